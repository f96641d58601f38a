//! Stored values (the broker's sled trees and the runtime's thread records, as a damaged
//! or foreign database would hold them), `api.json` as a client discovers its broker by
//! it, and the client's reading of an SSE stream.

use proptest::prelude::*;
use proptest::sample::Index;
use relay_broker::store::{
    child_key, decode, encode, message_id, pair_key, seq_key, StoredUpdate, T,
};
use relay_broker::Store;
use relay_client::{Client, DataDir, SseLimits, SseParser};
use relay_protocol::api::{ApiInfo, API_FILE};
use relay_protocol::domain::{
    Agent, Approval, Conversation, Delivery, Flight, Invocation, Message,
};
use relay_protocol::event::Event;
use relay_runtime::threads::{decode_record, encode_record};
use relay_tests::fuzz::{bytes, fuzz, json_input, mutated, Seen};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::seeds_of;

/// `b` as a stored `T`; one that decodes encodes to bytes that decode the same.
fn stored<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    b: &[u8],
    seen: &Seen,
) -> Result<(), TestCaseError> {
    let Ok(v) = decode::<T>(b) else {
        return Ok(());
    };
    seen.hit();
    let again =
        encode(&v).map_err(|e| TestCaseError::fail(format!("{v:?} does not encode: {e}")))?;
    let back = decode::<T>(&again).ok();
    prop_assert_eq!(back.as_ref(), Some(&v), "re-stored value reads the same");
    Ok(())
}

/// A stored value: the version byte (1, or another) and JSON.
fn stored_input(seeds: Vec<String>) -> BoxedStrategy<Vec<u8>> {
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    (
        prop_oneof![9 => Just(1u8), 1 => any::<u8>()],
        json_input(&seeds),
        any::<bool>(),
    )
        .prop_map(|(version, json, bare)| match bare {
            // Not even a version byte in front: what a foreign value holds.
            true if json.len() < 2 => Vec::new(),
            _ => std::iter::once(version).chain(json).collect(),
        })
        .boxed()
}

#[test]
fn sled_stored_values() {
    let mut seeds = Vec::new();
    seeds.extend(seeds_of::<Event>());
    seeds.extend(seeds_of::<Agent>());
    seeds.extend(seeds_of::<Flight>());
    seeds.extend(seeds_of::<Message>());
    seeds.extend(seeds_of::<Approval>());
    seeds.extend(seeds_of::<Invocation>());
    seeds.extend(seeds_of::<Delivery>());
    seeds.extend(seeds_of::<Conversation>());
    seeds.push(
        r#"{"event_seq":3,"update":{"flight":"f","seq":1,"change":{"type":"delta","text":"x"}}}"#
            .into(),
    );
    seeds.push(r#"{"harness":"codex-app-server","thread_id":"th","updated_at":5}"#.into());
    seeds.push(r#"{"A":"b"}"#.into());
    seeds.push(r#"["a","b"]"#.into());
    let seen = Seen::default();
    fuzz("sled_stored_values", 2000, stored_input(seeds), |b| {
        stored::<Event>(&b, &seen)?;
        stored::<Agent>(&b, &seen)?;
        stored::<Conversation>(&b, &seen)?;
        stored::<Message>(&b, &seen)?;
        stored::<Invocation>(&b, &seen)?;
        stored::<Flight>(&b, &seen)?;
        stored::<StoredUpdate>(&b, &seen)?;
        stored::<Delivery>(&b, &seen)?;
        stored::<Approval>(&b, &seen)?;
        stored::<std::collections::BTreeMap<String, String>>(&b, &seen)?;
        stored::<Vec<String>>(&b, &seen)?;
        if let Ok(Some(r)) = decode_record(&b) {
            let again = encode_record(&r).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decode_record(&again).ok().flatten(), Some(r.clone()));
        }
        Ok(())
    });
    seen.assert_some("sled_stored_values", "decoded as a stored value");
}

/// Every tree of the broker's store.
const TREES: [T; 18] = [
    T::EventPos,
    T::Agents,
    T::Conversations,
    T::Messages,
    T::MessageIds,
    T::Invocations,
    T::Flights,
    T::FlightUpdates,
    T::Deliveries,
    T::Approvals,
    T::Bindings,
    T::FlightApprovals,
    T::ReportCursors,
    T::Secrets,
    T::LiveFlights,
    T::Meta,
    T::FlightChildren,
    T::ReplayIndex,
];

/// A key as the store makes them (a seq, a name, a pair, a child), or any bytes.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop_oneof![Just(0u64), Just(1), Just(2), Just(u64::MAX), any::<u64>()]
            .prop_map(|n| seq_key(n).to_vec()),
        "[a-z0-9_]{0,6}".prop_map(String::into_bytes),
        ("[a-z0-9_]{0,6}", "[a-z0-9_]{0,6}").prop_map(|(a, b)| pair_key(&a, &b)),
        // A conversation's last message is under index `u64::MAX`.
        (
            "[acf]?[a-z0-9_]{0,6}",
            prop_oneof![Just(u64::MAX), any::<u64>()]
        )
            .prop_map(|(p, n)| child_key(&p, n)),
        bytes(12),
    ]
}

/// A damaged or foreign database: entries put straight into the broker's trees, then
/// everything that reads them (the queries the API answers from, `relay doctor`'s
/// rebuild of every projection from the log) answers with values or typed errors.
#[test]
fn sled_damaged_store() {
    let mut seeds = Vec::new();
    seeds.extend(seeds_of::<Event>());
    seeds.extend(seeds_of::<Flight>());
    seeds.extend(seeds_of::<Agent>());
    seeds.extend(seeds_of::<Message>());
    let entries = prop::collection::vec((any::<Index>(), key(), stored_input(seeds)), 1..12);
    let store = Store::temporary().expect("a temporary store");
    let verified = Seen::default();
    fuzz("sled_damaged_store", 300, entries, |entries| {
        for t in TREES {
            store
                .tree(t)
                .clear()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        for (tree, key, value) in &entries {
            store
                .tree(*tree.get(&TREES))
                .insert(key.as_slice(), value.as_slice())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let _ = store.last_seq();
        let _ = store.live_flights();
        let _ = store.recent_flights(10, |_| true);
        let _ = store.deliveries();
        let _ = store.events_after(0, 100);
        for id in ["", "a", "f", "flt_1", "c"] {
            let _ = store.children(id);
            let _ = store.flight_tree(id, 50);
            let _ = store.messages(id, 10);
            let _ = store.flight_updates(id, 0);
            let _ = store.last_stored_update(id, u64::MAX);
            let _ = store.agent(id);
            let _ = store.flight(id);
            for scope in [
                relay_broker::store::Scope::Agent,
                relay_broker::store::Scope::Flight,
            ] {
                let _ = store.replay_seqs(scope, id, 0, u64::MAX);
            }
        }
        // Messages by id: ids that carry a seq (read from the log through `event_pos`),
        // and ones that do not (through `message_ids`); a conversation's count and its
        // messages' seqs (walked back from its last).
        for seq in [0, 1, 16, 17, u64::MAX >> 2] {
            let _ = store.message(&message_id(seq));
        }
        for id in ["", "a", "msg_1", "msg_0000000000007000800000000000000z"] {
            let _ = store.message(id);
            let _ = store.conversation(id);
            let _ = store.message_seqs(id, 0, u64::MAX);
        }
        let _ = store.flight_counts();
        if store.doctor().is_ok() {
            verified.hit();
        }
        Ok(())
    });
    verified.assert_some("sled_damaged_store", "verified by doctor");
}

#[test]
fn api_json_discovery() {
    let dir = tempfile::tempdir().expect("a temporary dir");
    let seeds = [
        r#"{"url":"http://127.0.0.1:7777","token":"0123456789abcdef0123456789abcdef","pid":42}"#,
        r#"{"url":"http://[::1]:1/x/","token":"t\u0000\n","pid":0}"#,
    ];
    let found = Seen::default();
    fuzz("api_json_discovery", 500, json_input(&seeds), |b| {
        if let Ok(info) = serde_json::from_slice::<ApiInfo>(&b) {
            let again =
                serde_json::to_vec(&info).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                serde_json::from_slice::<ApiInfo>(&again).ok(),
                Some(info.clone())
            );
        }
        std::fs::write(dir.path().join(API_FILE), &b)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        // A client finds its broker by it, or says why not; a found one builds its URLs.
        if let Ok(client) = Client::discover(DataDir::Given(dir.path().to_path_buf()), None, None) {
            let _ = client.endpoint(&["v1", "status"], &[]);
            let _ = client.rediscover();
            found.hit();
        }
        Ok(())
    });
    found.assert_some("api_json_discovery", "found a broker");
}

#[test]
fn client_sse_stream() {
    let seeds = vec![
        b"\xef\xbb\xbf: c\r\nid: 1\r\nevent: a\r\ndata: x\r\ndata: \xc3\xa9\r\n\r\nretry: 5\rdata\r\rid: 2\nevent: b\ndata: {\"k\":[1,2]}\n\n:\ndata: end\r\n\r\n".to_vec(),
        b"id: 7\0\ndata: a\n\nretry: 99999999999999999999999\n\nevent: flight.update\ndata: {}\n\n".to_vec(),
    ];
    let input = (
        prop::collection::vec(prop_oneof![1 => bytes(64), 3 => mutated(seeds)], 1..5),
        1usize..64,
        1usize..64,
        any::<bool>(),
    );
    let dispatched = Seen::default();
    fuzz(
        "client_sse_stream",
        3000,
        input,
        |(chunks, line, event, resume)| {
            let limits = SseLimits { line, event };
            let mut p = match resume {
                true => SseParser::resuming(limits, "41"),
                false => SseParser::new(limits),
            };
            let mut events = Vec::new();
            for chunk in &chunks {
                let going = p.feed(chunk, &mut |e| {
                    events.push(e.clone());
                    true
                });
                match going {
                    Ok(_) => {}
                    // Over a limit: a typed end, the stream is not read on.
                    Err(_) => break,
                }
            }
            for e in &events {
                prop_assert!(
                    e.data.len() <= event,
                    "event data over the limit: {}",
                    e.data.len()
                );
                prop_assert!(!e.id.contains('\0'), "an id holding NUL is ignored");
                dispatched.hit();
            }
            Ok(())
        },
    );
    dispatched.assert_some("client_sse_stream", "dispatched events");
}

/// Found by `sled_damaged_store`: `relay doctor` over a log whose event holds the largest
/// seq overflowed counting the next one (a panic in a debug build, a wrap in release).
#[test]
fn an_event_with_the_largest_seq_is_reported_not_a_panic() {
    let store = Store::temporary().expect("a temporary store");
    let mut events: Vec<serde_json::Value> = crate::corpus()
        .into_iter()
        .filter(|(kind, _)| kind == "Event")
        .map(|(_, v)| v)
        .take(2)
        .collect();
    events[0]["seq"] = u64::MAX.into();
    events[1]["seq"] = 5.into();
    // The log holds them as records 1 and 2 (its own seqs follow on; the events' do not).
    let encoded: Vec<Vec<u8>> = events
        .iter()
        .map(|e| {
            let e: Event = serde_json::from_value(e.clone()).expect("an event");
            encode(&e).expect("encoded")
        })
        .collect();
    store
        .log()
        .append([(1, encoded[0].as_slice()), (2, encoded[1].as_slice())])
        .expect("appended");
    store.log().sync().expect("synced");
    let report = store.doctor().expect("a report");
    assert!(!report.consistent, "{report:?}");
    assert!(
        !report.gaps.is_empty(),
        "the seqs out of order are gaps: {report:?}"
    );
}

/// Next to the one above: a broker over a log whose last event holds the largest seq has
/// no seq left for the next event. It refuses to start with why (it overflowed: a panic
/// in a debug build, a wrap to seq 0 in release, over the log's first event).
#[tokio::test]
async fn a_log_at_the_largest_seq_is_refused_at_start() {
    let event = crate::corpus()
        .into_iter()
        .find(|(kind, _)| kind == "Event")
        .map(|(_, mut v)| {
            v["seq"] = u64::MAX.into();
            v
        })
        .expect("an event in the corpus");
    let event: Event = serde_json::from_value(event).expect("an event");
    // A log whose one segment starts at the largest seq (written by hand: no broker
    // gets there by appending).
    let tmp = tempfile::tempdir().expect("a temporary dir");
    let log = tmp.path().join("log");
    std::fs::create_dir_all(&log).expect("log dir");
    let mut bytes = Vec::new();
    relay_broker::store::log::frame_into(&mut bytes, u64::MAX, &encode(&event).expect("encoded"));
    std::fs::write(
        log.join(relay_broker::store::log::segment_name(0, u64::MAX)),
        bytes,
    )
    .expect("segment written");
    let store = Store::open(tmp.path()).expect("the store opens");
    let started = relay_broker::Broker::start(
        store,
        relay_broker::BrokerConfig::default(),
        tokio_util::sync::CancellationToken::new(),
    )
    .await;
    match started {
        Err(relay_broker::BrokerError::Corrupt(why)) => {
            assert!(why.contains("largest seq"), "{why}")
        }
        Err(e) => panic!("refused, but not as a damaged log: {e}"),
        Ok(_) => panic!("a broker started with no seq left for its next event"),
    }
}
