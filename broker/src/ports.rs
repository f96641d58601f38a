//! Ports: what the domain needs from the runtime, as traits that the adapters implement.
//!
//! The domain ([`crate::broker`], [`crate::ops`]) calls these; [`crate::plane`] implements
//! them over the embedded runtime and the nodes; the interfaces ([`crate::http`],
//! [`crate::nats`]) pass them on. No port depends on an adapter, so the module graph
//! points one way (see the crate's header).

use futures::future::BoxFuture;
use relay_protocol::api::{AgentDiff, Peek};
use relay_protocol::domain::{Agent, AgentSpec, Approval, Flight, FlightCommit, WorktreeState};

use crate::error::BrokerError;

/// What the runtime offers the API: live control of a flight's turn, waking an agent,
/// what an agent's screen shows, and the checks of an agent before it is registered.
pub trait FlightControl: Send + Sync + 'static {
    /// `by`: who steered, recorded with the steer's note.
    fn steer(
        &self,
        flight: Flight,
        text: String,
        by: Option<String>,
    ) -> BoxFuture<'static, Result<(), BrokerError>>;
    fn interrupt(&self, flight: Flight) -> BoxFuture<'static, Result<(), BrokerError>>;
    /// Passes the agent's answer to its running turn (`relay reply`) to the harness.
    fn reply(&self, flight: Flight, text: String) -> BoxFuture<'static, Result<(), BrokerError>>;
    /// Passes a decided approval on to the harness that asked.
    fn approval_decided(&self, approval: Approval) -> BoxFuture<'static, Result<(), BrokerError>>;
    /// Starts an agent's session now instead of at its first turn.
    fn wake(&self, agent: Agent) -> BoxFuture<'static, Result<(), BrokerError>>;
    /// The last `lines` lines an agent's screen (a tmux pane) shows now, read by the
    /// runtime that serves it (`relay agent peek`).
    fn peek(&self, agent: Agent, lines: usize) -> BoxFuture<'static, Result<Peek, BrokerError>>;
    /// Checks, before it is registered, what the runtime that would serve the agent can
    /// check of it (its directory, its program, its credentials): `Ok` with warnings
    /// worth saying, or why it cannot be accepted ([`BrokerError::AgentCheck`]).
    /// An agent with a worktree ([`AgentSpec::worktree`]) served here gets it made now
    /// ([`AgentChecked::worktree`]); a node's agent's is made by the node.
    fn check_agent(&self, spec: AgentSpec)
        -> BoxFuture<'static, Result<AgentChecked, BrokerError>>;
    /// The files agent's worktree holds uncommitted, read by the runtime that serves it
    /// (empty: clean, no worktree, or a node's agent: its node keeps a dirty worktree
    /// rather than lose work).
    fn worktree_dirty(&self, agent: Agent) -> BoxFuture<'static, Result<Vec<String>, BrokerError>>;
    /// The agent's branch against its base, read on its runtime's host (refused for a
    /// node's agent, with where to run git instead).
    fn agent_diff(&self, agent: Agent) -> BoxFuture<'static, Result<AgentDiff, BrokerError>>;
    /// Asks the runtime that serves `flight`'s agent to revert its commit `commit`, as
    /// `by` asked: [`Reverting::Done`] once this host's runtime did (its report of the
    /// revert is on its way), [`Reverting::Sent`] when it went to a node.
    fn revert(
        &self,
        flight: Flight,
        commit: FlightCommit,
        by: String,
    ) -> BoxFuture<'static, Result<Reverting, BrokerError>>;
}

/// What [`FlightControl::check_agent`] found: warnings worth saying, and the worktree it
/// made for the agent (to be recorded with its registration).
#[derive(Debug, Clone, Default)]
pub struct AgentChecked {
    pub warnings: Vec<String>,
    pub worktree: Option<WorktreeState>,
}

/// How far a revert got ([`FlightControl::revert`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reverting {
    /// This host's runtime made the revert commit.
    Done,
    /// Sent to node `node`, which makes it (and reports it) when it gets it.
    Sent { node: String },
}
