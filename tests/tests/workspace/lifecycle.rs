//! Life cycle without litter: a worktree deleted by hand is made again from the branch
//! at the next turn (and the flight says so); `relay agent remove` refuses a worktree
//! holding uncommitted work, and `--force` commits it on the branch, which stays;
//! `relay doctor` (the broker stopped) finds a worktree no agent owns, and `--fix`
//! removes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_tests::agents::{state, Env};
use relay_tests::{relay_cmd, wait_until};

use crate::repo::{
    env_with_repo, git, wait_commit, wait_ended, wait_note, worktree_args, worktree_of,
    write_prompt, Repo,
};

/// Runs a flight of `agent` to its commit.
async fn committed(env: &Env, agent: &str, path: &str, content: &str) -> String {
    let id = env.ask_no_wait(agent, &write_prompt(path, content));
    let f = wait_ended(env, &id).await;
    assert_eq!(state(&f), "completed", "{f}");
    wait_commit(env, &id, 30).await;
    id
}

async fn worktree_path(env: &Env, agent: &str) -> PathBuf {
    PathBuf::from(worktree_of(env, agent).await["path"].as_str().unwrap())
}

/// Whether `git worktree list` of the repository names `path`.
fn listed(repo: &Repo, path: &Path) -> bool {
    let list = repo.git(&["worktree", "list", "--porcelain"]);
    list.lines()
        .any(|l| l.strip_prefix("worktree ").map(Path::new) == Some(path))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worktree_deleted_by_hand_is_recreated_and_remove_keeps_work() {
    let (env, repo) = env_with_repo().await;
    env.add_agent("cx", &worktree_args());
    committed(&env, "cx", "one.txt", "first").await;
    let wt = worktree_path(&env, "cx").await;
    std::fs::remove_dir_all(&wt).unwrap();

    // The next turn finds it gone, makes it again from the branch (never the repo
    // itself), and says so on the flight.
    let second = committed(&env, "cx", "two.txt", "second").await;
    let note = wait_note(&env, &second, "made again", 10).await;
    assert!(note.contains(&wt.display().to_string()), "{note}");
    assert_eq!(
        std::fs::read_to_string(wt.join("one.txt")).ok().as_deref(),
        Some("first"),
        "the branch's earlier commit is in the recreated worktree"
    );
    assert_eq!(repo.file_at("relay/cx", "two.txt"), "second");
    assert!(!repo.path.join("two.txt").exists(), "the repo is untouched");
    assert_eq!(worktree_of(&env, "cx").await["recreated"], 1);

    // Uncommitted work: remove refuses, and says what to do.
    std::fs::write(wt.join("draft.txt"), "unfinished").unwrap();
    let out = env.relay.cli(&["agent", "remove", "cx"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--force"), "says what to do: {err}");
    assert!(wt.join("draft.txt").exists());
    assert_eq!(env.agent("cx").await["name"], "cx");

    // --force: the work committed on the branch, the worktree gone, the branch kept.
    let out = env.relay.cli_ok(&["agent", "remove", "cx", "--force"]);
    assert!(
        out.contains("relay/cx") && out.contains("branch -D"),
        "{out}"
    );
    wait_until(
        "the removed agent's worktree to go",
        Duration::from_secs(30),
        || async { (!wt.exists()).then_some(()) },
    )
    .await;
    assert_eq!(repo.file_at("relay/cx", "draft.txt"), "unfinished");
    assert_eq!(repo.file_at("relay/cx", "one.txt"), "first");
    assert!(!listed(&repo, &wt));
    assert_eq!(repo.status(), "");
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_finds_an_orphan_worktree_and_fix_removes_it() {
    let (mut env, repo) = env_with_repo().await;
    env.add_agent("gone", &worktree_args());
    committed(&env, "gone", "left.txt", "behind").await;
    let wt = worktree_path(&env, "gone").await;
    // A worktree git will not remove (locked, as `git worktree lock` leaves it) outlives
    // its agent's removal: Relay keeps it on record rather than forget it.
    git(&repo.path, &["worktree", "lock", &wt.display().to_string()]);
    env.relay.cli_ok(&["agent", "remove", "gone"]);
    env.relay.terminate().unwrap();
    assert!(wt.exists() && listed(&repo, &wt));

    let data = env.relay.data_dir.clone();
    let doctor = |args: &[&str]| relay_cmd(&data, &[&["doctor"], args].concat());
    let orphans = |args: &[&str]| {
        let out = doctor(args);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("doctor {args:?}: {e}: {out:?}"));
        json["orphan_worktrees"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let found = orphans(&["--json"]);
    let at = wt.display().to_string();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (&found[0]["path"], &found[0]["branch"], &found[0]["agent"]),
        (&at.clone().into(), &"relay/gone".into(), &"gone".into()),
        "{found:?}"
    );
    assert!(found[0]["fixed"].is_null(), "{found:?}");
    assert!(wt.exists(), "looking changes nothing");

    git(&repo.path, &["worktree", "unlock", &at]);
    let fixed = orphans(&["--fix", "--json"]);
    assert_eq!(fixed.len(), 1, "{fixed:?}");
    assert!(fixed[0]["fixed"].is_string(), "{fixed:?}");
    assert!(!wt.exists());
    assert!(!listed(&repo, &wt));
    // The branch and its work stay.
    assert_eq!(repo.file_at("relay/gone", "left.txt"), "behind");
    // Fixed: a second look finds nothing.
    assert_eq!(orphans(&["--json"]), Vec::<serde_json::Value>::new());
}
