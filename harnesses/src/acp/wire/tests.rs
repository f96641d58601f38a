//! The wire over the transcripts recorded from the real CLIs (`../fixtures/`, see its
//! README): the client's requests are made again by the wire itself (so its ids follow
//! the recording's 1, 2, 3...), the agent's lines are fed as they came, and each
//! permission request is answered by the wire with the decision the driver took.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_protocol::acp::{method, NewSessionRequest};
use relay_protocol::domain::{ApprovalDecision, ApprovalKind, TokenUsage};
use relay_protocol::harness::{HarnessEvent, ItemKind, TurnOutcome};
use serde_json::{json, Value};

use super::*;
use crate::fixtures::{completed, events_of, TURN};

/// What a transcript gave: the events, and what the wire wrote back on its own
/// (answers to the agent's requests) or to answer an approval.
struct Run {
    events: Vec<HarnessEvent>,
    written: Vec<Value>,
    quiet: u64,
}

/// Replays `fixture` (`cli/name`) through a wire; approvals are decided with
/// `decision`, and the turn is cancelled after its first delta when `cancel`.
fn replay(fixture: &str, decision: ApprovalDecision, cancel: bool) -> Run {
    let path = format!(
        "{}/src/acp/fixtures/{fixture}.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut wire = if fixture.starts_with("gemini") {
        AcpWire::titled_by_command()
    } else {
        AcpWire::default()
    };
    let (mut events, mut written) = (Vec::new(), Vec::new());
    let mut cancelled = false;
    for line in text.lines() {
        if let Some(client) = line.strip_prefix("> ") {
            let msg: Value = serde_json::from_str(client).unwrap();
            let params = msg["params"].clone();
            match msg["method"].as_str() {
                Some(method::SESSION_PROMPT) => {
                    let session = params["sessionId"].as_str().unwrap();
                    let prompt = params["prompt"][0]["text"].as_str().unwrap();
                    let out = wire.prompt(session, TURN, prompt).unwrap();
                    assert_eq!(out.message["id"], msg["id"], "{fixture}: ids in step");
                }
                Some(method::SESSION_CANCEL) => {}
                Some(m @ (method::SESSION_LOAD | method::SESSION_RESUME)) => {
                    wire.set_session(params["sessionId"].as_str().unwrap());
                    let out = wire.request(m, params.clone());
                    assert_eq!(out.message["id"], msg["id"], "{fixture}: ids in step");
                }
                Some(m @ method::SESSION_NEW) => {
                    let p: NewSessionRequest = serde_json::from_value(params).unwrap();
                    assert!(p.mcp_servers.is_empty());
                    let out = wire.request(m, json!(p));
                    assert_eq!(out.message["id"], msg["id"], "{fixture}: ids in step");
                }
                Some(m) => {
                    let out = wire.request(m, params);
                    assert_eq!(out.message["id"], msg["id"], "{fixture}: ids in step");
                }
                // The driver's answers: the wire gives its own.
                None => {}
            }
            continue;
        }
        let Some(agent) = line.strip_prefix("< ") else {
            continue;
        };
        let mut out = Vec::new();
        wire.line(agent, &mut out);
        for action in &out {
            match action {
                Action::Send(v) => written.push(v.clone()),
                Action::Malformed(why) => panic!("{fixture}: a recorded line is malformed: {why}"),
                _ => {}
            }
        }
        for event in events_of(&out) {
            if let HarnessEvent::ApprovalRequested { request_id, .. } = &event {
                written.push(wire.answer(request_id, decision).unwrap().message);
            }
            if cancel && !cancelled && matches!(event, HarnessEvent::TextDelta { .. }) {
                cancelled = true;
                let session = wire.session.clone().unwrap();
                written.push(wire.cancel(&session, TURN).unwrap().message);
            }
            events.push(event);
        }
    }
    Run {
        events,
        written,
        quiet: wire.quiet.load(Ordering::Relaxed),
    }
}

fn outcome(run: &Run) -> TurnOutcome {
    match run.events.last() {
        Some(HarnessEvent::TurnCompleted { outcome, .. }) => outcome.clone(),
        other => panic!("the turn did not end: {other:?}\n{:?}", run.events),
    }
}

fn text_of(run: &Run) -> String {
    run.events
        .iter()
        .filter_map(|e| match e {
            HarnessEvent::TextDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

const CLIS: [&str; 3] = ["gemini", "opencode", "qwen"];

#[test]
fn each_cli_streams_its_text_as_deltas_of_one_message() {
    for cli in CLIS {
        let run = replay(
            &format!("{cli}/prompt_text"),
            ApprovalDecision::Accept,
            false,
        );
        assert_eq!(
            outcome(&run),
            TurnOutcome::Completed {
                text: "alpha beta gamma".into()
            },
            "{cli}"
        );
        let deltas: Vec<&HarnessEvent> = run
            .events
            .iter()
            .filter(|e| matches!(e, HarnessEvent::TextDelta { .. }))
            .collect();
        assert_eq!(deltas.len(), 3, "{cli}: {:?}", run.events);
        assert!(run.events.contains(&HarnessEvent::ItemCompleted {
            turn_id: TURN.into(),
            item_id: format!("{TURN}-i1"),
            kind: ItemKind::AgentMessage,
            text: Some("alpha beta gamma".into()),
            exit_code: None,
        }));
        assert_eq!(run.events[0], crate::fixtures::turn_started(), "{cli}");
        // Every event is the turn's.
        assert!(run.events.iter().all(|e| !matches!(
            e,
            HarnessEvent::ApprovalRequested { .. } | HarnessEvent::Warning { .. }
        )));
    }
    // Usage: OpenCode's in the prompt's answer, Qwen Code's on its chunks' `_meta`.
    for cli in ["opencode", "qwen"] {
        let run = replay(
            &format!("{cli}/prompt_text"),
            ApprovalDecision::Accept,
            false,
        );
        assert!(
            run.events.iter().any(
                |e| matches!(e, HarnessEvent::TokenUsage { usage, .. } if usage.input_tokens > 0)
            ),
            "{cli}: {:?}",
            run.events
        );
    }
}

#[test]
fn a_shell_call_is_a_command_approval_answered_with_the_once_options() {
    for (cli, allow, reject) in [
        ("gemini", "proceed_once", "cancel"),
        ("opencode", "once", "reject"),
        ("qwen", "proceed_once", "cancel"),
    ] {
        for (name, decision, option, file) in [
            (
                "tool_allow",
                ApprovalDecision::AcceptForSession,
                allow,
                "relay-allowed",
            ),
            (
                "tool_reject",
                ApprovalDecision::Decline,
                reject,
                "relay-rejected",
            ),
        ] {
            let run = replay(&format!("{cli}/{name}"), decision, false);
            let asked: Vec<(&ApprovalKind, &str)> = run
                .events
                .iter()
                .filter_map(|e| match e {
                    HarnessEvent::ApprovalRequested { kind, detail, .. } => {
                        Some((kind, detail.as_str()))
                    }
                    _ => None,
                })
                .collect();
            let command = format!("echo {file} > {file}.txt");
            assert_eq!(
                asked,
                [(&ApprovalKind::Command, command.as_str())],
                "{cli}/{name}"
            );
            let answers: Vec<&Value> = run
                .written
                .iter()
                .filter(|w| w["result"]["outcome"]["outcome"] == "selected")
                .collect();
            assert_eq!(answers.len(), 1, "{cli}/{name}: {:?}", run.written);
            assert_eq!(answers[0]["result"]["outcome"]["optionId"], option);
            assert!(
                matches!(outcome(&run), TurnOutcome::Completed { .. }),
                "{cli}/{name}: {:?}",
                run.events
            );
            // The command's item: started, completed with the call and how it went.
            let done = run.events.iter().find_map(|e| match e {
                HarnessEvent::ItemCompleted {
                    kind: ItemKind::CommandExecution,
                    text,
                    ..
                } => text.clone(),
                _ => None,
            });
            match done {
                Some(done) => assert!(done.starts_with(&command), "{cli}/{name}: {done}"),
                // Gemini CLI says nothing more of a call it was not allowed to run: the
                // approval's decision is its record.
                None => assert_eq!((cli, name), ("gemini", "tool_reject"), "{:?}", run.events),
            }
        }
    }
    // Qwen Code asks `craft/drainMidTurnQueue` mid-turn: refused, the turn goes on.
    let run = replay("qwen/tool_allow", ApprovalDecision::Accept, false);
    assert!(run
        .written
        .iter()
        .any(|w| w["error"]["code"] == RpcError::METHOD_NOT_FOUND));
}

#[test]
fn a_cancel_ends_the_turn_interrupted() {
    for cli in CLIS {
        let run = replay(&format!("{cli}/cancel"), ApprovalDecision::Accept, true);
        assert_eq!(outcome(&run), TurnOutcome::Interrupted, "{cli}");
        assert!(run
            .written
            .iter()
            .any(|w| w["method"] == method::SESSION_CANCEL));
    }
}

#[test]
fn a_model_failure_fails_the_turn_with_the_agents_error() {
    for cli in CLIS {
        let run = replay(&format!("{cli}/fail"), ApprovalDecision::Accept, false);
        match outcome(&run) {
            TurnOutcome::Failed { error } => {
                assert!(
                    error.starts_with("the agent failed the prompt"),
                    "{cli}: {error}"
                )
            }
            other => panic!("{cli}: {other:?}"),
        }
    }
}

#[test]
fn a_loads_replay_is_consumed_and_only_the_new_turn_shows() {
    let mut runs = vec![];
    for cli in CLIS {
        runs.push((format!("{cli}/load"), true));
        runs.push((format!("{cli}/load_tool"), true));
    }
    // `session/resume` replays nothing.
    runs.push(("opencode/resume".into(), false));
    runs.push(("qwen/resume".into(), false));
    for (fixture, replays) in runs {
        let run = replay(&fixture, ApprovalDecision::Accept, false);
        assert_eq!(
            outcome(&run),
            TurnOutcome::Completed {
                text: "again".into()
            },
            "{fixture}"
        );
        assert_eq!(text_of(&run), "again", "{fixture}");
        assert!(
            run.events
                .iter()
                .all(|e| !matches!(e, HarnessEvent::ApprovalRequested { .. })),
            "{fixture}"
        );
        // A load replays the history (consumed, not shown); a resume replays nothing
        // of it (OpenCode still sends its commands list, also outside the turn).
        assert!(
            !replays || run.quiet > 0,
            "{fixture}: {} replayed",
            run.quiet
        );
    }
}

#[test]
fn unknown_stop_reasons_and_refusals_fail_saying_which() {
    let mut wire = AcpWire::default();
    for (reason, says) in [
        ("refusal", "refused"),
        ("max_tokens", "max_tokens"),
        ("max_turn_requests", "max_turn_requests"),
        ("out_of_coffee", "\"out_of_coffee\""),
    ] {
        let prompt = wire.prompt("s", TURN, "hi").unwrap();
        let mut out = Vec::new();
        let answer =
            json!({"jsonrpc": "2.0", "id": prompt.message["id"], "result": {"stopReason": reason}});
        wire.line(&answer.to_string(), &mut out);
        let events = events_of(&out);
        match events.last() {
            Some(HarnessEvent::TurnCompleted {
                outcome: TurnOutcome::Failed { error },
                ..
            }) => assert!(error.contains(says), "{reason}: {error}"),
            other => panic!("{reason}: {other:?}"),
        }
    }
    let prompt = wire.prompt("s", TURN, "hi").unwrap();
    let mut out = Vec::new();
    let answer = json!({"jsonrpc": "2.0", "id": prompt.message["id"], "result": {"stopReason": "cancelled"}});
    wire.line(&answer.to_string(), &mut out);
    assert_eq!(
        events_of(&out).last(),
        Some(&completed(TurnOutcome::Interrupted))
    );
}

/// The last usage a turn reported.
fn last_usage(run: &Run) -> Option<TokenUsage> {
    run.events.iter().rev().find_map(|e| match e {
        HarnessEvent::TokenUsage { usage, .. } => Some(usage.clone()),
        _ => None,
    })
}

fn counted(input: u64, output: u64, reasoning: Option<u64>, model: Option<&str>) -> TokenUsage {
    TokenUsage {
        reasoning_tokens: reasoning,
        model: model.map(str::to_string),
        ..TokenUsage::new(input, output)
    }
}

#[test]
fn qwen_s_usage_of_each_model_call_adds_up_to_the_turn_s() {
    // Qwen Code puts each model call's usage on one chunk's `_meta.usage`; a turn with a
    // tool makes two calls (7719/20 for the tool call, 7781/42 for the answer), and the
    // turn used both, as the other harnesses count a turn. Its `thoughtTokens` is the
    // reasoning (none here), `cachedReadTokens` the cached input (none).
    let run = replay("qwen/tool_allow", ApprovalDecision::Accept, false);
    assert_eq!(
        last_usage(&run),
        Some(counted(7719 + 7781, 20 + 42, Some(0), None))
    );
    // One call: its usage as it is.
    let run = replay("qwen/prompt_text", ApprovalDecision::Accept, false);
    assert_eq!(last_usage(&run).unwrap().input_tokens, 7714);
    // Gemini CLI and OpenCode give the turn's in the prompt's answer; Gemini CLI names
    // the model in `_meta.quota.model_usage`.
    let run = replay("gemini/tool_allow", ApprovalDecision::Accept, false);
    assert_eq!(
        last_usage(&run),
        Some(counted(304, 44, None, Some("gemini-2.5-flash")))
    );
    let run = replay("opencode/tool_allow", ApprovalDecision::Accept, false);
    assert_eq!(last_usage(&run), Some(counted(2428, 6, None, None)));
}

#[test]
fn a_permission_request_that_crosses_the_cancel_is_answered_cancelled_not_asked() {
    // The agent asked before it read Relay's `session/cancel`: nobody may be asked
    // about a turn being cancelled, and the agent waits for the answer before it ends
    // the turn, so it is answered `cancelled` at once.
    let mut wire = AcpWire::default();
    wire.prompt("s", TURN, "hi").unwrap();
    wire.cancel("s", TURN).unwrap();
    let request = json!({"jsonrpc": "2.0", "id": 0, "method": "session/request_permission",
        "params": {"sessionId": "s", "toolCall": {"toolCallId": "call_1", "title": "rm -rf x",
            "kind": "execute", "status": "pending", "rawInput": {"command": "rm -rf x"}},
        "options": [{"optionId": "once", "kind": "allow_once", "name": "Allow once"},
            {"optionId": "reject", "kind": "reject_once", "name": "Reject"}]}});
    let mut out = Vec::new();
    wire.line(&request.to_string(), &mut out);
    assert!(
        !events_of(&out)
            .iter()
            .any(|e| matches!(e, HarnessEvent::ApprovalRequested { .. })),
        "{out:?}"
    );
    let sent: Vec<&Value> = out
        .iter()
        .filter_map(|a| match a {
            Action::Send(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(
        sent,
        [&json!({"jsonrpc": "2.0", "id": 0, "result": {"outcome": {"outcome": "cancelled"}}})],
        "{out:?}"
    );
}

#[test]
fn a_broken_line_mid_turn_answers_the_open_permission_request_cancelled() {
    // The turn fails and the agent is told to cancel it; a permission request it still
    // waits on must be answered too (ACP: a client that cancels answers them
    // `cancelled`), else the agent never ends that turn and the next prompt meets it.
    let mut wire = AcpWire::default();
    wire.prompt("s", TURN, "hi").unwrap();
    let request = json!({"jsonrpc": "2.0", "id": 0, "method": "session/request_permission",
        "params": {"sessionId": "s", "toolCall": {"toolCallId": "call_1", "title": "ls",
            "kind": "execute", "status": "pending", "rawInput": {"command": "ls"}},
        "options": [{"optionId": "once", "kind": "allow_once", "name": "Allow once"}]}});
    let mut out = Vec::new();
    wire.line(&request.to_string(), &mut out);
    assert!(events_of(&out)
        .iter()
        .any(|e| matches!(e, HarnessEvent::ApprovalRequested { .. })));
    let mut out = Vec::new();
    wire.line("this line is not JSON", &mut out);
    let sent: Vec<&Value> = out
        .iter()
        .filter_map(|a| match a {
            Action::Send(v) => Some(v),
            _ => None,
        })
        .collect();
    assert!(
        sent.contains(
            &&json!({"jsonrpc": "2.0", "id": 0, "result": {"outcome": {"outcome": "cancelled"}}})
        ),
        "{out:?}"
    );
    assert!(
        sent.iter().any(|v| v["method"] == "session/cancel"),
        "{out:?}"
    );
}

#[test]
fn a_gemini_title_is_taken_as_the_command_only_from_the_verified_version() {
    // Gemini CLI 0.61.0 titles a shell call with `params.command` (its
    // `getDisplayTitle`); the default title of its tools is `getDescription()`, which
    // for a long command is the model's own description. So the title is read as the
    // command only when the agent says it is the version that was checked; otherwise
    // a person decides (no policy reads it).
    let ask = |version: &str| {
        let mut wire = AcpWire::titled_by_command();
        let init = wire.request(method::INITIALIZE, json!({"protocolVersion": 1}));
        let mut out = Vec::new();
        let answer = json!({"jsonrpc": "2.0", "id": init.message["id"], "result": {
            "protocolVersion": 1, "agentCapabilities": {"loadSession": true},
            "agentInfo": {"name": "gemini-cli", "version": version}}});
        wire.line(&answer.to_string(), &mut out);
        wire.prompt("s", TURN, "hi").unwrap();
        let request = json!({"jsonrpc": "2.0", "id": 0, "method": "session/request_permission",
            "params": {"sessionId": "s", "toolCall": {"toolCallId": "c1", "status": "pending",
                "title": "git status", "kind": "execute"},
            "options": [{"optionId": "proceed_once", "kind": "allow_once", "name": "Allow"}]}});
        let mut out = Vec::new();
        wire.line(&request.to_string(), &mut out);
        events_of(&out)
            .into_iter()
            .find_map(|e| match e {
                HarnessEvent::ApprovalRequested { kind, detail, .. } => Some((kind, detail)),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(
        ask(crate::pinned::GEMINI_VERSION),
        (ApprovalKind::Command, "git status".to_string())
    );
    assert_eq!(
        ask("0.99.0"),
        (ApprovalKind::Other, "git status".to_string())
    );
}
