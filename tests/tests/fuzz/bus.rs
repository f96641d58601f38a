//! NATS payloads: the protobuf requests and messages of `relay.proto` (and the domain
//! forms they convert to), the JSON bodies of the bus subjects as the method table types
//! them, the subjects themselves; and the messages a node and its broker seal for each
//! other, opened with the right key, the wrong key and no key.

use proptest::prelude::*;
use prost::Message as _;
use relay_broker::node::wire::{open_control, open_dispatch, open_report};
use relay_broker::seal::{BusKey, NodeKey};
use relay_protocol::bus::subjects;
use relay_protocol::convert::{self, ProtoEnum};
use relay_protocol::domain::{Action, ApprovalDecision};
use relay_protocol::methods::{self, call as m, BusCall};
use relay_protocol::pb;
use relay_protocol::runtime::{Control, Dispatch, Report};
use relay_tests::fuzz::{bytes, fuzz, json_input, mutated, Seen};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{corpus, seeds_of};

/// The protobuf bytes in the corpus (updates, messages, approvals), and small messages
/// of each request type.
fn pb_seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = corpus()
        .iter()
        .filter(|(k, _)| k.starts_with("pb_"))
        .filter_map(|(_, v)| {
            v["hex"]
                .as_str()
                .or(v["bytes"].as_str())
                .map(str::to_string)
        })
        .filter_map(|hex| relay_protocol::hex::decode(&hex))
        .collect();
    out.push(
        pb::InvokeRequest {
            task: "do it".into(),
            requester: "alice".into(),
            action: 1,
            conversation: Some("c1".into()),
            parent_flight: Some("f1".into()),
            timeout_ms: Some(1000),
        }
        .encode_to_vec(),
    );
    out.push(
        pb::PostMessage {
            conversation: "c1".into(),
            author: "alice".into(),
            body: "hi @bob".into(),
            class: 1,
            reply_to: Some("m1".into()),
        }
        .encode_to_vec(),
    );
    out.push(
        pb::ApproveRequest {
            approval: "a1".into(),
            decision: 2,
            decided_by: "op".into(),
        }
        .encode_to_vec(),
    );
    out.push(
        pb::SteerRequest {
            flight: "f1".into(),
            text: "also".into(),
        }
        .encode_to_vec(),
    );
    out
}

/// `bytes` decoded as `M`; what decodes re-encodes to bytes that decode the same.
fn pb_round_trip<M: prost::Message + Default + PartialEq + std::fmt::Debug>(
    bytes: &[u8],
) -> Result<Option<M>, TestCaseError> {
    let Ok(v) = M::decode(bytes) else {
        return Ok(None);
    };
    let again = M::decode(v.encode_to_vec().as_slice());
    prop_assert_eq!(
        again.as_ref().ok(),
        Some(&v),
        "re-encoded protobuf decodes the same"
    );
    Ok(Some(v))
}

#[test]
fn nats_protobuf_payloads() {
    let input = prop_oneof![1 => bytes(256), 3 => mutated(pb_seeds())];
    let converted = Seen::default();
    fuzz("nats_protobuf_payloads", 3000, input, |b| {
        if let Some(r) = pb_round_trip::<pb::InvokeRequest>(&b)? {
            if convert::invoke_request_from_pb("agent", &r, "nats").is_ok() {
                converted.hit();
            }
        }
        if let Some(p) = pb_round_trip::<pb::PostMessage>(&b)? {
            let _ = convert::post_from_pb(&p);
        }
        if let Some(r) = pb_round_trip::<pb::ApproveRequest>(&b)? {
            let _ = ApprovalDecision::from_pb(r.decision);
        }
        pb_round_trip::<pb::SteerRequest>(&b)?;
        pb_round_trip::<pb::InterruptRequest>(&b)?;
        pb_round_trip::<pb::FlightUpdate>(&b)?;
        pb_round_trip::<pb::Flight>(&b)?;
        pb_round_trip::<pb::Message>(&b)?;
        pb_round_trip::<pb::Approval>(&b)?;
        pb_round_trip::<pb::InvokeReply>(&b)?;
        pb_round_trip::<pb::CommandReply>(&b)?;
        let _ = Action::from_pb(i32::from(b.first().copied().unwrap_or(0)) - 128);
        Ok(())
    });
    converted.assert_some("nats_protobuf_payloads", "converted to an invocation");
}

/// `bytes` as the JSON body of `M`'s subject; what decodes encodes and decodes the same.
fn bus_json<M: BusCall>(b: &[u8]) -> Result<Option<<M as BusCall>::Request>, TestCaseError>
where
    <M as BusCall>::Request: PartialEq + std::fmt::Debug,
{
    json_round_trip::<<M as BusCall>::Request>(b)
}

fn json_round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    b: &[u8],
) -> Result<Option<T>, TestCaseError> {
    let Ok(v) = serde_json::from_slice::<T>(b) else {
        return Ok(None);
    };
    let text = serde_json::to_vec(&v)
        .map_err(|e| TestCaseError::fail(format!("{v:?} does not encode: {e}")))?;
    let again = serde_json::from_slice::<T>(&text);
    prop_assert_eq!(
        again.as_ref().ok(),
        Some(&v),
        "re-encoded JSON decodes the same"
    );
    Ok(Some(v))
}

#[test]
fn nats_json_bodies_and_subjects() {
    let mut seeds = vec![
        r#"{"task":"do it","requester":"alice","action":"execute","conversation":"c1","parent_flight":"f1","timeout_ms":5}"#.to_string(),
        r#"{"conversation":"c1","author":"alice","body":"hi @bob","class":"agent"}"#.to_string(),
        r#"{"flight":"f1","text":"also"}"#.to_string(),
        r#"{"flight":"f1"}"#.to_string(),
        r#"{"approval":"a1","decision":"accept","decided_by":"op"}"#.to_string(),
        r#"{"flight":"f1"}"#.to_string(),
        r#"{"agent":"a1"}"#.to_string(),
        r#"{"conversation":"c1","after":3}"#.to_string(),
    ];
    seeds.extend(seeds_of::<relay_protocol::domain::PostMessage>());
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let subject = prop_oneof![
        Just("relay.v1.invoke.agent-1".to_string()),
        Just("relay.v1.cmd.approve".to_string()),
        "relay\\.v1\\.[a-z.*>]{0,20}",
        ".{0,40}",
    ];
    let (invokes, posts, routed) = (Seen::default(), Seen::default(), Seen::default());
    fuzz(
        "nats_json_bodies_and_subjects",
        3000,
        (json_input(&seeds), subject),
        |(b, subject)| {
            if let Some(c) = bus_json::<m::Invoke>(&b)? {
                let _ = c.into_request("agent-1");
                invokes.hit();
            }
            if bus_json::<m::MessagePost>(&b)?.is_some() {
                posts.hit();
            }
            bus_json::<m::FlightSteer>(&b)?;
            bus_json::<m::FlightInterrupt>(&b)?;
            bus_json::<m::ApprovalDecide>(&b)?;
            if let Ok(w) = serde_json::from_slice::<<m::Watch as BusCall>::Request>(&b) {
                let _ = w.scope();
            }
            if let Some((method, param)) = methods::by_subject(&subject) {
                prop_assert!(method.bus.is_some(), "{subject} names a bus method");
                prop_assert!(
                    subject.ends_with(param) || param.is_empty(),
                    "{subject}: {param}"
                );
                routed.hit();
            }
            let _ = subjects::invoke_target(&subject);
            let _ = subjects::report_node(&subject);
            Ok(())
        },
    );
    // Each on its own: one decoder's seeds must not hide that the other's never pass.
    invokes.assert_some("nats_json_bodies_and_subjects", "decoded as an invoke");
    posts.assert_some("nats_json_bodies_and_subjects", "decoded as a post");
    routed.assert_some("nats_json_bodies_and_subjects", "named a bus method");
}

/// A sealed message: sealed right (any plaintext, the corpus's dispatches, controls and
/// reports changed), for another subject, by another key, or raw bytes.
#[derive(Debug, Clone)]
enum Sealed {
    Right(Vec<u8>),
    OtherSubject(Vec<u8>),
    OtherKey(Vec<u8>),
    Raw(Vec<u8>),
}

#[test]
fn sealed_node_messages() {
    let mut seeds: Vec<String> = Vec::new();
    for (kind, v) in corpus() {
        if matches!(kind.as_str(), "Dispatch" | "Control" | "Report") {
            seeds.push(v.to_string());
        }
    }
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let plain = json_input(&seeds);
    let input = prop_oneof![
        4 => plain.clone().prop_map(Sealed::Right),
        1 => plain.clone().prop_map(Sealed::OtherSubject),
        1 => plain.prop_map(Sealed::OtherKey),
        1 => bytes(128).prop_map(Sealed::Raw),
    ];
    let bus = BusKey::new([7; 32]);
    let node = bus.node("n1");
    let stranger = NodeKey::new([9; 32]);
    let opened = Seen::default();
    fuzz("sealed_node_messages", 2000, input, |sealed| {
        let dispatch = subjects::dispatch("n1");
        let control = subjects::node_control("n1");
        let report = subjects::report("n1");
        let (payloads, genuine) = match &sealed {
            Sealed::Right(p) => (
                [
                    node.seal(&dispatch, p),
                    node.seal(&control, p),
                    node.seal(&report, p),
                ],
                Some(p),
            ),
            Sealed::OtherSubject(p) => (
                [
                    node.seal("x", p),
                    node.seal(&dispatch, p),
                    node.seal(&control, p),
                ],
                None,
            ),
            Sealed::OtherKey(p) => (
                [
                    stranger.seal(&dispatch, p),
                    stranger.seal(&control, p),
                    stranger.seal(&report, p),
                ],
                None,
            ),
            Sealed::Raw(b) => ([b.clone(), b.clone(), b.clone()], None),
        };
        let d = open_dispatch(&node, &dispatch, &payloads[0]);
        let c = open_control(&node, &control, &payloads[1]);
        let (from, r) = open_report(&bus, &report, &payloads[2]);
        prop_assert_eq!(from, "n1");
        match genuine {
            // Opened with the right key: the plaintext decides, exactly as JSON does.
            Some(p) => {
                prop_assert_eq!(d.is_ok(), serde_json::from_slice::<Dispatch>(p).is_ok());
                prop_assert_eq!(c.is_ok(), serde_json::from_slice::<Control>(p).is_ok());
                prop_assert_eq!(r.is_ok(), serde_json::from_slice::<Report>(p).is_ok());
                prop_assert_eq!(
                    node.open(&dispatch, &payloads[0]).ok(),
                    Some(p.clone()),
                    "seal/open round-trips"
                );
                if d.is_ok() || c.is_ok() || r.is_ok() {
                    opened.hit();
                }
                if let Ok(d) = d {
                    json_round_trip::<Dispatch>(&serde_json::to_vec(&d).unwrap_or_default())?;
                }
            }
            // Anything else is refused before its JSON is read.
            None => {
                prop_assert!(
                    d.is_err(),
                    "a dispatch not sealed for this node and subject opened"
                );
                prop_assert!(
                    c.is_err(),
                    "a control not sealed for this node and subject opened"
                );
                prop_assert!(r.is_err(), "a report not sealed by this node opened");
            }
        }
        Ok(())
    });
    opened.assert_some(
        "sealed_node_messages",
        "opened and read as a dispatch, control or report",
    );
}
