//! What the broker and a runtime (the harness-session plane) say to each other. The
//! embedded runtime gets these in-process; a remote `relay node` gets them over NATS.

use serde::{Deserialize, Serialize};

use crate::domain::{
    Agent, AgentState, ApprovalDecision, ApprovalRequest, Endpoint, Flight, FlightChange,
    Invocation, ProgramInfo,
};

/// Most bytes of text one merged delta carries, wherever streamed deltas waiting at once
/// are joined (the runtime's worker, as it takes its harness's events; the broker's
/// plane and writer): a burst is cut into slices of this, each an event under the
/// broker's `LIVE_EVENT_MAX` with room for its envelope and some escaping, so
/// subscribers take a burst from memory, in pieces, with the other flights' updates
/// between them, instead of reading every slice back from the log.
pub const DELTA_MERGE_MAX: usize = 12 * 1024;

/// Broker -> runtime: run this flight's task as a turn of the agent's session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dispatch {
    pub agent: Agent,
    pub invocation: Invocation,
    pub flight: Flight,
}

/// Broker -> runtime: act on a live turn, or forget an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "control", rename_all = "snake_case")]
pub enum Control {
    Steer {
        agent: String,
        flight: String,
        text: String,
        /// Largest the task of a flight still queued may grow to with `text` added (the
        /// broker's message limit); `None`: no limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_task_bytes: Option<usize>,
        /// Who steered (recorded with the steer's note, [`FlightChange::Note`]'s `by`).
        ///
        /// [`FlightChange::Note`]: crate::domain::FlightChange::Note
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    Interrupt {
        agent: String,
        flight: String,
    },
    /// The agent's answer to its running turn (`relay reply`): ends the turn with
    /// `text` as its output, where the harness ends turns by reply.
    Reply {
        agent: String,
        flight: String,
        text: String,
    },
    Approval {
        agent: String,
        flight: String,
        harness_request_id: String,
        decision: ApprovalDecision,
    },
    /// The agent was removed: stop its session, and remove its worktree (the branch
    /// stays) unless it holds uncommitted work and `force` is not set.
    AgentRemoved {
        agent: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// Revert flight `flight`'s changes (`start..head` on the agent's branch) with a
    /// commit of its own (`relay revert`), between turns; reported as
    /// [`FlightChange::Reverted`].
    Revert {
        agent: String,
        flight: String,
        commit: Box<crate::domain::FlightCommit>,
        by: String,
    },
    /// Start the agent's session now (`relay agent wake`, `keep_warm`), not at its first
    /// turn.
    Wake {
        spec: Box<Agent>,
    },
}

impl Control {
    pub fn agent(&self) -> &str {
        match self {
            Control::Steer { agent, .. }
            | Control::Interrupt { agent, .. }
            | Control::Reply { agent, .. }
            | Control::Approval { agent, .. }
            | Control::Revert { agent, .. }
            | Control::AgentRemoved { agent, .. } => agent,
            Control::Wake { spec } => &spec.spec.name,
        }
    }
}

/// Runtime -> broker: what happened. Reports of one agent arrive in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "report", rename_all = "snake_case")]
pub enum Report {
    Flight {
        flight: String,
        change: FlightChange,
    },
    Agent {
        agent: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<AgentState>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<Endpoint>,
        /// Why the agent is in `state` (a session that could not start: the error, with
        /// the exit status and stderr tail); see [`Agent::state_reason`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// What the agent's program said of itself as its session started; see
        /// [`Agent::program`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        program: Option<ProgramInfo>,
        /// The agent's worktree, as made, recreated or moved on by a commit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worktree: Option<Box<crate::domain::WorktreeState>>,
    },
    ThreadLost {
        agent: String,
        old_thread_id: String,
        new_thread_id: String,
        reason: String,
    },
    ApprovalRequested {
        agent: String,
        request: ApprovalRequest,
    },
    /// Approvals of this flight still pending are closed as expired: the turn ended, or
    /// the harness withdrew its request. `by` is recorded as who closed them (default
    /// `relay:turn-ended`).
    ApprovalsExpired {
        flight: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        /// Only the approval of this harness request (default: all of the flight's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request: Option<String>,
    },
}
