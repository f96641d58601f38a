//! The normalised harness event stream: what every adapter (Codex app-server, Claude
//! stream-json, Pi RPC, tmux) turns its own wire protocol into. The runtime maps these to
//! flight changes; nothing above the adapters sees a harness's own wire.

use serde::{Deserialize, Serialize};

use crate::domain::{ApprovalDecision, ApprovalKind};
// Flight updates carry it too, so it lives with them; adapters name it from here.
pub use crate::domain::ItemKind;

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TurnOutcome {
    Completed {
        /// The final assistant text of the turn (may be empty).
        text: String,
    },
    Failed {
        error: String,
    },
    Interrupted,
}

/// One normalised event from a harness session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum HarnessEvent {
    TurnStarted {
        turn_id: String,
    },
    TextDelta {
        turn_id: String,
        item_id: String,
        delta: String,
    },
    ItemStarted {
        turn_id: String,
        item_id: String,
        kind: ItemKind,
    },
    ItemCompleted {
        turn_id: String,
        item_id: String,
        kind: ItemKind,
        /// The item's final text, where it has one (agent message, command line...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// A command's exit status, where the harness reports one (see
        /// [`crate::domain::FlightChange::Item`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    CommandOutputDelta {
        turn_id: String,
        item_id: String,
        delta: String,
    },
    PlanUpdated {
        turn_id: String,
        text: String,
    },
    DiffUpdated {
        turn_id: String,
        diff: String,
    },
    /// The turn's usage so far, a running total ([`crate::domain::TokenUsage`]'s
    /// conventions: input includes cached, output includes reasoning).
    TokenUsage {
        turn_id: String,
        #[serde(flatten)]
        usage: crate::domain::TokenUsage,
    },
    /// The harness asks permission; answer with the session's `respond_approval`.
    ApprovalRequested {
        turn_id: String,
        request_id: String,
        kind: ApprovalKind,
        detail: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// The harness reports a request as settled (answered or abandoned).
    ApprovalResolved {
        request_id: String,
    },
    TurnCompleted {
        turn_id: String,
        outcome: TurnOutcome,
    },
    /// A warning or transient error the harness reports; the turn goes on.
    Warning {
        message: String,
    },
    /// The harness cannot reach or use its model and tries again (Codex's `error` with
    /// `willRetry`, Claude Code's `api_retry`, Pi's auto-retry): the turn goes on, but
    /// makes no progress. Shown like a warning; it also starts the runtime's stall
    /// watchdog, which a plain warning does not.
    Retrying {
        message: String,
    },
    /// The child process exited. Every turn in progress has failed.
    ProcessExited {
        /// Exit code, or `None` when killed by a signal.
        code: Option<i32>,
        signal: Option<i32>,
        /// The last lines the child wrote on stderr.
        stderr_tail: String,
    },
}

/// The answer to an approval request, as the runtime hands it to an adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalAnswer {
    pub decision: ApprovalDecision,
}
