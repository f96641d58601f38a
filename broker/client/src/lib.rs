//! The client of a Relay broker's HTTP API, for the `relay` CLI, `relay mcp`, the
//! tests and the bench. It depends on `relay-protocol` only, never on the broker.
//!
//! - [`data_dir`]: the broker's data directory as a command line names it
//!   (`--data-dir`, `RELAY_DATA_DIR`, the XDG default).
//! - [`sse`]: a bounded `text/event-stream` parser (the whole standard: `id`, `retry`,
//!   multi-line `data`, comments, CR/LF/CRLF, BOM).
//! - [`client`]: [`Client`], requests with the token and typed errors ([`ClientError`]);
//!   finds the broker through `<data-dir>/api.json` ([`relay_protocol::api::ApiInfo`])
//!   or `RELAY_URL` + `RELAY_TOKEN`, and again after a restart; one SSE connection.
//! - [`follow`]: an SSE stream followed across reconnections with `Last-Event-ID`.
//!
//! Depends on: relay-protocol.
//!
//! Layering (a module uses only the modules after its arrow; `tests/tests/module_graph/`
//! checks it):
//! - `data_dir`, `sse` -> none
//! - `client` -> `data_dir`, `sse`
//! - `follow` -> `client`, `sse`

pub mod client;
pub mod data_dir;
pub mod follow;
pub mod sse;

pub use client::{Client, ClientError, Query, SseEnd};
pub use data_dir::DataDir;
pub use follow::{Follow, Followed, Reconnect};
pub use sse::{SseError, SseEvent, SseLimits, SseParser, MAX_SSE_EVENT};
