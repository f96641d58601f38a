//! Edges of the commit per flight, with real git in temp repositories: a marker is
//! dropped only by the commit of it (a reconcile at the start racing the agent's next
//! turn), the user's hooks never run in (or break) Relay's commits, a worktree made again
//! while its harness ran restarts the harness there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use relay_protocol::domain::MAX_RECORDED_PATCH;
use support::drive::*;
use support::repo::{direct, spec, write, Repo};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_is_dropped_only_by_the_commit_of_it() {
    let repo = Repo::new();
    let d = direct(&repo).await;
    let (ws, wt, record) = (&d.ws, d.wt.as_path(), &d.record);
    // A turn ended and the process died before its commit.
    ws.begin(wt, "flt_a1_1", "one").await.unwrap();
    write(wt, "a.txt", "1\n");
    // At the next start the reconcile commits it...
    let late = ws.commit(wt, record).await.unwrap().unwrap();
    // ... while the agent's worker, starting a turn dispatched again, finds that commit,
    // drops the marker and writes its own.
    let found = ws.commit(wt, record).await.unwrap().unwrap();
    assert_eq!(
        found.commit.as_ref().unwrap().commit,
        late.commit.as_ref().unwrap().commit
    );
    ws.finish(wt, &found.marker).await.unwrap();
    let next = ws.begin(wt, "flt_a1_2", "two").await.unwrap();
    assert!(next.pending.is_empty());
    // The reconcile's removal, late, leaves the running turn's marker alone.
    ws.finish(wt, &late.marker).await.unwrap();
    write(wt, "b.txt", "2\n");
    let second = ws
        .commit(wt, record)
        .await
        .unwrap()
        .expect("the running turn's marker is still there");
    assert_eq!(second.marker, next);
    let c = second.commit.unwrap();
    assert_eq!(c.files.len(), 1);
    assert_eq!(c.files[0].path, "b.txt");
    assert_eq!(
        repo.git(&[
            "log",
            "-1",
            "--format=%(trailers:key=Relay-Flight,valueonly)",
            "relay/a1"
        ]),
        "flt_a1_2"
    );
}

/// Writes an executable hook of the repository.
fn hook(repo: &Repo, name: &str, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = repo.path.join(".git/hooks").join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_repositorys_hooks_neither_break_nor_run_in_relays_commits() {
    let repo = Repo::new();
    let ran = repo.path.parent().unwrap().join("hooks ran");
    // commitizen's hook: it needs a terminal, and fails without one.
    hook(
        &repo,
        "prepare-commit-msg",
        "exec < /dev/tty && exit 0; exit 1",
    );
    for name in ["post-commit", "post-checkout", "pre-commit", "commit-msg"] {
        hook(&repo, name, &format!("echo {name} >> '{}'", ran.display()));
    }
    // A filesystem monitor runs its program at each `git status`.
    let monitor = repo.path.parent().unwrap().join("monitor");
    std::fs::write(
        &monitor,
        format!("#!/bin/sh\necho fsmonitor >> '{}'\nexit 1\n", ran.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        &monitor,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    repo.git(&["config", "core.fsmonitor", &monitor.display().to_string()]);
    let d = direct(&repo).await;
    let (ws, wt, record) = (&d.ws, d.wt.as_path(), &d.record);
    ws.begin(wt, "flt_a1_1", "one").await.unwrap();
    write(wt, "a.txt", "1\n");
    let a1 = spec("a1", &repo.path, None, &[]);
    assert_eq!(ws.dirty(&a1).await.unwrap(), ["a.txt"]);
    let done = ws.commit(wt, record).await.unwrap().unwrap();
    let c = done.commit.unwrap();
    assert_eq!(c.commit.unwrap(), repo.git(&["rev-parse", "relay/a1"]));
    assert!(
        !ran.exists(),
        "hooks ran: {}",
        std::fs::read_to_string(&ran).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_past_its_limit_is_recorded_cut() {
    let repo = Repo::new();
    let d = direct(&repo).await;
    let (ws, wt, record) = (&d.ws, d.wt.as_path(), &d.record);
    ws.begin(wt, "flt_a1_1", "one").await.unwrap();
    // Lines of 3 bytes and a 4-byte character: the cut falls inside one somewhere.
    let big = "é😀\n".repeat(4 * MAX_RECORDED_PATCH / 7);
    write(wt, "big.txt", &big);
    let c = ws
        .commit(wt, record)
        .await
        .unwrap()
        .unwrap()
        .commit
        .unwrap();
    assert!(c.patch_truncated);
    let patch = c.patch.unwrap();
    assert!(patch.len() <= MAX_RECORDED_PATCH && patch.len() > MAX_RECORDED_PATCH - 8);
    assert!(
        patch.starts_with("diff --git a/big.txt b/big.txt"),
        "{}",
        &patch[..80]
    );
    assert_eq!(c.files[0].added, (4 * MAX_RECORDED_PATCH / 7) as u64);
    let (_, diff) = ws.diff(&spec("a1", &repo.path, None, &[])).await.unwrap();
    assert!(diff.truncated && diff.patch.len() <= MAX_RECORDED_PATCH);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worktree_made_again_under_a_live_session_restarts_it_there() {
    let repo = Repo::new();
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    let spec = spec("a1", &repo.path, None, &[]);
    let mut sessions = Sessions::default();
    runtime
        .dispatch(dispatch_to(&spec, &flight_of("a1", 1), "add"))
        .await
        .unwrap();
    sessions
        .serve(&mut script, 1, |cwd, _| write(cwd, "kept.txt", "kept\n"))
        .await;
    until_ended(&mut reports, 1).await;
    assert_eq!(sessions.spawned, 1);
    // Deleted by hand while the session lives on (its process's directory is gone).
    std::fs::remove_dir_all(sessions.cwd("a1")).unwrap();
    runtime
        .dispatch(dispatch_to(&spec, &flight_of("a1", 2), "again"))
        .await
        .unwrap();
    sessions
        .serve(&mut script, 1, |cwd, _| {
            assert!(cwd.join("kept.txt").is_file());
        })
        .await;
    until_ended(&mut reports, 1).await;
    assert_eq!(sessions.spawned, 2, "the harness was not started again");
}
