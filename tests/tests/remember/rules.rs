//! A decision remembered with `--remember agent`, with each real CLI: one scenario, one
//! broker and two agents of the harness, in the order the checks build on. The second
//! agent's CLI starts while the first works (a real CLI takes seconds to start).

use std::time::Duration;

use relay_tests::agents::Env;
use relay_tests::procs;
use serde_json::{json, Value};

use crate::clis::{ask_waiting, completed, Cli};

/// The command the person accepts and remembers (it writes, so every CLI asks first).
const CMD: &str = "touch remembered.txt";
/// The same command with an extra option: not what the person saw.
const WIDER: &str = "touch -c remembered.txt";

fn rules(env: &Env) -> Vec<Value> {
    let list = env.relay.cli_json(&["rule", "list", "--json"]);
    list.as_array().unwrap().clone()
}

/// `relay approval decide ID DECISION ARGS`; its output.
fn decide(env: &Env, approval: &Value, decision: &str, args: &[&str]) -> String {
    let id = approval["id"].as_str().unwrap();
    let all = [&["approval", "decide", id, decision][..], args].concat();
    env.relay.cli_ok(&all)
}

/// Asks `agent` to run `cmd`, which must wait for a person; declines it.
async fn still_asks(env: &Env, cli: Cli, agent: &str, cmd: &str) {
    let (id, a) = ask_waiting(env, cli, agent, cmd).await;
    decide(env, &a, "decline", &[]);
    completed(env, &id).await;
    let d = env.approval_of(&id);
    assert_eq!(
        (d["decision"].as_str(), d["decided_by"].as_str()),
        (Some("decline"), Some("operator")),
        "{cli:?}: {d}"
    );
    assert!(d["remembered"].is_null(), "{d}");
}

/// `kill -9` of the broker (its agents' CLIs go with it), and a start on the same data;
/// the pid of `agent`'s CLI that was killed, to check it is gone (a CLI may take seconds
/// to exit, which the test need not wait for at once).
async fn kill9_and_restart(env: &mut Env, agent: &str) -> Option<u32> {
    let pid = env.agent(agent).await["endpoint"]["pid"].as_u64();
    env.relay.kill9();
    env.relay.restart().unwrap();
    pid.map(|p| p as u32)
}

/// The CLI `pid` (and everything it started) is gone.
async fn gone(pid: Option<u32>) {
    if let Some(pid) = pid {
        assert!(
            procs::wait_gone(pid, Duration::from_secs(30)).await,
            "the agent {pid} outlived relay"
        );
        procs::wait_group_gone(pid, Duration::from_secs(30)).await;
    }
}

async fn scenario(cli: Cli) {
    let mut env = Cli::env().await;
    cli.add(&env, "a1", &[]);
    cli.add(&env, "a2", &[]);
    let file = env.work.join("remembered.txt");
    // a2 starts its CLI meanwhile (a slow start: Qwen Code took 10 s on a busy machine).
    let warm = env.ask_no_wait("a2", "hello");

    // A person accepts, and remembers it for the agent.
    let (first, a) = ask_waiting(&env, cli, "a1", CMD).await;
    let said = decide(&env, &a, "accept", &["--remember", "agent"]);
    completed(&env, &first).await;
    assert!(file.exists(), "{cli:?}: the accepted command ran");
    let d = env.approval_of(&first);
    assert_eq!(
        (d["decision"].as_str(), d["decided_by"].as_str()),
        (Some("accept"), Some("operator")),
        "{d}"
    );
    let rule_id = d["remembered"].as_str().expect("the rule made").to_string();
    assert!(
        said.contains(&rule_id) && said.contains(CMD) && said.contains("a1"),
        "{said}"
    );
    // The command as it runs (the shell's `-c` unwrapped), for this agent only.
    let rule = env.relay.cli_json(&["rule", "show", &rule_id, "--json"]);
    let expected = json!({
        "id": rule_id, "decision": "accept", "kind": "command", "pattern": CMD,
        "scope": "agent", "agent": "a1", "origin": a["id"], "created_by": "operator",
        "created_at": rule["created_at"], "matched": 0,
    });
    assert_eq!(rule, expected, "{cli:?}");

    // The next identical command runs without asking: the rule decided it.
    std::fs::remove_file(&file).unwrap();
    let second = env.ask_no_wait("a1", &format!("exec: {CMD}"));
    let f = completed(&env, &second).await;
    assert!(file.exists(), "{cli:?}: the remembered command ran: {f}");
    let by_rule = env.approval_of(&second);
    let decider = format!("rule:{rule_id}");
    assert_eq!(
        (
            by_rule["state"].as_str(),
            by_rule["decision"].as_str(),
            by_rule["decided_by"].as_str()
        ),
        (Some("decided"), Some("accept"), Some(decider.as_str())),
        "{cli:?}: {by_rule}"
    );
    assert_eq!(by_rule["detail"], cli.detail(CMD), "{by_rule}");
    let replay = env.relay.cli_ok(&["replay", "flight", &second]);
    let line = format!(
        "approval {} accepted by {decider}",
        by_rule["id"].as_str().unwrap()
    );
    assert!(replay.contains(&line), "{line}\n{replay}");
    let counted = rules(&env);
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert_eq!(counted[0]["matched"], 1, "{counted:?}");
    let last = counted[0]["last_matched_at"].as_u64().unwrap();
    assert!(last >= rule["created_at"].as_u64().unwrap(), "{counted:?}");

    // The same command of another agent is not what the person accepted: it asks, and
    // the rule does not count it.
    completed(&env, &warm).await;
    still_asks(&env, cli, "a2", CMD).await;
    assert_eq!(rules(&env), counted, "{cli:?}");

    // The rule and its counters survive a `kill -9` of the broker.
    let killed = kill9_and_restart(&mut env, "a1").await;
    assert_eq!(rules(&env), counted, "{cli:?}: after kill -9");

    // Nor is a wider command of the agent: it asks, and the rule does not count it.
    still_asks(&env, cli, "a1", WIDER).await;
    assert_eq!(rules(&env), counted, "{cli:?}");
    gone(killed).await;
    let http = env.relay.http();
    let (code, for_a1) = http.get("/v1/rules?agent=a1").await;
    assert_eq!((code, for_a1), (200, json!(counted)));
    let (code, for_a2) = http.get("/v1/rules?agent=a2").await;
    assert_eq!((code, for_a2), (200, json!([])));

    // Removed, it asks again; the removal is an event naming who removed it.
    env.relay.cli_ok(&["rule", "remove", &rule_id]);
    assert_eq!(rules(&env), Vec::<Value>::new());
    let gone = env.relay.cli(&["rule", "show", &rule_id]);
    assert_eq!(gone.status.code(), Some(3), "{gone:?}");
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("unknown_rule"),
        "{gone:?}"
    );
    let removed = env.events_of("rule_removed");
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(
        (&removed[0]["rule"]["id"], &removed[0]["removed_by"]),
        (&json!(rule_id), &json!("operator")),
        "{removed:?}"
    );
    still_asks(&env, cli, "a1", CMD).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_remembers_for_the_agent() {
    scenario(Cli::Codex).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_remembers_for_the_agent() {
    scenario(Cli::Claude).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn qwen_code_remembers_for_the_agent() {
    scenario(Cli::Qwen).await;
}
