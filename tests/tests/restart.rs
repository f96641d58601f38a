//! Restarts with work queued behind a running turn: a `relay node` killed with SIGKILL
//! or stopped with SIGTERM, nats-server killed under the node, and the broker's own
//! runtime killed with SIGKILL. Each time only the turn that was running may fail (with
//! its cause); every flight queued behind it has never started, so it must be delivered
//! again and run exactly once. Real processes throughout: nats-server, `relay up`,
//! `relay node`, the pinned Codex CLI against the mock model (whose `hang` task holds
//! the turn until its client goes away).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_tests::agents::{state, Env};
use relay_tests::nats::NatsServer;
use relay_tests::{wait_until, NodeProcess};

/// Flights queued behind the running one.
const QUEUED: usize = 4;

/// A running turn that never ends on its own, and `QUEUED` flights behind it, each with
/// its task. Returns (running flight, [(queued flight, task)]).
async fn queue_behind_a_running_turn(env: &Env, agent: &str) -> (String, Vec<(String, String)>) {
    let running = env.ask_no_wait(agent, "hang until the restart");
    env.wait_flight(&running, 90, |f| state(f) == "running")
        .await;
    let queued = (0..QUEUED)
        .map(|i| {
            let task = format!("queued task {i}");
            (env.ask_no_wait(agent, &task), task)
        })
        .collect();
    (running, queued)
}

/// Waits until the node holds every queued dispatch (delivered, not acknowledged: their
/// turns wait behind the running one), so the restart really meets them there.
async fn wait_node_holds(nats: &NatsServer, node: &str, n: usize) {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    wait_until(
        format!("node {node} to hold {n} dispatches"),
        Duration::from_secs(60),
        || async {
            let mut consumer: async_nats::jetstream::consumer::PullConsumer = js
                .get_stream(relay_protocol::bus::subjects::DISPATCH_STREAM)
                .await
                .ok()?
                .get_consumer(&format!("node-{node}"))
                .await
                .ok()?;
            let info = consumer.info().await.ok()?;
            (info.num_ack_pending == n && info.num_pending == 0).then_some(())
        },
    )
    .await
}

/// The running flight failed with `cause`; every queued one completed, its task run by
/// the model exactly once, and none failed on the way.
async fn check_after_restart(
    env: &Env,
    running: &str,
    queued: &[(String, String)],
    cause: &str,
    log: impl Fn() -> String,
) {
    let f = env.wait_flight_or_show(running, 90, ended, &log).await;
    assert_eq!(state(&f), "failed", "{f}\n{}", log());
    let reason = f["error"].as_str().unwrap_or_default();
    assert!(reason.contains(cause), "{f}");
    for (id, task) in queued {
        let f = env.wait_flight_or_show(id, 120, ended, &log).await;
        assert_eq!(
            state(&f),
            "completed",
            "a queued flight that never started ended otherwise: {f}\nupdates: {:?}\n{}",
            env.updates(id).await,
            log()
        );
        assert_eq!(f["output"], format!("ok: {task}"), "{f}");
        let runs = env
            .mock
            .requests()
            .iter()
            .filter(|r| r.last_user_text().as_deref() == Some(task.as_str()))
            .count();
        assert_eq!(runs, 1, "{task:?} ran {runs} times");
    }
}

fn ended(f: &serde_json::Value) -> bool {
    matches!(state(f), "completed" | "failed" | "cancelled")
}

async fn setup_node(nats: &NatsServer) -> (Env, NodeProcess) {
    let url = nats.url();
    let env = Env::start_with(&["--nats", &url]).await;
    let node = NodeProcess::start("n1", &env.tmp.path().join("node-n1"), &url, &env.relay).unwrap();
    env.add_agent("remote-1", &["--node", "n1"]);
    (env, node)
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_a_node_fails_only_the_running_turn_and_runs_the_queued_once() {
    let nats = NatsServer::start().unwrap();
    let (env, mut node) = setup_node(&nats).await;
    let (running, queued) = queue_behind_a_running_turn(&env, "remote-1").await;
    wait_node_holds(&nats, "n1", QUEUED).await;
    node.kill9();
    node.restart().unwrap();
    check_after_restart(
        &env,
        &running,
        &queued,
        "node n1 restarted while this flight was running",
        || format!("node log:\n{}", node.log_text()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_stopped_with_sigterm_leaves_its_queued_flights_for_the_next_start() {
    let nats = NatsServer::start().unwrap();
    let (env, mut node) = setup_node(&nats).await;
    let (running, queued) = queue_behind_a_running_turn(&env, "remote-1").await;
    wait_node_holds(&nats, "n1", QUEUED).await;
    let status = node.terminate().unwrap();
    assert!(status.success(), "{status}\n{}", node.log_text());
    node.restart().unwrap();
    check_after_restart(&env, &running, &queued, "shut down", || {
        format!("node log:\n{}", node.log_text())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_nats_then_of_the_node_fails_only_the_running_turn() {
    let mut nats = NatsServer::start().unwrap();
    let (env, mut node) = setup_node(&nats).await;
    let (running, queued) = queue_behind_a_running_turn(&env, "remote-1").await;
    wait_node_holds(&nats, "n1", QUEUED).await;
    // NATS goes away under the node, comes back, and then the node is killed.
    nats.kill9();
    nats.restart().unwrap();
    wait_node_holds(&nats, "n1", QUEUED).await;
    node.kill9();
    node.restart().unwrap();
    check_after_restart(
        &env,
        &running,
        &queued,
        "node n1 restarted while this flight was running",
        || format!("node log:\n{}", node.log_text()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_the_broker_fails_only_the_running_turn_of_its_runtime() {
    let mut env = Env::start().await;
    env.add_agent("local-1", &[]);
    let (running, queued) = queue_behind_a_running_turn(&env, "local-1").await;
    env.relay.restart().unwrap();
    check_after_restart(
        &env,
        &running,
        &queued,
        "relay stopped while this flight was running",
        || format!("broker log:\n{}", env.relay.log_text()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_stopped_with_sigterm_leaves_its_queued_flights_for_the_next_start() {
    let mut env = Env::start().await;
    env.add_agent("local-1", &[]);
    let (running, queued) = queue_behind_a_running_turn(&env, "local-1").await;
    let status = env.relay.terminate().unwrap();
    assert!(status.success(), "{status}\n{}", env.relay.log_text());
    env.relay.restart().unwrap();
    check_after_restart(&env, &running, &queued, "shut down", || {
        format!("broker log:\n{}", env.relay.log_text())
    })
    .await;
}

/// A node stopped while NATS is away: today it did not exit (its last flush waited for
/// a server for ever), and it failed its queued flights with ends it could not send
/// (recorded as started, so the next start would call them running). Only the running
/// turn may fail, with its cause.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_stopped_while_nats_is_down_fails_only_the_running_turn() {
    let mut nats = NatsServer::start().unwrap();
    let (env, mut node) = setup_node(&nats).await;
    let (running, queued) = queue_behind_a_running_turn(&env, "remote-1").await;
    wait_node_holds(&nats, "n1", QUEUED).await;
    nats.kill9();
    let status = node.terminate().unwrap();
    assert!(status.success(), "{status}\n{}", node.log_text());
    nats.restart().unwrap();
    node.restart().unwrap();
    // The end the stop gave the running turn could not be sent then: it is recorded,
    // and sent at the next start.
    check_after_restart(
        &env,
        &running,
        &queued,
        "the runtime was shut down during the turn",
        || {
            format!(
                "node log:\n{}\nnats-server log:\n{}",
                node.log_text(),
                nats.log_text()
            )
        },
    )
    .await;
}
