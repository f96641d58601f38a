//! A flight's changes undone by a commit of its own (`relay revert FLIGHT`), between
//! turns: `git revert --no-commit` of the flight's commits, newest first, then one
//! commit with the `Relay-Revert-Of:` trailer. A conflict is aborted, leaving the
//! worktree as it was. Blocking.

use std::path::Path;

use relay_protocol::clock::now_ms;
use relay_protocol::domain::{FlightCommit, Revert, REVERT_TRAILER};

use super::commit::{commit_staged, numstat, staged};
use super::{git, WorkspaceError};
use crate::threads::WorktreeRecord;

/// Reverts flight `flight`'s commits (`commit.start..commit.head`) on the worktree at
/// `path`. Asked again after it was done, it answers the revert made then.
pub(crate) fn revert(
    path: &Path,
    record: &WorktreeRecord,
    flight: &str,
    commit: &FlightCommit,
    by: &str,
) -> Result<Revert, WorkspaceError> {
    let trailer = format!("{REVERT_TRAILER}: {flight}");
    let since = format!("{}..HEAD", commit.head);
    let done = git::run(path, &["log", "--format=%H%x00%B%x01", &since])?;
    for entry in done.split('\u{1}') {
        if let Some((id, body)) = entry.trim_start_matches('\n').split_once('\0') {
            if body.lines().any(|l| l.trim() == trailer) {
                return described(path, id, by);
            }
        }
    }
    let dirty = git::dirty_files(path, true, &record.copied)?;
    if !dirty.is_empty() {
        return Err(WorkspaceError::Dirty {
            path: path.to_path_buf(),
            files: git::some_files(&dirty),
        });
    }
    let range = format!("{}..{}", commit.start, commit.head);
    let commits = git::run(path, &["rev-list", "--no-merges", &range])?;
    let commits: Vec<&str> = commits.lines().filter(|c| !c.is_empty()).collect();
    if commits.is_empty() {
        return Err(nothing(flight, record));
    }
    let mut args = vec!["revert", "--no-commit", "--no-edit"];
    args.extend(&commits);
    let out = git::output(path, &args)?;
    if !out.ok {
        let conflicted = git::run(path, &["diff", "--name-only", "--diff-filter=U"])
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>();
        abort(path);
        if conflicted.is_empty() {
            return Err(git::failure(path, &args, out.stderr));
        }
        return Err(WorkspaceError::RevertConflict {
            flight: flight.to_string(),
            path: path.to_path_buf(),
            files: git::some_files(&conflicted),
        });
    }
    if !staged(path)? {
        abort(path);
        return Err(nothing(flight, record));
    }
    let message = format!("Revert flight {flight}\n\n{trailer}\n");
    let made = commit_staged(path, &message);
    // `revert --no-commit` leaves the sequencer's state behind; the commit is made.
    let _ = git::output(path, &["revert", "--quit"]);
    described(path, &made?, by)
}

fn nothing(flight: &str, record: &WorktreeRecord) -> WorkspaceError {
    WorkspaceError::NothingToRevert {
        flight: flight.to_string(),
        branch: record.branch.clone(),
    }
}

/// Puts the worktree back as it was before the revert was tried.
fn abort(path: &Path) {
    if !git::output(path, &["revert", "--abort"]).is_ok_and(|o| o.ok) {
        let _ = git::output(path, &["reset", "--merge"]);
    }
}

fn described(path: &Path, commit: &str, by: &str) -> Result<Revert, WorkspaceError> {
    let (mut files, _, _) = numstat(path, &format!("{commit}^"), commit)?;
    let more_files = relay_protocol::domain::cap_files(&mut files);
    Ok(Revert {
        commit: commit.to_string(),
        by: by.to_string(),
        at: now_ms(),
        files,
        more_files,
    })
}
