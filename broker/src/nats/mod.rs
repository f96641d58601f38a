//! The broker on NATS: request/reply subjects for invoking agents and for commands, and
//! every flight update and message published as it commits. The subject scheme is the
//! manual in `broker/README.md` ("The bus"); [`relay_protocol::bus`] is its one
//! definition in code.
//!
//! Payloads are the protobuf messages of `protocol/proto/relay/v1/relay.proto`, with a
//! `Relay-Type` header naming the message. A request whose `Content-Type` header is
//! `application/json` is read as JSON and answered in JSON.
//!
//! Requests are handled concurrently up to [`MAX_INFLIGHT_REQUESTS`]; past that they are
//! answered `overloaded` at once (and counted), never queued without bound.
//!
//! - [`config`]: the connection: its settings, [`connect`] with retries, the status
//!   [`Tracker`], and the flight stream's setup;
//! - [`service`]: the request subjects (invoke and commands in);
//! - [`publisher`]: every committed event out, flight updates through the stream.

mod config;
mod publisher;
mod service;

pub use config::{
    connect, ensure_flight_stream, redact_url, ConnectError, NatsAuth, NatsConfig, StreamError,
    Tracker,
};
pub use publisher::publish;
pub use service::{Counters, Service};

/// Requests handled at once; more are answered `overloaded`.
pub const MAX_INFLIGHT_REQUESTS: usize = 1024;
