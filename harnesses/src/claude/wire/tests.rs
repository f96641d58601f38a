//! The wire over lines recorded from Claude Code 2.1.197 (`../fixtures`, one file per
//! turn, each from the first line after the user message to the `result`; recorded
//! against a mock model, so message ids are `msg_<n>`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_protocol::domain::ApprovalKind;
use relay_protocol::harness::ItemKind;
use serde_json::{json, Value};

use super::*;
use crate::claude::items::approval_detail;
use crate::fixtures::{
    completed, delta, events_of, feed, feed_rest, feed_until, item_completed, item_started, priced,
    sent, turn_started, usage, TURN,
};

fn fixture(name: &str) -> &'static str {
    match name {
        "text" => include_str!("../fixtures/text.jsonl"),
        "tool_approved" => include_str!("../fixtures/tool_approved.jsonl"),
        "tool_declined" => include_str!("../fixtures/tool_declined.jsonl"),
        "tool_cancelled" => include_str!("../fixtures/tool_cancelled.jsonl"),
        "write_approved" => include_str!("../fixtures/write_approved.jsonl"),
        "interrupt" => include_str!("../fixtures/interrupt.jsonl"),
        "interrupt_pending_approval" => {
            include_str!("../fixtures/interrupt_pending_approval.jsonl")
        }
        "api_error" => include_str!("../fixtures/api_error.jsonl"),
        "stream_error_fallback" => include_str!("../fixtures/stream_error_fallback.jsonl"),
        "resume_refused" => include_str!("../fixtures/resume_refused.jsonl"),
        other => panic!("no fixture {other}"),
    }
}

fn started() -> ClaudeWire {
    let mut wire = ClaudeWire::new();
    wire.start_turn(TURN, "hello").unwrap();
    wire
}

/// The events of `actions`, which must all be events.
fn events(actions: Vec<Action>) -> Vec<HarnessEvent> {
    actions
        .into_iter()
        .map(|a| match a {
            Action::Event(e) => e,
            other => panic!("expected only events, got {other:?}"),
        })
        .collect()
}

fn approval(request_id: &str) -> HarnessEvent {
    HarnessEvent::ApprovalRequested {
        turn_id: TURN.into(),
        request_id: request_id.into(),
        kind: ApprovalKind::Command,
        detail: "bash -c 'echo hi > out.txt'".into(),
        reason: Some("run it".into()),
    }
}

fn request_id_of(events: &[HarnessEvent]) -> String {
    events
        .iter()
        .find_map(|e| match e {
            HarnessEvent::ApprovalRequested { request_id, .. } => Some(request_id.clone()),
            _ => None,
        })
        .expect("no approval requested")
}

fn line_of(outgoing: &Outgoing) -> Value {
    outgoing.message.clone()
}

#[test]
fn a_text_turn_streams_its_deltas_and_completes_with_the_result() {
    let mut wire = started();
    let seen = events(feed(&mut wire, fixture("text")));
    assert_eq!(
        seen,
        vec![
            turn_started(),
            item_started("msg_8:0", ItemKind::AgentMessage),
            delta("msg_8:0", "ok"),
            delta("msg_8:0", ": "),
            delta("msg_8:0", "hello"),
            item_completed("msg_8:0", ItemKind::AgentMessage, "ok: hello"),
            // Claude Code's price of 5 + 3 tokens of its default model: $0.0001.
            usage(priced(5, 3, "claude-opus-4-8", 100)),
            completed(TurnOutcome::Completed {
                text: "ok: hello".into()
            }),
        ]
    );
    assert_eq!(*wire.running().borrow(), None);
    assert_eq!(wire.malformed().load(Ordering::Relaxed), 0);
}

#[test]
fn an_approved_command_is_asked_then_completed_with_its_output() {
    let mut wire = started();
    let text = fixture("tool_approved");
    let mut lines = text.lines();
    let asked = events(feed_until(&mut wire, &mut lines, "can_use_tool"));
    let request = request_id_of(&asked);
    assert_eq!(
        asked,
        vec![
            turn_started(),
            item_started("msg_9:0", ItemKind::AgentMessage),
            delta("msg_9:0", "Running."),
            item_completed("msg_9:0", ItemKind::AgentMessage, "Running."),
            item_started("toolu_9", ItemKind::CommandExecution),
            approval(&request),
        ]
    );
    let answer = wire.respond(&request, ApprovalDecision::Accept).unwrap();
    assert_eq!(answer.awaits, None);
    assert_eq!(
        line_of(&answer),
        json!({"type": "control_response", "response": {"subtype": "success", "request_id": request,
            "response": {"behavior": "allow", "updatedInput": {"command": "echo hi > out.txt", "description": "run it"}}}})
    );
    let rest = events(feed_rest(&mut wire, &mut lines));
    assert_eq!(
        rest,
        vec![
            item_completed(
                "toolu_9",
                ItemKind::CommandExecution,
                "$ echo hi > out.txt\n(Bash completed with no output)"
            ),
            item_started("msg_10:0", ItemKind::AgentMessage),
            delta("msg_10:0", "done: "),
            delta("msg_10:0", "seen"),
            item_completed("msg_10:0", ItemKind::AgentMessage, "done: seen"),
            usage(priced(10, 10, "claude-opus-4-8", 300)),
            completed(TurnOutcome::Completed {
                text: "done: seen".into()
            }),
        ]
    );
    // Answered once: a second answer names no pending request.
    assert!(matches!(
        wire.respond(&request, ApprovalDecision::Accept),
        Err(HarnessError::UnknownRequest { .. })
    ));
}

#[test]
fn a_declined_command_completes_with_the_denial() {
    let mut wire = started();
    let text = fixture("tool_declined");
    let mut lines = text.lines();
    let request = request_id_of(&events(feed_until(&mut wire, &mut lines, "can_use_tool")));
    let answer = wire.respond(&request, ApprovalDecision::Decline).unwrap();
    assert_eq!(
        line_of(&answer)["response"]["response"],
        json!({"behavior": "deny", "message": DECLINED})
    );
    let rest = events(feed_rest(&mut wire, &mut lines));
    assert_eq!(
        rest[0],
        item_completed(
            "toolu_11",
            ItemKind::CommandExecution,
            "$ echo hi > out.txt\nerror: declined through Relay"
        )
    );
    assert!(matches!(
        rest.last(),
        Some(HarnessEvent::TurnCompleted {
            outcome: TurnOutcome::Completed { .. },
            ..
        })
    ));
}

#[test]
fn a_cancelled_approval_interrupts_the_turn() {
    let mut wire = started();
    let text = fixture("tool_cancelled");
    let mut lines = text.lines();
    let request = request_id_of(&events(feed_until(&mut wire, &mut lines, "can_use_tool")));
    let answer = wire.respond(&request, ApprovalDecision::Cancel).unwrap();
    assert_eq!(
        line_of(&answer)["response"]["response"],
        json!({"behavior": "deny", "message": CANCELLED, "interrupt": true})
    );
    assert_eq!(
        *wire.running().borrow(),
        Some(Running {
            turn_id: TURN.into(),
            interrupting: true
        })
    );
    let rest = events(feed_rest(&mut wire, &mut lines));
    assert_eq!(rest.last(), Some(&completed(TurnOutcome::Interrupted)));
}

#[test]
fn an_interrupt_is_answered_and_ends_the_turn_interrupted() {
    let mut wire = started();
    let text = fixture("interrupt");
    let mut lines = text.lines();
    let before = events(feed_until(&mut wire, &mut lines, "text_delta"));
    assert_eq!(before.last(), Some(&delta("msg_14:0", "ok")));

    // The fixture's interrupt was the session's second request, after `initialize`.
    wire.initialize().unwrap();
    let interrupt = wire.interrupt(TURN).unwrap();
    assert_eq!(interrupt.awaits.as_deref(), Some("relay-interrupt-2"));
    assert_eq!(
        line_of(&interrupt),
        json!({"type": "control_request", "request_id": "relay-interrupt-2", "request": {"subtype": "interrupt"}})
    );
    let mut rest = feed_rest(&mut wire, &mut lines).into_iter();
    assert!(matches!(
        rest.next(),
        Some(Action::Answer { id, result: Ok(_) }) if id == "relay-interrupt-2"
    ));
    assert_eq!(
        events(rest.collect()),
        vec![
            // Cut short: no `content_block_stop`, completed with what came.
            item_completed("msg_14:0", ItemKind::AgentMessage, "ok"),
            completed(TurnOutcome::Interrupted),
        ]
    );
}

#[test]
fn an_interrupt_settles_the_pending_approval() {
    let mut wire = started();
    let text = fixture("interrupt_pending_approval");
    let mut lines = text.lines();
    let request = request_id_of(&events(feed_until(&mut wire, &mut lines, "can_use_tool")));
    wire.initialize().unwrap();
    wire.interrupt(TURN).unwrap();
    let rest = events_of(&feed_rest(&mut wire, &mut lines));
    assert_eq!(
        rest,
        vec![
            HarnessEvent::ApprovalResolved {
                request_id: request.clone()
            },
            item_completed(
                "toolu_15",
                ItemKind::CommandExecution,
                "$ echo hi > out.txt\nerror: The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was a file edit, the new_string was NOT written to the file). STOP what you are doing and wait for the user to tell you how to proceed."
            ),
            usage(priced(5, 7, "claude-opus-4-8", 200)),
            completed(TurnOutcome::Interrupted),
        ]
    );
    assert!(matches!(
        wire.respond(&request, ApprovalDecision::Accept),
        Err(HarnessError::UnknownRequest { .. })
    ));
}

#[test]
fn a_file_write_is_a_file_change() {
    let mut wire = started();
    let seen = events_of(&feed(&mut wire, fixture("write_approved")));
    assert_eq!(seen[1], item_started("toolu_17", ItemKind::FileChange));
    let HarnessEvent::ApprovalRequested {
        kind,
        detail,
        reason,
        ..
    } = &seen[2]
    else {
        panic!("{:?}", seen[2])
    };
    assert_eq!(
        (kind, detail.as_str(), reason.as_deref()),
        (
            &ApprovalKind::FileChange,
            "/tmp/cl/w.txt",
            Some("Path is outside allowed working directories")
        )
    );
    // Not answered here: the turn's end settles it.
    assert!(seen.contains(&HarnessEvent::ApprovalResolved {
        request_id: "fcd4d40a-ce08-4cdc-89c7-c1fd1ab8f987".into()
    }));
    assert!(seen.contains(&item_completed(
        "toolu_17",
        ItemKind::FileChange,
        "Write /tmp/cl/w.txt\nFile created successfully at: /tmp/cl/w.txt (file state is current in your context — no need to Read it back)"
    )));
}

#[test]
fn a_failed_model_request_fails_the_turn_with_claudes_message() {
    let mut wire = started();
    let seen = events(feed(&mut wire, fixture("api_error")));
    // The made-up `assistant` message is not an agent message: the failure says it.
    assert_eq!(seen.len(), 2, "{seen:?}");
    let HarnessEvent::TurnCompleted {
        outcome: TurnOutcome::Failed { error },
        ..
    } = &seen[1]
    else {
        panic!("{seen:?}")
    };
    assert!(
        error.starts_with("API Error: 500 mock overloaded."),
        "{error}"
    );
}

#[test]
fn a_message_without_stream_events_is_read_from_its_assistant_line() {
    let mut wire = started();
    let seen = events(feed(&mut wire, fixture("stream_error_fallback")));
    assert_eq!(
        seen,
        vec![
            turn_started(),
            item_started("msg_ns20:0", ItemKind::AgentMessage),
            item_completed("msg_ns20:0", ItemKind::AgentMessage, "title"),
            completed(TurnOutcome::Completed {
                text: "title".into()
            }),
        ]
    );
}

#[test]
fn lines_outside_a_turn_are_ignored_and_garbage_is_counted() {
    let mut wire = ClaudeWire::new();
    assert!(feed(&mut wire, fixture("resume_refused")).is_empty());
    assert!(feed(&mut wire, fixture("text")).is_empty());
    let mut out = Vec::new();
    for line in [
        "not json",
        "{\"type\":\"result\"",
        "[1,2]",
        "{\"type\":\"rate_limit_event\"}",
    ] {
        wire.line(line, &mut out);
    }
    assert!(out.is_empty());
    assert_eq!(wire.malformed().load(Ordering::Relaxed), 3);
}

#[test]
fn requests_relay_does_not_serve_are_refused_never_left_waiting() {
    let mut wire = started();
    let mut out = Vec::new();
    wire.line(
        r#"{"type":"control_request","request_id":"r9","request":{"subtype":"mcp_message","server_name":"x"}}"#,
        &mut out,
    );
    wire.line(
        r#"{"type":"control_request","request_id":"r10","request":{"subtype":"can_use_tool","input":{}}}"#,
        &mut out,
    );
    assert_eq!(
        sent(&out),
        ["r9", "r10"]
            .map(|id| json!({"type": "control_response",
                "response": {"subtype": "error", "request_id": id, "error": NOT_SUPPORTED}}))
            .to_vec()
    );
}

#[test]
fn one_turn_at_a_time_and_interrupts_only_of_the_running_turn() {
    let mut wire = ClaudeWire::new();
    assert!(matches!(
        wire.interrupt(TURN),
        Err(HarnessError::NoActiveTurn { .. })
    ));
    let start = wire.start_turn(TURN, "hi").unwrap();
    assert_eq!(start.awaits, None);
    assert_eq!(
        line_of(&start),
        json!({"type": "user", "message": {"role": "user", "content": "hi"}})
    );
    assert!(matches!(
        wire.start_turn("t2", "again"),
        Err(HarnessError::TurnRunning { turn_id }) if turn_id == TURN
    ));
    assert!(matches!(
        wire.interrupt("t0"),
        Err(HarnessError::NoActiveTurn { .. })
    ));
    assert!(matches!(
        wire.respond("nope", ApprovalDecision::Accept),
        Err(HarnessError::UnknownRequest { .. })
    ));
}

#[test]
fn approval_details_are_what_runs() {
    let ask = |tool: &str, input: Value| CanUseTool {
        tool_name: tool.into(),
        input,
        tool_use_id: None,
        decision_reason: None,
    };
    let cases = [
        (
            ask(
                "Bash",
                json!({"command": "cargo test -- --nocapture 'a b'"}),
            ),
            (
                ApprovalKind::Command,
                r#"bash -c "cargo test -- --nocapture 'a b'""#,
            ),
        ),
        (
            ask(
                "Edit",
                json!({"file_path": "/w/src/lib.rs", "old_string": "a"}),
            ),
            (ApprovalKind::FileChange, "/w/src/lib.rs"),
        ),
        (
            ask("NotebookEdit", json!({"notebook_path": "/w/n.ipynb"})),
            (ApprovalKind::FileChange, "/w/n.ipynb"),
        ),
        (
            ask("WebFetch", json!({"url": "https://example.com"})),
            (
                ApprovalKind::Other,
                r#"WebFetch {"url":"https://example.com"}"#,
            ),
        ),
    ];
    for (ask, (kind, detail)) in cases {
        assert_eq!(approval_detail(&ask), (kind, detail.to_string()));
    }
    // The quoting splits back into exactly the script that runs.
    let (_, detail) = approval_detail(&ask("Bash", json!({"command": "echo $HOME; ls *"})));
    assert_eq!(
        shlex::split(&detail).unwrap(),
        ["bash", "-c", "echo $HOME; ls *"]
    );
}

#[test]
fn relay_tools_are_allowed_at_once_and_other_mcp_tools_ask_a_person() {
    let prompt = |id: &str, tool: &str| {
        json!({"type": "control_request", "request_id": id, "request": {
            "subtype": "can_use_tool", "tool_name": tool,
            "input": {"agent": "pi-1", "text": "hi"}, "tool_use_id": "toolu_1"}})
        .to_string()
    };
    let mut wire = ClaudeWire::new().with_relay_mcp(true);
    wire.start_turn(TURN, "hello").unwrap();
    let mut out = Vec::new();
    wire.line(&prompt("r1", "mcp__relay__ask"), &mut out);
    assert_eq!(events_of(&out), [turn_started()]);
    assert_eq!(
        sent(&out),
        [
            json!({"type": "control_response", "response": {"subtype": "success",
            "request_id": "r1", "response": {"behavior": "allow",
                "updatedInput": {"agent": "pi-1", "text": "hi"}}}})
        ]
    );
    // Another server's tool, one merely named like Relay's, and Relay's own when Relay
    // did not wire its server in: each a prompt for a person.
    for (wire, id, tool) in [
        (&mut wire, "r2", "mcp__files__read"),
        (&mut started(), "r3", "mcp__relay__ask"),
    ]
    .into_iter()
    .chain([(
        &mut ClaudeWire::new().with_relay_mcp(true),
        "r4",
        "mcp__relayx__ask",
    )]) {
        wire.start_turn(TURN, "hello").ok();
        let mut out = Vec::new();
        wire.line(&prompt(id, tool), &mut out);
        assert!(sent(&out).is_empty(), "{tool}: {out:?}");
        assert!(
            matches!(events_of(&out).last(), Some(HarnessEvent::ApprovalRequested { request_id, .. }) if request_id == id),
            "{tool}: {out:?}"
        );
    }
}

/// Claude Code 2.1.197 with its model on a closed port (`CLAUDE_CODE_MAX_RETRIES=3`)
/// says each retry on a `system` line: each is a note (the runtime's stall watchdog
/// counts from it), with the attempt, the wait and the error.
#[test]
fn a_retried_model_request_is_a_note_per_retry() {
    let mut wire = started();
    let lines = concat!(
        r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":3,"retry_delay_ms":513.5069395909335,"error_status":null,"error":"unknown","session_id":"78243362-3909-4d51-bf54-cec69a1be86b","uuid":"36176123-a33b-4c02-8477-b8a9ce5c8512"}"#,
        "\n",
        r#"{"type":"system","subtype":"api_retry","attempt":2,"max_retries":3,"retry_delay_ms":1028.155747160839,"error_status":529,"error":"overloaded_error","session_id":"78243362-3909-4d51-bf54-cec69a1be86b"}"#,
        "\n",
    );
    assert_eq!(
        events(feed(&mut wire, lines)),
        vec![
            HarnessEvent::TurnStarted {
                turn_id: TURN.into()
            },
            HarnessEvent::Retrying {
                message: "Claude Code retries its model request (1/3, in 0.5 s): unknown error"
                    .into()
            },
            HarnessEvent::Retrying {
                message:
                    "Claude Code retries its model request (2/3, in 1.0 s): overloaded_error (HTTP 529)"
                        .into()
            },
        ]
    );
}

/// Claude Code's `result` counts input as the Messages API does (uncached, cache
/// writes and cache reads apart): Relay's input is all three, cached the reads. Its
/// `total_cost_usd` adds up over the process's turns: each turn's cost is the
/// difference from the last `result`'s.
#[test]
fn input_adds_the_cache_back_and_the_cost_is_the_turns_part() {
    let with_counts = |cost: &str| {
        fixture("text")
            .replace(
                r#""usage":{"input_tokens":5,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3"#,
                r#""usage":{"input_tokens":5,"cache_creation_input_tokens":20,"cache_read_input_tokens":300,"output_tokens":3"#,
            )
            .replace(r#""total_cost_usd":0.0001,"#, &format!(r#""total_cost_usd":{cost},"#))
    };
    let mut wire = started();
    let first = events(feed(&mut wire, &with_counts("0.0001")));
    let expect = |micro_usd| {
        usage(relay_protocol::domain::TokenUsage {
            cached_input_tokens: 300,
            ..priced(5 + 20 + 300, 3, "claude-opus-4-8", micro_usd)
        })
    };
    assert!(first.contains(&expect(100)), "{first:?}");
    // The second turn of the process: $0.00035 so far, $0.00025 of it this turn's.
    wire.start_turn(TURN, "again").unwrap();
    let second = events(feed(&mut wire, &with_counts("0.00035")));
    assert!(second.contains(&expect(250)), "{second:?}");
}
