//! Backpressure instead of a hang: every bounded queue answers `overloaded` at once when
//! full, and never holds a request or loses one it accepted.
//!
//! - The command queue: when nothing can be committed and it is full, HTTP clients get
//!   429 and NATS clients an `overloaded` error reply at once, `GET /v1/status` still
//!   answers, and once storage moves again every accepted command completes.
//! - The NATS requests in progress: past [`MAX_INFLIGHT_REQUESTS`], a request is
//!   answered `overloaded` at once, even with room in the command queue.
//! - An agent's queue of turns: past [`AGENT_QUEUE_CAPACITY`] turns waiting behind a
//!   running one, a new invocation is refused `overloaded` at once, naming the full
//!   queue, and writes no flight (from many clients at once); those queued run.
//!
//! The first two run the broker in this test's process (`relay_broker::server::run`),
//! so the test can hold the process's storage thread: the one place every commit goes
//! through. They take [`STORAGE`] first, since `cargo test` runs the tests of this file
//! in one process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_broker::broker::BrokerConfig;
use relay_broker::nats::{NatsAuth, NatsConfig, MAX_INFLIGHT_REQUESTS};
use relay_broker::server::ServerConfig;
use relay_infra::storage::Storage;
use relay_protocol::api::{ApiInfo, API_FILE};
use relay_runtime::AGENT_QUEUE_CAPACITY;
use relay_tests::agents::state;
use relay_tests::load::add_instant_agents;
use relay_tests::nats::NatsServer;
use relay_tests::{wait_until, RelayProcess};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// A deadline against a hang: a refusal must come without any commit, so waiting
/// this long for one means the request waited instead of being refused.
const AT_ONCE: Duration = Duration::from_secs(60);
const QUEUE: usize = 8;
const CLIENTS: usize = 48;

/// Held by each test that holds the process's storage thread.
static STORAGE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A broker in this process, on `nats`, with a command queue of `command_queue`.
struct InProcess {
    api: ApiInfo,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<Result<(), relay_broker::server::ServeError>>,
    _tmp: tempfile::TempDir,
}

impl InProcess {
    async fn start(nats: &NatsServer, command_queue: usize) -> InProcess {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(relay_broker::server::run(
            ServerConfig {
                data_dir: data.clone(),
                listen: "127.0.0.1:0".parse().unwrap(),
                broker: BrokerConfig {
                    command_queue,
                    ..BrokerConfig::default()
                },
                nats: Some(NatsConfig::new(nats.url(), NatsAuth::None)),
                turn_idle_timeout: None,
                turn_stall_timeout: None,
                http: Default::default(),
                relay_program: None,
                notify_command: None,
                banner: true,
            },
            shutdown.clone(),
        ));
        let file = data.join(API_FILE);
        let api = wait_until("the broker to write api.json", AT_ONCE, || async {
            let text = std::fs::read_to_string(&file).ok()?;
            serde_json::from_str::<ApiInfo>(&text).ok()
        })
        .await;
        InProcess {
            api,
            shutdown,
            server,
            _tmp: tmp,
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(AT_ONCE, self.server)
            .await
            .expect("the broker did not stop")
            .unwrap()
            .unwrap();
    }
}

/// A post to `channel.shared` over NATS, in JSON.
async fn post_over_nats(
    client: async_nats::Client,
    body: String,
) -> Result<async_nats::Message, async_nats::RequestError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    let payload = json!({ "conversation": "channel.shared", "author": "nats", "body": body });
    client
        .request_with_headers("relay.v1.cmd.post", headers, payload.to_string().into())
        .await
}

/// The error code of a JSON reply, if it is an error.
fn error_code(reply: &async_nats::Message) -> Option<String> {
    let body: Value = serde_json::from_slice(&reply.payload).unwrap();
    body["error"]["code"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_command_queue_is_answered_overloaded_at_once_over_http_and_nats() {
    let _alone = STORAGE.lock().await;
    let nats = NatsServer::start().unwrap();
    let broker = InProcess::start(&nats, QUEUE).await;
    let api = broker.api.clone();
    let http = reqwest::Client::new();
    let nats_client = async_nats::connect(nats.url()).await.unwrap();
    let nats_post = |body: &str| post_over_nats(nats_client.clone(), body.to_string());
    // The bus answers before the test holds storage (its subscriptions are up).
    wait_until("the bus to answer", AT_ONCE, || nats_post("ready?")).await;
    let post = |body: &str| {
        let (http, api) = (http.clone(), api.clone());
        let body = json!({ "conversation": "channel.shared", "author": "load", "body": body });
        async move {
            http.post(format!("{}/v1/messages", api.url))
                .bearer_auth(&api.token)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(post("before").await, 200);

    // Hold the storage thread: from here nothing commits until it is released.
    let paused = Storage::global().pause().await;

    let mut posts = tokio::task::JoinSet::new();
    for i in 0..CLIENTS {
        posts.spawn(post(&format!("message {i}")));
    }
    // At most one batch and one full queue wait; every other request is refused
    // while storage is still held.
    let refused_at_least = CLIENTS - 2 * (QUEUE + 1);
    let mut refused = 0;
    while refused < refused_at_least {
        let status = tokio::time::timeout(AT_ONCE, posts.join_next())
            .await
            .expect("a request waited for a full queue instead of being refused")
            .unwrap()
            .unwrap();
        assert_eq!(status, 429, "nothing can be accepted while storage is held");
        refused += 1;
    }
    // NATS: refused at once too, with a typed error.
    let reply = tokio::time::timeout(AT_ONCE, nats_post("hi"))
        .await
        .expect("the bus waited instead of refusing")
        .unwrap();
    assert_eq!(error_code(&reply).as_deref(), Some("overloaded"));
    // Reads still answer.
    let status = tokio::time::timeout(
        AT_ONCE,
        http.get(format!("{}/v1/status", api.url))
            .bearer_auth(&api.token)
            .send(),
    )
    .await
    .expect("/v1/status hung while storage was held")
    .unwrap();
    assert_eq!(status.status().as_u16(), 200);

    // Storage moves again: everything still waiting is accepted.
    tokio::time::timeout(AT_ONCE, paused.resume())
        .await
        .expect("the storage thread did not resume");
    let mut accepted = 0;
    while let Some(status) = tokio::time::timeout(AT_ONCE, posts.join_next())
        .await
        .expect("a queued request was never answered")
    {
        match status.unwrap() {
            200 => accepted += 1,
            429 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(accepted >= 1, "the queued requests were accepted");
    assert_eq!(accepted + refused, CLIENTS);
    assert_eq!(post("after").await, 200);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_requests_past_the_in_flight_limit_are_answered_overloaded_at_once() {
    let _alone = STORAGE.lock().await;
    let nats = NatsServer::start().unwrap();
    // Room in the command queue for every request: only the in-flight limit refuses.
    let broker = InProcess::start(&nats, 2 * MAX_INFLIGHT_REQUESTS).await;
    let client = async_nats::ConnectOptions::new()
        .request_timeout(Some(AT_ONCE))
        .connect(nats.url())
        .await
        .unwrap();
    wait_until("the bus to answer", AT_ONCE, || {
        post_over_nats(client.clone(), "ready?".into())
    })
    .await;

    // Hold the storage thread: every request the broker takes waits for its commit.
    let paused = Storage::global().pause().await;
    const OVER: usize = 16;
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..MAX_INFLIGHT_REQUESTS + OVER {
        requests.spawn(post_over_nats(client.clone(), format!("message {i}")));
    }
    // The requests past the limit are answered while storage is still held.
    for _ in 0..OVER {
        let reply = tokio::time::timeout(AT_ONCE, requests.join_next())
            .await
            .expect("a request over the limit waited instead of being refused")
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(error_code(&reply).as_deref(), Some("overloaded"));
    }
    // The others are all in progress, each waiting for its commit.
    assert_eq!(requests.len(), MAX_INFLIGHT_REQUESTS);

    // Storage moves again: every request in progress is accepted.
    tokio::time::timeout(AT_ONCE, paused.resume())
        .await
        .expect("the storage thread did not resume");
    let mut accepted = 0;
    while let Some(reply) = tokio::time::timeout(AT_ONCE, requests.join_next())
        .await
        .expect("a request in progress was never answered")
    {
        let reply = reply.unwrap().unwrap();
        assert_eq!(error_code(&reply), None, "{:?}", reply.payload);
        accepted += 1;
    }
    assert_eq!(accepted, MAX_INFLIGHT_REQUESTS);
    // And the bus serves as before.
    let reply = post_over_nats(client.clone(), "after".into())
        .await
        .unwrap();
    assert_eq!(error_code(&reply), None);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ask_past_a_full_agent_queue_is_refused_at_once_without_a_flight_and_the_queued_ones_wait(
) {
    let tmp = tempfile::tempdir().unwrap();
    let mut relay = RelayProcess::start(&tmp.path().join("data")).unwrap();
    let agent = add_instant_agents(&relay, 1, None).remove(0);
    let http = relay.http();
    let invoke = |task: &str| {
        let body = json!({ "target": agent, "task": task });
        let http = &http;
        async move {
            let (code, body) = http.post("/v1/invocations", &body).await;
            assert_eq!(code, 200, "{body}");
            body["flight"]["id"].as_str().unwrap().to_string()
        }
    };
    let flight = |id: String| {
        let http = &http;
        async move { http.get(&format!("/v1/flights/{id}")).await.1 }
    };
    // A turn that streams one delta a second for days holds the agent.
    let running = invoke("stream:1000000:1:1").await;
    wait_until("the first turn to run", AT_ONCE, || async {
        let f = flight(running.clone()).await;
        if state(&f) == "running" {
            Ok(())
        } else {
            Err(f)
        }
    })
    .await;
    let mut queued = Vec::new();
    for i in 0..AGENT_QUEUE_CAPACITY {
        queued.push(invoke(&format!("queued {i}")).await);
    }
    // One more, from many clients at once: refused `overloaded` at once, and no flight
    // of them is written.
    let (_, before) = http.get("/v1/status").await;
    let mut over = Vec::new();
    for i in 0..32 {
        let http = http.clone();
        let body = json!({ "target": agent, "task": format!("one too many {i}") });
        over.push(tokio::spawn(async move {
            http.post("/v1/invocations", &body).await
        }));
    }
    for o in over {
        let (code, body) = tokio::time::timeout(AT_ONCE, o)
            .await
            .expect("a refusal waited")
            .unwrap();
        assert_eq!(
            (code, &body["error"]["code"]),
            (429, &json!("overloaded")),
            "{body}"
        );
        let reason = body["error"]["message"].as_str().unwrap();
        assert!(
            reason.contains(&format!("full queue of {AGENT_QUEUE_CAPACITY}")),
            "{reason}"
        );
    }
    let (_, after) = http.get("/v1/status").await;
    assert_eq!(after["flights"], before["flights"], "{before} {after}");
    // `/metrics` counts each refusal, and shows the queue as it stands.
    let (_, metrics) = http.get("/metrics").await;
    let metrics = metrics.as_str().unwrap();
    for line in [
        "relay_overloaded_total{what=\"agent_queue\"} 32".to_string(),
        format!("relay_queue_depth{{queue=\"agent\",agent=\"{agent}\"}} {AGENT_QUEUE_CAPACITY}"),
        format!("relay_flights{{state=\"queued\"}} {AGENT_QUEUE_CAPACITY}"),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    // The queued ones still wait their turn behind the running one.
    let (_, live) = http.get("/v1/flights?live=true&limit=1000").await;
    let mut states: Vec<(String, String)> = live
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["id"].as_str().unwrap().into(), state(f).into()))
        .collect();
    states.sort();
    let mut expected: Vec<(String, String)> = queued
        .iter()
        .map(|id| (id.clone(), "queued".into()))
        .chain([(running.clone(), "running".into())])
        .collect();
    expected.sort();
    assert_eq!(states, expected);
    assert!(relay.terminate().unwrap().success());
}
