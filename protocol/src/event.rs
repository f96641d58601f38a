//! The event log: every change in Relay is one [`Event`] with a global sequence number.
//! Projections (agents, flights, messages...) are a fold over these events, so the log
//! alone can rebuild them. Events carry the records they produce, which makes applying
//! one idempotent.

use serde::{Deserialize, Serialize};

use crate::domain::{
    Agent, Approval, Binding, Conversation, Delivery, Flight, FlightUpdate, Invocation, Message,
};

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
    #[serde(flatten)]
    pub body: EventBody,
}

fn first_version() -> u8 {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    AgentRegistered {
        agent: Agent,
    },
    /// State, thread id or endpoint changed.
    AgentUpdated {
        agent: Agent,
    },
    AgentRemoved {
        name: String,
        /// The node that served it (`None`: the broker's embedded runtime).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
    },
    /// The harness thread stored for an agent could not be resumed and a new one was
    /// started: the earlier conversation is not in the new thread.
    ThreadLost {
        agent: String,
        old_thread_id: String,
        new_thread_id: String,
        reason: String,
    },
    ConversationCreated {
        conversation: Conversation,
    },
    MessagePosted {
        message: Message,
        conversation: Conversation,
    },
    DeliveryPlanned {
        delivery: Delivery,
    },
    DeliveryAttempted {
        delivery: Delivery,
    },
    InvocationCreated {
        invocation: Invocation,
        flight: Flight,
    },
    FlightUpdated {
        update: FlightUpdate,
        flight: Flight,
    },
    BindingCreated {
        binding: Binding,
    },
    ApprovalRequested {
        approval: Approval,
    },
    ApprovalDecided {
        approval: Approval,
    },
}

impl EventBody {
    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::AgentRegistered { .. } => "agent_registered",
            EventBody::AgentUpdated { .. } => "agent_updated",
            EventBody::AgentRemoved { .. } => "agent_removed",
            EventBody::ThreadLost { .. } => "thread_lost",
            EventBody::ConversationCreated { .. } => "conversation_created",
            EventBody::MessagePosted { .. } => "message_posted",
            EventBody::DeliveryPlanned { .. } => "delivery_planned",
            EventBody::DeliveryAttempted { .. } => "delivery_attempted",
            EventBody::InvocationCreated { .. } => "invocation_created",
            EventBody::FlightUpdated { .. } => "flight_updated",
            EventBody::BindingCreated { .. } => "binding_created",
            EventBody::ApprovalRequested { .. } => "approval_requested",
            EventBody::ApprovalDecided { .. } => "approval_decided",
        }
    }
}
