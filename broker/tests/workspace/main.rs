//! The broker's rules of what a flight did to its agent's worktree, over a real
//! (temporary) sled store: a commit is recorded also after the flight ended (a commit
//! made after a restart), without its patch (the update keeps it); the same commit again
//! is one update, not two; a revert needs a commit; a flight's diff is its commit with
//! the patch; a revert is refused for a flight with no commit, one still running, one
//! reverted already; a registration's worktree spec is checked before any git runs; and
//! the worktree a registration carries is kept on the agent. In `fork`: the spec of a
//! fork (its turns and base), and a spec the rules refuse never reaching the runtime.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fork;

use relay_broker::store::Store;
use relay_broker::{Broker, BrokerConfig, BrokerError};
use relay_protocol::domain::{
    AgentSpec, FileChange, Flight, FlightChange, FlightCommit, FlightState, Harness, InvokeRequest,
    Revert, WorktreeSpec,
};
use tokio_util::sync::CancellationToken;

async fn broker() -> Broker {
    let (b, _task) = Broker::start(
        Store::temporary().unwrap(),
        BrokerConfig::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    b
}

fn state(to: FlightState) -> FlightChange {
    FlightChange::State {
        to,
        reason: None,
        output: None,
    }
}

fn commit() -> FlightCommit {
    FlightCommit {
        branch: "relay/a1".into(),
        start: "a".repeat(40),
        head: "b".repeat(40),
        commit: Some("b".repeat(40)),
        files: vec![FileChange {
            path: "notes.txt".into(),
            added: 1,
            removed: 0,
            binary: false,
        }],
        added: 1,
        removed: 0,
        patch: Some("+hello\n".into()),
        ..FlightCommit::default()
    }
}

/// A flight of agent a1 that ran and completed.
async fn ended_flight(b: &Broker) -> Flight {
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/tmp"))
        .await
        .unwrap();
    let f = b
        .invoke(InvokeRequest::new("a1", "hi"))
        .await
        .unwrap()
        .flight;
    b.update_flight(&f.id, state(FlightState::Running))
        .await
        .unwrap();
    b.update_flight(&f.id, state(FlightState::Completed))
        .await
        .unwrap()
        .flight
}

#[tokio::test]
async fn a_commit_after_the_end_is_recorded_once_and_without_its_patch() {
    let b = broker().await;
    let f = ended_flight(&b).await;
    let change = FlightChange::Commit {
        commit: Box::new(commit()),
    };
    let first = b.update_flight(&f.id, change.clone()).await.unwrap();
    assert_eq!(first.flight.state, FlightState::Completed);
    let mut kept = commit();
    kept.patch = None;
    assert_eq!(first.flight.commit, Some(kept.clone()));
    // The same commit again (a report replayed after a restart): no second update.
    let again = b.update_flight(&f.id, change).await.unwrap();
    assert_eq!(again.flight.update_seq, first.flight.update_seq);
    let updates = b
        .store()
        .read({
            let id = f.id.clone();
            move |s| s.flight_updates(&id, 0)
        })
        .await
        .unwrap();
    let commits: Vec<_> = updates
        .iter()
        .filter(|u| matches!(u.change, FlightChange::Commit { .. }))
        .collect();
    assert_eq!(commits.len(), 1, "{updates:?}");
    // The diff is the update's: with the patch.
    let diff = relay_broker::workspaces::flight_diff(&b, &f.id)
        .await
        .unwrap();
    assert_eq!(diff.commit.unwrap().patch.as_deref(), Some("+hello\n"));
    // Other changes are still refused after the end.
    let late = b
        .update_flight(&f.id, FlightChange::Delta { text: "x".into() })
        .await;
    assert!(
        matches!(late, Err(BrokerError::FlightTerminal { .. })),
        "{late:?}"
    );
}

#[tokio::test]
async fn a_revert_needs_a_commit_and_is_kept_on_it() {
    let b = broker().await;
    let f = ended_flight(&b).await;
    let revert = Revert {
        commit: "c".repeat(40),
        by: "operator".into(),
        at: 1,
        files: Vec::new(),
        more_files: 0,
    };
    let refused = b
        .update_flight(
            &f.id,
            FlightChange::Reverted {
                revert: revert.clone(),
            },
        )
        .await;
    assert!(
        matches!(&refused, Err(BrokerError::Invalid(m)) if m.contains("has no commit to revert")),
        "{refused:?}"
    );
    // Asked through the operation, the same refusal comes before any runtime is asked.
    let asked = relay_broker::workspaces::revert(&b, None, &f.id, "operator").await;
    assert!(
        matches!(&asked, Err(BrokerError::Invalid(m)) if m.contains("no commit to revert")),
        "{asked:?}"
    );
    b.update_flight(
        &f.id,
        FlightChange::Commit {
            commit: Box::new(commit()),
        },
    )
    .await
    .unwrap();
    let reverted = b
        .update_flight(
            &f.id,
            FlightChange::Reverted {
                revert: revert.clone(),
            },
        )
        .await
        .unwrap()
        .flight;
    assert_eq!(
        reverted.commit.as_ref().unwrap().reverted_by,
        Some(revert.clone())
    );
    // A commit report replayed after the revert keeps the revert.
    let replayed = b
        .update_flight(
            &f.id,
            FlightChange::Commit {
                commit: Box::new(commit()),
            },
        )
        .await
        .unwrap()
        .flight;
    assert_eq!(replayed.commit.unwrap().reverted_by, Some(revert));
    let twice = relay_broker::workspaces::revert(&b, None, &f.id, "operator").await;
    assert!(
        matches!(&twice, Err(BrokerError::Invalid(m)) if m.contains("reverted already")),
        "{twice:?}"
    );
}

#[tokio::test]
async fn a_running_flight_is_not_reverted() {
    let b = broker().await;
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/tmp"))
        .await
        .unwrap();
    let f = b
        .invoke(InvokeRequest::new("a1", "hi"))
        .await
        .unwrap()
        .flight;
    b.update_flight(&f.id, state(FlightState::Running))
        .await
        .unwrap();
    let asked = relay_broker::workspaces::revert(&b, None, &f.id, "operator").await;
    assert!(
        matches!(&asked, Err(BrokerError::Invalid(m)) if m.contains("is running flight") && m.contains("interrupt")),
        "{asked:?}"
    );
}

#[tokio::test]
async fn a_worktree_spec_is_checked_before_any_git_runs() {
    let b = broker().await;
    let with = |cwd: &str, w: WorktreeSpec| AgentSpec {
        worktree: Some(w),
        ..AgentSpec::new("w1", Harness::CodexAppServer, cwd)
    };
    let cases = [
        (with("relative/repo", WorktreeSpec::default()), "absolute"),
        (
            with(
                "/repo",
                WorktreeSpec {
                    base: Some("--upload-pack=x".into()),
                    ..WorktreeSpec::default()
                },
            ),
            "not a branch",
        ),
        (
            with(
                "/repo",
                WorktreeSpec {
                    dir: Some("rel".into()),
                    ..WorktreeSpec::default()
                },
            ),
            "--worktree-dir",
        ),
        (
            with(
                "/repo",
                WorktreeSpec {
                    copy: vec!["a/../../etc".into()],
                    ..WorktreeSpec::default()
                },
            ),
            "no `..`",
        ),
        (
            with(
                "/repo",
                WorktreeSpec {
                    copy: vec!["/etc/passwd".into()],
                    ..WorktreeSpec::default()
                },
            ),
            "not absolute",
        ),
    ];
    for (spec, says) in cases {
        let e = b.register_agent(spec.clone()).await.unwrap_err();
        assert!(e.to_string().contains(says), "{spec:?}: {e}");
    }
    assert!(b.agent("w1").await.unwrap().is_none());
    // A well-formed one is registered (its worktree made by the runtime, none here).
    let ok = b
        .register_agent(with(
            "/repo",
            WorktreeSpec {
                base: Some("main".into()),
                dir: Some("/srv/trees".into()),
                copy: vec![".env".into(), "config/*.local".into()],
            },
        ))
        .await
        .unwrap();
    assert_eq!(ok.worktree, None);
}

#[tokio::test]
async fn a_commits_patch_is_kept_within_the_recorded_bound_whoever_sends_it() {
    use relay_protocol::domain::MAX_RECORDED_PATCH;
    let b = broker().await;
    let f = ended_flight(&b).await;
    let mut big = commit();
    // Multi-byte characters across the bound: the cut is at a character's boundary.
    big.patch = Some("+é\n".repeat(MAX_RECORDED_PATCH));
    b.update_flight(
        &f.id,
        FlightChange::Commit {
            commit: Box::new(big),
        },
    )
    .await
    .unwrap();
    let diff = relay_broker::workspaces::flight_diff(&b, &f.id)
        .await
        .unwrap()
        .commit
        .unwrap();
    let patch = diff.patch.unwrap();
    assert!(patch.len() <= MAX_RECORDED_PATCH, "{}", patch.len());
    assert!(patch.len() > MAX_RECORDED_PATCH - 4, "{}", patch.len());
    assert!(diff.patch_truncated);
    // The event the log keeps (and watch, SSE and NATS send) holds the bounded patch.
    let events = b.store().read(|s| s.events_after(0, 10_000)).await.unwrap();
    let longest = events
        .iter()
        .filter_map(|e| match &e.body {
            relay_protocol::event::EventBody::FlightUpdated { update, .. } => {
                match &update.change {
                    FlightChange::Commit { commit } => commit.patch.as_ref().map(String::len),
                    _ => None,
                }
            }
            _ => None,
        })
        .max()
        .unwrap();
    assert!(longest <= MAX_RECORDED_PATCH, "{longest}");
}

#[tokio::test]
async fn a_commits_file_list_is_kept_within_its_bound_and_the_rest_counted() {
    use relay_protocol::domain::MAX_LISTED_FILES;
    let b = broker().await;
    let f = ended_flight(&b).await;
    let mut many = commit();
    many.files = (0..MAX_LISTED_FILES + 250)
        .map(|i| FileChange {
            path: format!("node_modules/p{i}/index.js"),
            added: 1,
            removed: 0,
            binary: false,
        })
        .collect();
    b.update_flight(
        &f.id,
        FlightChange::Commit {
            commit: Box::new(many),
        },
    )
    .await
    .unwrap();
    let shown = b.flight(&f.id).await.unwrap().unwrap();
    let c = shown.commit.unwrap();
    assert_eq!((c.files.len(), c.more_files), (MAX_LISTED_FILES, 250));
    // Said whole to a person.
    assert!(
        c.summary()
            .contains(&format!("{} files", MAX_LISTED_FILES + 250)),
        "{}",
        c.summary()
    );
}
