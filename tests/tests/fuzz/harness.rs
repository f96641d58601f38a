//! The harness wires: what an agent CLI prints on stdout (Codex's JSON-RPC lines, Claude
//! Code's stream-json, Pi's RPC), read by each adapter's [`Wire`] with its turn state,
//! Relay's own requests (a turn started, interrupted, steered, an approval answered)
//! interleaved; and a tmux pane's bytes and screens.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::sample::Index;
use relay_harnesses::acp::AcpWire;
use relay_harnesses::claude::ClaudeWire;
use relay_harnesses::codex::CodexWire;
use relay_harnesses::pi::PiWire;
use relay_harnesses::stdio::{Action, Wire};
use relay_harnesses::tmux::screens::{self, Judge, KnownCli, ReadyPattern};
use relay_harnesses::tmux::{sanitize, PaneText};
use relay_protocol::domain::ApprovalDecision;
use relay_tests::fuzz::{bytes, fuzz, line_runs, mutated, Seen};

/// The recorded runs of a CLI (`.jsonl` fixtures, one run each) beside the adapter.
fn recorded(dir: &str) -> Vec<Vec<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {}", dir.display());
    files
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect()
}

/// Codex lines as the pinned Codex sends them (from `codex/translate/tests.rs`): one turn
/// with text, a plan, usage, a command and its output, approvals, an elicitation, errors.
fn codex_runs() -> Vec<Vec<String>> {
    let turn = [
        r#"{"method":"thread/started","params":{"thread":{"id":"th"}}}"#,
        r#"{"method":"turn/started","params":{"threadId":"th","turn":{"id":"t1","status":"inProgress","items":[]}}}"#,
        r#"{"method":"item/started","params":{"threadId":"th","turnId":"t1","item":{"type":"agentMessage","id":"m","text":""}}}"#,
        r#"{"method":"item/agentMessage/delta","params":{"threadId":"th","turnId":"t1","itemId":"m","delta":"he"}}"#,
        r#"{"method":"item/completed","params":{"threadId":"th","turnId":"t1","item":{"type":"agentMessage","id":"m","text":"hello"}}}"#,
        r#"{"method":"turn/plan/updated","params":{"threadId":"th","turnId":"t1","explanation":null,"plan":[{"step":"read","status":"completed"},{"step":"write","status":"inProgress"}]}}"#,
        r#"{"method":"thread/tokenUsage/updated","params":{"threadId":"th","turnId":"t1","tokenUsage":{"total":{"inputTokens":150,"outputTokens":13},"last":{"inputTokens":50,"outputTokens":3}}}}"#,
        r#"{"method":"item/started","params":{"threadId":"th","turnId":"t1","item":{"type":"commandExecution","id":"c","command":"ls","status":"inProgress"}}}"#,
        r#"{"method":"item/commandExecution/outputDelta","params":{"threadId":"th","turnId":"t1","itemId":"c","delta":"hi\n"}}"#,
        r#"{"method":"item/completed","params":{"threadId":"th","turnId":"t1","item":{"type":"commandExecution","id":"c","command":"/bin/bash -lc 'echo hi'","status":"completed","aggregatedOutput":"hi\n","exitCode":0}}}"#,
        r#"{"method":"item/commandExecution/requestApproval","id":0,"params":{"kind":"command","threadId":"th","turnId":"t1","itemId":"call_1","startedAtMs":1,"reason":"needs net","command":"/bin/bash -lc 'echo x'","cwd":"/tmp"}}"#,
        r#"{"method":"item/started","params":{"threadId":"th","turnId":"t1","item":{"type":"fileChange","id":"fc","status":"inProgress","changes":[{"path":"a.rs","kind":{"type":"update","move_path":null},"diff":"@@"},{"path":"b.rs","kind":{"type":"add"},"diff":"+"}]}}}"#,
        r#"{"method":"item/fileChange/requestApproval","id":"s1","params":{"threadId":"th","turnId":"t1","itemId":"fc","startedAtMs":1,"grantRoot":"/w"}}"#,
        r#"{"method":"serverRequest/resolved","params":{"threadId":"th","requestId":"s1"}}"#,
        r#"{"method":"mcpServer/elicitation/request","id":5,"params":{"threadId":"th","turnId":"t1","serverName":"relay","mode":"form","_meta":{"codex_approval_kind":"mcp_tool_call","persist":["session","always"],"tool_name":"ask","tool_description":"Ask another agent.","tool_params":{"agent":"claude-1","text":"hi"},"tool_params_display":[{"name":"agent","value":"claude-1","display_name":"agent"}]},"message":"Allow the relay MCP server to run tool \"ask\"?"}}"#,
        r#"{"method":"error","params":{"error":{"message":"Reconnecting...","codexErrorInfo":{"responseStreamDisconnected":{"httpStatusCode":null}},"additionalDetails":"x"},"willRetry":true,"threadId":"th","turnId":"t1"},"emittedAtMs":1795710959927}"#,
        r#"{"method":"warning","params":{"message":"careful"}}"#,
        r#"{"id":1,"result":{"thread":{"id":"th"}}}"#,
        r#"{"id":2,"error":{"code":-32600,"message":"no such thread"}}"#,
        r#"{"method":"turn/completed","params":{"threadId":"th","turn":{"id":"t1","status":"failed","error":{"message":"own"}}}}"#,
        r#"{"method":"turn/completed","params":{"threadId":"th","turn":{"id":"t1","status":"completed","items":[],"itemsView":"notLoaded"}}}"#,
    ];
    vec![turn.iter().map(|s| s.to_string()).collect()]
}

/// Relay's side of a session, between the CLI's lines.
#[derive(Debug, Clone)]
enum Step {
    Line(String),
    Start,
    Interrupt,
    Steer,
    Answer(Index, u8),
}

fn steps(runs: Vec<Vec<String>>) -> impl Strategy<Value = Vec<Step>> {
    (
        line_runs(runs, 8),
        prop::collection::vec((any::<Index>(), 0u8..4, any::<Index>(), any::<u8>()), 0..4),
    )
        .prop_map(|(lines, ops)| {
            let mut steps: Vec<Step> = std::iter::once(Step::Start)
                .chain(lines.into_iter().map(Step::Line))
                .collect();
            for (at, op, which, d) in ops {
                let step = match op {
                    0 => Step::Start,
                    1 => Step::Interrupt,
                    2 => Step::Steer,
                    _ => Step::Answer(which, d),
                };
                steps.insert(at.index(steps.len() + 1), step);
            }
            steps
        })
}

fn decision(d: u8) -> ApprovalDecision {
    match d % 4 {
        0 => ApprovalDecision::Accept,
        1 => ApprovalDecision::AcceptForSession,
        2 => ApprovalDecision::Decline,
        _ => ApprovalDecision::Cancel,
    }
}

/// The request ids the wire's answers and events named, for Relay's answers to use.
fn seen_ids(out: &[Action]) -> Vec<String> {
    out.iter()
        .filter_map(|a| match a {
            Action::Event(relay_protocol::harness::HarnessEvent::ApprovalRequested {
                request_id,
                ..
            }) => Some(request_id.clone()),
            Action::Answer { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect()
}

/// Counts the events among `out`.
fn events(out: &[Action], seen: &Seen) {
    for a in out {
        if matches!(a, Action::Event(_)) {
            seen.hit();
        }
    }
}

/// Feeds `line` (skipped when empty, as the stdio owner does).
fn read(wire: &mut impl Wire, line: &str, out: &mut Vec<Action>) {
    if !line.is_empty() {
        wire.line(line, out);
    }
}

#[test]
fn codex_app_server_lines() {
    let seen = Seen::default();
    fuzz(
        "codex_app_server_lines",
        1500,
        steps(codex_runs()),
        |steps| {
            let mut wire = CodexWire::new(Arc::new(AtomicU64::new(0)), true);
            let mut out = Vec::new();
            for step in steps {
                match step {
                    Step::Line(line) => read(&mut wire, &line, &mut out),
                    Step::Start => {
                        let _ = wire.request("turn/start", serde_json::json!({"threadId": "th"}));
                    }
                    Step::Interrupt => {
                        let _ = wire.request(
                            "turn/interrupt",
                            serde_json::json!({"threadId": "th", "turnId": "t1"}),
                        );
                    }
                    Step::Steer => {
                        let _ = wire.request(
                            "turn/steer",
                            serde_json::json!({"threadId": "th", "expectedTurnId": "t1",
                                "input": [{"type": "text", "text": "also"}]}),
                        );
                    }
                    // An approval's answer, so what Codex does after one is fuzzed too.
                    Step::Answer(which, d) => {
                        let ids = seen_ids(&out);
                        if !ids.is_empty() {
                            let _ = wire.answer(which.get::<String>(&ids), decision(d));
                        }
                    }
                }
            }
            events(&out, &seen);
            Ok(())
        },
    );
    seen.assert_some("codex_app_server_lines", "events read");
}

#[test]
fn claude_stream_json_lines() {
    let seen = Seen::default();
    fuzz(
        "claude_stream_json_lines",
        1500,
        steps(recorded("harnesses/src/claude/fixtures")),
        |steps| {
            let mut wire = ClaudeWire::new().with_relay_mcp(true);
            let mut out = Vec::new();
            let mut turns = 0;
            for step in steps {
                match step {
                    Step::Line(line) => read(&mut wire, &line, &mut out),
                    Step::Start => {
                        turns += 1;
                        let _ = wire.start_turn(&format!("t{turns}"), "say hello");
                    }
                    Step::Interrupt | Step::Steer => {
                        let _ = wire.interrupt(&format!("t{turns}"));
                    }
                    Step::Answer(which, d) => {
                        let ids = seen_ids(&out);
                        if !ids.is_empty() {
                            let _ = wire.respond(which.get::<String>(&ids), decision(d));
                        }
                    }
                }
            }
            // Each line read is an answer, an event, a line back or a reason it was skipped.
            let _ = wire.running().borrow().clone();
            events(&out, &seen);
            Ok(())
        },
    );
    seen.assert_some("claude_stream_json_lines", "events read");
}

#[test]
fn pi_rpc_lines() {
    let seen = Seen::default();
    fuzz(
        "pi_rpc_lines",
        1500,
        steps(recorded("harnesses/src/pi/wire/fixtures")),
        |steps| {
            let mut wire = PiWire::default();
            let mut out = Vec::new();
            let mut turns = 0;
            for step in steps {
                match step {
                    Step::Line(line) => read(&mut wire, &line, &mut out),
                    Step::Start => {
                        turns += 1;
                        let _ = wire.prompt(&format!("t{turns}"), "say hello");
                    }
                    Step::Interrupt => {
                        let _ = wire.abort(&format!("t{turns}"));
                    }
                    Step::Steer => {
                        let _ = wire.steer(&format!("t{turns}"), "also this");
                    }
                    Step::Answer(..) => {
                        let _ = wire.get_state();
                    }
                }
            }
            events(&out, &seen);
            Ok(())
        },
    );
    seen.assert_some("pi_rpc_lines", "events read");
}

/// The agents' lines of the recorded ACP runs of the three CLIs (`acp/fixtures/*/`,
/// where `< ` marks what the agent wrote).
fn acp_runs() -> Vec<Vec<String>> {
    ["gemini", "opencode", "qwen"]
        .iter()
        .flat_map(|cli| recorded(&format!("harnesses/src/acp/fixtures/{cli}")))
        .map(|run| {
            run.iter()
                .filter_map(|l| l.strip_prefix("< ").map(str::to_string))
                .collect()
        })
        .collect()
}

#[test]
fn acp_lines() {
    let seen = Seen::default();
    fuzz("acp_lines", 1500, steps(acp_runs()), |steps| {
        let mut wire = AcpWire::titled_by_command();
        let mut out = Vec::new();
        let mut turns = 0;
        let mut session = String::from("s");
        for step in steps {
            match step {
                Step::Line(line) => {
                    // The session the recorded lines are about, as `session/new` set it.
                    if let Some(id) = serde_json::from_str::<serde_json::Value>(&line)
                        .ok()
                        .and_then(|v| v["params"]["sessionId"].as_str().map(str::to_string))
                    {
                        if id != session {
                            session = id;
                            wire.set_session(&session);
                        }
                    }
                    read(&mut wire, &line, &mut out)
                }
                Step::Start => {
                    turns += 1;
                    let _ = wire.prompt(&session, &format!("t{turns}"), "say hello");
                }
                Step::Interrupt => {
                    let _ = wire.cancel(&session, &format!("t{turns}"));
                }
                Step::Steer => {
                    let _ = wire.cancel_one_pending();
                }
                Step::Answer(which, d) => {
                    let ids = seen_ids(&out);
                    if !ids.is_empty() {
                        let _ = wire.answer(which.get::<String>(&ids), decision(d));
                    }
                }
            }
        }
        events(&out, &seen);
        Ok(())
    });
    seen.assert_some("acp_lines", "events read");
}

/// Screens captured from the real CLIs (`tmux/screens/`).
fn screens() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../harnesses/src/tmux/screens");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .collect();
    out.push(b"\x1b[?2004h\x1b[1;32m$ \x1b[0m\x1b]0;title\x07\x1bP+q\x1b\\ready\r\n".to_vec());
    out
}

#[test]
fn tmux_pane_output_and_screens() {
    let screens = screens();
    let input = (
        prop::collection::vec(prop_oneof![1 => bytes(512), 3 => mutated(screens)], 1..4),
        prop::option::of("[a-z^$.*+?()|\\[\\]{}\\\\0-9 ›❯─]{1,24}"),
        0usize..12,
    );
    let blocked = Seen::default();
    fuzz(
        "tmux_pane_output_and_screens",
        1500,
        input,
        |(chunks, pattern, n)| {
            // The pane's bytes as the output reader gets them: in chunks, one parser across.
            let mut pane = PaneText::default();
            let mut text = String::new();
            for chunk in &chunks {
                text.push_str(&pane.push(chunk));
            }
            prop_assert!(
                !text.contains('\u{1b}'),
                "the rendered text holds no escape: {text:?}"
            );
            // A capture as the readiness judges and `relay agent peek` read it.
            let screen = String::from_utf8_lossy(&chunks.concat()).into_owned();
            let tidy = screens::tidy(&screen);
            prop_assert!(
                !tidy.ends_with('\n'),
                "tidy leaves no blank line at the end"
            );
            let pattern = pattern.and_then(|p| ReadyPattern::new(&p).ok());
            for cli in [None, Some(KnownCli::Codex), Some(KnownCli::Claude)] {
                let judge = Judge {
                    cli,
                    pattern: pattern.clone(),
                };
                if let screens::Readiness::Blocked(..) = judge.judge(&screen) {
                    blocked.hit();
                }
                if let Some(cli) = cli {
                    let _ = screens::blocker(cli, &tidy);
                    let _ = screens::ready(cli, &tidy);
                }
            }
            let last = screens::last_lines(&screen, n);
            prop_assert!(
                !last.chars().any(|c| c.is_control()),
                "last_lines escapes control characters: {last:?}"
            );
            let clean = sanitize::sanitize(&screen);
            prop_assert!(
                !clean.chars().any(|c| c.is_control() && c != '\n'),
                "sanitize leaves no control character but newlines: {clean:?}"
            );
            Ok(())
        },
    );
    blocked.assert_some("tmux_pane_output_and_screens", "judged a blocking screen");
}
