//! Runtimes on other hosts: a broker (`relay up --nats`) and a `relay node` as separate
//! processes, a real nats-server, the real pinned CLIs (codex; claude and pi in one test)
//! and the mock model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_mock_model::all_input_text;
use relay_tests::agents::{state, Env};
use relay_tests::nats::NatsServer;
use relay_tests::NodeProcess;

async fn setup(nats: &NatsServer, agent_extra: &[&str]) -> (Env, NodeProcess) {
    let url = nats.url();
    let env = Env::start_with(&["--nats", &url]).await;
    let node = NodeProcess::start("n1", &env.tmp.path().join("node-n1"), &url, &env.relay).unwrap();
    let mut extra = vec!["--node", "n1"];
    extra.extend_from_slice(agent_extra);
    env.add_agent("remote-1", &extra);
    (env, node)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_serves_its_agent_through_nats() {
    let nats = NatsServer::start().unwrap();
    let (env, node) = setup(&nats, &[]).await;
    let out = env.relay.cli(&["ask", "remote-1", "the word is heron"]);
    assert!(
        out.status.success(),
        "{}\nnode log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.log_text()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok: the word is heron"
    );
    // The thread id lives in the node's sled and is reported to the broker.
    let agent = env.agent("remote-1").await;
    let thread = agent["thread_id"].as_str().unwrap().to_string();
    assert_eq!(agent["endpoint"]["node"], "n1");
    let out = env.relay.cli_ok(&["ask", "remote-1", "which word?"]);
    assert_eq!(out.trim(), "ok: which word?");
    assert_eq!(env.agent("remote-1").await["thread_id"], thread.as_str());
    let input = all_input_text(&env.mock.requests().last().cloned().unwrap());
    assert!(input.contains("the word is heron"), "{input}");

    // Control reaches the node: interrupt a slow stream.
    let id = env.ask_no_wait("remote-1", "slow: one two three four five six seven eight");
    env.wait_delta(&id).await;
    env.relay.cli_ok(&["interrupt", &id]);
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(state(&f), "cancelled", "{f}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_the_node_mid_dispatch_runs_the_invocation_once() {
    let nats = NatsServer::start().unwrap();
    // A codex that takes 3 s to start: the node is killed while the turn is waking.
    let tmp = tempfile::tempdir().unwrap();
    let wrapper = tmp.path().join("slow-codex");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nsleep 3\nexec {} \"$@\"\n",
            relay_harnesses::codex::codex_program(None).display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let wrapper = wrapper.display().to_string();
    let (env, mut node) = setup(&nats, &["--command", &wrapper]).await;

    let id = env.ask_no_wait("remote-1", "count me once");
    env.wait_flight(&id, 30, |f| state(f) == "waking").await;
    // kill9 returns once the node is gone (reaped); the restarted one takes over.
    node.kill9();
    node.restart().unwrap();
    let f = env
        .wait_flight(&id, 90, |f| {
            f["state"] != "waking" && f["state"] != "queued" && f["state"] != "running"
        })
        .await;
    assert_eq!(
        state(&f),
        "completed",
        "{f}\nnode log:\n{}",
        node.log_text()
    );
    assert_eq!(f["output"], "ok: count me once");
    let runs = env
        .mock
        .requests()
        .iter()
        .filter(|r| r.last_user_text().as_deref() == Some("count me once"))
        .count();
    assert_eq!(runs, 1, "the invocation ran {runs} times");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nats_restart_mid_flight_still_completes_through_the_node() {
    let mut nats = NatsServer::start().unwrap();
    let (env, _node) = setup(&nats, &[]).await;
    let id = env.ask_no_wait("remote-1", "slow: a b c d e f g h");
    env.wait_delta(&id).await;
    nats.restart().unwrap();
    let f = env.wait_flight(&id, 90, |f| state(f) == "completed").await;
    assert_eq!(f["output"], "a b c d e f g h");
    let msgs = env
        .relay
        .cli_json(&["read", "direct.operator.remote-1", "--json"]);
    let last = msgs.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["author"], "remote-1");
    assert_eq!(last["body"], "a b c d e f g h");
    assert_eq!(last["meta"]["flight"], id.as_str());
}

/// Asks `remote-1` three tasks (all three in flight together) and waits until each of their
/// flights completed with its own answer.
async fn asks_all_complete(env: &Env, node: &NodeProcess, label: &str) {
    let asked: Vec<(String, String)> = (0..3)
        .map(|i| {
            let task = format!("{label} {i}");
            (env.ask_no_wait("remote-1", &task), task)
        })
        .collect();
    for (id, task) in asked {
        let f = env
            .wait_flight_or_show(
                &id,
                120,
                |f| matches!(state(f), "completed" | "failed" | "cancelled"),
                || format!("node log:\n{}", node.log_text()),
            )
            .await;
        assert_eq!(state(&f), "completed", "{f}");
        assert_eq!(f["output"], format!("ok: {task}"), "{f}");
    }
}

/// The broker's reader of node reports outlives its consumer: deleted under it (an
/// operator's `nats consumer rm`, a server that lost it), the reader makes it anew and
/// the node's next reports are applied; before, the reader ended in silence and every
/// flight of every node stayed running for ever.
#[tokio::test(flavor = "multi_thread")]
async fn the_report_reader_outlives_its_consumer_deleted_under_it() {
    let nats = NatsServer::start().unwrap();
    let (env, node) = setup(&nats, &[]).await;
    let out = env
        .relay
        .cli_ok(&["ask", "remote-1", "before the deletion"]);
    assert_eq!(out.trim(), "ok: before the deletion");
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream(relay_protocol::bus::subjects::REPORT_STREAM)
        .await
        .unwrap();
    // nats-server 2.9 may fail a consumer's deletion while it writes the consumer's
    // state ("unlinkat ... directory not empty", fixed upstream in nats-server#7886),
    // with the consumer already dropped or not: asked again until it is gone, as an
    // operator would.
    let refused = std::sync::atomic::AtomicBool::new(false);
    relay_tests::wait_until(
        "the report consumer deleted",
        Duration::from_secs(30),
        || async {
            match stream.delete_consumer("relay-broker").await {
                Ok(_) => Ok(()),
                Err(e) if e.to_string().contains("directory not empty") => {
                    refused.store(true, std::sync::atomic::Ordering::Relaxed);
                    Err(e.to_string())
                }
                Err(e)
                    if refused.load(std::sync::atomic::Ordering::Relaxed)
                        && matches!(
                            e.kind(),
                            async_nats::jetstream::stream::ConsumerErrorKind::JetStream(j)
                                if j.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_NOT_FOUND
                        ) =>
                {
                    Ok(())
                }
                Err(e) => panic!("deleting the report consumer: {e}"),
            }
        },
    )
    .await;
    asks_all_complete(&env, &node, "after the deletion").await;
    assert!(
        env.relay.log_text().contains("reading them anew"),
        "{}",
        env.relay.log_text()
    );
}

/// A nats-server back with an empty JetStream store (its directory lost or replaced):
/// the broker and the node make the streams and their consumers again, and the new
/// report stream's seqs, which start again from 1, are not taken for reports applied
/// already. Before, the node's next flights stayed queued for ever.
#[tokio::test(flavor = "multi_thread")]
async fn a_nats_server_back_with_an_empty_store_serves_the_node_again() {
    let mut nats = NatsServer::start().unwrap();
    let (env, node) = setup(&nats, &[]).await;
    // Enough reports that the cursor stands well past the new stream's first seqs.
    for i in 0..3 {
        let task = format!("before the loss {i}");
        let out = env.relay.cli_ok(&["ask", "remote-1", &task]);
        assert_eq!(out.trim(), format!("ok: {task}"));
    }
    nats.stop();
    std::fs::remove_dir_all(nats.store_dir()).unwrap();
    nats.restart().unwrap();
    asks_all_complete(&env, &node, "after the loss").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_serves_claude_code_and_pi_agents_approvals_included() {
    let nats = NatsServer::start().unwrap();
    let url = nats.url();
    let env = Env::start_with(&["--nats", &url]).await;
    let node = NodeProcess::start("n1", &env.tmp.path().join("node-n1"), &url, &env.relay).unwrap();
    env.add_claude("claude-r", &["--node", "n1"]);
    env.add_pi("pi-r", &["--node", "n1"]);

    // A Claude Code approval asked on the node, decided at the broker.
    let id = env.ask_no_wait("claude-r", "exec: touch remote-approved");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let a = env.approval_of(&id);
    assert_eq!(a["detail"], "bash -c 'touch remote-approved'", "{a}");
    env.relay
        .cli_ok(&["approve", a["id"].as_str().unwrap(), "accept"]);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(env.work.join("remote-approved").exists());

    let out = env.relay.cli(&["ask", "pi-r", "the word is heron"]);
    assert!(
        out.status.success(),
        "{}\nnode log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.log_text()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok: the word is heron"
    );
    for agent in ["claude-r", "pi-r"] {
        let a = env.agent(agent).await;
        assert_eq!(a["endpoint"]["node"], "n1", "{a}");
        assert!(a["session_id"].is_string(), "{a}");
    }
    // The session is the node's: the next turn carries the first.
    env.relay.cli_ok(&["ask", "pi-r", "which word?"]);
    let input = all_input_text(&env.mock.requests().last().cloned().unwrap());
    assert!(input.contains("the word is heron"), "{input}");
}

/// `relay node --log-format json`: every line the node writes on stderr, from its start
/// to its exit at SIGTERM, is one JSON object (no line for a person in between).
#[tokio::test(flavor = "multi_thread")]
async fn a_node_with_json_logs_writes_only_json() {
    let nats = NatsServer::start().unwrap();
    let url = nats.url();
    let env = Env::start_with(&["--nats", &url]).await;
    let mut node = NodeProcess::start_with(
        "n1",
        &env.tmp.path().join("node-n1"),
        &url,
        &env.relay,
        &["--log-format", "json"],
    )
    .unwrap();
    node.terminate().unwrap();
    let log = node.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{log}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "relay node up"),
        "{log}"
    );
}
