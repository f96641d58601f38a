//! Two agents, a Codex and a Claude Code, with worktrees of ONE repository edit the same
//! file at the same time. Both wait for their write's approval at once (so both turns
//! run together), then both are accepted: each change is a commit naming its flight on
//! the agent's own branch, recorded on the flight; the main checkout is untouched;
//! `relay diff` shows each; `relay revert` undoes one.

use relay_tests::agents::{state, Env};
use serde_json::Value;

use crate::repo::{
    env_with_repo, updates_of, wait_commit, wait_ended, worktree_of, write_prompt, Repo, SHARED,
    SHARED_TEXT,
};

/// `shared.txt` with its second line as agent `name` writes it.
fn edited(name: &str) -> String {
    SHARED_TEXT.replace("line two", &format!("line two by {name}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_edit_one_file_each_on_its_branch_then_diff_and_revert() {
    let (env, repo) = env_with_repo().await;
    let main_head = repo.head("main");
    // No rule: each write waits for a person, which holds both turns open together.
    env.add_agent("cx", &["--worktree"]);
    env.add_claude("cl", &["--worktree"]);

    let cx = env.ask_no_wait("cx", &write_prompt(SHARED, &edited("cx")));
    let cl = env.ask_no_wait("cl", &write_prompt(SHARED, &edited("cl")));
    let approvals = [env.wait_approval(&cx).await, env.wait_approval(&cl).await];
    // Both turns are running, each asking to write shared.txt: the same file, now.
    for a in &approvals {
        assert_eq!(a["state"], "pending", "{a}");
    }
    let ids: Vec<String> = approvals
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    let deciders: Vec<_> = ids
        .iter()
        .map(|id| {
            env.relay
                .spawn_cli(&["approval", "decide", id, "accept"])
                .unwrap()
        })
        .collect();
    for d in deciders {
        let out = d.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    for (name, flight) in [("cx", &cx), ("cl", &cl)] {
        let f = wait_ended(&env, flight).await;
        assert_eq!(state(&f), "completed", "{f}");
        check_commit(&env, &repo, name, flight).await;
    }

    // The main checkout is never touched: same commit, same file, nothing pending.
    assert_eq!(repo.head("main"), main_head);
    assert_eq!(repo.status(), "");
    assert_eq!(
        std::fs::read_to_string(repo.path.join(SHARED)).unwrap(),
        SHARED_TEXT
    );
    assert_eq!(repo.git(&["branch", "--show-current"]).trim(), "main");

    check_diffs(&env, &cx, &cl);
    revert_one(&env, &repo, &cl, &cx).await;
}

/// Agent `name`'s flight: one commit on `relay/NAME` with the `Relay-Flight` trailer,
/// holding the edit; the flight records it (commit, file, lines); the worktree has it.
async fn check_commit(env: &Env, repo: &Repo, name: &str, flight: &str) {
    let branch = format!("relay/{name}");
    let f = wait_commit(env, flight, 30).await;
    let commit = &f["commit"];
    assert_eq!(commit["branch"], branch, "{f}");
    let sha = commit["commit"].as_str().unwrap_or_default().to_string();
    assert_eq!(
        commit["head"], sha,
        "Relay's commit is the branch's new tip: {f}"
    );
    assert_eq!(
        repo.commits_with(&branch, &format!("Relay-Flight: {flight}")),
        vec![sha.clone()],
        "{f}"
    );
    assert!(repo
        .message(&sha)
        .contains(&format!("Relay-Flight: {flight}")));
    assert_eq!(repo.file_at(&sha, SHARED), edited(name));
    assert_eq!(repo.files_of(&sha), vec![SHARED.to_string()]);
    assert_eq!(
        (&commit["added"], &commit["removed"]),
        (&Value::from(1), &Value::from(1)),
        "{f}"
    );
    assert_eq!(commit["files"][0]["path"], SHARED, "{f}");
    assert_eq!(commit["files"].as_array().map(Vec::len), Some(1), "{f}");
    assert_eq!(repo.head(&branch), sha);

    // The CLI shows the same record.
    let shown = env.relay.cli_json(&["flight", "show", flight, "--json"]);
    assert_eq!(shown["commit"]["commit"], sha, "{shown}");
    let text = env.relay.cli_ok(&["flight", "show", flight]);
    assert!(
        text.contains(&sha[..12]) && text.contains(&branch),
        "{text}"
    );

    // The agent works in its worktree: the file is there, committed, nothing left over.
    let wt = worktree_of(env, name).await;
    let path = std::path::PathBuf::from(wt["path"].as_str().unwrap());
    assert_ne!(path, repo.path);
    assert_eq!(wt["branch"], branch, "{wt}");
    assert_eq!(
        std::fs::read_to_string(path.join(SHARED)).unwrap(),
        edited(name)
    );
    assert_eq!(crate::repo::git(&path, &["status", "--porcelain"]), "");
}

/// `relay diff FLIGHT` shows that flight's change (text and JSON); `relay diff AGENT
/// --stat` the agent's branch against its base.
fn check_diffs(env: &Env, cx: &str, cl: &str) {
    for (name, flight) in [("cx", cx), ("cl", cl)] {
        let added = format!("+line two by {name}");
        let text = env.relay.cli_ok(&["diff", flight]);
        assert!(
            text.contains(&added) && text.contains("-line two"),
            "{text}"
        );
        let other = if name == "cx" { "cl" } else { "cx" };
        assert!(!text.contains(&format!("by {other}")), "{text}");
        let json = env.relay.cli_json(&["diff", flight, "--json"]);
        let patch = json["commit"]["patch"].as_str().unwrap_or_default();
        assert!(patch.contains(&added), "{json}");
        assert_eq!(json["flight"], flight, "{json}");

        let stat = env.relay.cli_ok(&["diff", name, "--stat"]);
        assert!(stat.contains(SHARED), "{stat}");
        assert!(!stat.contains(&added), "--stat prints no patch: {stat}");
        let json = env.relay.cli_json(&["diff", name, "--json"]);
        assert_eq!(json["files"][0]["path"], SHARED, "{json}");
        assert_eq!((&json["added"], &json["removed"]), (&1.into(), &1.into()));
        let patch = json["patch"].as_str().unwrap_or_default();
        assert!(patch.contains(&added), "{json}");
    }
}

/// `relay revert FLIGHT` of `flight` (agent cl): a revert commit on `relay/cl` with the
/// `Relay-Revert-Of` trailer, the file back as it was, the event on the flight; the
/// other agent's branch untouched.
async fn revert_one(env: &Env, repo: &Repo, flight: &str, other: &str) {
    let other_head = repo.head("relay/cx");
    let out = env.relay.cli_ok(&["revert", flight]);
    assert!(!out.trim().is_empty(), "revert says what it did");
    let f = env
        .wait_flight(flight, 30, |f| {
            f["commit"]["reverted_by"]["commit"].is_string()
        })
        .await;
    let revert = f["commit"]["reverted_by"]["commit"].as_str().unwrap();
    assert_eq!(repo.head("relay/cl"), revert);
    assert!(
        repo.message(revert)
            .contains(&format!("Relay-Revert-Of: {flight}")),
        "{}",
        repo.message(revert)
    );
    assert_eq!(
        repo.commits_with("relay/cl", &format!("Relay-Revert-Of: {flight}")),
        vec![revert.to_string()]
    );
    assert_eq!(repo.file_at("relay/cl", SHARED), SHARED_TEXT);
    let wt = worktree_of(env, "cl").await;
    let path = std::path::PathBuf::from(wt["path"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(path.join(SHARED)).unwrap(),
        SHARED_TEXT
    );
    let reverted = updates_of(env, flight, "reverted").await;
    assert_eq!(reverted.len(), 1, "{reverted:?}");
    assert_eq!(reverted[0]["revert"]["commit"], revert);

    // Only that flight: the other agent's branch and flight are as they were.
    assert_eq!(repo.head("relay/cx"), other_head);
    let o = env.flight(other).await;
    assert!(o["commit"]["reverted_by"].is_null(), "{o}");
    assert_eq!(repo.status(), "");
}
