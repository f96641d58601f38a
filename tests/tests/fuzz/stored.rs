//! Stored values (the broker's sled trees and the runtime's thread records, as a damaged
//! or foreign database would hold them), `api.json` as a client discovers its broker by
//! it, and the client's reading of an SSE stream.

use proptest::prelude::*;
use relay_broker::store::{decode, encode, StoredUpdate};
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
