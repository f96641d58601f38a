//! OpenAI chat completions (what OpenCode and Qwen Code speak): `POST …/chat/completions`
//! with `"stream": true` streams `chat.completion.chunk`s as bare `data:` lines: a role
//! delta, one `content` delta per text chunk (or one `tool_calls` delta with the whole
//! call), a last chunk with the `finish_reason`, a usage chunk with `choices: []` when
//! the request asks `stream_options.include_usage`, then `data: [DONE]`. Without
//! `stream` the whole `chat.completion` is one JSON body.
//!
//! A failure mid-stream is a `data: {"error": {...}}` line, which both the `openai` SDK
//! (Qwen Code) and the AI SDK (OpenCode) raise as an API error without retrying.

use serde_json::{json, Value};

use crate::http::{self, Conn, SseWriter};
use crate::usage::Usage;
use crate::{
    all_input_text, approx_tokens, hold_until_hangup, sleep_unless_hangup, RecordedRequest, Reply,
    Shared,
};

/// The `tool_calls` entry a [`Reply::FunctionCall`] becomes (`index` 0, the arguments
/// whole). An MCP tool's name is `<namespace>__<tool>` as in the Messages API (not
/// checked against either CLI's naming of MCP tools).
fn tool_call(call_id: &str, name: &str, arguments: &str, namespace: Option<&str>, n: u64) -> Value {
    let name = match namespace {
        Some(ns) => format!("{ns}__{name}"),
        None => name.to_string(),
    };
    let id = if call_id.is_empty() {
        format!("call_{n}")
    } else {
        call_id.to_string()
    };
    json!({"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// The error a [`Reply::Failed`] becomes. Its `code` is not sent: OpenCode retries, with
/// backoff and without end, any error whose text mentions a 5xx status, `server_error`,
/// rate limits or overload, so a scripted failure says only `invalid_request_error`
/// and its message (which should avoid those words too).
fn error_body(message: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}})
}

pub(crate) async fn complete(
    conn: &mut Conn,
    shared: &Shared,
    req: &RecordedRequest,
    reply: Reply,
    set_usage: Option<Usage>,
) -> std::io::Result<()> {
    let n = shared.next_id();
    let id = format!("chatcmpl-{n}");
    let model = req
        .body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock-model")
        .to_string();
    let input = approx_tokens(&all_input_text(req));
    let streamed = req.body.get("stream").and_then(Value::as_bool) == Some(true);
    if !streamed {
        return whole(conn, &id, &model, (input, set_usage), n, reply).await;
    }
    let include_usage = req.body["stream_options"]["include_usage"].as_bool() == Some(true);
    let chunk = |delta: Value, finish: Option<&str>| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
        .to_string()
    };

    let mut sse = SseWriter::start(conn).await?;
    let (output, finish) = match reply {
        Reply::Text { chunks, delay } => {
            sse.data(&chunk(json!({"role": "assistant", "content": ""}), None))
                .await?;
            let last = chunks.len().saturating_sub(1);
            for (i, text) in chunks.iter().enumerate() {
                sse.data(&chunk(json!({"content": text}), None)).await?;
                if i < last && !delay.is_zero() && !sleep_unless_hangup(sse.conn(), delay).await? {
                    // The client went away (a cancelled turn).
                    return Ok(());
                }
            }
            (approx_tokens(&chunks.concat()), "stop")
        }
        Reply::FunctionCall {
            call_id,
            name,
            arguments,
            namespace,
        } => {
            let call = tool_call(&call_id, &name, &arguments, namespace.as_deref(), n);
            sse.data(&chunk(
                json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                None,
            ))
            .await?;
            (approx_tokens(&arguments), "tool_calls")
        }
        Reply::Failed { message, .. } => {
            sse.data(&error_body(&message).to_string()).await?;
            return sse.finish().await;
        }
        Reply::Hang => return hold_until_hangup(sse.conn()).await,
        // Answered (HttpError), turned into a tool call (WriteFile, EditFile) or a failure
        // (CustomToolCall: Responses only) before any stream starts.
        Reply::HttpError { .. }
        | Reply::WriteFile { .. }
        | Reply::EditFile { .. }
        | Reply::CustomToolCall { .. }
        | Reply::WithUsage { .. } => return Ok(()),
    };
    sse.data(&chunk(json!({}), Some(finish))).await?;
    if include_usage {
        let body = json!({
            "id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [], "usage": Usage::or_estimate(set_usage, input, output).chat(),
        });
        sse.data(&body.to_string()).await?;
    }
    sse.data("[DONE]").await?;
    sse.finish().await
}

/// The non-streamed answer: one `chat.completion`.
async fn whole(
    conn: &mut Conn,
    id: &str,
    model: &str,
    (input, set_usage): (u64, Option<Usage>),
    n: u64,
    reply: Reply,
) -> std::io::Result<()> {
    let (message, finish, output) = match reply {
        Reply::Text { chunks, .. } => {
            let text = chunks.concat();
            let output = approx_tokens(&text);
            (
                json!({"role": "assistant", "content": text}),
                "stop",
                output,
            )
        }
        Reply::FunctionCall {
            call_id,
            name,
            arguments,
            namespace,
        } => {
            let mut call = tool_call(&call_id, &name, &arguments, namespace.as_deref(), n);
            if let Some(call) = call.as_object_mut() {
                // `index` belongs to stream deltas only.
                call.remove("index");
            }
            let output = approx_tokens(&arguments);
            (
                json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                "tool_calls",
                output,
            )
        }
        Reply::Failed { message, .. } => {
            // 400, not 5xx: both SDKs retry 5xx, which would hide a scripted failure.
            let body = error_body(&message).to_string();
            return http::write_response(conn, 400, "application/json", body.as_bytes()).await;
        }
        Reply::Hang => return hold_until_hangup(conn).await,
        Reply::HttpError { .. }
        | Reply::WriteFile { .. }
        | Reply::EditFile { .. }
        | Reply::CustomToolCall { .. }
        | Reply::WithUsage { .. } => return Ok(()),
    };
    let body = json!({
        "id": id, "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": Usage::or_estimate(set_usage, input, output).chat(),
    });
    http::write_response(conn, 200, "application/json", body.to_string().as_bytes()).await
}
