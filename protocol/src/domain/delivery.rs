//! Deliveries of messages to agents, and bindings of conversations to outside channels.

use serde::{Deserialize, Serialize};

use super::Harness;
use crate::names::wire_enum;

wire_enum! {
    /// Why a message is delivered to an agent.
    pub enum DeliveryReason("delivery reason") {
        Mention = "mention",
        DirectMessage = "direct_message",
        Invocation = "invocation",
    }
}

wire_enum! {
    pub enum DeliveryState("delivery state") {
        Pending = "pending",
        Delivered = "delivered",
        Failed = "failed",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryAttempt {
    pub at: u64,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Deterministic: see [`delivery_id`].
    pub id: String,
    pub message: String,
    pub target: String,
    pub reason: DeliveryReason,
    pub transport: Harness,
    pub state: DeliveryState,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<DeliveryAttempt>,
}

/// The same message, target, reason and transport always give the same id, so planning
/// twice (a retry, a replay) never makes a second delivery.
pub fn delivery_id(
    message: &str,
    target: &str,
    reason: DeliveryReason,
    transport: Harness,
) -> String {
    // FNV-1a 64: stable across builds and platforms, unlike std's RandomState hashers.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [message, target, reason.as_str(), transport.as_str()] {
        for b in part.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("dlv_{h:016x}")
}

/// A conversation mirrored to an outside channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub id: String,
    pub conversation: String,
    /// For example `nats`.
    pub kind: String,
    /// For example the NATS subject.
    pub target: String,
    pub created_at: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_ids_are_deterministic_and_distinct() {
        let a = delivery_id(
            "m1",
            "codex",
            DeliveryReason::Mention,
            Harness::CodexAppServer,
        );
        let b = delivery_id(
            "m1",
            "codex",
            DeliveryReason::Mention,
            Harness::CodexAppServer,
        );
        let c = delivery_id(
            "m1",
            "codex",
            DeliveryReason::Invocation,
            Harness::CodexAppServer,
        );
        let d = delivery_id(
            "m1c",
            "odex",
            DeliveryReason::Mention,
            Harness::CodexAppServer,
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }
}
