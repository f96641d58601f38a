//! What an agent process inherits: a real `relay up` started with secrets in its own
//! environment runs an agent (a wrapper script that records its environment, then execs
//! `relay-instant-codex`); none of the broker's secrets may reach the agent, only the
//! access Relay makes for it (its name, the API's URL, a token scoped to it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_tests::environ::{recorded, recording_harness};
use relay_tests::{procs, RelayProcess};

/// Variables set in the broker's environment that no agent may see.
const SECRETS: &[(&str, &str)] = &[
    ("RELAY_NATS_REQUEST_TOKEN", "nats-request-secret-4f1c"),
    ("AWS_SECRET_ACCESS_KEY", "aws-secret-9b2e"),
    ("RELAY_TOKEN", "relay-operator-secret-77a0"),
    ("RELAY_URL", "http://127.0.0.1:9/relay-url-secret"),
];

#[tokio::test(flavor = "multi_thread")]
async fn agents_do_not_inherit_the_brokers_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let (wrapper, dump) = recording_harness(tmp.path(), "agent");

    let data_str = data.display().to_string();
    let mut envs: Vec<(&str, &str)> = SECRETS.to_vec();
    envs.push(("RELAY_DATA_DIR", &data_str));
    let mut relay = RelayProcess::start_with(&data, &[], &envs).unwrap();
    let cwd = tmp.path().display().to_string();
    let wrapper_str = wrapper.display().to_string();
    relay.cli_ok(&[
        "agent",
        "add",
        "envy",
        "--harness",
        "codex_app_server",
        "--cwd",
        &cwd,
        "--command",
        &wrapper_str,
        "--env",
        "AGENT_OWN=from-the-agent-spec",
    ]);
    // `relay ask` returns when the flight has ended; it succeeds only if it completed.
    let reply = relay.cli_ok(&["ask", "envy", "hello"]);
    assert!(reply.contains("ok: hello"), "{reply}");
    let pid = relay.cli_json(&["agent", "show", "envy", "--json"])["endpoint"]["pid"]
        .as_u64()
        .unwrap() as u32;

    // The wrapper wrote the file before it exec'd the harness that answered.
    let vars = recorded(&dump);
    for (name, value) in SECRETS {
        assert!(
            !vars.values().any(|v| v.contains(value)),
            "the value of {name} leaked: {vars:?}"
        );
    }
    for name in ["RELAY_NATS_REQUEST_TOKEN", "AWS_SECRET_ACCESS_KEY"] {
        assert!(!vars.contains_key(name), "{name} leaked: {vars:?}");
    }
    // Nor does the broker's own API token: the agent has one scoped to itself.
    assert!(
        !vars.values().any(|v| v.contains(&relay.api.token)),
        "the operator's token leaked: {vars:?}"
    );
    assert!(!vars.contains_key("RELAY_DATA_DIR"), "{vars:?}");
    assert!(
        !vars.values().any(|v| v.contains(&data_str)),
        "the data dir leaked: {vars:?}"
    );
    // The RELAY_* variables are Relay's marker and the agent's access, made for it:
    // its name, the broker's URL (not the one in the broker's environment), its own
    // token and the relay program.
    let relay_vars: Vec<&String> = vars.keys().filter(|k| k.starts_with("RELAY_")).collect();
    assert_eq!(
        relay_vars,
        vec![
            "RELAY_AGENT",
            "RELAY_BIN",
            "RELAY_SUPERVISED",
            "RELAY_TOKEN",
            "RELAY_URL"
        ],
        "{vars:?}"
    );
    assert_eq!(vars["RELAY_AGENT"], "envy");
    assert_eq!(vars["RELAY_URL"], relay.api.url);
    assert_eq!(
        vars["RELAY_TOKEN"],
        relay_broker::seal::AgentTokens::new(relay.api.token.as_bytes()).token("envy")
    );
    assert_eq!(
        std::path::Path::new(&vars["RELAY_BIN"]),
        relay_tests::relay_bin()
    );
    assert_eq!(
        vars.get("AGENT_OWN").map(String::as_str),
        Some("from-the-agent-spec")
    );
    // PATH is passed through, with the relay program's directory at its end.
    let path = std::env::var("PATH").unwrap();
    let relay_dir = relay_tests::relay_bin()
        .parent()
        .unwrap()
        .display()
        .to_string();
    let expected = if std::env::split_paths(&path).any(|p| p.display().to_string() == relay_dir) {
        path
    } else {
        format!("{path}:{relay_dir}")
    };
    assert_eq!(vars.get("PATH"), Some(&expected), "PATH is passed through");

    // Stopping the broker stops its agent.
    assert!(relay.terminate().unwrap().success());
    assert!(
        procs::wait_gone(pid, Duration::from_secs(30)).await,
        "agent {pid} outlived the broker"
    );
}
