//! The foundation, end to end with a real `relay up` process: durability across
//! `kill -9`, the event log's sequence, projections equal to a rebuild, and bad input.
//!
//! Over 600 lines: the foundation's end-to-end specification, one test per guarantee.
//! The process fixtures live in `relay_tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_broker::store::Store;
use relay_tests::wait::wait_until_every;
use relay_tests::{procs, wait_until, wait_until_blocking, RelayProcess};
use serde_json::{json, Value};

#[test]
fn a_sent_message_survives_kill_9_and_the_log_stays_gap_free() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut relay = RelayProcess::start(&dir).unwrap();
    relay.cli_ok(&[
        "agent",
        "add",
        "codex-1",
        "--harness",
        "codex_app_server",
        "--cwd",
        "/tmp",
        // Without a session a manual agent's turn fails at once: the consult the mention
        // below starts never runs a real codex.
        "--wake",
        "manual",
    ]);
    relay.cli_ok(&["send", "first, for @codex-1"]);
    // The message the broker acknowledged last, then an immediate kill -9.
    let id = relay.cli_ok(&["send", "--as", "alice", "the last words"]);
    let id = id.trim().to_string();
    let pid = relay.pid();
    relay.kill9();
    assert!(!procs::alive(pid));

    relay.restart().unwrap();
    // The mention's consult has ended (it fails: no session), so nothing more is
    // written while the log is measured below.
    wait_until_blocking(
        "the consult of codex-1 to end",
        std::time::Duration::from_secs(60),
        || {
            let live = relay.cli_json(&["flights", "--live", "--json"]);
            let all = relay.cli_json(&["flights", "--json"]);
            (live == json!([]) && all.as_array().unwrap().len() == 1).then_some(())
        },
    );
    let msgs = relay.cli_json(&["read", "-n", "10", "--json"]);
    let last = msgs.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["id"], id.as_str());
    assert_eq!(last["body"], "the last words");
    assert_eq!(last["author"], "alice");

    // The sequence continues where it stopped: no gap, no reuse.
    let before: Vec<u64> = seqs(&relay.cli_json(&["events", "--json"]));
    relay.cli_ok(&["send", "after the restart"]);
    let after: Vec<u64> = seqs(&relay.cli_json(&["events", "--json"]));
    assert_eq!(before, (1..=before.len() as u64).collect::<Vec<_>>());
    assert_eq!(after, (1..=after.len() as u64).collect::<Vec<_>>());
    assert!(after.len() > before.len());
    let tail = relay.cli_json(&["events", "--since", &before.len().to_string(), "--json"]);
    assert_eq!(tail[0]["type"], "message_posted");
    assert_eq!(tail[0]["message"]["body"], "after the restart");

    // Projections equal a rebuild from the log (read with the broker stopped).
    let status = relay.terminate().unwrap();
    assert!(status.success(), "clean shutdown: {status}");
    let store = Store::open(&dir.join(relay_broker::store::STORE_DIR)).unwrap();
    let report = store.verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");
    assert_eq!(report.events, after.len() as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_under_concurrent_load_loses_nothing_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut relay = RelayProcess::start(&dir).unwrap();
    let http = relay.http();
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let http = relay.http();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..1000 {
                let body = json!({"conversation": "channel.shared", "author": format!("w{w}"), "body": format!("m{w}-{i}")});
                // A request the dying broker did not answer was never acknowledged.
                match http
                    .try_request(reqwest::Method::POST, "/v1/messages", Some(body.to_string().into_bytes()))
                    .await
                {
                    Ok((200, body)) => acked
                        .lock()
                        .unwrap()
                        .push(body["message"]["id"].as_str().unwrap().to_string()),
                    _ => return,
                }
            }
        }));
    }
    // Let the writers get going, then kill the broker mid-stream.
    wait_until_every(
        std::time::Duration::from_millis(5),
        "300 acknowledged messages",
        std::time::Duration::from_secs(60),
        || async { (acked.lock().unwrap().len() >= 300).then_some(()) },
    )
    .await;
    relay.kill9();
    for t in tasks {
        t.await.unwrap();
    }
    drop(http);
    let acked = acked.lock().unwrap().clone();
    relay.restart().unwrap();
    let (code, msgs) = relay
        .http()
        .get("/v1/conversations/channel.shared/messages?limit=100000")
        .await;
    assert_eq!(code, 200);
    let stored: std::collections::HashSet<String> = msgs
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    let lost: Vec<_> = acked.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(lost.is_empty(), "{} acknowledged messages lost", lost.len());
    let indexes: Vec<u64> = msgs
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, (0..indexes.len() as u64).collect::<Vec<_>>());
    relay.terminate().unwrap();
    let report = Store::open(&dir.join(relay_broker::store::STORE_DIR))
        .unwrap()
        .verify()
        .unwrap();
    assert!(report.is_consistent(), "{report:?}");
}

fn seqs(events: &Value) -> Vec<u64> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_a_typed_error_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &["--max-message-bytes", "1024"],
        &[],
    )
    .unwrap();
    let http = relay.http();
    let last_seq = || async {
        relay.http().get("/v1/status").await.1["last_seq"]
            .as_u64()
            .unwrap()
    };
    let flushes = || async {
        relay.http().get("/v1/status").await.1["flushes"]
            .as_u64()
            .unwrap()
    };
    // An agent for the invocations below (registering it is the last write).
    let (code, body) = http
        .post(
            "/v1/agents",
            &json!({"name": "a1", "harness": "codex_app_server", "cwd": "/tmp"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let seq0 = last_seq().await;
    let flushes0 = flushes().await;
    let msg =
        |body: String| json!({"conversation": "channel.shared", "author": "me", "body": body});
    let task = |requester: &str, task: String| json!({"target": "a1", "requester": requester, "task": task});

    let cases: Vec<(&str, u16, &str, (u16, Value))> = vec![
        (
            "malformed JSON",
            400,
            "invalid_request",
            http.request(
                reqwest::Method::POST,
                "/v1/messages",
                Some(b"{\"conversation\": ".to_vec()),
            )
            .await,
        ),
        (
            "garbage bytes",
            400,
            "invalid_request",
            http.request(
                reqwest::Method::POST,
                "/v1/messages",
                Some(vec![0xff, 0x00, 0x13]),
            )
            .await,
        ),
        (
            "wrong field type",
            400,
            "invalid_request",
            http.post(
                "/v1/messages",
                &json!({"conversation": 5, "author": "me", "body": "x"}),
            )
            .await,
        ),
        (
            "no token",
            401,
            "unauthorized",
            relay
                .http()
                .with_token(None)
                .post("/v1/messages", &msg("hi".into()))
                .await,
        ),
        (
            "wrong token",
            401,
            "unauthorized",
            relay
                .http()
                .with_token(Some("not-the-token"))
                .post("/v1/messages", &msg("hi".into()))
                .await,
        ),
        (
            "wrong token on a read",
            401,
            "unauthorized",
            relay.http().with_token(Some("x")).get("/v1/agents").await,
        ),
        (
            "body over the message limit",
            413,
            "payload_too_large",
            http.post("/v1/messages", &msg("x".repeat(1025))).await,
        ),
        (
            "request over the HTTP body limit",
            413,
            "payload_too_large",
            http.post("/v1/messages", &msg("x".repeat(200_000))).await,
        ),
        (
            "unknown conversation",
            404,
            "unknown_conversation",
            http.post(
                "/v1/messages",
                &json!({"conversation": "nope", "author": "me", "body": "x"}),
            )
            .await,
        ),
        (
            "unknown agent",
            404,
            "unknown_agent",
            http.post("/v1/invocations", &json!({"target": "ghost", "task": "x"}))
                .await,
        ),
        (
            "unknown agent (show)",
            404,
            "unknown_agent",
            http.get("/v1/agents/ghost").await,
        ),
        (
            "unknown flight",
            404,
            "unknown_flight",
            http.get("/v1/flights/flt_nope").await,
        ),
        (
            "bad harness",
            400,
            "invalid_request",
            http.post(
                "/v1/agents",
                &json!({"name": "a", "harness": "vim", "cwd": "/tmp"}),
            )
            .await,
        ),
        (
            "no such route",
            404,
            "not_found",
            http.get("/v1/nothing-here").await,
        ),
        (
            "bad query parameter",
            400,
            "invalid_request",
            http.get("/v1/events?after=abc").await,
        ),
        (
            "wrong method",
            405,
            "invalid_request",
            http.request(reqwest::Method::PUT, "/v1/messages", None)
                .await,
        ),
        (
            "conversation id that is no subject token",
            400,
            "invalid_request",
            http.post(
                "/v1/conversations",
                &json!({"id": "bad id", "kind": "channel"}),
            )
            .await,
        ),
        (
            "empty body",
            400,
            "invalid_request",
            http.post("/v1/messages", &msg(String::new())).await,
        ),
        (
            "blank author",
            400,
            "invalid_request",
            http.post(
                "/v1/messages",
                &json!({"conversation": "channel.shared", "author": " ", "body": "x"}),
            )
            .await,
        ),
        (
            "author over 128 characters",
            400,
            "invalid_request",
            http.post(
                "/v1/messages",
                &json!({"conversation": "channel.shared", "author": "a".repeat(129), "body": "x"}),
            )
            .await,
        ),
        (
            "empty task",
            400,
            "invalid_request",
            http.post("/v1/invocations", &task("me", String::new()))
                .await,
        ),
        (
            "task over the message limit",
            413,
            "payload_too_large",
            http.post("/v1/invocations", &task("me", "x".repeat(1025)))
                .await,
        ),
        (
            "empty requester",
            400,
            "invalid_request",
            http.post("/v1/invocations", &task("", "x".into())).await,
        ),
        (
            "empty agent name",
            400,
            "invalid_request",
            http.post(
                "/v1/agents",
                &json!({"name": "", "harness": "codex_app_server", "cwd": "/tmp"}),
            )
            .await,
        ),
        (
            "empty cwd",
            400,
            "invalid_request",
            http.post(
                "/v1/agents",
                &json!({"name": "a2", "harness": "codex_app_server", "cwd": ""}),
            )
            .await,
        ),
        (
            "empty conversation id",
            400,
            "invalid_request",
            http.post("/v1/conversations", &json!({"id": "", "kind": "channel"}))
                .await,
        ),
        (
            "illegal transition on unknown flight",
            404,
            "unknown_flight",
            http.post(
                "/v1/flights/flt_x/updates",
                &json!({"kind": "state", "to": "running"}),
            )
            .await,
        ),
    ];
    for (what, status, code, (got_status, body)) in cases {
        assert_eq!(got_status, status, "{what}: {body}");
        assert_eq!(body["error"]["code"], code, "{what}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}"
        );
    }
    assert_eq!(last_seq().await, seq0, "nothing was written");
    assert_eq!(flushes().await, flushes0, "nothing was flushed");

    // The auth scheme is case-insensitive.
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/agents", relay.api.url))
        .header("authorization", format!("bearer {}", relay.api.token))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    // The broker still serves, and a good request after all that works.
    let (code, body) = http.post("/v1/messages", &msg("still here".into())).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(last_seq().await, seq0 + 1);
    assert!(flushes().await > flushes0, "the message was flushed");

    // The CLI reports errors on stderr with a non-zero exit code.
    let out = relay.cli(&["send", "--to", "nope", "hello"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown conversation") && stderr.contains("unknown_conversation"),
        "{stderr}"
    );
    let out = relay.cli(&["agent", "show", "ghost", "--json"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}

#[test]
fn api_json_is_private_and_the_token_survives_a_restart() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut relay = RelayProcess::start(&dir).unwrap();
    let meta = std::fs::metadata(dir.join("api.json")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(relay.api.url.starts_with("http://127.0.0.1:"));
    let token = relay.api.token.clone();
    assert!(token.len() >= 32);
    relay.restart().unwrap();
    assert_eq!(relay.api.token, token);
    // Refuses to listen beyond loopback.
    let out = std::process::Command::new(relay_tests::relay_bin())
        .args(["up", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(tmp.path().join("other"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}

#[test]
fn shutdown_is_not_held_up_by_an_open_event_stream() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut relay = RelayProcess::start(&dir).unwrap();
    let mut follower = Follower(
        std::process::Command::new(relay_tests::relay_bin())
            .args(["events", "--follow"])
            .env("RELAY_DATA_DIR", &dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    relay.cli_ok(&["send", "while someone follows"]);
    // The follower's lines, stdout and stderr, each read on a thread of its own (a read
    // blocks).
    let lines_of = |pipe: Box<dyn std::io::Read + Send>| {
        let (lines, printed) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        printed
    };
    let printed = lines_of(Box::new(follower.0.stdout.take().unwrap()));
    let said = lines_of(Box::new(follower.0.stderr.take().unwrap()));
    let (mut text, mut notes) = (String::new(), String::new());
    let wait_for = |what: &str, rx: &std::sync::mpsc::Receiver<String>, into: &mut String| {
        wait_until_blocking(
            format!("the follower to print {what:?}"),
            std::time::Duration::from_secs(60),
            || {
                into.extend(rx.try_iter().map(|l| l + "\n"));
                into.contains(what).then_some(())
            },
        )
    };
    // The stream is open and has delivered the message: now stop the broker under it.
    wait_for("while someone follows", &printed, &mut text);
    // terminate() fails if relay takes more than 20 s to exit after SIGTERM.
    let status = relay.terminate().unwrap();
    assert!(status.success(), "{status}");
    // The stream ended with the broker; the follower says so and waits for it.
    wait_for("lost the broker", &said, &mut notes);
    // A broker on the same data dir: the follower goes on from the last event it
    // printed, nothing missed, nothing twice.
    relay.restart().unwrap();
    relay.cli_ok(&["send", "after the restart"]);
    wait_for("after the restart", &printed, &mut text);
    assert_eq!(text.matches("while someone follows").count(), 1, "{text}");
    wait_for("the broker is back", &said, &mut notes);
}

/// A child process killed on drop, so a failing test leaves nothing running.
struct Follower(std::process::Child);

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_error_quotes_at_most_the_start_of_a_huge_input() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let http = relay.http();
    // 100 KB in a body; a path holds less (hyper refuses a URI over 64 KB).
    let huge = "a".repeat(100_000);
    let long = "a".repeat(60_000);
    // (what, status, code, the size of the input the message quotes (0: none of ours),
    // answer)
    type Case = (&'static str, u16, &'static str, usize, (u16, Value));
    let cases: Vec<Case> = vec![
        (
            "unknown agent",
            404,
            "unknown_agent",
            60_000,
            http.get(&format!("/v1/agents/{long}")).await,
        ),
        (
            "invalid agent name",
            400,
            "invalid_request",
            100_000,
            http.post(
                "/v1/agents",
                &json!({"name": huge, "harness": "codex_app_server", "cwd": "/tmp"}),
            )
            .await,
        ),
        (
            "unknown harness (the JSON parser's own message)",
            400,
            "invalid_request",
            0,
            http.post(
                "/v1/agents",
                &json!({"name": "a1", "harness": huge, "cwd": "/tmp"}),
            )
            .await,
        ),
        (
            "unknown flight",
            404,
            "unknown_flight",
            60_000,
            http.get(&format!("/v1/flights/{long}")).await,
        ),
        (
            "steer of an unknown flight",
            404,
            "unknown_flight",
            60_000,
            http.post(&format!("/v1/flights/{long}/steer"), &json!({"text": "x"}))
                .await,
        ),
        (
            "unknown approval",
            404,
            "unknown_approval",
            60_000,
            http.post(
                &format!("/v1/approvals/{long}"),
                &json!({"decision": "accept"}),
            )
            .await,
        ),
        (
            "unknown conversation",
            404,
            "unknown_conversation",
            60_000,
            http.get(&format!("/v1/conversations/{long}/messages")).await,
        ),
        (
            "invalid conversation id",
            400,
            "invalid_request",
            100_000,
            http.post("/v1/conversations", &json!({"id": huge, "kind": "channel"}))
                .await,
        ),
        (
            "unknown reply_to",
            404,
            "unknown_message",
            100_000,
            http.post(
                "/v1/messages",
                &json!({"conversation": "channel.shared", "author": "me", "body": "x", "reply_to": huge}),
            )
            .await,
        ),
        (
            "unknown approval state",
            400,
            "invalid_request",
            60_000,
            http.get(&format!("/v1/approvals?state={long}")).await,
        ),
    ];
    for (what, status, code, quoted, (got_status, body)) in cases {
        let text = body.to_string();
        let start: String = text.chars().take(300).collect();
        assert_eq!(got_status, status, "{what}: {start}");
        assert_eq!(body["error"]["code"], code, "{what}: {start}");
        assert!(
            text.len() < 2048,
            "{what}: a {}-byte error: {start}",
            text.len()
        );
        let message = body["error"]["message"].as_str().unwrap();
        if quoted > 0 {
            assert!(
                message.contains(&format!("\"{}\"…({quoted} bytes)", "a".repeat(100))),
                "{what}: {message}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_garbage_resume_position_on_the_event_stream_is_refused_not_replayed_from_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let http = relay.http();
    for body in ["one", "two"] {
        let (code, b) = http
            .post(
                "/v1/messages",
                &json!({"conversation": "channel.shared", "author": "me", "body": body}),
            )
            .await;
        assert_eq!(code, 200, "{b}");
    }
    let last_seq = http.get("/v1/status").await.1["last_seq"].as_u64().unwrap();
    assert!(last_seq >= 2);
    let client = reqwest::Client::new();
    let stream = |query: &str, last_event_id: Option<&str>| {
        let mut req = client
            .get(format!("{}/v1/events/stream{query}", relay.api.url))
            .bearer_auth(&relay.api.token);
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        req.send()
    };
    let too_big = "9".repeat(30);
    let refused: Vec<(&str, &str, Option<&str>, &str)> = vec![
        ("a word", "", Some("abc"), "Last-Event-ID"),
        ("a negative seq", "", Some("-1"), "Last-Event-ID"),
        ("a seq past u64", "", Some(&too_big), "Last-Event-ID"),
        (
            "a garbage header beside a good after",
            "?after=1",
            Some("x1"),
            "Last-Event-ID",
        ),
        ("a garbage after", "?after=abc", None, "after"),
        ("an empty after", "?after=", None, "after"),
    ];
    for (what, query, header, names) in refused {
        let resp = stream(query, header).await.unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{what}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_request", "{what}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{what}: {message}");
    }

    // A good one resumes right after it: the first event is the next one, not seq 1.
    let mut resp = stream("", Some(&(last_seq - 1).to_string())).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = resp.chunk().await.unwrap().expect("the stream ended");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let first_id = text
        .lines()
        .find_map(|l| l.strip_prefix("id:"))
        .map(|id| id.trim().parse::<u64>().unwrap());
    assert_eq!(first_id, Some(last_seq), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_limit_is_answered_413_and_never_reset() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &["--max-message-bytes", "1024"],
        &[],
    )
    .unwrap();
    let http = relay.http();
    let seq0 = http.get("/v1/status").await.1["last_seq"].as_u64().unwrap();
    // Over the HTTP body limit (the message limit + 64 KB) by a little and by a lot: the
    // larger one outgrows the socket buffers, so the client is still sending when the
    // broker decides; the broker reads it to its end before it answers.
    for size in [200_000, 3_000_000] {
        for attempt in 0..20 {
            let body =
                json!({"conversation": "channel.shared", "author": "me", "body": "x".repeat(size)});
            let answer = http
                .try_request(
                    reqwest::Method::POST,
                    "/v1/messages",
                    Some(body.to_string().into_bytes()),
                )
                .await;
            let (status, body) =
                answer.unwrap_or_else(|e| panic!("{size} bytes, attempt {attempt}: {e:?}"));
            assert_eq!(status, 413, "{size} bytes: {body}");
            assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
        }
    }
    // The same without a declared length (chunked).
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..48).map(|_| Ok(vec![b'x'; 64 * 1024])).collect();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/messages", relay.api.url))
        .bearer_auth(&relay.api.token)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    assert_eq!(
        http.get("/v1/status").await.1["last_seq"].as_u64().unwrap(),
        seq0,
        "nothing was written"
    );
}

/// How long a test waits for the broker to close a connection before it fails (it
/// never waits that long when the broker does its job).
const GUARD: std::time::Duration = std::time::Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_never_finishes_its_request_head_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &["--header-timeout-ms", "300"],
        &[],
    )
    .unwrap();
    let addr = relay.api.url.trim_start_matches("http://").to_string();
    // A live stream, open before and during all that follows: only request heads are
    // timed, so it is not cut.
    let mut events = reqwest::Client::new()
        .get(format!("{}/v1/events/stream", relay.api.url))
        .bearer_auth(&relay.api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status().as_u16(), 200);

    let partial_heads = [
        "",
        "GET /v1/status HTTP/1.1\r\n",
        "POST /v1/messages HTTP/1.1\r\nhost: relay\r\nauthorization: Bearer x\r\ncontent-le",
    ];
    for head in partial_heads {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(GUARD, conn.read_to_end(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("the broker kept {head:?} open"));
        // The broker closed it: the read reached the end of the stream.
        assert!(read.is_ok(), "{head:?}: {read:?}");
        assert!(
            !String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 2"),
            "{head:?} was answered as a request"
        );
    }

    // The stream is still live: a message posted now arrives on it.
    let (code, body) = relay
        .http()
        .post(
            "/v1/messages",
            &json!({"conversation": "channel.shared", "author": "me", "body": "after the timeouts"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let mut text = String::new();
    while !text.contains("after the timeouts") {
        let chunk = tokio::time::timeout(GUARD, events.chunk())
            .await
            .expect("the stream went quiet")
            .unwrap()
            .expect("the stream ended");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_over_the_cap_are_answered_overloaded_until_one_closes() {
    use tokio::io::AsyncReadExt;
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &["--max-connections", "1", "--header-timeout-ms", "600000"],
        &[("RELAY_RESERVED_CONNECTIONS", "1")],
    )
    .unwrap();
    let addr = relay.api.url.trim_start_matches("http://").to_string();
    // Two live streams hold both places, the general one and the operator's reserve (a
    // connection that sends nothing would give its place to a newer one).
    let stream = || {
        reqwest::Client::new()
            .get(format!("{}/v1/events/stream", relay.api.url))
            .bearer_auth(&relay.api.token)
            .send()
    };
    let first = stream().await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    let second = stream().await.unwrap();
    assert_eq!(second.status().as_u16(), 200);
    // A third, once it has sent its request (a connection takes a slot with its head).
    let mut third = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!("GET /v1/status HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut third, head.as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(GUARD, third.read_to_end(&mut answer))
        .await
        .expect("the connection over the cap was held open")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 429 "), "{answer}");
    let (_, body) = answer.split_once("\r\n\r\n").unwrap();
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");

    // Once one closes, requests are served again.
    drop(first);
    let http = relay.http();
    wait_until("a request to be served again", GUARD, || async {
        match http
            .try_request(reqwest::Method::GET, "/v1/status", None)
            .await
        {
            Ok((200, _)) => Ok(()),
            // Refused while the broker has not yet seen the first one close.
            Ok((429, _)) => Err("429".to_string()),
            Err(e) => Err(e.to_string()),
            Ok(other) => panic!("{other:?}"),
        }
    })
    .await;
}

#[test]
fn a_data_dir_made_by_someone_else_is_made_private_and_planted_files_are_not_followed() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
    // What another local user could plant in a world-writable dir before the start.
    let elsewhere = tmp.path().join("attacker-readable");
    std::fs::write(&elsewhere, "").unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, data.join("api.json.tmp")).unwrap();

    // A symlink in the data dir is refused outright, naming it; nothing is written
    // through it.
    let e = RelayProcess::start(&data)
        .err()
        .expect("a data dir holding a symlink was accepted");
    assert!(
        format!("{e:#}").contains("api.json.tmp is a symlink"),
        "{e:#}"
    );
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "");
    std::fs::remove_file(data.join("api.json.tmp")).unwrap();
    // A planted regular file is not reused either.
    std::fs::write(data.join("api.json.tmp"), "").unwrap();
    std::fs::set_permissions(
        data.join("api.json.tmp"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();

    let relay = RelayProcess::start(&data).unwrap();
    assert_eq!(std::fs::metadata(&data).unwrap().mode() & 0o777, 0o700);
    let api = std::fs::symlink_metadata(data.join("api.json")).unwrap();
    assert!(api.is_file(), "api.json is a regular file, not a link");
    assert_eq!(api.mode() & 0o777, 0o600);
    assert_eq!(
        std::fs::read_to_string(&elsewhere).unwrap(),
        "",
        "the token was written through the planted link"
    );
    assert!(!relay.api.token.is_empty());
}
