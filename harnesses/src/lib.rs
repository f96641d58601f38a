//! Harness adapters: one per agent CLI, each turning the CLI's own wire protocol into
//! [`relay_protocol::harness::HarnessEvent`]s, so nothing above this crate sees a CLI's
//! wire. Each adapter owns its CLI's wire types ([`codex::app_server`],
//! [`claude::stream_json`], Pi's `pi/rpc.rs`); `relay-protocol` holds only Relay's own.
//!
//! - [`seam`]: what every adapter offers the runtime ([`Launcher`], [`HarnessSession`],
//!   their [`Capabilities`]). The runtime knows only this module and the registry.
//! - [`registry`]: [`Harnesses`], the launchers keyed by the agent's harness.
//! - [`codex`]: Codex `app-server` (JSON-RPC over stdio): [`codex::CodexSession`], and
//!   [`codex::CodexLauncher`], the seam over it.
//! - [`claude`]: Claude Code (`claude -p`, stream-json over stdio) and [`pi`]: Pi
//!   (`pi --mode rpc`, JSON lines), each a launcher and its session over [`stdio`].
//! - [`acp`]: any Agent Client Protocol agent (JSON-RPC over stdio), with presets for
//!   Gemini CLI, OpenCode and Qwen Code: [`acp::AcpLauncher`], one per harness, over
//!   [`stdio`] and [`restartable`].
//! - [`tmux`]: a tmux pane ([`tmux::TmuxLauncher`]): the agent's command in a detached
//!   session on Relay's own socket, tasks pasted in once its screen says it is ready
//!   ([`tmux::screens`]), output followed through a pipe.
//!   Not registered in [`Harnesses::builtin`] yet.
//! - [`stdio`]: the owner task and handle every CLI over pipes runs on (Codex, Claude
//!   Code, Pi, ACP agents): one [`stdio::Wire`] per protocol reads stdout and keeps its state.
//! - [`restartable`]: [`restartable::RestartableChild`], the one child of a session
//!   whose CLI takes the session at process start (Claude Code, Pi) or by a request
//!   right after (an ACP agent),
//!   started in `open`, on one event stream, stopped at shutdown.
//! - [`pinned`]: the agent CLIs Relay pins (Codex, Claude Code, Pi, Gemini CLI,
//!   OpenCode, Qwen Code: name, version,
//!   override variable) and where each one's program is (the pinned install, an override);
//!   [`config`]: how it is started for an agent ([`config::CliConfig`]).
//! - [`process`]: child supervision shared by every adapter (own process group, stderr
//!   tail, exit report, no leaked processes).
//! - [`preflight`]: the checks of an agent before it is registered (its directory, that
//!   its program runs, its credentials), which each launcher's `preflight` puts together.
//! - [`lines`]: the bounded line reader every read of a child's stdout and stderr goes
//!   through.
//! - [`error`]: [`HarnessError`], the one error type, with its retryable variants.
//! - [`access`]: [`RelayAccess`], how an agent's session reaches Relay as that agent,
//!   and how each CLI is given Relay's MCP server on its command line.
//!
//! Every session follows one shape: a cheap `Clone` handle sends commands over a bounded
//! channel to one owner task that owns the child's pipes and the pending requests; events
//! flow back on an `mpsc` receiver that ends with `ProcessExited`.
//!
//! Depends on: relay-protocol.
//! Tests also depend on: relay-mock-model, relay-tests.
//!
//! Nothing in it knows the broker or the runtime. Only the registry names the adapters
//! ([`Harnesses::builtin`]), and adapters never depend on each other: what two of them
//! need of one CLI (the `codex` adapter and the `tmux` one driving Codex's TUI) lives in
//! [`pinned`] and [`access`].
//!
//! Layering, one way (a module uses only the modules after its arrow;
//! `tests/tests/module_graph/` checks it):
//! - `access`, `error`, `lines`, `pinned`, `ration` -> none
//! - `process` -> `error`, `lines`
//! - `config` -> `access`, `error`, `pinned`, `process`
//! - `preflight` -> `config`, `error`, `process`
//! - `seam` -> `access`, `error`, `preflight`
//! - `stdio` -> `error`, `lines`, `process`, `ration`
//! - `restartable` -> `error`, `process`, `stdio`
//! - `codex` -> `access`, `config`, `error`, `pinned`, `preflight`, `seam`, `stdio`
//! - `acp`, `claude`, `pi` -> `access`, `config`, `error`, `pinned`, `preflight`,
//!   `process`, `restartable`, `seam`, `stdio`
//! - `tmux` -> `access`, `config`, `error`, `pinned`, `preflight`, `process`, `seam`
//! - `registry` -> `acp`, `claude`, `codex`, `error`, `pi`, `seam`, `tmux`

pub mod access;
pub mod acp;
pub mod claude;
pub mod codex;
pub mod config;
pub mod error;
/// What the wires' tests share: feeding recorded lines, the events of one turn.
#[cfg(test)]
mod fixtures;
pub mod lines;
pub mod pi;
pub mod pinned;
pub mod preflight;
pub mod process;
pub mod ration;
pub mod registry;
pub mod restartable;
pub mod seam;
pub mod stdio;
pub mod tmux;

pub use access::{AccessIssuer, RelayAccess};
pub use error::HarnessError;
pub use registry::Harnesses;
pub use seam::{
    Capabilities, Endpoint, HarnessInfo, HarnessSession, Launcher, Lost, OpenedSession, Preflight,
    Screen, Spawned,
};
