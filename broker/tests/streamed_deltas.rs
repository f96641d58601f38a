//! What sled writes for a streamed delta (or a live flight's item, session ids or
//! command output): not the flight's record, which is written for a change of state or
//! usage and at least every 32 of its updates (`store::heads`: the updates after it are
//! folded on when it is read), nor the event's position, which `event_pos` holds for one event in 16
//! (the others are found from it in the log). Over real sled files, from many flights
//! streaming at once and across a restart of the broker, every reader sees the flight as
//! the rules made it, the writer numbers the next update right, every event is found by
//! its seq, and a rebuild from the log writes the same projections.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;

use futures::future::join_all;
use relay_broker::store::{child_key, decode_flight_without_output, pair_value, Store, T};
use relay_broker::Broker;
use relay_protocol::domain::{
    tail, AgentSpec, Flight, FlightChange, FlightState, FlightUpdate, Harness, InvokeRequest,
    SUMMARY_CHARS,
};
use relay_protocol::event::EventBody;

const FLIGHTS: usize = 8;
/// Past the record written at update 64 (update 1 is `running`): the last 11 lag.
const BEFORE: usize = 74;
const AFTER: usize = 5;

fn state(to: FlightState, output: Option<&str>) -> FlightChange {
    FlightChange::State {
        to,
        reason: None,
        output: output.map(Into::into),
    }
}

fn text(flight: usize, k: usize) -> String {
    format!("f{flight}.{k} ")
}

/// Streams deltas `range` of each flight, all flights at once.
async fn stream(b: &Broker, ids: &[String], range: std::ops::Range<usize>) {
    join_all(ids.iter().enumerate().map(|(i, id)| {
        let range = range.clone();
        async move {
            for k in range {
                b.update_flight(id, FlightChange::Delta { text: text(i, k) })
                    .await
                    .unwrap();
            }
        }
    }))
    .await;
}

/// Each flight as the last `flight_updated` event of it carries it: what the rules made.
fn as_published(store: &Store) -> HashMap<String, Flight> {
    let mut last = HashMap::new();
    for event in store.events_after(0, usize::MAX).unwrap() {
        if let EventBody::FlightUpdated { flight, .. } = event.body {
            last.insert(flight.id.clone(), flight);
        }
    }
    last
}

/// The record as sled holds it.
fn record(store: &Store, id: &str) -> Flight {
    let v = store.tree(T::Flights).get(id.as_bytes()).unwrap().unwrap();
    decode_flight_without_output(&v).unwrap()
}

/// [`FLIGHTS`] flights, one per agent, each running (its update 1).
async fn running_flights(b: &Broker) -> Vec<String> {
    let ids = support::one_flight_each(b, FLIGHTS).await;
    for id in &ids {
        b.update_flight(id, state(FlightState::Running, None))
            .await
            .unwrap();
    }
    ids
}

/// A broker on a new store at `path` whose [`FLIGHTS`] flights streamed [`BEFORE`]
/// deltas each, all at once, flushed: the broker, its stop, its writer, the flights.
async fn streamed(
    path: &std::path::Path,
) -> (
    Broker,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
    Vec<String>,
) {
    let (b, stop, writer) = support::start(Store::open(path).unwrap()).await;
    let ids = running_flights(&b).await;
    stream(&b, &ids, 0..BEFORE).await;
    b.store().flush().await.unwrap();
    (b, stop, writer, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_flights_lagging_record_is_read_whole_by_all_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let (b, stop, writer, ids) = streamed(&path).await;
    let published = as_published(b.store());
    for (i, id) in ids.iter().enumerate() {
        let rules = &published[id];
        assert_eq!(rules.update_seq, 1 + BEFORE as u64);
        let all: String = (0..BEFORE).map(|k| text(i, k)).collect();
        assert_eq!(rules.summary.as_deref(), Some(&*tail(&all, SUMMARY_CHARS)));
        // The record lags; what every reader gets does not.
        assert_eq!(record(b.store(), id).update_seq, 64, "{id}");
        assert_eq!(&b.store().flight(id).unwrap().unwrap(), rules);
        let live = b.store().live_flights().unwrap();
        assert_eq!(live.iter().find(|f| &f.id == id), Some(rules));
        assert_eq!(b.flight(id).await.unwrap().as_ref(), Some(rules));
        let store = b.store();
        assert_eq!(
            store.get(T::Flights, id.as_bytes()).unwrap().as_ref(),
            Some(rules)
        );
        assert!(store.values::<Flight>(T::Flights).unwrap().contains(rules));
        let kept = store.live_flights_where(|f| &f.id == id).unwrap();
        assert_eq!(kept, vec![rules.clone()]);
    }
    let report = b.store().verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");

    // A restart: the writer has nothing in memory and reads the lagging records.
    stop.cancel();
    drop(b);
    writer.await.unwrap();
    let (b, _stop, _writer) = support::start(support::reopen(&path).await).await;
    stream(&b, &ids, BEFORE..BEFORE + AFTER).await;
    join_all(
        ids.iter()
            .map(|id| b.update_flight(id, state(FlightState::Completed, Some("done")))),
    )
    .await
    .into_iter()
    .for_each(|r| {
        r.unwrap();
    });
    b.store().flush().await.unwrap();
    let published = as_published(b.store());
    let events = b.store().events_after(0, usize::MAX).unwrap();
    for (i, id) in ids.iter().enumerate() {
        // Every update kept, numbered on from where the flight was.
        let updates = b.store().flight_updates(id, 0).unwrap();
        let seqs: Vec<u64> = updates.iter().map(|u| u.seq).collect();
        let want: Vec<u64> = (1..=2 + (BEFORE + AFTER) as u64).collect();
        assert_eq!(seqs, want, "{id}");
        // The first delta after the restart extended the text streamed before it.
        let first_after = events
            .iter()
            .find_map(|e| match &e.body {
                EventBody::FlightUpdated { update, flight }
                    if &update.flight == id && update.seq == 2 + BEFORE as u64 =>
                {
                    Some(flight.clone())
                }
                _ => None,
            })
            .unwrap();
        let all: String = (0..=BEFORE).map(|k| text(i, k)).collect();
        assert_eq!(
            first_after.summary.as_deref(),
            Some(&*tail(&all, SUMMARY_CHARS))
        );
        let ended = b.store().flight(id).unwrap().unwrap();
        assert_eq!(ended, published[id]);
        assert_eq!(ended.state, FlightState::Completed);
        assert_eq!(record(b.store(), id).update_seq, ended.update_seq);
    }
    let report = b.store().verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");
    every_event_found(b.store());
}

/// Not only deltas: a live flight's items, session ids and command output leave its record
/// as it is too (a change of state or usage writes it), for many flights at once and
/// across a restart, and every reader still sees the flight as the rules made it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_flights_record_lags_behind_its_items_and_session_too() {
    use relay_protocol::domain::{ItemKind, ItemPhase, TokenUsage};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    // A turn's updates but its deltas, each flight's own ids and texts.
    let turn = |i: usize, k: usize| -> Vec<FlightChange> {
        let item = |phase| FlightChange::Item {
            item_id: format!("i{i}.{k}"),
            item_kind: ItemKind::CommandExecution,
            phase,
            text: Some(format!("cargo test {i}.{k}").into()),
            exit_code: None,
        };
        vec![
            FlightChange::Session {
                thread_id: Some(format!("thr-{i}")),
                turn_id: Some(format!("turn-{i}.{k}")),
            },
            item(ItemPhase::Started),
            FlightChange::CommandOutput {
                item_id: format!("i{i}.{k}"),
                text: format!("ok {i}.{k}\n"),
            },
            item(ItemPhase::Completed),
        ]
    };
    let run = |b: Broker, ids: Vec<String>, k: usize| async move {
        join_all(ids.iter().enumerate().map(|(i, id)| {
            let b = b.clone();
            async move {
                for change in turn(i, k) {
                    b.update_flight(id, change).await.unwrap();
                }
            }
        }))
        .await;
    };
    let readers_agree = |b: &Broker, ids: &[String]| {
        let published = as_published(b.store());
        for id in ids {
            let rules = &published[id];
            assert_eq!(&b.store().flight(id).unwrap().unwrap(), rules, "{id}");
            let live = b.store().live_flights().unwrap();
            assert_eq!(live.iter().find(|f| &f.id == id), Some(rules));
            assert!(b
                .store()
                .values::<Flight>(T::Flights)
                .unwrap()
                .contains(rules));
        }
        published
    };
    let (b, stop, writer) = support::start(Store::open(&path).unwrap()).await;
    let ids = running_flights(&b).await;
    run(b.clone(), ids.clone(), 0).await;
    b.store().flush().await.unwrap();
    let published = readers_agree(&b, &ids);
    for (i, id) in ids.iter().enumerate() {
        // Running is update 1; the 4 after it lag.
        assert_eq!(record(b.store(), id).update_seq, 1, "{id}");
        let rules = &published[id];
        assert_eq!(rules.update_seq, 5);
        assert_eq!(
            (rules.thread_id.as_deref(), rules.turn_id.clone()),
            (Some(&*format!("thr-{i}")), Some(format!("turn-{i}.0")))
        );
        assert!(rules.summary.as_deref().unwrap().contains("cargo test"));
    }
    // The usage counters fold from the record: usage writes it.
    for id in &ids {
        b.update_flight(id, FlightChange::Usage(TokenUsage::new(10, 5)))
            .await
            .unwrap();
        assert_eq!(record(b.store(), id).update_seq, 6);
    }
    run(b.clone(), ids.clone(), 1).await;
    b.store().flush().await.unwrap();
    readers_agree(&b, &ids);
    assert!(b.store().verify().unwrap().is_consistent());

    // A restart: the writer reads the lagging records and numbers on from the flights.
    stop.cancel();
    drop(b);
    writer.await.unwrap();
    let (b, _stop, _writer) = support::start(support::reopen(&path).await).await;
    readers_agree(&b, &ids);
    run(b.clone(), ids.clone(), 2).await;
    b.store().flush().await.unwrap();
    let published = readers_agree(&b, &ids);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(published[id].update_seq, 14);
        assert_eq!(published[id].turn_id, Some(format!("turn-{i}.2")));
        assert_eq!(record(b.store(), id).update_seq, 6);
        b.update_flight(id, state(FlightState::Completed, Some("done")))
            .await
            .unwrap();
        let ended = b.store().flight(id).unwrap().unwrap();
        assert_eq!(record(b.store(), id).update_seq, ended.update_seq);
        assert_eq!(ended.turn_id, Some(format!("turn-{i}.2")));
    }
    let report = b.store().verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");
    let usage = b.store().flight(&ids[0]).unwrap().unwrap().usage;
    assert_eq!(usage, Some(TokenUsage::new(10, 5)));
}

/// Every event is found by its seq, and read from any seq on; `event_pos` holds one in 16.
fn every_event_found(store: &Store) {
    let last = store.last_seq().unwrap();
    assert!(last > 100, "{last}");
    for seq in 1..=last {
        assert_eq!(store.event(seq).unwrap().unwrap().seq, seq);
        let after = store.events_after(seq - 1, 3).unwrap();
        let want: Vec<u64> = (seq..=last.min(seq + 2)).collect();
        assert_eq!(after.iter().map(|e| e.seq).collect::<Vec<_>>(), want);
    }
    assert!(store.event(last + 1).unwrap().is_none());
    assert!(store.events_after(last, 10).unwrap().is_empty());
    assert_eq!(store.tree(T::EventPos).len() as u64, last / 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_a_position_for_every_event_keeps_one_in_16_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let (b, stop, writer) = support::start(Store::open(&path).unwrap()).await;
    b.register_agent(AgentSpec::new("a0", Harness::CodexAppServer, "/w"))
        .await
        .unwrap();
    let id = b
        .invoke(InvokeRequest::new("a0", "go"))
        .await
        .unwrap()
        .flight
        .id;
    stream(&b, std::slice::from_ref(&id), 0..200).await;
    b.store().flush().await.unwrap();
    // As a store made before wrote it: every event's position, and no marker.
    let store = b.store().clone();
    let last = store.last_seq().unwrap();
    for seq in 1..=last {
        let pos = store
            .log()
            .find(store.log().start().unwrap(), seq)
            .unwrap()
            .unwrap();
        store
            .tree(T::EventPos)
            .insert(seq.to_be_bytes(), &pos.to_be_bytes())
            .unwrap();
    }
    store.tree(T::Meta).remove(b"event_pos_sparse").unwrap();
    store.tree(T::EventPos).flush().unwrap();
    store.tree(T::Meta).flush().unwrap();
    drop(store);
    stop.cancel();
    drop(b);
    writer.await.unwrap();
    let store = support::reopen(&path).await;
    every_event_found(&store);
    let report = store.verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");
}

/// Four flights stream at once (their batches written without a transaction); then
/// sled is left as a crash while the last batches were applied would leave it: their
/// update positions and where the projections stand missing. The next open catches
/// sled up from the log: every update is found again, and `verify` agrees. Then as a
/// power cut leaves it: a stray key of a batch the log lost; the next open rebuilds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_sled_lost_part_of_are_caught_up_from_the_log_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let (b, stop, writer, ids) = streamed(&path).await;
    let before: Vec<Vec<FlightUpdate>> = ids
        .iter()
        .map(|id| b.store().flight_updates(id, 0).unwrap())
        .collect();
    stop.cancel();
    drop(b);
    writer.await.unwrap();

    let store = support::reopen(&path).await;
    let cut = store.log().last_seq() - 20;
    let mut marker = None;
    store
        .log()
        .scan(0, |r| {
            if r.seq == cut {
                marker = Some(pair_value(r.seq, r.next()));
            }
            Ok::<_, relay_broker::BrokerError>(r.seq < cut)
        })
        .unwrap();
    let mut lost = 0;
    for event in store.events_after(cut, usize::MAX).unwrap() {
        if let EventBody::FlightUpdated { update, .. } = event.body {
            let key = child_key(&update.flight, update.seq);
            lost += usize::from(store.tree(T::FlightUpdates).remove(key).unwrap().is_some());
        }
    }
    assert_eq!(
        lost, 20,
        "the last 20 events are deltas whose positions sled loses"
    );
    let meta = store.tree(T::Meta);
    // Where the projections stand (`log_applied`, in the store's module header).
    meta.insert(b"log_applied", &marker.unwrap()[..]).unwrap();
    meta.flush().unwrap();
    drop(store);

    let store = support::reopen(&path).await;
    for (id, updates) in ids.iter().zip(&before) {
        assert_eq!(&store.flight_updates(id, 0).unwrap(), updates, "{id}");
        assert_eq!(updates.len(), 1 + BEFORE);
    }
    let report = store.verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");

    // As a power cut leaves it: sled kept the first keys of a batch (its seq marked as
    // being applied first) whose log record was lost. The next open rebuilds sled.
    let last = store.log().last_seq();
    let stray = child_key(&ids[0], 1 + BEFORE as u64 + 1);
    store
        .tree(T::FlightUpdates)
        .insert(&stray, &pair_value(last + 1, u64::MAX)[..])
        .unwrap();
    let meta = store.tree(T::Meta);
    meta.insert(b"log_applying", &(last + 1).to_be_bytes()[..])
        .unwrap();
    meta.flush().unwrap();
    drop(store);
    let store = support::reopen(&path).await;
    assert_eq!(store.tree(T::FlightUpdates).get(&stray).unwrap(), None);
    // The stray marker is gone (the rebuild marks its own chunks, within the log).
    let applying = store.tree(T::Meta).get(b"log_applying").unwrap();
    let applying = applying.map(|v| u64::from_be_bytes(v[..8].try_into().unwrap()));
    assert!(applying.is_none_or(|seq| seq <= last), "{applying:?}");
    for (id, updates) in ids.iter().zip(&before) {
        assert_eq!(&store.flight_updates(id, 0).unwrap(), updates, "{id}");
    }
    let report = store.verify().unwrap();
    assert!(report.is_consistent(), "{report:?}");

    // A damaged marker of a batch being applied is taken as ahead: rebuilt, not refused.
    store
        .tree(T::Meta)
        .insert(b"log_applying", b"bad".as_slice())
        .unwrap();
    store.tree(T::Meta).flush().unwrap();
    drop(store);
    let store = support::reopen(&path).await;
    // The stray marker is gone (the rebuild marks its own chunks, within the log).
    let applying = store.tree(T::Meta).get(b"log_applying").unwrap();
    let applying = applying.map(|v| u64::from_be_bytes(v[..8].try_into().unwrap()));
    assert!(applying.is_none_or(|seq| seq <= last), "{applying:?}");
    assert_eq!(&store.flight_updates(&ids[0], 0).unwrap(), &before[0]);
}
