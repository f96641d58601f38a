//! Agents ask agents from their shell, with the token Relay gives their session: real
//! `relay up`, real Pi and Claude Code agents against the mock model, and `relay ask`
//! run by the agent's own bash tool (as a tmux agent or any agent without MCP would).
//!
//! - a Pi agent asks a Claude Code agent and reads the reply as its command's output; the
//!   child flight links to the parent and the tree shows both;
//! - self-ask, a cycle and a chain deeper than the limit are refused, and the asking
//!   agent reads why as its command's output;
//! - an agent's token posts as its agent, and cannot approve, remove an agent or post as
//!   someone else (from the agent's shell, and over HTTP from many clients at once).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_broker::seal::AgentTokens;
use relay_tests::agents::{state, Env};
use reqwest::Method;
use serde_json::{json, Value};

const TURN: u64 = 120;

fn terminal(f: &Value) -> bool {
    matches!(state(f), "completed" | "failed" | "cancelled")
}

/// The flights of `agent`, newest last.
fn flights_of(env: &Env, agent: &str) -> Vec<Value> {
    env.relay
        .cli_json(&["flights", "--agent", agent, "--json"])
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pi_agent_asks_a_claude_agent_from_its_shell() {
    let env = Env::start().await;
    env.add_pi("pi-1", &[]);
    env.add_claude("cl-1", &[]);
    let parent = env.ask_no_wait("pi-1", "exec:relay ask cl-1 what is the answer");
    let f = env.wait_flight(&parent, TURN, terminal).await;
    // Pi's bash ran `relay ask`, which printed Claude's reply: the model read it as the
    // command's output.
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(
        f["output"].as_str().map(str::trim),
        Some("outputs: ok: what is the answer"),
        "{f}"
    );

    let children = flights_of(&env, "cl-1");
    assert_eq!(children.len(), 1, "{children:?}");
    let child = &children[0];
    assert_eq!(child["parent_flight"], parent.as_str(), "{child}");
    assert_eq!(state(child), "completed", "{child}");
    assert_eq!(child["output"], "ok: what is the answer", "{child}");
    let invocation = env
        .relay
        .http()
        .get(&format!("/v1/flights/{}", child["id"].as_str().unwrap()))
        .await
        .1;
    assert_eq!(invocation["agent"], "cl-1");

    // Asked as pi-1: the request message of the child is pi-1's.
    let conversation = child["conversation"].as_str().unwrap();
    let asked = env.message_with_body(conversation, "what is the answer");
    assert_eq!(asked["author"], "pi-1", "{asked}");

    // The tree, from either flight: the parent, the child under it.
    let tree = env
        .relay
        .cli_json(&["flight", child["id"].as_str().unwrap(), "--tree", "--json"]);
    assert_eq!(tree["flight"]["id"], parent.as_str(), "{tree}");
    assert_eq!(tree["children"][0]["flight"]["id"], child["id"], "{tree}");
    assert_eq!(tree["children"][0]["children"], json!([]), "{tree}");
    let text = env.relay.cli_ok(&["flight", &parent, "--tree"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with(&format!("{parent}*")), "{text}");
    assert!(lines[0].contains("pi-1"), "{text}");
    assert!(
        lines[1].starts_with(&format!("└─ {}", child["id"].as_str().unwrap())),
        "{text}"
    );
    assert!(lines[1].contains("cl-1"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_asks_cycles_and_deep_chains_are_refused_and_the_asker_reads_why() {
    let env = Env::start_with(&["--max-depth", "1"]).await;
    for name in ["p1", "p2", "p3"] {
        env.add_pi(name, &[]);
    }

    // Asking yourself.
    let own = env.ask_no_wait("p1", "exec:relay ask p1 hello me");
    let f = env.wait_flight(&own, TURN, terminal).await;
    assert_eq!(state(&f), "completed", "{f}");
    let out = f["output"].as_str().unwrap();
    assert!(out.contains("agent \"p1\" cannot ask itself"), "{f}");

    // A cycle: p1 asks p2, whose turn asks p1 back.
    let cycle = env.ask_no_wait("p1", "exec:relay ask p2 'exec:relay ask p1 back to you'");
    let f = env.wait_flight(&cycle, TURN, terminal).await;
    assert_eq!(state(&f), "completed", "{f}");
    let out = f["output"].as_str().unwrap();
    assert!(
        out.contains("cycle: agent \"p1\" is already working on an ancestor flight"),
        "{f}"
    );

    // Too deep: p1 asks p2 (depth 1, the limit), whose turn asks p3 (depth 2).
    let deep = env.ask_no_wait("p1", "exec:relay ask p2 'exec:relay ask p3 one more'");
    let f = env.wait_flight(&deep, TURN, terminal).await;
    assert_eq!(state(&f), "completed", "{f}");
    let out = f["output"].as_str().unwrap();
    assert!(
        out.contains("invocation depth 2 exceeds the limit of 1"),
        "{f}"
    );

    // Nothing was started for the refused asks: p1 ran its 3 turns, p2 the 2 it was
    // asked, p3 none; every flight ended.
    let p1 = flights_of(&env, "p1");
    let p2 = flights_of(&env, "p2");
    assert_eq!(p1.len(), 3, "{p1:?}");
    assert_eq!(p2.len(), 2, "{p2:?}");
    assert!(flights_of(&env, "p3").is_empty());
    for f in p1.iter().chain(&p2) {
        assert_eq!(state(f), "completed", "{f}");
    }
    for f in &p2 {
        assert!(
            f["parent_flight"] == cycle || f["parent_flight"] == deep,
            "{f}"
        );
    }
    // The tree of the deep chain stops at p2.
    let tree = env.relay.cli_json(&["flight", &deep, "--tree", "--json"]);
    assert_eq!(tree["children"].as_array().unwrap().len(), 1, "{tree}");
    assert_eq!(tree["children"][0]["children"], json!([]), "{tree}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_token_acts_as_its_agent_only() {
    let env = Env::start().await;
    env.add_pi("pi-1", &[]);
    env.add_claude("cl-1", &[]);
    // A pending approval of another agent, for pi-1 to try to decide.
    let waiting = env.ask_no_wait("cl-1", "exec:touch approved-by-pi");
    env.wait_flight(&waiting, TURN, |f| state(f) == "waiting")
        .await;
    let approval = env.approval_of(&waiting);
    let approval_id = approval["id"].as_str().unwrap();

    // One turn of pi-1 runs each refused command, then posts as itself.
    let commands = format!(
        "relay approve {approval_id} accept; relay agent remove cl-1; relay send --as cl-1 forged; relay send said by pi"
    );
    let turn = env.ask_no_wait("pi-1", &format!("exec:{commands}"));
    let f = env.wait_flight(&turn, TURN, terminal).await;
    assert_eq!(state(&f), "completed", "{f}");
    let out = f["output"].as_str().unwrap();
    for refusal in [
        "agent \"pi-1\"'s token cannot POST /v1/approvals/{id}",
        "agent \"pi-1\"'s token cannot DELETE /v1/agents/{name}",
        "agent \"pi-1\"'s token acts as \"pi-1\" only, not as \"cl-1\"",
    ] {
        assert!(out.contains(refusal), "{refusal:?} not in {out}");
    }

    // Nothing happened: the approval waits, cl-1 is registered, nothing was forged.
    assert_eq!(env.approval_of(&waiting)["state"], "pending");
    assert_eq!(env.agent("cl-1").await["name"], "cl-1");
    let shared = env.relay.cli_json(&["read", "-n", "100", "--json"]);
    let shared = shared.as_array().unwrap();
    assert!(!shared.iter().any(|m| m["body"] == "forged"), "{shared:?}");
    // What pi-1 sent is its own, marked with the flight it ran it from.
    let said = shared
        .iter()
        .find(|m| m["body"] == "said by pi")
        .unwrap_or_else(|| panic!("no message from pi-1: {shared:?}"));
    assert_eq!(said["author"], "pi-1", "{said}");
    assert_eq!(said["meta"]["flight"], turn.as_str(), "{said}");

    env.relay
        .cli_ok(&["approve", approval_id, "decline", "--as", "test"]);
    env.wait_flight(&waiting, TURN, terminal).await;
}

/// Over HTTP, many clients at once with agent tokens and the operator's: each request
/// is let through or refused by whose token it carries, never mixed up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_tokens_hold_under_many_clients_at_once() {
    let env = Env::start().await;
    // Two agents that never run a turn (a program that is not there is never started:
    // nothing here asks them anything).
    for name in ["a1", "a2"] {
        env.relay.cli_ok(&[
            "agent",
            "add",
            name,
            "--harness",
            "pi_rpc",
            "--cwd",
            env.work.to_str().unwrap(),
        ]);
    }
    let tokens = AgentTokens::new(env.relay.api.token.as_bytes());
    let http = env.relay.http();
    let mut tasks = Vec::new();
    for i in 0..48 {
        let agent = if i % 2 == 0 { "a1" } else { "a2" };
        let other = if i % 2 == 0 { "a2" } else { "a1" };
        let http = http.clone().with_token(Some(&tokens.token(agent)));
        let (agent, other) = (agent.to_string(), other.to_string());
        tasks.push(tokio::spawn(async move {
            let post = |author: &str, body: String| {
                serde_json::to_vec(&json!({
                    "conversation": "channel.shared",
                    "author": author,
                    "body": body,
                }))
                .unwrap()
            };
            let own = http
                .request(
                    Method::POST,
                    "/v1/messages",
                    Some(post(&agent, format!("{agent} {i}"))),
                )
                .await;
            let forged = http
                .request(
                    Method::POST,
                    "/v1/messages",
                    Some(post(&other, format!("forged {i}"))),
                )
                .await;
            let removed = http
                .request(Method::DELETE, &format!("/v1/agents/{other}"), None)
                .await;
            let read = http.request(Method::GET, "/v1/agents", None).await;
            (i, agent, own, forged, removed, read)
        }));
    }
    for task in tasks {
        let (i, agent, own, forged, removed, read) = task.await.unwrap();
        assert_eq!(own.0, 200, "{i}: {}", own.1);
        assert_eq!(own.1["message"]["author"], agent.as_str(), "{i}");
        assert_eq!(forged.0, 401, "{i}: {}", forged.1);
        assert_eq!(forged.1["error"]["code"], "unauthorized", "{i}");
        assert_eq!(removed.0, 401, "{i}: {}", removed.1);
        assert_eq!(read.0, 200, "{i}: {}", read.1);
    }
    // Exactly the 48 own messages, none forged; both agents still there.
    let shared = env.relay.cli_json(&["read", "-n", "500", "--json"]);
    let bodies: Vec<&str> = shared
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["body"].as_str())
        .collect();
    assert_eq!(bodies.iter().filter(|b| b.starts_with('a')).count(), 48);
    assert!(
        !bodies.iter().any(|b| b.starts_with("forged")),
        "{bodies:?}"
    );
    assert_eq!(env.agent("a1").await["name"], "a1");
    assert_eq!(env.agent("a2").await["name"], "a2");

    // A token of another broker, a forged one, and one of a removed agent are refused.
    let stranger = AgentTokens::new(b"another broker's token").token("a1");
    let (code, body) = http
        .clone()
        .with_token(Some(&stranger))
        .request(Method::GET, "/v1/agents", None)
        .await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (401, &json!("unauthorized"))
    );
    env.relay.cli_ok(&["agent", "remove", "a2"]);
    let (code, body) = http
        .clone()
        .with_token(Some(&tokens.token("a2")))
        .request(Method::GET, "/v1/agents", None)
        .await;
    assert_eq!(code, 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no such agent is registered"),
        "{body}"
    );
}
