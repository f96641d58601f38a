//! Snapshot, then follow, end to end: a real `relay up` on a real nats-server, a real
//! Codex agent streaming a long reply from the mock model, and ten watchers joining at
//! random moments (after the k-th delta observed, k random) over the three ways to watch:
//! `relay watch --flight ID --json` processes, `GET /v1/watch` (SSE) and the NATS
//! snapshot request caught up from the flight stream. Once the flight has ended, each
//! must hold exactly the flight's stored updates: what its snapshot had, then what it
//! followed, without a gap or a duplicate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use futures::StreamExt;
use prost::Message as _;
use rand::Rng;
use relay_mock_model::Reply;
use relay_protocol::convert;
use relay_protocol::domain::{Flight, FlightChange, FlightUpdate};
use relay_protocol::event::{Event, EventBody};
use relay_protocol::pb;
use relay_protocol::watch::{Snapshot, SnapshotReply, View};
use relay_tests::agents::{script, state, Env};
use relay_tests::nats::NatsServer;
use serde_json::json;
use tokio::io::AsyncBufReadExt;

/// Chunks of the long reply, and the pause between two (the stream lasts ~3 s).
const CHUNKS: usize = 200;
const CHUNK_PAUSE: Duration = Duration::from_millis(15);

/// The way a watcher watches.
#[derive(Debug, Clone, Copy)]
enum Via {
    Cli,
    Sse,
    Nats,
}

/// What a watcher ends with: its snapshot's updates, then the ones it followed (with
/// the global seq each came with), and whether it joined before the flight ended.
/// Updates are compared in their protobuf form (what NATS carries; without the flight
/// record each carries there), and those that came as JSON also as they are.
#[derive(Debug)]
struct Watched {
    via: Via,
    k: usize,
    seq: u64,
    joined_live: bool,
    snapshot: Vec<FlightUpdate>,
    followed: Vec<(u64, pb::FlightUpdate)>,
    /// What came as JSON (everything but a NATS watcher's followed updates).
    json: Option<Vec<FlightUpdate>>,
}

/// A flight's updates from a snapshot and the events that follow it, as SSE and
/// `relay watch --json` give them: the snapshot first, then events.
#[derive(Default)]
struct Fold {
    snapshot: Option<Snapshot>,
    followed: Vec<(u64, FlightUpdate)>,
    /// Followed over NATS, in protobuf.
    followed_pb: Vec<(u64, pb::FlightUpdate)>,
}

impl Fold {
    fn take(&mut self, kind: &str, data: &str) {
        if kind == "snapshot" {
            assert!(self.snapshot.is_none(), "a second snapshot: {data}");
            self.snapshot = Some(serde_json::from_str(data).unwrap());
            return;
        }
        assert!(
            self.snapshot.is_some(),
            "an event before the snapshot: {data}"
        );
        let event: Event = serde_json::from_str(data).unwrap();
        match event.body {
            EventBody::FlightUpdated { update, .. } => self.followed.push((event.seq, update)),
            other => panic!("a flight's watch sent {}", other.type_name()),
        }
    }

    fn finish(self, via: Via, k: usize) -> Watched {
        let snapshot = self.snapshot.expect("a snapshot");
        let View::Flight(v) = snapshot.view else {
            panic!("not a flight's snapshot")
        };
        let json = match via {
            Via::Nats => None,
            _ => Some(
                v.updates
                    .iter()
                    .cloned()
                    .chain(self.followed.iter().map(|(_, u)| u.clone()))
                    .collect(),
            ),
        };
        let followed = match via {
            Via::Nats => self.followed_pb,
            _ => self
                .followed
                .iter()
                .map(|(seq, u)| (*seq, to_pb(u, &v.flight)))
                .collect(),
        };
        Watched {
            via,
            k,
            seq: snapshot.seq,
            joined_live: !v.flight.state.is_terminal(),
            snapshot: v.updates,
            followed,
            json,
        }
    }
}

async fn watch_cli(env: &Env, id: &str, k: usize) -> Watched {
    let mut child = tokio::process::Command::new(&env.relay.bin)
        .args(["watch", "--flight", id, "--json"])
        .env("RELAY_DATA_DIR", &env.relay.data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut fold = Fold::default();
    while let Some(line) = lines.next_line().await.unwrap() {
        let kind = if fold.snapshot.is_none() {
            "snapshot"
        } else {
            "event"
        };
        fold.take(kind, &line);
    }
    let status = child.wait().await.unwrap();
    assert!(
        status.success(),
        "relay watch ended {status} on a completed flight"
    );
    fold.finish(Via::Cli, k)
}

async fn watch_sse(env: &Env, id: &str, k: usize) -> Watched {
    let mut fold = Fold::default();
    env.client()
        .sse(
            &["v1", "watch"],
            &[("flight", id.to_string())],
            |kind, data| {
                fold.take(kind, data);
                true
            },
        )
        .await
        .unwrap();
    fold.finish(Via::Sse, k)
}

/// As a NATS client would: the snapshot request, then an ordered consumer on the stream
/// from the sequence the reply gives, dropping what the snapshot already holds
/// (`Relay-Seq` <= its seq), until the update that ends the flight.
async fn watch_nats(nats: &async_nats::Client, id: &str, k: usize) -> Watched {
    let reply = nats
        .request(
            "relay.v1.cmd.snapshot",
            json!({ "flight": id }).to_string().into(),
        )
        .await
        .unwrap();
    let headers = reply.headers.clone().unwrap();
    assert_eq!(
        headers.get("Relay-Type").unwrap().as_str(),
        "relay.v1.SnapshotReply+json"
    );
    let reply: SnapshotReply = serde_json::from_slice(&reply.payload)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&reply.payload)));
    let mut fold = Fold {
        snapshot: Some(reply.snapshot.clone()),
        ..Fold::default()
    };
    let ended = matches!(&reply.snapshot.view, View::Flight(v) if v.flight.state.is_terminal());
    if !ended {
        let catch_up = reply.catch_up;
        let js = async_nats::jetstream::new(nats.clone());
        let stream = js
            .get_stream(
                catch_up
                    .stream
                    .as_deref()
                    .expect("a stream to catch up from"),
            )
            .await
            .unwrap();
        let consumer = stream
            .create_consumer(OrderedConfig {
                filter_subject: catch_up.subject,
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: catch_up.start_sequence.expect("a start sequence"),
                },
                ..Default::default()
            })
            .await
            .unwrap();
        let mut msgs = consumer.messages().await.unwrap();
        loop {
            let m = tokio::time::timeout(Duration::from_secs(60), msgs.next())
                .await
                .expect("the flight's next update on the stream")
                .unwrap()
                .unwrap();
            let seq = relay_seq(&m.headers);
            if seq <= reply.snapshot.seq {
                continue;
            }
            let u = pb::FlightUpdate::decode(m.payload.as_ref()).unwrap();
            let terminal = u.flight_after.as_ref().is_some_and(|f| {
                pb::FlightState::try_from(f.state).is_ok_and(|s| {
                    matches!(
                        s,
                        pb::FlightState::Completed
                            | pb::FlightState::Failed
                            | pb::FlightState::Cancelled
                    )
                })
            });
            fold.followed_pb.push((seq, strip(u)));
            if terminal {
                break;
            }
        }
    }
    fold.finish(Via::Nats, k)
}

/// The global event seq a published message carries (`Relay-Seq`).
fn relay_seq(headers: &Option<async_nats::HeaderMap>) -> u64 {
    let h = headers.as_ref().expect("headers");
    h.get("Relay-Seq").unwrap().as_str().parse().unwrap()
}

/// A protobuf update without the flight record it carries (a watcher compares updates).
fn strip(u: pb::FlightUpdate) -> pb::FlightUpdate {
    pb::FlightUpdate {
        flight_after: None,
        ..u
    }
}

/// An update in the protobuf form NATS carries, as [`strip`] leaves it.
fn to_pb(u: &FlightUpdate, flight: &Flight) -> pb::FlightUpdate {
    strip(convert::update_to_pb(u, flight))
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_watchers_joining_a_streaming_flight_at_random_moments_each_hold_every_update_once() {
    let nats = NatsServer::start().unwrap();
    let env = Env::start_with(&["--nats", &nats.url()]).await;
    env.mock.set_handler(|req| {
        if req
            .last_user_text()
            .is_some_and(|t| t.starts_with("stream:"))
        {
            Reply::slow_chunks((0..CHUNKS).map(|i| format!("w{i} ")), CHUNK_PAUSE)
        } else {
            script(req)
        }
    });
    env.add_agent("codex-1", &[]);
    let client = async_nats::connect(nats.url()).await.unwrap();

    let id = env.ask_no_wait("codex-1", "stream: a long reply");
    // The observer: counts the flight's deltas as they stream (over its own SSE), so
    // the watchers join after the k-th one, whatever the pace.
    let (deltas, mut observed) = tokio::sync::watch::channel((0usize, false));
    let observer = {
        let client = env.client();
        let id = id.clone();
        tokio::spawn(async move {
            let mut n = 0;
            client
                .sse(&["v1", "flights", &id, "stream"], &[], |_, data| {
                    let u: FlightUpdate = serde_json::from_str(data).unwrap();
                    if matches!(u.change, FlightChange::Delta { .. }) {
                        n += 1;
                        deltas.send_replace((n, false));
                    }
                    true
                })
                .await
                .unwrap();
            deltas.send_replace((n, true));
        })
    };
    let mut rng = rand::rng();
    let vias = [
        Via::Cli,
        Via::Sse,
        Via::Nats,
        Via::Cli,
        Via::Sse,
        Via::Nats,
        Via::Cli,
        Via::Sse,
        Via::Nats,
        Via::Cli,
    ];
    let mut joins: Vec<(usize, Via)> = vias
        .iter()
        .map(|via| (rng.random_range(1..CHUNKS * 3 / 4), *via))
        .collect();
    joins.sort_by_key(|(k, _)| *k);
    let env = std::sync::Arc::new(env);
    let mut watchers = Vec::new();
    for (k, via) in joins.clone() {
        // After the k-th delta, or at the end if fewer came (merged deltas).
        observed
            .wait_for(|(n, done)| *n >= k || *done)
            .await
            .unwrap();
        let (env, client, id) = (env.clone(), client.clone(), id.clone());
        watchers.push(tokio::spawn(async move {
            match via {
                Via::Cli => watch_cli(&env, &id, k).await,
                Via::Sse => watch_sse(&env, &id, k).await,
                Via::Nats => watch_nats(&client, &id, k).await,
            }
        }));
    }
    let flight = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    observer.await.unwrap();
    let flight: Flight = serde_json::from_value(flight).unwrap();
    let stored: Vec<FlightUpdate> = serde_json::from_value(env.updates(&id).await.into()).unwrap();
    let deltas = stored
        .iter()
        .filter(|u| matches!(u.change, FlightChange::Delta { .. }))
        .count();
    assert!(deltas >= CHUNKS / 4, "only {deltas} delta updates");

    let mut live = 0;
    for w in watchers {
        let w = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("the watcher ends with the flight")
            .unwrap();
        let seqs: Vec<u64> = w.followed.iter().map(|(s, _)| *s).collect();
        assert!(
            seqs.windows(2).all(|p| p[0] < p[1]) && seqs.first().is_none_or(|s| *s > w.seq),
            "{:?} (k = {}): event seqs {seqs:?} after a snapshot at {}",
            w.via,
            w.k,
            w.seq
        );
        let held: Vec<pb::FlightUpdate> = w
            .snapshot
            .iter()
            .map(|u| to_pb(u, &flight))
            .chain(w.followed.iter().map(|(_, u)| u.clone()))
            .collect();
        assert_eq!(
            held.iter().map(|u| u.seq).collect::<Vec<_>>(),
            (1..=stored.len() as u64).collect::<Vec<_>>(),
            "{:?} joined after delta {}: snapshot at {} with {} updates, then {} followed",
            w.via,
            w.k,
            w.seq,
            w.snapshot.len(),
            w.followed.len()
        );
        let expected: Vec<pb::FlightUpdate> = stored.iter().map(|u| to_pb(u, &flight)).collect();
        assert_eq!(held, expected, "{:?} joined after delta {}", w.via, w.k);
        if let Some(json) = &w.json {
            assert_eq!(*json, stored, "{:?} joined after delta {}", w.via, w.k);
        }
        if w.joined_live && !w.snapshot.is_empty() && !w.followed.is_empty() {
            live += 1;
        }
    }
    assert!(
        live >= 1,
        "no watcher joined mid-stream (joins after deltas {:?}; {deltas} delta updates)",
        joins.iter().map(|(k, _)| k).collect::<Vec<_>>()
    );
}

/// The NATS snapshot of a conversation (whose messages no stream keeps: a client
/// subscribes first, then asks) and of an agent, and the typed errors of a bad request
/// over NATS and HTTP.
#[tokio::test(flavor = "multi_thread")]
async fn nats_snapshots_of_a_conversation_and_an_agent_say_where_to_follow_them() {
    let nats = NatsServer::start().unwrap();
    let env = Env::start_with(&["--nats", &nats.url()]).await;
    env.add_agent("codex-1", &[]);
    let client = async_nats::connect(nats.url()).await.unwrap();
    let ask = |body: serde_json::Value| {
        let client = client.clone();
        async move {
            let reply = client
                .request("relay.v1.cmd.snapshot", body.to_string().into())
                .await
                .unwrap();
            serde_json::from_slice::<serde_json::Value>(&reply.payload).unwrap()
        }
    };
    let post = |n: usize| env.relay.cli_ok(&["send", &format!("m{n}")]);

    let mut sub = client
        .subscribe("relay.v1.conversation.channel.shared")
        .await
        .unwrap();
    client.flush().await.unwrap();
    for n in 0..3 {
        post(n);
    }
    let reply: SnapshotReply =
        serde_json::from_value(ask(json!({"conversation": "channel.shared", "limit": 2})).await)
            .unwrap();
    for n in 3..5 {
        post(n);
    }
    assert_eq!(
        reply.catch_up.subject,
        "relay.v1.conversation.channel.shared"
    );
    assert_eq!(
        (reply.catch_up.stream, reply.catch_up.start_sequence),
        (None, None)
    );
    let View::Conversation(v) = &reply.snapshot.view else {
        panic!("{:?}", reply.snapshot)
    };
    let mut bodies: Vec<String> = v.messages.iter().map(|m| m.body.to_string()).collect();
    assert_eq!(bodies, ["m1", "m2"]);
    // Followed: what the subscription got past the snapshot's seq.
    while bodies.len() < 4 {
        let m = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .unwrap()
            .unwrap();
        let seq = relay_seq(&m.headers);
        if seq > reply.snapshot.seq {
            bodies.push(pb::Message::decode(m.payload.as_ref()).unwrap().body);
        }
    }
    assert_eq!(bodies, ["m1", "m2", "m3", "m4"]);

    let reply: SnapshotReply =
        serde_json::from_value(ask(json!({"agent": "codex-1"})).await).unwrap();
    assert_eq!(reply.catch_up.subject, "relay.v1.flight.codex-1.*");
    assert_eq!(reply.catch_up.stream.as_deref(), Some("RELAY_FLIGHTS"));
    assert!(reply.catch_up.start_sequence.is_some_and(|s| s >= 1));
    assert!(
        matches!(&reply.snapshot.view, View::Agent(v) if v.agent.spec.name == "codex-1" && v.flights.is_empty())
    );

    for (body, code) in [
        (json!({"flight": "flt_nope"}), "unknown_flight"),
        (
            json!({"agent": "a", "conversation": "c"}),
            "invalid_request",
        ),
        (json!({"flihgt": "x"}), "invalid_request"),
    ] {
        assert_eq!(ask(body.clone()).await["error"]["code"], code, "{body}");
    }
    let (status, body) = env.relay.http().get("/v1/watch?agent=a&flight=b").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("invalid_request"))
    );
    let (status, body) = env.relay.http().get("/v1/watch?agent=nobody").await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("unknown_agent"))
    );
}
