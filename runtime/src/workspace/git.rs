//! Running `git`: a clean environment (nothing of the parent's `GIT_DIR`,
//! `GIT_WORK_TREE`, `GIT_INDEX_FILE`... leaks in: the broker may itself run inside a git
//! hook or a worktree), `LC_ALL=C` so that its messages parse, no prompts, no pager.
//! Blocking: called on the blocking pool only (see [`super::blocking`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::WorkspaceError;

/// The options every Relay git command runs with: no automatic gc or maintenance after
/// a commit (it would take the repository-wide locks that the other agents' commits
/// need, and it is the user's repository to maintain), no commit signing (a signing
/// prompt would hang a turn's end), no hooks at all (`--no-verify` skips only
/// `pre-commit` and `commit-msg`: a `prepare-commit-msg` hook failing without a
/// terminal, as commitizen's does, would fail every turn's commit, one rewriting the
/// message could drop its `Relay-Flight:` trailer, and `post-commit`, `post-checkout`
/// hooks would run the repository's programs at each of Relay's commits), and no
/// filesystem monitor (`core.fsmonitor` runs a program at each `status`, also for a
/// repository an agent nests in its worktree: `-c` reaches the git processes run for
/// submodules too).
const QUIET: [&str; 10] = [
    "-c",
    "gc.auto=0",
    "-c",
    "maintenance.auto=false",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
];

/// How long [`run`] retries a git command that fails on one of the repository's shared
/// locks (a ref, `packed-refs`, `config`) held by another git process (another agent's
/// commit on the same repository).
const SHARED_LOCK_PATIENCE: Duration = Duration::from_secs(10);

/// A git command's output.
pub(crate) struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .args(QUIET)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GIT_") {
            cmd.env_remove(&key);
        }
    }
    cmd.env("LC_ALL", "C")
        .env("LANGUAGE", "C")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_PAGER", "cat")
        .env("GIT_OPTIONAL_LOCKS", "0");
    cmd
}

/// Runs git in `dir` once; a failure is in the output. `Err` only when git cannot be
/// run at all.
pub(crate) fn output(dir: &Path, args: &[&str]) -> Result<Output, WorkspaceError> {
    let out = command(dir, args).output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound if !dir.exists() => WorkspaceError::NotARepo {
            repo: dir.to_path_buf(),
        },
        std::io::ErrorKind::NotFound => WorkspaceError::GitMissing,
        _ => WorkspaceError::Io(e),
    })?;
    Ok(Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Runs git and gives at most `max` bytes of its stdout (as text), and whether there
/// was more: the rest is never read (git is stopped), so a flight that wrote a file of
/// gigabytes costs `max` bytes of memory, not the file's size.
pub(crate) fn capped(
    dir: &Path,
    args: &[&str],
    max: usize,
) -> Result<(String, bool), WorkspaceError> {
    let (bytes, more, stderr, ok) =
        read_capped(command(dir, args), max).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => WorkspaceError::GitMissing,
            _ => WorkspaceError::Io(e),
        })?;
    if !ok && !more {
        return Err(failure(dir, args, stderr));
    }
    Ok((String::from_utf8_lossy(&bytes).into_owned(), more))
}

/// Runs `cmd` (its stdout and stderr piped) and reads at most `max` bytes of its
/// stdout; with more to come, the process is killed. (stdout read, whether there was
/// more, stderr, success).
fn read_capped(mut cmd: Command, max: usize) -> std::io::Result<(Vec<u8>, bool, String, bool)> {
    use std::io::Read;
    let mut child = cmd.spawn()?;
    // stderr drains on its own thread: a full stderr pipe must not stop the child
    // before its stdout is read.
    let errors = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = (&mut e).take(64 * 1024).read_to_end(&mut buf);
            buf
        })
    });
    let mut out = Vec::new();
    let more = match child.stdout.take() {
        Some(stdout) => {
            let mut limited = stdout.take(max as u64 + 1);
            limited.read_to_end(&mut out)?;
            out.len() > max
        }
        None => false,
    };
    if more {
        out.truncate(max);
        let _ = child.kill();
    }
    let status = child.wait()?;
    let stderr = errors
        .and_then(|t| t.join().ok())
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    Ok((out, more, stderr, status.success()))
}

/// Whether git failed on a lock another git process holds.
pub(crate) fn is_lock_error(stderr: &str) -> bool {
    stderr.contains(".lock': File exists")
        || stderr.contains("Unable to create") && stderr.contains(".lock")
        || stderr.contains("cannot lock ref")
        || stderr.contains("could not lock config file")
        || stderr.contains("Another git process seems to be running")
}

/// The error of a failed git command: [`WorkspaceError::Locked`] for a lock held by
/// another process, else [`WorkspaceError::Git`].
pub(crate) fn failure(dir: &Path, args: &[&str], stderr: String) -> WorkspaceError {
    if is_lock_error(&stderr) {
        return WorkspaceError::Locked {
            dir: dir.to_path_buf(),
            stderr,
        };
    }
    WorkspaceError::Git {
        args: args.join(" "),
        dir: dir.to_path_buf(),
        stderr,
    }
}

/// Runs git once; its stdout, or the error.
pub(crate) fn run_once(dir: &Path, args: &[&str]) -> Result<String, WorkspaceError> {
    let out = output(dir, args)?;
    if out.ok {
        Ok(out.stdout)
    } else {
        Err(failure(dir, args, out.stderr))
    }
}

/// Runs git; its stdout, or the error. A lock held by another git process is waited
/// out (up to [`SHARED_LOCK_PATIENCE`]): the agents of one repository share its refs,
/// `packed-refs` and `config`.
pub(crate) fn run(dir: &Path, args: &[&str]) -> Result<String, WorkspaceError> {
    let began = Instant::now();
    let mut wait = Duration::from_millis(20);
    loop {
        match run_once(dir, args) {
            Err(WorkspaceError::Locked { .. }) if began.elapsed() < SHARED_LOCK_PATIENCE => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// Runs git and gives its stdout's first line, trimmed.
pub(crate) fn line(dir: &Path, args: &[&str]) -> Result<String, WorkspaceError> {
    Ok(run(dir, args)?
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string())
}

/// Whether git succeeds (for questions: `rev-parse --verify`, `diff --quiet`).
pub(crate) fn succeeds(dir: &Path, args: &[&str]) -> Result<bool, WorkspaceError> {
    Ok(output(dir, args)?.ok)
}

/// Whether git is installed here.
pub(crate) fn present() -> Result<(), WorkspaceError> {
    output(&std::env::temp_dir(), &["--version"]).map(|_| ())
}

/// The top of the repository `dir` is in, canonical.
pub(crate) fn toplevel(dir: &Path) -> Result<PathBuf, WorkspaceError> {
    let not_a_repo = || WorkspaceError::NotARepo {
        repo: dir.to_path_buf(),
    };
    if !dir.is_dir() {
        return Err(not_a_repo());
    }
    let out = output(dir, &["rev-parse", "--show-toplevel"])?;
    if !out.ok {
        return Err(not_a_repo());
    }
    let top = PathBuf::from(out.stdout.trim_end_matches(['\n', '\r']));
    Ok(std::fs::canonicalize(&top).unwrap_or(top))
}

/// The commit `rev` names, if any.
pub(crate) fn commit_of(dir: &Path, rev: &str) -> Result<Option<String>, WorkspaceError> {
    let spec = format!("{rev}^{{commit}}");
    let out = output(
        dir,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &spec,
        ],
    )?;
    Ok(out
        .ok
        .then(|| out.stdout.trim().to_string())
        .filter(|s| !s.is_empty()))
}

/// Whether branch `branch` exists.
pub(crate) fn branch_exists(dir: &Path, branch: &str) -> Result<bool, WorkspaceError> {
    let r = format!("refs/heads/{branch}");
    succeeds(dir, &["show-ref", "--verify", "--quiet", &r])
}

/// `git status --porcelain` of the worktree at `dir`: the paths with changes (tracked
/// or untracked), except `skip`.
pub(crate) fn dirty_files(
    dir: &Path,
    untracked: bool,
    skip: &[String],
) -> Result<Vec<String>, WorkspaceError> {
    let mode = if untracked {
        "--untracked-files=all"
    } else {
        "--untracked-files=no"
    };
    let out = run(dir, &["status", "--porcelain=v1", "-z", mode])?;
    let mut files = Vec::new();
    let mut entries = out.split('\0');
    while let Some(entry) = entries.next() {
        if entry.len() < 4 {
            continue;
        }
        let (code, path) = entry.split_at(3);
        // A rename's entry is followed by its old path.
        if code.starts_with('R') || code.starts_with('C') {
            entries.next();
        }
        if !skip.iter().any(|s| s == path) {
            files.push(path.to_string());
        }
    }
    Ok(files)
}

/// A few file names for a message: the first five, and how many more.
pub(crate) fn some_files(files: &[String]) -> String {
    let mut s = files.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if files.len() > 5 {
        s.push_str(&format!(" and {} more", files.len() - 5));
    }
    s
}

/// Runs `work` (a `git worktree add`, `prune` or `remove` on `repo`) while no other
/// such work of this process runs on the same repository: git 2.47 reads every
/// worktree's admin dir while adding one, and fails on one another `add` is writing
/// ("failed to read .git/worktrees/NAME/commondir"). Blocking.
pub(crate) fn admin<R>(repo: &Path, work: impl FnOnce() -> R) -> R {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    let lock = {
        let mut locks = LOCKS
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.entry(repo.to_path_buf()).or_default().clone()
    };
    let _held = lock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    work()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_capped_read_stops_the_writer_past_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let finished = dir.path().join("finished");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "head -c 4000000 /dev/zero && touch '{}'",
                finished.display()
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let (out, more, _, _) = read_capped(cmd, 1000).unwrap();
        assert_eq!(out.len(), 1000);
        assert!(more);
        // The writer was stopped before it wrote the rest (the pipe holds 64 KiB).
        assert!(!finished.exists());

        let (out, more, _, ok) = read_capped(command(dir.path(), &["--version"]), 1000).unwrap();
        assert!(ok && !more && out.starts_with(b"git version"));
    }
}
