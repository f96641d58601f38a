//! Agents' git worktrees (issue 27), through the `git` CLI: an agent with
//! [`WorktreeSpec`](relay_protocol::domain::WorktreeSpec) works in a worktree of its
//! repository on branch `relay/NAME`, never in the repository's own checkout, and each
//! of its flights' changes becomes a commit naming the flight.
//!
//! Every git call blocks: the functions of the parts below run on the blocking pool
//! only, through [`Workspaces`], the async face the runtime and its workers use.
//! - `git.rs`: running git with a clean environment; its errors.
//! - `make.rs`: making an agent's worktree (or finding it), making it again from its
//!   branch when it was deleted or moved by hand, copying the untracked files asked for.
//! - `commit.rs`: the marker a turn leaves in the worktree's git dir, the commit of a
//!   flight's changes, and reconciling a marker left by a crash.
//! - `revert.rs`: a flight's changes undone by a revert commit.
//! - `remove.rs`: removal (the branch stays), what is uncommitted, the agent's diff.
//! - `facade.rs`: [`Workspaces`]: the registry of the worktrees made here (in
//!   [`crate::threads::ThreadStore`]), the per-agent lock that keeps a turn's commit, a
//!   revert and a removal apart, and orphans.

mod commit;
mod facade;
mod git;
mod make;
mod remove;
mod revert;

use std::path::{Path, PathBuf};

pub use commit::Marker;
pub use facade::{Committed, Ensured, TurnLock, Workspaces};
pub use remove::Diff;

/// Why a worktree cannot be made, committed, reverted or removed. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// `git` is not installed (or not on PATH) on this host.
    #[error("git is not installed on this host (or not on PATH): install it (Debian: `apt install git`) to give agents worktrees")]
    GitMissing,
    /// The agent's `cwd` is not in a git repository.
    #[error("{repo} is not a git repository: `git init` it (and commit), or pass the repository's directory as --cwd")]
    NotARepo { repo: PathBuf },
    /// The repository has no commit yet: there is nothing to branch from.
    #[error("{repo} has no commits yet: commit something first (`git -C {repo} commit --allow-empty -m init`), a worktree branches from a commit")]
    NoCommits { repo: PathBuf },
    /// The base ref does not name a commit in the repository.
    #[error("{base:?} is not a branch, tag or commit of {repo}: see `git -C {repo} branch -a`")]
    UnknownRef { repo: PathBuf, base: String },
    /// The branch exists and is not this agent's.
    #[error("branch {branch} already exists in {repo} and is not this agent's worktree: delete it (`git -C {repo} branch -D {branch}`) if its work is not needed, or name the agent differently")]
    BranchTaken { repo: PathBuf, branch: String },
    /// The worktree's directory exists and is not the agent's worktree.
    #[error("{path} exists and is not agent {agent}'s worktree: move it away, or choose another --worktree-dir")]
    PathTaken { path: PathBuf, agent: String },
    /// The worktree would be inside the repository's own checkout (a `--worktree-dir`
    /// in it), where git sees it as an untracked embedded repository.
    #[error("{path} is inside the repository {repo}: its checkout would see the worktree as an untracked embedded repository; pick a --worktree-dir outside the repository (or none: Relay's data dir)")]
    InsideRepo { path: PathBuf, repo: PathBuf },
    /// The default base (the repository's current branch) has uncommitted changes the
    /// worktree would not have.
    #[error("{repo} has uncommitted changes ({files}) that the agent's worktree would not have: commit or stash them first, or name the base explicitly with --base to branch without them")]
    DirtyBase { repo: PathBuf, files: String },
    /// The worktree holds work not committed (removal without force, a revert).
    #[error("the worktree {path} holds uncommitted changes ({files}): commit them, or remove with --force (they are committed on the agent's branch first)")]
    Dirty { path: PathBuf, files: String },
    /// Reverting conflicts with later changes.
    #[error("reverting flight {flight} conflicts with later changes in {files}: nothing was changed; revert by hand in {path}")]
    RevertConflict {
        flight: String,
        path: PathBuf,
        files: String,
    },
    /// The flight's changes are undone already (or there were none).
    #[error("flight {flight} has no changes left to revert on {branch}")]
    NothingToRevert { flight: String, branch: String },
    /// A turn runs on the agent: its worktree is not to be changed under it.
    #[error("agent {agent} is running flight {flight}: revert after it ends, or interrupt it (`relay interrupt {flight}`)")]
    Running { agent: String, flight: String },
    /// The agent has no worktree made by this runtime.
    #[error("agent {agent} has no worktree here: it was registered without --worktree, or its worktree was not made yet (it is made at its first turn)")]
    NoWorktree { agent: String },
    /// The agent runs on another host.
    #[error("agent {agent} runs on node {node}: its worktree is on that host; run `git -C <its worktree> diff` there")]
    OnNode { agent: String, node: String },
    /// Another git process holds a lock of the repository (`index.lock`...).
    #[error("another git process holds a lock in {dir}: {stderr}")]
    Locked { dir: PathBuf, stderr: String },
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

/// Where agent `name`'s worktree is made: `DIR/NAME` for a `--worktree-dir` (relative:
/// to the repository `cwd`), else `<data_dir>/worktrees/NAME`. Its longest existing
/// ancestor is made canonical, so the path is the same string before and after the
/// directories are made (a data dir under a symlink) and compares equal to git's.
pub fn worktree_path(spec: &relay_protocol::domain::AgentSpec, data_dir: &Path) -> PathBuf {
    let parent = match spec.worktree.as_ref().and_then(|w| w.dir.as_deref()) {
        Some(dir) => Path::new(&spec.cwd).join(dir),
        None => data_dir.join("worktrees"),
    };
    let mut existing = parent.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(up), Some(name)) => {
                rest.push(name.to_os_string());
                existing = up;
            }
            _ => break,
        }
    }
    let mut path = std::fs::canonicalize(existing).unwrap_or_else(|_| existing.to_path_buf());
    for name in rest.iter().rev() {
        path.push(name);
    }
    path.join(&spec.name)
}

/// Runs blocking git work on the blocking pool (never on an async worker).
pub(crate) async fn blocking<R, F>(work: F) -> Result<R, WorkspaceError>
where
    F: FnOnce() -> Result<R, WorkspaceError> + Send + 'static,
    R: Send + 'static,
{
    relay_infra::storage::read(work)
        .await
        .map_err(|e| WorkspaceError::Io(std::io::Error::other(e.to_string())))?
}
