//! Runtimes on other hosts, over NATS JetStream.
//!
//! Broker -> node: a [`Dispatch`](relay_protocol::runtime::Dispatch) is published to the
//! `RELAY_DISPATCH` stream on `relay.v1.dispatch.<node>` with `Nats-Msg-Id` = the
//! invocation id and a tag keyed with the bus key (JetStream drops a second publish of
//! the same invocation; no client can take the id first). The node
//! reads it with a durable consumer and acknowledges it once the turn has started (or the
//! flight ended); the start is first recorded in the node's sled, so a redelivery (after
//! a node crash, a NATS restart) never runs a turn twice, and a dispatch whose turn never
//! started is delivered again.
//!
//! Node -> broker: every [`Report`](relay_protocol::runtime::Report) is published to the
//! `RELAY_REPORTS` stream on `relay.v1.report.<node>` and waits for JetStream's
//! acknowledgement (retried until it comes), so reports survive a NATS restart. The
//! broker acknowledges a report once the command it stands for is committed.
//!
//! Broker -> node control (steer, interrupt, approvals): request/reply on
//! `relay.v1.node.<node>.control`, a [`Control`](relay_protocol::runtime::Control) in,
//! `{"ok":true}` or an error out.
//!
//! Dispatches, reports and controls are JSON sealed with the node's key
//! ([`crate::seal`]): a node drops (and answers `unauthorized` to) anything it cannot
//! open, so no NATS client but its broker can make it run anything.
//!
//! - [`wire`]: what both sides speak: the streams, sealing and publishing a dispatch, a
//!   report or a control, and opening them on the other side. The broker side
//!   (`crate::plane`) uses only this.
//! - `process`: `relay node` itself ([`run`]): a runtime serving its agents from the
//!   dispatch stream and the control subject, its reports forwarded in order.
//!
//! Layering: `process` -> [`wire`]; [`wire`] knows nothing of the process.

mod process;
pub mod wire;

pub use process::{read_key, run, NodeConfig, NodeError};
