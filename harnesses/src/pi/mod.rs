//! The Pi adapter: `pi --mode rpc`, JSON lines over stdio.
//!
//! Parts:
//! - [`PiLauncher`] (`launcher.rs`): Pi behind the harness seam ([`crate::seam`]). Its
//!   session starts `pi` in [`open`](crate::HarnessSession::open), since pi takes the
//!   session at process start (`--session <id>`), and starts it again without one
//!   when pi no longer has the stored session. [`PiConfig`] (`config.rs`): the command
//!   line for an agent.
//! - `wire.rs` (and `wire/turn.rs`): the [`crate::stdio::Wire`] of pi's RPC: commands
//!   written, stdout lines read into
//!   [`HarnessEvent`](relay_protocol::harness::HarnessEvent)s, and the turn running.
//!   Pure, tested over lines recorded from the real pi (`wire/fixtures/`). `rpc.rs`:
//!   the shapes of those lines.
//! - [`crate::stdio`]: the owner task that holds the child's pipes (the same as Claude
//!   Code's), and [`crate::process`] under it.
//!
//! Data flow: `open` spawns `pi --mode rpc [--model M] <agent args> [--session ID]` and
//! asks `get_state` (the handshake; its `sessionId` is the session's id); only then
//! is the child armed, so that a pi refusing `--session` never reads as a session end.
//! `start_turn` writes `{"id":"relay-N","type":"prompt","message":...}` and waits for
//! pi's `{"id":"relay-N","type":"response","success":true}`; pi's events (no ids) are
//! stamped with Relay's turn id until the run it started is over.
//!
//! Event mapping: `agent_start` -> `TurnStarted`; a user message of the run (the prompt,
//! then each steered text) -> `ItemStarted`/`ItemCompleted` (`UserMessage`); a `text`
//! block of an assistant message -> `ItemStarted`/`TextDelta`s/`ItemCompleted`
//! (`AgentMessage`), a `thinking` block the same without deltas (`Reasoning`);
//! `tool_execution_start|update|end` -> an item per tool call (`bash` a
//! `CommandExecution` with its output as `CommandOutputDelta`s, `edit`/`write` a
//! `FileChange`, others a `ToolCall`), completed with the call and its result as text;
//! each assistant `message_end` -> `TokenUsage` (the turn's running total over its model
//! requests; input counts cache reads and writes, cached the reads; the message's
//! model; pi's cost where it is not zero, which it is for a model without a price in
//! `models.json`); `agent_end` -> `TurnCompleted` by the
//! run's last assistant message: `stopReason` `aborted` is `Interrupted`, `error` is
//! `Failed` with pi's `errorMessage` (unless pi runs again, below), anything else
//! `Completed` with the message's text. `auto_retry_start` and `extension_error` become
//! warnings; an extension's dialog (`extension_ui_request` select/confirm/input/editor)
//! is cancelled at once, since it would block pi and Relay has no one to ask. Lines that
//! are not JSON, or known events of the wrong shape, are counted and skipped; unknown
//! event types are skipped.
//!
//! Observed with pi 0.73.1 (and pinned by `tests/pi.rs`):
//! - `get_state` answers at once with `sessionId` (a UUIDv7) and `sessionFile`; the file
//!   is written only once a prompt has run, so a session that never ran a turn cannot be
//!   resumed later (it is reported lost like an unknown one).
//! - `--session <unknown id>` prints `No session found matching '<id>'` on stderr and
//!   exits with code 1 without reading stdin. Pi finds a session by id prefix in the
//!   working directory's sessions, then in every directory's.
//! - A fork: `--fork <id>` (not with `--session`) writes at once a new session in the
//!   working directory's sessions with a copy of all of the source (found like
//!   `--session`'s, in any directory; its header gets the new `cwd` and `parentSession`
//!   the source file) and runs on it; an unknown id: `No session found matching '<id>'`,
//!   exit 1. Cutting: `get_fork_messages` lists the user messages (`entryId`, `text`) of
//!   the branch, and `fork` with one's `entryId` switches the process to a new session
//!   holding what came before that message (answered `{text, cancelled}`; an extension
//!   may cancel it). `--session <id>` of a session kept in ANOTHER directory asks on
//!   stdin `Fork this session into current directory? [y/N]` (then exits 0 with
//!   `Aborted.` in RPC mode), which is why a fork starts with `--fork`. A user message
//!   steered into a run counts as a message of its own there, so a session with steers
//!   is cut by messages, not turns.
//! - `prompt` is answered before `agent_start`; `success: false` (no model, no key, a
//!   turn already running) means it did not start.
//! - `steer` does not stop the stream in flight: the assistant message completes, then,
//!   in the same run, pi sends the model a new request with the steered text as a user
//!   message after it, and `agent_end` follows that answer. Sent while idle, pi accepts it
//!   and keeps it for the next prompt, so the adapter refuses a steer with no turn
//!   running ([`HarnessError::NoActiveTurn`](crate::HarnessError::NoActiveTurn)). One
//!   race is left: a steer that arrives after pi's last look at its queue (between the
//!   last `turn_end` and `agent_end`) is accepted but kept for the next prompt.
//! - `abort` is answered only after the run has ended: `message_end` with `stopReason:
//!   "aborted"` (`errorMessage: "This operation was aborted"`; a text block cut short gets
//!   no `text_end`), `turn_end`, `agent_end`, then the response. With no run, it answers
//!   success and does nothing.
//! - A model error ends the run with `stopReason: "error"` and the provider's error body
//!   as `errorMessage`. Pi retries some errors by itself (overloaded, rate limits, 5xx,
//!   lost connections: by default 3 times from 2 s) with a new run after that
//!   `agent_end`, announced by `auto_retry_start` (or `compaction_start` for a context
//!   overflow) written right after it, before pi reads its next command; giving up is
//!   `auto_retry_end` with `success: false`. So the wire answers a failed `agent_end`
//!   with a `get_state` probe: a retry announced before the probe's answer goes on in the
//!   same turn, else the turn fails.
//! - `tool_execution_update` carries the tool's output so far (its tail, once long), not
//!   a delta; the first update of `bash` is empty.
//! - A command pi does not know, or a line it cannot parse, is refused with a response
//!   without `id`.

mod config;
mod launcher;
mod rpc;
mod wire;

pub use config::PiConfig;
pub use launcher::{PiLauncher, PI_INFO};
/// Pi's stdout read as a [`crate::stdio::Wire`] (public for the fuzz targets).
pub use wire::PiWire;

use std::path::PathBuf;

pub use crate::pinned::{PI_CLI, PI_VERSION};

/// Where the `pi` program is; see [`PinnedCli::program`].
pub fn pi_program(explicit: Option<&str>) -> PathBuf {
    PI_CLI.program(explicit)
}
