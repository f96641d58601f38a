//! The OpenAI Responses API stream (what Codex speaks): `response.created`, the output
//! item (text deltas, a function call, or a freeform tool's `custom_tool_call`), then `response.completed` with usage, or
//! `response.failed`.

use serde_json::json;

use crate::http::{Conn, SseWriter};
use crate::usage::Usage;
use crate::{
    all_input_text, approx_tokens, hold_until_hangup, sleep_unless_hangup, RecordedRequest, Reply,
    Shared,
};

pub(crate) async fn stream(
    conn: &mut Conn,
    shared: &Shared,
    req: &RecordedRequest,
    reply: Reply,
    usage: Option<Usage>,
) -> std::io::Result<()> {
    let n = shared.next_id();
    let response_id = format!("resp_{n}");
    let mut sse = SseWriter::start(conn).await?;
    sse.event(
        "response.created",
        &json!({"type": "response.created", "response": {"id": response_id, "status": "in_progress"}}),
    )
    .await?;

    let output_tokens = match reply {
        Reply::Text { chunks, delay } => {
            let item_id = format!("msg_{n}");
            sse.event(
                "response.output_item.added",
                &json!({
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": {"type": "message", "role": "assistant", "id": item_id, "status": "in_progress", "content": []},
                }),
            )
            .await?;
            let last = chunks.len().saturating_sub(1);
            for (i, chunk) in chunks.iter().enumerate() {
                sse.event(
                    "response.output_text.delta",
                    &json!({
                        "type": "response.output_text.delta",
                        "item_id": item_id,
                        "output_index": 0,
                        "content_index": 0,
                        "delta": chunk,
                    }),
                )
                .await?;
                if i < last && !delay.is_zero() && !sleep_unless_hangup(sse.conn(), delay).await? {
                    // The client went away (an interrupted or steered turn).
                    return Ok(());
                }
            }
            let text = chunks.concat();
            sse.event(
                "response.output_item.done",
                &json!({
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": {
                        "type": "message",
                        "role": "assistant",
                        "id": item_id,
                        "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    },
                }),
            )
            .await?;
            approx_tokens(&text)
        }
        Reply::FunctionCall {
            call_id,
            name,
            arguments,
            namespace,
        } => {
            let mut item = json!({
                "type": "function_call",
                "id": format!("fc_{n}"),
                "status": "completed",
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
            });
            if let Some(namespace) = namespace {
                item["namespace"] = json!(namespace);
            }
            sse.event(
                "response.output_item.done",
                &json!({
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": item,
                }),
            )
            .await?;
            approx_tokens(&arguments)
        }
        Reply::CustomToolCall {
            call_id,
            name,
            input,
        } => {
            sse.event(
                "response.output_item.done",
                &json!({
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": {
                        "type": "custom_tool_call",
                        "id": format!("ctc_{n}"),
                        "status": "completed",
                        "call_id": call_id,
                        "name": name,
                        "input": input,
                    },
                }),
            )
            .await?;
            approx_tokens(&input)
        }
        Reply::Failed { code, message } => {
            sse.event(
                "response.failed",
                &json!({
                    "type": "response.failed",
                    "response": {
                        "id": response_id,
                        "status": "failed",
                        "error": {"code": code, "message": message},
                    },
                }),
            )
            .await?;
            return sse.finish().await;
        }
        Reply::Hang => return hold_until_hangup(sse.conn()).await,
        // Answered (HttpError) or turned into a tool call (WriteFile, EditFile) before any
        // stream starts.
        // (WithUsage is unwrapped before.)
        Reply::HttpError { .. }
        | Reply::WriteFile { .. }
        | Reply::EditFile { .. }
        | Reply::WithUsage { .. } => return Ok(()),
    };

    let input_tokens = approx_tokens(&all_input_text(req));
    sse.event(
        "response.completed",
        &json!({
            "type": "response.completed",
            "response": {
                "id": response_id,
                "status": "completed",
                "usage": Usage::or_estimate(usage, input_tokens, output_tokens).responses(),
            },
        }),
    )
    .await?;
    sse.finish().await
}
