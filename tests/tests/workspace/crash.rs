//! `kill -9` of the broker between a turn's end and its commit. The commit is made to
//! wait, deterministically, by holding git's index lock in the agent's worktree while
//! the turn runs: the runtime retries and notes "cannot commit yet" on the flight. Then
//! the broker is killed (its Codex child goes with it), the lock is released, and the
//! broker starts again on the same data dir: exactly one commit names the flight, the
//! flight records it, and the file is in it. Not twice (another turn later still finds
//! one), not lost.

use std::path::PathBuf;
use std::time::Duration;

use relay_tests::agents::state;
use relay_tests::procs;

use crate::repo::{
    env_with_repo, git, private_git_dir, wait_commit, wait_ended, wait_note, worktree_of,
    write_prompt,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_cut_short_by_kill_9_is_made_once_after_the_restart() {
    let (mut env, repo) = env_with_repo().await;
    // No rule: the write waits for a person, so the turn is known to be running.
    env.add_agent("cx", &["--worktree"]);
    let flight = env.ask_no_wait("cx", &write_prompt("kept.txt", "not lost"));
    let approval = env.wait_approval(&flight).await;

    // The worktree exists once the turn runs: hold its index lock, as a git command
    // running there would.
    let wt = PathBuf::from(worktree_of(&env, "cx").await["path"].as_str().unwrap());
    let lock = private_git_dir(&wt).join("index.lock");
    std::fs::write(&lock, "").unwrap();
    let codex = env.codex_pid("cx").await;
    env.relay.cli_ok(&[
        "approval",
        "decide",
        approval["id"].as_str().unwrap(),
        "accept",
    ]);
    let note = wait_note(&env, &flight, "cannot commit yet", 30).await;
    assert!(note.contains("index.lock"), "git's words: {note}");
    // The turn has ended (the file is written), and its commit is not made.
    assert_eq!(
        std::fs::read_to_string(wt.join("kept.txt")).ok().as_deref(),
        Some("not lost")
    );
    let trailer = format!("Relay-Flight: {flight}");
    assert!(repo.commits_with("relay/cx", &trailer).is_empty());

    env.relay.kill9();
    assert!(
        procs::wait_gone(codex, Duration::from_secs(15)).await,
        "codex {codex} outlived its broker"
    );
    std::fs::remove_file(&lock).unwrap();
    env.relay.restart().unwrap();

    let f = wait_commit(&env, &flight, 60).await;
    let commits = repo.commits_with("relay/cx", &trailer);
    assert_eq!(commits.len(), 1, "one commit names the flight: {commits:?}");
    assert_eq!(f["commit"]["commit"], commits[0].as_str(), "{f}");
    assert_eq!(repo.file_at(&commits[0], "kept.txt"), "not lost");
    assert_eq!(repo.files_of(&commits[0]), vec!["kept.txt".to_string()]);
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    // The flight ends too (its end was on disk before the kill).
    wait_ended(&env, &flight).await;

    // Not twice: the next turn (its own reconcile first) leaves one commit for it.
    let next = env.ask_no_wait("cx", "anything else?");
    let n = wait_ended(&env, &next).await;
    assert_eq!(state(&n), "completed", "{n}");
    assert_eq!(repo.commits_with("relay/cx", &trailer), commits);
    assert!(
        n["commit"].is_null(),
        "a turn that changed nothing commits nothing: {n}"
    );
    let commit_updates = crate::repo::updates_of(&env, &flight, "commit").await;
    let shas: Vec<_> = commit_updates
        .iter()
        .map(|u| u["commit"]["commit"].clone())
        .collect();
    assert!(
        !shas.is_empty() && shas.iter().all(|s| *s == commits[0].as_str()),
        "every commit reported for the flight is the one commit: {shas:?}"
    );
}
