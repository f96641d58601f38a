//! Relay's wire and domain types: Relay's own contract only. No I/O lives here: no tokio,
//! sled or NATS. Other programs' wires (Codex, Claude Code, Pi) belong to their adapters
//! in `relay-harnesses`; the Agent Client Protocol is here because Relay speaks it both
//! ways ([`acp`]).
//!
//! - [`acp`]: the Agent Client Protocol's JSON-RPC messages, tolerant of what agents add:
//!   the `acp` harness is a client of ACP agents, `relay acp` an agent for editors.
//! - [`domain`]: agents, conversations, messages, invocations, flights, deliveries,
//!   bindings and approvals, as the CLI, the HTTP API and the store see them (serde JSON).
//! - [`event`]: the versioned event log every projection is rebuilt from.
//! - [`harness`]: the normalised event stream every harness adapter produces.
//! - [`bus`]: the NATS subjects, streams, headers and `Relay-Type` names, in one place.
//! - [`api`]: request/response bodies and typed error codes of the local HTTP API, and
//!   the `api.json` a broker writes for its clients ([`api::ApiInfo`]).
//! - [`methods`]: the method table: every operation once, with its types, HTTP route,
//!   NATS subject and scope; the router, the NATS service, the client and the
//!   dashboard's generated constants are driven by it.
//! - [`replay`]: a flight, an agent's session or a conversation read back from the log.
//! - [`clock`]: the one wall clock every timestamp is read from.
//! - [`runtime`]: what the broker and a runtime (embedded, or a `relay node` over NATS)
//!   say to each other: dispatches, controls and reports.
//! - [`convert`]: the domain types that cross NATS, to and from their [`pb`] forms.
//! - [`pb`]: the protobuf contract on NATS (`proto/relay/v1/relay.proto`), for clients
//!   in any language.
//! - [`hex`]: bytes as hex text, and back.
//! - [`text`]: agent text made inert (control characters and bidi overrides escaped)
//!   before a person sees it.
//! - [`watch`]: snapshots of a flight, an agent or a conversation, valid at an event seq
//!   (`relay watch`, `GET /v1/watch`, `relay.v1.cmd.snapshot`).
//!
//! Depends on: none.
//!
//! The crate depends on no other crate of the workspace: every other one depends on it.
//!
//! Layering (a module uses only the modules after its arrow; `names` and [`domain`] at the
//! bottom, [`convert`] and its [`pb`] forms over the types that cross NATS;
//! `tests/tests/module_graph/` checks it):
//! - `acp`, `clock`, `hex`, `names`, `text` -> none
//! - `domain` -> `names`
//! - `bus`, `harness`, `replay`, `runtime`, `watch` -> `domain`
//! - `api`, `event` -> `domain`, `names`
//! - `convert` -> `api`, `domain`
//! - `methods` -> `api`, `bus`, `domain`, `event`, `replay`, `watch`

pub mod acp;
pub mod api;
pub mod bus;
pub mod clock;
pub mod convert;
pub mod domain;
pub mod event;
pub mod harness;
pub mod hex;
pub mod methods;
mod names;
pub mod replay;
pub mod runtime;
pub mod text;
pub mod watch;

/// Types generated from `proto/relay/v1/relay.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/relay.v1.rs"));
}
