//! A commit per flight. At a turn's start a marker goes into the worktree's private
//! git dir (`relay-flight`, fsynced): the flight, the branch's tip then, and the
//! flights whose own commit could not be made (carried into this one). At the turn's
//! end the worktree's changes are committed with a `Relay-Flight:` trailer per flight,
//! and what changed is recorded; then the marker goes. A marker found later (a crash,
//! or a lock held past the patience) is committed then, once: a commit since the
//! marker's start that already names the flight is taken as that commit (a crash
//! between the commit and the marker's removal), never a second one naming it: what
//! the worktree gained since is left uncommitted, carried into the next turn's commit.
//! Blocking.

use std::io::Write;
use std::path::{Path, PathBuf};

use relay_protocol::domain::{FileChange, FlightCommit, FLIGHT_TRAILER, MAX_RECORDED_PATCH};
use serde::{Deserialize, Serialize};

use super::{git, WorkspaceError};
use crate::threads::WorktreeRecord;

/// The marker's file name, in the worktree's own git dir.
const MARKER: &str = "relay-flight";
/// Longest first line of a flight's commit message, `relay: ` included.
const TITLE_MAX: usize = 72;
/// The identity of Relay's commits in a repository that has none configured.
const RELAY_IDENTITY: [&str; 4] = ["-c", "user.name=Relay", "-c", "user.email=relay@localhost"];

/// What a turn in progress (or ended without its commit) left in its worktree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    pub flight: String,
    /// The branch's tip when the turn started.
    pub start: String,
    /// The commit's first line (`relay: <the task's first line>`).
    pub title: String,
    /// Earlier flights whose changes are carried into this commit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
}

impl Marker {
    /// The marker of flight `flight` (task `task`) starting at `start`.
    pub fn new(flight: &str, task: &str, start: String) -> Marker {
        let first = task.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        Marker {
            flight: flight.to_string(),
            start,
            title: cut(&format!("relay: {}", first.trim()), TITLE_MAX),
            pending: Vec::new(),
        }
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn marker_file(path: &Path) -> Result<PathBuf, WorkspaceError> {
    Ok(PathBuf::from(git::line(path, &["rev-parse", "--absolute-git-dir"])?).join(MARKER))
}

/// The marker left in the worktree at `path`, if any. One that does not decode is
/// reported as an error (it is left for a person to look at).
pub(crate) fn read_marker(path: &Path) -> Result<Option<Marker>, WorkspaceError> {
    let file = marker_file(path)?;
    match std::fs::read(&file) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            WorkspaceError::Io(std::io::Error::other(format!(
                "{} is not a marker Relay can read ({e}): delete it once its changes are committed",
                file.display()
            )))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes the marker, on disk (fsynced, and its directory) before it returns.
pub(crate) fn write_marker(path: &Path, marker: &Marker) -> Result<(), WorkspaceError> {
    let file = marker_file(path)?;
    let tmp = file.with_extension("tmp");
    let bytes = serde_json::to_vec(marker).map_err(std::io::Error::other)?;
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &file)?;
    if let Some(dir) = file.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

pub(crate) fn clear_marker(path: &Path) -> Result<(), WorkspaceError> {
    match std::fs::remove_file(marker_file(path)?) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// The worktree's HEAD commit.
pub(crate) fn head(path: &Path) -> Result<String, WorkspaceError> {
    git::line(path, &["rev-parse", "--verify", "HEAD"])
}

/// `-c` options giving the commit an author: the repository's (or the user's) identity
/// where one is configured, else Relay's.
pub(crate) fn identity(path: &Path) -> Result<&'static [&'static str], WorkspaceError> {
    let name = git::succeeds(path, &["config", "--get", "user.name"])?;
    let email = git::succeeds(path, &["config", "--get", "user.email"])?;
    Ok(if name && email { &[] } else { &RELAY_IDENTITY })
}

/// Stages everything in the worktree but the files copied in (never committed).
pub(crate) fn stage_all(path: &Path, copied: &[String]) -> Result<(), WorkspaceError> {
    let excluded: Vec<String> = copied
        .iter()
        .map(|c| format!(":(exclude,literal){c}"))
        .collect();
    let mut args = vec!["add", "-A", "--", "."];
    args.extend(excluded.iter().map(String::as_str));
    git::run_once(path, &args).map(|_| ())
}

/// Commits what is staged with `message`; its commit. A lock held is
/// [`WorkspaceError::Locked`], for the caller to retry.
pub(crate) fn commit_staged(path: &Path, message: &str) -> Result<String, WorkspaceError> {
    let mut args: Vec<&str> = identity(path)?.to_vec();
    args.extend([
        "commit",
        "--quiet",
        "--no-verify",
        "--cleanup=whitespace",
        "-m",
        message,
    ]);
    git::run_once(path, &args)?;
    head(path)
}

/// Whether something is staged.
pub(crate) fn staged(path: &Path) -> Result<bool, WorkspaceError> {
    Ok(!git::succeeds(path, &["diff", "--cached", "--quiet"])?)
}

/// The commits of `range`, oldest first, with whether each names `flight` in a
/// `Relay-Flight:` trailer.
fn commits_of(
    path: &Path,
    range: &str,
    flight: &str,
) -> Result<Vec<(String, bool)>, WorkspaceError> {
    let log = git::run(path, &["log", "--reverse", "--format=%H%x00%B%x01", range])?;
    let trailer = format!("{FLIGHT_TRAILER}: {flight}");
    Ok(log
        .split('\u{1}')
        .filter_map(|entry| {
            let (id, body) = entry.trim_start_matches('\n').split_once('\0')?;
            Some((id.to_string(), body.lines().any(|l| l.trim() == trailer)))
        })
        .collect())
}

/// Commits the changes of the flight `marker` names (and the flights it carries) on
/// the worktree at `path`, and records them. `None`: nothing changed and the agent
/// made no commit. Idempotent: see the module docs. Does not clear the marker.
pub(crate) fn commit(
    path: &Path,
    marker: &Marker,
    record: &WorktreeRecord,
) -> Result<Option<FlightCommit>, WorkspaceError> {
    let range = format!("{}..HEAD", marker.start);
    let before = commits_of(path, &range, &marker.flight)?;
    let made = before
        .iter()
        .find(|(_, ours)| *ours)
        .map(|(c, _)| c.clone());
    let ours = match made {
        // One commit per flight: changes made since (the harness still writing after
        // it) stay in the worktree for the next turn's commit, which stages everything.
        Some(c) => Some(c),
        None => {
            stage_all(path, &record.copied)?;
            if staged(path)? {
                let mut message = format!("{}\n\n", marker.title);
                for f in std::iter::once(&marker.flight).chain(&marker.pending) {
                    message.push_str(&format!("{FLIGHT_TRAILER}: {f}\n"));
                }
                Some(commit_staged(path, &message)?)
            } else {
                None
            }
        }
    };
    let agent_commits: Vec<String> = before
        .into_iter()
        .filter(|(c, named)| !named && Some(c) != ours.as_ref())
        .map(|(c, _)| c)
        .collect();
    if ours.is_none() && agent_commits.is_empty() {
        return Ok(None);
    }
    let head = head(path)?;
    let (mut files, added, removed) = numstat(path, &marker.start, &head)?;
    let more_files = relay_protocol::domain::cap_files(&mut files);
    let (patch, patch_truncated) = patch(path, &marker.start, &head)?;
    Ok(Some(FlightCommit {
        branch: record.branch.clone(),
        start: marker.start.clone(),
        head,
        commit: ours,
        agent_commits,
        files,
        more_files,
        added,
        removed,
        also_flights: marker.pending.clone(),
        patch: Some(patch),
        patch_truncated,
        reverted_by: None,
    }))
}

/// The files `from..to` changed, with their lines; the lines in all.
pub(crate) fn numstat(
    dir: &Path,
    from: &str,
    to: &str,
) -> Result<(Vec<FileChange>, u64, u64), WorkspaceError> {
    let out = git::run(dir, &["diff", "--numstat", "-z", "--no-renames", from, to])?;
    let mut files = Vec::new();
    let (mut added, mut removed) = (0, 0);
    for entry in out.split('\0').filter(|e| !e.is_empty()) {
        let mut parts = entry.splitn(3, '\t');
        let (Some(a), Some(r), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let binary = a == "-";
        let (a, r) = (a.parse().unwrap_or(0), r.parse().unwrap_or(0));
        added += a;
        removed += r;
        files.push(FileChange {
            path: file.trim_start_matches('\n').to_string(),
            added: a,
            removed: r,
            binary,
        });
    }
    Ok((files, added, removed))
}

/// `git diff from..to`, cut to [`MAX_RECORDED_PATCH`] bytes; whether it was cut. No
/// more of it than that is read.
pub(crate) fn patch(dir: &Path, from: &str, to: &str) -> Result<(String, bool), WorkspaceError> {
    let args = [
        "diff",
        "--no-renames",
        "--no-color",
        "--no-ext-diff",
        from,
        to,
    ];
    let (text, more) = git::capped(dir, &args, MAX_RECORDED_PATCH)?;
    // Bytes cut mid-character come back as U+FFFD, longer than they were.
    if text.len() <= MAX_RECORDED_PATCH && !more {
        return Ok((text, false));
    }
    Ok((cut(&text, MAX_RECORDED_PATCH), true))
}
