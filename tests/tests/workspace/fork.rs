//! `relay agent fork A A2 --at <A's first flight>` after A ran two flights, each writing
//! a file of its own: A2's next turn's model request carries A's conversation up to its
//! first flight (that prompt and its answer) and nothing of the second, and A2's
//! worktree, on its own branch, has the first flight's file and not the second's.

use relay_tests::agents::{state, Env};

use crate::repo::{
    env_with_repo, wait_commit, wait_ended, worktree_args, worktree_of, write_prompt, Repo,
};

#[tokio::test(flavor = "multi_thread")]
async fn a_codex_agent_forked_at_its_first_flight() {
    let (env, repo) = env_with_repo().await;
    env.add_agent("a", &worktree_args());
    fork_at_first_flight(&env, &repo, "codex").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claude_code_agent_forked_at_its_first_flight() {
    let (env, repo) = env_with_repo().await;
    env.add_claude("a", &worktree_args());
    fork_at_first_flight(&env, &repo, "claude").await;
}

/// Runs a flight of `agent` to its commit; the flight's id.
async fn flight(env: &Env, agent: &str, prompt: &str) -> String {
    let id = env.ask_no_wait(agent, prompt);
    let f = wait_ended(env, &id).await;
    assert_eq!(state(&f), "completed", "{f}");
    id
}

async fn fork_at_first_flight(env: &Env, repo: &Repo, harness: &str) {
    let first = write_prompt("first.txt", "pelican one");
    let second = write_prompt("second.txt", "walrus two");
    let f1 = flight(env, "a", &first).await;
    let f1_commit = wait_commit(env, &f1, 30).await["commit"]["head"]
        .as_str()
        .unwrap()
        .to_string();
    let f2 = flight(env, "a", &second).await;
    wait_commit(env, &f2, 30).await;

    let out = env.relay.cli_ok(&["agent", "fork", "a", "a2", "--at", &f1]);
    assert!(out.contains("a2"), "{out}");
    let a2 = env.agent("a2").await;
    assert_eq!(a2["harness"], env.agent("a").await["harness"]);
    assert_eq!(a2["fork"]["agent"], "a", "{a2}");
    assert_eq!(a2["fork"]["flight"], f1.as_str(), "{a2}");

    let f3 = flight(env, "a2", "what do you remember? marker-kiwi").await;
    let f = env.flight(&f3).await;
    assert_eq!(f["agent"], "a2");

    // The fork's model request: A's first turn (prompt and answer), not its second.
    let requests = env.mock.requests_prompted("marker-kiwi");
    let req = requests
        .first()
        .unwrap_or_else(|| panic!("{harness}: no request of a2's turn"));
    assert!(
        req.carries(&first),
        "{harness}: no first prompt in {:?}",
        req.body
    );
    assert!(
        req.carries("wrote first.txt: pelican one"),
        "{harness}: no first answer in {:?}",
        req.body
    );
    for later in [&second, "walrus"] {
        assert!(
            !req.carries(later),
            "{harness}: the fork carries the second flight ({later:?}): {:?}",
            req.body
        );
    }

    // The fork's worktree: from A's commit at its first flight, on its own branch.
    let wt = worktree_of(env, "a2").await;
    assert_eq!(wt["branch"], "relay/a2", "{wt}");
    assert_eq!(wt["base_commit"], f1_commit.as_str(), "{wt}");
    let path = std::path::PathBuf::from(wt["path"].as_str().unwrap());
    assert_ne!(
        Some(path.to_str().unwrap()),
        worktree_of(env, "a").await["path"].as_str()
    );
    assert_eq!(
        std::fs::read_to_string(path.join("first.txt"))
            .ok()
            .as_deref(),
        Some("pelican one")
    );
    assert!(!path.join("second.txt").exists(), "{harness}");
    assert_eq!(repo.file_at("relay/a2", "first.txt"), "pelican one");
    // A goes on as it was.
    assert_eq!(repo.file_at("relay/a", "second.txt"), "walrus two");
}
