//! Harness adapters: one per agent CLI, each turning the CLI's own wire protocol into
//! [`relay_protocol::harness::HarnessEvent`]s, so nothing above this crate sees a CLI's
//! wire.
//!
//! - [`seam`]: what every adapter offers the runtime ([`Launcher`], [`HarnessSession`],
//!   their [`Capabilities`]) and the registry [`Harnesses`], keyed by the agent's
//!   harness. The runtime knows only this module.
//! - [`codex`]: Codex `app-server` (JSON-RPC over stdio): [`codex::CodexSession`], and
//!   [`codex::CodexLauncher`], the seam over it.
//! - [`process`]: child supervision shared by every adapter (own process group, stderr
//!   tail, exit report, no leaked processes).
//! - [`lines`]: the bounded line reader every read of a child's stdout and stderr goes
//!   through.
//! - [`error`]: [`HarnessError`], the one error type, with its retryable variants.
//!
//! Layering, one way: `seam` <- `codex` (an adapter implements the seam) -> `process`,
//! `lines` -> `error`; `seam` names the Codex launcher only to register it in
//! [`Harnesses::builtin`]. Nothing here depends on the runtime.
//!
//! Every session follows one shape: a cheap `Clone` handle sends commands over a bounded
//! channel to one owner task that owns the child's pipes and the pending requests; events
//! flow back on an `mpsc` receiver that ends with `ProcessExited`.

pub mod codex;
pub mod error;
pub mod lines;
pub mod process;
pub mod seam;

pub use error::HarnessError;
pub use seam::{
    Capabilities, Conversation, Endpoint, HarnessInfo, HarnessSession, Harnesses, Launcher, Lost,
    Spawned,
};
