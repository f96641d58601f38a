//! The Gemini API (what Gemini CLI speaks): `POST /v1beta/models/<model>:streamGenerateContent?alt=sse`
//! streams one `data: <GenerateContentResponse>` per chunk (no `event:` lines), the last
//! with `finishReason: "STOP"` and the usage; `:generateContent` answers the same
//! response as one JSON body. A function call is a `functionCall` part.
//!
//! A failure mid-stream is a bare JSON `{"error": {...}}` chunk, not a `data:` line:
//! that is what the `@google/genai` SDK looks for (it parses each raw chunk as JSON
//! first). Its code is 400, because Gemini CLI retries 429, 499 and 5xx up to ten times
//! with 5-30 s backoff, which would turn a scripted failure into minutes of retries.

use serde_json::{json, Value};

use crate::http::{self, Conn, SseWriter};
use crate::usage::Usage;
use crate::{
    all_input_text, approx_tokens, hold_until_hangup, sleep_unless_hangup, RecordedRequest, Reply,
    Shared,
};

/// The model named in the path (`/v1beta/models/<model>:<method>`).
fn model(req: &RecordedRequest) -> String {
    req.path
        .rsplit_once("/models/")
        .and_then(|(_, rest)| rest.split(':').next())
        .filter(|m| !m.is_empty())
        .unwrap_or("mock-model")
        .to_string()
}

/// The `functionCall` part a [`Reply::FunctionCall`] becomes. An MCP tool's name is
/// `<namespace>__<tool>` as in the Messages API (not checked against Gemini CLI's
/// naming of MCP tools). The id is kept when given: Gemini CLI echoes it back in the
/// `functionResponse`.
fn function_call_part(
    call_id: &str,
    name: &str,
    arguments: &str,
    namespace: Option<&str>,
) -> Value {
    let name = match namespace {
        Some(ns) => format!("{ns}__{name}"),
        None => name.to_string(),
    };
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!({}));
    let mut call = json!({"name": name, "args": args});
    if !call_id.is_empty() {
        call["id"] = json!(call_id);
    }
    json!({"functionCall": call})
}

/// One `GenerateContentResponse` carrying `parts`; with `finish` set, the finish
/// reason and the usage too (Gemini sends usage on every chunk; the CLI reads the last).
fn response(parts: Vec<Value>, finish: Option<Usage>, model: &str, id: &str) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    let mut body = json!({"candidates": [], "modelVersion": model, "responseId": id});
    if let Some(usage) = finish {
        candidate["finishReason"] = json!("STOP");
        body["usageMetadata"] = usage.gemini();
    }
    body["candidates"] = json!([candidate]);
    body
}

fn error_body(code: &str, message: &str) -> Value {
    json!({"error": {"code": 400, "message": message, "status": "FAILED_PRECONDITION", "details": [{"reason": code}]}})
}

/// `…:countTokens`: the same 4-bytes-a-token estimate as the usage numbers.
pub(crate) async fn count_tokens(conn: &mut Conn, req: &RecordedRequest) -> std::io::Result<()> {
    let body = json!({"totalTokens": approx_tokens(&all_input_text(req))}).to_string();
    http::write_response(conn, 200, "application/json", body.as_bytes()).await
}

/// `…:generateContent`: the whole reply as one JSON response.
pub(crate) async fn generate(
    conn: &mut Conn,
    shared: &Shared,
    req: &RecordedRequest,
    reply: Reply,
    set_usage: Option<Usage>,
) -> std::io::Result<()> {
    let id = format!("gem_{}", shared.next_id());
    let model = model(req);
    let input = approx_tokens(&all_input_text(req));
    let part = match reply {
        Reply::Text { chunks, .. } => json!({"text": chunks.concat()}),
        Reply::FunctionCall {
            call_id,
            name,
            arguments,
            namespace,
        } => function_call_part(&call_id, &name, &arguments, namespace.as_deref()),
        Reply::Failed { code, message } => {
            let body = error_body(&code, &message).to_string();
            return http::write_response(conn, 400, "application/json", body.as_bytes()).await;
        }
        Reply::Hang => return hold_until_hangup(conn).await,
        // Answered (HttpError), turned into a tool call (WriteFile, EditFile) or a failure
        // (CustomToolCall: Responses only) before this is called.
        Reply::HttpError { .. }
        | Reply::WriteFile { .. }
        | Reply::EditFile { .. }
        | Reply::CustomToolCall { .. }
        | Reply::WithUsage { .. } => return Ok(()),
    };
    let output = approx_tokens(&part.to_string());
    let usage = Usage::or_estimate(set_usage, input, output);
    let body = response(vec![part], Some(usage), &model, &id).to_string();
    http::write_response(conn, 200, "application/json", body.as_bytes()).await
}

/// `…:streamGenerateContent?alt=sse`: one `data:` chunk per text chunk, or one with the
/// function call; the last carries `finishReason` and usage.
pub(crate) async fn stream(
    conn: &mut Conn,
    shared: &Shared,
    req: &RecordedRequest,
    reply: Reply,
    set_usage: Option<Usage>,
) -> std::io::Result<()> {
    let id = format!("gem_{}", shared.next_id());
    let model = model(req);
    let input = approx_tokens(&all_input_text(req));
    let mut sse = SseWriter::start(conn).await?;
    match reply {
        Reply::Text { chunks, delay } => {
            let output = approx_tokens(&chunks.concat());
            // An empty reply still ends with one (empty) part and the finish reason.
            let chunks = if chunks.is_empty() {
                vec![String::new()]
            } else {
                chunks
            };
            let last = chunks.len() - 1;
            for (i, chunk) in chunks.iter().enumerate() {
                let finish = (i == last).then_some(Usage::or_estimate(set_usage, input, output));
                let body = response(vec![json!({"text": chunk})], finish, &model, &id);
                sse.data(&body.to_string()).await?;
                if i < last && !delay.is_zero() && !sleep_unless_hangup(sse.conn(), delay).await? {
                    // The client went away (a cancelled turn).
                    return Ok(());
                }
            }
        }
        Reply::FunctionCall {
            call_id,
            name,
            arguments,
            namespace,
        } => {
            let part = function_call_part(&call_id, &name, &arguments, namespace.as_deref());
            let output = approx_tokens(&arguments);
            let usage = Usage::or_estimate(set_usage, input, output);
            let body = response(vec![part], Some(usage), &model, &id);
            sse.data(&body.to_string()).await?;
        }
        Reply::Failed { code, message } => {
            sse.raw(&error_body(&code, &message).to_string()).await?;
        }
        Reply::Hang => return hold_until_hangup(sse.conn()).await,
        // Answered (HttpError), turned into a tool call (WriteFile, EditFile) or a failure
        // (CustomToolCall: Responses only) before any stream starts.
        Reply::HttpError { .. }
        | Reply::WriteFile { .. }
        | Reply::EditFile { .. }
        | Reply::CustomToolCall { .. }
        | Reply::WithUsage { .. } => return Ok(()),
    }
    sse.finish().await
}
