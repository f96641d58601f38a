//! The `acp` harness through the seam against `relay-fake-acp`, an ACP agent that
//! misbehaves on request: what the real CLIs do not do on demand (a line that is not
//! JSON, an unknown stop reason, no answer to `initialize`, death mid-turn, an unknown
//! request before a permission request with id 0), and the mapping of every update
//! kind. Each check ends with the agent's process gone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::acp::{AcpConfig, AcpLauncher};
use relay_harnesses::{HarnessError, HarnessSession, Spawned};
use relay_protocol::domain::{AgentSpec, ApprovalDecision, ApprovalKind, Harness, ProgramInfo};
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use relay_tests::harness_events::{
    is_approval_requested, is_process_exited, outcome, run_turn, shut_down, until, within,
};
use relay_tests::procs;
use tempfile::TempDir;
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(20);

fn config(dir: &TempDir, env: &[(&str, &str)]) -> AcpConfig {
    let mut agent = AgentSpec::new("fake", Harness::Acp, dir.path().display().to_string());
    agent.command = Some(env!("CARGO_BIN_EXE_relay-fake-acp").into());
    // Names the test's own process (the fake ignores its arguments).
    agent.args = vec![format!("--tag={}", dir.path().display())];
    for (k, v) in env {
        agent.env.insert(k.to_string(), v.to_string());
    }
    AcpConfig::for_agent(&agent, None).unwrap()
}

async fn open(
    config: AcpConfig,
    stored: Option<&str>,
) -> (Arc<dyn HarnessSession>, Receiver<HarnessEvent>, String) {
    let Spawned { session, events } = AcpLauncher::spawn_with(config).unwrap();
    let opened = within(WAIT, "open", session.open(stored)).await.unwrap();
    (session, events, opened.id)
}

async fn close(session: &dyn HarnessSession, events: &mut Receiver<HarnessEvent>) {
    shut_down(session, events, WAIT).await;
}

fn failed(events: &[HarnessEvent]) -> String {
    match outcome(events) {
        TurnOutcome::Failed { error } => error,
        other => panic!("expected a failed turn, got {other:?} in {events:?}"),
    }
}

#[tokio::test]
async fn every_update_kind_becomes_its_event_and_the_agent_is_known_by_what_it_said() {
    let dir = tempfile::tempdir().unwrap();
    let (session, mut events, id) = open(config(&dir, &[]), None).await;
    assert_eq!(id, "fake-1");
    assert_eq!(
        session.program(),
        Some(ProgramInfo {
            name: "relay-fake-acp".into(),
            version: "0.0.1".into(),
            protocol_version: Some(1),
            capabilities: vec!["load_session".into(), "image".into()],
        })
    );
    let turn = run_turn(session.as_ref(), &mut events, WAIT, &id, "hello", "t1").await;
    assert_eq!(
        outcome(&turn),
        TurnOutcome::Completed {
            text: "echo: hello".into()
        }
    );
    let deltas: Vec<&str> = turn
        .iter()
        .filter_map(|e| match e {
            HarnessEvent::TextDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, ["echo: ", "hello"]);
    assert!(turn.contains(&HarnessEvent::PlanUpdated {
        turn_id: "t1".into(),
        text: "[completed] look\n[in_progress] answer".into()
    }));
    assert!(turn.contains(&HarnessEvent::ItemCompleted {
        turn_id: "t1".into(),
        item_id: "t1".into(),
        kind: ItemKind::CommandExecution,
        text: Some("ls\na.txt".into()),
        exit_code: None,
    }));
    assert!(turn.contains(&HarnessEvent::CommandOutputDelta {
        turn_id: "t1".into(),
        item_id: "t1".into(),
        delta: "a.txt".into(),
    }));
    assert!(turn
        .iter()
        .any(|e| matches!(e, HarnessEvent::ItemCompleted {
        kind: ItemKind::Reasoning, text: Some(t), ..} if t == "hmm")));
    assert!(turn.contains(&HarnessEvent::TokenUsage {
        turn_id: "t1".into(),
        usage: relay_protocol::domain::TokenUsage::new(12, 3)
    }));
    // A second turn in the same process and session.
    let turn = run_turn(session.as_ref(), &mut events, WAIT, &id, "again", "t2").await;
    assert_eq!(
        outcome(&turn),
        TurnOutcome::Completed {
            text: "echo: again".into()
        }
    );
    close(session.as_ref(), &mut events).await;
}

#[tokio::test]
async fn a_permission_request_with_id_0_beside_an_unknown_request_is_a_relay_approval() {
    let dir = tempfile::tempdir().unwrap();
    let (session, mut events, id) = open(config(&dir, &[]), None).await;
    for (turn, decision, chose) in [
        ("a1", ApprovalDecision::Accept, "proceed_once"),
        ("a2", ApprovalDecision::AcceptForSession, "proceed_once"),
        ("a3", ApprovalDecision::Decline, "cancel"),
    ] {
        session.start_turn(&id, "ask", turn).await.unwrap();
        let seen = until(&mut events, WAIT, is_approval_requested).await;
        let Some(HarnessEvent::ApprovalRequested {
            request_id,
            kind,
            detail,
            reason,
            ..
        }) = seen.last()
        else {
            panic!("{seen:?}")
        };
        // The agent's request ids count from 0; the unknown one (0) was refused.
        assert_eq!(request_id, "1");
        assert_eq!(*kind, ApprovalKind::Command);
        assert_eq!(detail, "rm -rf /tmp/x", "the command as it will run");
        assert_eq!(reason.as_deref(), Some("Remove a directory (execute)"));
        session
            .respond_approval(request_id, decision)
            .await
            .unwrap();
        let rest = until(&mut events, WAIT, |e| {
            matches!(e, HarnessEvent::TurnCompleted { .. })
        })
        .await;
        assert_eq!(
            outcome(&rest),
            TurnOutcome::Completed {
                text: format!("chose {chose}; unknown request refused: true")
            }
        );
        // Answered once.
        assert!(matches!(
            session.respond_approval(request_id, decision).await,
            Err(HarnessError::UnknownRequest { .. })
        ));
    }
    close(session.as_ref(), &mut events).await;
}

#[tokio::test]
async fn a_cancel_answers_the_open_permission_request_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (session, mut events, id) = open(config(&dir, &[]), None).await;
    session.start_turn(&id, "ask", "c1").await.unwrap();
    let seen = until(&mut events, WAIT, is_approval_requested).await;
    let Some(HarnessEvent::ApprovalRequested { request_id, .. }) = seen.last() else {
        panic!("{seen:?}")
    };
    session.interrupt(&id, "c1").await.unwrap();
    let rest = until(&mut events, WAIT, |e| {
        matches!(e, HarnessEvent::TurnCompleted { .. })
    })
    .await;
    assert_eq!(outcome(&rest), TurnOutcome::Interrupted);
    assert!(
        format!("{rest:?}").contains("chose cancelled"),
        "the request was answered cancelled: {rest:?}"
    );
    // And Relay hears it is settled (its approval closed), before the turn ends.
    let resolved = rest.iter().position(
        |e| matches!(e, HarnessEvent::ApprovalResolved { request_id: r } if r == request_id),
    );
    assert!(
        resolved.is_some_and(|i| i + 1 < rest.len()),
        "the approval was settled by the cancel: {rest:?}"
    );
    // Nothing is left to answer.
    assert!(matches!(
        session
            .respond_approval(request_id, ApprovalDecision::Accept)
            .await,
        Err(HarnessError::UnknownRequest { .. })
    ));
    close(session.as_ref(), &mut events).await;
}

#[tokio::test]
async fn a_cancel_interrupts_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (session, mut events, id) = open(config(&dir, &[]), None).await;
    session.start_turn(&id, "slow", "s1").await.unwrap();
    until(&mut events, WAIT, |e| {
        matches!(e, HarnessEvent::TextDelta { .. })
    })
    .await;
    session.interrupt(&id, "s1").await.unwrap();
    let rest = until(&mut events, WAIT, |e| {
        matches!(e, HarnessEvent::TurnCompleted { .. })
    })
    .await;
    assert_eq!(outcome(&rest), TurnOutcome::Interrupted);
    assert!(matches!(
        session.interrupt(&id, "s1").await,
        Err(HarnessError::NoActiveTurn { .. })
    ));
    close(session.as_ref(), &mut events).await;
}

#[tokio::test]
async fn a_line_that_is_not_json_or_an_unknown_stop_reason_fails_the_turn_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let (session, mut events, id) = open(config(&dir, &[]), None).await;
    let turn = run_turn(session.as_ref(), &mut events, WAIT, &id, "garbage", "g1").await;
    let error = failed(&turn);
    assert!(error.contains("not ACP's JSON-RPC"), "{error}");
    assert!(error.contains("this line is not JSON at all"), "{error}");
    let turn = run_turn(session.as_ref(), &mut events, WAIT, &id, "weird-stop", "w1").await;
    let error = failed(&turn);
    assert!(error.contains("\"out_of_coffee\""), "{error}");
    // The agent still serves the next turn.
    let turn = run_turn(session.as_ref(), &mut events, WAIT, &id, "fine", "f1").await;
    assert_eq!(
        outcome(&turn),
        TurnOutcome::Completed {
            text: "echo: fine".into()
        }
    );
    close(session.as_ref(), &mut events).await;
}

#[tokio::test]
async fn an_agent_that_dies_mid_turn_ends_the_session_with_its_exit_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let (session, mut events, id) = open(config(&dir, &[]), None).await;
    let pid = session.endpoint().pid().unwrap();
    session.start_turn(&id, "die", "d1").await.unwrap();
    let seen = until(&mut events, WAIT, is_process_exited).await;
    match seen.last() {
        Some(HarnessEvent::ProcessExited {
            code, stderr_tail, ..
        }) => {
            assert_eq!(*code, Some(3));
            assert!(stderr_tail.contains("fake dies"), "{stderr_tail}");
        }
        other => panic!("{other:?}"),
    }
    procs::wait_group_gone(pid, WAIT).await;
    assert!(session.start_turn(&id, "again", "d2").await.is_err());
    // The session's end was reported once: the stream then just ends.
    session.shutdown().await.unwrap();
    assert!(within(WAIT, "the stream's end", events.recv())
        .await
        .is_none());
}

#[tokio::test]
async fn an_agent_that_never_answers_initialize_fails_the_open_in_time_and_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&dir, &[("RELAY_FAKE_ACP", "silent")]);
    config.cli.request_timeout = Duration::from_secs(2);
    let Spawned {
        session,
        mut events,
    } = AcpLauncher::spawn_with(config).unwrap();
    let err = within(WAIT, "open", session.open(None)).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("did not start as an ACP agent (initialize)") && text.contains("timed out"),
        "{text}"
    );
    // Never armed: the stream ends with no session end of a session that never began.
    session.shutdown().await.unwrap();
    let rest = until(&mut events, WAIT, is_process_exited).await;
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(
        procs::mentioning(&dir.path().display().to_string()),
        Vec::<u32>::new(),
        "the agent that never answered is gone"
    );
}

#[tokio::test]
async fn a_stored_session_is_loaded_without_showing_its_replay_or_replaced_when_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (session, mut events, id) = open(config(&dir, &[]), Some("fake-7")).await;
    assert_eq!(id, "fake-7");
    // The replay (before and after the load's answer) is not this turn's output.
    let turn = run_turn(session.as_ref(), &mut events, WAIT, &id, "next", "n1").await;
    assert_eq!(
        outcome(&turn),
        TurnOutcome::Completed {
            text: "echo: next".into()
        }
    );
    assert!(
        !format!("{turn:?}").contains("replayed"),
        "the replay is not shown: {turn:?}"
    );
    close(session.as_ref(), &mut events).await;

    let Spawned {
        session,
        mut events,
    } = AcpLauncher::spawn_with(config(&dir, &[])).unwrap();
    let opened = within(WAIT, "open", session.open(Some("gone-1")))
        .await
        .unwrap();
    assert_eq!(opened.id, "fake-1");
    let lost = opened.lost.unwrap();
    assert_eq!(lost.old_id, "gone-1");
    assert!(
        lost.reason.contains("Session not found: gone-1") && lost.reason.contains("started fake-1"),
        "{}",
        lost.reason
    );
    close(session.as_ref(), &mut events).await;
}

/// Through `relay up`: the same bad input ends the flight with a clear error.
#[tokio::test(flavor = "multi_thread")]
async fn through_relay_bad_input_fails_the_flight_saying_why() {
    use relay_tests::agents::{state, Env};
    let env = Env::start().await;
    let fake = env!("CARGO_BIN_EXE_relay-fake-acp");
    env.add_acp("fake", fake);
    for (task, says) in [
        ("garbage", "not ACP's JSON-RPC"),
        ("weird-stop", "out_of_coffee"),
        ("die", "fake dies"),
    ] {
        let id = env.ask_no_wait("fake", task);
        let f = env.wait_flight(&id, 60, |f| state(f) == "failed").await;
        let error = f["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{task}: {f}");
    }
    let shown = env.relay.cli_ok(&["agent", "show", "fake"]);
    assert!(
        shown.contains("program   relay-fake-acp 0.0.1 (ACP 1: load_session, image)"),
        "{shown}"
    );
}

/// Many asks of several ACP agents at once: each flight gets its own answer, whole.
#[tokio::test(flavor = "multi_thread")]
async fn many_asks_of_several_acp_agents_at_once_each_get_their_answer() {
    use relay_tests::agents::{state, Env};
    let env = Env::start().await;
    let fake = env!("CARGO_BIN_EXE_relay-fake-acp");
    let agents = ["f1", "f2", "f3"];
    for name in agents {
        env.add_acp(name, fake);
    }
    let asks: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = agents
            .iter()
            .flat_map(|a| (0..4).map(move |n| (*a, format!("task-{a}-{n}"))))
            .map(|(a, task)| {
                let env = &env;
                s.spawn(move || (env.ask_no_wait(a, &task), task))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (id, task) in asks {
        let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
        assert_eq!(f["output"], format!("echo: {task}"), "{f}");
    }
}
