//! Making an agent's worktree, or finding the one made before; making it again from
//! its branch when it was deleted or moved by hand (never the repository itself in its
//! place); copying in the untracked files asked for; its state (head, ahead/behind).
//! Blocking.

use std::path::{Path, PathBuf};

use relay_protocol::clock::now_ms;
use relay_protocol::domain::{branch_of, short, AgentSpec, WorktreeState};

use super::git;
use super::WorkspaceError;
use crate::threads::WorktreeRecord;

/// What [`plan`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// The worktree is there.
    Ready,
    /// The branch is the agent's and its worktree is gone: make it again from the branch.
    Recreate,
    /// Neither is there: make the branch from the base, and the worktree on it.
    Create,
}

/// The git config key that says which worktree a `relay/NAME` branch was made for (the
/// branch is "this agent's" when it equals the worktree's path); `git branch -D` drops it.
fn owner_key(branch: &str) -> String {
    format!("branch.{branch}.relayWorktree")
}

/// Looks at agent `spec`'s worktree at `path` (`known`: the registry's record of that
/// path): what is to be done, and the record it is (or will be) made under.
pub(crate) fn plan(
    spec: &AgentSpec,
    path: &Path,
    known: Option<&WorktreeRecord>,
) -> Result<(Plan, WorktreeRecord), WorkspaceError> {
    git::present()?;
    let repo = git::toplevel(Path::new(&spec.cwd))?;
    let branch = branch_of(&spec.name);
    if is_live(&repo, path)? {
        let record = match known {
            Some(r) => r.clone(),
            None => found_record(&repo, &spec.name, &branch)?,
        };
        return Ok((Plan::Ready, record));
    }
    if canonical(path).starts_with(&repo) {
        return Err(WorkspaceError::InsideRepo {
            path: path.to_path_buf(),
            repo,
        });
    }
    let taken = path.exists() && !is_empty_dir(path);
    if git::branch_exists(&repo, &branch)? {
        let owner = git::output(&repo, &["config", "--get", &owner_key(&branch)])?;
        if !owner.ok || Path::new(owner.stdout.trim_end_matches('\n')) != path {
            return Err(WorkspaceError::BranchTaken { repo, branch });
        }
        if taken {
            return Err(WorkspaceError::PathTaken {
                path: path.to_path_buf(),
                agent: spec.name.clone(),
            });
        }
        let record = match known {
            Some(r) => r.clone(),
            None => found_record(&repo, &spec.name, &branch)?,
        };
        return Ok((Plan::Recreate, record));
    }
    if taken {
        return Err(WorkspaceError::PathTaken {
            path: path.to_path_buf(),
            agent: spec.name.clone(),
        });
    }
    let given = spec.worktree.as_ref().and_then(|w| w.base.as_deref());
    let (base, base_commit) = base(&repo, given)?;
    Ok((
        Plan::Create,
        WorktreeRecord {
            repo: repo.display().to_string(),
            agent: spec.name.clone(),
            branch,
            base,
            base_commit,
            copied: Vec::new(),
            recreated: 0,
            created_at: now_ms(),
        },
    ))
}

/// The base the branch starts from: the ref given, else the repository's current
/// branch (a detached HEAD: `HEAD@<commit>`), refused while that checkout has
/// uncommitted changes to tracked files. (name, commit).
fn base(repo: &Path, given: Option<&str>) -> Result<(String, String), WorkspaceError> {
    let head = git::commit_of(repo, "HEAD")?;
    if head.is_none()
        && git::run(repo, &["for-each-ref", "--count=1"])?
            .trim()
            .is_empty()
    {
        return Err(WorkspaceError::NoCommits {
            repo: repo.to_path_buf(),
        });
    }
    if let Some(given) = given {
        return match git::commit_of(repo, given)? {
            Some(commit) => Ok((given.to_string(), commit)),
            None => Err(WorkspaceError::UnknownRef {
                repo: repo.to_path_buf(),
                base: given.to_string(),
            }),
        };
    }
    let Some(head) = head else {
        // An unborn current branch in a repository with other refs.
        return Err(WorkspaceError::NoCommits {
            repo: repo.to_path_buf(),
        });
    };
    let dirty = git::dirty_files(repo, false, &[])?;
    if !dirty.is_empty() {
        return Err(WorkspaceError::DirtyBase {
            repo: repo.to_path_buf(),
            files: git::some_files(&dirty),
        });
    }
    let name = git::output(repo, &["symbolic-ref", "--short", "-q", "HEAD"])?;
    let name = match name.ok {
        true => name.stdout.trim().to_string(),
        false => format!("HEAD@{}", short(&head)),
    };
    Ok((name, head))
}

/// A record for a branch of ours the registry does not know (its database was lost):
/// the base is the repository's current branch, from where the branch left it.
fn found_record(repo: &Path, agent: &str, branch: &str) -> Result<WorktreeRecord, WorkspaceError> {
    let name = git::output(repo, &["symbolic-ref", "--short", "-q", "HEAD"])?;
    let base = match name.ok {
        true => name.stdout.trim().to_string(),
        false => "HEAD".to_string(),
    };
    let base_commit = git::line(repo, &["merge-base", "HEAD", branch]).unwrap_or_default();
    Ok(WorktreeRecord {
        repo: repo.display().to_string(),
        agent: agent.to_string(),
        branch: branch.to_string(),
        base,
        base_commit,
        copied: Vec::new(),
        recreated: 0,
        created_at: now_ms(),
    })
}

fn is_empty_dir(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Whether `path` is a worktree of `repo` (its top, sharing the repository's git dir).
pub(crate) fn is_live(repo: &Path, path: &Path) -> Result<bool, WorkspaceError> {
    if !path.is_dir() {
        return Ok(false);
    }
    let theirs = git::output(path, &["rev-parse", "--show-toplevel", "--git-common-dir"])?;
    if !theirs.ok {
        return Ok(false);
    }
    let mut lines = theirs.stdout.lines();
    let (Some(top), Some(common)) = (lines.next(), lines.next()) else {
        return Ok(false);
    };
    if canonical(Path::new(top)) != canonical(path) {
        return Ok(false);
    }
    let ours = git::line(repo, &["rev-parse", "--git-common-dir"])?;
    Ok(canonical(&path.join(common)) == canonical(&repo.join(ours)))
}

/// Makes the branch from the base and the worktree on it, then copies the untracked
/// files `patterns` name. The files copied.
pub(crate) fn create(
    path: &Path,
    record: &WorktreeRecord,
    patterns: &[String],
) -> Result<Vec<String>, WorkspaceError> {
    let repo = Path::new(&record.repo);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let at = path.display().to_string();
    // The owner first: a crash after `worktree add` must not leave a branch that looks
    // like someone else's.
    git::run(repo, &["config", &owner_key(&record.branch), &at])?;
    git::admin(repo, || {
        git::run(
            repo,
            &[
                "worktree",
                "add",
                "--quiet",
                "-b",
                &record.branch,
                &at,
                &record.base_commit,
            ],
        )
    })?;
    copy(repo, path, patterns)
}

/// Makes the worktree again from its branch (the old one deleted or moved by hand).
pub(crate) fn recreate(path: &Path, record: &WorktreeRecord) -> Result<(), WorkspaceError> {
    let repo = Path::new(&record.repo);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let at = path.display().to_string();
    git::admin(repo, || {
        git::run(repo, &["worktree", "prune"])?;
        git::run(repo, &["worktree", "add", "--quiet", &at, &record.branch])
    })?;
    Ok(())
}

/// Copies the untracked (or ignored) files of `repo` that `patterns` match (git glob
/// pathspecs, relative to the repository) into the worktree at `path`. A symlink is
/// copied as the link, never followed (its target may be outside the repository);
/// files already there are left alone.
fn copy(repo: &Path, path: &Path, patterns: &[String]) -> Result<Vec<String>, WorkspaceError> {
    let mut copied = Vec::new();
    let inside = canonical(path);
    for pattern in patterns {
        let spec = format!(":(glob){pattern}");
        let listed = git::run(repo, &["ls-files", "-z", "--others", "--", &spec])?;
        for file in listed.split('\0').filter(|f| !f.is_empty()) {
            let rel = Path::new(file);
            if rel.is_absolute()
                || rel
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                continue;
            }
            let (from, to) = (repo.join(rel), path.join(rel));
            if to.symlink_metadata().is_ok() {
                continue;
            }
            let meta = from.symlink_metadata()?;
            if let Some(parent) = to.parent() {
                // A directory of the branch may be a symlink out of the worktree: never
                // written (nor a directory made) through it.
                let mut existing = parent;
                while !existing.exists() {
                    existing = existing.parent().unwrap_or(path);
                }
                if !canonical(existing).starts_with(&inside) {
                    tracing::warn!(
                        file,
                        worktree = %path.display(),
                        "not copied: its directory in the worktree is a symlink leading out of it"
                    );
                    continue;
                }
                std::fs::create_dir_all(parent)?;
            }
            if meta.file_type().is_symlink() {
                #[cfg(unix)]
                std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            } else if meta.is_file() {
                std::fs::copy(&from, &to)?;
            } else {
                continue;
            }
            copied.push(file.to_string());
        }
    }
    Ok(copied)
}

/// The worktree's state as the broker shows it: its branch's tip, and ahead/behind
/// against the base (the base ref while it resolves, else the commit it started from).
pub(crate) fn state(path: &Path, record: &WorktreeRecord) -> Result<WorktreeState, WorkspaceError> {
    let repo = Path::new(&record.repo);
    let head = git::commit_of(repo, &format!("refs/heads/{}", record.branch))?.unwrap_or_default();
    let base = match record.base.starts_with("HEAD") {
        false if git::commit_of(repo, &record.base)?.is_some() => record.base.clone(),
        _ => record.base_commit.clone(),
    };
    let (mut ahead, mut behind) = (0, 0);
    if !base.is_empty() && !head.is_empty() {
        let range = format!("{base}...refs/heads/{}", record.branch);
        let counts = git::line(repo, &["rev-list", "--left-right", "--count", &range])?;
        let mut n = counts.split_whitespace().map(|n| n.parse().unwrap_or(0));
        behind = n.next().unwrap_or(0);
        ahead = n.next().unwrap_or(0);
    }
    Ok(WorktreeState {
        path: path.display().to_string(),
        branch: record.branch.clone(),
        base: record.base.clone(),
        base_commit: record.base_commit.clone(),
        head,
        ahead,
        behind,
        recreated: record.recreated,
        updated_at: now_ms(),
    })
}
