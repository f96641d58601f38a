//! Relay's broker: the source of truth for agents, conversations, messages, invocations
//! and flights.
//!
//! - [`store`]: sled: the append-only event log and the projections rebuilt from it.
//! - [`broker`]: the domain rules (who may invoke whom, an agent's queue, a flight's
//!   output cap among them) and the single writer that group-commits them;
//!   [`policy`]: approval policies and remembered decisions' rules; [`prices`]: the
//!   user's price table (a flight's cost where its harness reported none); [`ops`]: steer,
//!   interrupt and decide (and remember), the same for every interface; [`remembered`]:
//!   remembered rules listed, removed and deciding requests, the same for every interface; [`workspaces`]: agents' worktrees (remove, diff, revert, fork),
//!   the same for every interface; [`ports`]: what the domain needs from the runtime
//!   ([`ports::FlightControl`]).
//! - [`feed`]: a gap-free, duplicate-free stream of events from any seq (SSE, NATS);
//!   [`watch`]: a flight's, an agent's or a conversation's snapshot exact at a seq, then
//!   its events after it; [`replay`]: a flight, an agent's session or a conversation
//!   read back from the log.
//! - [`http`]: the local HTTP + SSE API, on loopback, behind a bearer token; [`nats`]:
//!   the NATS bus (commands, events and flight updates).
//! - [`plane`]: the link to a runtime, embedded or on a node; [`node`]: the node wire
//!   ([`node::wire`]: dispatches, reports, controls over JetStream, what both sides
//!   speak) and the node process (`relay node`, a runtime on another host).
//! - [`server`]: `relay up`, the process: broker, embedded runtime, API and bus, started
//!   and drained; [`shutdown`]: the signals that stop them; [`tasks`]: every task the
//!   broker spawns is owned by one, ended and waited for when its part stops.
//! - [`telemetry`]: the Prometheus series of `/metrics` (flights, approvals, usage from
//!   the committed events; the writer's queue, flushes and refusals from its atomics), in
//!   a recorder each broker owns.
//! - [`alerts`]: an approval waiting for a person runs the user's notify command (a
//!   bounded pool, batched when over), and its agent's timeout declines it (used by
//!   `plane`).
//! - [`error`], [`files`] (private files), [`seal`] (node keys, token comparison): used
//!   by all of the above.
//!
//! Errors are typed ([`error::BrokerError`] for commands, [`server::ServeError`] and
//! [`node::NodeError`] for the processes, [`files::FileError`]): `anyhow` is only in the
//! `relay` binary, which says them and picks the exit code.
//!
//! Data flows one way: a command (HTTP, NATS, the runtime) goes to the writer, which
//! applies the rules, writes events and projections as one batch, flushes, and
//! then answers and publishes the events. The batch and the flush run on the
//! process's storage thread ([`relay_infra::storage`]); reads run on the blocking pool
//! ([`Store::read`]), so no async worker ever waits on sled.
//!
//! Depends on: relay-harnesses, relay-infra, relay-protocol, relay-runtime.
//!
//! Modules depend one way, in layers: the leaves, on no other module; the domain (`store`, then
//! `broker`, `feed`, `watch`, `replay`, `ports`, `ops`, `remembered`) and its ports; the adapters (`http`
//! and `nats`, the interfaces; `node` on `nats`; `plane` on `node`, implementing the
//! ports); and `server`, which wires them together.
//!
//! Layering (a module uses only the modules after its arrow; `tests/tests/module_graph/`
//! checks it):
//! - `error`, `files`, `policy`, `prices`, `seal`, `shutdown`, `tasks` -> none
//! - `alerts` -> `tasks`
//! - `store` -> `error`, `files`
//! - `ports` -> `error`
//! - `broker` -> `error`, `policy`, `ports`, `prices`, `store`, `tasks`
//! - `feed` -> `broker`, `error`, `ports`
//! - `ops` -> `broker`, `error`, `policy`, `ports`
//! - `remembered` -> `broker`, `error`, `ops`, `policy`, `ports`
//! - `workspaces` -> `broker`, `error`, `ports`, `store`
//! - `replay` -> `broker`, `error`, `store`
//! - `watch` -> `broker`, `error`, `feed`, `store`
//! - `telemetry` -> `alerts`, `broker`, `error`, `feed`, `store`
//! - `http` -> `broker`, `error`, `feed`, `files`, `ops`, `ports`, `remembered`, `replay`,
//!   `seal`, `store`, `tasks`, `telemetry`, `watch`, `workspaces`
//! - `nats` -> `broker`, `error`, `feed`, `files`, `ops`, `ports`, `remembered`, `seal`, `watch`,
//!   `workspaces`
//! - `node` -> `error`, `files`, `nats`, `seal`, `tasks`
//! - `plane` -> `alerts`, `broker`, `error`, `feed`, `node`, `ops`, `policy`, `ports`,
//!   `remembered`, `seal`, `store`, `tasks`
//! - `server` -> `alerts`, `broker`, `error`, `files`, `http`, `nats`, `plane`, `seal`, `store`,
//!   `tasks`, `telemetry`
//!
//! `store`, `broker` and `plane` are directories with a file per concern (`store/`: the
//! handle, `keys.rs`, `projections.rs`, `queries.rs`, `doctor.rs`; `broker/`: the handle,
//! `writer.rs`, `rules/` by entity, `agents.rs`; `plane/`: `dispatch.rs`, `reports.rs`, `nodes.rs`,
//! `controls.rs`); their submodules are private, so only the top-level modules layer.
//!
//! The domain never depends on an adapter, nor do the interfaces on the runtime link: a
//! port the domain calls lives in [`ports`].

pub mod alerts;
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
pub mod ports;
pub mod prices;
pub mod remembered;
pub mod replay;
pub mod seal;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod tasks;
pub mod telemetry;
pub mod watch;
pub mod workspaces;

pub use broker::{Broker, BrokerConfig, Command, Outcome};
pub use error::BrokerError;
pub use store::Store;
