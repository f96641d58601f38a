//! Fuzz targets: every decoder of bytes from outside Relay, each driven with generated
//! inputs by [`relay_tests::fuzz`] (proptest's runner, stable Rust). A target passes when
//! the decoder answers each input with a value or a typed error (never a panic or a
//! hang) and, where it has an encoder, what it decoded encodes and decodes back the same.
//!
//! Bounded here (a fixed number of inputs per target, seconds in all); `ops/fuzz.sh` runs
//! them for longer (`RELAY_FUZZ_SECS`, `RELAY_FUZZ_CASES`) and prints the figures.
//!
//! - `harness`: Codex's JSON-RPC lines, Claude Code's stream-json, Pi's RPC, a tmux pane's
//!   output and screens.
//! - `bus`: NATS payloads (the protobuf messages and their JSON forms, subjects) and the
//!   sealed node messages (dispatches, controls, reports).
//! - `stored`: sled values (the broker's and the runtime's), `api.json`, the client's SSE
//!   parser.
//! - `http`: HTTP requests (bodies, headers, tokens, cookies, `Last-Event-ID`) to a real
//!   broker.

mod bus;
mod harness;
mod http;
mod stored;

use serde_json::Value;

/// The values Relay 0.1 wrote (`protocol/tests/compat/bf65053.jsonl`): every event body,
/// agents, flight changes, dispatches, controls, reports, errors, requests, and the
/// protobuf bytes of updates, messages and approvals; `(kind, value)`.
pub fn corpus() -> Vec<(String, Value)> {
    include_str!("../../../protocol/tests/compat/bf65053.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|mut d| {
            let kind = d["kind"].as_str().unwrap_or_default().to_string();
            (kind, d["value"].take())
        })
        .collect()
}

/// Every object and array inside the corpus's values (they are the seeds of types that
/// appear only inside another, like a flight inside an event).
pub fn sub_values() -> Vec<Value> {
    fn walk(v: &Value, out: &mut Vec<Value>) {
        match v {
            Value::Object(m) => {
                out.push(v.clone());
                m.values().for_each(|c| walk(c, out));
            }
            Value::Array(a) => {
                out.push(v.clone());
                a.iter().for_each(|c| walk(c, out));
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (_, v) in corpus() {
        walk(&v, &mut out);
    }
    out
}

/// The corpus's values that decode as `T`, as JSON texts (at least one: else every value).
pub fn seeds_of<T: serde::de::DeserializeOwned>() -> Vec<String> {
    let all = sub_values();
    let fit: Vec<String> = all
        .iter()
        .filter(|v| serde_json::from_value::<T>((*v).clone()).is_ok())
        .map(Value::to_string)
        .collect();
    match fit.is_empty() {
        true => all.iter().map(Value::to_string).collect(),
        false => fit,
    }
}
