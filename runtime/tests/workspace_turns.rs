//! A commit per flight, with real git in temp repositories and the scripted harness
//! playing an agent that edits files in the directory it was spawned in: the commit
//! and what it records, no commit without changes, the agent's own commits as the
//! range, a lock held by someone else, a marker left by a crash, a worktree deleted by
//! hand, reverts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;

use relay_protocol::domain::{FlightChange, FLIGHT_TRAILER, REVERT_TRAILER};
use relay_protocol::runtime::{Control, Report};
use relay_runtime::workspace::WorkspaceError;
use relay_runtime::RuntimeError;
use support::drive::*;
use support::repo::{git, hold_index_lock, spec, write, Repo};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flights_changes_are_one_commit_naming_it_and_the_agents_own_are_its_range() {
    let repo = Repo::new();
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    let spec = spec("a1", &repo.path, None, &[]);
    let f1 = flight_of("a1", 1);
    runtime
        .dispatch(dispatch_to(&spec, &f1, "Edit the lib\nand more words"))
        .await
        .unwrap();
    let mut sessions = Sessions::default();
    sessions
        .serve(&mut script, 1, |cwd, _| {
            // The agent commits once itself, then leaves more uncommitted.
            write(cwd, "src/lib.txt", "one\n2\nthree\n");
            git(cwd, &["commit", "-q", "-am", "agent's own"]);
            write(cwd, "docs/new file.md", "a\nb\n");
        })
        .await;
    let got = until_ended(&mut reports, 1).await;
    let cwd = sessions.cwd("a1");
    assert!(
        cwd.ends_with("worktrees/a1"),
        "spawned in {}",
        cwd.display()
    );
    let commits = commits(&got);
    assert_eq!(commits.len(), 1, "{got:?}");
    let (flight, c) = &commits[0];
    assert_eq!(flight, &f1);
    // Reported before the flight's end.
    let at = got
        .iter()
        .position(|r| {
            matches!(
                r,
                Report::Flight {
                    change: FlightChange::Commit { .. },
                    ..
                }
            )
        })
        .unwrap();
    assert!(at < end_of(&got, &f1));
    assert_eq!(c.branch, "relay/a1");
    assert_eq!(c.start, repo.head());
    assert_eq!(c.agent_commits.len(), 1);
    let ours = c.commit.clone().unwrap();
    assert_eq!(c.head, ours);
    assert_eq!(repo.git(&["rev-parse", "relay/a1"]), ours);
    assert_eq!(
        repo.git(&["rev-parse", &format!("{ours}^")]),
        c.agent_commits[0]
    );
    let files: Vec<_> = c
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.added, f.removed))
        .collect();
    assert_eq!(
        files,
        vec![("docs/new file.md", 2, 0), ("src/lib.txt", 1, 1)]
    );
    assert_eq!((c.added, c.removed), (3, 1));
    let patch = c.patch.as_deref().unwrap();
    assert!(
        patch.contains("+2") && patch.contains("-two") && patch.contains("+b"),
        "{patch}"
    );
    assert!(!c.patch_truncated);
    let message = repo.git(&["log", "-1", "--format=%B", "relay/a1"]);
    assert_eq!(
        message,
        format!("relay: Edit the lib\n\n{FLIGHT_TRAILER}: {f1}")
    );
    // The branch's state moved on with it.
    let state = got
        .iter()
        .rev()
        .filter_map(|r| match r {
            Report::Agent {
                worktree: Some(w), ..
            } => Some(w.clone()),
            _ => None,
        })
        .next()
        .unwrap();
    assert_eq!(
        (state.head.as_str(), state.ahead, state.behind),
        (ours.as_str(), 2, 0)
    );
    // The main checkout never saw any of it.
    assert_eq!(repo.git(&["status", "--porcelain"]), "");
    assert!(!repo.path.join("docs").exists());
    // The commit's reports were kept on disk before they went (a crash before the
    // broker records them loses none), until the flight's end is with the broker.
    let kept = runtime.threads().commit_reports_unsent().await.unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].0, f1);
    assert!(
        kept[0].1.iter().any(|r| matches!(
            r,
            Report::Flight { flight, change: FlightChange::Commit { commit } }
                if flight == &f1 && commit.commit.as_deref() == Some(ours.as_str())
        )),
        "{kept:?}"
    );
    runtime.threads().forget_flight(&f1).await.unwrap();
    assert!(runtime
        .threads()
        .commit_reports_unsent()
        .await
        .unwrap()
        .is_empty());

    // A turn that changes nothing makes no commit.
    let f2 = flight_of("a1", 2);
    runtime
        .dispatch(dispatch_to(&spec, &f2, "look only"))
        .await
        .unwrap();
    sessions.serve(&mut script, 1, |_, _| {}).await;
    let got = until_ended(&mut reports, 1).await;
    assert!(support::drive::commits(&got).is_empty(), "{got:?}");
    assert_eq!(repo.git(&["rev-parse", "relay/a1"]), ours);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_by_someone_else_is_waited_out_with_a_note() {
    let repo = Repo::new();
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    let spec = spec("a1", &repo.path, None, &[]);
    let f1 = flight_of("a1", 1);
    runtime
        .dispatch(dispatch_to(&spec, &f1, "edit"))
        .await
        .unwrap();
    let lock = std::sync::Mutex::new(None);
    Sessions::default()
        .serve(&mut script, 1, |cwd, _| {
            write(cwd, "README.md", "changed\n");
            // Someone else's git holds the worktree's index.
            *lock.lock().unwrap() = Some(hold_index_lock(cwd));
        })
        .await;
    let mut got = Vec::new();
    loop {
        let r = reports.next().await;
        let noted = matches!(&r, Report::Flight { change: FlightChange::Note { text, .. }, .. } if text.starts_with("cannot commit yet:"));
        got.push(r);
        if noted {
            break;
        }
    }
    assert!(commits(&got).is_empty());
    let note = notes(&got, &f1).pop().unwrap();
    assert!(
        note.contains("index.lock") && note.ends_with("; retrying"),
        "{note}"
    );
    std::fs::remove_file(lock.lock().unwrap().take().unwrap()).unwrap();
    let rest = until_ended(&mut reports, 1).await;
    let commits = commits(&rest);
    assert_eq!(commits.len(), 1, "{rest:?}");
    assert_eq!(repo.git(&["show", "relay/a1:README.md"]), "changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_left_by_a_crash_is_committed_once() {
    let repo = Repo::new();
    let (launcher, _script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    let spec = spec("a1", &repo.path, None, &[]);
    let state = runtime.prepare_worktree(&spec).await.unwrap();
    let wt = Path::new(&state.path);
    // The turn of flt_a1_9 ended and the process died before its commit.
    write(wt, "src/lib.txt", "changed by the lost turn\n");
    let marker_at = git(wt, &["rev-parse", "--absolute-git-dir"]) + "/relay-flight";
    let marker =
        relay_runtime::workspace::Marker::new("flt_a1_9", "the lost turn", state.head.clone());
    std::fs::write(&marker_at, serde_json::to_vec(&marker).unwrap()).unwrap();
    runtime.reconcile_worktrees().await.unwrap();
    let got = [reports.next().await, reports.next().await];
    let c = match &got[0] {
        Report::Flight {
            flight,
            change: FlightChange::Commit { commit },
        } if flight == "flt_a1_9" => commit.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        matches!(&got[1], Report::Agent { worktree: Some(w), .. } if w.head == *c.commit.as_ref().unwrap())
    );
    assert!(!Path::new(&marker_at).exists());
    // Again: nothing more to do.
    runtime.reconcile_worktrees().await.unwrap();
    assert!(reports.quiet());
    assert_eq!(repo.git(&["rev-list", "--count", "main..relay/a1"]), "1");

    // A crash between the commit and the marker's removal: the commit is found, not
    // made again, and reported (the broker takes the same commit twice as once).
    write(wt, "README.md", "second\n");
    let marker = relay_runtime::workspace::Marker::new(
        "flt_a1_10",
        "t",
        repo.git(&["rev-parse", "relay/a1"]),
    );
    git(
        wt,
        &[
            "commit",
            "-q",
            "-am",
            &format!("relay: t\n\n{FLIGHT_TRAILER}: flt_a1_10"),
        ],
    );
    std::fs::write(&marker_at, serde_json::to_vec(&marker).unwrap()).unwrap();
    runtime.reconcile_worktrees().await.unwrap();
    match reports.next().await {
        Report::Flight {
            flight,
            change: FlightChange::Commit { commit },
        } => {
            assert_eq!(flight, "flt_a1_10");
            assert_eq!(commit.commit.unwrap(), repo.git(&["rev-parse", "relay/a1"]));
            assert!(commit.agent_commits.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(repo.git(&["rev-list", "--count", "main..relay/a1"]), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worktree_deleted_by_hand_is_made_again_from_its_branch_with_a_note() {
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
    let cwd = sessions.cwd("a1");
    std::fs::remove_dir_all(&cwd).unwrap();
    let f2 = flight_of("a1", 2);
    runtime
        .dispatch(dispatch_to(&spec, &f2, "again"))
        .await
        .unwrap();
    sessions
        .serve(&mut script, 1, |cwd, _| {
            // Made again from the branch: the first flight's work is there.
            assert_eq!(
                std::fs::read_to_string(cwd.join("kept.txt")).unwrap(),
                "kept\n"
            );
            write(cwd, "second.txt", "2\n");
        })
        .await;
    let got = until_ended(&mut reports, 1).await;
    let note = notes(&got, &f2);
    assert!(
        note.iter()
            .any(|n| n.contains("was gone") && n.contains("relay/a1")),
        "{note:?}"
    );
    assert!(got
        .iter()
        .any(|r| matches!(r, Report::Agent { worktree: Some(w), .. } if w.recreated == 1)));
    assert_eq!(commits(&got).len(), 1);
    assert_eq!(repo.git(&["show", "relay/a1:second.txt"]), "2");
    // The repository's own checkout was never used in its place.
    assert!(!repo.path.join("second.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_is_a_commit_naming_the_flight_and_a_conflict_changes_nothing() {
    let repo = Repo::new();
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    let spec = spec("a1", &repo.path, None, &[]);
    let mut sessions = Sessions::default();
    let (f1, f2, f3) = (flight_of("a1", 1), flight_of("a1", 2), flight_of("a1", 3));
    runtime
        .dispatch(dispatch_to(&spec, &f1, "one"))
        .await
        .unwrap();
    runtime
        .dispatch(dispatch_to(&spec, &f2, "two"))
        .await
        .unwrap();
    runtime
        .dispatch(dispatch_to(&spec, &f3, "three"))
        .await
        .unwrap();
    sessions
        .serve(&mut script, 3, |cwd, flight| {
            match flight.rsplit('_').next().unwrap() {
                "1" => write(cwd, "a.txt", "from one\n"),
                "2" => write(cwd, "src/lib.txt", "one\nTWO\nthree\n"),
                _ => write(cwd, "src/lib.txt", "one\nTWO again\nthree\n"),
            }
        })
        .await;
    let got = until_ended(&mut reports, 3).await;
    let commits = commits(&got);
    assert_eq!(commits.len(), 3);
    let revert = |flight: &str| Control::Revert {
        agent: "a1".into(),
        flight: flight.into(),
        commit: Box::new(commits.iter().find(|(f, _)| f == flight).unwrap().1.clone()),
        by: "cli".into(),
    };
    runtime.control(revert(&f1)).await.unwrap();
    // (The last turn's closing reports first.)
    let r = loop {
        match reports.next().await {
            Report::Flight {
                flight,
                change: FlightChange::Reverted { revert },
            } if flight == f1 => break revert,
            Report::ApprovalsExpired { .. } | Report::Agent { worktree: None, .. } => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(r.by, "cli");
    assert_eq!(r.files.len(), 1);
    assert!(
        matches!(reports.next().await, Report::Agent { worktree: Some(w), .. } if w.head == r.commit)
    );
    let wt = sessions.cwd("a1");
    assert!(!wt.join("a.txt").exists());
    assert_eq!(
        repo.git(&["log", "-1", "--format=%B", "relay/a1"]),
        format!("Revert flight {f1}\n\n{REVERT_TRAILER}: {f1}")
    );
    // Asked again: the same revert, no second commit.
    let head = repo.git(&["rev-parse", "relay/a1"]);
    runtime.control(revert(&f1)).await.unwrap();
    assert_eq!(repo.git(&["rev-parse", "relay/a1"]), head);
    // f2's line was changed again by f3: reverting f2 conflicts, and nothing changes.
    let e = runtime.control(revert(&f2)).await.unwrap_err();
    assert!(
        matches!(e, RuntimeError::Workspace(WorkspaceError::RevertConflict { ref files, .. }) if files == "src/lib.txt"),
        "{e}"
    );
    assert_eq!(repo.git(&["rev-parse", "relay/a1"]), head);
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(wt.join("src/lib.txt")).unwrap(),
        "one\nTWO again\nthree\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_waits_for_no_turn_and_is_refused_while_one_runs() {
    let repo = Repo::new();
    let (launcher, mut script) = full();
    let (_dir, runtime, _reports, _stop) = runtime(launcher, None);
    let spec = spec("a1", &repo.path, None, &[]);
    let f1 = flight_of("a1", 1);
    runtime
        .dispatch(dispatch_to(&spec, &f1, "long"))
        .await
        .unwrap();
    let _events = script.session_up(None, "c1").await;
    script.turn_started("t1").await;
    let commit = relay_protocol::domain::FlightCommit {
        branch: "relay/a1".into(),
        start: repo.head(),
        head: repo.head(),
        ..Default::default()
    };
    let e = runtime
        .control(Control::Revert {
            agent: "a1".into(),
            flight: "flt_old".into(),
            commit: Box::new(commit),
            by: "cli".into(),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, RuntimeError::Workspace(WorkspaceError::Running { ref flight, .. }) if *flight == f1),
        "{e}"
    );
    assert!(
        e.to_string().contains(&format!("relay interrupt {f1}")),
        "{e}"
    );
}

/// A turn left uncommitted that still cannot be committed before the next turn (a lock
/// held): its changes are carried into the next turn's commit, which names both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_could_not_commit_is_carried_into_the_next() {
    let repo = Repo::new();
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    let spec = spec("a1", &repo.path, None, &[]);
    let state = runtime.prepare_worktree(&spec).await.unwrap();
    let wt = Path::new(&state.path);
    write(wt, "old.txt", "from the earlier turn\n");
    let marker_at = git(wt, &["rev-parse", "--absolute-git-dir"]) + "/relay-flight";
    let old = relay_runtime::workspace::Marker::new("flt_a1_0", "earlier", state.head.clone());
    std::fs::write(&marker_at, serde_json::to_vec(&old).unwrap()).unwrap();
    let lock = hold_index_lock(wt);
    let f1 = flight_of("a1", 1);
    runtime
        .dispatch(dispatch_to(&spec, &f1, "next"))
        .await
        .unwrap();
    Sessions::default()
        .serve(&mut script, 1, |cwd, _| {
            // The lock goes while the turn runs.
            std::fs::remove_file(&lock).unwrap();
            write(cwd, "new.txt", "from this turn\n");
        })
        .await;
    let got = until_ended(&mut reports, 1).await;
    let commits = commits(&got);
    let flights: Vec<&str> = commits.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(flights, vec![f1.as_str(), "flt_a1_0"], "{got:?}");
    let c = &commits[0].1;
    assert_eq!(c.also_flights, vec!["flt_a1_0".to_string()]);
    assert_eq!(c.start, state.head);
    let files: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(files, vec!["new.txt", "old.txt"]);
    let message = repo.git(&["log", "-1", "--format=%B", "relay/a1"]);
    assert!(
        message.ends_with(&format!(
            "{FLIGHT_TRAILER}: {f1}\n{FLIGHT_TRAILER}: flt_a1_0"
        )),
        "{message}"
    );
    assert_eq!(repo.git(&["rev-list", "--count", "main..relay/a1"]), "1");
}

/// The runtime stops after a turn ended and before its commit could be made (a lock
/// held): the end is recorded, the marker stays; the next start commits it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_ended_without_its_commit_is_committed_once_at_the_next_start() {
    let repo = Repo::new();
    let dir = tempfile::tempdir().unwrap();
    let db = relay_infra::storage::Durable::new(
        relay_infra::storage::config()
            .path(dir.path().join("db"))
            .open()
            .unwrap(),
    );
    let spec = spec("a1", &repo.path, None, &[]);
    let f1 = flight_of("a1", 1);
    let lock = std::sync::Mutex::new(None);
    {
        let (launcher, mut script) = full();
        let (runtime, mut reports, stop) = runtime_in(dir.path(), Some(db.clone()), launcher, None);
        runtime
            .dispatch(dispatch_to(&spec, &f1, "edit"))
            .await
            .unwrap();
        Sessions::default()
            .serve(&mut script, 1, |cwd, _| {
                write(cwd, "README.md", "the lost turn\n");
                *lock.lock().unwrap() = Some(hold_index_lock(cwd));
            })
            .await;
        loop {
            if let Report::Flight {
                change: FlightChange::Note { text, .. },
                ..
            } = reports.next().await
            {
                if text.starts_with("cannot commit yet") {
                    break;
                }
            }
        }
        stop.cancel();
        let got = until_ended(&mut reports, 1).await;
        assert!(
            notes(&got, &f1)
                .iter()
                .any(|n| n.contains("committed at the next start")),
            "{got:?}"
        );
        assert!(commits(&got).is_empty());
        runtime.stopped().await;
        assert_eq!(
            runtime
                .threads()
                .dispatch_state(&format!("inv_{f1}"))
                .await
                .unwrap(),
            Some(relay_runtime::DispatchState::Ended)
        );
    }
    assert_eq!(repo.git(&["rev-list", "--count", "main..relay/a1"]), "0");
    std::fs::remove_file(lock.lock().unwrap().take().unwrap()).unwrap();
    let (launcher, _script) = full();
    let (runtime, mut reports, _stop) = runtime_in(dir.path(), Some(db.clone()), launcher, None);
    runtime.reconcile_worktrees().await.unwrap();
    match reports.next().await {
        Report::Flight {
            flight,
            change: FlightChange::Commit { commit },
        } => {
            assert_eq!(flight, f1);
            assert_eq!(commit.files.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    runtime.reconcile_worktrees().await.unwrap();
    assert_eq!(repo.git(&["rev-list", "--count", "main..relay/a1"]), "1");
    assert_eq!(repo.git(&["show", "relay/a1:README.md"]), "the lost turn");
    let message = repo.git(&["log", "-1", "--format=%B", "relay/a1"]);
    assert!(
        message.ends_with(&format!("{FLIGHT_TRAILER}: {f1}")),
        "{message}"
    );
}
