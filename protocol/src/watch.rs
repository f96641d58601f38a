//! Snapshot, then follow: what `relay watch`, `GET /v1/watch` and the NATS subject
//! `relay.v1.cmd.snapshot` answer with.
//!
//! A [`Snapshot`] is the state of one scope (a flight, an agent, a conversation) after
//! every event up to its [`Snapshot::seq`], a global event seq (the `seq` of
//! [`crate::event::Event`]), and nothing after it. A watcher then applies every event
//! of the scope with a seq above it, in order: no gap, no duplicate. How the broker
//! makes a snapshot exact while events keep committing is in `broker/src/watch.rs`.

use serde::{Deserialize, Serialize};

use crate::domain::{Agent, Approval, Conversation, Flight, FlightUpdate, Message};

/// Messages a conversation's snapshot holds when the request names no limit (the same
/// default as `GET /v1/conversations/{id}/messages`).
pub const DEFAULT_MESSAGES: usize = 50;
/// Most messages a conversation's snapshot holds.
pub const MAX_MESSAGES: usize = 10_000;

/// What to watch: one flight, one agent, one conversation, or the whole fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every agent, the flights not ended and the approvals waiting: what the dashboard
    /// shows at a glance. Its events are the agents', the flights' and the approvals'.
    Fleet,
    Flight(String),
    Agent(String),
    /// The conversation and its last `limit` messages.
    Conversation {
        id: String,
        limit: usize,
    },
}

/// A watch request: the HTTP query of `GET /v1/watch` and the JSON body of the NATS
/// request. Exactly one of `fleet` (true), `flight`, `agent`, `conversation`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchRequest {
    /// The whole fleet ([`Scope::Fleet`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fleet: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flight: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// A conversation's snapshot: at most this many of its last messages
    /// ([`DEFAULT_MESSAGES`]; at most [`MAX_MESSAGES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

impl WatchRequest {
    /// The scope the request names; an error (in words for a person) unless it names
    /// exactly one, or gives a limit to anything but a conversation.
    pub fn scope(&self) -> Result<Scope, String> {
        let scope = match (self.fleet, &self.flight, &self.agent, &self.conversation) {
            (true, None, None, None) => Scope::Fleet,
            (false, Some(f), None, None) => Scope::Flight(f.clone()),
            (false, None, Some(a), None) => Scope::Agent(a.clone()),
            (false, None, None, Some(c)) => Scope::Conversation {
                id: c.clone(),
                limit: self.limit.unwrap_or(DEFAULT_MESSAGES),
            },
            _ => return Err(
                "name exactly one thing to watch: the fleet, a flight, an agent or a conversation"
                    .into(),
            ),
        };
        match (&scope, self.limit) {
            (Scope::Conversation { .. }, Some(n)) if n > MAX_MESSAGES => Err(format!(
                "a snapshot holds at most {MAX_MESSAGES} messages; the limit asked is {n}"
            )),
            (Scope::Conversation { .. }, _) | (_, None) => Ok(scope),
            (_, Some(_)) => Err("a limit counts a conversation's messages: only a conversation's snapshot takes one".into()),
        }
    }
}

impl From<&Scope> for WatchRequest {
    fn from(scope: &Scope) -> WatchRequest {
        match scope {
            Scope::Fleet => WatchRequest {
                fleet: true,
                ..WatchRequest::default()
            },
            Scope::Flight(f) => WatchRequest {
                flight: Some(f.clone()),
                ..WatchRequest::default()
            },
            Scope::Agent(a) => WatchRequest {
                agent: Some(a.clone()),
                ..WatchRequest::default()
            },
            Scope::Conversation { id, limit } => WatchRequest {
                conversation: Some(id.clone()),
                limit: Some(*limit),
                ..WatchRequest::default()
            },
        }
    }
}

/// The state of a scope after every event up to `seq`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The global event seq the snapshot is valid at: follow with the scope's events
    /// whose seq is greater.
    pub seq: u64,
    #[serde(flatten)]
    pub view: View,
}

/// What a snapshot holds, by scope (`"scope": "fleet" | "flight" | "agent" |
/// "conversation"`).
// One per watch, built once: the size of its largest variant (an agent's view) costs
// nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "scope", rename_all = "snake_case")]
pub enum View {
    Fleet(FleetView),
    Flight(FlightView),
    Agent(AgentView),
    Conversation(ConversationView),
}

/// A flight and all its updates so far, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlightView {
    pub flight: Flight,
    pub updates: Vec<FlightUpdate>,
}

/// Every agent (by name), every flight not yet ended (oldest first, without its
/// updates: the flight record has its state and summary) and every approval waiting for
/// a decision (oldest first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetView {
    pub agents: Vec<Agent>,
    pub flights: Vec<Flight>,
    pub approvals: Vec<Approval>,
}

/// An agent and its flights not yet ended (running, waiting, queued), oldest first,
/// each with its updates so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentView {
    pub agent: Agent,
    pub flights: Vec<FlightView>,
}

/// A conversation and its last messages, oldest first (`conversation.message_count`
/// says how many it has in all).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationView {
    pub conversation: Conversation,
    pub messages: Vec<Message>,
}

/// The reply to the NATS request `relay.v1.cmd.snapshot`: the snapshot, and where to
/// follow it from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotReply {
    pub snapshot: Snapshot,
    pub catch_up: CatchUp,
}

/// Where a NATS client follows a snapshot: the messages on `subject` whose `Relay-Seq`
/// header is greater than the snapshot's seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchUp {
    /// The subject (filter) the scope's messages are published on.
    pub subject: String,
    /// The JetStream stream that keeps them (`RELAY_FLIGHTS`); `None` when there is
    /// none (a conversation's messages: subscribe to `subject` before asking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// The stream sequence to start a consumer at (`DeliverPolicy::ByStartSequence`):
    /// every message of the scope after the snapshot is at or after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_sequence: Option<u64>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::domain::{ConversationKind, ConversationSpec};
    use serde_json::json;

    #[test]
    fn a_request_names_one_scope() {
        let r: WatchRequest = serde_json::from_value(json!({"flight": "flt_1"})).unwrap();
        assert_eq!(r.scope(), Ok(Scope::Flight("flt_1".into())));
        let r: WatchRequest = serde_json::from_value(json!({"fleet": true})).unwrap();
        assert_eq!(r.scope(), Ok(Scope::Fleet));
        assert_eq!(WatchRequest::from(&Scope::Fleet), r);
        let r: WatchRequest =
            serde_json::from_value(json!({"conversation": "channel.shared"})).unwrap();
        assert_eq!(
            r.scope(),
            Ok(Scope::Conversation {
                id: "channel.shared".into(),
                limit: DEFAULT_MESSAGES
            })
        );
        assert_eq!(WatchRequest::from(&r.scope().unwrap()).scope(), r.scope());
        for bad in [
            json!({}),
            json!({"flight": "f", "agent": "a"}),
            json!({"fleet": true, "agent": "a"}),
            json!({"fleet": false}),
            json!({"fleet": true, "limit": 3}),
            json!({"agent": "a", "limit": 3}),
            json!({"conversation": "c", "limit": MAX_MESSAGES + 1}),
        ] {
            let r: WatchRequest = serde_json::from_value(bad.clone()).unwrap();
            assert!(r.scope().is_err(), "{bad}");
        }
        assert!(serde_json::from_value::<WatchRequest>(json!({"flihgt": "f"})).is_err());
    }

    #[test]
    fn a_snapshot_says_its_scope_and_seq_beside_its_records() {
        let snapshot = Snapshot {
            seq: 7,
            view: View::Conversation(ConversationView {
                conversation: Conversation {
                    spec: ConversationSpec {
                        id: "channel.x".into(),
                        kind: ConversationKind::Channel,
                        title: None,
                        participants: vec![],
                        parent: None,
                    },
                    created_at: 1,
                    message_count: 0,
                },
                messages: vec![],
            }),
        };
        let v = serde_json::to_value(&snapshot).unwrap();
        assert_eq!(v["seq"], 7);
        assert_eq!(v["scope"], "conversation");
        assert_eq!(v["conversation"]["id"], "channel.x");
        assert_eq!(v["messages"], json!([]));
        assert_eq!(serde_json::from_value::<Snapshot>(v).unwrap(), snapshot);
    }
}
