//! Git for the tests that need a repository (worktree agents): run with none of this
//! machine's configuration, so a developer's hooks, signing or default branch never
//! change what a test sees.

use std::path::Path;
use std::process::Command;

/// Runs `git ARGS` in `dir` with no system or global config, in the C locale: its
/// stdout, trimmed. Fails the test, with git's stderr, when git fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("LC_ALL", "C")
        .output()
        .unwrap_or_else(|e| panic!("git {args:?} in {}: {e}", dir.display()));
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Makes `dir` (created if missing) a repository on `main` with one commit, `init`,
/// of `README.md` ("hello").
pub fn repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["config", "user.name", "Tester"]);
    git(dir, &["config", "user.email", "tester@example.com"]);
    std::fs::write(dir.join("README.md"), "hello\n")
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "init"]);
}
