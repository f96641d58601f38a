//! Edges of the workspaces found in review, with real git in temp repositories: one
//! commit per flight even when the worktree changed after it was made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;

use relay_runtime::workspace::Workspaces;
use support::repo::{spec, Repo};
use support::*;

fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

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
    let (launcher, _script) = full();
    let (dir, runtime, _reports, _stop) = runtime(launcher, None);
    let state = runtime
        .prepare_worktree(&spec("a1", &repo.path, None, &[]))
        .await
        .unwrap();
    let wt = Path::new(&state.path);
    let ws = Workspaces::new(runtime.threads().clone(), dir.path().to_path_buf());
    let record = ws.record(wt).await.unwrap().unwrap();
    ws.begin(wt, "flt_a1_1", "one").await.unwrap();
    write(wt, "a.txt", "1\n");
    let first = ws.commit(wt, &record).await.unwrap().unwrap();
    let made = first.commit.unwrap().commit.unwrap();
    // The process died before the marker went; the harness wrote on meanwhile.
    write(wt, "late.txt", "late\n");
    let again = ws.commit(wt, &record).await.unwrap().unwrap();
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
    let next = ws.commit(wt, &record).await.unwrap().unwrap();
    let c = next.commit.unwrap();
    assert_eq!(
        c.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        ["late.txt"]
    );
    assert_eq!(naming(&repo, "relay/a1", "flt_a1_1"), 1);
    assert_eq!(naming(&repo, "relay/a1", "flt_a1_2"), 1);
}
