//! The HTTP API's guards, against a real `relay up`:
//! - connection slots the operator keeps: half-sent request heads cannot hold the
//!   broker's slots, and a crowd of agent streams cannot take the slots kept for the
//!   operator's token;
//! - each agent's token holds a capped number of streams, answered `overloaded` past it,
//!   and a stream whose client stopped reading is closed;
//! - the CLI says an overload is one (retry, with the broker's `Retry-After`), never
//!   that the broker cannot be reached;
//! - `Host` and `Origin` must be the broker's own (DNS rebinding);
//! - an agent's token reads what it asked or was asked, not another agent's flights,
//!   approvals or direct conversations.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_broker::seal::AgentTokens;
use relay_tests::agents::{state, Env};
use relay_tests::load::add_instant_agents;
use relay_tests::{wait_until, RelayProcess};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A deadline against a hang (never reached when the broker does its job).
const GUARD: Duration = Duration::from_secs(60);

fn addr(relay: &RelayProcess) -> String {
    relay.api.url.trim_start_matches("http://").to_string()
}

fn agent_token(relay: &RelayProcess, agent: &str) -> String {
    AgentTokens::new(relay.api.token.as_bytes()).token(agent)
}

/// `relay` with `args` as the holder of `token` (RELAY_URL + RELAY_TOKEN).
fn cli_as(relay: &RelayProcess, token: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(&relay.bin)
        .args(args)
        .env("RELAY_URL", &relay.api.url)
        .env("RELAY_TOKEN", token)
        .env_remove("RELAY_DATA_DIR")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// A GET of `path` with `token`, its response (a stream stays open while it is held).
async fn open(relay: &RelayProcess, token: &str, path: &str) -> reqwest::Response {
    // A client of its own: each stream on its own connection.
    reqwest::Client::new()
        .get(format!("{}{path}", relay.api.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

/// A stream opened once a general slot is free: the CLI's connections just before it
/// (adding the agent, its token) are given back when the broker sees them close, a
/// race with this open on a loaded machine. Refused (429) until then, nothing else.
async fn open_once_free(relay: &RelayProcess, token: &str, path: &str) -> reqwest::Response {
    wait_until("a general slot to be free", GUARD, || async {
        let s = open(relay, token, path).await;
        match s.status().as_u16() {
            200 => Some(s),
            429 => None,
            other => panic!("{path}: {other}"),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn half_sent_request_heads_do_not_lock_the_operator_out() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        // Heads may take their time: only the slots' policy lets others in.
        &["--max-connections", "8", "--header-timeout-ms", "600000"],
        &[("RELAY_RESERVED_CONNECTIONS", "2")],
    )
    .unwrap();
    // A crowd of thirty times more connections than slots (more than the broker keeps
    // waiting for their heads, too), each stopped in the middle of its head; one the
    // broker closes is opened again, until the test ends.
    let half_open = |addr: String| async move {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = conn
            .write_all(b"GET /v1/status HTTP/1.1\r\nhost: 127.0.0.1\r\n")
            .await;
        let mut rest = Vec::new();
        let _ = conn.read_to_end(&mut rest).await;
    };
    let (closed, mut first_closed) = tokio::sync::mpsc::unbounded_channel();
    let mut crowd = tokio::task::JoinSet::new();
    for _ in 0..300 {
        let (addr, closed) = (addr(&relay), closed.clone());
        crowd.spawn(async move {
            loop {
                half_open(addr.clone()).await;
                let _ = closed.send(());
            }
        });
    }
    // The broker has pushed some out: every place is taken by the crowd by now.
    tokio::time::timeout(GUARD, first_closed.recv())
        .await
        .expect("the broker held every half-sent head");
    for poll in 0..10 {
        let out = relay.cli(&["status", "--json"]);
        assert!(
            out.status.success(),
            "poll {poll}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    crowd.abort_all();
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_streams_are_capped_and_the_operator_keeps_its_slots() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &["--max-connections", "4"],
        &[
            ("RELAY_STREAMS_PER_AGENT", "3"),
            ("RELAY_RESERVED_CONNECTIONS", "2"),
        ],
    )
    .unwrap();
    let agents = add_instant_agents(&relay, 2, None);
    let (a, b) = (
        agent_token(&relay, &agents[0]),
        agent_token(&relay, &agents[1]),
    );
    let watch_a = format!("/v1/watch?agent={}", agents[0]);
    let watch_b = format!("/v1/watch?agent={}", agents[1]);
    // Agent a holds its three streams.
    let mut streams = Vec::new();
    for _ in 0..3 {
        let s = open(&relay, &a, &watch_a).await;
        assert_eq!(s.status().as_u16(), 200);
        streams.push(s);
    }
    // A fourth is refused, typed, naming the cap.
    let over = open(&relay, &a, &watch_a).await;
    assert_eq!(over.status().as_u16(), 429);
    assert_eq!(over.headers()["retry-after"], "1");
    let body: Value = over.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("3 streams"), "{message}");

    // Agent b takes the last general slot, once the refused stream's connection is gone
    // (its client closes it after reading the answer: a race with this open); what b
    // asks next finds only the operator's.
    let s = wait_until(
        "b's stream gets the last general slot",
        Duration::from_secs(10),
        || async {
            let s = open(&relay, &b, &watch_b).await;
            (s.status().as_u16() == 200).then_some(s)
        },
    )
    .await;
    streams.push(s);
    let refused = open(&relay, &b, "/v1/status").await;
    assert_eq!(refused.status().as_u16(), 429);
    // Said by the CLI as an overload, with the broker's Retry-After; not unreachable.
    let out = cli_as(&relay, &b, &["status"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{said}");
    assert!(said.contains("is overloaded; retry in 1 s"), "{said}");
    assert!(!said.contains("cannot reach"), "{said}");

    // The operator still answers, and opens a stream.
    let out = relay.cli(&["status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = open(&relay, &relay.api.token, "/v1/events/stream").await;
    assert_eq!(events.status().as_u16(), 200);
    drop(events);
    // A stream given back is a place again.
    streams.remove(0);
    wait_until(
        "agent a's closed stream to be given back",
        GUARD,
        || async {
            let s = open(&relay, &a, &watch_a).await;
            (s.status().as_u16() == 200).then_some(s)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_anonymous_login_page_cannot_keep_the_operators_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        // Idle connections are not closed during the test: only the guard frees a slot.
        &["--max-connections", "2", "--header-timeout-ms", "600000"],
        &[("RELAY_RESERVED_CONNECTIONS", "1")],
    )
    .unwrap();
    let agents = add_instant_agents(&relay, 1, None);
    let token = agent_token(&relay, &agents[0]);
    let watch = format!("/v1/watch?agent={}", agents[0]);
    // An agent's streams hold every general slot.
    let mut streams = Vec::new();
    for _ in 0..2 {
        streams.push(open_once_free(&relay, &token, &watch).await);
    }
    // Anyone, without a token, takes the operator's slot with `GET /login` (no code):
    // the page answers, and the slot must not stay this client's (it would send the
    // same request again, and keep it for ever).
    let mut conn = tokio::net::TcpStream::connect(addr(&relay)).await.unwrap();
    let head = format!("GET /login HTTP/1.1\r\nhost: {}\r\n\r\n", addr(&relay));
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(GUARD, conn.read_to_end(&mut answer))
        .await
        .expect("the broker kept an anonymous login page's connection in the operator's reserve")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    // The operator gets in.
    wait_until("the operator's status to answer", GUARD, || async {
        relay
            .cli(&["status", "--json"])
            .status
            .success()
            .then_some(())
    })
    .await;
    drop(streams);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_head_that_is_not_one_yet_does_not_take_the_operators_slot() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        // Heads may take their time: only the slots' policy lets the operator in.
        &["--max-connections", "1", "--header-timeout-ms", "600000"],
        &[("RELAY_RESERVED_CONNECTIONS", "1")],
    )
    .unwrap();
    let agents = add_instant_agents(&relay, 1, None);
    let token = agent_token(&relay, &agents[0]);
    // An agent's stream holds the general slot.
    let stream = open_once_free(&relay, &token, &format!("/v1/watch?agent={}", agents[0])).await;
    // Empty lines before a request line (which HTTP skips), and a head that goes on
    // past what the broker reads before it gives a slot: neither is a whole head yet.
    let not_yet = [b"\r\n\r\n".to_vec(), {
        let mut long = b"GET /v1/status HTTP/1.1\r\nx-long: ".to_vec();
        long.resize(70 * 1024, b'a');
        long
    }];
    for bytes in not_yet {
        let mut conn = tokio::net::TcpStream::connect(addr(&relay)).await.unwrap();
        conn.write_all(&bytes).await.unwrap();
        for poll in 0..10 {
            let out = relay.cli(&["status", "--json"]);
            assert!(
                out.status.success(),
                "poll {poll} after {} bytes of a head: {}",
                bytes.len(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        drop(conn);
    }
    drop(stream);
}

#[tokio::test(flavor = "multi_thread")]
async fn streams_asked_at_once_are_held_up_to_the_cap_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &[],
        &[("RELAY_STREAMS_PER_AGENT", "3")],
    )
    .unwrap();
    let agents = add_instant_agents(&relay, 2, None);
    // Two agents ask for twelve streams each, all at once.
    let asks: Vec<(String, String)> = agents
        .iter()
        .flat_map(|name| {
            let token = agent_token(&relay, name);
            let path = format!("/v1/watch?agent={name}");
            (0..12).map(move |_| (token.clone(), path.clone()))
        })
        .collect();
    let opened =
        futures::future::join_all(asks.iter().map(|(token, path)| open(&relay, token, path))).await;
    for s in &opened {
        assert!(matches!(s.status().as_u16(), 200 | 429), "{}", s.status());
    }
    for name in &agents {
        let mine = opened
            .iter()
            .filter(|s| s.status().as_u16() == 200 && s.url().as_str().ends_with(name.as_str()))
            .count();
        assert_eq!(mine, 3, "{name} holds three streams, the cap");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_whose_client_stopped_reading_is_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start_with(
        &tmp.path().join("data"),
        &[],
        &[("RELAY_WRITE_STALL_TIMEOUT_MS", "1000")],
    )
    .unwrap();
    // A client that asks for every event and never reads one (a small receive buffer:
    // it fills sooner).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(addr(&relay).parse().unwrap()).await.unwrap();
    let head = format!(
        "GET /v1/events/stream HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\r\n",
        addr(&relay),
        relay.api.token
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let http = relay.http();
    let big = "x".repeat(200 * 1024);
    wait_until("the broker to close the stream nobody reads", GUARD, || {
        let (http, big, log) = (&http, &big, relay.log_text());
        async move {
            if log.contains("closed a connection whose client stopped reading") {
                return Some(());
            }
            let body = json!({"conversation": "channel.shared", "author": "me", "body": big});
            let (code, body) = http.post("/v1/messages", &body).await;
            assert_eq!(code, 200, "{body}");
            None
        }
    })
    .await;
    // Closed: reading now reaches its end (what was sent, then the close).
    let mut rest = Vec::new();
    let read = tokio::time::timeout(GUARD, conn.read_to_end(&mut rest))
        .await
        .expect("the stream was still open");
    let _ = read;
    // And the broker serves as before.
    assert_eq!(http.get("/v1/status").await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_host_or_origin_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let port = relay.api.url.rsplit(':').next().unwrap().to_string();
    let get = |host: String, origin: Option<String>| {
        let relay = &relay;
        async move {
            let mut conn = tokio::net::TcpStream::connect(addr(relay)).await.unwrap();
            let origin = origin
                .map(|o| format!("origin: {o}\r\n"))
                .unwrap_or_default();
            let head = format!(
                "GET /v1/status HTTP/1.1\r\nhost: {host}\r\n{origin}authorization: Bearer {}\r\nconnection: close\r\n\r\n",
                relay.api.token
            );
            conn.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            tokio::time::timeout(GUARD, conn.read_to_end(&mut answer))
                .await
                .unwrap()
                .unwrap();
            String::from_utf8_lossy(&answer).into_owned()
        }
    };
    // The broker's own names, without an Origin or with the same one (the dashboard's).
    for host in ["127.0.0.1", "localhost", "[::1]"] {
        let host = format!("{host}:{port}");
        for origin in [None, Some(format!("http://{host}"))] {
            let answer = get(host.clone(), origin.clone()).await;
            assert!(
                answer.starts_with("HTTP/1.1 200 "),
                "{host} {origin:?}: {answer}"
            );
        }
    }
    let here = format!("127.0.0.1:{port}");
    // A rebound name, another port, no Host; a page of another site, of another port,
    // a sandboxed one.
    for (host, origin, status, code) in [
        (format!("evil.example:{port}"), None, 400, "invalid_request"),
        ("127.0.0.1:1".to_string(), None, 400, "invalid_request"),
        ("".to_string(), None, 400, "invalid_request"),
        (
            here.clone(),
            Some("http://evil.example"),
            401,
            "unauthorized",
        ),
        (
            here.clone(),
            Some("http://127.0.0.1:1"),
            401,
            "unauthorized",
        ),
        (here.clone(), Some("null"), 401, "unauthorized"),
    ] {
        let answer = get(host.clone(), origin.map(str::to_string)).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{host} {origin:?}: {answer}"
        );
        let (_, body) = answer.split_once("\r\n\r\n").unwrap();
        let body: Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], code, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_token_reads_only_what_it_asked_or_was_asked() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    env.add_agent("codex-2", &[]);
    // The operator asks codex-1 for a command: it waits on its approval, in the direct
    // conversation of the operator and codex-1.
    let id = env
        .relay
        .cli_ok(&["ask", "codex-1", "--no-wait", "exec: echo scoped"])
        .trim()
        .to_string();
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let approval = env.approval_of(&id)["id"].as_str().unwrap().to_string();
    let flight = env.flight(&id).await;
    let dm = flight["conversation"].as_str().unwrap().to_string();
    assert!(dm.starts_with("direct."), "{dm}");

    let as_agent = |name: &str| {
        env.relay
            .http()
            .with_token(Some(&agent_token(&env.relay, name)))
    };
    let (one, two) = (as_agent("codex-1"), as_agent("codex-2"));
    let reads = [
        format!("/v1/flights/{id}"),
        format!("/v1/flights/{id}/updates"),
        format!("/v1/flights/{id}/tree"),
        format!("/v1/replay/flights/{id}"),
        format!("/v1/conversations/{dm}/messages"),
        format!("/v1/replay/conversations/{dm}"),
    ];
    for path in &reads {
        let (code, body) = one.get(path).await;
        assert_eq!(code, 200, "codex-1 reads its own {path}: {body}");
        let (code, body) = two.get(path).await;
        assert_eq!(code, 401, "codex-2 reads {path}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    }
    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect()
    };
    // Lists: codex-2 sees none of it.
    let (_, listed) = two.get("/v1/approvals?state=all").await;
    assert!(!ids(&listed).contains(&approval), "{listed}");
    let (_, listed) = one.get("/v1/approvals?state=all").await;
    assert!(ids(&listed).contains(&approval), "{listed}");
    let (_, listed) = two.get("/v1/flights").await;
    assert!(!ids(&listed).contains(&id), "{listed}");
    let (_, listed) = one.get("/v1/flights").await;
    assert!(ids(&listed).contains(&id), "{listed}");
    let (_, listed) = two.get("/v1/conversations").await;
    assert!(!ids(&listed).contains(&dm), "{listed}");
    assert!(
        ids(&listed).contains(&"channel.shared".to_string()),
        "{listed}"
    );
    // Streams: its flight, the log, another's watch.
    for path in [
        format!("/v1/flights/{id}/stream"),
        format!("/v1/watch?flight={id}"),
        "/v1/events".to_string(),
        "/v1/watch?agent=codex-1".to_string(),
    ] {
        let (code, body) = two.get(&path).await;
        assert_eq!(code, 401, "codex-2 reads {path}: {body}");
    }
    // The operator still reads everything.
    assert_eq!(
        env.relay.http().get(&format!("/v1/flights/{id}")).await.0,
        200
    );
    env.relay.cli_ok(&["approve", &approval, "decline"]);
}
