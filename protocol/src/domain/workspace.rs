//! Workspaces: an agent in a git worktree of its own (`relay agent add --worktree`), on
//! its own branch, each flight's changes a commit that names it; and an agent forked
//! from another's session (`relay agent fork`).
//!
//! - [`WorktreeSpec`]: what the registration asks for (on [`super::AgentSpec`]).
//! - [`WorktreeState`]: what the runtime that serves the agent made of it: where the
//!   worktree is, its branch and base, ahead/behind (on [`super::Agent`]).
//! - [`FlightCommit`]: what a flight changed, committed on the agent's branch (on
//!   [`super::Flight`], and as the [`super::FlightChange::Commit`] update, which also
//!   carries the patch).
//! - [`ForkSpec`]: the session and commit a forked agent starts from.

use serde::{Deserialize, Serialize};

/// The trailer that names a flight in the commit of its changes.
pub const FLIGHT_TRAILER: &str = "Relay-Flight";
/// The trailer that names the flight a revert commit undoes.
pub const REVERT_TRAILER: &str = "Relay-Revert-Of";
/// The prefix of every agent's branch: `relay/NAME`.
pub const BRANCH_PREFIX: &str = "relay/";
/// Largest patch recorded with a flight's commit; a larger one is cut (and says so).
pub const MAX_RECORDED_PATCH: usize = 256 * 1024;
/// Most files listed with a flight's commit or a revert; the rest are counted only
/// ([`FlightCommit::more_files`]): a flight that adds a dependency tree would otherwise
/// put tens of thousands of entries in the flight record and every copy of it.
pub const MAX_LISTED_FILES: usize = 1000;

/// Cuts `files` to [`MAX_LISTED_FILES`]; how many were left out.
pub fn cap_files(files: &mut Vec<FileChange>) -> u64 {
    let over = files.len().saturating_sub(MAX_LISTED_FILES);
    files.truncate(MAX_LISTED_FILES);
    over as u64
}

/// The branch of agent `name`'s worktree.
pub fn branch_of(name: &str) -> String {
    format!("{BRANCH_PREFIX}{name}")
}

/// A git worktree of its own for an agent, as its registration asks
/// (`relay agent add NAME --worktree [--base REF] [--worktree-dir DIR] [--copy PAT] --cwd REPO`).
/// The agent's `cwd` is the repository (`REPO`); it runs in the worktree, never there.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorktreeSpec {
    /// The ref the agent's branch starts from; `None`: the repository's current branch
    /// (refused while that checkout has uncommitted changes to tracked files: the
    /// worktree would not have them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The directory the worktree is made in (`DIR/NAME`); `None`: the runtime's own
    /// (its data dir's `worktrees/NAME`), outside the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Untracked files of the repository copied into the worktree when it is made:
    /// paths relative to the repository, or glob patterns (`.env`, `config/*.local`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy: Vec<String>,
}

/// An agent's worktree as the runtime that serves it made it ([`super::Agent::worktree`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorktreeState {
    /// The worktree's directory, on the host of the runtime that serves the agent.
    pub path: String,
    /// The agent's branch (`relay/NAME`).
    pub branch: String,
    /// The ref the branch started from, as given or found (`main`).
    pub base: String,
    /// The commit the branch started from.
    pub base_commit: String,
    /// The branch's tip when last seen (after the last flight, revert or recreation).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub head: String,
    /// Commits on the branch and not on `base`, and the other way round, when last seen.
    #[serde(default)]
    pub ahead: u32,
    #[serde(default)]
    pub behind: u32,
    /// Times the worktree was found missing (deleted or moved by hand) and made again
    /// from the branch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recreated: u32,
    pub updated_at: u64,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero64(n: &u64) -> bool {
    *n == 0
}

/// One file a flight changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    pub path: String,
    /// Lines added and removed (`0` for a binary file).
    pub added: u64,
    pub removed: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub binary: bool,
}

/// What a flight changed in its agent's worktree, committed on the agent's branch
/// ([`super::Flight::commit`], [`super::FlightChange::Commit`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FlightCommit {
    /// The agent's branch.
    pub branch: String,
    /// The branch's tip before the flight's turn.
    pub start: String,
    /// The branch's tip after it (Relay's commit, or the agent's last own commit).
    pub head: String,
    /// The commit Relay made of what the turn left uncommitted (its message carries the
    /// `Relay-Flight: flt_...` trailer); `None` when the agent committed everything
    /// itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Commits the agent made itself during the turn, oldest first (`start..` them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_commits: Vec<String>,
    /// The files `start..head` changed, with their lines: the first
    /// [`MAX_LISTED_FILES`]; `more_files` counts the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileChange>,
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub more_files: u64,
    pub added: u64,
    pub removed: u64,
    /// Other flights whose changes are in this commit too: their own commit could not
    /// be made when they ended (a git lock held too long), so they were carried here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also_flights: Vec<String>,
    /// `git diff start..head`, up to [`MAX_RECORDED_PATCH`] bytes; only in the
    /// [`super::FlightChange::Commit`] update (the flight record leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// The patch was longer and was cut.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub patch_truncated: bool,
    /// The revert commit that undid this flight's changes (`relay revert`), and who
    /// asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverted_by: Option<Revert>,
}

/// A revert of a flight's changes ([`super::FlightChange::Reverted`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revert {
    /// The revert commit on the agent's branch (trailer `Relay-Revert-Of: flt_...`).
    pub commit: String,
    /// Who asked (`cli`, `<user>@dashboard`...).
    pub by: String,
    pub at: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileChange>,
    /// Files the revert changed past the first [`MAX_LISTED_FILES`].
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub more_files: u64,
}

/// Where a forked agent starts from (`relay agent fork SRC NEW [--at FLIGHT]`): a fork
/// of SRC's harness session at that point, and, with a worktree, a branch from SRC's
/// commit at that flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkSpec {
    /// The agent it was forked from.
    pub agent: String,
    /// SRC's harness session (thread) that is forked.
    pub thread_id: String,
    /// The flight it was forked at; `None`: SRC's last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flight: Option<String>,
    /// The turns of SRC's session kept in the fork (its turns up to and including
    /// `flight`'s); `None`: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_turns: Option<u32>,
    /// The turns SRC's session had when it was forked (so a harness that drops turns
    /// from the end knows how many: `turns - keep_turns`).
    #[serde(default)]
    pub turns: u32,
    /// SRC's working directory (its worktree, or its cwd): where a harness that keeps
    /// sessions per directory (Claude Code) finds SRC's session.
    pub cwd: String,
}

/// The first 12 hex digits of a commit id, as people read them.
pub fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

impl FlightCommit {
    /// One line for a person: `commit 1a2b3c4d5e6f on relay/a: 2 files, +10 -3`.
    pub fn summary(&self) -> String {
        let what = match &self.commit {
            Some(c) => format!("commit {}", short(c)),
            None => format!("commits up to {}", short(&self.head)),
        };
        let files = self.files.len() as u64 + self.more_files;
        let mut line = format!(
            "{what} on {}: {files} file{}, +{} -{}",
            self.branch,
            if files == 1 { "" } else { "s" },
            self.added,
            self.removed
        );
        if !self.agent_commits.is_empty() {
            line.push_str(&format!(
                " ({} made by the agent)",
                self.agent_commits.len()
            ));
        }
        if let Some(r) = &self.reverted_by {
            line.push_str(&format!("; reverted by {} ({})", short(&r.commit), r.by));
        }
        line
    }
}

impl Revert {
    /// One line for a person: `reverted by commit 1a2b3c4d5e6f (cli)`.
    pub fn summary(&self) -> String {
        format!("reverted by commit {} ({})", short(&self.commit), self.by)
    }
}
