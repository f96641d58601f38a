//! Many agents with worktrees of one repository at once, with real git: each works on
//! its own branch, their commits at the same moment all land (git's shared locks on the
//! repository's refs, objects and config are waited out), and the repository's own
//! checkout is never touched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use relay_protocol::domain::FLIGHT_TRAILER;
use support::drive::*;
use support::repo::{spec, Repo};
use support::*;

async fn agents_at_once(n: usize) {
    let repo = Repo::new();
    let main_head = repo.head();
    let (launcher, mut script) = full();
    let (_dir, runtime, mut reports, _stop) = runtime(launcher, None);
    let names: Vec<String> = (0..n).map(|i| format!("a{i}")).collect();
    // Their worktrees made at once too (registration checks of many agents).
    let specs: Vec<_> = names
        .iter()
        .map(|a| spec(a, &repo.path, None, &[]))
        .collect();
    let mut made = tokio::task::JoinSet::new();
    for s in &specs {
        let (runtime, s) = (runtime.clone(), s.clone());
        made.spawn(async move { runtime.prepare_worktree(&s).await });
    }
    while let Some(r) = made.join_next().await {
        r.unwrap().unwrap();
    }
    for s in &specs {
        runtime
            .dispatch(dispatch_to(s, &flight_of(&s.name, 1), "edit the same file"))
            .await
            .unwrap();
    }
    let mut sessions = Sessions::default();
    sessions
        .serve_together(&mut script, n, |cwd, flight| {
            // Every agent edits the same line of the same file, differently.
            std::fs::write(cwd.join("src/lib.txt"), format!("one\n{flight}\nthree\n")).unwrap();
            std::fs::write(cwd.join(format!("{flight}.txt")), "mine\n").unwrap();
        })
        .await;
    let got = until_ended(&mut reports, n).await;
    let commits = commits(&got);
    assert_eq!(commits.len(), n, "{:?}", notes_of_all(&got));
    for name in &names {
        let flight = flight_of(name, 1);
        let branch = format!("relay/{name}");
        let (_, c) = commits.iter().find(|(f, _)| *f == flight).unwrap();
        assert_eq!(c.branch, branch);
        assert_eq!(
            repo.git(&["rev-parse", &branch]),
            *c.commit.as_ref().unwrap()
        );
        assert_eq!(
            repo.git(&["show", &format!("{branch}:src/lib.txt")]),
            format!("one\n{flight}\nthree")
        );
        let message = repo.git(&["log", "-1", "--format=%B", &branch]);
        assert!(
            message.ends_with(&format!("{FLIGHT_TRAILER}: {flight}")),
            "{message}"
        );
        assert_eq!(
            repo.git(&["rev-list", "--count", &format!("main..{branch}")]),
            "1"
        );
    }
    // The repository's own checkout: as it was.
    assert_eq!(repo.head(), main_head);
    assert_eq!(repo.git(&["status", "--porcelain"]), "");
    assert_eq!(
        std::fs::read_to_string(repo.path.join("src/lib.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
}

fn notes_of_all(reports: &[relay_protocol::runtime::Report]) -> Vec<String> {
    reports
        .iter()
        .filter_map(|r| match r {
            relay_protocol::runtime::Report::Flight {
                change: relay_protocol::domain::FlightChange::Note { text, by: None },
                ..
            } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_editing_one_file_at_once_each_commit_on_their_own_branch() {
    agents_at_once(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_agents_committing_at_once_on_one_repository_all_land() {
    agents_at_once(8).await;
}
