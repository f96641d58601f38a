//! Bodies of the local HTTP API and the typed error every interface (HTTP, NATS, CLI)
//! reports. See `broker/README.md` for the routes.

use serde::{Deserialize, Serialize};

use crate::domain::{ApprovalDecision, Flight, FlightChange, Invocation, Message};
use crate::names::wire_enum;

wire_enum! {
    /// A stable, machine-readable error code. Clients match on this, never on the text.
    pub enum ErrorCode("error code") {
        InvalidRequest = "invalid_request",
        Unauthorized = "unauthorized",
        PayloadTooLarge = "payload_too_large",
        UnknownAgent = "unknown_agent",
        UnknownConversation = "unknown_conversation",
        UnknownFlight = "unknown_flight",
        UnknownMessage = "unknown_message",
        UnknownApproval = "unknown_approval",
        AgentExists = "agent_exists",
        ConversationExists = "conversation_exists",
        IllegalTransition = "illegal_transition",
        FlightTerminal = "flight_terminal",
        ApprovalClosed = "approval_closed",
        /// A queue is full; retry later.
        Overloaded = "overloaded",
        /// The agent's session could not do what was asked (no live turn to steer...).
        Unavailable = "unavailable",
        DepthLimit = "depth_limit",
        Cycle = "cycle",
        /// No such route (HTTP) or subject.
        NotFound = "not_found",
        /// The broker's disk is (nearly) full: the write was refused and nothing of it
        /// stored; reads go on, and writes resume once space is freed.
        StorageFull = "storage_full",
        /// The agent (or the flight tree) used up its budget; the message names the
        /// budget and when it resets.
        BudgetExceeded = "budget_exceeded",
        /// No such remembered rule.
        UnknownRule = "unknown_rule",
        Internal = "internal",
    }
}

impl ErrorCode {
    /// HTTP status for this code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::UnknownAgent
            | ErrorCode::UnknownConversation
            | ErrorCode::UnknownFlight
            | ErrorCode::UnknownMessage
            | ErrorCode::UnknownApproval
            | ErrorCode::UnknownRule
            | ErrorCode::NotFound => 404,
            ErrorCode::AgentExists
            | ErrorCode::ConversationExists
            | ErrorCode::IllegalTransition
            | ErrorCode::FlightTerminal
            | ErrorCode::ApprovalClosed
            | ErrorCode::DepthLimit
            | ErrorCode::Cycle => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::Overloaded | ErrorCode::BudgetExceeded => 429,
            ErrorCode::Unavailable => 503,
            // "Insufficient Storage" (RFC 4918).
            ErrorCode::StorageFull => 507,
            ErrorCode::Internal => 500,
        }
    }
}

/// The error body every interface returns: `{"error":{"code":..,"message":..}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ApiError,
}

/// A node's answer to a control (`relay.v1.node.<node>.control`): `{"ok":true}`, or the
/// error body every interface returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ControlAnswer {
    Refused(ErrorBody),
    Done { ok: bool },
}

impl ControlAnswer {
    pub fn done() -> ControlAnswer {
        ControlAnswer::Done { ok: true }
    }

    pub fn refused(code: ErrorCode, message: impl Into<String>) -> ControlAnswer {
        ControlAnswer::Refused(ErrorBody {
            error: ApiError {
                code,
                message: message.into(),
            },
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ApiError {}

/// Reply to an invocation: the ids to follow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvokeAccepted {
    pub invocation: Invocation,
    pub flight: Flight,
}

/// `GET /v1/flights/{id}/tree`: the agent-to-agent tree a flight belongs to, from its
/// root: each flight with the flights asked from it, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlightTree {
    pub flight: Flight,
    #[serde(default)]
    pub children: Vec<FlightTree>,
}

/// Body of `POST /v1/flights/{id}/updates`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateFlight {
    #[serde(flatten)]
    pub change: FlightChange,
}

/// Result of a flight update: `applied` is false when it was an identical (skipped) one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpdateResult {
    pub applied: bool,
    pub flight: Flight,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteerRequest {
    pub text: String,
}

/// `POST /v1/flights/{id}/reply`: the agent's answer to its running flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyRequest {
    pub text: String,
}

/// `POST /v1/agents`'s answer: the registered agent (its fields flat, as `GET
/// /v1/agents/{name}` answers) and what the checks before accepting it found worth
/// saying without refusing it (credentials not found, a program slow to answer
/// `--version`, an agent on another node whose host was not checked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentAdded {
    #[serde(flatten)]
    pub agent: crate::domain::Agent,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `DELETE /v1/agents/{name}`'s query: `force` removes the agent's worktree even when it
/// holds uncommitted work (committed on its branch first, so nothing is lost).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveQuery {
    #[serde(default)]
    pub force: bool,
}

/// `POST /v1/agents/{name}/fork`: a new agent `name`, forked from the path's agent at
/// flight `at` (default: its last).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkRequest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// `GET /v1/flights/{id}/diff`: what a flight changed (its commit, with the patch);
/// `commit` is `None` for a flight that changed nothing or whose agent has no worktree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlightDiff {
    pub flight: String,
    pub agent: String,
    #[serde(default)]
    pub commit: Option<crate::domain::FlightCommit>,
}

/// `GET /v1/agents/{name}/diff`: an agent's branch against its base.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentDiff {
    pub agent: String,
    pub worktree: crate::domain::WorktreeState,
    #[serde(default)]
    pub files: Vec<crate::domain::FileChange>,
    pub added: u64,
    pub removed: u64,
    /// `git diff BASE...BRANCH`, up to [`crate::domain::MAX_RECORDED_PATCH`] bytes.
    pub patch: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub patch_truncated: bool,
}

/// `relay doctor`'s look at the worktrees Relay made: one that no agent owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrphanWorktree {
    pub path: String,
    pub repo: String,
    pub branch: String,
    /// The agent it was made for (removed, or registered again with another worktree).
    pub agent: String,
    /// Why it is an orphan, for a person.
    pub why: String,
    /// What `--fix` did with it (`None`: not fixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed: Option<String>,
}

/// `GET /v1/agents/{name}/peek`: what a tmux agent's pane shows now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peek {
    pub agent: String,
    pub pane: String,
    /// How a person looks at the pane (`tmux -L relay@tm-1 attach -t %3`).
    pub attach: String,
    /// The pane's last lines as plain text (no escape codes), oldest first.
    pub lines: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecideApproval {
    pub decision: ApprovalDecision,
    #[serde(default = "default_decider")]
    pub decided_by: String,
    /// Remember the decision as a rule (`--remember SCOPE [--any-arg N]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remember: Option<crate::domain::Remember>,
}

/// `GET /v1/rules`'s query: the rules that apply to `agent` (all, without).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RulesQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// `POST /v1/agents/{name}`: what `relay agent set` changes. A field left out stays.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSettings {
    /// The new budget; `Some` of an empty budget removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::domain::Budget>,
}

/// `GET /v1/usage`'s query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageQuery {
    #[serde(default)]
    pub by: crate::domain::UsageBy,
    /// Flights created at or after this time (ms since the epoch); all without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Only this agent's flights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// `relay usage`: totals per group, largest cost first (then tokens, then key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    pub by: crate::domain::UsageBy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    pub rows: Vec<UsageRow>,
    /// All rows added up.
    pub total: crate::domain::UsageTotals,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// The agent, conversation id, root flight id, `YYYY-MM-DD` or node.
    pub key: String,
    #[serde(flatten)]
    pub totals: crate::domain::UsageTotals,
}

/// An agent's budget and what it has used of it (`agent show`, `GET
/// /v1/agents/{name}/budget`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetStatus {
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::domain::Budget>,
    /// The agent's usage today (UTC).
    pub today: crate::domain::UsageTotals,
    /// When today's limits reset: the next UTC midnight (ms since the epoch).
    pub resets_at: u64,
}

fn default_decider() -> String {
    crate::domain::decider::OPERATOR.to_string()
}

/// Answer to a posted message (`POST /v1/messages`, `relay.v1.cmd.post` in JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagePosted {
    pub message: Message,
    /// The consult flights its `@mentions` started, one per mentioned agent (queued, in
    /// the order of the mentions). Their replies are posted in reply to the message.
    #[serde(default)]
    pub flights: Vec<Flight>,
    /// Mentioned agents that were not consulted because a loop rule refused it (a cycle,
    /// a chain too deep). The message is posted all the same; Relay also answers it in
    /// the conversation with a `system` message that says why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<MentionRefused>,
    /// Mentioned names that are not registered agents (in the order mentioned): nobody
    /// was asked, the mention is text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
    /// Mentions the mention rules did not count, and why: the author, a mention inside
    /// code or on a quoted line (listed only when it names an agent), an agent's reply
    /// repeating a mention of the message it answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<MentionSkipped>,
}

/// A mention that the mention rules did not count, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MentionSkipped {
    pub name: String,
    pub reason: crate::domain::MentionSkip,
}

/// A mention that did not start a consult, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MentionRefused {
    pub agent: String,
    pub error: ApiError,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub data_dir: String,
    pub last_seq: u64,
    pub agents: u64,
    pub flights: u64,
    pub live_flights: u64,
    pub nats: NatsStatus,
    pub uptime_ms: u64,
    /// Durable flushes of the database since this broker started.
    #[serde(default)]
    pub flushes: u64,
    /// The data dir's filesystem, when the broker watches its free space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskStatus>,
}

/// The free space of the broker's data dir: under `reserve_bytes`, writes are refused
/// (`storage_full`) until space is freed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskStatus {
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    pub full: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum NatsStatus {
    Disabled,
    /// `url` is empty (and left out) for an agent's token: see [`NatsStatus::without_address`].
    Connected {
        #[serde(default, skip_serializing_if = "String::is_empty")]
        url: String,
    },
    Disconnected {
        #[serde(default, skip_serializing_if = "String::is_empty")]
        url: String,
        since_ms: u64,
        /// Why the last connection attempt failed, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

impl NatsStatus {
    /// The state without where the bus is: an agent's token learns whether the bus is
    /// up, not its address (on an open bus, the address is all a stranger needs).
    pub fn without_address(self) -> NatsStatus {
        match self {
            NatsStatus::Disabled => NatsStatus::Disabled,
            NatsStatus::Connected { .. } => NatsStatus::Connected { url: String::new() },
            NatsStatus::Disconnected {
                since_ms, error, ..
            } => NatsStatus::Disconnected {
                url: String::new(),
                since_ms,
                // A connection error names the address too.
                error: error.map(|_| "not reachable".to_string()),
            },
        }
    }
}

#[cfg(test)]
mod control_answer_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The node's answers keep the wire they had as hand-built JSON.
    #[test]
    fn control_answers_read_and_write_the_same_json_as_before() {
        let done = serde_json::to_value(ControlAnswer::done()).unwrap();
        assert_eq!(done, serde_json::json!({"ok": true}));
        let refused = ControlAnswer::refused(ErrorCode::Unauthorized, "bad seal");
        assert_eq!(
            serde_json::to_value(&refused).unwrap(),
            serde_json::json!({"error": {"code": "unauthorized", "message": "bad seal"}})
        );
        for (wire, answer) in [
            (r#"{"ok":true}"#, ControlAnswer::done()),
            (
                r#"{"error":{"code":"payload_too_large","message":"m"}}"#,
                ControlAnswer::refused(ErrorCode::PayloadTooLarge, "m"),
            ),
        ] {
            assert_eq!(serde_json::from_str::<ControlAnswer>(wire).unwrap(), answer);
        }
        assert!(serde_json::from_str::<ControlAnswer>(r#"{"nope":1}"#).is_err());
    }
}

/// `POST /v1/login` (the operator's token only): a one-time link that logs a browser in
/// to the dashboard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// Who will use the page: its approvals are recorded as decided by `NAME@dashboard`
    /// (default `operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A one-time login link: open `url` once, within `expires_in_secs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoginLink {
    pub url: String,
    /// Where the page is once logged in (the link's URL without its code).
    pub dashboard: String,
    pub expires_in_secs: u64,
}

/// `GET /v1/login`: who the caller is, and the name its decisions are recorded under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoginInfo {
    pub name: String,
    pub decided_by: String,
    /// `dashboard` (a login link's cookie), `operator` or `agent` (a bearer token).
    pub via: String,
}

/// No parameters: the query of a `GET` that takes none, the body of a `POST` that takes
/// none (`{}`), the answer that says nothing but success.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// The query of the event log and of a flight's updates: after a seq (global for
/// events, per flight for updates), at most `limit`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AfterQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// `GET /v1/flights`: flights by agent, state, time or text, newest last, at most
/// `limit` (100).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlightsQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<crate::domain::FlightState>,
    /// Only flights not in a terminal state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub live: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Only flights created since then: ms since the epoch, a duration back from now
    /// (`30m`, `24h`, `7d`, `2w`) or a UTC date (`2026-11-27`, from its midnight), as
    /// [`crate::clock::parse_since_or_ms`] reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Only flights whose id, agent, requester, task or output holds this text (any
    /// case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
}

/// `GET /v1/approvals`: `pending` (default), `decided`, `expired` or `all`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalsQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// `GET /v1/conversations/{id}/messages`: the last `limit` messages (50).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagesQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// `GET /v1/agents/{name}/peek`: the pane's last `lines` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeekQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<usize>,
}

/// The replays' query: the entries after global seq `from_seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_seq: Option<u64>,
}

/// What `relay up` writes to `<data-dir>/api.json` (mode 0600): how clients on the same
/// host reach it (`relay_client` reads it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiInfo {
    pub url: String,
    pub token: String,
    pub pid: u32,
}

/// The name of the [`ApiInfo`] file in a broker's data dir.
pub const API_FILE: &str = "api.json";
