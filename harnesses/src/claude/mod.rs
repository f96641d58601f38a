//! The Claude Code adapter: `claude -p` speaking stream-json over its stdio.
//!
//! Parts:
//! - [`ClaudeLauncher`] (`launcher.rs`): Claude Code behind the harness seam
//!   ([`crate::seam`]). Its session starts a `claude` process in
//!   [`open`](crate::HarnessSession::open), because the CLI takes the session at
//!   process start (`--resume=<id>` or `--session-id=<id>`), as [`ClaudeConfig`]
//!   (`config.rs`) says.
//! - `wire.rs`: the protocol as a [`crate::stdio::Wire`]: stdout lines -> harness events,
//!   the running turn, the pending permission prompts; and the lines the session writes.
//!   No I/O. `items.rs`, part of it: the model's content blocks and tool results -> items.
//! - `fork.rs`: where a fork starts ([`crate::HarnessSession::fork`]): the source
//!   session's transcript and the message that ends the turns kept.
//! - [`stream_json`]: Claude Code's own stream-json lines as types (the subset Relay
//!   reads and writes), which only this adapter knows.
//! - [`crate::stdio`]: the owner task that alone touches the child's pipes, and
//!   [`crate::process`] under it (process group, stderr tail, no leaks).
//!
//! Data flow: `open` spawns `claude -p ... --session-id=<new uuid>` (or `--resume=<id>`)
//! and writes the `initialize` control request; its control response is the handshake.
//! `start_turn` writes a `user` line; Claude Code answers with `system`, `stream_event`
//! (the model's raw SSE events), `assistant`, `user` (tool results) lines and a `result`
//! that ends the turn, each read by the wire into events stamped with Relay's turn id.
//! A permission prompt (`control_request` `can_use_tool`) becomes
//! [`HarnessEvent::ApprovalRequested`](relay_protocol::harness::HarnessEvent) and is
//! answered by `respond_approval` with a `control_response`.
//!
//! Events: `TurnStarted` at Claude Code's first line after the user message (its `system
//! init`); `TextDelta` per `text_delta` (item id `<message id>:<block index>`);
//! `ItemStarted`/`ItemCompleted` around text blocks (agent message, the block's whole
//! text), thinking blocks (reasoning) and tool calls (item id the tool use id; command
//! for `Bash`, file change for `Edit`/`Write`/`MultiEdit`/`NotebookEdit`, tool call
//! otherwise), a tool's completion carrying the call and its output; `TokenUsage` from
//! the result (summed over the turn's model requests by Claude Code; input counts cache
//! reads and writes too, cached the reads; the model the API named; the cost is the
//! turn's part of `total_cost_usd`, which Claude Code adds up over the process's life
//! and prices from its own table, any model name included); `TurnCompleted`: `success`
//! without `is_error` -> completed with the result text, after an interrupt Relay sent ->
//! interrupted, else failed with Claude Code's message. Prompts still pending when the
//! turn ends are settled (`ApprovalResolved`). A subagent's lines (those with a
//! `parent_tool_use_id`) are skipped: its `Task` call is the item.
//!
//! Observed with Claude Code 2.1.197 (and pinned by `tests/claude.rs` and the wire's
//! unit tests over recorded lines):
//! - `--verbose` is required with stream-json output. The `initialize` request is
//!   answered at once (with commands, agents, models). `system init` comes only with a
//!   turn, once per turn.
//! - `--resume=<unknown uuid>`: `No conversation found with session ID: <id>` on stderr,
//!   a `result` `error_during_execution`, exit code 1, and no answer to `initialize`. A
//!   stored id that is not a uuid is refused too (`... is not a UUID and does not match
//!   any session title`); the adapter does not even try it. A session started with
//!   `--session-id` and given no turn is not saved, so it cannot be resumed later.
//! - A fork: `--resume=<transcript path>.jsonl --fork-session --session-id=<new uuid>
//!   [--resume-session-at=<message uuid>]`. `--resume <id>` finds a session only in the
//!   working directory's project (`No conversation found with session ID` from another
//!   directory), but a path ending in `.jsonl` is loaded from anywhere, so the fork runs
//!   in the new agent's directory without copying anything. `--resume-session-at` keeps
//!   the messages up to and including the one whose `uuid` it names (`No message found
//!   with message.uuid of: <id>`, exit 1, when none). The new session's transcript, in
//!   its own project, holds the kept entries with its `sessionId`; the source is left
//!   as it was. Like any session it is saved only once a turn ran.
//! - While streaming, the `assistant` line of each content block comes before that
//!   block's `content_block_stop`; one line per block, same message id.
//! - A failed model request (HTTP 500, no retries) gives a made-up `assistant` message
//!   (model `<synthetic>`, `error` set, text `API Error: 500 ...`) and a `result` with
//!   subtype `success` but `is_error: true` and that text. A stream that breaks off with
//!   an SSE `error` is retried as a request without streaming (its `assistant` line has
//!   no `stream_event`s).
//! - Read-only commands (`echo hi`, `ls`) run without a prompt; a command that writes
//!   (`echo hi > f`) or a file outside the working directory asks `can_use_tool`, with
//!   `tool_use_id`, `description` (Bash: the input's; Write: the path) and sometimes
//!   `decision_reason`. A denial's message reaches the model as the tool result with
//!   `is_error: true`. Deny with `interrupt: true` ends the turn: a `result`
//!   `error_during_execution` (`terminal_reason: aborted_tools`).
//! - A `tool_use` whose id the session already holds (a model that reuses ids) is
//!   not run and never asked about: the history shows `[Tool use interrupted]` and the
//!   model is asked again with an empty user message.
//! - An interrupt while a prompt is pending: Claude Code sends `control_cancel_request`
//!   for it, then the control response, then `result` `error_during_execution`
//!   (`aborted_streaming` mid-stream) without a `result` text. The partial text comes in
//!   an `assistant` line without a `content_block_stop`. An interrupt between turns is
//!   answered `success` and does nothing, so the adapter refuses it itself.
//! - With `relay mcp` wired in (`--mcp-config`, see `config.rs`), Claude Code starts it
//!   with its own whole environment and offers its tools as `mcp__relay__<tool>`. A call
//!   of one asks `can_use_tool` like any tool; the wire allows Relay's own at once (the
//!   agent's scoped token bounds them), any other tool still asks a person.
//! - A user message sent while a turn runs is queued as the next turn when the model is
//!   streaming text, but folded into the running turn between tool calls ("The user sent
//!   a new message while you were working"): so one turn at a time
//!   ([`crate::HarnessError::TurnRunning`]), and no steer.

mod config;
mod fork;
mod items;
mod launcher;
pub mod stream_json;
mod wire;

pub use config::ClaudeConfig;
pub use launcher::{ClaudeLauncher, CLAUDE_INFO};
/// Claude Code's stdout read as a [`crate::stdio::Wire`] (public for the fuzz targets).
pub use wire::ClaudeWire;

pub use crate::pinned::{CLAUDE_CLI, CLAUDE_VERSION};
