use serde_json::{json, Value};

use super::*;

fn update(line: &str) -> SessionUpdate {
    match Message::parse(line) {
        Ok(Message::Notification { params, .. }) => {
            serde_json::from_value::<SessionNotification>(params)
                .map(|n| n.update)
                .unwrap_or_else(|e| panic!("{e}: {line}"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn messages_are_told_apart_and_id_zero_is_an_id() {
    let m = Message::parse(
        r#"{"jsonrpc":"2.0","id":0,"method":"session/request_permission","params":{}}"#,
    );
    assert_eq!(
        m,
        Ok(Message::Request {
            id: RequestId::Number(0),
            method: "session/request_permission".into(),
            params: json!({})
        })
    );
    let m = Message::parse(r#"{"jsonrpc":"2.0","method":"session/update","params":{"a":1}}"#);
    assert!(matches!(m, Ok(Message::Notification { .. })));
    let m = Message::parse(r#"{"jsonrpc":"2.0","id":"x","result":null}"#);
    assert_eq!(
        m,
        Ok(Message::Response {
            id: RequestId::Str("x".into()),
            result: Ok(Value::Null)
        })
    );
    let m = Message::parse(r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"no"}}"#);
    assert_eq!(
        m,
        Ok(Message::Response {
            id: RequestId::Number(3),
            result: Err(RpcError::new(-32601, "no"))
        })
    );
}

#[test]
fn lines_that_are_not_rpc_say_why() {
    assert!(matches!(
        Message::parse("hello"),
        Err(LineError::NotJson(_))
    ));
    assert!(matches!(
        Message::parse("[1]"),
        Err(LineError::NotRpc { id: None, .. })
    ));
    assert!(matches!(
        Message::parse(r#"{"id":7}"#),
        Err(LineError::NotRpc {
            id: Some(RequestId::Number(7)),
            ..
        })
    ));
    assert_eq!(
        LineError::NotJson("x".into()).rpc_error().code,
        RpcError::PARSE_ERROR
    );
}

#[test]
fn a_message_round_trips_through_its_line() {
    let m = Message::request(
        RequestId::Number(1),
        method::SESSION_PROMPT,
        PromptRequest {
            session_id: "s".into(),
            prompt: vec![ContentBlock::text("two\nlines")],
        },
    );
    let line = m.to_line();
    assert!(!line.contains('\n'));
    assert_eq!(Message::parse(&line), Ok(m));
}

#[test]
fn updates_of_the_three_clis_parse() {
    // Gemini CLI: a tool_call_update without a tool_call before it.
    let u = update(
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"run_shell_command-1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"hi"}}]}}}"#,
    );
    assert!(
        matches!(u, SessionUpdate::ToolCallUpdate(ref t) if t.status == Some(ToolCallStatus::Completed))
    );
    // OpenCode: a message chunk with a messageId.
    let u = update(
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","messageId":"m1","content":{"type":"text","text":"Hello "}}}}"#,
    );
    assert_eq!(
        u,
        SessionUpdate::AgentMessageChunk(ContentChunk {
            content: ContentBlock::text("Hello "),
            message_id: Some("m1".into()),
            meta: None
        })
    );
    // Qwen Code: an empty chunk carrying usage in _meta.
    let u = update(
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":""},"_meta":{"usage":{"promptTokens":3}}}}}"#,
    );
    assert!(matches!(
        u,
        SessionUpdate::AgentMessageChunk(ContentChunk { meta: Some(_), .. })
    ));
    let u = update(
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"t","title":"ls","kind":"execute","status":"pending","rawInput":{"command":"ls"}}}}"#,
    );
    assert!(matches!(u, SessionUpdate::ToolCall(ref t) if t.kind == ToolKind::Execute));
}

#[test]
fn unknown_kinds_are_tolerated_and_named() {
    let line = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"available_commands_update","availableCommands":[]}}}"#;
    assert_eq!(update(line), SessionUpdate::Unknown);
    let Ok(Message::Notification { params, .. }) = Message::parse(line) else {
        panic!("a notification")
    };
    assert_eq!(
        SessionNotification::kind_of(&params),
        Some("available_commands_update")
    );
    let tool: ToolCall = serde_json::from_value(
        json!({"toolCallId":"t","kind":"teleport","content":[{"type":"hologram"}]}),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tool.kind, ToolKind::Unknown("teleport".into()));
    assert_eq!(tool.content, vec![ToolCallContent::Unknown]);
    let r: PromptResponse = serde_json::from_value(json!({"stopReason":"out_of_coffee"}))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.stop_reason, StopReason::Other("out_of_coffee".into()));
    assert_eq!(
        serde_json::to_value(&r).ok(),
        Some(json!({"stopReason":"out_of_coffee"}))
    );
}

#[test]
fn a_permission_request_offers_its_options_by_kind() {
    let r: RequestPermissionRequest = serde_json::from_value(json!({
        "sessionId": "s",
        "toolCall": {"toolCallId": "t", "title": "rm -rf /tmp/x", "kind": "execute"},
        "options": [
            {"optionId": "proceed_always", "name": "Always", "kind": "allow_always"},
            {"optionId": "proceed_once", "name": "Once", "kind": "allow_once"},
            {"optionId": "cancel", "name": "No", "kind": "reject_once"},
            {"optionId": "x", "name": "?", "kind": "maybe"}
        ]
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.option(PermissionOptionKind::AllowOnce)
            .map(|o| o.option_id.as_str()),
        Some("proceed_once")
    );
    assert_eq!(r.options[3].kind, PermissionOptionKind::Unknown);
    let answer = RequestPermissionResponse {
        outcome: PermissionOutcome::Selected {
            option_id: "cancel".into(),
        },
    };
    assert_eq!(
        serde_json::to_value(&answer).ok(),
        Some(json!({"outcome": {"outcome": "selected", "optionId": "cancel"}}))
    );
}

#[test]
fn capabilities_are_named_for_a_person() {
    let r: InitializeResponse = serde_json::from_value(json!({
        "protocolVersion": 1,
        "agentCapabilities": {
            "loadSession": true,
            "promptCapabilities": {"image": true},
            "sessionCapabilities": {"resume": {}, "list": {}}
        },
        "agentInfo": {"name": "opencode", "version": "1.18.33"}
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.agent_capabilities.can_resume());
    assert_eq!(
        r.agent_capabilities.names(),
        vec!["load_session", "resume", "list", "image"]
    );
}
