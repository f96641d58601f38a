//! Secrets kept as secrets: `--env` values that look like keys and `--secret` ones reach
//! the agent's process (embedded runtime and a `relay node`), and nothing else: not the
//! event log, not a listing, not any NATS message (a stranger subscribed to everything
//! on an open server sees none), and they are deleted with the agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use futures::StreamExt;
use relay_tests::environ::{recorded, recording_harness};
use relay_tests::nats::NatsServer;
use relay_tests::{NodeProcess, RelayProcess};

/// `relay agent add` with `extra` arguments and `envs` in the CLI's own environment.
fn add_agent(relay: &RelayProcess, args: &[&str], envs: &[(&str, &str)]) {
    let out = Command::new(&relay.bin)
        .args(["agent", "add"])
        .args(args)
        .env("RELAY_DATA_DIR", &relay.data_dir)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const SECRET_VALUES: &[&str] = &["sk-local-5e1f", "ghp-local-93ab", "tok-remote-c0de"];

#[tokio::test(flavor = "multi_thread")]
async fn secrets_reach_the_agent_and_nothing_else() {
    let nats = NatsServer::start().unwrap();
    let url = nats.url();
    let tmp = tempfile::tempdir().unwrap();
    // A stranger on the open bus, listening to everything from the start.
    let stranger = async_nats::connect(url.as_str()).await.unwrap();
    let mut everything = stranger.subscribe(">").await.unwrap();
    stranger.flush().await.unwrap();

    let mut relay =
        RelayProcess::start_with(&tmp.path().join("data"), &["--nats", &url], &[]).unwrap();
    let _node = NodeProcess::start("n1", &tmp.path().join("n1"), &url, &relay).unwrap();
    let cwd = tmp.path().display().to_string();
    let (local_cmd, local_dump) = recording_harness(tmp.path(), "local");
    let (remote_cmd, remote_dump) = recording_harness(tmp.path(), "remote");
    add_agent(
        &relay,
        &[
            "local",
            "--harness",
            "codex_app_server",
            "--cwd",
            &cwd,
            "--command",
            &local_cmd.display().to_string(),
            "--env",
            "OPENAI_API_KEY=sk-local-5e1f",
            "--env",
            "PLAIN=visible",
            "--secret",
            "GH_TOKEN",
        ],
        &[("GH_TOKEN", "ghp-local-93ab")],
    );
    add_agent(
        &relay,
        &[
            "remote",
            "--harness",
            "codex_app_server",
            "--cwd",
            &cwd,
            "--node",
            "n1",
            "--command",
            &remote_cmd.display().to_string(),
            "--secret",
            "SERVICE",
        ],
        &[("SERVICE", "tok-remote-c0de")],
    );
    // `relay ask` succeeds only when the flight completed.
    relay.cli_ok(&["ask", "local", "hello"]);
    relay.cli_ok(&["ask", "remote", "hello"]);

    // The agents got them.
    let local = recorded(&local_dump);
    assert_eq!(local["OPENAI_API_KEY"], "sk-local-5e1f");
    assert_eq!(local["GH_TOKEN"], "ghp-local-93ab");
    assert_eq!(local["PLAIN"], "visible");
    assert_eq!(recorded(&remote_dump)["SERVICE"], "tok-remote-c0de");

    // Nothing else did: listings show ***, the event log holds no value.
    let shown = relay.cli_json(&["agent", "show", "local", "--json"]);
    assert_eq!(shown["env"]["OPENAI_API_KEY"], "***", "{shown}");
    assert_eq!(shown["env"]["GH_TOKEN"], "***", "{shown}");
    assert_eq!(shown["env"]["PLAIN"], "visible", "{shown}");
    let texts = [
        relay.cli_ok(&["agent", "list", "--json"]),
        relay.cli_ok(&["agent", "show", "remote"]),
        relay
            .http()
            .get("/v1/events?limit=10000")
            .await
            .1
            .to_string(),
        relay.http().get("/v1/agents").await.1.to_string(),
    ];
    for text in &texts {
        for secret in SECRET_VALUES {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
    }

    // Removing the agents deletes their secrets.
    relay.cli_ok(&["agent", "remove", "local"]);
    relay.cli_ok(&["agent", "remove", "remote"]);
    assert!(relay.terminate().unwrap().success());
    let store =
        relay_broker::Store::open(&tmp.path().join("data").join(relay_broker::store::STORE_DIR))
            .unwrap();
    for agent in ["local", "remote"] {
        let left: Option<BTreeMap<String, String>> = store
            .get(relay_broker::store::T::Secrets, agent.as_bytes())
            .unwrap();
        assert_eq!(left, None, "{agent}'s secrets outlived it");
    }
    drop(store);

    // No NATS message carried a value (the node's dispatch was sealed). The broker has
    // exited, so everything it published reached the server before this sentinel.
    stranger
        .publish("test.sentinel", "end".into())
        .await
        .unwrap();
    let mut seen = 0;
    while let Some(msg) = everything.next().await {
        if msg.subject.as_str() == "test.sentinel" {
            break;
        }
        seen += 1;
        for secret in SECRET_VALUES {
            assert!(
                !msg.payload
                    .windows(secret.len())
                    .any(|w| w == secret.as_bytes()),
                "{secret} published on {}",
                msg.subject
            );
        }
    }
    assert!(
        seen > 10,
        "the stranger heard {seen} messages: the check proved little"
    );
}
