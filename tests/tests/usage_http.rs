//! Usage and budgets through the real `relay` binary over HTTP, with agents' tokens:
//! `GET /v1/usage` adds up only the flights an agent runs or asked for (as its flight
//! list shows them), `GET /v1/agents/{name}/budget` reads its own agent only, and
//! `agent.set` is the operator's. The agents are `relay-fake-acp` (each turn reports
//! 12 input and 3 output tokens), so the test takes seconds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_broker::seal::AgentTokens;
use relay_tests::agents::{state, Env};
use relay_tests::Http;
use serde_json::{json, Value};

const FAKE: &str = env!("CARGO_BIN_EXE_relay-fake-acp");

fn as_agent(env: &Env, agent: &str) -> Http {
    let token = AgentTokens::new(env.relay.api.token.as_bytes()).token(agent);
    env.relay.http().with_token(Some(&token))
}

/// Waits until flight `id` completed with its usage recorded.
async fn used(env: &Env, id: &str) {
    env.wait_flight(id, 60, |f| {
        state(f) == "completed" && f["usage"]["input_tokens"] == 12
    })
    .await;
}

/// A report's row as (key, flights, tokens).
type Row = (String, u64, u64);

/// The report's rows, and its total's (flights, tokens).
fn rows(report: &Value) -> (Vec<Row>, (u64, u64)) {
    let rows = report["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no rows: {report}"))
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_string(),
                r["flights"].as_u64().unwrap(),
                r["tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    let t = &report["total"];
    (
        rows,
        (
            t["flights"].as_u64().unwrap(),
            t["tokens"].as_u64().unwrap(),
        ),
    )
}

fn row(key: &str) -> Row {
    (key.to_string(), 1, 15)
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_and_budgets_over_http_are_scoped_to_an_agents_own_flights() {
    let env = Env::start().await;
    for name in ["fa", "fb", "fc"] {
        env.add_acp(name, FAKE);
    }
    let http = env.relay.http();
    let (fa, fb, fc) = (
        as_agent(&env, "fa"),
        as_agent(&env, "fb"),
        as_agent(&env, "fc"),
    );

    // fa's own flight, a flight of fb that fa asked for, and fc's flight. fa asks once its
    // own flight has ended: asked while it runs, the ask would be linked to it, and the
    // fake agent may end it before that ask is committed (then refused: the flight it
    // named has ended).
    let own = env.ask_no_wait("fa", "hello");
    used(&env, &own).await;
    let (code, asked) = fa
        .post(
            "/v1/invocations",
            &json!({"target": "fb", "task": "hi", "requester": "fa"}),
        )
        .await;
    assert_eq!(code, 200, "{asked}");
    let asked = asked["flight"]["id"].as_str().unwrap().to_string();
    let other = env.ask_no_wait("fc", "hey");
    for id in [&own, &asked, &other] {
        used(&env, id).await;
    }

    // The operator adds up every flight; fa the two it runs or asked for; fb the one it
    // runs; fc its own.
    let (code, all) = http.get("/v1/usage?by=agent").await;
    assert_eq!(code, 200, "{all}");
    assert_eq!(rows(&all), (vec![row("fa"), row("fb"), row("fc")], (3, 45)));
    let (code, mine) = fa.get("/v1/usage?by=agent").await;
    assert_eq!(code, 200, "{mine}");
    assert_eq!(rows(&mine), (vec![row("fa"), row("fb")], (2, 30)));
    let (_, mine) = fb.get("/v1/usage?by=agent").await;
    assert_eq!(rows(&mine), (vec![row("fb")], (1, 15)));
    let (_, mine) = fc.get("/v1/usage?by=tree").await;
    assert_eq!(rows(&mine), (vec![row(&other)], (1, 15)));
    // Asking for another agent's flights by name shows nothing of them.
    let (code, none) = fc.get("/v1/usage?agent=fa").await;
    assert_eq!(code, 200, "{none}");
    assert_eq!(rows(&none), (vec![], (0, 0)));

    // An agent reads its own budget and what it used today; not another's.
    let (code, status) = fa.get("/v1/agents/fa/budget").await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["agent"], "fa");
    assert_eq!(status["today"]["tokens"], 15, "{status}");
    let (code, body) = fa.get("/v1/agents/fc/budget").await;
    assert!(code == 401 || code == 403, "{code} {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("\"fa\"") && message.contains("\"fc\""),
        "{message}"
    );
    let (code, status) = http.get("/v1/agents/fc/budget").await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["today"]["tokens"], 15, "{status}");
    let (code, body) = http.get("/v1/agents/ghost/budget").await;
    assert_eq!(code, 404, "{body}");

    // Only the operator sets a budget: an agent's token cannot lift its own.
    let budget = json!({"budget": {"tokens_per_day": 10, "on_exceed": "finish"}});
    let (code, body) = fa.post("/v1/agents/fa", &budget).await;
    assert!(code == 401 || code == 403, "{code} {body}");
    assert!(env.agent("fa").await["budget"].is_null());
    let (code, body) = http.post("/v1/agents/fa", &budget).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["budget"]["tokens_per_day"], 10, "{body}");
    let (_, status) = fa.get("/v1/agents/fa/budget").await;
    assert_eq!(status["budget"]["tokens_per_day"], 10, "{status}");

    // fa is past it (15 of 10 tokens today): its next ask is refused, saying so.
    let (code, body) = http
        .post("/v1/invocations", &json!({"target": "fa", "task": "again"}))
        .await;
    assert_eq!(code, 429, "{body}");
    assert_eq!(body["error"]["code"], "budget_exceeded", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    for part in [
        "15 tokens",
        "10 tokens/day",
        "00:00 UTC",
        "relay agent set fa",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
}
