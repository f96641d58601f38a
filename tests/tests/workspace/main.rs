//! Workspaces end to end (issue 27's "Must be shown"): the real pinned Codex and Claude
//! Code against the mock model, whose `write:PATH CONTENT` prompt makes each CLI write a
//! file with its own shell tool (`relay_tests::agents::script`), a real `relay up`, real
//! git repositories in temp dirs.
//!
//! - `writes`: the mock's write lands in the agent's cwd, for both CLIs (no worktree).
//! - `concurrent`: a Codex and a Claude Code agent with worktrees of one repository edit
//!   the same file at the same time: each change a commit naming its flight on the
//!   agent's own branch, recorded on the flight; the main checkout untouched; `relay
//!   diff` of each flight and agent; `relay revert` of one.
//! - `fork`: `relay agent fork A A2 --at <A's first flight>`: A2's next model request
//!   carries the conversation up to that flight and not after it, and A2's worktree has
//!   that flight's files and not the next one's; Codex and Claude Code.
//! - `crash`: `kill -9` of the broker while a flight's commit waits for git's lock: after
//!   the restart the commit is made once, not twice, not lost.
//! - `native`: each CLI's own edit tool (Codex's `apply_patch`, Claude Code's `Write`;
//!   the mock's `edit:PATH CONTENT`) accepted by `--accept-file-changes`: its native
//!   change events (`file_change` items; Codex's diff) on the flight before its end, the
//!   file in the flight's commit.
//! - `lifecycle`: a worktree deleted by hand is recreated at the next turn; `relay agent
//!   remove` refuses uncommitted work and `--force` commits it on the kept branch; `relay
//!   doctor` finds an orphan worktree and `--fix` removes it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod concurrent;
mod crash;
mod fork;
mod lifecycle;
mod native;
mod repo;
mod writes;
