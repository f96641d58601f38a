//! Flight updates stored without their flight (`store::slim`). Over real sled files and
//! log segments, with many flights streaming at once (deltas, items, command output,
//! notes, usage, an item whose kind reads back as another, then their ends): most
//! updates are stored slim, no run of them is longer than `SLIM_RUN`, and every reader
//! gets back, byte for byte, the JSON that the live subscribers were sent: readers in
//! order (one from the start, several from other points at once), a reader of single
//! events in reverse order (no previous flight in memory), and all of them again after a
//! restart; a rebuild of the projections from the log writes the same ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::join_all;
use relay_broker::store::{Store, SLIM_RUN, SLIM_VERSION};
use relay_broker::Broker;
use relay_protocol::domain::{
    tail, FlightChange, FlightState, ItemKind, ItemPhase, TokenUsage, SUMMARY_CHARS,
};
use relay_protocol::event::EventBody;

const FLIGHTS: usize = 12;
/// Updates each flight streams between its start and its end: several runs of slim ones.
const UPDATES: usize = 3 * SLIM_RUN as usize + 7;

/// The update of each flight that is a long answer's item, and its text's length.
const LONG_AT: usize = 13;
const LONG: usize = 80 * 1024;

/// Update `k` of flight `i`: mostly deltas, with every other kind that may be slim.
fn change(i: usize, k: usize) -> FlightChange {
    let item = |phase| FlightChange::Item {
        item_id: format!("cmd-{k}"),
        item_kind: ItemKind::CommandExecution,
        phase,
        text: Some(format!("cargo test -p f{i}").into()),
        exit_code: None,
    };
    match k % 10 {
        // A long answer's item: stored whole, however it could fold (`slim::SLIM_MAX`).
        3 if k == LONG_AT => FlightChange::Item {
            item_id: format!("msg-{k}"),
            item_kind: ItemKind::AgentMessage,
            phase: ItemPhase::Completed,
            text: Some(format!("f{i} long é\n").repeat(LONG / 8).into()),
            exit_code: None,
        },
        3 => item(ItemPhase::Started),
        4 => FlightChange::CommandOutput {
            item_id: format!("cmd-{}", k - 1),
            text: format!("test result: ok. {k} passed\n"),
        },
        5 => FlightChange::Note {
            text: format!("Reconnecting... {k}/5 \"quoted\" \u{1b}[31m"),
            by: None,
        },
        6 => FlightChange::Usage(TokenUsage::new(100 * k as u64, 10 * k as u64)),
        // A kind under another kind's name: read back, it is that kind, which the fold
        // treats otherwise (so this update is stored whole).
        7 => FlightChange::Item {
            item_id: format!("r-{k}"),
            item_kind: ItemKind::Other("reasoning".into()),
            phase: ItemPhase::Started,
            text: Some("thinking".into()),
            exit_code: None,
        },
        _ => FlightChange::Delta {
            text: format!("f{i}.{k} é \"x\" "),
        },
    }
}

/// The JSON of every event as the live subscribers were sent it, by seq.
fn collect(b: &Broker) -> tokio::task::JoinHandle<HashMap<u64, bytes::Bytes>> {
    let mut feed = relay_broker::feed::follow(b.clone(), 0);
    tokio::spawn(async move {
        let mut got = HashMap::new();
        while let Some(p) = feed.recv().await {
            let p = p.unwrap();
            got.insert(p.seq, p.json().clone());
        }
        got
    })
}

/// Every event read back from the log in order from `after`, as JSON, checked against
/// what the subscribers were sent.
fn read_in_order(store: &Store, after: u64, sent: &HashMap<u64, bytes::Bytes>) -> usize {
    let read = store.published_after(after, usize::MAX).unwrap();
    for p in &read {
        assert_eq!(
            p.json(),
            &sent[&p.seq],
            "event {} read in order from {after}",
            p.seq
        );
    }
    read.len()
}

/// Flight updates by how they are stored: (slim, whole); and the longest run of slim
/// updates of one flight in a row.
fn stored_kinds(store: &Store) -> (usize, usize, u32) {
    let (mut slim, mut whole, mut longest) = (0, 0, 0);
    let mut runs: HashMap<String, u32> = HashMap::new();
    let log = store.log();
    log.scan(log.start().unwrap(), |record| {
        let event = store.event(record.seq).unwrap().unwrap();
        if let EventBody::FlightUpdated { flight, .. } = event.body {
            let run = runs.entry(flight.id).or_default();
            if record.payload.len() > LONG {
                assert_ne!(
                    record.payload.first(),
                    Some(&SLIM_VERSION),
                    "a long update is whole"
                );
            }
            if record.payload.first() == Some(&SLIM_VERSION) {
                slim += 1;
                *run += 1;
                longest = longest.max(*run);
            } else {
                whole += 1;
                *run = 0;
            }
        }
        Ok::<_, relay_broker::BrokerError>(true)
    })
    .unwrap();
    (slim, whole, longest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_stored_without_their_flight_read_back_byte_for_byte_by_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let (b, stop, writer) = support::start(Store::open(&path).unwrap()).await;
    let sent = collect(&b);
    let ids = support::one_flight_each(&b, FLIGHTS).await;
    // Every flight streams at once, each from its own task.
    join_all(ids.iter().enumerate().map(|(i, id)| {
        let b = b.clone();
        async move {
            let running = FlightChange::State {
                to: FlightState::Running,
                reason: None,
                output: None,
            };
            b.update_flight(id, running).await.unwrap();
            for k in 0..UPDATES {
                b.update_flight(id, change(i, k)).await.unwrap();
            }
            let done = FlightChange::State {
                to: FlightState::Completed,
                reason: None,
                output: Some(format!("done {i}").into()),
            };
            b.update_flight(id, done).await.unwrap();
        }
    }))
    .await;
    b.store().flush().await.unwrap();
    let last = b.store().last_seq().unwrap();
    stop.cancel();
    drop(b);
    writer.await.unwrap();
    let sent = sent.await.unwrap();
    assert_eq!(sent.len() as u64, last, "a subscriber got every event");

    let store = support::reopen(&path).await;
    let (slim, whole, longest) = stored_kinds(&store);
    assert!(
        slim >= FLIGHTS * UPDATES * 3 / 4,
        "{slim} slim, {whole} whole of {} updates",
        FLIGHTS * (UPDATES + 2)
    );
    assert!(longest <= SLIM_RUN, "{longest} slim updates in a row");
    // Read back after the restart: in order from the start, from several points at once
    // (each reader's previous flights in memory interleave), and one event at a time in
    // reverse order, each from the records before it.
    assert_eq!(read_in_order(&store, 0, &sent) as u64, last);
    let store = Arc::new(store);
    let readers: Vec<_> = (1..=4u64)
        .map(|r| {
            let (store, sent) = (store.clone(), sent.clone());
            std::thread::spawn(move || read_in_order(&store, last * r / 5, &sent))
        })
        .collect();
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    for seq in (1..=last).rev() {
        let event = store.event(seq).unwrap().unwrap();
        assert_eq!(
            serde_json::to_vec(&event).unwrap(),
            sent[&seq],
            "event {seq}"
        );
    }
    // What the flights ended as, from what they streamed.
    for (i, id) in ids.iter().enumerate() {
        let flight = store.flight(id).unwrap().unwrap();
        assert_eq!(flight.state, FlightState::Completed);
        assert_eq!(flight.update_seq, UPDATES as u64 + 2);
        let updates = store.flight_updates(id, 0).unwrap();
        assert_eq!(updates.len(), UPDATES + 2);
        for (k, u) in updates[1..=UPDATES].iter().enumerate() {
            assert_eq!(
                serde_json::to_value(&u.change).unwrap(),
                serde_json::to_value(change(i, k)).unwrap(),
                "{id} update {}",
                k + 2
            );
        }
        // The summary of the last streamed text: the deltas after the last other change.
        let last_other = (0..UPDATES)
            .rev()
            .find(|k| !matches!(k % 10, 0..=2 | 8..=9));
        let from = last_other.map_or(0, |k| k + 1);
        let text: String = (from..UPDATES)
            .map(|k| format!("f{i}.{k} é \"x\" "))
            .collect();
        let events = store.events_after(0, usize::MAX).unwrap();
        let streamed = events
            .iter()
            .find_map(|e| match &e.body {
                EventBody::FlightUpdated { update, flight }
                    if &update.flight == id && update.seq == UPDATES as u64 + 1 =>
                {
                    Some(flight.clone())
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(
            streamed.summary.as_deref(),
            Some(&*tail(&text, SUMMARY_CHARS))
        );
        let usage = streamed.usage.unwrap();
        let k = (0..UPDATES).rev().find(|k| k % 10 == 6).unwrap() as u64;
        assert_eq!((usage.input_tokens, usage.output_tokens), (100 * k, 10 * k));
    }
    let report = store.verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");
}
