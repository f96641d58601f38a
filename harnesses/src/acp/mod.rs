//! The ACP adapter: any Agent Client Protocol agent (JSON-RPC 2.0, one message a line
//! over stdio), and the presets of the verified CLIs (Gemini CLI, OpenCode, Qwen Code).
//! Relay is the ACP client; the wire's types are Relay's own
//! ([`relay_protocol::acp`]).
//!
//! Parts:
//! - [`AcpLauncher`] (`launcher.rs`): ACP behind the harness seam, one per harness
//!   (`acp`, `gemini`, `opencode`, `qwen`). Its session starts the agent's program when
//!   first opened, `initialize`s it once (what the agent said of itself is kept as the
//!   agent's [`ProgramInfo`](relay_protocol::domain::ProgramInfo), shown by `relay
//!   agent show`), then opens the session by request: the stored one by
//!   `session/resume` where the agent offers it, else `session/load` (its replay of
//!   history consumed, never shown, whether it comes before or after the load's
//!   answer); one the agent no longer has is replaced by `session/new` and reported
//!   lost. One process per agent for as long as it lives.
//! - `preset.rs` ([`AcpConfig`], [`Preset`]): the command line, variables and settings
//!   files of each preset.
//! - `wire.rs` (and `wire/turn.rs`, `wire/usage.rs`): the [`crate::stdio::Wire`] of ACP: requests
//!   written, stdout lines read into
//!   [`HarnessEvent`](relay_protocol::harness::HarnessEvent)s, the turn running and
//!   the permission requests waiting. Pure, tested over lines.
//! - `quirks.rs`: what one agent needs that the protocol does not say (Gemini CLI's
//!   lost sessions).
//!
//! Event mapping: `agent_message_chunk` -> `ItemStarted`/`TextDelta`s/`ItemCompleted`
//! (`AgentMessage`; a new `messageId`, or anything between, starts a new item);
//! `agent_thought_chunk` the same without deltas (`Reasoning`); `tool_call` and
//! `tool_call_update` -> an item per `toolCallId` (kind `execute`, or a
//! `rawInput.command`, a `CommandExecution` with its output as `CommandOutputDelta`s;
//! `edit`/`delete`/`move` a `FileChange`; others a `ToolCall`), completed with the call
//! and its output when its status is `completed` or `failed`; `plan` -> `PlanUpdated`;
//! usage from `usage_update` (its `cost` in USD is the harness's), `_meta.usage` on a
//! chunk (one per model call, summed over the turn), or the prompt's answer (`usage`,
//! `_meta.usage`, `_meta.quota`) -> `TokenUsage`, in Relay's counting whichever way the
//! agent counts (`wire/usage.rs`); the prompt's answer -> `TurnCompleted`
//! by its `stopReason` (`end_turn` completed with the last message's text, `cancelled`
//! interrupted, `refusal`, `max_tokens`, `max_turn_requests` and any unknown reason
//! failed, saying which). `session/request_permission` -> `ApprovalRequested`: a
//! `Command` whose detail is the command as it will run (`rawInput.command`; Gemini
//! CLI 0.61.0, the checked version, sends none and titles the call with it), so a
//! policy's `--auto-accept`/`--auto-decline` rules read it as they read Codex's; a
//! `FileChange` for edits; else `Other` with the call's title. It is answered with the
//! `allow_once` option (accept, also "for the session") or `reject_once` (decline,
//! cancel): never an "always" one. Interrupt is `session/cancel`, after which the open
//! permission requests, and any that come after it, are answered `cancelled` (the open
//! ones' approvals settled at once). No steer: ACP has none.
//!
//! Tolerance: unknown update kinds, notifications and vendor `_meta` are skipped and
//! logged once; an agent's request Relay does not serve (Qwen Code's
//! `craft/drainMidTurnQueue`, `fs/*`, `terminal/*`: Relay offers no client
//! capabilities) is answered `-32601` and the turn goes on. The agent's first request
//! has id `0`, a real id. A line that is not JSON-RPC during a turn fails the turn (the
//! stream can no longer be trusted) and cancels it; before, it is counted and skipped.

mod launcher;
mod preset;
mod quirks;
mod wire;

pub use launcher::AcpLauncher;
pub use preset::{settings_dir, AcpConfig, Preset};
/// ACP read as a [`crate::stdio::Wire`] (public for the fuzz targets).
pub use wire::AcpWire;
