//! A flight's answer is stored once: its agent message's text, the completion's output,
//! the flight's output and the reply's body after it are references in the log to the
//! first of them, and the flight's record in sled reads its output from the log
//! (`store::shared`), while everything read back (events with their JSON,
//! updates, messages, replays, a rebuild) is whole and as it was published, from many
//! flights at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use relay_broker::broker::Live;
use relay_broker::store::{
    encode, Store, FLIGHT_OUTPUT_IN_LOG, SHARED_FILE_VERSION, SHARED_VERSION, T,
};
use relay_broker::{Broker, BrokerConfig};
use relay_protocol::domain::shared::LONG_TEXT;
use relay_protocol::domain::{
    AgentSpec, FlightChange, FlightState, Harness, InvokeRequest, ItemKind, ItemPhase, SharedStr,
};
use relay_protocol::event::EventBody;
use tokio_util::sync::CancellationToken;

async fn broker(store: Store, agents: usize) -> Broker {
    let (b, _) = Broker::start(store, BrokerConfig::default(), CancellationToken::new())
        .await
        .unwrap();
    for i in 0..agents {
        b.register_agent(AgentSpec::new(
            format!("a{i}"),
            Harness::CodexAppServer,
            "/w",
        ))
        .await
        .unwrap();
    }
    b
}

/// An answer of a few KB, its own for each `n`, with what JSON escapes.
fn answer(n: usize) -> String {
    format!("answer {n}: \"quoted\", a\ttab, a ünïcödé line\n").repeat(60)
}

/// Runs a flight of `agent` that streams, says its answer as an agent message and
/// completes with it. Returns the flight's id.
async fn answered(b: &Broker, agent: &str, text: &str) -> String {
    let f = b
        .invoke(InvokeRequest::new(agent, "go"))
        .await
        .unwrap()
        .flight
        .id;
    let item = |phase, text: Option<&str>| FlightChange::Item {
        item_id: "m1".into(),
        item_kind: ItemKind::AgentMessage,
        phase,
        text: text.map(Into::into),
        exit_code: None,
    };
    for change in [
        FlightChange::State {
            to: FlightState::Running,
            reason: None,
            output: None,
        },
        item(ItemPhase::Started, None),
        FlightChange::Delta { text: text.into() },
        item(ItemPhase::Completed, Some(text)),
        FlightChange::State {
            to: FlightState::Completed,
            reason: None,
            output: Some(text.into()),
        },
    ] {
        b.update_flight(&f, change).await.unwrap();
    }
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_stored_once_and_read_back_whole_from_many_flights_at_once() {
    const FLIGHTS: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let b = broker(Store::open(dir.path()).unwrap(), FLIGHTS).await;
    let mut live = b.subscribe();
    let (before, first) = (b.store().log().end(), b.store().last_seq().unwrap());
    let flights = futures::future::join_all((0..FLIGHTS).map(|i| {
        let b = &b;
        async move { answered(b, &format!("a{i}"), &answer(i)).await }
    }))
    .await;
    let last = b.store().last_seq().unwrap();

    // What subscribers got live, event by event...
    let mut published = Vec::new();
    while published.len() < (last - first) as usize {
        let next = tokio::time::timeout(std::time::Duration::from_secs(60), live.recv());
        match next.await.expect("every event is published").unwrap() {
            Live::Event(p) => published.push((p.event.clone(), p.json().clone())),
            Live::InLog(held) => panic!("event {} not kept live", held.seq()),
        }
    }
    // ...is what the log gives back: the same events, the same JSON, byte for byte.
    let read = b.store().published_after(first, 100_000).unwrap();
    assert_eq!(read.len(), published.len());
    for (r, (event, json)) in read.iter().zip(&published) {
        assert_eq!(&r.event, event);
        assert_eq!(r.json(), json, "event {}", event.seq);
    }

    let mut shared = 0;
    let mut stored = Vec::new();
    let mut pos = before;
    while let Some(record) = b.store().log().read(pos).unwrap() {
        shared += usize::from(record.payload.first() == Some(&SHARED_VERSION));
        stored.extend_from_slice(&record.payload);
        pos = record.next();
    }
    // Per flight: the reply's body, and the completion's output and flight's output.
    assert_eq!(shared, 2 * FLIGHTS);
    // Each answer is in the log twice (streamed as a delta, said as an item), not five
    // times (the reply, the completion and its flight as well).
    for i in 0..FLIGHTS {
        let json = serde_json::to_string(&answer(i)).unwrap();
        let escaped = &json.as_bytes()[1..json.len() - 1];
        assert_eq!(
            memchr::memmem::find_iter(&stored, escaped).count(),
            2,
            "flight {i}"
        );
    }

    for (i, f) in flights.iter().enumerate() {
        // The flight's record in sled keeps no copy: its output is read from the log.
        let record = b.store().tree(T::Flights).get(f).unwrap().unwrap();
        assert_eq!(record[0], FLIGHT_OUTPUT_IN_LOG);
        assert!(record.len() < answer(i).len(), "{} B", record.len());
        let flight = b.store().flight(f).unwrap().unwrap();
        assert_eq!(flight.output.as_deref(), Some(answer(i).as_str()));
        let updates = b.store().flight_updates(f, 0).unwrap();
        match &updates.last().unwrap().change {
            FlightChange::State { output, .. } => {
                assert_eq!(output.as_deref(), Some(answer(i).as_str()))
            }
            other => panic!("{other:?}"),
        }
        let reply = flight.reply_message.unwrap();
        let reply = read
            .iter()
            .find_map(|p| match &p.body {
                EventBody::MessagePosted { message, .. } if message.id == reply => {
                    Some(message.clone())
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(reply.body, answer(i));
        let messages = b.store().messages(&reply.conversation, 1000).unwrap();
        assert!(messages
            .iter()
            .any(|m| m.id == reply.id && m.body == answer(i)));
    }
    // A rebuild from the log (references filled in) makes the same projections.
    assert!(b.store().verify().unwrap().is_consistent());
}

/// An event too large to keep in the live buffer, however small its record in the log
/// (the size that counts is its wire JSON's), is held for the subscribers following live
/// instead, and what they take from memory is what the log gives back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_large_for_the_buffer_is_held_for_subscribers_as_the_log_has_it() {
    let b = broker(Store::temporary().unwrap(), 1).await;
    let first = b.store().last_seq().unwrap();
    let mut live = b.subscribe();
    let text = "x".repeat(relay_broker::broker::LIVE_EVENT_MAX);
    let f = answered(&b, "a0", &text).await;
    let last = b.store().last_seq().unwrap();
    let mut in_log = Vec::new();
    for _ in first..last {
        let next = tokio::time::timeout(std::time::Duration::from_secs(60), live.recv());
        match next.await.expect("every event is published").unwrap() {
            Live::Event(p) => assert!(p.json().len() <= text.len(), "event {} kept live", p.seq),
            // Held for this subscriber (the only one) until it takes it.
            Live::InLog(held) => in_log.push(held.take().expect("held for its subscriber")),
        }
    }
    // The delta, the agent message, the reply and the completion: each holds the answer.
    assert_eq!(in_log.len(), 4, "{in_log:?}");
    for held in in_log {
        let seq = held.seq;
        let event = b.store().event(seq).unwrap().unwrap();
        let json = serde_json::to_string(&event).unwrap();
        assert!(json.contains(&text), "event {seq} read back whole");
        // What the subscriber got from memory is what the log gives back, byte for byte.
        assert_eq!(held.json()[..], *json.as_bytes(), "event {seq}");
    }
    let flight = b.store().flight(&f).unwrap().unwrap();
    assert_eq!(flight.output.as_deref(), Some(text.as_str()));
}

/// A large event is held for a subscriber that never takes it only for a while: then it
/// is let go of (the buffer keeps no long text), and that subscriber reads the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_event_nobody_takes_is_let_go_of() {
    let b = broker(Store::temporary().unwrap(), 1).await;
    let first = b.store().last_seq().unwrap();
    let mut live = b.subscribe();
    let text = "y".repeat(relay_broker::broker::LIVE_EVENT_MAX * 2);
    answered(&b, "a0", &text).await;
    let last = b.store().last_seq().unwrap();
    let mut held = Vec::new();
    for _ in first..last {
        if let Live::InLog(h) = live.recv().await.unwrap() {
            held.push(h);
        }
    }
    assert!(!held.is_empty());
    for h in &held {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while h.is_held() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "event {} still held",
                h.seq()
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(h.take().is_none(), "let go of: read from the log");
    }
}

/// A store made before answers were stored once (a completed flight's record holding a
/// copy of its output) has the record of today after its next open, and a rebuild
/// agrees with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_before_reads_its_outputs_from_the_log_after_its_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let stop = CancellationToken::new();
    let (b, writer) = Broker::start(
        Store::open(dir.path()).unwrap(),
        BrokerConfig::default(),
        stop.clone(),
    )
    .await
    .unwrap();
    b.register_agent(AgentSpec::new("a0", Harness::CodexAppServer, "/w"))
        .await
        .unwrap();
    let f = answered(&b, "a0", &answer(0)).await;
    stop.cancel();
    drop(b);
    writer.await.unwrap();
    let reopen = || support::reopen(dir.path());
    {
        let store = reopen().await;
        let flight = store.flight(&f).unwrap().unwrap();
        store
            .tree(T::Flights)
            .insert(f.as_bytes(), encode(&flight).unwrap())
            .unwrap();
        store
            .tree(T::Meta)
            .remove(b"flight_outputs_in_log")
            .unwrap();
        assert!(!store.verify().unwrap().is_consistent());
        store.durable().db().flush().unwrap();
    }
    let store = reopen().await;
    let record = store.tree(T::Flights).get(&f).unwrap().unwrap();
    assert_eq!(record[0], FLIGHT_OUTPUT_IN_LOG);
    assert!(store.verify().unwrap().is_consistent());
    let flight = store.flight(&f).unwrap().unwrap();
    assert_eq!(flight.output.as_deref(), Some(answer(0).as_str()));
    // Read as any type, the record has its output.
    let values: Vec<relay_protocol::domain::Flight> = store.values(T::Flights).unwrap();
    assert_eq!(values[0].output.as_deref(), Some(answer(0).as_str()));
}

/// A long answer written to the log's text files before it is reported (as the embedded
/// runtime does) is stored as a reference to its file, by the item, the reply and the
/// completion (stored version 6), never as its text; every reader gets it whole, and a
/// file gone is damage (typed), not an empty answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_answer_written_first_is_referred_to_in_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(Store::open(dir.path()).unwrap(), 1).await;
    let text = SharedStr::from(answer(0).repeat(1 + LONG_TEXT / answer(0).len()));
    let f = b
        .invoke(InvokeRequest::new("a0", "go"))
        .await
        .unwrap()
        .flight
        .id;
    let before = b.store().log().end();
    let file = b.store().log().texts().write(&f, &text).unwrap();
    let item = FlightChange::Item {
        item_id: "m1".into(),
        item_kind: ItemKind::AgentMessage,
        phase: ItemPhase::Completed,
        text: Some(text.clone()),
        exit_code: None,
    };
    let done = FlightChange::State {
        to: FlightState::Completed,
        reason: None,
        output: Some(text.clone()),
    };
    for change in [
        FlightChange::State {
            to: FlightState::Running,
            reason: None,
            output: None,
        },
        item,
        done,
    ] {
        b.update_flight(&f, change).await.unwrap();
    }
    let mut versions = Vec::new();
    let mut pos = before;
    while let Some(record) = b.store().log().read(pos).unwrap() {
        assert!(record.payload.len() < 4096, "{} B", record.payload.len());
        versions.push(record.payload[0]);
        pos = record.next();
    }
    // The item, the reply, the completion.
    let files = versions
        .iter()
        .filter(|v| **v == SHARED_FILE_VERSION)
        .count();
    assert_eq!(files, 3, "{versions:?}");
    let flight = b.store().flight(&f).unwrap().unwrap();
    assert_eq!(flight.output.as_ref(), Some(&text));
    let updates = b.store().flight_updates(&f, 0).unwrap();
    let texts: Vec<_> = updates
        .iter()
        .filter_map(|u| match &u.change {
            FlightChange::Item { text, .. } => text.clone(),
            FlightChange::State { output, .. } => output.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(texts, [text.clone(), text.clone()]);
    let reply = flight.reply_message.unwrap();
    let messages = b.store().messages(&flight.conversation, 10).unwrap();
    assert!(messages.iter().any(|m| m.id == reply && m.body == text));
    assert!(b.store().verify().unwrap().is_consistent());

    // Its file gone: reading the flight's updates is damage, said so.
    let path = dir.path().join("log").join("texts").join(&file.name);
    std::fs::remove_file(path).unwrap();
    let e = b.store().flight_updates(&f, 0).unwrap_err();
    assert!(
        matches!(&e, relay_broker::BrokerError::Corrupt(m) if m.contains(&file.name)),
        "{e:?}"
    );
}
