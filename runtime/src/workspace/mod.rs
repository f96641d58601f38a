//! Agents' git worktrees (issue 27): SKELETON, filled in by the workspace work.
//!
//! The contract the broker codes against (see `Runtime::prepare_worktree`,
//! `Runtime::agent_diff`, `Runtime::worktree_dirty`, `Runtime::orphan_worktrees`).

use std::path::PathBuf;

/// Why a worktree cannot be made, committed, reverted or removed. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// `git` is not installed (or not on PATH) on this host.
    #[error("git is not installed on this host (or not on PATH): install it (Debian: `apt install git`) to give agents worktrees")]
    GitMissing,
    /// The agent's `cwd` is not in a git repository.
    #[error("{repo} is not a git repository: `git init` it (and commit), or pass the repository's directory as --cwd")]
    NotARepo { repo: PathBuf },
    /// The base ref does not name a commit in the repository.
    #[error("{base:?} is not a branch, tag or commit of {repo}: see `git -C {repo} branch -a`")]
    UnknownRef { repo: PathBuf, base: String },
    /// The branch exists and is not this agent's.
    #[error("branch {branch} already exists in {repo} and is not this agent's worktree: delete it (`git -C {repo} branch -D {branch}`) if its work is not needed, or name the agent differently")]
    BranchTaken { repo: PathBuf, branch: String },
    /// The default base (the repository's current branch) has uncommitted changes the
    /// worktree would not have.
    #[error("{repo} has uncommitted changes ({files}) that the agent's worktree would not have: commit or stash them first, or name the base explicitly with --base to branch without them")]
    DirtyBase { repo: PathBuf, files: String },
    /// The worktree holds work not committed (removal without force).
    #[error("the worktree {path} holds uncommitted changes ({files}): commit them, or remove with --force (they are committed on the agent's branch first)")]
    Dirty { path: PathBuf, files: String },
    /// Reverting conflicts with later changes.
    #[error("reverting flight {flight} conflicts with later changes in {files}: nothing was changed; revert by hand in {path}")]
    RevertConflict {
        flight: String,
        path: PathBuf,
        files: String,
    },
    /// A git command failed.
    #[error("git {args} failed in {dir}: {stderr}")]
    Git {
        args: String,
        dir: PathBuf,
        stderr: String,
    },
    #[error("worktree: {0}")]
    Io(#[from] std::io::Error),
}
