//! Compatibility with what Relay 0.1 (commit bf65053) wrote: `compat/bf65053.jsonl` holds
//! values that build serialised, one per line as `{"kind", "value"}`: every event body
//! (the sled log), agents, flight changes, node dispatches, controls and reports, error
//! bodies, requests, every enum value, `delivery_id`s, and the protobuf bytes of flight
//! updates, messages and approvals (hex, with the values they encode). Each must read
//! into today's types and write back the same, so the sled format, the node JSON, the
//! HTTP JSON and the NATS protobuf have not moved.

#![allow(clippy::unwrap_used)]

use relay_protocol::api::*;
use relay_protocol::domain::*;
use relay_protocol::event::*;
use relay_protocol::runtime::*;
use serde_json::Value;

fn again<T: serde::Serialize + serde::de::DeserializeOwned>(v: &Value) -> Value {
    let t: T = serde_json::from_value(v.clone()).unwrap();
    serde_json::to_value(&t).unwrap()
}

fn hex(b: Vec<u8>) -> String {
    relay_protocol::hex::encode(&b)
}

#[test]
fn what_the_first_release_wrote_reads_and_writes_back_the_same() {
    let mut n = 0;
    for line in include_str!("compat/bf65053.jsonl").lines() {
        let doc: Value = serde_json::from_str(line).unwrap();
        let v = &doc["value"];
        let back = match doc["kind"].as_str().unwrap() {
            "Event" => {
                let e: Event = serde_json::from_value(v.clone()).unwrap();
                assert_eq!(
                    v["type"],
                    e.body.type_name(),
                    "the SSE event name is the tag"
                );
                serde_json::to_value(&e).unwrap()
            }
            "Report" => again::<Report>(v),
            "FlightChange" => again::<FlightChange>(v),
            "Agent" => again::<Agent>(v),
            "Dispatch" => again::<Dispatch>(v),
            "Control" => again::<Control>(v),
            "ErrorBody" => again::<ErrorBody>(v),
            "InvokeRequest" => again::<InvokeRequest>(v),
            "PostMessage" => again::<PostMessage>(v),
            "Harness" => again::<Harness>(v),
            "FlightState" => again::<FlightState>(v),
            "WakePolicy" => again::<WakePolicy>(v),
            "AgentState" => again::<AgentState>(v),
            "ConversationKind" => again::<ConversationKind>(v),
            "ApprovalDecision" => again::<ApprovalDecision>(v),
            "ApprovalKind" => again::<ApprovalKind>(v),
            "ApprovalState" => again::<ApprovalState>(v),
            "DeliveryReason" => again::<DeliveryReason>(v),
            "DeliveryState" => again::<DeliveryState>(v),
            "ItemPhase" => again::<ItemPhase>(v),
            "str" => {
                let s = v[1].as_str().unwrap();
                let shown = if let Ok(h) = s.parse::<Harness>() {
                    h.to_string()
                } else if let Ok(f) = s.parse::<FlightState>() {
                    f.to_string()
                } else {
                    s.parse::<ApprovalDecision>().unwrap().to_string()
                };
                serde_json::json!([shown, s])
            }
            "delivery_id" => serde_json::json!([
                delivery_id("m", "t", DeliveryReason::DirectMessage, Harness::PiRpc),
                delivery_id("m", "t", DeliveryReason::Mention, Harness::Tmux),
                delivery_id(
                    "m",
                    "t",
                    DeliveryReason::Invocation,
                    Harness::CodexAppServer
                )
            ]),
            "pb_update" => {
                use prost::Message as _;
                let u: FlightUpdate = serde_json::from_value(v["update"].clone()).unwrap();
                let f: Flight = serde_json::from_value(v["flight"].clone()).unwrap();
                let mut out = v.clone();
                out["hex"] =
                    hex(relay_protocol::convert::update_to_pb(&u, &f).encode_to_vec()).into();
                out
            }
            "pb_message" => {
                use prost::Message as _;
                let m: Message = serde_json::from_value(v["message"].clone()).unwrap();
                let mut out = v.clone();
                out["hex"] = hex(relay_protocol::convert::message_to_pb(&m).encode_to_vec()).into();
                out
            }
            "pb_approval" => {
                use prost::Message as _;
                let a: Approval = serde_json::from_value(v["approval"].clone()).unwrap();
                let mut out = v.clone();
                out["hex"] =
                    hex(relay_protocol::convert::approval_to_pb(&a).encode_to_vec()).into();
                out
            }
            k => panic!("kind {k}"),
        };
        assert_eq!(&back, v, "{line}");
        // Byte-identical too (field order).
        assert_eq!(
            serde_json::to_string(&back).unwrap(),
            serde_json::to_string(v).unwrap()
        );
        n += 1;
    }
    assert_eq!(n, 179);
}
