//! A real git repository in the test's temp dir, and the `relay up` that serves agents
//! with worktrees of it: git run with no system or user configuration (the developer's
//! own `~/.gitconfig` never leaks into a test), an identity set in the repository.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use relay_mock_model::WRITE_FILE_RULE;
use relay_tests::agents::{state, Env};
use serde_json::Value;

/// What git, the test's and the broker's, runs with: no system and no global config.
pub const GIT_ENV: &[(&str, &str)] = &[
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
];

/// The tracked file both agents edit, as the main checkout has it.
pub const SHARED: &str = "shared.txt";
pub const SHARED_TEXT: &str = "line one\nline two\nline three\n";

/// Runs git in `dir`; its stdout. Panics, with stderr, when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = try_git(dir, args);
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn try_git(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(dir).args(args);
    for (k, v) in GIT_ENV {
        cmd.env(k, v);
    }
    cmd.output().expect("running git")
}

/// A repository with one commit on `main` holding [`SHARED`].
pub struct Repo {
    pub path: PathBuf,
}

impl Repo {
    pub fn init(path: &Path) -> Repo {
        std::fs::create_dir_all(path).unwrap();
        git(path, &["init", "-q", "-b", "main"]);
        git(path, &["config", "user.name", "Test Person"]);
        git(path, &["config", "user.email", "test@localhost"]);
        std::fs::write(path.join(SHARED), SHARED_TEXT).unwrap();
        git(path, &["add", "-A"]);
        git(path, &["commit", "-q", "-m", "the start"]);
        Repo {
            path: path.to_path_buf(),
        }
    }

    pub fn git(&self, args: &[&str]) -> String {
        git(&self.path, args)
    }

    /// `git status --porcelain` of the main checkout (empty: clean).
    pub fn status(&self) -> String {
        self.git(&["status", "--porcelain", "--untracked-files=all"])
    }

    /// The commits of `rev`'s history whose message matches `pattern` (`git log --grep`,
    /// fixed string), newest first.
    pub fn commits_with(&self, rev: &str, pattern: &str) -> Vec<String> {
        let out = self.git(&["log", "--format=%H", "-F", "--grep", pattern, rev]);
        out.lines().map(str::to_string).collect()
    }

    /// `git show REV:PATH`.
    pub fn file_at(&self, rev: &str, path: &str) -> String {
        self.git(&["show", &format!("{rev}:{path}")])
    }

    /// A commit's full message.
    pub fn message(&self, rev: &str) -> String {
        self.git(&["log", "-1", "--format=%B", rev])
    }

    /// The files a commit changed.
    pub fn files_of(&self, rev: &str) -> Vec<String> {
        let out = self.git(&["show", "--format=", "--name-only", rev]);
        out.lines().map(str::to_string).collect()
    }

    pub fn head(&self, rev: &str) -> String {
        self.git(&["rev-parse", rev]).trim().to_string()
    }
}

/// An [`Env`] whose broker runs git without system or user config, and a repository
/// at `env.work` (the `--cwd` every agent of the env is added with).
pub async fn env_with_repo() -> (Env, Repo) {
    let env = Env::start_with_env(&[], GIT_ENV).await;
    let repo = Repo::init(&env.work);
    (env, repo)
}

/// The registration arguments of an agent with a worktree whose writes
/// ([`relay_mock_model::Reply::write_file`]) are accepted by rule.
pub fn worktree_args() -> Vec<&'static str> {
    vec!["--worktree", "--auto-accept", WRITE_FILE_RULE]
}

/// The prompt that makes the scripted model write `content` to `path` (`\n` escaped).
pub fn write_prompt(path: &str, content: &str) -> String {
    format!("write:{path} {}", content.replace('\n', "\\n"))
}

/// Waits for a flight to reach a terminal state; it, as the broker has it.
pub async fn wait_ended(env: &Env, flight: &str) -> Value {
    env.wait_flight(flight, 90, |f| {
        matches!(state(f), "completed" | "failed" | "cancelled")
    })
    .await
}

/// Waits until the flight records its commit (reported after the turn's end, so it may
/// come a moment after the terminal state); the flight.
pub async fn wait_commit(env: &Env, flight: &str, secs: u64) -> Value {
    env.wait_flight(flight, secs, |f| f["commit"]["head"].is_string())
        .await
}

/// The updates of `flight` of kind `kind` (`note`, `commit`, `reverted`).
pub async fn updates_of(env: &Env, flight: &str, kind: &str) -> Vec<Value> {
    let updates = env.updates(flight).await;
    updates.into_iter().filter(|u| u["kind"] == kind).collect()
}

/// Waits until `flight` has a note containing `text`; the note's text.
pub async fn wait_note(env: &Env, flight: &str, text: &str, secs: u64) -> String {
    relay_tests::wait_until(
        format!("a note {text:?} on flight {flight}"),
        Duration::from_secs(secs),
        || async {
            let notes = updates_of(env, flight, "note").await;
            notes
                .iter()
                .filter_map(|n| n["text"].as_str())
                .find(|t| t.contains(text))
                .map(str::to_string)
        },
    )
    .await
}

/// The agent's worktree as the broker records it (`agent show --json`), once the
/// runtime has reported it.
pub async fn worktree_of(env: &Env, agent: &str) -> Value {
    let waited = relay_tests::try_wait_until(
        format!("agent {agent}'s worktree"),
        Duration::from_secs(60),
        || async {
            let a = env.agent(agent).await;
            state_of(&a).cloned().ok_or(a)
        },
    )
    .await;
    waited.unwrap_or_else(|e| panic!("{e}"))
}

/// The worktree state in an agent's JSON: `worktree_state` (the agent flattens its
/// spec, whose `worktree` is what the registration asked for).
pub fn state_of(agent: &Value) -> Option<&Value> {
    Some(&agent["worktree_state"]).filter(|w| w["path"].is_string())
}

/// The path of a worktree's private git dir (`<repo>/.git/worktrees/NAME`).
pub fn private_git_dir(worktree: &Path) -> PathBuf {
    let dir = git(worktree, &["rev-parse", "--absolute-git-dir"]);
    PathBuf::from(dir.trim())
}
