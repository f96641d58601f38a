//! Unit tests of the Codex wire types: decoding the envelope, items and notifications as
//! the pinned Codex sends them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;

use super::*;

#[test]
fn envelope_kinds_decode_by_shape() {
    let m: Message =
        serde_json::from_str(r#"{"id":0,"method":"item/fileChange/requestApproval","params":{}}"#)
            .unwrap();
    assert!(matches!(
        m,
        Message::Request(Request {
            id: RequestId::Integer(0),
            ..
        })
    ));
    let m: Message =
        serde_json::from_str(r#"{"method":"warning","params":{"message":"m"},"emittedAtMs":1}"#)
            .unwrap();
    assert!(matches!(m, Message::Notification(_)));
    let m: Message = serde_json::from_str(r#"{"id":"a","result":{}}"#).unwrap();
    assert_eq!(
        m,
        Message::Response(Response {
            id: RequestId::String("a".into()),
            result: json!({})
        })
    );
    let m: Message =
        serde_json::from_str(r#"{"error":{"code":-32600,"message":"no"},"id":3}"#).unwrap();
    assert!(matches!(
        m,
        Message::Error(ErrorResponse {
            id: RequestId::Integer(3),
            ..
        })
    ));
    assert!(serde_json::from_str::<Message>(r#"{"garbage":1}"#).is_err());
}

#[test]
fn requests_serialise_without_jsonrpc_field_and_with_camel_case() {
    let req = Request {
        id: RequestId::Integer(7),
        method: method::TURN_STEER.into(),
        params: Some(
            serde_json::to_value(TurnSteerParams {
                thread_id: "t".into(),
                expected_turn_id: "u".into(),
                input: vec![UserInput::text("hi")],
            })
            .unwrap(),
        ),
    };
    assert_eq!(
        serde_json::to_value(&req).unwrap(),
        json!({"id": 7, "method": "turn/steer", "params": {
            "threadId": "t", "expectedTurnId": "u", "input": [{"type": "text", "text": "hi"}]
        }})
    );
    assert_eq!(
        serde_json::to_value(ThreadStartParams {
            approval_policy: Some(AskForApproval::OnRequest),
            sandbox: Some(SandboxMode::ReadOnly),
            ..Default::default()
        })
        .unwrap(),
        json!({"approvalPolicy": "on-request", "sandbox": "read-only"})
    );
    assert_eq!(
        serde_json::to_value(ApprovalResponse {
            decision: ApprovalDecision::AcceptForSession
        })
        .unwrap(),
        json!({"decision": "acceptForSession"})
    );
}

#[test]
fn items_decode_known_and_unknown_types() {
    let item: ThreadItem = serde_json::from_value(json!({
        "type": "agentMessage", "id": "msg_1", "text": "hi", "phase": null
    }))
    .unwrap();
    assert_eq!(
        item,
        ThreadItem::Known(KnownThreadItem::AgentMessage {
            id: "msg_1".into(),
            text: "hi".into()
        })
    );
    let item: ThreadItem = serde_json::from_value(json!({
        "type": "userMessage", "id": "u", "content": [
            {"type": "text", "text": "a", "text_elements": []},
            {"type": "localImage", "path": "/x.png"}
        ]
    }))
    .unwrap();
    assert_eq!(
        item,
        ThreadItem::Known(KnownThreadItem::UserMessage {
            id: "u".into(),
            content: vec![UserInput::text("a"), UserInput::Other]
        })
    );
    let item: ThreadItem =
        serde_json::from_value(json!({"type": "contextCompaction", "id": "c"})).unwrap();
    assert_eq!((item.type_name(), item.id()), ("contextCompaction", "c"));
}

#[test]
fn unknown_turn_status_is_tolerated() {
    let turn: Turn =
        serde_json::from_value(json!({"id": "t", "status": "paused", "items": []})).unwrap();
    assert_eq!(turn.status, TurnStatus::Unknown);
}
