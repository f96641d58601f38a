//! A node's agent with a worktree: the node makes it on its own host (under its data
//! dir, not the broker's) and reports it; a flight's commit and patch come through it;
//! `relay diff FLIGHT` works from here, `relay diff AGENT` says where to run git; a revert
//! reaches the node and is recorded; `remove` says the node decides, and it keeps a
//! worktree holding uncommitted work.

use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_tests::nats::NatsServer;
use relay_tests::{wait_until, NodeProcess};
use serde_json::Value;

use super::{refused, stderr, stdout, Setup};

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_makes_the_worktree_on_its_host_and_commits_diffs_and_reverts_there() {
    let nats = NatsServer::start().unwrap();
    let url = nats.url();
    let s = Setup::start_with(&["--nats", &url]);
    let home = s.tmp.path().join("home").display().to_string();
    let node_dir = s.tmp.path().join("node-n1");
    let node = NodeProcess::start_with_env(
        "n1",
        &node_dir,
        &url,
        &s.relay,
        &[],
        &[("HOME", &home), ("GIT_CONFIG_NOSYSTEM", "1")],
    )
    .unwrap();
    let out = s.add("rw", &["--worktree", "--node", "n1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the node makes its worktree then too"),
        "{}",
        stderr(&out)
    );

    let asked = s
        .relay
        .cli(&["ask", "rw", "write:node.txt=from the node", "--json"]);
    assert!(
        asked.status.success(),
        "{}\nnode log:\n{}",
        stderr(&asked),
        node.log_text()
    );
    let flight: Value = serde_json::from_slice(&asked.stdout).unwrap();
    assert_eq!(flight["state"], "completed", "{flight}");
    let id = flight["id"].as_str().unwrap().to_string();

    // The worktree is the node's, under its data dir, reported through it.
    let w = s.agent("rw")["worktree_state"].clone();
    assert_eq!(w["branch"], "relay/rw", "{w}");
    let path = PathBuf::from(w["path"].as_str().unwrap());
    assert!(
        canonical(&path).starts_with(canonical(&node_dir)),
        "{w} not under {}",
        node_dir.display()
    );
    assert!(
        !canonical(&path).starts_with(canonical(&s.relay.data_dir)),
        "{w}"
    );
    assert_eq!(
        std::fs::read_to_string(path.join("node.txt")).unwrap(),
        "from the node\n"
    );

    // The commit is recorded (the commit's report comes before the flight's end), the
    // file is on the branch, never in the main checkout.
    let f = s.relay.cli_json(&["flight", "show", &id, "--json"]);
    let commit = &f["commit"];
    assert_eq!(commit["branch"], "relay/rw", "{f}");
    assert_eq!(commit["files"][0]["path"], "node.txt", "{f}");
    assert_eq!(
        s.git(&["show", "relay/rw:node.txt"]),
        "from the node",
        "the file on branch relay/rw"
    );
    assert!(!s.repo.join("node.txt").exists());
    let message = s.git(&["log", "-1", "--format=%B", "relay/rw"]);
    assert!(
        message.contains(&format!("Relay-Flight: {id}")),
        "{message}"
    );

    // The flight's patch was recorded with it; the branch's live diff is on the node's
    // host, and the refusal says where to run git.
    let patch = s.relay.cli_ok(&["diff", &id]);
    assert!(patch.contains("+from the node"), "{patch}");
    let e = refused(&s.relay.cli(&["diff", "rw"]));
    assert!(
        e.contains("node n1's host") && e.contains(&format!("git -C {} diff", s.repo.display())),
        "{e}"
    );
    assert!(e.contains("relay diff FLIGHT"), "{e}");

    // A revert goes to the node, which makes it and reports it on the flight.
    let sent = s.relay.cli_ok(&["revert", &id]);
    assert!(sent.contains("asked of agent rw's runtime"), "{sent}");
    let by = wait_until(
        "the node's revert recorded on the flight",
        Duration::from_secs(30),
        || async {
            let f = s.relay.cli_json(&["flight", "show", &id, "--json"]);
            f["commit"]["reverted_by"]["commit"]
                .as_str()
                .map(str::to_string)
        },
    )
    .await;
    let message = s.git(&["log", "-1", "--format=%B", &by]);
    assert!(
        message.contains(&format!("Relay-Revert-Of: {id}")),
        "{message}"
    );
    assert!(!path.join("node.txt").exists());
    let e = refused(&s.relay.cli(&["revert", &id]));
    assert!(e.contains("reverted already"), "{e}");

    // Removal: the node decides, and keeps a worktree holding uncommitted work.
    std::fs::write(path.join("draft.txt"), "unfinished\n").unwrap();
    let removed = s.relay.cli(&["agent", "remove", "rw"]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    let said = stdout(&removed);
    assert!(
        said.contains(&format!(
            "worktree {} is removed by node n1 on its host, and kept there if it holds uncommitted work",
            path.display()
        )) && said.contains("`relay doctor` on that host does not reach it yet"),
        "{said}"
    );
    // Not the local wording: this host removes nothing.
    assert!(
        !said.contains(&format!("worktree {} removed", path.display())),
        "{said}"
    );
    assert!(said.contains("branch relay/rw is kept"), "{said}");
    wait_until(
        "the node to keep the dirty worktree",
        Duration::from_secs(30),
        || async { node.log_text().contains("worktree kept").then_some(()) },
    )
    .await;
    assert!(path.join("draft.txt").exists());
    assert!(!s.git(&["branch", "--list", "relay/rw"]).is_empty());
}
