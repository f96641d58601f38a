//! `relay-instant-codex`: a stand-in for `codex app-server` that answers at once, for load
//! tests and benchmarks (it measures Relay, not a model).
//!
//! It speaks the same JSON-RPC lines as the real app-server (the types of
//! `relay_protocol::codex`): `initialize`, `thread/start`, `thread/resume` (any id is
//! resumed, with no earlier turns), and `turn/start`, which it answers with the turn and
//! then, without waiting, `turn/started`, `item/started`, one `item/agentMessage/delta`
//! (`ok: <task>`), `item/completed` and `turn/completed`. `turn/steer` and
//! `turn/interrupt` are refused as "no active turn": a turn is over before either can
//! arrive.
//!
//! Invoked as the agent's `--command`; the `app-server` argument is ignored.

use std::io::{BufRead, BufWriter, Write};

use relay_protocol::codex::{
    error_code, method, notification, ErrorObject, ErrorResponse, InitializeResponse,
    KnownThreadItem, Message, Notification, Request, Response, Thread, ThreadItem, Turn,
    TurnStatus,
};
use serde_json::{json, Value};

fn main() -> std::io::Result<()> {
    let stdin = std::io::stdin();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut next_thread = 0u64;
    let mut next_turn = 0u64;
    for line in stdin.lock().lines() {
        let line = line?;
        let Ok(Message::Request(req)) = serde_json::from_str::<Message>(&line) else {
            // Notifications (`initialized`) and answers need nothing back.
            continue;
        };
        match req.method.as_str() {
            method::INITIALIZE => respond(
                &mut out,
                &req,
                to_value(&InitializeResponse {
                    user_agent: "relay-instant-codex".into(),
                    codex_home: None,
                    platform_os: None,
                }),
            )?,
            method::THREAD_START | method::THREAD_RESUME => {
                let id = match param(&req, "threadId") {
                    Some(id) => id,
                    None => {
                        next_thread += 1;
                        format!("00000000-0000-4000-8000-{next_thread:012}")
                    }
                };
                let thread = Thread {
                    id,
                    path: None,
                    cwd: None,
                    preview: None,
                    turns: Vec::new(),
                };
                respond(&mut out, &req, json!({ "thread": to_value(&thread) }))?;
            }
            method::TURN_START => {
                next_turn += 1;
                let thread_id = param(&req, "threadId").unwrap_or_default();
                let turn_id = format!("turn-{next_turn}");
                let task = req
                    .params
                    .as_ref()
                    .and_then(|p| p["input"][0]["text"].as_str())
                    .unwrap_or_default()
                    .to_string();
                let turn = |status, items| Turn {
                    id: turn_id.clone(),
                    status,
                    items,
                    error: None,
                };
                respond(
                    &mut out,
                    &req,
                    json!({ "turn": to_value(&turn(TurnStatus::InProgress, vec![])) }),
                )?;
                let turn_note = |status, items| json!({ "threadId": thread_id, "turn": to_value(&turn(status, items)) });
                notify(
                    &mut out,
                    notification::TURN_STARTED,
                    turn_note(TurnStatus::InProgress, vec![]),
                )?;
                let item_id = format!("msg-{next_turn}");
                let text = format!("ok: {task}");
                let item = |text: &str| {
                    ThreadItem::Known(KnownThreadItem::AgentMessage {
                        id: item_id.clone(),
                        text: text.to_string(),
                    })
                };
                let item_note = |text: &str| json!({ "threadId": thread_id, "turnId": turn_id, "item": to_value(&item(text)) });
                notify(&mut out, notification::ITEM_STARTED, item_note(""))?;
                notify(
                    &mut out,
                    notification::AGENT_MESSAGE_DELTA,
                    json!({ "threadId": thread_id, "turnId": turn_id, "itemId": item_id, "delta": text }),
                )?;
                notify(&mut out, notification::ITEM_COMPLETED, item_note(&text))?;
                notify(
                    &mut out,
                    notification::TURN_COMPLETED,
                    turn_note(TurnStatus::Completed, vec![item(&text)]),
                )?;
            }
            other => {
                let message = match other {
                    method::TURN_STEER => "no active turn to steer".to_string(),
                    method::TURN_INTERRUPT => "no active turn to interrupt".to_string(),
                    _ => format!("unknown method {other}"),
                };
                write(
                    &mut out,
                    &Message::Error(ErrorResponse {
                        id: req.id.clone(),
                        error: ErrorObject {
                            code: error_code::INVALID_REQUEST,
                            message,
                            data: None,
                        },
                    }),
                )?;
            }
        }
        out.flush()?;
    }
    Ok(())
}

fn param(req: &Request, name: &str) -> Option<String> {
    req.params.as_ref()?[name].as_str().map(str::to_string)
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn respond(out: &mut impl Write, req: &Request, result: Value) -> std::io::Result<()> {
    write(
        out,
        &Message::Response(Response {
            id: req.id.clone(),
            result,
        }),
    )
}

fn notify(out: &mut impl Write, method: &str, params: Value) -> std::io::Result<()> {
    write(
        out,
        &Message::Notification(Notification {
            method: method.to_string(),
            params: Some(params),
        }),
    )
}

fn write(out: &mut impl Write, msg: &Message) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, msg)?;
    out.write_all(b"\n")
}
