//! Remembered decisions through the `relay` command line, against a real broker and the
//! real pinned Codex (mock model): `relay approval decide --remember` says the rule it
//! made; the rule decides the next identical command (recorded as `rule:<id>`) and
//! counts it; `relay rule list|show|remove` show and remove it, in text and `--json`;
//! after removal the command asks again; `--any-arg` remembers one argument as `*`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::agents::{state, Env};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asks `agent` to run `command` and waits for the approval it asks for: its id.
async fn pending_approval(env: &Env, agent: &str, command: &str) -> (String, String) {
    let flight = env.ask_no_wait(agent, &format!("exec: {command}"));
    env.wait_flight(&flight, 60, |f| state(f) == "waiting")
        .await;
    let a = env.approval_of(&flight);
    assert_eq!(a["state"], "pending", "{a}");
    (flight, a["id"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_remembered_decision_decides_the_same_command_until_it_is_removed() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    env.add_agent("codex-2", &[]);
    let (flight, approval) = pending_approval(&env, "codex-1", "echo remembered-once").await;

    // What cannot be remembered is refused before the broker is asked, and the
    // approval still waits.
    let out = env.relay.cli(&[
        "approval",
        "decide",
        &approval,
        "cancel",
        "--remember",
        "agent",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--remember goes with accept or decline"),
        "{}",
        stderr(&out)
    );
    let out = env
        .relay
        .cli(&["approval", "decide", &approval, "accept", "--any-arg", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(env.approval_of(&flight)["state"], "pending");

    // Accepted and remembered for the agent: the CLI says what it remembered.
    let said = env.relay.cli_ok(&[
        "approval",
        "decide",
        &approval,
        "accept",
        "--remember",
        "agent",
    ]);
    let rules = env.relay.cli_json(&["rule", "list", "--json"]);
    let rules = rules.as_array().unwrap();
    assert_eq!(rules.len(), 1, "{rules:?}");
    let rule = &rules[0];
    let id = rule["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("rul_"), "{rule}");
    assert_eq!(
        said.trim_end(),
        format!(
            "{approval} accept by operator\nremembered as rule {id}: accept `echo remembered-once` for agent codex-1"
        )
    );
    assert_eq!(
        (
            rule["decision"].as_str(),
            rule["kind"].as_str(),
            rule["pattern"].as_str(),
            rule["scope"].as_str(),
            rule["agent"].as_str(),
            rule["origin"].as_str(),
            rule["matched"].as_u64(),
        ),
        (
            Some("accept"),
            Some("command"),
            Some("echo remembered-once"),
            Some("agent"),
            Some("codex-1"),
            Some(approval.as_str()),
            Some(0)
        )
    );
    assert_eq!(env.approval_of(&flight)["remembered"], id.as_str());
    env.wait_flight(&flight, 60, |f| state(f) == "completed")
        .await;

    // The same command again runs without a person, decided by the rule.
    let again = env.ask_no_wait("codex-1", "exec: echo remembered-once");
    let f = env
        .wait_flight(&again, 60, |f| state(f) == "completed")
        .await;
    assert!(
        f["output"].as_str().unwrap().contains("remembered-once"),
        "{f}"
    );
    let decided = env.approval_of(&again);
    assert_eq!(decided["decided_by"], format!("rule:{id}"), "{decided}");
    assert_eq!(decided["decision"], "accept");

    // Listed with its count, as text and JSON; only for the agent it applies to.
    let list = env.relay.cli_ok(&["rule", "list"]);
    let lines: Vec<&str> = list.lines().collect();
    assert!(
        lines[0].starts_with("RULE") && lines[0].ends_with("PATTERN"),
        "{list}"
    );
    let row = lines[1].split_whitespace().collect::<Vec<_>>();
    assert_eq!(
        row,
        [
            id.as_str(),
            "accept",
            "command",
            "agent",
            "codex-1",
            approval.as_str(),
            "1",
            row[7],
            row[8],
            "echo",
            "remembered-once"
        ],
        "{list}"
    );
    assert!(row[8] == "ago", "the last match is an age: {list}");
    let for_one = env
        .relay
        .cli_json(&["rule", "list", "--agent", "codex-1", "--json"]);
    assert_eq!(for_one[0]["matched"], 1, "{for_one}");
    assert!(for_one[0]["last_matched_at"].as_u64().is_some());
    let for_two = env.relay.cli(&["rule", "list", "--agent", "codex-2"]);
    assert!(for_two.status.success());
    assert_eq!(stdout(&for_two), "");
    assert_eq!(
        stderr(&for_two).trim(),
        "no remembered decision applies to codex-2"
    );

    // Shown whole.
    let shown = env.relay.cli_ok(&["rule", "show", &id]);
    for line in [
        format!("rule      {id}"),
        "decision  accept".into(),
        "pattern   echo remembered-once".into(),
        "scope     agent".into(),
        "agent     codex-1".into(),
        "matched   1 times".into(),
    ] {
        assert!(shown.contains(&line), "{line:?} in\n{shown}");
    }
    assert_eq!(
        env.relay.cli_json(&["rule", "show", &id, "--json"])["id"],
        id.as_str()
    );

    // Removed: said so; gone (exit 3, its code); the command asks a person again.
    let removed = env.relay.cli_ok(&["rule", "remove", &id]);
    assert_eq!(
        removed.trim_end(),
        format!("removed {id}: accept `echo remembered-once` for agent codex-1; such requests ask again")
    );
    let gone = env.relay.cli(&["rule", "show", &id]);
    assert_eq!(gone.status.code(), Some(3), "{}", stderr(&gone));
    assert!(
        stderr(&gone).contains("(unknown_rule)"),
        "{}",
        stderr(&gone)
    );
    let (third, approval) = pending_approval(&env, "codex-1", "echo remembered-once").await;

    // --any-arg 1: the first argument may be any plain one; for this session only.
    let said = env.relay.cli_ok(&[
        "approval",
        "decide",
        &approval,
        "accept",
        "--remember",
        "session",
        "--any-arg",
        "1",
    ]);
    let rule = env.relay.cli_json(&["rule", "list", "--json"])[0].clone();
    assert_eq!(rule["pattern"], "echo *", "{rule}");
    assert_eq!(rule["scope"], "session", "{rule}");
    let thread = rule["session"].as_str().unwrap();
    assert!(
        said.contains(&format!(
            ": accept `echo *` for agent codex-1's session {thread}"
        )),
        "{said}"
    );
    env.wait_flight(&third, 60, |f| state(f) == "completed")
        .await;
    let other = env.ask_no_wait("codex-1", "exec: echo another-word");
    env.wait_flight(&other, 60, |f| state(f) == "completed")
        .await;
    assert_eq!(
        env.approval_of(&other)["decided_by"],
        format!("rule:{}", rule["id"].as_str().unwrap())
    );
}
