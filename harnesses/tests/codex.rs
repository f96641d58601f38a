//! The Codex adapter against the real pinned `codex app-server` and a mock model.
//!
//! Each test has its own mock model, its own `CODEX_HOME` (a tempdir with a
//! `config.toml` pointing at that mock) and its own Codex process, and checks that the
//! process is gone at the end. Every wait has a timeout so a bug fails instead of hanging.
//!
//! Over 600 lines: the adapter's specification against the real Codex, read as one file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use relay_harnesses::codex::{
    codex_program, CodexConfig, CodexSession, ResumedThread, ThreadOptions,
};
use relay_harnesses::HarnessError;
use relay_mock_model::{all_input_text, codex_env, write_codex_home, MockModel, Reply};
use relay_protocol::domain::{ApprovalDecision, ApprovalKind};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_tests::harness_events::{
    assert_ended, first_delta_item, is_approval_requested, is_process_exited, is_text_delta,
    is_turn_completed, outcome, streamed_turn, turn_level, until, within,
};
use relay_tests::{procs, wait_until};
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(20);

struct Setup {
    mock: MockModel,
    home: TempDir,
}

async fn setup() -> Setup {
    let mock = MockModel::start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    write_codex_home(home.path(), &mock.url()).unwrap();
    Setup { mock, home }
}

fn config(home: &Path) -> CodexConfig {
    let mut config = CodexConfig::new(codex_program(None));
    config.env.extend(codex_env(home));
    config.cwd = Some(home.to_path_buf());
    config.request_timeout = WAIT;
    config.shutdown_grace = Duration::from_millis(500);
    config
}

fn thread_options(home: &Path) -> ThreadOptions {
    ThreadOptions {
        cwd: Some(home.to_path_buf()),
        ..Default::default()
    }
}

async fn spawn(home: &Path) -> (CodexSession, Receiver<HarnessEvent>) {
    within(WAIT, "spawn", CodexSession::spawn(config(home)))
        .await
        .expect("spawn failed")
}

/// Waits for the next approval request and accepts it.
async fn accept_next_approval(session: &CodexSession, events: &mut Receiver<HarnessEvent>) {
    let seen = until(events, WAIT, is_approval_requested).await;
    let Some(HarnessEvent::ApprovalRequested { request_id, .. }) = seen.last() else {
        unreachable!("until returns once the predicate held")
    };
    session
        .respond_approval(request_id, ApprovalDecision::Accept)
        .await
        .unwrap();
}

/// [`spawn`], then a thread started with the test's options.
async fn spawn_with_thread(home: &Path) -> (CodexSession, Receiver<HarnessEvent>, String) {
    let (session, events) = spawn(home).await;
    let thread = session.start_thread(&thread_options(home)).await.unwrap();
    (session, events, thread)
}

/// A session whose model runs `command` outside the sandbox (so it asks approval as
/// `call_1`) and then answers "done", its thread started.
async fn escalated_command(command: &str) -> (Setup, CodexSession, Receiver<HarnessEvent>, String) {
    let s = setup().await;
    s.mock.push(Reply::exec_command_escalated(
        "call_1",
        command,
        "needs to run outside the sandbox",
    ));
    s.mock.push(Reply::text("done"));
    let (session, events, thread) = spawn_with_thread(s.home.path()).await;
    (s, session, events, thread)
}

/// The commands' output as it streamed in `seen`.
fn command_output(seen: &[HarnessEvent]) -> String {
    seen.iter()
        .filter_map(|e| match e {
            HarnessEvent::CommandOutputDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

async fn shutdown(session: &CodexSession, events: &mut Receiver<HarnessEvent>) {
    let pid = session.pid();
    session.shutdown().await.unwrap();
    let rest = until(events, WAIT, is_process_exited).await;
    assert!(matches!(
        rest.last(),
        Some(HarnessEvent::ProcessExited { .. })
    ));
    procs::wait_group_gone(pid, WAIT).await;
}

#[tokio::test]
async fn text_turn_streams_deltas_in_order() {
    let s = setup().await;
    let chunks = ["Hel", "lo", ", ", "wor", "ld!"];
    s.mock.push(Reply::chunks(chunks));
    let (session, mut events) = spawn(s.home.path()).await;

    let thread = session
        .start_thread(&thread_options(s.home.path()))
        .await
        .unwrap();
    let turn = session.start_turn(&thread, "say hello").await.unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;

    let item_id = first_delta_item(&seen).expect("no delta");
    assert_eq!(
        turn_level(&seen),
        streamed_turn(&turn, &item_id, &chunks, "Hello, world!")
    );
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::ItemCompleted { item_id: id, text: Some(t), .. } if *id == item_id && t == "Hello, world!")));
    assert!(
        seen.iter().any(|e| matches!(e,
        HarnessEvent::TokenUsage { turn_id, usage } if *turn_id == turn && usage.input_tokens > 0))
    );

    let requests = s.mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].last_user_text().as_deref(), Some("say hello"));
    assert_eq!(session.malformed_lines(), 0);
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn thread_resumes_in_a_new_process() {
    let s = setup().await;
    let (session, mut events, thread) = spawn_with_thread(s.home.path()).await;
    session
        .start_turn(&thread, "remember the word pineapple")
        .await
        .unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "ok: remember the word pineapple".into()
        }
    );
    let first_pid = session.pid();
    shutdown(&session, &mut events).await;
    drop(session);

    let (session, mut events) = spawn(s.home.path()).await;
    assert_ne!(session.pid(), first_pid);
    let resumed = session.resume_thread(&thread).await.unwrap();
    assert_eq!(
        resumed,
        ResumedThread {
            thread_id: thread.clone(),
            turn_count: 1
        }
    );
    let turn = session
        .start_turn(&thread, "which word was it?")
        .await
        .unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    assert_eq!(
        seen.last(),
        Some(&HarnessEvent::TurnCompleted {
            turn_id: turn,
            outcome: TurnOutcome::Completed {
                text: "ok: which word was it?".into()
            }
        })
    );

    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    let history = all_input_text(&requests[1]);
    let first = history
        .find("remember the word pineapple")
        .expect("first user text missing");
    let reply = history
        .find("ok: remember the word pineapple")
        .expect("first reply missing");
    let second = history
        .find("which word was it?")
        .expect("new text missing");
    assert!(first < reply && reply < second, "{history}");
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn unknown_threads_are_thread_not_found() {
    let s = setup().await;
    let (session, mut events) = spawn(s.home.path()).await;
    for bogus in ["01a2018b-0000-7000-8000-000000000000", "not-a-thread"] {
        match session.resume_thread(bogus).await {
            Err(HarnessError::SessionNotFound { session_id }) => assert_eq!(session_id, bogus),
            other => panic!("resume {bogus}: {other:?}"),
        }
        match session.start_turn(bogus, "hi").await {
            Err(HarnessError::SessionNotFound { session_id }) => assert_eq!(session_id, bogus),
            other => panic!("turn on {bogus}: {other:?}"),
        }
    }

    // A thread whose rollout file was deleted is gone too, for a new process.
    let thread = session
        .start_thread(&thread_options(s.home.path()))
        .await
        .unwrap();
    session.start_turn(&thread, "hello").await.unwrap();
    until(&mut events, WAIT, is_turn_completed).await;
    shutdown(&session, &mut events).await;
    let rollout = find_rollout(&s.home.path().join("sessions"), &thread).expect("no rollout");
    std::fs::remove_file(rollout).unwrap();
    let (session, mut events) = spawn(s.home.path()).await;
    assert!(matches!(
        session.resume_thread(&thread).await,
        Err(HarnessError::SessionNotFound { .. })
    ));
    shutdown(&session, &mut events).await;
}

fn find_rollout(dir: &Path, thread: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_rollout(&path, thread) {
                return Some(found);
            }
        } else if path.to_string_lossy().contains(thread) {
            return Some(path);
        }
    }
    None
}

#[tokio::test]
async fn interrupt_ends_a_streaming_turn() {
    let s = setup().await;
    s.mock.push(Reply::slow_chunks(
        ["one ", "two ", "three"],
        Duration::from_secs(30),
    ));
    let (session, mut events, thread) = spawn_with_thread(s.home.path()).await;
    let turn = session.start_turn(&thread, "count slowly").await.unwrap();
    let seen = until(&mut events, WAIT, is_text_delta).await;
    assert!(matches!(seen.last(), Some(HarnessEvent::TextDelta { delta, .. }) if delta == "one "));

    session.interrupt(&thread, &turn).await.unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    assert_eq!(
        seen.last(),
        Some(&HarnessEvent::TurnCompleted {
            turn_id: turn.clone(),
            outcome: TurnOutcome::Interrupted
        })
    );
    assert!(!seen.iter().any(is_text_delta));

    // Nothing left to interrupt: refused, not hung.
    assert!(matches!(
        session.interrupt(&thread, &turn).await,
        Err(HarnessError::Rpc { .. })
    ));

    // A hung model request is interrupted the same way.
    s.mock.push(Reply::hang());
    let turn = session.start_turn(&thread, "hang").await.unwrap();
    s.mock.wait_for_requests(2, WAIT).await.unwrap();
    session.interrupt(&thread, &turn).await.unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    assert_eq!(outcome(&seen), TurnOutcome::Interrupted);
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn steer_adds_input_to_the_running_turn() {
    let s = setup().await;
    s.mock.push(Reply::slow_chunks(
        ["Xyzzy-draft ", "on ", "it"],
        Duration::from_secs(30),
    ));
    let (session, mut events, thread) = spawn_with_thread(s.home.path()).await;
    let turn = session.start_turn(&thread, "write a poem").await.unwrap();
    until(&mut events, WAIT, is_text_delta).await;

    session
        .steer(&thread, &turn, "make it about rust")
        .await
        .unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    // The same turn goes on and answers the steered input (the mock echoes the last user
    // text).
    assert!(!seen
        .iter()
        .any(|e| matches!(e, HarnessEvent::TurnStarted { .. })));
    assert_eq!(
        seen.last(),
        Some(&HarnessEvent::TurnCompleted {
            turn_id: turn.clone(),
            outcome: TurnOutcome::Completed {
                text: "ok: make it about rust".into()
            }
        })
    );
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::ItemCompleted { kind: relay_protocol::harness::ItemKind::UserMessage, text: Some(t), .. }
            if t == "make it about rust")));

    // Codex cut the slow request short and sampled again with both inputs, as two user
    // messages; the partial answer ("Xyzzy-draft ") was dropped, not sent back.
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    let input = all_input_text(&requests[1]);
    let original = input.find("write a poem").expect("original input missing");
    let steered = input
        .find("make it about rust")
        .expect("steered input missing");
    assert!(original < steered, "{input}");
    assert!(!input.contains("Xyzzy-draft"), "{input}");

    // Steering a turn that is over is refused.
    assert!(matches!(
        session.steer(&thread, &turn, "too late").await,
        Err(HarnessError::Rpc { .. })
    ));
    shutdown(&session, &mut events).await;
}

async fn approval_turn(decision: ApprovalDecision) -> (Vec<HarnessEvent>, Vec<(String, String)>) {
    let (s, session, mut events, thread) = escalated_command("echo relay-approved").await;
    let turn = session.start_turn(&thread, "run it").await.unwrap();
    let seen = until(&mut events, WAIT, is_approval_requested).await;
    let Some(HarnessEvent::ApprovalRequested {
        turn_id,
        request_id,
        kind,
        detail,
        reason,
    }) = seen.last().cloned()
    else {
        unreachable!()
    };
    assert_eq!(turn_id, turn);
    assert_eq!(kind, ApprovalKind::Command);
    // The whole command, as codex will run it (policies and people decide on that).
    assert_eq!(detail, "/bin/bash -lc 'echo relay-approved'");
    assert_eq!(reason.as_deref(), Some("needs to run outside the sandbox"));

    session
        .respond_approval(&request_id, decision)
        .await
        .unwrap();
    // Answered once only.
    assert!(matches!(
        session.respond_approval(&request_id, decision).await,
        Err(HarnessError::UnknownRequest { .. })
    ));
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    assert!(seen.contains(&HarnessEvent::ApprovalResolved {
        request_id: request_id.clone()
    }));
    assert_eq!(
        outcome(&seen),
        TurnOutcome::Completed {
            text: "done".into()
        }
    );
    let requests = s.mock.requests();
    assert_eq!(requests.len(), 2);
    let outputs = requests[1].function_call_outputs();
    shutdown(&session, &mut events).await;
    (seen, outputs)
}

#[tokio::test]
async fn approved_command_runs() {
    let (seen, outputs) = approval_turn(ApprovalDecision::Accept).await;
    let output = command_output(&seen);
    assert_eq!(output, "relay-approved\n");
    assert!(seen.iter().any(|e| matches!(e,
        HarnessEvent::ItemCompleted { kind: relay_protocol::harness::ItemKind::CommandExecution, text: Some(t), .. }
            if t == "/bin/bash -lc 'echo relay-approved'")));
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].0, "call_1");
    assert!(outputs[0].1.contains("relay-approved"), "{outputs:?}");
    assert!(outputs[0].1.contains("exited with code 0"), "{outputs:?}");
}

/// A command that fails: its item completes with its command line and Codex's exit
/// status, its output streamed before.
#[tokio::test]
async fn a_failing_command_reports_its_exit_code_and_output() {
    // `_s` holds the mock model and the home until the test ends.
    let (_s, session, mut events, thread) = escalated_command("echo hi; exit 3").await;
    session.start_turn(&thread, "run it").await.unwrap();
    accept_next_approval(&session, &mut events).await;
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    let output = command_output(&seen);
    assert_eq!(output, "hi\n");
    let completed: Vec<_> = seen
        .iter()
        .filter_map(|e| match e {
            HarnessEvent::ItemCompleted {
                kind: relay_protocol::harness::ItemKind::CommandExecution,
                text,
                exit_code,
                ..
            } => Some((text.clone(), *exit_code)),
            _ => None,
        })
        .collect();
    assert_eq!(
        completed,
        [(Some("/bin/bash -lc 'echo hi; exit 3'".to_string()), Some(3))]
    );
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn declined_command_does_not_run() {
    let (seen, outputs) = approval_turn(ApprovalDecision::Decline).await;
    assert!(!seen
        .iter()
        .any(|e| matches!(e, HarnessEvent::CommandOutputDelta { .. })));
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].0, "call_1");
    // Codex 0.169.0 reports: `exec_command failed: CreateProcess { message:
    // "Rejected(\"rejected by user\")" }`.
    assert!(outputs[0].1.contains("rejected by user"), "{outputs:?}");
}

#[tokio::test]
async fn killed_child_fails_pending_requests_and_ends_events() {
    let s = setup().await;
    // The turn runs an approved command (Codex starts it in a session of its own), then
    // hangs in the next model request.
    s.mock.push(Reply::exec_command_escalated(
        "call_1",
        "sleep 39.75",
        "wait a while",
    ));
    s.mock.push(Reply::hang());
    let (session, mut events, thread) = spawn_with_thread(s.home.path()).await;
    let pid = session.pid();
    let turn = session.start_turn(&thread, "hang").await.unwrap();
    accept_next_approval(&session, &mut events).await;
    let sleeper = wait_for_process_with("sleep 39.75").await;

    // Stopped, Codex cannot answer: the interrupt below is surely pending when it dies.
    // The whole group: with Node < 22.15 the pid is the `codex.js` launcher and the native
    // binary is its child.
    procs::signal(-i32::try_from(pid).unwrap(), procs::Signal::STOP);
    let pending = {
        let session = session.clone();
        let (thread, turn) = (thread.clone(), turn.clone());
        tokio::spawn(async move { session.interrupt(&thread, &turn).await })
    };
    // Until every task of this (single-threaded) runtime waits: the interrupt has reached
    // the session's owner task, which wrote it to Codex's stdin and parked its reply, and
    // nothing more can happen while Codex is stopped. On paused time a sleep ends exactly
    // then, when the runtime has nothing left to run, so it is that event, not a time.
    tokio::time::pause();
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::time::resume();
    procs::signal(pid, procs::Signal::KILL);

    let result = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    match result {
        Err(HarnessError::ProcessExited { code, signal, .. }) => {
            assert_eq!(
                (code, signal),
                (None, Some(rustix::process::Signal::KILL.as_raw()))
            );
        }
        other => panic!("expected ProcessExited, got {other:?}"),
    }
    let seen = until(&mut events, WAIT, is_process_exited).await;
    assert!(matches!(
        seen.last(),
        Some(HarnessEvent::ProcessExited {
            code: None,
            signal: Some(9),
            ..
        })
    ));
    // ProcessExited is the last event.
    assert_ended(&mut events, WAIT).await;
    // Later calls fail at once with the same typed error.
    assert!(matches!(
        session.start_turn(&thread, "again").await,
        Err(HarnessError::ProcessExited {
            signal: Some(9),
            ..
        })
    ));
    procs::wait_group_gone(pid, WAIT).await;
    assert_gone(sleeper).await;
    session.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_and_drop_leave_no_process() {
    let s = setup().await;

    // Shutdown, with a command still running in the turn.
    s.mock.push(Reply::exec_command_escalated(
        "call_1",
        "sleep 37.25",
        "wait a while",
    ));
    let (session, mut events, thread) = spawn_with_thread(s.home.path()).await;
    let pid = session.pid();
    session.start_turn(&thread, "sleep").await.unwrap();
    accept_next_approval(&session, &mut events).await;
    let sleeper = wait_for_process_with("sleep 37.25").await;
    shutdown(&session, &mut events).await;
    assert!(session
        .start_thread(&ThreadOptions::default())
        .await
        .is_err());
    assert_gone(sleeper).await;

    // Drop every handle: the owner task shuts the process down by itself.
    let (session, mut events) = spawn(s.home.path()).await;
    let pid2 = session.pid();
    assert_ne!(pid, pid2);
    assert!(!procs::group_members(pid2).is_empty());
    drop(session);
    let seen = until(&mut events, WAIT, is_process_exited).await;
    assert!(matches!(
        seen.last(),
        Some(HarnessEvent::ProcessExited { .. })
    ));
    procs::wait_group_gone(pid2, WAIT).await;
}

/// The pid of the process whose command line is `command` (its words), once it runs.
async fn wait_for_process_with(command: &str) -> u32 {
    let argv: Vec<&str> = command.split(' ').collect();
    wait_until(format!("a process running {command:?}"), WAIT, || async {
        procs::running(&argv).first().copied()
    })
    .await
}

async fn assert_gone(pid: u32) {
    let cmdline = procs::cmdline(pid);
    assert!(
        procs::wait_gone(pid, WAIT).await,
        "process {pid} ({cmdline:?}) survived"
    );
}

#[tokio::test]
async fn failed_model_response_fails_the_turn() {
    let s = setup().await;
    s.mock.push(Reply::failed("the mock model broke"));
    let (session, mut events, thread) = spawn_with_thread(s.home.path()).await;
    session.start_turn(&thread, "try").await.unwrap();
    let seen = until(&mut events, WAIT, is_turn_completed).await;
    match outcome(&seen) {
        TurnOutcome::Failed { error } => assert!(error.contains("the mock model broke"), "{error}"),
        other => panic!("expected failure, got {other:?}"),
    }
    shutdown(&session, &mut events).await;
}

#[tokio::test]
async fn spawn_errors_are_typed() {
    let home = tempfile::tempdir().unwrap();
    let mut config = config(home.path());
    config.program = "/nonexistent/codex".into();
    assert!(matches!(
        CodexSession::spawn(config).await,
        Err(HarnessError::Spawn { .. })
    ));

    // A program that exits at once: the handshake fails with the exit, not a timeout.
    // `sh app-server` runs the file `app-server` in the cwd: no executable file to write
    // (and no ETXTBSY race with other tests forking meanwhile).
    std::fs::write(
        home.path().join("app-server"),
        "echo bad config >&2\nexit 7\n",
    )
    .unwrap();
    let mut config = self::config(home.path());
    config.program = "/bin/sh".into();
    match CodexSession::spawn(config).await {
        Err(HarnessError::ProcessExited {
            code, stderr_tail, ..
        }) => {
            assert_eq!(code, Some(7));
            assert_eq!(stderr_tail, "bad config");
        }
        other => panic!("expected ProcessExited, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// The wire names this adapter relies on exist in the pinned Codex's own schema.

/// Every definition in the generated schema (top level, `v1/`, `v2/` and the bundles),
/// by name.
fn schema_definitions(dir: &Path) -> std::collections::HashMap<String, Value> {
    fn add(defs: &mut std::collections::HashMap<String, Value>, doc: &Value) {
        if let Some(title) = doc.get("title").and_then(Value::as_str) {
            defs.entry(title.to_string()).or_insert_with(|| doc.clone());
        }
        if let Some(map) = doc.get("definitions").and_then(Value::as_object) {
            for (name, def) in map {
                defs.entry(name.clone()).or_insert_with(|| def.clone());
                add(defs, def);
            }
        }
    }
    let mut defs = std::collections::HashMap::new();
    for sub in ["", "v1", "v2"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json") {
                let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                add(&mut defs, &doc);
            }
        }
    }
    defs
}

/// The `method` names of a `oneOf` union such as `ClientRequest`.
fn union_methods(union: &Value) -> BTreeSet<String> {
    union["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| {
            v["properties"]["method"]["enum"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|m| m.as_str().map(str::to_string))
        .collect()
}

fn properties(def: &Value) -> BTreeSet<String> {
    def.get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// The strings of a schema's `enum` list.
fn enum_strings(list: &Value) -> BTreeSet<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

/// The keys of `value` (a serialised sample of one of our types).
fn keys(value: &impl serde::Serialize) -> BTreeSet<String> {
    serde_json::to_value(value)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// `sample` with only the keys the schema `def` requires still parses as a `T`.
fn parses_with_only_required<T: serde::de::DeserializeOwned>(
    name: &str,
    def: &Value,
    sample: &impl serde::Serialize,
) {
    let required: BTreeSet<&str> = def["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut minimal = serde_json::to_value(sample).unwrap();
    minimal
        .as_object_mut()
        .unwrap()
        .retain(|k, _| required.contains(k.as_str()));
    if let Err(e) = serde_json::from_value::<T>(minimal.clone()) {
        panic!("{name}: our type needs more than the schema requires ({required:?}): {e}; sent {minimal}");
    }
}

#[tokio::test]
async fn wire_names_exist_in_the_generated_schema() {
    use relay_harnesses::codex::app_server::{self as wire, *};

    let dir = tempfile::tempdir().unwrap();
    let status = tokio::process::Command::new(codex_program(None))
        .args(["app-server", "generate-json-schema", "--out"])
        .arg(dir.path())
        .kill_on_drop(true)
        .status();
    let status = tokio::time::timeout(WAIT, status).await.unwrap().unwrap();
    assert!(status.success());
    let defs = schema_definitions(dir.path());
    let def = |name: &str| -> &Value {
        defs.get(name)
            .unwrap_or_else(|| panic!("schema has no definition {name}"))
    };

    // Method names.
    let client = union_methods(def("ClientRequest"));
    for m in wire::method::ALL {
        assert!(client.contains(m), "client request {m} not in schema");
    }
    assert!(union_methods(def("ClientNotification")).contains(wire::method::INITIALIZED));
    let notifications = union_methods(def("ServerNotification"));
    for m in wire::notification::ALL {
        assert!(notifications.contains(m), "notification {m} not in schema");
    }
    let server_requests = union_methods(def("ServerRequest"));
    for m in wire::server_request::ALL {
        assert!(
            server_requests.contains(m),
            "server request {m} not in schema"
        );
    }

    // Field names: every key our types write or read must be a property of the schema
    // type. Samples have every optional field set so that all keys appear.
    let check = |name: &str, ours: BTreeSet<String>| {
        let theirs = properties(def(name));
        let missing: Vec<_> = ours.difference(&theirs).collect();
        assert!(
            missing.is_empty(),
            "{name}: {missing:?} not in schema {theirs:?}"
        );
    };
    // Types we read must also parse when Codex sends only what its schema requires: none
    // of our fields may be required where Codex's is optional.
    macro_rules! read_type {
        ($name:expr, $ty:ty, $sample:expr) => {{
            let sample: $ty = $sample;
            check($name, keys(&sample));
            parses_with_only_required::<$ty>($name, def($name), &sample);
        }};
    }
    let s = || Some("x".to_string());
    check(
        "InitializeParams",
        keys(&InitializeParams {
            client_info: ClientInfo {
                name: "r".into(),
                title: s(),
                version: "1".into(),
            },
            capabilities: Some(InitializeCapabilities {
                opt_out_notification_methods: Some(vec![]),
            }),
        }),
    );
    check(
        "ClientInfo",
        keys(&ClientInfo {
            name: "r".into(),
            title: s(),
            version: "1".into(),
        }),
    );
    check(
        "InitializeCapabilities",
        keys(&InitializeCapabilities {
            opt_out_notification_methods: Some(vec![]),
        }),
    );
    read_type!(
        "InitializeResponse",
        InitializeResponse,
        InitializeResponse {
            user_agent: "u".into(),
            codex_home: s(),
            platform_os: s(),
        }
    );
    check(
        "ThreadStartParams",
        keys(&ThreadStartParams {
            cwd: s(),
            model: s(),
            approval_policy: Some(AskForApproval::OnRequest),
            sandbox: Some(SandboxMode::ReadOnly),
            base_instructions: s(),
            developer_instructions: s(),
        }),
    );
    check(
        "ThreadResumeParams",
        keys(&ThreadResumeParams {
            thread_id: "t".into(),
            cwd: s(),
            model: s(),
            approval_policy: Some(AskForApproval::OnRequest),
            sandbox: Some(SandboxMode::ReadOnly),
            developer_instructions: s(),
        }),
    );
    let turn = Turn {
        id: "u".into(),
        status: TurnStatus::Completed,
        items: vec![],
        error: Some(TurnError {
            message: "m".into(),
            additional_details: s(),
            codex_error_info: Some(Value::Null),
        }),
    };
    let thread = Thread {
        id: "t".into(),
        path: s(),
        cwd: s(),
        preview: s(),
        turns: vec![],
    };
    read_type!(
        "ThreadStartResponse",
        ThreadStartResponse,
        ThreadStartResponse {
            thread: thread.clone(),
            model: s(),
        }
    );
    read_type!(
        "ThreadResumeResponse",
        ThreadResumeResponse,
        ThreadResumeResponse {
            thread: thread.clone(),
            model: s(),
        }
    );
    check(
        "ThreadForkParams",
        keys(&ThreadForkParams {
            thread_id: "t".into(),
            last_turn_id: s(),
            cwd: s(),
            model: s(),
            approval_policy: Some(AskForApproval::OnRequest),
            sandbox: Some(SandboxMode::ReadOnly),
            developer_instructions: s(),
            exclude_turns: true,
        }),
    );
    read_type!(
        "ThreadForkResponse",
        ThreadForkResponse,
        ThreadForkResponse {
            thread: thread.clone(),
            model: s(),
        }
    );
    check(
        "ThreadTurnsListParams",
        keys(&ThreadTurnsListParams {
            thread_id: "t".into(),
            cursor: s(),
            limit: Some(2),
            sort_direction: Some(SortDirection::Asc),
            items_view: Some(TurnItemsView::NotLoaded),
        }),
    );
    read_type!(
        "ThreadTurnsListResponse",
        ThreadTurnsListResponse,
        ThreadTurnsListResponse {
            data: vec![turn.clone()],
            next_cursor: s(),
        }
    );
    read_type!("Thread", Thread, thread.clone());
    read_type!("Turn", Turn, turn.clone());
    read_type!("TurnError", TurnError, turn.error.clone().unwrap());
    check(
        "TurnStartParams",
        keys(&TurnStartParams {
            thread_id: "t".into(),
            input: vec![],
        }),
    );
    read_type!(
        "TurnStartResponse",
        TurnStartResponse,
        TurnStartResponse { turn: turn.clone() }
    );
    check(
        "TurnSteerParams",
        keys(&TurnSteerParams {
            thread_id: "t".into(),
            expected_turn_id: "u".into(),
            input: vec![],
        }),
    );
    read_type!(
        "TurnSteerResponse",
        TurnSteerResponse,
        TurnSteerResponse {
            turn_id: "u".into(),
        }
    );
    check(
        "TurnInterruptParams",
        keys(&TurnInterruptParams {
            thread_id: "t".into(),
            turn_id: "u".into(),
        }),
    );
    read_type!(
        "TurnStartedNotification",
        TurnNotification,
        TurnNotification {
            thread_id: "t".into(),
            turn: turn.clone(),
        }
    );
    read_type!(
        "TurnCompletedNotification",
        TurnNotification,
        TurnNotification {
            thread_id: "t".into(),
            turn: turn.clone(),
        }
    );
    read_type!(
        "ThreadStartedNotification",
        ThreadStartedNotification,
        ThreadStartedNotification {
            thread: thread.clone(),
        }
    );
    let item = ItemNotification {
        thread_id: "t".into(),
        turn_id: "u".into(),
        item: ThreadItem::Known(KnownThreadItem::Plan {
            id: "i".into(),
            text: "p".into(),
        }),
    };
    read_type!("ItemStartedNotification", ItemNotification, item.clone());
    read_type!("ItemCompletedNotification", ItemNotification, item.clone());
    let delta = DeltaNotification {
        thread_id: "t".into(),
        turn_id: "u".into(),
        item_id: "i".into(),
        delta: "d".into(),
    };
    read_type!(
        "AgentMessageDeltaNotification",
        DeltaNotification,
        delta.clone()
    );
    read_type!(
        "CommandExecutionOutputDeltaNotification",
        DeltaNotification,
        delta.clone()
    );
    let plan = TurnPlanUpdatedNotification {
        thread_id: "t".into(),
        turn_id: "u".into(),
        explanation: s(),
        plan: vec![TurnPlanStep {
            step: "s".into(),
            status: "pending".into(),
        }],
    };
    read_type!(
        "TurnPlanUpdatedNotification",
        TurnPlanUpdatedNotification,
        plan.clone()
    );
    read_type!("TurnPlanStep", TurnPlanStep, plan.plan[0].clone());
    read_type!(
        "TurnDiffUpdatedNotification",
        TurnDiffUpdatedNotification,
        TurnDiffUpdatedNotification {
            thread_id: "t".into(),
            turn_id: "u".into(),
            diff: "d".into(),
        }
    );
    let usage = TokenUsageUpdatedNotification {
        thread_id: "t".into(),
        turn_id: "u".into(),
        token_usage: ThreadTokenUsage {
            total: TokenUsageBreakdown::default(),
            last: TokenUsageBreakdown::default(),
            model_context_window: Some(1),
        },
    };
    read_type!(
        "ThreadTokenUsageUpdatedNotification",
        TokenUsageUpdatedNotification,
        usage.clone()
    );
    read_type!(
        "ThreadTokenUsage",
        ThreadTokenUsage,
        usage.token_usage.clone()
    );
    read_type!(
        "TokenUsageBreakdown",
        TokenUsageBreakdown,
        usage.token_usage.total
    );
    read_type!(
        "ErrorNotification",
        ErrorNotification,
        ErrorNotification {
            thread_id: "t".into(),
            turn_id: "u".into(),
            error: turn.error.clone().unwrap(),
            will_retry: false,
        }
    );
    read_type!(
        "WarningNotification",
        WarningNotification,
        WarningNotification {
            thread_id: s(),
            message: "m".into(),
        }
    );
    read_type!(
        "ServerRequestResolvedNotification",
        ServerRequestResolvedNotification,
        ServerRequestResolvedNotification {
            thread_id: "t".into(),
            request_id: RequestId::Integer(0),
        }
    );
    read_type!(
        "CommandExecutionRequestApprovalParams",
        CommandExecutionRequestApprovalParams,
        CommandExecutionRequestApprovalParams {
            thread_id: "t".into(),
            turn_id: "u".into(),
            item_id: "i".into(),
            reason: s(),
            command: s(),
            cwd: s(),
            kind: s(),
            network_approval_context: Some(Value::Null),
        }
    );
    read_type!(
        "FileChangeRequestApprovalParams",
        FileChangeRequestApprovalParams,
        FileChangeRequestApprovalParams {
            thread_id: "t".into(),
            turn_id: "u".into(),
            item_id: "i".into(),
            reason: s(),
            grant_root: s(),
        }
    );
    check(
        "CommandExecutionRequestApprovalResponse",
        keys(&ApprovalResponse {
            decision: wire::ApprovalDecision::Accept,
        }),
    );
    check(
        "FileChangeRequestApprovalResponse",
        keys(&ApprovalResponse {
            decision: wire::ApprovalDecision::Accept,
        }),
    );
    // The elicitation's fields are split: the thread, turn and server at the top, the
    // form's (`mode`, `message`, `_meta`) in each `oneOf` variant.
    let elicitation = McpServerElicitationRequestParams {
        thread_id: "t".into(),
        turn_id: s(),
        server_name: "relay".into(),
        mode: "form".into(),
        message: "m".into(),
        meta: Some(Value::Null),
    };
    let elicitation_def = def("McpServerElicitationRequestParams");
    let mut theirs = properties(elicitation_def);
    for variant in elicitation_def["oneOf"].as_array().unwrap() {
        theirs.extend(properties(variant));
    }
    let missing: Vec<_> = keys(&elicitation).difference(&theirs).cloned().collect();
    assert!(
        missing.is_empty(),
        "elicitation: {missing:?} not in schema {theirs:?}"
    );
    parses_with_only_required::<McpServerElicitationRequestParams>(
        "McpServerElicitationRequestParams",
        elicitation_def,
        &elicitation,
    );
    check(
        "McpServerElicitationRequestResponse",
        keys(&McpServerElicitationResponse::accept_tool_call()),
    );
    assert_eq!(
        enum_strings(&def("McpServerElicitationAction")["enum"]),
        [
            McpElicitationAction::Accept,
            McpElicitationAction::Decline,
            McpElicitationAction::Cancel
        ]
        .iter()
        .map(|a| serde_json::to_value(a)
            .unwrap()
            .as_str()
            .unwrap()
            .to_string())
        .collect::<BTreeSet<_>>()
    );
    read_type!(
        "FileUpdateChange",
        FileUpdateChange,
        FileUpdateChange {
            path: "p".into(),
            kind: Value::Null,
            diff: "d".into(),
        }
    );

    // Item types and their fields: each known item is one `oneOf` variant of ThreadItem.
    let variants = def("ThreadItem")["oneOf"].as_array().unwrap().clone();
    let samples = [
        KnownThreadItem::UserMessage {
            id: "i".into(),
            content: vec![UserInput::text("t")],
        },
        KnownThreadItem::AgentMessage {
            id: "i".into(),
            text: "t".into(),
        },
        KnownThreadItem::Plan {
            id: "i".into(),
            text: "t".into(),
        },
        KnownThreadItem::Reasoning {
            id: "i".into(),
            summary: vec![],
            content: vec![],
        },
        KnownThreadItem::CommandExecution {
            id: "i".into(),
            command: "c".into(),
            cwd: s(),
            status: s(),
            aggregated_output: s(),
            exit_code: Some(0),
        },
        KnownThreadItem::FileChange {
            id: "i".into(),
            changes: vec![],
            status: s(),
        },
        KnownThreadItem::McpToolCall {
            id: "i".into(),
            server: "s".into(),
            tool: "t".into(),
            status: s(),
        },
        KnownThreadItem::DynamicToolCall {
            id: "i".into(),
            tool: "t".into(),
            status: s(),
        },
        KnownThreadItem::WebSearch {
            id: "i".into(),
            query: "q".into(),
        },
    ];
    for sample in samples {
        let name = sample.type_name();
        let variant = variants
            .iter()
            .find(|v| v["properties"]["type"]["enum"][0] == name)
            .unwrap_or_else(|| panic!("ThreadItem has no {name} variant"));
        let theirs = properties(variant);
        let missing: Vec<_> = keys(&sample).difference(&theirs).cloned().collect();
        assert!(missing.is_empty(), "item {name}: {missing:?} not in schema");
    }

    // Enum values we send or match on.
    let enum_values = |name: &str| -> BTreeSet<String> {
        let d = def(name);
        let mut out = BTreeSet::new();
        let mut add = |v: &Value| {
            for s in v.as_array().into_iter().flatten() {
                if let Some(s) = s.as_str() {
                    out.insert(s.to_string());
                }
            }
        };
        add(&d["enum"]);
        for key in ["oneOf", "anyOf"] {
            for variant in d[key].as_array().into_iter().flatten() {
                add(&variant["enum"]);
            }
        }
        out
    };
    fn json_str<T: serde::Serialize>(v: &T) -> String {
        serde_json::to_value(v)
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }
    for v in [
        json_str(&AskForApproval::OnRequest),
        json_str(&AskForApproval::Never),
        json_str(&AskForApproval::Untrusted),
    ] {
        assert!(enum_values("AskForApproval").contains(&v), "{v}");
    }
    for v in [
        json_str(&SandboxMode::ReadOnly),
        json_str(&SandboxMode::WorkspaceWrite),
        json_str(&SandboxMode::DangerFullAccess),
    ] {
        assert!(enum_values("SandboxMode").contains(&v), "{v}");
    }
    for v in [
        json_str(&TurnStatus::Completed),
        json_str(&TurnStatus::Interrupted),
        json_str(&TurnStatus::Failed),
        json_str(&TurnStatus::InProgress),
    ] {
        assert!(enum_values("TurnStatus").contains(&v), "{v}");
    }
    for decision in [
        wire::ApprovalDecision::Accept,
        wire::ApprovalDecision::AcceptForSession,
        wire::ApprovalDecision::Decline,
        wire::ApprovalDecision::Cancel,
    ] {
        let v = json_str(&decision);
        assert!(
            enum_values("CommandExecutionApprovalDecision").contains(&v),
            "{v}"
        );
        assert!(
            enum_values("FileChangeApprovalDecision").contains(&v),
            "{v}"
        );
    }
    let text = serde_json::to_value(UserInput::text("t")).unwrap();
    let input_variant = def("UserInput")["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["properties"]["type"]["enum"][0] == "text")
        .cloned()
        .expect("no text input");
    for key in text.as_object().unwrap().keys() {
        assert!(
            properties(&input_variant).contains(key),
            "UserInput text: {key}"
        );
    }
}
