//! The Claude Code adapter against the real pinned `claude` and a mock model, through the
//! harness seam only (`ClaudeLauncher::spawn`, then the session's methods).
//!
//! Each test has its own mock model, its own `CLAUDE_CONFIG_DIR` (also `HOME`) and work
//! directory, and checks that every `claude` process it started is gone at the end. Every
//! wait has a timeout so a bug fails instead of hanging; none is a measure.
//!
//! Over 600 lines: the adapter's specification against real Claude Code, read as one file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::claude::{ClaudeLauncher, CLAUDE_INFO};
use relay_harnesses::{HarnessError, HarnessSession, Launcher, OpenedSession, Spawned};
use relay_mock_model::{all_input_text, claude_env, MockModel, Reply};
use relay_protocol::domain::{AgentSpec, ApprovalDecision, ApprovalKind, Harness};
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use relay_tests::harness_events::{
    all_in_turn, assert_ended, completed_item, first_delta_item, is_approval_requested,
    is_process_exited, is_text_delta, is_turn_completed, outcome, run_turn, shut_down,
    streamed_turn, turn_level, until, within,
};
use relay_tests::{procs, wait_until};
use serde_json::json;
use tempfile::TempDir;
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(30);
/// Long enough that a slow stream is always cut by the test, never finished.
const FOREVER: Duration = Duration::from_secs(600);

struct Setup {
    mock: MockModel,
    /// `CLAUDE_CONFIG_DIR` and `HOME`: the sessions Claude Code saves are here.
    config: TempDir,
    work: TempDir,
}

async fn setup() -> Setup {
    Setup {
        mock: MockModel::start().await.unwrap(),
        config: tempfile::tempdir().unwrap(),
        work: tempfile::tempdir().unwrap(),
    }
}

impl Setup {
    fn agent(&self) -> AgentSpec {
        let mut agent = AgentSpec::new(
            "a1",
            Harness::ClaudeStreamJson,
            self.work.path().display().to_string(),
        );
        agent
            .env
            .extend(claude_env(self.config.path(), &self.mock.base_url()));
        agent
    }

    /// Waits until Claude Code's transcript of `conversation` holds `text`.
    async fn wait_for_transcript(&self, conversation: &str, text: &str) {
        let projects = self.config.path().join("projects");
        let file = format!("{conversation}.jsonl");
        wait_until(format!("the transcript to hold {text:?}"), WAIT, || async {
            let dirs = std::fs::read_dir(&projects).ok()?;
            dirs.flatten()
                .filter_map(|d| std::fs::read_to_string(d.path().join(&file)).ok())
                .find(|t| t.contains(text))
                .map(|_| ())
        })
        .await;
    }

    async fn spawn(&self) -> Session {
        let Spawned { session, events } =
            within(WAIT, "spawn", ClaudeLauncher.spawn(&self.agent(), None))
                .await
                .expect("spawn failed");
        Session { session, events }
    }

    /// A session with a conversation open: `stored`'s, or a new one.
    async fn open(&self, stored: Option<&str>) -> (Session, OpenedSession) {
        let session = self.spawn().await;
        let conversation = within(WAIT, "open", session.session.open(stored))
            .await
            .expect("open failed");
        (session, conversation)
    }
}

struct Session {
    session: Arc<dyn HarnessSession>,
    events: Receiver<HarnessEvent>,
}

impl Session {
    fn pid(&self) -> u32 {
        self.session.endpoint().pid().unwrap()
    }

    /// Events up to and including the first one matching `done`.
    async fn until(&mut self, done: impl Fn(&HarnessEvent) -> bool) -> Vec<HarnessEvent> {
        until(&mut self.events, WAIT, done).await
    }

    async fn turn_end(&mut self) -> Vec<HarnessEvent> {
        self.until(is_turn_completed).await
    }

    /// Runs a whole turn and returns its events.
    async fn turn(&mut self, conversation: &str, text: &str, turn: &str) -> Vec<HarnessEvent> {
        run_turn(
            &*self.session,
            &mut self.events,
            WAIT,
            conversation,
            text,
            turn,
        )
        .await
    }

    /// Waits for the next approval request and answers it; returns the request.
    async fn answer_next_approval(&mut self, decision: ApprovalDecision) -> HarnessEvent {
        let seen = self.until(is_approval_requested).await;
        let request = seen.last().cloned().unwrap();
        let HarnessEvent::ApprovalRequested { request_id, .. } = &request else {
            unreachable!("until returns once the predicate held")
        };
        self.session
            .respond_approval(request_id, decision)
            .await
            .unwrap();
        request
    }

    /// Shuts the session down: the events end with `ProcessExited`, the process group is
    /// gone, and the stream ends.
    async fn shutdown(mut self) {
        shut_down(&*self.session, &mut self.events, WAIT).await;
        assert_ended(&mut self.events, WAIT).await;
    }
}

#[test]
fn claude_info_declares_what_claude_can_do() {
    assert_eq!(CLAUDE_INFO.harness, Harness::ClaudeStreamJson);
    assert_eq!(CLAUDE_INFO.name, "claude");
    assert_eq!(CLAUDE_INFO.program, "claude -p (stream-json)");
    let c = CLAUDE_INFO.capabilities;
    assert_eq!(
        (c.steer, c.approvals, c.resume, c.interrupt, c.turn_ids),
        (false, true, true, true, false)
    );
    assert_eq!(ClaudeLauncher.info(), CLAUDE_INFO);
}

#[tokio::test]
async fn text_turn_streams_deltas_before_it_completes() {
    let s = setup().await;
    let chunks = ["Hel", "lo, ", "wor", "ld!"];
    s.mock
        .push(Reply::slow_chunks(chunks, Duration::from_millis(20)));
    let (mut session, conversation) = s.open(None).await;
    assert!(conversation.lost.is_none());
    assert!(uuid_like(&conversation.id), "{}", conversation.id);

    let seen = session.turn(&conversation.id, "say hello", "turn-1").await;
    let item_id = first_delta_item(&seen).expect("no delta");
    assert_eq!(
        turn_level(&seen),
        streamed_turn("turn-1", &item_id, &chunks, "Hello, world!")
    );
    assert_eq!(
        completed_item(&seen, &item_id),
        Some((ItemKind::AgentMessage, Some("Hello, world!".into())))
    );
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::TokenUsage { turn_id, usage }
            if turn_id == "turn-1" && usage.input_tokens > 0 && usage.output_tokens > 0)));

    let requests = s.mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].last_user_text().as_deref(), Some("say hello"));
    session.shutdown().await;
}

fn uuid_like(id: &str) -> bool {
    id.len() == 36 && id.chars().filter(|c| *c == '-').count() == 4
}

#[tokio::test]
async fn a_read_only_command_runs_without_asking_and_its_output_is_the_items_text() {
    let s = setup().await;
    s.mock.push(Reply::function_call(
        "toolu_1",
        "Bash",
        &json!({"command": "echo hi"}),
    ));
    s.mock.push(Reply::text("it said hi"));
    let (mut session, conversation) = s.open(None).await;
    let seen = session.turn(&conversation.id, "run echo", "turn-1").await;

    // Claude Code 2.1.197 deems `echo hi` read-only: no prompt.
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, HarnessEvent::ApprovalRequested { .. })),
        "{seen:?}"
    );
    assert!(seen.contains(&HarnessEvent::ItemStarted {
        turn_id: "turn-1".into(),
        item_id: "toolu_1".into(),
        kind: ItemKind::CommandExecution,
    }));
    assert_eq!(
        completed_item(&seen, "toolu_1"),
        Some((ItemKind::CommandExecution, Some("$ echo hi\nhi".into())))
    );
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "it said hi".into()
        }
    );
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].function_call_outputs(),
        vec![("toolu_1".to_string(), "hi".to_string())]
    );
    session.shutdown().await;
}

#[tokio::test]
async fn the_next_turn_carries_the_earlier_one() {
    let s = setup().await;
    let (mut session, conversation) = s.open(None).await;
    let first = session
        .turn(&conversation.id, "remember the kiwi", "turn-1")
        .await;
    assert_eq!(
        outcome(&first),
        TurnOutcome::Completed {
            text: "ok: remember the kiwi".into()
        }
    );
    let second = session
        .turn(&conversation.id, "what fruit?", "turn-2")
        .await;
    assert!(matches!(outcome(&second), TurnOutcome::Completed { .. }));
    assert!(all_in_turn(&second, "turn-2"), "{second:?}");
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    let history = all_input_text(&requests[1]);
    assert!(history.contains("remember the kiwi"), "{history}");
    assert!(history.contains("ok: remember the kiwi"), "{history}");
    assert_eq!(requests[1].last_user_text().as_deref(), Some("what fruit?"));

    // Another conversation is not this session's.
    assert!(matches!(
        session
            .session
            .start_turn("0b4e9c1e-5d55-4a43-8e4f-3c1d2f1e8a77", "x", "t")
            .await,
        Err(HarnessError::SessionNotFound { .. })
    ));
    // Nor is a second one opened in it.
    assert!(matches!(
        session.session.open(None).await,
        Err(HarnessError::Incapable { .. })
    ));
    session.shutdown().await;
}

#[tokio::test]
async fn a_conversation_resumes_in_a_new_process_and_an_unknown_one_is_lost() {
    let s = setup().await;
    let (mut session, conversation) = s.open(None).await;
    let pid = session.pid();
    session
        .turn(&conversation.id, "remember the kiwi", "turn-1")
        .await;
    session.shutdown().await;

    let (mut session, resumed) = s.open(Some(&conversation.id)).await;
    assert_eq!(
        resumed,
        OpenedSession {
            id: conversation.id.clone(),
            lost: None
        }
    );
    assert_ne!(session.pid(), pid);
    let seen = session.turn(&resumed.id, "what fruit?", "turn-2").await;
    assert!(matches!(outcome(&seen), TurnOutcome::Completed { .. }));
    let history = all_input_text(s.mock.requests().last().unwrap());
    assert!(history.contains("remember the kiwi"), "{history}");
    assert!(history.contains("ok: remember the kiwi"), "{history}");
    session.shutdown().await;

    for unknown in ["0b4e9c1e-5d55-4a43-8e4f-3c1d2f1e8a77", "not-a-session"] {
        let (mut session, fresh) = s.open(Some(unknown)).await;
        assert_ne!(fresh.id, unknown);
        assert!(uuid_like(&fresh.id), "{}", fresh.id);
        let lost = fresh
            .lost
            .clone()
            .expect("the unknown conversation is lost");
        assert_eq!(lost.old_id, unknown);
        assert!(lost.reason.contains(&fresh.id), "{}", lost.reason);
        // The refused process ended quietly: the first event is the new turn's.
        let seen = session.turn(&fresh.id, "hello again", "turn-3").await;
        assert_eq!(
            seen.first(),
            Some(&HarnessEvent::TurnStarted {
                turn_id: "turn-3".into()
            })
        );
        let history = all_input_text(s.mock.requests().last().unwrap());
        assert!(!history.contains("kiwi"), "{history}");
        session.shutdown().await;
    }
}

/// A turn whose model asks to run a command that writes (so Claude Code asks first),
/// answered with `decision`; returns the turn's events and the tool results of the
/// request after it.
async fn approval_turn(
    decision: ApprovalDecision,
) -> (Setup, Vec<HarnessEvent>, Vec<(String, String)>) {
    let s = setup().await;
    s.mock.push(Reply::function_call(
        "toolu_1",
        "Bash",
        &json!({"command": "echo hi > out.txt", "description": "write a file"}),
    ));
    s.mock.push(Reply::text("done"));
    let (mut session, conversation) = s.open(None).await;
    session
        .session
        .start_turn(&conversation.id, "write it", "turn-1")
        .await
        .unwrap();
    let request = session.answer_next_approval(decision).await;
    let HarnessEvent::ApprovalRequested { request_id, .. } = &request else {
        unreachable!()
    };
    assert_eq!(
        request,
        HarnessEvent::ApprovalRequested {
            turn_id: "turn-1".into(),
            request_id: request_id.clone(),
            kind: ApprovalKind::Command,
            detail: "bash -c 'echo hi > out.txt'".into(),
            reason: Some("write a file".into()),
        }
    );
    let mut seen = vec![request.clone()];
    seen.extend(session.turn_end().await);
    // Answered: a second answer names no pending request.
    assert!(matches!(
        session
            .session
            .respond_approval(request_id, ApprovalDecision::Accept)
            .await,
        Err(HarnessError::UnknownRequest { .. })
    ));
    let outputs = s
        .mock
        .requests()
        .get(1)
        .map(|r| r.function_call_outputs())
        .unwrap_or_default();
    session.shutdown().await;
    (s, seen, outputs)
}

/// A command that fails: Claude Code's tool result is an error whose text starts `Exit
/// code N`, then the output: the item records N, and the command with its output.
#[tokio::test]
async fn a_failing_command_reports_its_exit_code_and_output() {
    let s = setup().await;
    s.mock.push(Reply::function_call(
        "toolu_1",
        "Bash",
        &json!({"command": "echo hi; exit 3", "description": "fail"}),
    ));
    s.mock.push(Reply::text("done"));
    let (mut session, conversation) = s.open(None).await;
    session
        .session
        .start_turn(&conversation.id, "fail it", "turn-1")
        .await
        .unwrap();
    session.answer_next_approval(ApprovalDecision::Accept).await;
    let seen = session.turn_end().await;
    let outputs = s.mock.requests().get(1).map(|r| r.function_call_outputs());
    let item = seen.iter().find_map(|e| match e {
        HarnessEvent::ItemCompleted {
            item_id,
            text,
            exit_code,
            ..
        } if item_id == "toolu_1" => Some((text.clone(), *exit_code)),
        _ => None,
    });
    assert_eq!(
        item,
        Some((
            Some("$ echo hi; exit 3\nerror: Exit code 3\nhi".into()),
            Some(3)
        ))
    );
    assert_eq!(
        outputs,
        Some(vec![("toolu_1".into(), "Exit code 3\nhi".into())])
    );
    session.shutdown().await;
}

#[tokio::test]
async fn an_approved_command_runs() {
    let (s, seen, outputs) = approval_turn(ApprovalDecision::Accept).await;
    assert_eq!(
        std::fs::read_to_string(s.work.path().join("out.txt")).unwrap(),
        "hi\n"
    );
    assert!(matches!(
        completed_item(&seen, "toolu_1"),
        Some((ItemKind::CommandExecution, Some(text))) if text.starts_with("$ echo hi > out.txt")
    ));
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].0, "toolu_1");
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "done".into()
        }
    );
}

#[tokio::test]
async fn a_declined_command_does_not_run_and_the_model_is_told() {
    let (s, seen, outputs) = approval_turn(ApprovalDecision::Decline).await;
    assert!(!s.work.path().join("out.txt").exists());
    assert_eq!(
        outputs,
        vec![("toolu_1".to_string(), "declined through Relay".to_string())]
    );
    assert_eq!(
        completed_item(&seen, "toolu_1"),
        Some((
            ItemKind::CommandExecution,
            Some("$ echo hi > out.txt\nerror: declined through Relay".into())
        ))
    );
    assert!(matches!(outcome(&seen), TurnOutcome::Completed { .. }));
}

#[tokio::test]
async fn interrupt_stops_a_streaming_turn_and_the_session_goes_on() {
    let s = setup().await;
    s.mock
        .push(Reply::slow_chunks(["partial", " never"], FOREVER));
    let (mut session, conversation) = s.open(None).await;
    let c = conversation.id.as_str();
    assert!(matches!(
        session.session.interrupt(c, "turn-1").await,
        Err(HarnessError::NoActiveTurn { .. })
    ));
    session
        .session
        .start_turn(c, "stream slowly", "turn-1")
        .await
        .unwrap();
    let streamed = session.until(is_text_delta).await;
    assert_eq!(
        streamed.first(),
        Some(&HarnessEvent::TurnStarted {
            turn_id: "turn-1".into()
        })
    );
    // One turn at a time.
    assert!(matches!(
        session.session.start_turn(c, "too soon", "turn-x").await,
        Err(HarnessError::TurnRunning { turn_id }) if turn_id == "turn-1"
    ));
    assert!(matches!(
        session.session.steer(c, "turn-1", "more").await,
        Err(HarnessError::Incapable { .. })
    ));

    session.session.interrupt(c, "turn-1").await.unwrap();
    // The next turn may start at once: it waits for the interrupted one to end.
    s.mock.push(Reply::text("after"));
    session
        .session
        .start_turn(c, "carry on", "turn-2")
        .await
        .unwrap();
    let ended = session.turn_end().await;
    assert_eq!(
        ended.last(),
        Some(&HarnessEvent::TurnCompleted {
            turn_id: "turn-1".into(),
            outcome: TurnOutcome::Interrupted
        })
    );
    let item_id = first_delta_item(&streamed).unwrap();
    assert_eq!(
        completed_item(&ended, &item_id),
        Some((ItemKind::AgentMessage, Some("partial".into())))
    );
    let next = turn_level(&session.turn_end().await);
    let HarnessEvent::TextDelta { item_id, .. } = &next[1] else {
        panic!("{next:?}")
    };
    assert_eq!(next, streamed_turn("turn-2", item_id, &["after"], "after"));
    assert!(matches!(
        session.session.interrupt(c, "turn-2").await,
        Err(HarnessError::NoActiveTurn { .. })
    ));
    session.shutdown().await;
}

#[tokio::test]
async fn a_killed_process_is_reported_and_its_conversation_resumes() {
    let s = setup().await;
    let (mut session, conversation) = s.open(None).await;
    let c = conversation.id.clone();
    session.turn(&c, "remember the kiwi", "turn-1").await;
    s.mock
        .push(Reply::slow_chunks(["partial", " never"], FOREVER));
    session
        .session
        .start_turn(&c, "stream slowly", "turn-2")
        .await
        .unwrap();
    session.until(is_text_delta).await;
    // Claude Code writes its transcript a moment after each entry (and at exit): a
    // process killed before that loses the entry, and a conversation with none saved
    // cannot be resumed. So the kill waits for the transcript to hold the turn.
    s.wait_for_transcript(&c, "stream slowly").await;
    let pid = session.pid();
    procs::signal(pid, procs::Signal::KILL);

    let seen = session.until(is_process_exited).await;
    assert_eq!(
        seen.last(),
        Some(&HarnessEvent::ProcessExited {
            code: None,
            signal: Some(rustix::process::Signal::KILL.as_raw()),
            stderr_tail: session.session.stderr_tail(),
        })
    );
    assert!(matches!(
        session.session.start_turn(&c, "again", "turn-3").await,
        Err(HarnessError::ProcessExited {
            signal: Some(9),
            ..
        })
    ));
    procs::wait_group_gone(pid, WAIT).await;
    // Already gone: shutting down just ends the stream.
    session.session.shutdown().await.unwrap();
    assert_ended(&mut session.events, WAIT).await;

    let (mut session, resumed) = s.open(Some(&c)).await;
    assert_eq!(resumed, OpenedSession { id: c, lost: None });
    let seen = session.turn(&resumed.id, "what fruit?", "turn-3").await;
    assert!(matches!(outcome(&seen), TurnOutcome::Completed { .. }));
    let history = all_input_text(s.mock.requests().last().unwrap());
    assert!(history.contains("remember the kiwi"), "{history}");
    assert!(history.contains("ok: remember the kiwi"), "{history}");
    assert!(history.contains("stream slowly"), "{history}");
    session.shutdown().await;
}

#[tokio::test]
async fn dropping_the_session_stops_claude_and_shutdown_before_open_ends_the_events() {
    let s = setup().await;
    let (session, _) = s.open(None).await;
    let pid = session.pid();
    assert!(!procs::group_members(pid).is_empty());
    let Session {
        session,
        mut events,
    } = session;
    drop(session);
    let last = tokio::time::timeout(WAIT, async {
        let mut last = None;
        while let Some(e) = events.recv().await {
            last = Some(e);
        }
        last
    })
    .await
    .unwrap();
    assert!(matches!(last, Some(HarnessEvent::ProcessExited { .. })));
    procs::wait_group_gone(pid, WAIT).await;

    // Never opened: no process, and the stream still ends with `ProcessExited`.
    let session = s.spawn().await;
    assert_eq!(session.session.endpoint().pid(), Some(0));
    session.shutdown().await;
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error() {
    let s = setup().await;
    let mut agent = s.agent();
    agent.command = Some(missing(s.work.path()).display().to_string());
    assert!(matches!(
        ClaudeLauncher.spawn(&agent, None).await.map(|_| ()),
        Err(HarnessError::Spawn { .. })
    ));
}

fn missing(dir: &Path) -> std::path::PathBuf {
    dir.join("no-such-claude")
}

#[tokio::test]
async fn a_failed_model_request_fails_the_turn_with_claudes_message() {
    let s = setup().await;
    s.mock.set_handler(|_| Reply::HttpError {
        status: 500,
        body:
            json!({"type": "error", "error": {"type": "api_error", "message": "mock overloaded"}})
                .to_string(),
    });
    let (mut session, conversation) = s.open(None).await;
    let seen = session.turn(&conversation.id, "hello", "turn-1").await;
    match outcome(&seen) {
        TurnOutcome::Failed { error } => {
            assert!(error.contains("API Error: 500"), "{error}");
            assert!(error.contains("mock overloaded"), "{error}");
        }
        other => panic!("expected a failed turn, got {other:?}"),
    }
    // Claude Code's made-up message that says so is not an agent message.
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, HarnessEvent::ItemStarted { .. })),
        "{seen:?}"
    );
    session.shutdown().await;
}
