//! The Anthropic Messages API (what Claude Code and Pi speak): `POST /v1/messages`
//! streams `message_start`, one content block (text deltas, or a `tool_use` whose input
//! arrives as `input_json_delta`), `message_delta` with the stop reason and usage, and
//! `message_stop`; a failure is an `error` event. A request with `"stream": false` gets
//! the whole message as one JSON body.

use serde_json::{json, Value};

use crate::http::{self, Conn, SseWriter};
use crate::usage::Usage;
use crate::{
    all_input_text, approx_tokens, hold_until_hangup, sleep_unless_hangup, RecordedRequest, Reply,
    Shared,
};

/// The content block a reply becomes, and its stop reason.
fn block(reply: &Reply, n: u64) -> Option<(Value, &'static str)> {
    match reply {
        Reply::Text { chunks, .. } => {
            Some((json!({"type": "text", "text": chunks.concat()}), "end_turn"))
        }
        Reply::FunctionCall {
            call_id,
            name,
            arguments,
            namespace,
        } => {
            let name = match namespace {
                Some(ns) => format!("{ns}__{name}"),
                None => name.clone(),
            };
            let input: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
            let id = if call_id.is_empty() {
                format!("toolu_{n}")
            } else {
                call_id.clone()
            };
            Some((
                json!({"type": "tool_use", "id": id, "name": name, "input": input}),
                "tool_use",
            ))
        }
        _ => None,
    }
}

pub(crate) async fn stream(
    conn: &mut Conn,
    shared: &Shared,
    req: &RecordedRequest,
    reply: Reply,
    set_usage: Option<Usage>,
) -> std::io::Result<()> {
    let n = shared.next_id();
    let message_id = format!("msg_{n}");
    let model = req
        .body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock-model")
        .to_string();
    let input_tokens = approx_tokens(&all_input_text(req));
    // The reply's usage, given the estimate of its output.
    let usage = |output_tokens: u64| {
        let u = Usage::or_estimate(set_usage, input_tokens, output_tokens);
        u.messages(u.output)
    };
    // `message_start` says 1 output token so far, as the API does.
    let start_usage = Usage::or_estimate(set_usage, input_tokens, 1).messages(1);

    if req.body.get("stream").and_then(Value::as_bool) != Some(true) {
        let Some((content, stop)) = block(&reply, n) else {
            let body = json!({"type": "error", "error": {"type": "api_error", "message": "mock: no reply"}});
            return http::write_response(
                conn,
                500,
                "application/json",
                body.to_string().as_bytes(),
            )
            .await;
        };
        let out = approx_tokens(&content.to_string());
        let body = json!({
            "id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": [content], "stop_reason": stop, "stop_sequence": null,
            "usage": usage(out),
        });
        return http::write_response(conn, 200, "application/json", body.to_string().as_bytes())
            .await;
    }

    let mut sse = SseWriter::start(conn).await?;
    sse.event(
        "message_start",
        &json!({"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage,
        }}),
    )
    .await?;

    let (output_tokens, stop) = match &reply {
        Reply::Text { chunks, delay } => {
            sse.event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            )
            .await?;
            let last = chunks.len().saturating_sub(1);
            for (i, chunk) in chunks.iter().enumerate() {
                sse.event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": chunk}}),
                )
                .await?;
                if i < last && !delay.is_zero() && !sleep_unless_hangup(sse.conn(), *delay).await? {
                    return Ok(());
                }
            }
            (approx_tokens(&chunks.concat()), "end_turn")
        }
        Reply::FunctionCall { arguments, .. } => {
            let Some((mut content, stop)) = block(&reply, n) else {
                return sse.finish().await;
            };
            // The input arrives only through the deltas.
            content["input"] = json!({});
            sse.event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": content}),
            )
            .await?;
            sse.event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": arguments}}),
            )
            .await?;
            (approx_tokens(arguments), stop)
        }
        Reply::Failed { code, message } => {
            sse.event(
                "error",
                &json!({"type": "error", "error": {"type": code, "message": message}}),
            )
            .await?;
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
    sse.event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    )
    .await?;
    sse.event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": usage(output_tokens)}),
    )
    .await?;
    sse.event("message_stop", &json!({"type": "message_stop"}))
        .await?;
    sse.finish().await
}
