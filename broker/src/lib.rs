//! Relay's broker: the source of truth for agents, conversations, messages, invocations
//! and flights.
//!
//! - [`store`]: sled: the append-only event log and the projections rebuilt from it.
//! - [`broker`]: the domain rules and the single writer that group-commits them.
//! - [`feed`]: a gap-free, duplicate-free stream of events from any seq (SSE, NATS).
//! - [`http`]: the local HTTP + SSE API, on loopback, behind a bearer token.
//! - [`server`]: `relay up`, the process: broker, embedded runtime, API and bus, started
//!   and drained; [`node`]: `relay node`, a runtime on another host; [`shutdown`]: the
//!   signals that stop them.
//!
//! Data flows one way: a command (HTTP, NATS, the runtime) goes to the writer, which
//! applies the rules, writes events and projections in one transaction, flushes, and
//! then answers and publishes the events. The transaction and the flush run on the
//! process's storage thread ([`relay_runtime::storage`]); reads run on the blocking pool
//! ([`Store::read`]), so no async worker ever waits on sled.

pub mod broker;
pub mod error;
pub mod feed;
pub mod files;
pub mod http;
pub mod nats;
pub mod node;
pub mod ops;
pub mod plane;
pub mod policy;
pub mod seal;
pub mod server;
pub mod shutdown;
pub mod store;

pub use broker::{Broker, BrokerConfig, Command, Outcome};
pub use error::BrokerError;
pub use store::Store;
