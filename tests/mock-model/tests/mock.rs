//! The mock over raw HTTP/1.1, as a client sees it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{call, post, WAIT};
use relay_mock_model::{
    apply_patch_add_file_text, write_codex_home, write_file_command, MockModel, Reply,
    WRITE_FILE_RULE,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn post_json(addr: SocketAddr, body: &Value) -> (String, String, String) {
    post(addr, "/v1/responses", body).await
}

/// `(event, data)` pairs of an SSE body.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let event = block
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap();
            let data = block
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            (event.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn user(text: &str) -> Value {
    json!({"model": "mock-model", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    ]})
}

#[tokio::test]
async fn text_reply_streams_deltas_then_completes() {
    let mock = MockModel::start().await.unwrap();
    mock.push(Reply::chunks(["a", "b", "c"]));
    let (status, headers, body) = post_json(mock.addr(), &user("hi")).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(headers.contains("content-type: text/event-stream"));
    let evs = events(&body);
    let kinds: Vec<&str> = evs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.output_item.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let deltas: Vec<&str> = evs
        .iter()
        .filter_map(|(_, d)| d.get("delta").and_then(Value::as_str))
        .collect();
    assert_eq!(deltas, ["a", "b", "c"]);
    assert_eq!(evs[5].1["item"]["content"][0]["text"], "abc");
    assert_eq!(evs[6].1["response"]["id"], evs[0].1["response"]["id"]);
    assert!(
        evs[6].1["response"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/responses");
    assert_eq!(requests[0].header("content-type"), Some("application/json"));
    assert_eq!(requests[0].body, user("hi"));
}

#[tokio::test]
async fn replies_come_from_the_queue_then_the_handler_then_the_echo() {
    let mock = MockModel::start().await.unwrap();
    let text_of = |body: &str| -> String {
        events(body)
            .into_iter()
            .find(|(k, _)| k == "response.output_item.done")
            .map(|(_, d)| {
                d["item"]["content"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .unwrap()
    };
    let (_, _, body) = post_json(mock.addr(), &user("first")).await;
    assert_eq!(text_of(&body), "ok: first");

    mock.push(Reply::text("queued"));
    mock.set_handler(|req| Reply::text(format!("handled {}", req.last_user_text().unwrap())));
    let (_, _, body) = post_json(mock.addr(), &user("second")).await;
    assert_eq!(text_of(&body), "queued");
    let (_, _, body) = post_json(mock.addr(), &user("third")).await;
    assert_eq!(text_of(&body), "handled third");
    assert_eq!(mock.wait_for_requests(3, WAIT).await.unwrap().len(), 3);
}

#[tokio::test]
async fn function_calls_and_failures_have_their_events() {
    let mock = MockModel::start().await.unwrap();
    mock.push(Reply::exec_command_escalated(
        "call_9", "echo hi", "because",
    ));
    mock.push(Reply::failed("nope"));
    mock.push(Reply::HttpError {
        status: 503,
        body: "{}".into(),
    });

    let (_, _, body) = post_json(mock.addr(), &user("x")).await;
    let evs = events(&body);
    let item = &evs
        .iter()
        .find(|(k, _)| k == "response.output_item.done")
        .unwrap()
        .1["item"];
    assert_eq!(item["type"], "function_call");
    assert_eq!(item["call_id"], "call_9");
    assert_eq!(item["name"], "exec_command");
    let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        args,
        json!({"cmd": "echo hi", "sandbox_permissions": "require_escalated", "justification": "because"})
    );
    assert_eq!(evs.last().unwrap().0, "response.completed");

    let (_, _, body) = post_json(mock.addr(), &user("x")).await;
    let evs = events(&body);
    assert_eq!(evs.last().unwrap().0, "response.failed");
    assert_eq!(
        evs.last().unwrap().1["response"]["error"]["message"],
        "nope"
    );

    let (status, _, _) = post_json(mock.addr(), &user("x")).await;
    assert!(status.starts_with("HTTP/1.1 503"), "{status}");
}

/// A write is Codex's escalated `exec_command` on Responses, Claude Code's `Bash` on
/// Messages; either way a command that, run by a shell, writes the file; and the requests
/// of a turn are found by the text they carry.
#[tokio::test]
async fn a_write_file_is_each_clis_shell_call_and_writes_the_file() {
    let mock = MockModel::start().await.unwrap();
    let content = "a line with 'quotes', spaces and a $dollar";
    mock.push(Reply::write_file("call_w", "notes.txt", content));
    mock.push(Reply::write_file("toolu_w", "notes.txt", content));
    let cmd = write_file_command("notes.txt", content).unwrap();

    let (_, _, body) = post_json(mock.addr(), &user("write it")).await;
    let item = events(&body)
        .into_iter()
        .find(|(k, _)| k == "response.output_item.done")
        .unwrap()
        .1["item"]
        .clone();
    let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        (
            &item["name"],
            &item["call_id"],
            &args["cmd"],
            &args["sandbox_permissions"]
        ),
        (
            &json!("exec_command"),
            &json!("call_w"),
            &json!(cmd),
            &json!("require_escalated")
        )
    );

    let claude = json!({"model": "m", "stream": false,
        "tools": [{"name": "Read"}, {"name": "Bash"}],
        "messages": [{"role": "user", "content": "write it too"}]});
    let (_, _, body) = post(mock.addr(), "/v1/messages", &claude).await;
    let block = &serde_json::from_str::<Value>(&body).unwrap()["content"][0];
    assert_eq!(
        (
            &block["type"],
            &block["name"],
            &block["id"],
            &block["input"]["command"]
        ),
        (
            &json!("tool_use"),
            &json!("Bash"),
            &json!("toolu_w"),
            &json!(cmd)
        )
    );

    // The command writes exactly the content, in the directory it runs in.
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("bash")
        .args(["-c", &cmd])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes.txt")).unwrap(),
        content
    );
    // The rule names the script word for word, then the two plain arguments.
    assert!(WRITE_FILE_RULE.ends_with(" sh * *"), "{WRITE_FILE_RULE}");
    assert_eq!(
        shlex::split(WRITE_FILE_RULE).unwrap()[..4],
        shlex::split(&cmd).unwrap()[..4]
    );

    assert_eq!(mock.requests_with("write it").len(), 2);
    assert_eq!(mock.requests_with("write it too").len(), 1);
    let prompted = mock.requests_prompted("too");
    assert_eq!(prompted.len(), 1);
    assert!(prompted[0].carries("write it too") && !prompted[0].carries("nothing like it"));
}

/// [`Reply::edit_file`] on the wire: Codex's freeform `apply_patch` as a Responses
/// `custom_tool_call` (then `response.completed`), Claude Code's `Write` as a `tool_use`
/// whose input streams as JSON deltas.
#[tokio::test]
async fn an_edit_file_is_codex_apply_patch_or_claude_codes_write() {
    let mock = MockModel::start().await.unwrap();
    mock.push(Reply::edit_file("call_e", "new.txt", "one\ntwo\n"));
    mock.push(Reply::edit_file("toolu_e", "/w/new.txt", "one\n"));
    let mut codex = user("edit it");
    codex["tools"] = json!([
        {"type": "function", "name": "exec_command"},
        {"type": "custom", "name": "apply_patch"},
    ]);
    let (_, _, body) = post_json(mock.addr(), &codex).await;
    let sent = events(&body);
    let kinds: Vec<&str> = sent.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let item = &sent[1].1["item"];
    assert_eq!(
        (
            &item["type"],
            &item["name"],
            &item["call_id"],
            &item["input"]
        ),
        (
            &json!("custom_tool_call"),
            &json!("apply_patch"),
            &json!("call_e"),
            &json!(apply_patch_add_file_text("new.txt", "one\ntwo\n"))
        )
    );

    let claude = json!({"model": "m", "stream": true,
        "tools": [{"name": "Bash"}, {"name": "Write"}],
        "messages": [{"role": "user", "content": "edit it too"}]});
    let (_, _, body) = post(mock.addr(), "/v1/messages", &claude).await;
    let events = events(&body);
    let start = &events
        .iter()
        .find(|(k, _)| k == "content_block_start")
        .unwrap()
        .1;
    assert_eq!(
        (
            &start["content_block"]["name"],
            &start["content_block"]["id"]
        ),
        (&json!("Write"), &json!("toolu_e"))
    );
    let delta = &events
        .iter()
        .find(|(k, _)| k == "content_block_delta")
        .unwrap()
        .1;
    let input: Value =
        serde_json::from_str(delta["delta"]["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(
        input,
        json!({"file_path": "/w/new.txt", "content": "one\n"})
    );
}

#[tokio::test]
async fn chunked_request_bodies_are_read() {
    let mock = MockModel::start().await.unwrap();
    let body = user("chunky").to_string();
    let (a, b) = body.split_at(10);
    let chunked = format!(
        "{:x};ext=1\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let head = "POST /v1/responses HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n";
    let (status, _, _) = call(mock.addr(), head, chunked.as_bytes()).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        mock.requests()[0].last_user_text().as_deref(),
        Some("chunky")
    );
}

#[tokio::test]
async fn models_and_unknown_paths() {
    let mock = MockModel::start().await.unwrap();
    let (status, _, body) = call(
        mock.addr(),
        "GET /v1/models?client_version=1 HTTP/1.1\r\nhost: x\r\n\r\n",
        b"",
    )
    .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["data"][0]["id"], "mock-model");

    let (status, _, _) = call(mock.addr(), "GET /nope HTTP/1.1\r\nhost: x\r\n\r\n", b"").await;
    assert!(status.starts_with("HTTP/1.1 404"));

    assert!(mock.requests().is_empty());
    let all = mock.all_requests();
    assert_eq!(all.len(), 2);
    assert_eq!(
        (all[0].path.as_str(), all[0].query.as_str()),
        ("/v1/models", "client_version=1")
    );
}

#[tokio::test]
async fn a_hang_holds_the_stream_until_the_mock_is_dropped() {
    let mock = MockModel::start().await.unwrap();
    mock.push(Reply::hang());
    let body = user("x").to_string();
    let mut stream = TcpStream::connect(mock.addr()).await.unwrap();
    stream
        .write_all(
            format!(
                "POST /v1/responses HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("response.created") {
        let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    // Nothing more arrives...
    assert!(
        tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf))
            .await
            .is_err()
    );
    // ...until the mock goes away and closes the connection.
    drop(mock);
    let n = tokio::time::timeout(WAIT, stream.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0);
}

#[test]
fn codex_home_points_at_the_mock() {
    let dir = tempfile::tempdir().unwrap();
    write_codex_home(dir.path(), "http://127.0.0.1:9/v1").unwrap();
    let config = std::fs::read_to_string(dir.path().join("config.toml")).unwrap();
    for line in [
        "model = \"mock-model\"",
        "model_provider = \"mock\"",
        "approval_policy = \"on-request\"",
        "sandbox_mode = \"read-only\"",
        "[model_providers.mock]",
        "base_url = \"http://127.0.0.1:9/v1\"",
        "wire_api = \"responses\"",
        "request_max_retries = 0",
        "stream_max_retries = 0",
        "supports_websockets = false",
    ] {
        assert!(config.lines().any(|l| l == line), "missing {line:?}");
    }
}
