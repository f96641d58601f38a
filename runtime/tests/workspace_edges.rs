//! Edges of the workspaces found in review, with real git in temp repositories: one
//! commit per flight even when the worktree changed after it was made; a removed
//! agent's worktree goes only once its harness stopped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;

use relay_protocol::runtime::Control;
use support::drive::*;
use support::repo::{direct, spec, write, Repo};
use support::*;

/// The commits of `branch` naming `flight` in their trailer.
fn naming(repo: &Repo, branch: &str, flight: &str) -> usize {
    repo.git(&[
        "log",
        "--format=%(trailers:key=Relay-Flight,valueonly)",
        branch,
    ])
    .lines()
    .filter(|l| l.trim() == flight)
    .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flight_found_committed_is_not_committed_again_when_the_tree_changed_since() {
    let repo = Repo::new();
    let d = direct(&repo).await;
    let (ws, wt, record) = (&d.ws, d.wt.as_path(), &d.record);
    ws.begin(wt, "flt_a1_1", "one").await.unwrap();
    write(wt, "a.txt", "1\n");
    let first = ws.commit(wt, record).await.unwrap().unwrap();
    let made = first.commit.unwrap().commit.unwrap();
    // The process died before the marker went; the harness wrote on meanwhile.
    write(wt, "late.txt", "late\n");
    let again = ws.commit(wt, record).await.unwrap().unwrap();
    let c = again.commit.unwrap();
    assert_eq!(c.commit.as_deref(), Some(made.as_str()));
    assert_eq!(naming(&repo, "relay/a1", "flt_a1_1"), 1);
    assert_eq!(
        c.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["a.txt"]
    );
    // The late file stays for the next turn's commit.
    assert!(wt.join("late.txt").is_file());
    ws.finish(wt, &again.marker).await.unwrap();
    ws.begin(wt, "flt_a1_2", "two").await.unwrap();
    let next = ws.commit(wt, record).await.unwrap().unwrap();
    let c = next.commit.unwrap();
    assert_eq!(
        c.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["late.txt"]
    );
    assert_eq!(naming(&repo, "relay/a1", "flt_a1_1"), 1);
    assert_eq!(naming(&repo, "relay/a1", "flt_a1_2"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_agents_worktree_goes_only_after_its_harness_stopped() {
    let repo = Repo::new();
    let (launcher, mut script, stopped) = full_slow_to_stop();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    let spec = spec("a1", &repo.path, None, &[]);
    let mut sessions = Sessions::default();
    runtime
        .dispatch(dispatch_to(&spec, &flight_of("a1", 1), "add"))
        .await
        .unwrap();
    sessions
        .serve(&mut script, 1, |cwd, _| write(cwd, "a.txt", "1\n"))
        .await;
    until_ended(&mut reports, 1).await;
    let wt = sessions.cwd("a1");
    let rt = runtime.clone();
    let removal = tokio::spawn(async move {
        rt.control(Control::AgentRemoved {
            agent: "a1".into(),
            force: true,
        })
        .await
    });
    assert!(matches!(script.next().await, Call::Shutdown));
    // The harness is stopping and still writes: its worktree must stay meanwhile, and
    // what it writes then must reach the branch (a removal that did not wait for it
    // would have the directory gone, or the file lost, below).
    assert!(
        !removal.is_finished(),
        "the worktree was removed before its harness stopped"
    );
    assert!(wt.is_dir());
    write(&wt, "last.txt", "written while stopping\n");
    stopped.notify_one();
    removal.await.unwrap().unwrap();
    assert!(!wt.exists());
    // Forced: what it wrote while stopping is committed on the branch, not lost.
    assert_eq!(
        repo.git(&["show", "relay/a1:last.txt"]),
        "written while stopping"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worktree_dir_inside_the_repository_is_refused() {
    let repo = Repo::new();
    let (launcher, _script) = full();
    let (_dir, runtime, _reports, _stop) = runtime(launcher, None);
    let mut a1 = spec("a1", &repo.path, None, &[]);
    a1.worktree.as_mut().unwrap().dir = Some("trees".into());
    let err = runtime.prepare_worktree(&a1).await.unwrap_err();
    assert!(
        matches!(
            &err,
            relay_runtime::RuntimeError::Workspace(
                relay_runtime::workspace::WorkspaceError::InsideRepo { .. }
            )
        ),
        "{err}"
    );
    assert!(err.to_string().contains("outside the repository"), "{err}");
    assert!(!repo.path.join("trees").exists());
    assert_eq!(repo.git(&["worktree", "list"]).lines().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_file_is_never_written_through_a_symlink_out_of_the_worktree() {
    let repo = Repo::new();
    let outside = tempfile::tempdir().unwrap();
    // Branch `evil` has `conf` as a symlink to a directory outside; the main checkout
    // has `conf/` a real directory holding an untracked `.env`.
    repo.git(&["checkout", "-q", "-b", "evil"]);
    std::os::unix::fs::symlink(outside.path(), repo.path.join("conf")).unwrap();
    repo.git(&["add", "conf"]);
    repo.git(&["commit", "-q", "-m", "link"]);
    repo.git(&["checkout", "-q", "main"]);
    write(&repo.path, "conf/.env", "SECRET=1\n");
    write(&repo.path, ".env", "TOP=1\n");
    let (launcher, _script) = full();
    let (_dir, runtime, _reports, _stop) = runtime(launcher, None);
    let state = runtime
        .prepare_worktree(&spec(
            "a1",
            &repo.path,
            Some("evil"),
            &["conf/.env", ".env"],
        ))
        .await
        .unwrap();
    let wt = Path::new(&state.path);
    assert!(!outside.path().join(".env").exists(), "written outside");
    assert!(wt.join("conf").symlink_metadata().unwrap().is_symlink());
    // The other file is copied.
    assert_eq!(std::fs::read_to_string(wt.join(".env")).unwrap(), "TOP=1\n");
}
