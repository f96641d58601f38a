//! Agents ask agents through Relay's MCP server, `relay mcp`, which Relay wires into each
//! agent CLI itself (Codex through `-c mcp_servers.relay.*`, Claude Code through
//! `--mcp-config`), acting as that agent with its scoped token. Real pinned CLIs: Codex
//! with its sandbox on (`read-only`, approvals `on-request`: what the Env writes), Claude
//! Code, Pi; one mock model, scripted by the last user text (`mcp:SERVER:TOOL ARGS` calls
//! an MCP tool, then answers `tool said: <its result>`; see `relay_tests::agents::script`).
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
    let approvals = env
        .relay
        .cli_json(&["approvals", "--state", "all", "--json"]);
    assert_eq!(approvals, json!([]));
}
