//! Ports: what the domain needs from the runtime, as traits that the adapters implement.
//!
//! The domain ([`crate::broker`], [`crate::ops`]) calls these; [`crate::plane`] implements
//! them over the embedded runtime and the nodes; the interfaces ([`crate::http`],
//! [`crate::nats`]) pass them on. No port depends on an adapter, so the module graph
//! points one way (see the crate's header).

use futures::future::BoxFuture;
use relay_protocol::api::Peek;
use relay_protocol::domain::{Agent, AgentSpec, Approval, Flight};

use crate::error::BrokerError;

/// What the runtime offers the API: live control of a flight's turn, waking an agent,
/// what an agent's screen shows, and the checks of an agent before it is registered.
pub trait FlightControl: Send + Sync + 'static {
    fn steer(&self, flight: Flight, text: String) -> BoxFuture<'static, Result<(), BrokerError>>;
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
    fn check_agent(&self, spec: AgentSpec) -> BoxFuture<'static, Result<Vec<String>, BrokerError>>;
}
