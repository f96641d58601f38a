//! The Gemini API and OpenAI chat completions over raw HTTP/1.1: the bytes one request
//! gets back, in the shapes Gemini CLI, OpenCode and Qwen Code sent (their requests as
//! recorded against the real CLIs, trimmed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{call, post};
use relay_mock_model::{
    gemini_env, opencode_env, qwen_env, write_gemini_home, write_opencode_home, write_qwen_home,
    MockModel, Reply,
};
use serde_json::{json, Value};

const STREAM: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent";

/// A Gemini CLI request: its context part, then what was typed.
fn gemini_request(text: &str) -> Value {
    json!({
        "contents": [{"role": "user", "parts": [
            {"text": "<session_context>\nThis is the Gemini CLI.\n</session_context>"},
            {"text": text},
        ]}],
        "systemInstruction": {"role": "user", "parts": [{"text": "You are an agent."}]},
        "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}],
    })
}

/// The `data:` payloads of an SSE body that names no events, each block checked to be
/// exactly one `data:` line.
fn data_lines(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "{body:?}");
    body.split_terminator("\n\n")
        .map(|block| {
            assert!(!block.contains('\n'), "one line per event: {block:?}");
            block.strip_prefix("data: ").unwrap().to_string()
        })
        .collect()
}

fn parsed(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn gemini_streams_text_chunks_and_finishes_the_last() {
    let mock = MockModel::start().await.unwrap();
    mock.push(Reply::chunks(["Hello ", "there"]));
    let path = format!("{STREAM}?alt=sse");
    let (status, headers, body) = post(mock.addr(), &path, &gemini_request("hi")).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(headers.contains("content-type: text/event-stream"));
    let lines = data_lines(&body);
    assert_eq!(
        lines[0],
        r#"{"candidates":[{"content":{"parts":[{"text":"Hello "}],"role":"model"},"index":0}],"modelVersion":"gemini-2.5-flash","responseId":"gem_1"}"#
    );
    let chunks = parsed(&lines);
    assert_eq!(chunks.len(), 2);
    let last = &chunks[1];
    assert_eq!(
        last["candidates"][0]["content"]["parts"][0]["text"],
        "there"
    );
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    let usage = &last["usageMetadata"];
    let (prompt, out) = (
        usage["promptTokenCount"].as_u64().unwrap(),
        usage["candidatesTokenCount"].as_u64().unwrap(),
    );
    assert!(prompt > 0 && out > 0);
    assert_eq!(usage["totalTokenCount"].as_u64().unwrap(), prompt + out);

    let req = &mock.requests()[0];
    assert_eq!((req.path.as_str(), req.query.as_str()), (STREAM, "alt=sse"));
    assert_eq!(req.last_user_text().as_deref(), Some("hi"));
}

#[tokio::test]
async fn gemini_function_calls_failures_and_the_echo() {
    let mock = MockModel::start().await.unwrap();
    mock.push(Reply::shell_command("call_1", "echo hi", "say hi"));
    mock.push(Reply::failed("nope"));
    mock.push(Reply::HttpError {
        status: 429,
        body: "{}".into(),
    });

    let (_, _, body) = post(mock.addr(), STREAM, &gemini_request("run")).await;
    let chunks = parsed(&data_lines(&body));
    assert_eq!(chunks.len(), 1);
    assert_eq!(
        chunks[0]["candidates"][0]["content"]["parts"],
        json!([{"functionCall": {"name": "run_shell_command", "id": "call_1", "args": {"command": "echo hi", "description": "say hi"}}}])
    );
    assert_eq!(chunks[0]["candidates"][0]["finishReason"], "STOP");

    // The SDK spots an error only as a bare JSON chunk, not a `data:` line.
    let (status, _, body) = post(mock.addr(), STREAM, &gemini_request("x")).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        body,
        r#"{"error":{"code":400,"details":[{"reason":"server_error"}],"message":"nope","status":"FAILED_PRECONDITION"}}"#
    );

    let (status, _, _) = post(mock.addr(), STREAM, &gemini_request("x")).await;
    assert!(status.starts_with("HTTP/1.1 429"), "{status}");

    // Nothing queued: the echo of what was typed, not of the context part.
    let (_, _, body) = post(mock.addr(), STREAM, &gemini_request("marker")).await;
    let chunks = parsed(&data_lines(&body));
    assert_eq!(
        chunks[0]["candidates"][0]["content"]["parts"][0]["text"],
        "ok: marker"
    );
}

#[tokio::test]
async fn gemini_generate_content_and_count_tokens_answer_one_json() {
    let mock = MockModel::start().await.unwrap();
    mock.push(Reply::chunks(["a", "b"]));
    let (status, headers, body) = post(
        mock.addr(),
        "/v1beta/models/gemini-2.5-flash:generateContent",
        &gemini_request("x"),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(headers.contains("content-type: application/json"));
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["candidates"][0]["content"],
        json!({"role": "model", "parts": [{"text": "ab"}]})
    );
    assert_eq!(body["candidates"][0]["finishReason"], "STOP");

    let (status, _, body) = post(
        mock.addr(),
        "/v1beta/models/gemini-2.5-flash:countTokens",
        &gemini_request("x"),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert!(body["totalTokens"].as_u64().unwrap() > 0);
    // Counting is not a model request.
    assert_eq!(mock.requests().len(), 1);
    assert_eq!(mock.all_requests().len(), 2);
}

/// An OpenCode / Qwen Code request.
fn chat_request(text: &str, stream: bool, include_usage: bool) -> Value {
    let mut body = json!({
        "model": "mock-model",
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\ncontext\n</system-reminder>"},
                {"type": "text", "text": text},
            ]},
        ],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
        "stream": stream,
    });
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

const CHAT: &str = "/v1/chat/completions";

#[tokio::test]
async fn chat_streams_deltas_usage_and_done() {
    let mock = MockModel::start().await.unwrap();
    mock.push(Reply::chunks(["Hel", "lo"]));
    let (status, headers, body) = post(mock.addr(), CHAT, &chat_request("hi", true, true)).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(headers.contains("content-type: text/event-stream"));
    let lines = data_lines(&body);
    assert_eq!(lines.last().unwrap(), "[DONE]");
    assert_eq!(
        lines[0],
        r#"{"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0}],"created":0,"id":"chatcmpl-1","model":"mock-model","object":"chat.completion.chunk"}"#
    );
    let chunks = parsed(&lines[..lines.len() - 1]);
    let deltas: Vec<&str> = chunks[1..3]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, ["Hel", "lo"]);
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[3]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[4]["choices"], json!([]));
    let usage = &chunks[4]["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(chunks.len(), 5);

    // Without `include_usage`, no usage chunk.
    let (_, _, body) = post(mock.addr(), CHAT, &chat_request("hi", true, false)).await;
    let lines = data_lines(&body);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(
        lines[1],
        r#"{"choices":[{"delta":{"content":"ok: hi"},"finish_reason":null,"index":0}],"created":0,"id":"chatcmpl-2","model":"mock-model","object":"chat.completion.chunk"}"#
    );
}

#[tokio::test]
async fn chat_tool_calls_and_failures() {
    let mock = MockModel::start().await.unwrap();
    let args = json!({"command": "echo hi", "description": "d"});
    mock.push(Reply::function_call("call_7", "bash", &args));
    mock.push(Reply::function_call("", "bash", &args));
    mock.push(Reply::failed("nope"));
    mock.push(Reply::failed("nope"));

    let (_, _, body) = post(mock.addr(), CHAT, &chat_request("run", true, true)).await;
    let lines = data_lines(&body);
    let chunks = parsed(&lines[..lines.len() - 1]);
    assert_eq!(
        chunks[0]["choices"][0]["delta"]["tool_calls"],
        json!([{"index": 0, "id": "call_7", "type": "function", "function": {"name": "bash", "arguments": args.to_string()}}])
    );
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(lines.last().unwrap(), "[DONE]");

    // Not streamed: one `chat.completion`, the call without `index`, a made-up id.
    let (status, _, body) = post(mock.addr(), CHAT, &chat_request("run", false, false)).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"],
        json!([{"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": args.to_string()}}])
    );

    let (_, _, body) = post(mock.addr(), CHAT, &chat_request("x", true, true)).await;
    assert_eq!(
        data_lines(&body),
        [r#"{"error":{"code":null,"message":"nope","param":null,"type":"invalid_request_error"}}"#]
    );
    let (status, _, body) = post(mock.addr(), CHAT, &chat_request("x", false, false)).await;
    assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["message"],
        "nope"
    );
}

#[tokio::test]
async fn chat_without_stream_answers_the_whole_text() {
    let mock = MockModel::start().await.unwrap();
    let mut req = chat_request("title please", false, false);
    req.as_object_mut().unwrap().remove("stream");
    let (_, headers, body) = post(mock.addr(), CHAT, &req).await;
    assert!(headers.contains("content-type: application/json"));
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["choices"][0],
        json!({"index": 0, "message": {"role": "assistant", "content": "ok: title please"}, "finish_reason": "stop"})
    );
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn unknown_gemini_methods_are_404() {
    let mock = MockModel::start().await.unwrap();
    let (status, _, _) = call(
        mock.addr(),
        "GET /v1beta/models/gemini-2.5-flash:nope HTTP/1.1\r\nhost: x\r\n\r\n",
        b"",
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 404"));
    assert!(mock.requests().is_empty());
}

fn env_value<'a>(env: &'a [(String, String)], key: &str) -> &'a str {
    env.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} in {env:?}"))
}

fn read_json(path: std::path::PathBuf) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn acp_homes_point_each_cli_at_the_mock() {
    let dir = tempfile::tempdir().unwrap();

    let home = dir.path().join("gemini");
    write_gemini_home(&home).unwrap();
    let settings = read_json(home.join(".gemini/settings.json"));
    assert_eq!(settings["privacy"]["usageStatisticsEnabled"], false);
    assert_eq!(settings["model"]["name"], relay_mock_model::GEMINI_MODEL);
    assert_eq!(settings["general"]["sessionRetention"]["enabled"], false);
    let env = gemini_env(&home, "http://127.0.0.1:9");
    assert_eq!(env_value(&env, "HOME"), home.display().to_string());
    assert_eq!(
        env_value(&env, "GOOGLE_GEMINI_BASE_URL"),
        "http://127.0.0.1:9"
    );
    assert_eq!(env_value(&env, "GEMINI_CLI_NO_RELAUNCH"), "true");

    let home = dir.path().join("opencode");
    write_opencode_home(&home, "http://127.0.0.1:9/v1").unwrap();
    let config = read_json(home.join(".config/opencode/opencode.json"));
    assert_eq!(
        config["provider"]["mock"]["options"]["baseURL"],
        "http://127.0.0.1:9/v1"
    );
    assert_eq!(config["model"], "mock/mock-model");
    assert_eq!(config["permission"]["bash"], "ask");
    assert_eq!(config["agent"]["title"]["disable"], true);
    let env = opencode_env(&home);
    assert_eq!(env_value(&env, "OPENCODE_PURE"), "1");
    assert_eq!(env_value(&env, "OPENCODE_DISABLE_MODELS_FETCH"), "1");
    assert_eq!(
        env_value(&env, "XDG_CONFIG_HOME"),
        home.join(".config").display().to_string()
    );

    let home = dir.path().join("qwen");
    write_qwen_home(&home).unwrap();
    let settings = read_json(home.join(".qwen/settings.json"));
    assert_eq!(settings["security"]["auth"]["selectedType"], "openai");
    assert_eq!(settings["tools"]["approvalMode"], "default");
    let env = qwen_env(&home, "http://127.0.0.1:9/v1");
    assert_eq!(env_value(&env, "OPENAI_BASE_URL"), "http://127.0.0.1:9/v1");
    assert_eq!(env_value(&env, "OPENAI_MODEL"), "mock-model");
    assert_eq!(env_value(&env, "HOME"), home.display().to_string());
}
