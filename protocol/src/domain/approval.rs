//! Approval requests a harness makes, and how they are decided.

use serde::{Deserialize, Serialize};

use crate::names::wire_enum;

wire_enum! {
    pub enum ApprovalKind("approval kind") {
        Command = "command",
        FileChange = "file_change",
        Other = "other",
    }
}

wire_enum! {
    /// On the command line Codex's own spelling `acceptForSession` is taken too.
    pub enum ApprovalDecision("decision") {
        Accept = "accept",
        AcceptForSession = "accept_for_session" | "acceptForSession",
        Decline = "decline",
        Cancel = "cancel",
    }
}

wire_enum! {
    pub enum ApprovalState("approval state") {
        Pending = "pending",
        Decided = "decided",
        /// Its turn ended (or its session died) before anyone decided.
        Expired = "expired",
    }
}

/// Who decides an approval, as its record names them: a person or client by its own
/// name, and the identities only Relay records, from this one list: its approval
/// policies (`policy:...`), remembered rules (`rule:<id>`), Relay itself (`relay:restart`, `relay:turn-ended`), a
/// harness settling its own request (`codex:withdrawn`, `claude:withdrawn`... for every
/// harness, by short and wire name), a dashboard login (`alice@dashboard`) and a
/// decision made over the bus (`alice@nats`). A client may not claim any of
/// them, so the record always tells who really decided. Every surface checks against
/// [`reserved`]: the broker's HTTP and NATS services and the CLI.
pub mod decider {
    use crate::domain::Harness;

    /// An agent's approval policy decided: `policy:auto-accept:RULE`...
    pub const POLICY: &str = "policy:";
    /// Relay decided on its own: `relay:restart`, `relay:turn-ended`.
    pub const RELAY: &str = "relay:";
    /// A remembered decision decided: `rule:<id>` (see [`crate::domain::Rule`]).
    pub const RULE: &str = "rule:";
    /// The suffix of a dashboard login's decisions.
    pub const DASHBOARD: &str = "@dashboard";
    /// The suffix of decisions made over the bus: NATS does not say who published a
    /// request, so a name given there is what the bus claims, never the person itself.
    pub const BUS: &str = "@nats";
    /// The bus's own name: who a bus request acts as when it names nobody (the bus
    /// module's `BUS_ACTOR` is this).
    pub const BUS_NAME: &str = "nats";
    /// The operator's own name: who an HTTP request made with the operator's token
    /// acts as when it names nobody.
    pub const OPERATOR: &str = "operator";
    /// Who Relay's own messages are from (a refused mention's answer).
    pub const RELAY_AUTHOR: &str = "relay";
    /// The whole names only Relay and the operator's token act as: no agent is named
    /// one, and an open bus's stranger speaks as none (but the bus's own [`BUS_NAME`]).
    /// A decision may still be `operator` (the operator's token) or `nats` (the bus's),
    /// so [`reserved`] does not hold them: [`reserved_name`] does.
    pub const NAMES: [&str; 3] = [OPERATOR, RELAY_AUTHOR, BUS_NAME];

    /// Why `name` may not name an agent or speak for a stranger: one of [`NAMES`]
    /// (without case and surrounding space) or a decider [`reserved`] for Relay.
    pub fn reserved_name(name: &str) -> Option<String> {
        let lower = name.trim().to_ascii_lowercase();
        if let Some(n) = NAMES.iter().find(|n| **n == lower) {
            return Some(format!("`{n}` is one of Relay's own identities"));
        }
        reserved(name, false)
    }

    /// A harness withdrew its own request.
    pub fn withdrawn(harness: Harness) -> String {
        format!("{}:withdrawn", harness.short_name())
    }

    /// How a dashboard login `name`'s decisions are recorded.
    pub fn dashboard(name: &str) -> String {
        format!("{name}{DASHBOARD}")
    }

    /// How a decision made over the bus in the name of `name` is recorded: the bus's
    /// own name ([`BUS_NAME`]) as it is, any other as `name@nats`, so the record never
    /// names the operator (or anyone) for what a bus client decided.
    pub fn bus(name: &str) -> String {
        if name == BUS_NAME {
            name.to_string()
        } else {
            format!("{name}{BUS}")
        }
    }

    /// Why `decided_by` is one of Relay's own identities (compared without case and
    /// leading space), or `None` when a client may use it. `dashboard`: the decision
    /// comes from a dashboard login, which may use its own `@dashboard` name.
    pub fn reserved(decided_by: &str, dashboard: bool) -> Option<String> {
        let lower = decided_by.trim_start().to_ascii_lowercase();
        // Asked of every request over the bus: the prefixes are compared, not made.
        let fixed = [
            (POLICY, "an agent's approval policy"),
            (RELAY, "Relay"),
            (RULE, "a remembered rule"),
        ];
        if let Some((prefix, who)) = fixed.iter().find(|(p, _)| lower.starts_with(p)) {
            return Some(format!(
                "`{prefix}` names a decision of {who}, made on its own"
            ));
        }
        let harness = Harness::ALL
            .iter()
            .flat_map(|h| [h.short_name(), h.as_str()])
            .find(|name| {
                lower
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(':'))
            });
        if let Some(name) = harness {
            return Some(format!(
                "`{name}:` names a decision of a harness, made on its own"
            ));
        }
        if !dashboard && lower.trim_end().ends_with(DASHBOARD) {
            return Some(format!(
                "`{DASHBOARD}` names a decision made on the dashboard by its login"
            ));
        }
        if lower.trim_end().ends_with(BUS) {
            return Some(format!("`{BUS}` names a decision made over the bus"));
        }
        None
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub flight: String,
    pub kind: ApprovalKind,
    /// The command line, or a description of the change.
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The harness's own id for the request (JSON-RPC id, request_id...).
    pub harness_request_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub agent: String,
    #[serde(flatten)]
    pub request: ApprovalRequest,
    pub state: ApprovalState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ApprovalDecision>,
    /// Who or what decided: `operator`, `policy:auto-accept:<rule>`, an agent name...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    pub created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<u64>,
    /// The rule this decision was remembered as (`--remember`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remembered: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::decider::{reserved, reserved_name};

    #[test]
    fn relays_own_deciders_are_reserved_and_a_clients_name_is_not() {
        let said = |name: &str| reserved(name, false).unwrap_or_default();
        assert_eq!(
            said(" Policy:read"),
            "`policy:` names a decision of an agent's approval policy, made on its own"
        );
        assert_eq!(
            said("rule:3"),
            "`rule:` names a decision of a remembered rule, made on its own"
        );
        // A harness, by its short name or its whole one, in any case.
        assert_eq!(
            said("Codex:x"),
            "`codex:` names a decision of a harness, made on its own"
        );
        assert_eq!(
            said("codex_app_server:x"),
            "`codex_app_server:` names a decision of a harness, made on its own"
        );
        assert_eq!(
            said("opencode:1"),
            "`opencode:` names a decision of a harness, made on its own"
        );
        assert_eq!(
            said("ann@dashboard"),
            "`@dashboard` names a decision made on the dashboard by its login"
        );
        assert_eq!(reserved("ann@dashboard", true), None);
        assert_eq!(
            said("bob@nats"),
            "`@nats` names a decision made over the bus"
        );
        // A name that only starts like a harness's is a client's.
        for free in ["codexter", "codex", "ann", "pilot:1"] {
            assert_eq!(reserved(free, false), None, "{free}");
        }
        assert!(reserved_name("RELAY").is_some());
    }
}
