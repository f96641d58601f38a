//! Unit tests of the translator: Codex wire lines in, the actions and harness events out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_protocol::domain::{ApprovalDecision, ApprovalKind};
use relay_protocol::harness::ItemKind;
use serde_json::json;

use super::super::app_server::error_code;
use super::*;

/// The one-pass envelope sorts every line into the same shape as decoding the whole
/// [`Message`] does (request, notification, response, error, or none).
#[test]
fn the_envelope_reads_every_shape_as_the_whole_message_does() {
    fn by_message(line: &str) -> &'static str {
        match serde_json::from_str::<Message>(line) {
            Ok(Message::Request(_)) => "request",
            Ok(Message::Notification(_)) => "notification",
            Ok(Message::Response(_)) => "response",
            Ok(Message::Error(_)) => "error",
            Err(_) => "none",
        }
    }
    fn by_envelope(line: &str) -> &'static str {
        match serde_json::from_str::<Envelope<'_>>(line) {
            Ok(Envelope {
                id: Some(_),
                method: Some(_),
                ..
            }) => "request",
            Ok(Envelope {
                method: Some(_), ..
            }) => "notification",
            Ok(Envelope {
                id: Some(_),
                result: Some(_),
                ..
            }) => "response",
            Ok(Envelope {
                id: Some(_),
                error: Some(_),
                ..
            }) => "error",
            _ => "none",
        }
    }
    let lines = [
        r#"{"id":1,"method":"item/commandExecution/requestApproval","params":{"a":1}}"#,
        r#"{"id":"s-1","method":"x"}"#,
        r#"{"method":"item/agentMessage/delta","params":{"delta":"h\u00e9\"llo"}}"#,
        r#"{"method":"turn/started","params":null}"#,
        r#"{"method":"turn/started"}"#,
        r#"{"id":2,"result":null}"#,
        r#"{"id":2,"result":{"thread":{"id":"t"}}}"#,
        r#"{"id":3,"error":{"code":-32600,"message":"no active turn"}}"#,
        r#"{"id":3,"error":{"code":"x","message":"bad code"}}"#,
        r#"{"id":4}"#,
        r#"{"garbage":1}"#,
        r#"{"jsonrpc":"2.0","id":5,"result":[1,2]}"#,
        r#"not json"#,
    ];
    for line in lines {
        assert_eq!(by_envelope(line), by_message(line), "{line}");
    }
    // One difference, on purpose: serde reads a struct from an array too, so the
    // whole message took `[1,2]` for a response; JSON-RPC has no such line.
    assert_eq!(by_message("[1,2]"), "response");
    assert_eq!(by_envelope("[1,2]"), "none");
}

impl Translator {
    /// A line as [`CodexWire::line`] reads it: a delta's in one pass, any other the
    /// general way.
    pub(super) fn handle_line(&mut self, line: &str) -> Vec<Action> {
        match self.delta(line) {
            Some(delta) => vec![Action::Event(delta)],
            None => self.handle_envelope(line),
        }
    }
}

pub(super) fn translator() -> (Translator, Arc<AtomicU64>) {
    let counter = Arc::new(AtomicU64::new(0));
    (Translator::new(counter.clone(), true), counter)
}

pub(super) fn events(actions: Vec<Action>) -> Vec<HarnessEvent> {
    actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Event(e) => Some(e),
            _ => None,
        })
        .collect()
}

fn feed(t: &mut Translator, lines: &[Value]) -> Vec<HarnessEvent> {
    lines
        .iter()
        .flat_map(|l| events(t.handle_line(&l.to_string())))
        .collect()
}

#[test]
fn malformed_lines_and_unknown_notifications_are_tolerated() {
    let (mut t, counter) = translator();
    assert_eq!(t.handle_line("not json"), vec![]);
    assert_eq!(t.handle_line("{\"garbage\": 1}"), vec![]);
    assert_eq!(t.handle_line(""), vec![]);
    // A known method with params of the wrong shape.
    assert_eq!(
        t.handle_line(r#"{"method":"turn/started","params":{"threadId":1}}"#),
        vec![]
    );
    assert_eq!(counter.load(Ordering::Relaxed), 3);
    assert_eq!(
        t.handle_line(r#"{"method":"thread/someday/new","params":{"x":1},"emittedAtMs":5}"#),
        vec![]
    );
    assert_eq!(counter.load(Ordering::Relaxed), 3);
    // Still works afterwards.
    assert_eq!(
        t.handle_line(r#"{"method":"warning","params":{"message":"careful"}}"#),
        vec![Action::Event(HarnessEvent::Warning {
            message: "careful".into()
        })]
    );
}

#[test]
fn responses_and_errors_are_routed_by_id() {
    let (mut t, _) = translator();
    assert_eq!(
        t.handle_line(r#"{"id":4,"result":{"turnId":"u"}}"#),
        vec![Action::Response {
            id: RequestId::Integer(4),
            result: Ok(json!({"turnId": "u"}))
        }]
    );
    assert_eq!(
        t.handle_line(r#"{"error":{"code":-32600,"message":"no active turn to steer"},"id":5}"#),
        vec![Action::Response {
            id: RequestId::Integer(5),
            result: Err(wire::ErrorObject {
                code: -32600,
                message: "no active turn to steer".into(),
                data: None
            })
        }]
    );
}

#[test]
fn command_output_is_reported_once_whether_streamed_or_not() {
    let (mut t, _) = translator();
    let completed = |id: &str| {
        json!({"method":"item/completed","params":{"threadId":"th","turnId":"t1","item":{
            "type":"commandExecution","id":id,"command":"/bin/bash -lc 'echo hi'",
            "status":"completed","aggregatedOutput":"hi\n","exitCode":0}}})
    };
    let output = |evs: &[HarnessEvent]| -> Vec<(String, String)> {
        evs.iter()
            .filter_map(|e| match e {
                HarnessEvent::CommandOutputDelta { item_id, delta, .. } => {
                    Some((item_id.clone(), delta.clone()))
                }
                _ => None,
            })
            .collect()
    };
    // Streamed: the aggregated output is not repeated.
    let evs = feed(
        &mut t,
        &[
            json!({"method":"item/commandExecution/outputDelta","params":{"threadId":"th","turnId":"t1","itemId":"a","delta":"hi\n"}}),
            completed("a"),
        ],
    );
    assert_eq!(output(&evs), vec![("a".to_string(), "hi\n".to_string())]);
    // Not streamed: the aggregated output arrives as one delta, before the item ends.
    let evs = feed(&mut t, &[completed("b")]);
    assert_eq!(output(&evs), vec![("b".to_string(), "hi\n".to_string())]);
    assert!(matches!(
        evs.last(),
        Some(HarnessEvent::ItemCompleted { item_id, kind: ItemKind::CommandExecution, exit_code: Some(0), .. }) if item_id == "b"
    ));
    // A turn that ends forgets its items' streaming state.
    feed(
        &mut t,
        &[
            json!({"method":"item/commandExecution/outputDelta","params":{"threadId":"th","turnId":"t1","itemId":"c","delta":"x"}}),
            json!({"method":"turn/completed","params":{"threadId":"th","turn":{"id":"t1","status":"interrupted","items":[]}}}),
        ],
    );
    assert!(t.streamed_output.is_empty());
}

#[test]
fn a_turn_translates_in_order() {
    let (mut t, _) = translator();
    let tid = "th";
    let evs = feed(
        &mut t,
        &[
            // The answer to `thread/start` names the thread's model.
            json!({"id":1,"result":{"thread":{"id":tid,"turns":[]},"model":"gpt-test"}}),
            json!({"method":"thread/tokenUsage/updated","params":{"threadId":tid,"turnId":"old","tokenUsage":{
                "total":{"inputTokens":100,"cachedInputTokens":40,"outputTokens":10,"reasoningOutputTokens":4},
                "last":{"inputTokens":100,"outputTokens":10}}}}),
            json!({"method":"turn/started","params":{"threadId":tid,"turn":{"id":"t1","status":"inProgress","items":[]}}}),
            json!({"method":"item/started","params":{"threadId":tid,"turnId":"t1","item":{"type":"agentMessage","id":"m","text":""}}}),
            json!({"method":"item/agentMessage/delta","params":{"threadId":tid,"turnId":"t1","itemId":"m","delta":"he"}}),
            json!({"method":"item/agentMessage/delta","params":{"threadId":tid,"turnId":"t1","itemId":"m","delta":"llo"}}),
            json!({"method":"item/completed","params":{"threadId":tid,"turnId":"t1","item":{"type":"agentMessage","id":"m","text":"hello"}}}),
            json!({"method":"turn/plan/updated","params":{"threadId":tid,"turnId":"t1","explanation":null,"plan":[
                {"step":"read","status":"completed"},{"step":"write","status":"inProgress"}]}}),
            json!({"method":"thread/tokenUsage/updated","params":{"threadId":tid,"turnId":"t1","tokenUsage":{
                "total":{"inputTokens":150,"cachedInputTokens":60,"outputTokens":13,"reasoningOutputTokens":5},
                "last":{"inputTokens":50,"outputTokens":3}}}}),
            json!({"method":"turn/completed","params":{"threadId":tid,"turn":{"id":"t1","status":"completed","items":[],"itemsView":"notLoaded"}}}),
        ],
    );
    assert_eq!(
        evs,
        vec![
            HarnessEvent::TurnStarted {
                turn_id: "t1".into()
            },
            HarnessEvent::ItemStarted {
                turn_id: "t1".into(),
                item_id: "m".into(),
                kind: ItemKind::AgentMessage
            },
            HarnessEvent::TextDelta {
                turn_id: "t1".into(),
                item_id: "m".into(),
                delta: "he".into()
            },
            HarnessEvent::TextDelta {
                turn_id: "t1".into(),
                item_id: "m".into(),
                delta: "llo".into()
            },
            HarnessEvent::ItemCompleted {
                turn_id: "t1".into(),
                item_id: "m".into(),
                kind: ItemKind::AgentMessage,
                text: Some("hello".into()),
                exit_code: None
            },
            HarnessEvent::PlanUpdated {
                turn_id: "t1".into(),
                text: "[x] read\n[>] write".into()
            },
            // What the turn used: the thread's totals minus those at its start, with
            // the model of its thread.
            HarnessEvent::TokenUsage {
                turn_id: "t1".into(),
                usage: relay_protocol::domain::TokenUsage {
                    input_tokens: 50,
                    cached_input_tokens: 20,
                    output_tokens: 3,
                    reasoning_tokens: Some(1),
                    model: Some("gpt-test".into()),
                    ..Default::default()
                },
            },
            // No items on turn/completed: the last completed agent message is the answer.
            HarnessEvent::TurnCompleted {
                turn_id: "t1".into(),
                outcome: TurnOutcome::Completed {
                    text: "hello".into()
                }
            },
        ]
    );
}

#[test]
fn failures_take_the_turn_error_or_the_last_error_notification() {
    let (mut t, _) = translator();
    let evs = feed(
        &mut t,
        &[
            json!({"method":"error","params":{"threadId":"th","turnId":"t1","willRetry":true,"error":{"message":"retrying"}}}),
            // As codex 0.169.0 sends it with its provider on a closed port.
            json!({"method":"error","params":{"error":{"message":"Reconnecting... waiting for network","codexErrorInfo":{"responseStreamDisconnected":{"httpStatusCode":null}},"additionalDetails":"Connection failed: error sending request","misalignment":null},"willRetry":true,"threadId":"th","turnId":"t1"},"emittedAtMs":1_795_710_959_927_u64}),
            json!({"method":"error","params":{"threadId":"th","turnId":"t1","willRetry":false,"error":{"message":"boom"}}}),
            json!({"method":"turn/completed","params":{"threadId":"th","turn":{"id":"t1","status":"failed","items":[]}}}),
            json!({"method":"turn/completed","params":{"threadId":"th","turn":{"id":"t2","status":"failed","error":{"message":"own"}}}}),
            json!({"method":"turn/completed","params":{"threadId":"th","turn":{"id":"t3","status":"interrupted"}}}),
        ],
    );
    assert_eq!(
        evs,
        vec![
            HarnessEvent::Retrying {
                message: "retrying".into()
            },
            HarnessEvent::Retrying {
                message:
                    "Reconnecting... waiting for network (Connection failed: error sending request)"
                        .into()
            },
            HarnessEvent::TurnCompleted {
                turn_id: "t1".into(),
                outcome: TurnOutcome::Failed {
                    error: "boom".into()
                }
            },
            HarnessEvent::TurnCompleted {
                turn_id: "t2".into(),
                outcome: TurnOutcome::Failed {
                    error: "own".into()
                }
            },
            HarnessEvent::TurnCompleted {
                turn_id: "t3".into(),
                outcome: TurnOutcome::Interrupted
            },
        ]
    );
}

#[test]
fn only_a_command_to_run_is_a_command_approval() {
    let (mut t, _) = translator();
    let evs = feed(
        &mut t,
        &[
            json!({"method":"item/commandExecution/requestApproval","id":7,"params":{
            "threadId":"th","turnId":"t1","itemId":"c1",
            "command":"cargo test","kind":"writeStdin"}}),
        ],
    );
    assert_eq!(
        evs,
        vec![HarnessEvent::ApprovalRequested {
            turn_id: "t1".into(),
            request_id: "7".into(),
            kind: ApprovalKind::Other,
            detail: "writeStdin: cargo test".into(),
            reason: None
        }]
    );
}

#[test]
fn approvals_are_surfaced_and_unsupported_requests_refused() {
    let (mut t, _) = translator();
    let evs = feed(
        &mut t,
        &[
            json!({"method":"item/commandExecution/requestApproval","id":0,"params":{
                "kind":"command","threadId":"th","turnId":"t1","itemId":"call_1","startedAtMs":1,
                "reason":"needs net","command":"/bin/bash -lc 'echo relay-approved'","cwd":"/tmp"}}),
            json!({"method":"item/started","params":{"threadId":"th","turnId":"t1","item":{
                "type":"fileChange","id":"fc","status":"inProgress","changes":[
                    {"path":"a.rs","kind":{"type":"update","move_path":null},"diff":"@@"},
                    {"path":"b.rs","kind":{"type":"add"},"diff":"+"}]}}}),
            json!({"method":"item/fileChange/requestApproval","id":"s1","params":{
                "threadId":"th","turnId":"t1","itemId":"fc","startedAtMs":1,"grantRoot":"/w"}}),
        ],
    );
    assert_eq!(
        evs,
        vec![
            HarnessEvent::ApprovalRequested {
                turn_id: "t1".into(),
                request_id: "0".into(),
                kind: ApprovalKind::Command,
                detail: "/bin/bash -lc 'echo relay-approved'".into(),
                reason: Some("needs net".into())
            },
            HarnessEvent::ItemStarted {
                turn_id: "t1".into(),
                item_id: "fc".into(),
                kind: ItemKind::FileChange
            },
            HarnessEvent::ApprovalRequested {
                turn_id: "t1".into(),
                request_id: "s1".into(),
                // A grant of wider access: never an auto-accepted file change.
                kind: ApprovalKind::Other,
                detail: "update a.rs\nadd b.rs\nwrite access to /w".into(),
                reason: None
            },
        ]
    );
    assert_eq!(
        t.answer("0", ApprovalDecision::AcceptForSession),
        Some(Message::Response(wire::Response {
            id: RequestId::Integer(0),
            result: json!({"decision": "acceptForSession"})
        }))
    );
    assert_eq!(t.answer("0", ApprovalDecision::Accept), None);
    // Resolved by Codex itself: no longer answerable.
    let evs = feed(
        &mut t,
        &[json!({"method":"serverRequest/resolved","params":{"threadId":"th","requestId":"s1"}})],
    );
    assert_eq!(
        evs,
        vec![HarnessEvent::ApprovalResolved {
            request_id: "s1".into()
        }]
    );
    assert_eq!(t.answer("s1", ApprovalDecision::Accept), None);

    let actions = t
        .handle_line(r#"{"method":"item/tool/requestUserInput","id":7,"params":{"questions":[]}}"#);
    assert!(
        matches!(
            &actions[..],
            [Action::Send(Message::Error(wire::ErrorResponse { id: RequestId::Integer(7), error }))]
                if error.code == error_code::METHOD_NOT_FOUND
        ),
        "{actions:?}"
    );
}

/// Codex's request before an MCP tool call, as the pinned Codex sent it (recorded from
/// `tests/a2a_mcp.rs`, ids and the description shortened).
fn tool_call_approval(id: i64, server: &str, turn: Option<&str>) -> serde_json::Value {
    json!({"method":"mcpServer/elicitation/request","id":id,"params":{
        "threadId":"th","turnId":turn,"serverName":server,"mode":"form",
        "_meta":{"codex_approval_kind":"mcp_tool_call","persist":["session","always"],
            "tool_name":"ask","tool_description":"Ask another agent.",
            "tool_params":{"agent":"claude-1","text":"hi"},
            "tool_params_display":[{"name":"agent","value":"claude-1","display_name":"agent"},
                {"name":"text","value":"hi","display_name":"text"}]},
        "message":format!("Allow the {server} MCP server to run tool \"ask\"?"),
        "requestedSchema":{"type":"object","properties":{}}}})
}

#[test]
fn a_relay_tool_call_runs_unasked_and_any_other_server_asks_a_person() {
    let (mut t, _) = translator();
    // Relay's own server: accepted at once, nothing surfaced.
    let actions = t.handle_line(&tool_call_approval(3, "relay", Some("t1")).to_string());
    assert_eq!(
        actions,
        vec![Action::Send(Message::Response(wire::Response {
            id: RequestId::Integer(3),
            result: json!({"action": "accept", "content": {}})
        }))]
    );
    assert_eq!(t.answer("3", ApprovalDecision::Accept), None);

    // Another server: a Relay approval, answered in the elicitation's words.
    let evs = feed(&mut t, &[tool_call_approval(4, "files", Some("t1"))]);
    assert_eq!(
        evs,
        vec![HarnessEvent::ApprovalRequested {
            turn_id: "t1".into(),
            request_id: "4".into(),
            kind: ApprovalKind::Other,
            detail: "MCP tool files.ask\n{\n  \"agent\": \"claude-1\",\n  \"text\": \"hi\"\n}"
                .into(),
            reason: None
        }]
    );
    let answer = |t: &mut Translator, id: &str, d| {
        t.answer(id, d).map(|m| match m {
            Message::Response(r) => r.result,
            other => panic!("{other:?}"),
        })
    };
    assert_eq!(
        answer(&mut t, "4", ApprovalDecision::Decline),
        Some(json!({"action": "decline"}))
    );
    feed(&mut t, &[tool_call_approval(5, "files", Some("t1"))]);
    assert_eq!(
        answer(&mut t, "5", ApprovalDecision::AcceptForSession),
        Some(json!({"action": "accept", "content": {}}))
    );
    feed(&mut t, &[tool_call_approval(6, "files", Some("t1"))]);
    assert_eq!(
        answer(&mut t, "6", ApprovalDecision::Cancel),
        Some(json!({"action": "cancel"}))
    );
}

#[test]
fn a_server_named_relay_is_not_trusted_unless_relay_wired_it_in() {
    let mut t = Translator::new(Arc::default(), false);
    let evs = feed(&mut t, &[tool_call_approval(1, "relay", Some("t1"))]);
    assert!(
        matches!(&evs[..], [HarnessEvent::ApprovalRequested { request_id, .. }] if request_id == "1"),
        "{evs:?}"
    );
}

#[test]
fn a_form_for_a_person_is_declined_never_filled_in() {
    let (mut t, _) = translator();
    let declined = |id: i64| {
        Action::Send(Message::Response(wire::Response {
            id: RequestId::Integer(id),
            result: json!({"action": "decline"}),
        }))
    };
    // A real form, even from Relay's own server name.
    let form = json!({"method":"mcpServer/elicitation/request","id":8,"params":{
        "threadId":"th","turnId":"t1","serverName":"relay","mode":"form",
        "message":"Your GitHub password?",
        "requestedSchema":{"type":"object","properties":{"password":{"type":"string"}}}}});
    let actions = t.handle_line(&form.to_string());
    assert_eq!(actions.len(), 2, "{actions:?}");
    assert_eq!(actions[0], declined(8));
    assert!(
        matches!(&actions[1], Action::Event(HarnessEvent::Warning { message })
            if message.contains("Your GitHub password?") && message.contains("declined")),
        "{actions:?}"
    );
    // A URL to open, and an approval kind Relay does not know.
    let url = json!({"method":"mcpServer/elicitation/request","id":9,"params":{
        "threadId":"th","serverName":"files","mode":"url","message":"Log in",
        "url":"https://example.com","elicitationId":"e"}});
    assert_eq!(t.handle_line(&url.to_string())[0], declined(9));
    let other_kind = json!({"method":"mcpServer/elicitation/request","id":10,"params":{
        "threadId":"th","turnId":"t1","serverName":"relay","mode":"form","message":"Install?",
        "requestedSchema":{"type":"object","properties":{}},
        "_meta":{"codex_approval_kind":"tool_suggestion"}}});
    assert_eq!(t.handle_line(&other_kind.to_string())[0], declined(10));
    // A tool call of another server outside a turn: nobody to ask.
    assert_eq!(
        t.handle_line(&tool_call_approval(11, "files", None).to_string())[0],
        declined(11)
    );
    for id in ["8", "9", "10", "11"] {
        assert_eq!(t.answer(id, ApprovalDecision::Accept), None);
    }
}

/// An item whose fields do not parse as Relay models them (a newer Codex's reasoning
/// with structured summaries, an agent message whose text is not a string) keeps its
/// kind; only a type Relay does not know is `Other`. (Before, such a reasoning item was
/// `Other("reasoning")`, which no filter on `Reasoning` matched.)
#[test]
fn an_item_whose_fields_do_not_parse_keeps_its_kind() {
    let item = |v: serde_json::Value| serde_json::from_value::<ThreadItem>(v).unwrap();
    let reasoning = item(json!({"type": "reasoning", "id": "r", "summary": [{"text": "x"}]}));
    assert!(matches!(reasoning, ThreadItem::Other(_)), "{reasoning:?}");
    assert_eq!(items::item_kind(&reasoning), ItemKind::Reasoning);
    let known = item(json!({"type": "reasoning", "id": "r", "summary": ["x"]}));
    assert!(matches!(known, ThreadItem::Known(_)));
    assert_eq!(items::item_kind(&known), ItemKind::Reasoning);
    let message = item(json!({"type": "agentMessage", "id": "m", "text": 5}));
    assert!(matches!(message, ThreadItem::Other(_)), "{message:?}");
    assert_eq!(items::item_kind(&message), ItemKind::AgentMessage);
    let collab = item(json!({"type": "collabAgentToolCall", "id": "c"}));
    assert_eq!(items::item_kind(&collab), ItemKind::ToolCall);
    let unknown = item(json!({"type": "imageView", "id": "i"}));
    assert_eq!(
        items::item_kind(&unknown),
        ItemKind::Other("imageView".into())
    );
}
