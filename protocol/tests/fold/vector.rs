//! The test vector of the fold, made from the v1 fixture (`tests/fixtures/v1/expected.json`,
//! a real broker's recorded `/v1/events` stream): for every `flight_updated` event, the
//! flight before it (the flight its previous event carried, or the `invocation_created`
//! one), the update, the reply message it posted (the `message_posted` of the flight's
//! agent replying, just before the completion) and the flight the event carried after it.
//!
//! Not folded: every value is what the v1 writer recorded. The one field v1 did not
//! record, `streaming`, is set by its definition: the update was streamed text and the
//! flight did not end.

use std::collections::HashMap;

use relay_protocol::domain::{Flight, FlightChange, FlightUpdate};
use relay_protocol::event::{Event, EventBody};
use serde::{Deserialize, Serialize};

/// One line of `v1.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub flight: Flight,
    pub update: FlightUpdate,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    pub after: Flight,
}

/// The fixture's event stream, as the broker sent it.
pub fn fixture_events() -> Vec<Event> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/v1/expected.json"
    );
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let sse = fixture["outputs"]["SSE-UNTIL 428 /v1/events/stream?after=0"]
        .as_str()
        .unwrap();
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

pub fn from_events(events: &[Event]) -> Vec<Case> {
    let mut before: HashMap<String, Flight> = HashMap::new();
    let mut replies: HashMap<String, String> = HashMap::new();
    let mut cases = Vec::new();
    for event in events {
        match &event.body {
            EventBody::InvocationCreated { flight, .. } => {
                before.insert(flight.id.clone(), flight.clone());
            }
            EventBody::MessagePosted { message, .. } => {
                let of = message.meta.flight.as_ref().and_then(|f| before.get(f));
                if let Some(flight) =
                    of.filter(|f| message.reply_to.is_some() && f.agent == message.author)
                {
                    replies.insert(flight.id.clone(), message.id.clone());
                }
            }
            EventBody::FlightUpdated { update, flight } => {
                let prev = before[&update.flight].clone();
                assert_eq!(prev.update_seq + 1, update.seq, "event {}", event.seq);
                let reply = replies.remove(&update.flight);
                if reply.is_some() {
                    assert!(
                        matches!(update.change, FlightChange::State { .. }),
                        "a reply is posted by a completion (event {})",
                        event.seq
                    );
                }
                let mut after = flight.clone();
                after.streaming = matches!(update.change, FlightChange::Delta { .. })
                    && !after.state.is_terminal();
                before.insert(update.flight.clone(), after.clone());
                cases.push(Case {
                    flight: prev,
                    update: update.clone(),
                    reply,
                    after,
                });
            }
            _ => {}
        }
    }
    assert!(replies.is_empty(), "a reply without its completion");
    cases
}
