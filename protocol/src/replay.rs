//! Replays: a flight, an agent's session or a conversation read back from the event log
//! as one document (`relay replay`, `GET /v1/replay/...`).
//!
//! A replay is a function of the log alone: every entry carries the global seq of the
//! event it comes from (the number `relay events` shows), states are those the log
//! recorded, and nothing in it is read from a clock or a hash map. The same log gives
//! the same bytes, before and after any restart. `from_seq` keeps the entries with a
//! seq above it; a turn begun at or before it still shows who asked what (its own `seq`
//! says when), with only its later entries.
//!
//! Shapes: a [`TurnReplay`] is one flight (`relay replay flight`); an [`AgentReplay`]
//! is an agent's registrations, lost sessions and turns in log order; a
//! [`ConversationReplay`] is its messages and the flights they started.

use serde::{Deserialize, Serialize};

use crate::domain::{
    Action, ApprovalDecision, ApprovalKind, ApprovalState, ConversationSpec, FlightChange,
    FlightState, Harness, Invocation, Message,
};

/// Tokens a turn used, as its harness last reported them (a running total per turn).
pub use crate::domain::TokenUsage as Usage;

/// One turn: a flight, who asked for it and what happened in it, in log order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnReplay {
    pub flight: String,
    pub agent: String,
    /// Seq of the event that created the flight (the request).
    pub seq: u64,
    pub at: u64,
    /// Who asked what, as asked: requester, task, conversation, parent flight, depth.
    pub invocation: Invocation,
    /// The flight's state after its last recorded update.
    pub state: FlightState,
    /// Why it failed or was cancelled (`null` otherwise).
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The last token usage the harness reported (`null`: none).
    #[serde(default)]
    pub usage: Option<Usage>,
    pub entries: Vec<TurnEntry>,
}

/// One step of a turn: a flight update or an approval event. Consecutive text deltas
/// are joined into one entry, and so is consecutive output of one command: `seq` is
/// then the first piece's and `last_seq` the last's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnEntry {
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<u64>,
    pub at: u64,
    #[serde(flatten)]
    pub step: TurnStep,
}

/// What a [`TurnEntry`] holds: `kind` names it (`delta`, `item`, `command_output`,
/// `state`, `usage`... as in a flight update, or `approval_requested`,
/// `approval_decided`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TurnStep {
    Approval(ApprovalStep),
    Update(FlightChange),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ApprovalStep {
    /// The harness asked to run a command or change files.
    ApprovalRequested {
        approval: String,
        approval_kind: ApprovalKind,
        /// The command line, or a description of the change.
        detail: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Decided (`state: decided`, with the decision), or closed undecided when its turn
    /// ended (`state: expired`); `decided_by` says who or what.
    ApprovalDecided {
        approval: String,
        state: ApprovalState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decision: Option<ApprovalDecision>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decided_by: Option<String>,
    },
}

/// An agent's session across turns: `GET /v1/replay/agents/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentReplay {
    pub agent: String,
    /// In log order (a turn by the seq of its request).
    pub entries: Vec<AgentEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AgentEntry {
    /// The agent was registered (again, after a removal: the name's history goes on).
    Registered {
        seq: u64,
        at: u64,
        harness: Harness,
        cwd: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        /// The worktree it was registered with (made by this host's runtime; a node's
        /// agent's is made at its first session: see its turns' commits).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worktree: Option<crate::domain::WorktreeState>,
        /// Who added it ([`crate::event::Event::by`]), where recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    Removed {
        seq: u64,
        at: u64,
        /// Who removed it, where recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// The stored session could not be resumed and a new one replaced it: it does not
    /// remember the turns before. Found when a turn wakes the agent, so it follows that
    /// turn's request in the log.
    ThreadLost {
        seq: u64,
        at: u64,
        old_thread_id: String,
        new_thread_id: String,
        reason: String,
    },
    Turn(Box<TurnReplay>),
}

impl AgentEntry {
    /// The seq of the event the entry starts at.
    pub fn seq(&self) -> u64 {
        match self {
            AgentEntry::Registered { seq, .. }
            | AgentEntry::Removed { seq, .. }
            | AgentEntry::ThreadLost { seq, .. } => *seq,
            AgentEntry::Turn(turn) => turn.seq,
        }
    }
}

/// Who said what in a conversation, and the flights it started:
/// `GET /v1/replay/conversations/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConversationReplay {
    pub conversation: ConversationSpec,
    pub entries: Vec<ConversationEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConversationEntry {
    /// A message posted (a reply names the message it answers in `reply_to`).
    Message { seq: u64, message: Message },
    /// A message started a flight: its agent, and how the flight stands (as of the
    /// last update recorded; `relay replay flight` shows the turn).
    FlightStarted {
        seq: u64,
        at: u64,
        flight: String,
        agent: String,
        requester: String,
        action: Action,
        request_message: String,
        state: FlightState,
        #[serde(default)]
        error: Option<String>,
    },
}

impl ConversationEntry {
    pub fn seq(&self) -> u64 {
        match self {
            ConversationEntry::Message { seq, .. }
            | ConversationEntry::FlightStarted { seq, .. } => *seq,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::domain::{ItemKind, ItemPhase};

    /// Updates and approvals share one `kind` field, and read back as what they were.
    #[test]
    fn turn_entries_round_trip_through_one_kind_field() {
        let entries = vec![
            TurnEntry {
                seq: 7,
                last_seq: Some(9),
                at: 1,
                step: TurnStep::Update(FlightChange::Delta { text: "hi".into() }),
            },
            TurnEntry {
                seq: 10,
                last_seq: None,
                at: 2,
                step: TurnStep::Update(FlightChange::Item {
                    item_id: "i".into(),
                    item_kind: ItemKind::CommandExecution,
                    phase: ItemPhase::Started,
                    text: None,
                    exit_code: None,
                }),
            },
            TurnEntry {
                seq: 11,
                last_seq: None,
                at: 3,
                step: TurnStep::Approval(ApprovalStep::ApprovalDecided {
                    approval: "apr_1".into(),
                    state: ApprovalState::Decided,
                    decision: Some(ApprovalDecision::Accept),
                    decided_by: Some("operator".into()),
                }),
            },
        ];
        let json = serde_json::to_value(&entries).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"seq": 7, "last_seq": 9, "at": 1, "kind": "delta", "text": "hi"},
                {"seq": 10, "at": 2, "kind": "item", "item_id": "i",
                 "item_kind": "command_execution", "phase": "started"},
                {"seq": 11, "at": 3, "kind": "approval_decided", "approval": "apr_1",
                 "state": "decided", "decision": "accept", "decided_by": "operator"},
            ])
        );
        let back: Vec<TurnEntry> = serde_json::from_value(json).unwrap();
        assert_eq!(back, entries);
    }
}
