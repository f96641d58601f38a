//! `relay-fake-acp`: an ACP agent that misbehaves on request, for the `acp` harness's
//! tests (`tests/tests/acp_fake.rs`). It speaks JSON lines on stdio like
//! the real ones (`relay_protocol::acp`) and knows sessions whose id starts `fake-`.
//!
//! With `RELAY_FAKE_ACP=silent` it never answers `initialize`. Otherwise each prompt's
//! text picks what it does:
//! - `garbage`: a message chunk, a line that is not JSON, then an ordinary end;
//! - `weird-stop`: a chunk, then the stop reason `out_of_coffee`;
//! - `die`: a chunk, `fake dies` on stderr, exit code 3;
//! - `ask`: a request Relay does not know (`craft/drainMidTurnQueue`, id 0), then a
//!   permission request for `rm -rf /tmp/x` (id 1; `ask:COMMAND`: for COMMAND); once answered, the chunk
//!   `chose <optionId|cancelled>` and `end_turn` (`cancelled` after a `session/cancel`);
//! - `slow`: a chunk every 50 ms until `session/cancel`, then `cancelled`;
//! - anything else: an update kind nobody knows, a plan, a finished tool call, the
//!   chunks `echo: ` and the text, and `end_turn` with usage.
//!
//! `session/load` replays the session's history (`replayed history`) before and after
//! its answer, as Gemini CLI and OpenCode do.

use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

fn out(v: Value) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{v}");
    let _ = stdout.flush();
}

fn update(session: &str, update: Value) {
    out(json!({"jsonrpc": "2.0", "method": "session/update",
        "params": {"sessionId": session, "update": update}}));
}

fn chunk(session: &str, text: &str) {
    update(
        session,
        json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}),
    );
}

fn answer(id: &Value, result: Value) {
    out(json!({"jsonrpc": "2.0", "id": id, "result": result}));
}

fn main() {
    let silent = std::env::var("RELAY_FAKE_ACP").is_ok_and(|m| m == "silent");
    let (tx, rx) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    let mut sessions = 0;
    while let Ok(msg) = rx.recv() {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let session = params["sessionId"].as_str().unwrap_or_default().to_string();
        match msg["method"].as_str().unwrap_or_default() {
            "initialize" if silent => {}
            "initialize" => answer(
                &id,
                json!({"protocolVersion": 1,
                    "agentCapabilities": {"loadSession": true, "promptCapabilities": {"image": true}},
                    "agentInfo": {"name": "relay-fake-acp", "version": "0.0.1"}}),
            ),
            "session/new" => {
                sessions += 1;
                answer(&id, json!({"sessionId": format!("fake-{sessions}")}));
            }
            "session/load" if session.starts_with("fake-") => {
                chunk(&session, "replayed history ");
                answer(&id, json!({}));
                update(
                    &session,
                    json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "earlier"}}),
                );
                chunk(&session, "replayed history, after");
            }
            "session/load" => out(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32602, "message": format!("Session not found: {session}")}})),
            "session/prompt" => {
                let text = params["prompt"][0]["text"].as_str().unwrap_or_default();
                if !prompt(&rx, &id, &session, text) {
                    return;
                }
            }
            _ if id.is_null() => {}
            other => out(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": format!("unknown method {other}")}})),
        }
    }
}

/// Runs one prompt; `false` when the agent is to exit.
fn prompt(rx: &mpsc::Receiver<Value>, id: &Value, session: &str, text: &str) -> bool {
    let end = |reason: &str| answer(id, json!({"stopReason": reason}));
    match text {
        "garbage" => {
            chunk(session, "before ");
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "this line is not JSON at all");
            let _ = stdout.flush();
            drop(stdout);
            chunk(session, "after");
            end("end_turn");
        }
        "weird-stop" => {
            chunk(session, "thinking about coffee");
            end("out_of_coffee");
        }
        "die" => {
            chunk(session, "about to die");
            eprintln!("fake dies");
            std::process::exit(3);
        }
        "ask" => ask(rx, id, session, "rm -rf /tmp/x"),
        text if text.starts_with("ask:") => ask(rx, id, session, &text["ask:".len()..]),
        "slow" => loop {
            chunk(session, "tick ");
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(msg) if msg["method"] == "session/cancel" => {
                    end("cancelled");
                    break;
                }
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        },
        text => {
            update(
                session,
                json!({"sessionUpdate": "available_commands_update", "availableCommands": []}),
            );
            update(
                session,
                json!({"sessionUpdate": "plan", "entries": [
                {"content": "look", "priority": "high", "status": "completed"},
                {"content": "answer", "priority": "high", "status": "in_progress"}]}),
            );
            update(
                session,
                json!({"sessionUpdate": "tool_call", "toolCallId": "t1",
                "title": "ls", "kind": "execute", "status": "pending", "rawInput": {"command": "ls"}}),
            );
            update(
                session,
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "t1",
                "status": "completed", "content": [{"type": "content", "content": {"type": "text", "text": "a.txt"}}]}),
            );
            update(
                session,
                json!({"sessionUpdate": "agent_thought_chunk",
                "content": {"type": "text", "text": "hmm"}}),
            );
            chunk(session, "echo: ");
            chunk(session, text);
            answer(
                id,
                json!({"stopReason": "end_turn",
                "usage": {"inputTokens": 12, "outputTokens": 3, "totalTokens": 15}}),
            );
        }
    }
    true
}

/// `ask`/`ask:COMMAND`: an unknown request, then a permission request for `command`,
/// answered with the option chosen (see the module docs).
fn ask(rx: &mpsc::Receiver<Value>, id: &Value, session: &str, command: &str) {
    let end = |reason: &str| answer(id, json!({"stopReason": reason}));
    out(
        json!({"jsonrpc": "2.0", "id": 0, "method": "craft/drainMidTurnQueue",
        "params": {"sessionId": session}}),
    );
    out(
        json!({"jsonrpc": "2.0", "id": 1, "method": "session/request_permission",
        "params": {"sessionId": session,
            "toolCall": {"toolCallId": "call-1", "title": "Remove a directory",
                "kind": "execute", "rawInput": {"command": command}},
            "options": [
                {"optionId": "proceed_always", "name": "Always", "kind": "allow_always"},
                {"optionId": "proceed_once", "name": "Once", "kind": "allow_once"},
                {"optionId": "cancel", "name": "No", "kind": "reject_once"}]}}),
    );
    let mut refused_unknown = false;
    let mut cancelled = false;
    while let Ok(msg) = rx.recv() {
        if msg["method"] == "session/cancel" {
            cancelled = true;
            continue;
        }
        if msg["id"] == json!(0) {
            refused_unknown = msg["error"]["code"] == json!(-32601);
            continue;
        }
        if msg["id"] == json!(1) {
            let outcome = &msg["result"]["outcome"];
            let chose = outcome["optionId"].as_str().unwrap_or("cancelled");
            chunk(
                session,
                &format!("chose {chose}; unknown request refused: {refused_unknown}"),
            );
            end(if cancelled { "cancelled" } else { "end_turn" });
            break;
        }
    }
}
