//! Agents ask agents through Relay's MCP server, `relay mcp`, which Relay wires into each
//! agent CLI itself (Codex through `-c mcp_servers.relay.*`, Claude Code through
//! `--mcp-config`), acting as that agent with its scoped token. Real pinned CLIs: Codex
//! with its sandbox on (`read-only`, approvals `on-request`: what the Env writes), Claude
//! Code, Pi; one mock model, scripted by the last user text (`mcp:SERVER:TOOL ARGS` calls
//! an MCP tool, then answers `tool said: <its result>`; see `relay_tests::agents::script`).
//!
//! - Codex asks Claude Code, Claude Code asks Pi: the reply comes back as the tool's
//!   result, the child flight hangs under the parent, and no person was asked;
//! - an ask that loops back is refused (`cycle`) and the model reads why as its tool
//!   result, while every flight ends;
//! - a tool of any other MCP server is a Relay approval, from Codex (its elicitation)
//!   and from Claude Code (its permission prompt).
//! - the `send` tool's result says whom the message's mentions asked, which were
//!   skipped and which names are not agents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_mock_model::RecordedRequest;
use relay_tests::agents::{state, Env};
use serde_json::{json, Value};

/// How long a chain of asks may take (each CLI answers in about a second).
const SECS: u64 = 120;

fn ended(f: &Value) -> bool {
    matches!(state(f), "completed" | "failed" | "cancelled")
}

/// The task that makes an agent call Relay's `ask` tool with `agent` and `text`.
fn ask_task(agent: &str, text: &str) -> String {
    format!("mcp:relay:ask {}", json!({ "agent": agent, "text": text }))
}

async fn tree(env: &Env, flight: &str) -> Value {
    let (code, tree) = env
        .relay
        .http()
        .get(&format!("/v1/flights/{flight}/tree"))
        .await;
    assert_eq!(code, 200, "{tree}");
    tree
}

/// The flight `id` once ended, which must be `completed` (else the broker's log shows
/// why).
async fn completed(env: &Env, id: &str) -> Value {
    let f = env.wait_flight(id, SECS, ended).await;
    assert_eq!(
        state(&f),
        "completed",
        "{f}\nlog:\n{}",
        env.relay.log_text()
    );
    f
}

/// The model requests of one API: Codex's (`/responses`) or Claude Code's and Pi's
/// (`/messages`).
fn requests_to(env: &Env, path: &str) -> Vec<RecordedRequest> {
    env.mock
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(path))
        .collect()
}

/// The outputs of the tool calls a request carries back to the model.
fn tool_outputs(req: &RecordedRequest) -> Vec<String> {
    req.function_call_outputs()
        .into_iter()
        .map(|(_, output)| output)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_codex_agent_asks_a_claude_agent_through_the_mcp_ask_tool() {
    let env = Env::start().await;
    env.add_agent("cx", &[]);
    env.add_claude("cl", &[]);

    let id = env.ask_no_wait("cx", &ask_task("cl", "what is six times seven?"));
    let f = completed(&env, &id).await;

    // Claude Code answered in a flight of its own, the child of Codex's.
    let tree = tree(&env, &id).await;
    assert_eq!(tree["flight"]["id"], id.as_str());
    let children = tree["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{tree}");
    let child = &children[0]["flight"];
    assert_eq!(child["agent"], "cl");
    assert_eq!(child["state"], "completed");
    assert_eq!(child["output"], "ok: what is six times seven?");
    assert_eq!(child["parent_flight"], id.as_str(), "{child}");
    // Asked as cx: the child's request message is cx's.
    let conversation = child["conversation"].as_str().unwrap();
    let asked = env.message_with_body(conversation, "what is six times seven?");
    assert_eq!(asked["author"], "cx", "{asked}");

    // Codex's model got that reply as the result of its call, and said so.
    let codex = requests_to(&env, "/responses");
    let outputs = tool_outputs(codex.last().unwrap());
    assert_eq!(outputs.len(), 1, "{outputs:?}");
    assert!(
        outputs[0].contains("ok: what is six times seven?"),
        "{outputs:?}"
    );
    assert!(
        f["output"].as_str().unwrap().starts_with("tool said: ")
            && f["output"]
                .as_str()
                .unwrap()
                .contains("ok: what is six times seven?"),
        "{f}"
    );
    // Relay's own tool ran without asking anyone.
    assert_eq!(env.approvals(), Vec::<Value>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claude_agent_asks_a_pi_agent_through_the_mcp_ask_tool() {
    let env = Env::start().await;
    env.add_claude("cl", &[]);
    env.add_pi("pi", &[]);

    let id = env.ask_no_wait("cl", &ask_task("pi", "name a colour"));
    let f = completed(&env, &id).await;
    // Claude Code's model got Pi's reply as the `mcp__relay__ask` tool result.
    assert_eq!(f["output"], "tool said: ok: name a colour", "{f}");
    let tree = tree(&env, &id).await;
    let child = &tree["children"][0]["flight"];
    assert_eq!(
        (&child["agent"], &child["state"], &child["output"]),
        (
            &json!("pi"),
            &json!("completed"),
            &json!("ok: name a colour")
        ),
        "{tree}"
    );
    // Relay's tool ran without a prompt to a person.
    assert_eq!(env.approvals(), Vec::<Value>::new());
}

/// Codex asks Claude Code, whose model tries to ask Codex back: the broker refuses the
/// cycle, Claude's model reads the refusal as its tool result and answers with it, and
/// both flights end.
#[tokio::test(flavor = "multi_thread")]
async fn an_ask_that_loops_back_gets_the_cycle_error_as_its_tool_result() {
    let env = Env::start().await;
    env.add_agent("cx", &[]);
    env.add_claude("cl", &[]);

    let back = ask_task("cx", "and what do you think?");
    let id = env.ask_no_wait("cx", &ask_task("cl", &back));
    let f = completed(&env, &id).await;
    let tree = tree(&env, &id).await;
    let children = tree["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{tree}");
    assert_eq!(children[0]["children"], json!([]), "no grandchild: {tree}");
    let child = &children[0]["flight"];
    assert_eq!(child["state"], "completed", "{child}");

    // Claude's model got the refusal as the result of its `ask` call.
    let claude = requests_to(&env, "/messages");
    let refusal = tool_outputs(claude.last().unwrap());
    assert_eq!(refusal.len(), 1, "{refusal:?}");
    assert!(
        refusal[0].starts_with("relay refused the ask:") && refusal[0].contains("(cycle)"),
        "{refusal:?}"
    );
    assert_eq!(child["output"], format!("tool said: {}", refusal[0]));
    // And Codex's got Claude's answer, refusal included.
    assert!(f["output"].as_str().unwrap().contains(&refusal[0]), "{f}");
    // Only the one ask of cx ran: the loop made no flight.
    let cx_flights = env.relay.cli_json(&["flights", "--agent", "cx", "--json"]);
    assert_eq!(cx_flights.as_array().unwrap().len(), 1, "{cx_flights}");
}

/// A tool of any MCP server but Relay's asks a person, as a command does: Codex's
/// approval request becomes a Relay approval naming the server, the tool and its
/// arguments; accepted, the tool runs; declined, the model is told.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_to_another_mcp_server_from_codex_is_a_relay_approval() {
    let env = Env::start().await;
    // The other server: `relay mcp` again, under another name, so that only the name
    // tells it from Relay's own.
    let relay = relay_tests::relay_bin().display().to_string();
    let overrides = [
        format!("mcp_servers.other.command={}", json!(relay)),
        r#"mcp_servers.other.args=["mcp"]"#.to_string(),
        r#"mcp_servers.other.env_vars=["RELAY_AGENT","RELAY_URL","RELAY_TOKEN"]"#.to_string(),
    ];
    let mut extra = Vec::new();
    for o in &overrides {
        extra.extend(["--arg", "-c", "--arg", o.as_str()]);
    }
    env.add_agent("cx", &extra);

    for (decision, said) in [("accept", "\"name\": \"cx\""), ("decline", "rejected")] {
        let id = env.ask_no_wait("cx", "mcp:other:list_agents {}");
        let approval = env.wait_approval(&id).await;
        assert_eq!(approval["state"], "pending", "{approval}");
        assert_eq!(approval["kind"], "other", "{approval}");
        assert_eq!(
            approval["detail"], "MCP tool other.list_agents\n{}",
            "{approval}"
        );
        env.relay
            .cli_ok(&["approve", approval["id"].as_str().unwrap(), decision]);
        let f = completed(&env, &id).await;
        let output = f["output"].as_str().unwrap();
        assert!(
            output.starts_with("tool said: ") && output.contains(said),
            "{decision}: {f}"
        );
    }
}

/// Claude Code asks its permission prompt before an MCP tool, like any tool: another
/// server's tool becomes a Relay approval (so the `mcp__relay__*` calls above ran
/// unasked because Relay allowed them, not because Claude Code never asks).
#[tokio::test(flavor = "multi_thread")]
async fn a_call_to_another_mcp_server_from_claude_is_a_relay_approval() {
    let env = Env::start().await;
    let other = json!({"mcpServers": {"other": {
        "type": "stdio",
        "command": relay_tests::relay_bin(),
        "args": ["mcp"],
    }}})
    .to_string();
    env.add_claude("cl", &["--arg", "--mcp-config", "--arg", &other]);

    let id = env.ask_no_wait("cl", "mcp:other:list_agents {}");
    let approval = env.wait_approval(&id).await;
    assert_eq!(
        (&approval["state"], &approval["kind"], &approval["detail"]),
        (
            &json!("pending"),
            &json!("other"),
            &json!("mcp__other__list_agents {}")
        ),
        "{approval}"
    );
    env.relay
        .cli_ok(&["approve", approval["id"].as_str().unwrap(), "accept"]);
    let f = completed(&env, &id).await;
    let output = f["output"].as_str().unwrap();
    assert!(
        output.starts_with("tool said: ") && output.contains("\"name\": \"cl\""),
        "{f}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mcp_send_tool_says_whom_the_mentions_asked_and_which_names_are_not_agents() {
    let env = Env::start().await;
    env.add_claude("cl", &[]);
    env.add_pi("p1", &[]);

    let task = format!(
        "mcp:relay:send {}",
        json!({ "text": "@p1 @cl hello, @ghost" })
    );
    let id = env.ask_no_wait("cl", &task);
    let f = completed(&env, &id).await;
    // p1 was asked, as a child of cl's flight (cl posted from its turn).
    let tree = tree(&env, &id).await;
    let children = tree["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{tree}");
    let child = &children[0]["flight"];
    assert_eq!(child["agent"], "p1");
    let child_id = child["id"].as_str().unwrap();
    // The model read what the post did as the tool's result.
    let out = f["output"].as_str().unwrap();
    for line in [
        format!("asked p1 ({child_id}): relay watch --flight {child_id}"),
        "@cl not asked: it wrote the message".to_string(),
        "@ghost is not an agent (relay agent list)".to_string(),
    ] {
        assert!(out.contains(&line), "{line:?} not in {out}");
    }
    assert!(out.starts_with("tool said: posted msg_"), "{out}");
    completed(&env, child_id).await;
}
