//! Who may ask whom, and what one turn may cost, end to end: real `relay up`, a real
//! Codex agent (sandboxed, approvals on request) against the mock model, a shell pane on
//! this test's own tmux server.
//!
//! - a shell pane (a tmux agent with no `--command`) is registered only with
//!   `allow_from`; a Codex agent that it does not name cannot make it run anything: not
//!   through Relay's MCP `ask` tool (which Codex answers without a person), not over
//!   HTTP with its token from many clients at once; the operator can;
//! - a flight streaming past `relay up --max-flight-output` fails naming the cap, keeps
//!   what it streamed before, and its turn is interrupted (the agent takes its next ask);
//! - a turn reaching its agent's budget (`on_exceed: interrupt`) is cancelled with
//!   `budget_exceeded` and interrupted, the next ask is refused until the budget is
//!   raised, and `GET /v1/usage` (and `relay.v1.cmd.usage`) adds up the flights' last
//!   totals; a bad price file stops
//!   `relay up` naming its line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_broker::seal::AgentTokens;
use relay_tests::agents::{state, Env};
use relay_tests::wait_until;
use reqwest::Method;
use serde_json::{json, Value};

/// A deadline against a hang (each CLI answers in about a second), not a measure.
const SECS: u64 = 120;

fn ended(f: &Value) -> bool {
    matches!(state(f), "completed" | "failed" | "cancelled")
}

/// The flights of `agent`.
fn flights_of(env: &Env, agent: &str) -> Vec<Value> {
    env.relay
        .cli_json(&["flights", "--agent", agent, "--json"])
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_codex_agent_cannot_make_a_shell_pane_run_commands_unless_its_allow_list_names_it() {
    let env = Env::start().await;
    env.add_agent("cx", &[]);
    let marker = env.work.join("pwned");
    let pane = |allow: Value| {
        json!({
            "name": "sh", "harness": "tmux", "cwd": env.work.display().to_string(),
            "pane": {"shell": true, "socket": env.tmux.socket()}, "allow_from": allow,
        })
    };
    let http = env.relay.http();
    // No allow list: refused, naming the flag (over HTTP and by the CLI).
    let (code, body) = http.post("/v1/agents", &pane(json!([]))).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--allow-from"),
        "{body}"
    );
    let work = env.work.display().to_string();
    let out = env.relay.cli(&[
        "agent",
        "add",
        "sh",
        "--harness",
        "tmux",
        "--shell",
        "--socket",
        env.tmux.socket(),
        "--cwd",
        &work,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-from"));
    let (code, body) = http.post("/v1/agents", &pane(json!(["operator"]))).await;
    assert_eq!(code, 200, "{body}");
    let shown = env.relay.cli_ok(&["agent", "show", "sh"]);
    assert!(shown.contains("allow     operator"), "{shown}");

    // Codex calls Relay's `ask` tool (no person is asked for that): refused, and the
    // model reads why.
    let ask = format!(
        "mcp:relay:ask {}",
        json!({"agent": "sh", "text": format!("touch {}", marker.display())})
    );
    let id = env.ask_no_wait("cx", &ask);
    let f = env.wait_flight(&id, SECS, ended).await;
    assert_eq!(state(&f), "completed", "{f}");
    let output = f["output"].as_str().unwrap();
    assert!(
        output.starts_with("tool said: ")
            && output.contains(
                "relay refused the ask: unauthorized: \"cx\" may not invoke agent \"sh\""
            )
            && output.contains("(unauthorized)"),
        "{output}"
    );

    // Nor with its token over HTTP, from many clients at once.
    let token = AgentTokens::new(env.relay.api.token.as_bytes()).token("cx");
    let body = serde_json::to_vec(&json!({
        "target": "sh", "requester": "cx", "task": format!("touch {}", marker.display()),
    }))
    .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let http = http.clone().with_token(Some(&token));
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            http.request(Method::POST, "/v1/invocations", Some(body))
                .await
        }));
    }
    for t in tasks {
        let (code, body) = t.await.unwrap();
        assert_eq!(
            (code, &body["error"]["code"]),
            (401, &json!("unauthorized")),
            "{body}"
        );
    }
    assert!(flights_of(&env, "sh").is_empty(), "no flight of the shell");
    assert!(!marker.exists());

    // The operator can: the pane runs the task.
    let mine = env.work.join("operator-was-here");
    env.ask_no_wait("sh", &format!("touch {}", mine.display()));
    wait_until(
        "the shell to run the operator's task",
        std::time::Duration::from_secs(SECS),
        || async { mine.exists().then_some(()) },
    )
    .await;
    assert!(!marker.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flight_past_the_output_cap_fails_naming_it_and_its_turn_is_interrupted() {
    let env = Env::start_with(&["--max-flight-output", "2000"]).await;
    env.add_agent("cx", &[]);
    // 1,000 words of 100 bytes, 250 ms apart: the cap is reached within the first 20,
    // and the turn would stream for minutes more if nothing stopped it.
    let words: Vec<String> = (0..1000)
        .map(|i| format!("{i:04}{} ", "w".repeat(95)))
        .collect();
    let id = env.ask_no_wait("cx", &format!("slow: {}", words.concat()));
    let f = env.wait_flight(&id, SECS, ended).await;
    assert_eq!(state(&f), "failed", "{f}");
    let error = f["error"].as_str().unwrap();
    assert!(
        error.contains("cap of 2000 bytes") && error.contains("--max-flight-output"),
        "{error}"
    );
    // What it streamed before the cap is kept, in order.
    let updates = env.updates(&id).await;
    let streamed: String = updates
        .iter()
        .filter(|u| u["kind"] == "delta")
        .map(|u| u["text"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !streamed.is_empty() && streamed.len() <= 2000,
        "{streamed}: {updates:?}"
    );
    assert!(words.concat().starts_with(&streamed), "{streamed}");
    // The turn was interrupted: the agent answers its next ask.
    let next = env.ask_no_wait("cx", "hello");
    let f = env.wait_flight(&next, SECS, ended).await;
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(f["output"], "ok: hello", "{f}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_reaching_an_interrupting_budget_is_interrupted_and_the_next_flight_waits_for_a_raise(
) {
    let nats = relay_tests::nats::NatsServer::start().unwrap();
    let env = Env::start_with(&["--nats", &nats.url()]).await;
    env.add_agent("cx", &[]);
    let http = env.relay.http();
    // One token a day: the turn's first usage report reaches it.
    let (code, body) = http
        .post(
            "/v1/agents/cx",
            &json!({"budget": {"tokens_per_day": 1, "on_exceed": "interrupt"}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["budget"]["tokens_per_day"], 1, "{body}");
    // A turn of two model answers around a command. Codex reports an answer's usage
    // only once the tools it called are done: here after the approval and the command.
    let id = env.ask_no_wait("cx", "exec: echo spent");
    let approval = env.wait_approval(&id).await;
    let (code, body) = http
        .post(
            &format!("/v1/approvals/{}", approval["id"].as_str().unwrap()),
            &json!({"decision": "accept"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let f = env.wait_flight(&id, SECS, ended).await;
    assert_eq!(state(&f), "cancelled", "{f}");
    let error = f["error"].as_str().unwrap();
    assert!(
        error.starts_with("budget_exceeded: agent \"cx\" used ")
            && error.contains("its budget is 1 tokens/day"),
        "{error}"
    );
    let used = f["usage"]["input_tokens"].as_u64().unwrap()
        + f["usage"]["output_tokens"].as_u64().unwrap();
    assert!(used >= 1, "{f}");
    // The next flight is refused, saying when the budget resets and how to raise it.
    let (code, body) = http
        .post("/v1/invocations", &json!({"target": "cx", "task": "hello"}))
        .await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["error"]["code"], "budget_exceeded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("00:00 UTC") && message.contains("relay agent set cx --budget"),
        "{message}"
    );
    let (code, status) = http.get("/v1/agents/cx/budget").await;
    assert_eq!(code, 200, "{status}");
    assert!(
        status["today"]["tokens"].as_u64().unwrap() >= used,
        "{status}"
    );
    // Removed: the agent takes its next ask, so its interrupted turn is over.
    let (code, body) = http.post("/v1/agents/cx", &json!({"budget": {}})).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.get("budget").is_none(), "{body}");
    let next = env.ask_no_wait("cx", "hello");
    let f = env.wait_flight(&next, SECS, ended).await;
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(f["output"], "ok: hello", "{f}");
    // The usage report adds both flights' last totals.
    let (code, report) = http.get("/v1/usage?by=agent").await;
    assert_eq!(code, 200, "{report}");
    let mut want = 0;
    for flight in [&id, &next] {
        let f = env.flight(flight).await;
        want += f["usage"]["input_tokens"].as_u64().unwrap_or(0)
            + f["usage"]["output_tokens"].as_u64().unwrap_or(0);
    }
    assert_eq!(report["rows"][0]["key"], "cx", "{report}");
    assert_eq!(report["rows"][0]["tokens"].as_u64(), Some(want), "{report}");
    // The same over NATS (JSON only).
    let client = async_nats::connect(nats.url()).await.unwrap();
    let reply = client
        .request(
            "relay.v1.cmd.usage",
            json!({"by": "agent"}).to_string().into(),
        )
        .await
        .unwrap();
    let headers = reply.headers.clone().unwrap();
    assert_eq!(
        headers.get("Relay-Type").unwrap().as_str(),
        "relay.v1.UsageReport+json"
    );
    let over_nats: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(over_nats, report);
}

#[test]
fn a_bad_price_file_stops_relay_up_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let prices = dir.path().join("prices.json");
    std::fs::write(
        &prices,
        "{\"models\": {\n  \"m\": {\"input\": -1, \"output\": 1}}}",
    )
    .unwrap();
    let out = std::process::Command::new(relay_tests::relay_bin())
        .args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--prices")
        .arg(&prices)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prices.json") && err.contains("line 2") && err.contains("negative"),
        "{err}"
    );
}
