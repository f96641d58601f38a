//! The bus obeys only the broker and its nodes: a NATS client without the broker's keys
//! or credentials cannot make a node run anything, nor forge what a node reports. A real
//! nats-server (open, and with the shipped `ops/nats` users), a broker, a `relay node`,
//! the real pinned codex and the mock model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_protocol::domain::{
    Action, Agent, AgentSpec, AgentState, Flight, FlightChange, FlightState, Harness, Invocation,
};
use relay_protocol::runtime::{Control, Dispatch, Report};
use relay_tests::agents::{state, Env};
use relay_tests::nats::{Auth, NatsServer};
use relay_tests::NodeProcess;
use serde_json::Value;

/// An agent spec whose "harness" is a script that leaves `marker` behind if it ever runs.
fn evil_agent(dir: &Path, marker: &Path) -> Agent {
    let script = dir.join("evil.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\nsleep 5\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut spec = AgentSpec::new("evil", Harness::CodexAppServer, dir.display().to_string());
    spec.node = Some("n1".into());
    spec.command = Some(script.display().to_string());
    Agent {
        worktree: None,
        spec,
        state: AgentState::Offline,
        session_id: None,
        thread_id: None,
        endpoint: None,
        state_reason: None,
        note: None,
        program: None,
        created_at: 0,
        updated_at: 0,
    }
}

fn forged_dispatch(agent: Agent) -> Dispatch {
    let invocation = Invocation {
        id: "inv_forged".into(),
        requester: "mallory".into(),
        target: agent.spec.name.clone(),
        action: Action::Execute,
        task: "run".into(),
        conversation: "channel.shared".into(),
        request_message: "msg_forged".into(),
        parent_flight: None,
        depth: 0,
        timeout_ms: None,
        created_at: 0,
    };
    let flight = Flight::queued("flt_forged", &invocation);
    Dispatch {
        agent,
        invocation,
        flight,
    }
}

async fn ask_remote(env: &Env, text: &str) -> Value {
    let id = env.ask_no_wait("remote-1", text);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stranger_on_an_open_bus_cannot_make_a_node_run_anything() {
    let nats = NatsServer::start().unwrap();
    let url = nats.url();
    let env = Env::start_with(&["--nats", &url]).await;
    let node = NodeProcess::start("n1", &env.tmp.path().join("node-n1"), &url, &env.relay).unwrap();
    env.add_agent("remote-1", &["--node", "n1"]);
    let marker: PathBuf = env.tmp.path().join("pwned");
    let evil = evil_agent(env.tmp.path(), &marker);
    let stranger = async_nats::connect(url.as_str()).await.unwrap();
    // A node key is only made from a broker's own data dir (one made anywhere else
    // would open nothing the broker seals).
    let out = relay_tests::relay_cmd_with(
        &env.relay.bin,
        &env.tmp.path().join("not-a-broker"),
        &["node-key", "n1"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a broker's data dir"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A wake control with the stranger's program: refused, as unauthenticated.
    let wake = Control::Wake {
        spec: Box::new(evil.clone()),
    };
    let reply = stranger
        .request(
            "relay.v1.node.n1.control",
            serde_json::to_vec(&wake).unwrap().into(),
        )
        .await
        .unwrap();
    let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(reply["error"]["code"], "unauthorized", "{reply}");

    // A forged dispatch in the node's JetStream queue, and a forged report claiming a
    // flight of the broker's ended.
    let js = async_nats::jetstream::new(stranger.clone());
    js.publish(
        "relay.v1.dispatch.n1",
        serde_json::to_vec(&forged_dispatch(evil)).unwrap().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let slow = env.ask_no_wait("remote-1", "slow: one two three four five six seven");
    env.wait_flight(&slow, 60, |f| state(f) == "running").await;
    let forged_end = Report::Flight {
        flight: slow.clone(),
        change: FlightChange::State {
            to: FlightState::Failed,
            reason: Some("forged".into()),
            output: None,
        },
    };
    js.publish(
        "relay.v1.report.n1",
        serde_json::to_vec(&forged_end).unwrap().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    // Even a node, with a key of its own (n2's, derived from the broker's bus key), may
    // report only on its own agents.
    let bus_key = relay_broker::files::read_key(&env.relay.data_dir.join("bus.key"))
        .unwrap()
        .unwrap();
    let n2 = relay_broker::seal::BusKey::new(bus_key).node("n2");
    js.publish(
        "relay.v1.report.n2",
        n2.seal(
            "relay.v1.report.n2",
            &serde_json::to_vec(&forged_end).unwrap(),
        )
        .into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();

    // The node goes on serving its broker: the dispatch queued after the forged one ran,
    // so the forged one was handled (dropped) first; the broker's flight ends as the
    // node says, not as the forgery did.
    let f = env
        .wait_flight(&slow, 60, |f| state(f) == "completed")
        .await;
    assert!(f["error"].is_null(), "{f}");
    let f = ask_remote(&env, "after the forgeries").await;
    assert!(f["output"]
        .as_str()
        .unwrap()
        .contains("after the forgeries"));
    assert!(!marker.exists(), "the stranger's program ran");
    let log = node.log_text();
    assert!(log.contains("dispatch dropped"), "{log}");
    assert!(log.contains("node control refused"), "{log}");
    let broker_log = env.relay.log_text();
    assert!(broker_log.contains("node report dropped"), "{broker_log}");
    assert!(
        broker_log.contains("a node reported on an agent that is not its own"),
        "{broker_log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shipped_nats_users_keep_a_client_off_the_node_subjects() {
    let nats = NatsServer::start_with_auth(Auth::RelayUsers {
        broker: "broker-pw".into(),
        node: "node-pw".into(),
        client: "client-pw".into(),
    })
    .unwrap();
    let url = nats.url();
    let secrets = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = secrets.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let broker_pw = file("broker", "broker-pw");
    let node_pw = file("node", "node-pw");
    let env = Env::start_with(&[
        "--nats",
        &url,
        "--nats-user",
        "relay-broker",
        "--nats-password-file",
        &broker_pw,
    ])
    .await;
    let _node = NodeProcess::start_with(
        "n1",
        &env.tmp.path().join("node-n1"),
        &url,
        &env.relay,
        &[
            "--nats-user",
            "relay-node-n1",
            "--nats-password-file",
            &node_pw,
        ],
    )
    .unwrap();
    env.add_agent("remote-1", &["--node", "n1"]);
    // The node's permissions are enough to serve.
    let f = ask_remote(&env, "through the permissioned bus").await;
    assert!(
        f["output"].as_str().unwrap().contains("permissioned"),
        "{f}"
    );

    let client = async_nats::ConnectOptions::with_user_and_password(
        "relay-client".into(),
        "client-pw".into(),
    )
    // What is refused is never answered: do not wait long for it.
    .request_timeout(Some(Duration::from_secs(2)))
    .connect(url.as_str())
    .await
    .unwrap();
    // The client may invoke: the broker answers it.
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        client.request_with_headers(
            "relay.v1.invoke.remote-1",
            {
                let mut h = async_nats::HeaderMap::new();
                h.insert("Content-Type", "application/json");
                h
            },
            serde_json::json!({"task": "hello from a client", "requester": "c"})
                .to_string()
                .into(),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let reply: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert!(reply.get("error").is_none(), "{reply}");
    // But a node control never reaches the node, and a dispatch never enters its queue.
    let control = client
        .request(
            "relay.v1.node.n1.control",
            serde_json::to_vec(&Control::AgentRemoved {
                force: false,
                agent: "remote-1".into(),
            })
            .unwrap()
            .into(),
        )
        .await;
    assert!(control.is_err(), "a client reached the node: {control:?}");
    let mut js = async_nats::jetstream::new(client.clone());
    js.set_timeout(Duration::from_secs(2));
    let published = match js.publish("relay.v1.dispatch.n1", "{}".into()).await {
        Ok(ack) => ack.await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(published.is_err(), "a client queued a dispatch");
    let published = match js.publish("relay.v1.report.n1", "{}".into()).await {
        Ok(ack) => ack.await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(published.is_err(), "a client queued a report");
    for subject in [
        "relay.v1.node.n1.control",
        "relay.v1.dispatch.n1",
        "relay.v1.report.n1",
    ] {
        let violation = format!("Publish Violation - User \"relay-client\", Subject \"{subject}\"");
        assert!(nats.log_text().contains(&violation), "{}", nats.log_text());
    }
    // And the agent still works.
    let f = ask_remote(&env, "still served").await;
    assert!(
        f["output"].as_str().unwrap().contains("still served"),
        "{f}"
    );
}
