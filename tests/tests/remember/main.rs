//! Issue 28's "Must be shown", end to end: a real `relay up` driven through its CLI and
//! HTTP API, the real pinned Codex, Claude Code and Qwen Code (the ACP agent: it asks for
//! every shell command, starts in 1-2 s and reloads a session at once, where Gemini CLI
//! must wait for the next minute) against the mock model.
//!
//! - `rules`: a person accepts a command with `--remember agent`; the agent's next
//!   identical command runs without asking, decided by `rule:<id>` (the approval record,
//!   `relay replay flight`); the same command with an extra option asks, another agent of
//!   the same harness asks; `relay rule list` counts the match, and so does it after a
//!   `kill -9` of the broker and a restart; after `relay rule remove` it asks again. One
//!   scenario, run for each of the three harnesses.
//! - `usage`: flights on each harness, the mock reporting known token counts, and an
//!   agent-to-agent tree across two agents: `relay usage --by agent|tree|day --json` adds
//!   up exactly to the flights' own usage.
//! - `budget`: an agent whose daily budget is below one flight's tokens runs its first
//!   flight; the next is refused with `budget_exceeded` (exit code and a message naming
//!   the budget and when it resets); `relay agent set --budget` higher lets it run.
//!
//! - `concurrent`: sixteen decisions remembered over HTTP at once, and removals racing
//!   the next asks (`relay-fake-acp` agents: sixteen real CLIs are too heavy for it): no
//!   rule lost, each rule's count exactly the approvals it decided.
//!
//! The harnesses and the mock's script are in `clis`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod budget;
mod clis;
mod concurrent;
mod rules;
mod usage;
