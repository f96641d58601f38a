//! An agent's worktree removed (the branch stays: its commits are the agent's work),
//! what it holds uncommitted, and the agent's branch against its base. Blocking.

use std::path::Path;

use super::commit::{commit_staged, numstat, patch, stage_all, staged};
use super::{git, WorkspaceError};
use crate::threads::WorktreeRecord;

/// The files the worktree at `path` holds uncommitted (tracked or untracked; the files
/// copied in when it was made do not count). Empty when the worktree is gone.
pub(crate) fn dirty(path: &Path, record: &WorktreeRecord) -> Result<Vec<String>, WorkspaceError> {
    if !super::make::is_live(Path::new(&record.repo), path)? {
        return Ok(Vec::new());
    }
    git::dirty_files(path, true, &record.copied)
}

/// Removes the worktree at `path`. Uncommitted work refuses it unless `force`, which
/// commits it on the branch first (`why` says whose it was). The commit made, if any.
pub(crate) fn remove(
    path: &Path,
    record: &WorktreeRecord,
    force: bool,
    why: &str,
) -> Result<Option<String>, WorkspaceError> {
    let repo = Path::new(&record.repo);
    if !repo.is_dir() {
        // The repository itself is gone: nothing of git's to tidy.
        return Ok(None);
    }
    if !super::make::is_live(repo, path)? {
        git::admin(repo, || git::run(repo, &["worktree", "prune"]))?;
        return Ok(None);
    }
    let left = git::dirty_files(path, true, &record.copied)?;
    let mut made = None;
    if !left.is_empty() {
        if !force {
            return Err(WorkspaceError::Dirty {
                path: path.to_path_buf(),
                files: git::some_files(&left),
            });
        }
        stage_all(path, &record.copied)?;
        if staged(path)? {
            made = Some(commit_staged(path, &format!("relay: {why}\n"))?);
        }
    }
    let _ = super::commit::clear_marker(path);
    // Forced: the files copied in (and ignored ones) are not work to keep.
    let at = path.display().to_string();
    git::admin(repo, || {
        git::run(repo, &["worktree", "remove", "--force", &at])
    })?;
    Ok(made)
}

/// The agent's branch against its base (`git diff BASE...BRANCH`): files, lines, patch.
pub struct Diff {
    pub files: Vec<relay_protocol::domain::FileChange>,
    pub added: u64,
    pub removed: u64,
    pub patch: String,
    pub truncated: bool,
}

pub(crate) fn diff(record: &WorktreeRecord) -> Result<Diff, WorkspaceError> {
    let repo = Path::new(&record.repo);
    let branch = format!("refs/heads/{}", record.branch);
    let base = match record.base.starts_with("HEAD") {
        false if git::commit_of(repo, &record.base)?.is_some() => record.base.clone(),
        _ => record.base_commit.clone(),
    };
    // BASE...BRANCH: what the branch did since it left the base.
    let from = git::line(repo, &["merge-base", &base, &branch])?;
    let (files, added, removed) = numstat(repo, &from, &branch)?;
    let (patch, truncated) = patch(repo, &from, &branch)?;
    Ok(Diff {
        files,
        added,
        removed,
        patch,
        truncated,
    })
}
