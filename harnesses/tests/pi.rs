//! The Pi adapter against the real pinned `pi --mode rpc` and a mock model, through the
//! harness seam: [`PiLauncher::spawn`] an agent, then `open`, turns, steer, interrupt.
//!
//! Each test has its own mock model and its own pi directory (a tempdir with
//! `models.json` pointing at that mock, also pi's `HOME` and working directory, where it
//! keeps its sessions), and checks that every pi it started is gone at the end. Every wait
//! has a timeout so a bug fails instead of hanging; nothing sleeps or measures time.
//!
//! Longer than 500 lines on purpose: this is the adapter's specification against the real
//! pi, one test per behaviour of the seam, read as one file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::pi::PiLauncher;
use relay_harnesses::{HarnessError, HarnessSession, Launcher, Lost, OpenedSession, Spawned};
use relay_mock_model::{all_input_text, write_pi_dir, MockModel, Reply};
use relay_protocol::domain::{AgentSpec, ApprovalDecision, Harness};
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use relay_tests::harness_events::{
    all_in_turn, first_delta_item, is_process_exited, is_text_delta, is_turn_completed, outcome,
    run_turn, shut_down, streamed_turn, turn_level, until, within,
};
use relay_tests::procs;
use serde_json::json;
use tempfile::TempDir;
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(30);

struct Setup {
    mock: MockModel,
    dir: TempDir,
    env: Vec<(String, String)>,
}

async fn setup() -> Setup {
    let mock = MockModel::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let env = write_pi_dir(dir.path(), &mock.base_url()).unwrap();
    Setup { mock, dir, env }
}

fn agent(s: &Setup) -> AgentSpec {
    let mut agent = AgentSpec::new(
        "pi-test",
        Harness::PiRpc,
        s.dir.path().display().to_string(),
    );
    agent.args = vec!["--provider".into(), "mock".into()];
    agent.model = Some("mock-model".into());
    agent.env.extend(s.env.iter().cloned());
    agent
}

type Session = Arc<dyn HarnessSession>;

async fn spawn(s: &Setup) -> (Session, Receiver<HarnessEvent>) {
    let Spawned { session, events } = within(WAIT, "spawn", PiLauncher.spawn(&agent(s), None))
        .await
        .unwrap();
    (session, events)
}

async fn open(session: &Session, stored: Option<&str>) -> OpenedSession {
    within(WAIT, "open", session.open(stored)).await.unwrap()
}

/// A session with a new conversation.
async fn spawn_open(s: &Setup) -> (Session, Receiver<HarnessEvent>, String) {
    let (session, events) = spawn(s).await;
    let conversation = open(&session, None).await;
    assert_eq!(conversation.lost, None);
    (session, events, conversation.id)
}

/// Starts turn `turn` with `text` and returns its events up to its completion.
async fn turn(
    session: &Session,
    events: &mut Receiver<HarnessEvent>,
    conversation: &str,
    turn: &str,
    text: &str,
) -> Vec<HarnessEvent> {
    run_turn(&**session, events, WAIT, conversation, text, turn).await
}

fn pid(session: &Session) -> u32 {
    session.endpoint().pid().expect("pi is a process")
}

async fn shutdown(session: &Session, events: &mut Receiver<HarnessEvent>) {
    assert_ne!(pid(session), 0, "pi runs");
    let rest = shut_down(&**session, events, WAIT).await;
    assert!(
        !rest.iter().any(is_turn_completed),
        "nothing was running: {rest:?}"
    );
}

/// Live processes with `arg` in their command line.
fn running_with(arg: &str) -> Vec<u32> {
    procs::live()
        .into_iter()
        .map(|s| s.pid)
        .filter(|&pid| procs::cmdline(pid).is_some_and(|c| c.iter().any(|a| a == arg)))
        .collect()
}

#[tokio::test]
async fn text_turn_streams_deltas_before_it_completes() {
    let s = setup().await;
    let chunks = ["Hel", "lo, ", "wor", "ld!"];
    s.mock
        .push(Reply::slow_chunks(chunks, Duration::from_millis(50)));
    let (session, mut events, conversation) = spawn_open(&s).await;
    assert_eq!(
        PiLauncher.info().capabilities,
        relay_harnesses::Capabilities {
            fork: true,
            steer: true,
            approvals: false,
            resume: true,
            interrupt: true,
            turn_ids: false,
            reply: false,
        }
    );

    let seen = turn(&session, &mut events, &conversation, "t1", "say hello").await;
    let item_id = first_delta_item(&seen).expect("no delta");
    assert_eq!(
        turn_level(&seen),
        streamed_turn("t1", &item_id, &chunks, "Hello, world!")
    );
    assert!(seen.iter().any(|e| *e
        == HarnessEvent::ItemCompleted {
            turn_id: "t1".into(),
            item_id: item_id.clone(),
            kind: ItemKind::AgentMessage,
            text: Some("Hello, world!".into()),
            exit_code: None,
        }));
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::TokenUsage { turn_id, usage }
            if turn_id == "t1" && usage.input_tokens > 0 && usage.output_tokens > 0)));

    let requests = s.mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].last_user_text().as_deref(), Some("say hello"));
    assert_eq!(requests[0].body["model"], json!("mock-model"));
    // Pi never asks: there is no approval to answer.
    assert!(matches!(
        session
            .respond_approval("1", ApprovalDecision::Accept)
            .await,
        Err(HarnessError::UnknownRequest { .. })
    ));
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn a_bash_call_and_its_output_are_items_and_the_model_gets_the_result() {
    let s = setup().await;
    s.mock.push(Reply::function_call(
        "toolu_1",
        "bash",
        &json!({"command": "echo hi"}),
    ));
    s.mock.push(Reply::text("done"));
    let (session, mut events, conversation) = spawn_open(&s).await;

    let seen = turn(&session, &mut events, &conversation, "t1", "run it").await;
    let tool: Vec<_> = seen
        .iter()
        .filter(|e| {
            matches!(e,
                HarnessEvent::ItemStarted { item_id, .. }
                | HarnessEvent::ItemCompleted { item_id, .. }
                | HarnessEvent::CommandOutputDelta { item_id, .. } if item_id == "toolu_1")
        })
        .cloned()
        .collect();
    assert_eq!(
        tool,
        vec![
            HarnessEvent::ItemStarted {
                turn_id: "t1".into(),
                item_id: "toolu_1".into(),
                kind: ItemKind::CommandExecution,
            },
            HarnessEvent::CommandOutputDelta {
                turn_id: "t1".into(),
                item_id: "toolu_1".into(),
                delta: "hi\n".into(),
            },
            HarnessEvent::ItemCompleted {
                turn_id: "t1".into(),
                item_id: "toolu_1".into(),
                kind: ItemKind::CommandExecution,
                text: Some("echo hi\nhi".into()),
                exit_code: None,
            },
        ]
    );
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "done".into()
        }
    );

    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].function_call_outputs(),
        vec![("toolu_1".to_string(), "hi\n".to_string())]
    );
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn a_second_turn_carries_the_first() {
    let s = setup().await;
    let (session, mut events, conversation) = spawn_open(&s).await;
    let first = turn(&session, &mut events, &conversation, "t1", "remember apple").await;
    assert_eq!(
        outcome(&first),
        TurnOutcome::Completed {
            text: "ok: remember apple".into()
        }
    );
    let second = turn(&session, &mut events, &conversation, "t2", "what fruit").await;
    assert!(all_in_turn(&second, "t2"), "{second:?}");
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        all_input_text(&requests[1]),
        "remember apple\nok: remember apple\nwhat fruit"
    );
    // Another conversation's id is not this session's.
    assert!(matches!(
        session.start_turn("other", "x", "t3").await,
        Err(HarnessError::SessionNotFound { .. })
    ));
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn a_conversation_resumes_in_a_new_process_and_an_unknown_one_is_lost() {
    let s = setup().await;
    let (session, mut events, conversation) = spawn_open(&s).await;
    turn(&session, &mut events, &conversation, "t1", "remember apple").await;
    shutdown(&session, &mut events).await;

    let (session, mut events) = spawn(&s).await;
    assert_eq!(
        open(&session, Some(&conversation)).await,
        OpenedSession {
            id: conversation.clone(),
            lost: None
        }
    );
    // Opening it again in the same session is the same conversation.
    assert_eq!(open(&session, Some(&conversation)).await.id, conversation);
    turn(&session, &mut events, &conversation, "t2", "what fruit").await;
    let requests = s.mock.requests();
    assert!(all_input_text(&requests[1]).contains("remember apple"));
    shutdown(&session, &mut events).await;

    let unknown = "01a206eb-88a6-7195-9096-6bc0da1cfb59";
    let (session, mut events) = spawn(&s).await;
    let opened = open(&session, Some(unknown)).await;
    assert_ne!(opened.id, unknown);
    assert_ne!(opened.id, conversation);
    let Some(Lost { old_id, reason }) = opened.lost else {
        panic!("the unknown session was not reported lost")
    };
    assert_eq!(old_id, unknown);
    assert!(reason.contains(&opened.id), "{reason}");
    // The pi that refused it is gone, and its end was no session end.
    assert!(running_with(unknown).is_empty());
    assert!(events.try_recv().is_err());
    let seen = turn(&session, &mut events, &opened.id, "t3", "fresh").await;
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "ok: fresh".into()
        }
    );
    assert_eq!(all_input_text(&s.mock.requests()[2]), "fresh");
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn a_conversation_that_never_ran_a_turn_cannot_be_resumed() {
    let s = setup().await;
    let (session, mut events, conversation) = spawn_open(&s).await;
    shutdown(&session, &mut events).await;
    // Pi writes its session file with the first prompt: this one was never kept.
    let (session, mut events) = spawn(&s).await;
    let opened = open(&session, Some(&conversation)).await;
    assert_eq!(
        opened.lost.map(|l| l.old_id).as_deref(),
        Some(conversation.as_str())
    );
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn steer_reaches_the_model_within_the_running_turn() {
    let s = setup().await;
    s.mock.push(Reply::slow_chunks(
        ["a ", "b ", "c ", "d"],
        Duration::from_millis(500),
    ));
    let (session, mut events, conversation) = spawn_open(&s).await;
    within(
        WAIT,
        "start_turn",
        session.start_turn(&conversation, "count", "t1"),
    )
    .await
    .unwrap();
    until(&mut events, WAIT, is_text_delta).await;
    within(
        WAIT,
        "steer",
        session.steer(&conversation, "t1", "steered text"),
    )
    .await
    .unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;

    // Pi lets the streaming answer finish, then asks the model again in the same turn
    // with the steered text after it; the turn ends with that answer.
    assert!(!seen
        .iter()
        .any(|e| matches!(e, HarnessEvent::TurnStarted { .. })));
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::ItemCompleted { kind: ItemKind::AgentMessage, text: Some(t), .. } if t == "a b c d")));
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::ItemCompleted { kind: ItemKind::UserMessage, text: Some(t), .. } if t == "steered text")));
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "ok: steered text".into()
        }
    );
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(all_input_text(&requests[1]), "count\na b c d\nsteered text");

    // Nothing runs: refused here (pi would keep it for the next prompt).
    for result in [
        session.steer(&conversation, "t1", "too late").await,
        session.interrupt(&conversation, "t1").await,
    ] {
        assert!(
            matches!(result, Err(HarnessError::NoActiveTurn { .. })),
            "{result:?}"
        );
    }
    turn(&session, &mut events, &conversation, "t2", "next").await;
    assert_eq!(
        s.mock.requests()[2].last_user_text().as_deref(),
        Some("next")
    );
    assert!(!all_input_text(&s.mock.requests()[2]).contains("too late"));
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn interrupt_ends_a_hung_turn_and_the_next_turn_works() {
    let s = setup().await;
    s.mock.push(Reply::hang());
    let (session, mut events, conversation) = spawn_open(&s).await;
    within(
        WAIT,
        "start_turn",
        session.start_turn(&conversation, "hang", "t1"),
    )
    .await
    .unwrap();
    within(WAIT, "the model request", s.mock.wait_for_requests(1, WAIT))
        .await
        .unwrap();
    // Pi answers the abort once the turn has ended: its end is already in the stream.
    within(WAIT, "interrupt", session.interrupt(&conversation, "t1"))
        .await
        .unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    assert_eq!(outcome(&seen), TurnOutcome::Interrupted);

    // A stream cut mid-text the same way closes its message with the text so far.
    s.mock
        .push(Reply::slow_chunks(["one ", "two"], Duration::from_secs(60)));
    within(
        WAIT,
        "start_turn",
        session.start_turn(&conversation, "slow", "t2"),
    )
    .await
    .unwrap();
    until(&mut events, WAIT, is_text_delta).await;
    within(WAIT, "interrupt", session.interrupt(&conversation, "t2"))
        .await
        .unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::ItemCompleted { kind: ItemKind::AgentMessage, text: Some(t), .. } if t == "one ")));
    assert_eq!(outcome(&seen), TurnOutcome::Interrupted);

    let seen = turn(&session, &mut events, &conversation, "t3", "again").await;
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "ok: again".into()
        }
    );
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn a_retried_error_goes_on_in_its_turn_and_one_pi_gives_up_on_fails_it() {
    let s = setup().await;
    // Pi retries overloaded, rate-limited and 5xx answers (3 times, from 2 s, by
    // default); one retry at once here.
    std::fs::write(
        s.dir.path().join("settings.json"),
        r#"{"retry": {"maxRetries": 1, "baseDelayMs": 1}}"#,
    )
    .unwrap();
    let (session, mut events, conversation) = spawn_open(&s).await;

    s.mock.push(Reply::failed("overloaded"));
    s.mock.push(Reply::text("recovered"));
    let seen = turn(&session, &mut events, &conversation, "t1", "try").await;
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "recovered".into()
        }
    );
    let starts = seen
        .iter()
        .filter(|e| matches!(e, HarnessEvent::TurnStarted { .. }))
        .count();
    assert_eq!(starts, 1);
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::Retrying { message } if message.contains("overloaded"))));

    // Still failing after the retry.
    s.mock.push(Reply::failed("overloaded"));
    s.mock.push(Reply::failed("overloaded again"));
    let seen = turn(&session, &mut events, &conversation, "t2", "try again").await;
    match outcome(&seen) {
        TurnOutcome::Failed { error } => assert!(error.contains("overloaded again"), "{error}"),
        other => panic!("{other:?}"),
    }

    // An error pi does not retry fails the turn at once.
    s.mock.push(Reply::Failed {
        code: "invalid_request_error".into(),
        message: "bad input".into(),
    });
    let seen = turn(&session, &mut events, &conversation, "t3", "bad").await;
    match outcome(&seen) {
        TurnOutcome::Failed { error } => assert!(error.contains("bad input"), "{error}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.mock.requests().len(), 5);
    let seen = turn(&session, &mut events, &conversation, "t4", "fine").await;
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "ok: fine".into()
        }
    );
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn a_killed_pi_ends_the_session_and_a_new_one_resumes_it() {
    let s = setup().await;
    let (session, mut events, conversation) = spawn_open(&s).await;
    turn(&session, &mut events, &conversation, "t1", "remember apple").await;
    s.mock.push(Reply::hang());
    within(
        WAIT,
        "start_turn",
        session.start_turn(&conversation, "hang", "t2"),
    )
    .await
    .unwrap();
    within(WAIT, "the model request", s.mock.wait_for_requests(2, WAIT))
        .await
        .unwrap();

    let pid = pid(&session);
    procs::signal(pid, procs::Signal::KILL);
    let seen = until(&mut events, WAIT, is_process_exited).await;
    assert!(!seen.iter().any(is_turn_completed), "{seen:?}");
    assert_eq!(
        seen.last(),
        Some(&HarnessEvent::ProcessExited {
            code: None,
            signal: Some(procs::Signal::KILL.as_raw()),
            stderr_tail: session.stderr_tail(),
        })
    );
    procs::wait_group_gone(pid, WAIT).await;
    // The session is over: its calls fail with the exit.
    assert!(matches!(
        session.start_turn(&conversation, "x", "t3").await,
        Err(HarnessError::ProcessExited { .. })
    ));
    within(WAIT, "shutdown", session.shutdown()).await.unwrap();

    let (session, mut events) = spawn(&s).await;
    assert_eq!(open(&session, Some(&conversation)).await.lost, None);
    turn(&session, &mut events, &conversation, "t3", "what fruit").await;
    let last = s.mock.requests().pop().unwrap();
    assert!(all_input_text(&last).contains("remember apple"));
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn a_dropped_session_leaves_no_process() {
    let s = setup().await;
    let (session, events, _) = spawn_open(&s).await;
    let pid = pid(&session);
    assert!(procs::alive(pid));
    drop(session);
    drop(events);
    procs::wait_group_gone(pid, WAIT).await;
}
