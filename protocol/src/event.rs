//! The event log: every change in Relay is one [`Event`] with a global sequence number.
//! Projections (agents, flights, messages...) are a fold over these events, so the log
//! alone can rebuild them. Events carry the records they produce, which makes applying
//! one idempotent.

use serde::{Deserialize, Serialize};

use crate::domain::{
    Agent, Approval, Binding, Conversation, Delivery, Flight, FlightUpdate, Invocation, Message,
    Rule,
};
use crate::names::wire_tagged_enum;

/// Version of the event encoding; bumped on an incompatible change.
pub const EVENT_VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Version of the event's encoding ([`EVENT_VERSION`]); absent in the log's oldest
    /// records, which are version 1. A reader refuses a version newer than it knows.
    #[serde(default = "first_version")]
    pub v: u8,
    /// Global, gap-free, starting at 1.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at: u64,
    /// Who asked for the change, when a client did (adding, forking, removing, waking an
    /// agent, setting its budget): `NAME@dashboard` for a dashboard login, `operator`
    /// for the operator's token. `None`: Relay's own doing (a runtime's report, a
    /// policy), or an event older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(flatten)]
    pub body: EventBody,
}

fn first_version() -> u8 {
    1
}

wire_tagged_enum! {
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "type")]
    pub enum EventBody {
        AgentRegistered = "agent_registered" {
            agent: Agent,
        },
        /// State, thread id or endpoint changed.
        AgentUpdated = "agent_updated" {
            agent: Agent,
        },
        AgentRemoved = "agent_removed" {
            name: String,
            /// The node that served it (`None`: the broker's embedded runtime).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            node: Option<String>,
            /// Its worktree is removed even with uncommitted work (committed on its
            /// branch first): `relay agent remove --force`.
            #[serde(default, skip_serializing_if = "std::ops::Not::not")]
            force: bool,
        },
        /// The harness thread stored for an agent could not be resumed and a new one was
        /// started: the earlier conversation is not in the new thread.
        ThreadLost = "thread_lost" {
            agent: String,
            old_thread_id: String,
            new_thread_id: String,
            reason: String,
        },
        ConversationCreated = "conversation_created" {
            conversation: Conversation,
        },
        MessagePosted = "message_posted" {
            message: Message,
            /// The conversation as it was after the message: only in the events of a
            /// broker before 2026-11-29. Each message carried a copy of it; its count is
            /// the message's `index` plus one, and the rest is its
            /// `conversation_created`'s.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            conversation: Option<Conversation>,
        },
        DeliveryPlanned = "delivery_planned" {
            delivery: Delivery,
        },
        DeliveryAttempted = "delivery_attempted" {
            delivery: Delivery,
        },
        InvocationCreated = "invocation_created" {
            invocation: Invocation,
            flight: Flight,
        },
        FlightUpdated = "flight_updated" {
            update: FlightUpdate,
            flight: Flight,
        },
        BindingCreated = "binding_created" {
            binding: Binding,
        },
        ApprovalRequested = "approval_requested" {
            approval: Approval,
        },
        ApprovalDecided = "approval_decided" {
            approval: Approval,
        },
        /// A decision was remembered as a rule (`--remember`).
        RuleAdded = "rule_added" {
            rule: Rule,
        },
        /// A rule was removed (`relay rule remove`): the rule as it was, who removed it.
        RuleRemoved = "rule_removed" {
            rule: Rule,
            removed_by: String,
        },
    }
}
