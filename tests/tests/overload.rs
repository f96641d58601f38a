//! Backpressure instead of a hang: when nothing can be committed and the command queue
//! is full, HTTP clients get 429 and NATS clients an `overloaded` error reply at once,
//! `GET /v1/status` still answers, and once storage moves again every accepted command
//! completes.
//!
//! The broker runs in this test's process (`relay_broker::server::run`), so the test can
//! hold the process's storage thread: the one place every commit goes through.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_broker::broker::BrokerConfig;
use relay_broker::nats::{NatsAuth, NatsConfig};
use relay_broker::server::{ApiInfo, ServerConfig, API_FILE};
use relay_runtime::storage::Storage;
use relay_tests::nats::NatsServer;
use relay_tests::wait_until;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A deadline against a hang: a refusal must come without any commit, so waiting
/// this long for one means the request waited instead of being refused.
const AT_ONCE: Duration = Duration::from_secs(60);
const QUEUE: usize = 8;
const CLIENTS: usize = 48;

async fn wait_api(data: &std::path::Path) -> ApiInfo {
    let file = data.join(API_FILE);
    wait_until("the broker to write api.json", AT_ONCE, || async {
        let text = std::fs::read_to_string(&file).ok()?;
        serde_json::from_str::<ApiInfo>(&text).ok()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_command_queue_is_answered_overloaded_at_once_over_http_and_nats() {
    let nats = NatsServer::start().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(relay_broker::server::run(
        ServerConfig {
            data_dir: data.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            broker: BrokerConfig {
                command_queue: QUEUE,
                ..BrokerConfig::default()
            },
            nats: Some(NatsConfig::new(nats.url(), NatsAuth::None)),
            turn_idle_timeout: None,
            http: Default::default(),
        },
        shutdown.clone(),
    ));
    let api = wait_api(&data).await;
    let http = reqwest::Client::new();
    let nats_client = async_nats::connect(nats.url()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    let nats_post = |body: &str| {
        nats_client.request_with_headers(
            "relay.v1.cmd.post",
            headers.clone(),
            json!({ "conversation": "channel.shared", "author": "nats", "body": body })
                .to_string()
                .into(),
        )
    };
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
    let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
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

    shutdown.cancel();
    tokio::time::timeout(AT_ONCE, server)
        .await
        .expect("the broker did not stop")
        .unwrap()
        .unwrap();
}
