//! Harness adapters: one per agent CLI, each turning the CLI's own wire protocol into
//! [`relay_protocol::harness::HarnessEvent`]s, so nothing above this crate sees a CLI's
//! wire.
//!
//! - [`process`]: child supervision shared by every adapter (own process group, stderr
//!   tail, exit report, no leaked processes).
//! - [`lines`]: the bounded line reader every read of a child's stdout and stderr goes
//!   through.
//! - [`codex`]: Codex `app-server` (JSON-RPC over stdio): [`codex::CodexSession`].
//! - [`error`]: [`HarnessError`], the one error type, with its retryable variants.
//!
//! Every session follows one shape: a cheap `Clone` handle sends commands over a bounded
//! channel to one owner task that owns the child's pipes and the pending requests; events
//! flow back on an `mpsc` receiver that ends with `ProcessExited`.
//!
//! Layering: [`error`] and [`lines`] depend on no other module, [`process`] on them, and
//! each adapter on all three; adapters never depend on each other. The crate depends on
//! `relay-protocol` only, and nothing in it knows the broker or the runtime.

pub mod codex;
pub mod error;
pub mod lines;
pub mod process;

pub use error::HarnessError;
