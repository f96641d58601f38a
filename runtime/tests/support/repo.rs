//! Real git repositories in temp dirs for the workspace tests, with their own identity
//! (nothing of the user's git config is needed), and [`direct`]: a worktree made by a runtime,
//! driven through its `Workspaces` step by step.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs git in `dir`; its stdout. Panics with git's words on failure.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("LC_ALL", "C")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository on branch `main` with one commit (`README.md`, `src/lib.txt`), in a
/// directory whose name has a space.
pub struct Repo {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Repo {
    pub fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("my repo");
        std::fs::create_dir(&path).unwrap();
        let path = std::fs::canonicalize(&path).unwrap();
        git(&path, &["init", "-q", "-b", "main"]);
        git(&path, &["config", "user.name", "Tester"]);
        git(&path, &["config", "user.email", "tester@example.com"]);
        std::fs::write(path.join("README.md"), "hello\n").unwrap();
        std::fs::create_dir(path.join("src")).unwrap();
        std::fs::write(path.join("src/lib.txt"), "one\ntwo\nthree\n").unwrap();
        std::fs::write(path.join(".gitignore"), ".env\n").unwrap();
        git(&path, &["add", "-A"]);
        git(&path, &["commit", "-q", "-m", "init"]);
        Repo { _dir: dir, path }
    }

    pub fn git(&self, args: &[&str]) -> String {
        git(&self.path, args)
    }

    pub fn head(&self) -> String {
        self.git(&["rev-parse", "HEAD"])
    }
}

/// The spec of agent `name` with a worktree of `repo` (base, copy as given).
pub fn spec(
    name: &str,
    repo: &Path,
    base: Option<&str>,
    copy: &[&str],
) -> relay_protocol::domain::AgentSpec {
    let mut spec = relay_protocol::domain::AgentSpec::new(
        name,
        relay_protocol::domain::Harness::ClaudeStreamJson,
        repo.display().to_string(),
    );
    spec.worktree = Some(relay_protocol::domain::WorktreeSpec {
        base: base.map(str::to_string),
        dir: None,
        copy: copy.iter().map(|c| c.to_string()).collect(),
    });
    spec
}

/// Writes `text` to `file` under `dir`, making its directories.
pub fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().expect("a file has a parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// Takes git's index lock of the worktree `cwd` (as another git process would hold
/// it); the lock file's path, to remove to release it.
pub fn hold_index_lock(cwd: &Path) -> PathBuf {
    let path = PathBuf::from(git(
        cwd,
        &[
            "rev-parse",
            "--path-format=absolute",
            "--git-path",
            "index.lock",
        ],
    ));
    std::fs::write(&path, "").expect("lock");
    path
}

/// Agent `a1`'s worktree of `repo`, made by a runtime, and the runtime's
/// [`relay_runtime::workspace::Workspaces`] to drive it directly (no worker: the steps a
/// turn, a crash or a restart would take, one by one).
#[allow(dead_code)]
pub struct Direct {
    pub runtime: relay_runtime::Runtime,
    pub ws: relay_runtime::workspace::Workspaces,
    pub wt: std::path::PathBuf,
    pub record: relay_runtime::threads::WorktreeRecord,
    _guards: (
        tempfile::TempDir,
        super::Reports,
        tokio_util::sync::CancellationToken,
        super::Script,
    ),
}

#[allow(dead_code)]
pub async fn direct(repo: &Repo) -> Direct {
    let (launcher, script) = super::full();
    let (dir, runtime, reports, stop) = super::runtime(launcher, None);
    let state = runtime
        .prepare_worktree(&spec("a1", &repo.path, None, &[]))
        .await
        .expect("worktree made");
    let wt = std::path::PathBuf::from(&state.path);
    let ws = relay_runtime::workspace::Workspaces::new(
        runtime.threads().clone(),
        dir.path().to_path_buf(),
    );
    let record = ws.record(&wt).await.expect("read").expect("recorded");
    Direct {
        runtime,
        ws,
        wt,
        record,
        _guards: (dir, reports, stop, script),
    }
}
