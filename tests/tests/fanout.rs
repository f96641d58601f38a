//! One stream of committed events, many live subscribers at once: 32 `/v1/events/stream` SSE
//! clients, 4 fleet watchers, and NATS subscribers (flight updates as protobuf and as
//! JSON, conversations' messages), while two flights stream deltas from many HTTP
//! clients and messages are posted (one too large to be kept in memory for
//! subscribers: it reaches them read back from the log). Every SSE client gets exactly
//! the log's events, each framed as axum frames `serde_json` of the event; every watcher
//! the fleet's; every NATS subscriber each update's protobuf and `{update, flight}` JSON
//! and each message's protobuf: all byte for byte, in order, gap-free. Against an older
//! `relay` (`RELAY_BIN`), the same test shows the wire did not change.
//!
//! Then it measures: the broker's CPU time per event with those subscribers connected
//! and with none (printed: a measurement, not a check of time).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use prost::Message as _;
use relay_protocol::bus::{subjects, SEQ_HEADER};
use relay_protocol::convert;
use relay_protocol::event::{Event, EventBody};
use relay_protocol::watch::Scope;
use relay_tests::agents::{state, Env};
use relay_tests::nats::NatsServer;
use relay_tests::wait_until;
use serde_json::json;

const SSE_CLIENTS: usize = 32;
const WATCHERS: usize = 4;
/// Subscribers of each NATS subject pattern.
const NATS_SUBSCRIBERS: usize = 4;

/// The bytes an SSE client received so far.
type Received = Arc<Mutex<Vec<u8>>>;

/// An SSE stream at `path`, its bytes collected as they come.
async fn sse(env: &Env, path: &str) -> (tokio::task::JoinHandle<()>, Received) {
    let mut resp = reqwest::Client::new()
        .get(format!("{}{path}", env.relay.api.url))
        .bearer_auth(&env.relay.api.token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    let got = Received::default();
    let into = got.clone();
    let task = tokio::spawn(async move {
        while let Ok(Some(chunk)) = resp.chunk().await {
            into.lock().unwrap().extend_from_slice(&chunk);
        }
    });
    (task, got)
}

/// The frames of an SSE body, each with its blank line; keep-alive comments left out.
fn frames(body: &[u8]) -> Vec<Vec<u8>> {
    let text = std::str::from_utf8(body).unwrap();
    text.split_inclusive("\n\n")
        .filter(|f| f.ends_with("\n\n") && *f != ":\n\n")
        .map(|f| f.as_bytes().to_vec())
        .collect()
}

/// An event as `/v1/events` frames it: its seq, its type, serde_json of it.
fn frame(e: &Event) -> Vec<u8> {
    format!(
        "id: {}\nevent: {}\ndata: {}\n\n",
        e.seq,
        e.body.type_name(),
        serde_json::to_string(e).unwrap()
    )
    .into_bytes()
}

/// A NATS message as the test collects it: its event's seq, subject and payload.
type Got = (u64, String, Vec<u8>);

/// A NATS subscriber of `subject`, collecting what it gets (a plain subscriber may get a
/// re-published update twice: dropped by its seq).
async fn nats_sub(client: &async_nats::Client, subject: &'static str) -> Arc<Mutex<Vec<Got>>> {
    let mut sub = client.subscribe(subject).await.unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let into = got.clone();
    tokio::spawn(async move {
        let mut last = 0;
        while let Some(m) = sub.next().await {
            let seq: u64 = m
                .headers
                .as_ref()
                .and_then(|h| h.get(SEQ_HEADER))
                .map(|v| v.as_str().parse().unwrap())
                .unwrap();
            if seq <= last {
                continue;
            }
            last = seq;
            into.lock()
                .unwrap()
                .push((seq, m.subject.to_string(), m.payload.to_vec()));
        }
    });
    got
}

/// What `got` holds of the events after `after`: subject and payload.
fn after(got: &Mutex<Vec<Got>>, after: u64) -> Vec<(String, Vec<u8>)> {
    got.lock()
        .unwrap()
        .iter()
        .filter(|(seq, ..)| *seq > after)
        .map(|(_, subject, payload)| (subject.clone(), payload.clone()))
        .collect()
}

async fn last_seq(env: &Env) -> u64 {
    env.relay.http().get("/v1/status").await.1["last_seq"]
        .as_u64()
        .unwrap()
}

/// Every event after `after`, from the log.
async fn log_after(env: &Env, after: u64) -> Vec<Event> {
    let (code, body) = env
        .relay
        .http()
        .get(&format!("/v1/events?after={after}&limit=10000"))
        .await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_value(body).unwrap()
}

/// A flight of a tmux pane that never answers: it runs until the test ends it.
async fn open_flight(env: &Env, agent: &str) -> String {
    let id = env.ask_no_wait(agent, "stream here");
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    id
}

/// The broker's CPU time so far (user + system), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // Fields 14 and 15 of proc(5), counted from the state (field 3).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// `each` deltas from each of 8 clients into `id`; the events they made.
async fn stream(env: &Env, id: &str, each: u32) -> u64 {
    let before = last_seq(env).await;
    env.stream_deltas(id, 8, each, |c, n| format!("<{c}.{n}>"))
        .await;
    last_seq(env).await - before
}

#[tokio::test(flavor = "multi_thread")]
async fn every_subscriber_gets_the_same_bytes_of_each_event() {
    let nats = NatsServer::start().unwrap();
    let env = Env::start_with(&["--nats", nats.url().as_str()]).await;
    env.add_tmux("pane-1", "sh", &[]);
    env.add_tmux("pane-2", "sh", &[]);
    // Their turns, ended over HTTP here, are not ended in their panes: the measuring
    // runs have panes of their own.
    env.add_tmux("pane-3", "sh", &[]);
    env.add_tmux("pane-4", "sh", &[]);
    let flights = [
        open_flight(&env, "pane-1").await,
        open_flight(&env, "pane-2").await,
    ];
    // Subscribed before the log's end is read: the flights' panes may still be making
    // events, and one made between that read and a subscription would never reach it.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut nats_subs = Vec::new();
    for _ in 0..NATS_SUBSCRIBERS {
        for subject in [
            subjects::FLIGHTS_ALL,
            "relay.v1.json.flight.>",
            "relay.v1.conversation.>",
        ] {
            nats_subs.push((subject, nats_sub(&client, subject).await));
        }
    }
    client.flush().await.unwrap();
    let start = last_seq(&env).await;
    let mut clients = Vec::new();
    for _ in 0..SSE_CLIENTS {
        clients.push(sse(&env, &format!("/v1/events/stream?after={start}")).await);
    }
    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        watchers.push(sse(&env, "/v1/watch?fleet=true").await);
    }

    // Two flights streaming from 8 clients each, messages posted meanwhile; one over
    // the size kept in memory for subscribers (16 KiB), then both flights end.
    let streams = futures::future::join_all(
        flights
            .iter()
            .map(|id| env.stream_deltas(id, 8, 40, |c, n| format!("<{c}.{n}> \"é\"\n"))),
    );
    let messages = async {
        for n in 0..30 {
            let body = if n == 15 {
                "large ".repeat(4000)
            } else {
                format!("message {n}")
            };
            let (code, resp) = env
                .relay
                .http()
                .post(
                    "/v1/messages",
                    &json!({"conversation": "channel.shared", "author": "me", "body": body}),
                )
                .await;
            assert_eq!(code, 200, "{resp}");
        }
    };
    futures::join!(streams, messages);
    for id in &flights {
        let end = json!({"kind": "state", "to": "completed", "output": "done"});
        let (code, body) = env
            .relay
            .http()
            .post(&format!("/v1/flights/{id}/updates"), &end)
            .await;
        assert_eq!(code, 200, "{body}");
    }

    // The runtime may still record what follows the flights' ends (their panes' agents
    // going idle): subscribers may be further on than this read of the log, so each is
    // compared over the log's length, from its start.
    let last = last_seq(&env).await;
    let log = log_after(&env, start).await;
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (start + 1..start + 1 + log.len() as u64).collect::<Vec<_>>(),
        "the log is whole"
    );
    assert!(log.len() as u64 >= last - start);
    assert!(
        log.iter()
            .any(|e| serde_json::to_vec(e).unwrap().len() > 16 * 1024),
        "one event is over the size subscribers keep in memory"
    );

    // Every SSE client: the log's events, framed, nothing else.
    let expected: Vec<Vec<u8>> = log.iter().map(frame).collect();
    for (i, (_, got)) in clients.iter().enumerate() {
        wait_until(
            format!("SSE client {i} got every event"),
            Duration::from_secs(30),
            || async {
                let got = frames(&got.lock().unwrap());
                if got.len() >= expected.len() {
                    Ok(())
                } else {
                    Err(format!(
                        "{} of {} frames, the last: {:?}",
                        got.len(),
                        expected.len(),
                        got.last()
                            .map(|f| String::from_utf8_lossy(&f[..f.len().min(80)]).to_string())
                    ))
                }
            },
        )
        .await;
        assert!(
            frames(&got.lock().unwrap())[..expected.len()] == expected[..],
            "SSE client {i}: not the log's events, byte for byte"
        );
    }
    // Every watcher: a snapshot, then the fleet's events after it.
    for (i, (_, got)) in watchers.iter().enumerate() {
        let want = |got: &[Vec<u8>]| {
            let snapshot = std::str::from_utf8(&got[0]).unwrap();
            let at: u64 = snapshot
                .strip_prefix("id: ")
                .and_then(|s| s.split('\n').next())
                .unwrap()
                .parse()
                .unwrap();
            assert!(snapshot.contains("\nevent: snapshot\n"), "{snapshot}");
            log.iter()
                .filter(|e| e.seq > at && relay_broker::watch::matches(&Scope::Fleet, e))
                .map(frame)
                .collect::<Vec<_>>()
        };
        wait_until(
            format!("watcher {i} got every fleet event"),
            Duration::from_secs(30),
            || async {
                let got = frames(&got.lock().unwrap());
                (!got.is_empty() && got.len() > want(&got).len()).then_some(())
            },
        )
        .await;
        let got = frames(&got.lock().unwrap());
        let want = want(&got);
        assert!(!want.is_empty());
        assert!(
            got[1..=want.len()] == want[..],
            "watcher {i}: not the fleet's events"
        );
    }
    // Every NATS subscriber: each event's encodings, once each, in order.
    let mut updates = Vec::new();
    let mut update_json = Vec::new();
    let mut messages = Vec::new();
    for e in &log {
        match &e.body {
            EventBody::FlightUpdated { update, flight } => {
                updates.push((
                    subjects::flight(&update.agent, &update.flight),
                    convert::update_to_pb(update, flight).encode_to_vec(),
                ));
                update_json.push((
                    subjects::flight_json(&update.agent, &update.flight),
                    // `{"update": ..., "flight": ...}`, each record's fields in order.
                    format!(
                        r#"{{"update":{},"flight":{}}}"#,
                        serde_json::to_string(update).unwrap(),
                        serde_json::to_string(flight).unwrap()
                    )
                    .into_bytes(),
                ));
            }
            EventBody::MessagePosted { message, .. } => messages.push((
                subjects::conversation(&message.conversation),
                convert::message_to_pb(message).encode_to_vec(),
            )),
            _ => {}
        }
    }
    assert!(updates.len() > 2 && messages.len() >= 30);
    for (subject, got) in &nats_subs {
        let want = match *subject {
            subjects::FLIGHTS_ALL => &updates,
            "relay.v1.json.flight.>" => &update_json,
            _ => &messages,
        };
        wait_until(
            format!("a NATS subscriber of {subject} got everything"),
            Duration::from_secs(30),
            || async {
                // Counted without the copies `after` makes, at every look.
                let n = got
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(seq, ..)| *seq > start)
                    .count();
                if n >= want.len() {
                    Ok(())
                } else {
                    // What would tell a publisher's gap from a subscriber the server
                    // dropped: the server's word on slow consumers.
                    let slow: Vec<String> = nats
                        .log_text()
                        .lines()
                        .filter(|l| l.contains("Slow Consumer"))
                        .map(str::to_string)
                        .collect();
                    Err(format!("{n} of {}; nats-server: {slow:?}", want.len()))
                }
            },
        )
        .await;
        assert!(
            after(got, start)[..want.len()] == want[..],
            "a NATS subscriber of {subject}: not each event's encoding"
        );
    }

    // The cost: the broker's CPU per event with every subscriber above connected, then
    // with none (each streaming run makes its own flight's events).
    let pid = env.relay.pid();
    let id = open_flight(&env, "pane-3").await;
    let before = cpu_ticks(pid);
    let events = stream(&env, &id, 100).await;
    let with = cpu_ticks(pid) - before;
    for (task, _) in clients.iter().chain(&watchers) {
        task.abort();
    }
    drop(nats_subs);
    let id = open_flight(&env, "pane-4").await;
    let before = cpu_ticks(pid);
    let events_alone = stream(&env, &id, 100).await;
    let alone = cpu_ticks(pid) - before;
    let tick_us = 1e6 / 100.0;
    eprintln!(
        "fan-out cost ({}): {} subscribers (SSE + watch): {events} events, {:.1} us CPU/event; none: {events_alone} events, {:.1} us CPU/event",
        env.relay.bin.display(),
        SSE_CLIENTS + WATCHERS,
        with as f64 * tick_us / events as f64,
        alone as f64 * tick_us / events_alone as f64,
    );
    assert!(events > 0 && events_alone > 0);
}
