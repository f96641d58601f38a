//! The NATS wire, named in one place: every subject, stream and header the broker, its
//! nodes and its clients use, and the `Relay-Type` name of every payload.
//! `broker/README.md` ("The bus") is the manual; the tests in `tests/tests/nats.rs` and
//! `tests/tests/bus.rs` spell the same names out, as a client would, so a change here
//! that breaks the wire fails them.
//!
//! - Client subjects ([`subjects::invoke`], the `cmd` subjects, [`subjects::flight`],
//!   [`subjects::conversation`]) carry the protobuf messages of [`crate::pb`], named by
//!   [`type_name`], or their JSON forms, named by [`json_type_name`], when the request's
//!   [`CONTENT_TYPE_HEADER`] is [`JSON_CONTENT_TYPE`]; [`subjects::CMD_SNAPSHOT`] speaks
//!   JSON only ([`crate::watch`]).
//! - Node subjects ([`subjects::dispatch`], [`subjects::report`],
//!   [`subjects::node_control`]) carry JSON sealed with the node's key
//!   ([`SEALED_CONTENT_TYPE`]): [`crate::runtime`]'s `Dispatch`, `Report` and `Control`.

use prost::Name;

/// The header that names a payload: [`type_name`], [`json_type_name`], [`DISPATCH_TYPE`]...
pub const TYPE_HEADER: &str = "Relay-Type";
/// The header that carries the request token, when the broker wants one.
pub const TOKEN_HEADER: &str = "Relay-Token";
/// The header with the global event seq of a published event.
pub const SEQ_HEADER: &str = "Relay-Seq";
/// The header that says a request or reply is JSON ([`JSON_CONTENT_TYPE`]) or sealed.
pub const CONTENT_TYPE_HEADER: &str = "Content-Type";
/// A request with this content type is read as JSON and answered in JSON.
pub const JSON_CONTENT_TYPE: &str = "application/json";
/// Dispatches, reports and node controls: JSON sealed with the node's key.
pub const SEALED_CONTENT_TYPE: &str = "application/vnd.relay.sealed";

/// The `Relay-Type` of a protobuf payload: its proto package and message name
/// (`relay.v1.InvokeRequest`), so the header cannot drift from `relay.proto`.
pub fn type_name<M: Name>() -> String {
    M::full_name()
}

/// The `Relay-Type` of the JSON form of `M`: `relay.v1.InvokeReply+json`.
pub fn json_type_name<M: Name>() -> String {
    format!("{}+json", M::full_name())
}

/// The `Relay-Type` of the reply to [`subjects::CMD_SNAPSHOT`]: JSON only (agents and
/// conversations have no protobuf form), a [`crate::watch::SnapshotReply`] or an
/// `{"error"}`.
pub const SNAPSHOT_REPLY_TYPE: &str = "relay.v1.SnapshotReply+json";

/// The `Relay-Type` of a sealed [`crate::runtime::Dispatch`].
pub const DISPATCH_TYPE: &str = "relay.v1.Dispatch";
/// The `Relay-Type` of a sealed [`crate::runtime::Report`].
pub const REPORT_TYPE: &str = "relay.v1.Report";

/// The subject scheme, version 1.
pub mod subjects {
    const INVOKE: &str = "relay.v1.invoke.";
    const REPORT: &str = "relay.v1.report.";

    /// Request/reply: invoke `<agent>` (`InvokeRequest` in, `InvokeReply` out).
    pub fn invoke(agent: &str) -> String {
        format!("{INVOKE}{agent}")
    }
    /// The agent an invoke subject names; `None` for any other subject.
    pub fn invoke_target(subject: &str) -> Option<&str> {
        subject.strip_prefix(INVOKE)
    }
    pub const INVOKE_ALL: &str = "relay.v1.invoke.*";

    /// Request/reply commands (their request message in, `CommandReply` out).
    pub const CMD_POST: &str = "relay.v1.cmd.post";
    pub const CMD_STEER: &str = "relay.v1.cmd.steer";
    pub const CMD_INTERRUPT: &str = "relay.v1.cmd.interrupt";
    pub const CMD_APPROVE: &str = "relay.v1.cmd.approve";
    pub const CMD_REVERT: &str = "relay.v1.cmd.revert";
    /// Request/reply, JSON: a [`crate::api::RulesQuery`] in, the rules out.
    pub const CMD_RULES: &str = "relay.v1.cmd.rules";
    /// Request/reply, JSON: a [`super::RuleRemoveCommand`] in, the removed rule out.
    pub const CMD_RULE_REMOVE: &str = "relay.v1.cmd.rule_remove";
    /// Request/reply, JSON: a [`crate::api::UsageQuery`] in, a
    /// [`crate::api::UsageReport`] out.
    pub const CMD_USAGE: &str = "relay.v1.cmd.usage";
    /// Request/reply, JSON only: a [`crate::watch::WatchRequest`] in, a
    /// [`crate::watch::SnapshotReply`] ([`super::SNAPSHOT_REPLY_TYPE`]) out.
    pub const CMD_SNAPSHOT: &str = "relay.v1.cmd.snapshot";
    pub const CMD_ALL: &str = "relay.v1.cmd.*";

    /// Published: every update of a flight, protobuf `FlightUpdate`.
    pub fn flight(agent: &str, flight: &str) -> String {
        format!("relay.v1.flight.{agent}.{flight}")
    }
    pub const FLIGHTS_ALL: &str = "relay.v1.flight.>";
    /// The subject filter of every flight of `agent`.
    pub fn agent_flights(agent: &str) -> String {
        format!("relay.v1.flight.{agent}.*")
    }
    /// Published: the same updates as JSON, for clients without protobuf.
    pub fn flight_json(agent: &str, flight: &str) -> String {
        format!("relay.v1.json.flight.{agent}.{flight}")
    }
    /// The JetStream stream that keeps flight updates for late joiners.
    pub const FLIGHT_STREAM: &str = "RELAY_FLIGHTS";

    /// Published: every message posted to a conversation, protobuf `Message`.
    pub fn conversation(id: &str) -> String {
        format!("relay.v1.conversation.{id}")
    }

    /// Broker -> node: sealed dispatches, in [`DISPATCH_STREAM`].
    pub fn dispatch(node: &str) -> String {
        format!("relay.v1.dispatch.{node}")
    }
    pub const DISPATCH_ALL: &str = "relay.v1.dispatch.>";
    pub const DISPATCH_STREAM: &str = "RELAY_DISPATCH";

    /// Node -> broker: sealed reports, in [`REPORT_STREAM`].
    pub fn report(node: &str) -> String {
        format!("{REPORT}{node}")
    }
    /// The node a report subject names; `None` for any other subject.
    pub fn report_node(subject: &str) -> Option<&str> {
        subject.strip_prefix(REPORT)
    }
    pub const REPORT_ALL: &str = "relay.v1.report.>";
    pub const REPORT_STREAM: &str = "RELAY_REPORTS";

    /// Broker -> node, request/reply: sealed controls (steer, interrupt, approvals, wake).
    pub fn node_control(node: &str) -> String {
        format!("relay.v1.node.{node}.control")
    }
    /// Where a node's replies go: its own inbox, so NATS permissions can give it only its
    /// replies (`ops/nats/relay-users.conf`).
    pub fn node_inbox(node: &str) -> String {
        format!("_INBOX_relay_node_{node}")
    }
}

/// The JSON body of an invoke subject (`relay.v1.invoke.<agent>`): the agent is in the
/// subject; the requester is `nats` unless named.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InvokeCommand {
    pub task: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester: Option<String>,
    #[serde(default)]
    pub action: crate::domain::Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_flight: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl InvokeCommand {
    /// The invocation it asks of `agent` (the subject's last token).
    pub fn into_request(self, agent: &str) -> crate::domain::InvokeRequest {
        crate::domain::InvokeRequest {
            target: agent.to_string(),
            task: self.task,
            requester: self.requester.unwrap_or_else(|| BUS_ACTOR.into()),
            action: self.action,
            conversation: self.conversation,
            parent_flight: self.parent_flight,
            timeout_ms: self.timeout_ms,
        }
    }
}

/// Who a bus request acts as when it names nobody, and the principal its decisions are
/// recorded under ([`crate::domain::decider::bus`]).
pub const BUS_ACTOR: &str = crate::domain::decider::BUS_NAME;

/// The flags that make the bus trusted, for the refusals of an open one: a request token
/// its clients must send, or NATS credentials (a server whose users and permissions keep
/// strangers off the command subjects, as `ops/nats/relay-users.conf` does).
pub const TRUST_FLAGS: &str = "--nats-request-token-file FILE (clients send it in the Relay-Token header) or NATS credentials (--nats-creds, --nats-user with --nats-password-file, or --nats-token-file) on a server whose permissions keep strangers off relay.v1.cmd.>";

/// The JSON body of [`subjects::CMD_STEER`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SteerCommand {
    pub flight: String,
    pub text: String,
}

/// The JSON body of [`subjects::CMD_INTERRUPT`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InterruptCommand {
    pub flight: String,
}

/// The JSON body of [`subjects::CMD_APPROVE`]; recorded as decided by `nats`, or by
/// `NAME@nats` when `decided_by` names someone ([`crate::domain::decider::bus`]): the
/// bus cannot prove who published a request, so its decisions are the bus's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApproveCommand {
    pub approval: String,
    pub decision: crate::domain::ApprovalDecision,
    #[serde(default = "bus_actor")]
    pub decided_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember: Option<crate::domain::Remember>,
}

/// The JSON body of [`subjects::CMD_RULE_REMOVE`] (recorded as removed by `nats`, or
/// `NAME@nats`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuleRemoveCommand {
    pub rule: String,
    #[serde(default = "bus_actor")]
    pub removed_by: String,
}

/// The JSON reply of [`subjects::CMD_RULE_REMOVE`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuleAnswer {
    pub rule: crate::domain::Rule,
}

fn bus_actor() -> String {
    BUS_ACTOR.into()
}

/// The JSON body of [`subjects::CMD_REVERT`]: revert the flight's commit (a trusted
/// bus only; recorded as asked by `nats`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RevertCommand {
    pub flight: String,
}

/// The JSON reply of a command that answers with a flight (steer, interrupt, revert).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlightAnswer {
    pub flight: crate::domain::Flight,
}

/// The JSON reply of [`subjects::CMD_APPROVE`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApprovalAnswer {
    pub approval: crate::domain::Approval,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    #[test]
    fn type_names_come_from_the_proto() {
        assert_eq!(type_name::<pb::InvokeRequest>(), "relay.v1.InvokeRequest");
        assert_eq!(type_name::<pb::FlightUpdate>(), "relay.v1.FlightUpdate");
        assert_eq!(
            json_type_name::<pb::CommandReply>(),
            "relay.v1.CommandReply+json"
        );
    }

    #[test]
    fn subjects_parse_back() {
        assert_eq!(subjects::invoke("codex-1"), "relay.v1.invoke.codex-1");
        assert_eq!(
            subjects::invoke_target(&subjects::invoke("codex-1")),
            Some("codex-1")
        );
        assert_eq!(subjects::invoke_target(subjects::CMD_POST), None);
        assert_eq!(subjects::report_node(&subjects::report("n1")), Some("n1"));
        assert_eq!(subjects::report_node(&subjects::dispatch("n1")), None);
    }
}
