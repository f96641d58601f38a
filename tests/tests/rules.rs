//! Remembered decisions through the real `relay` binary, over every surface a request
//! reaches: HTTP `approval.decide` with `remember` and `rule.list`/`show`/`remove` with
//! the operator's token, an agent's token (scoped to the rules that apply to it, never
//! removing one) and a dashboard login (recorded as `NAME@dashboard`); NATS
//! `relay.v1.cmd.approve` with `remember`, `relay.v1.cmd.rules` and
//! `relay.v1.cmd.rule_remove` on a trusted bus (recorded as `NAME@nats`) and refused on an
//! open one. The agent is `relay-fake-acp` (its `ask` prompt asks for `rm -rf /tmp/x` at
//! once, and says which option it got), so each test takes seconds; a real nats-server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_broker::seal::AgentTokens;
use relay_tests::agents::{state, Env};
use relay_tests::nats::{json_request as request, NatsServer};
use relay_tests::Http;
use serde_json::{json, Value};

const FAKE: &str = env!("CARGO_BIN_EXE_relay-fake-acp");

fn agent_token(env: &Env, agent: &str) -> String {
    AgentTokens::new(env.relay.api.token.as_bytes()).token(agent)
}

/// A flight of `agent` asking `prompt` (`ask`, `ask:COMMAND`), waiting on its approval,
/// and the approval's id.
async fn asking(env: &Env, agent: &str, prompt: &str) -> (String, String) {
    let id = env.ask_no_wait(agent, prompt);
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let approval = env.wait_approval(&id).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    (id, approval)
}

/// Waits for flight `id` to complete; the option the fake agent was answered with.
async fn chosen(env: &Env, id: &str) -> String {
    let f = env.wait_flight(id, 60, |f| state(f) == "completed").await;
    let output = f["output"].as_str().unwrap_or_default();
    let chose = output.split("chose ").nth(1).unwrap_or_default();
    chose.split(';').next().unwrap_or_default().to_string()
}

async fn delete(http: &Http, path: &str) -> (u16, Value) {
    http.request(reqwest::Method::DELETE, path, None).await
}

fn ids(rules: &Value) -> Vec<String> {
    rules
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {rules}"))
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

/// The `rule_removed` events of the log, as (rule id, removed_by).
fn removals(env: &Env) -> Vec<(String, String)> {
    env.events_of("rule_removed")
        .iter()
        .map(|e| {
            let body = if e["rule"].is_null() { &e["body"] } else { e };
            (
                body["rule"]["id"].as_str().unwrap_or_default().to_string(),
                body["removed_by"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_over_http_for_the_operator_an_agents_token_and_a_dashboard_login() {
    let env = Env::start().await;
    env.add_acp("fk", FAKE);
    env.add_acp("fk2", FAKE);
    let http = env.relay.http();

    // A command not in canonical form cannot be remembered: refused, still pending.
    let (f0, a0) = asking(&env, "fk", "ask:rm  -rf /tmp/x").await;
    let remember_agent = json!({"decision": "accept", "decided_by": "operator",
        "remember": {"scope": "agent"}});
    let (code, body) = http
        .post(&format!("/v1/approvals/{a0}"), &remember_agent)
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("canonical form"), "{message}");
    assert_eq!(env.approval_of(&f0)["state"], "pending");
    // An agent's token decides nothing, remembered or not.
    let fk_http = http.clone().with_token(Some(&agent_token(&env, "fk")));
    let (code, body) = fk_http
        .post(&format!("/v1/approvals/{a0}"), &remember_agent)
        .await;
    assert!(code == 401 || code == 403, "{code} {body}");
    assert_eq!(env.approval_of(&f0)["state"], "pending");
    let (code, body) = http
        .post(
            &format!("/v1/approvals/{a0}"),
            &json!({"decision": "decline"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(chosen(&env, &f0).await, "cancel");

    // Accepted and remembered for agent fk: the harness gets a plain allow once.
    let (f1, a1) = asking(&env, "fk", "ask").await;
    let (code, body) = http
        .post(&format!("/v1/approvals/{a1}"), &remember_agent)
        .await;
    assert_eq!(code, 200, "{body}");
    let rule = body["remembered"].as_str().unwrap().to_string();
    assert!(rule.starts_with("rul_"), "{body}");
    assert_eq!(chosen(&env, &f1).await, "proceed_once");

    // The same command again is decided by the rule, never "always" for the harness.
    let f2 = env.ask_no_wait("fk", "ask");
    assert_eq!(chosen(&env, &f2).await, "proceed_once");
    assert_eq!(
        env.approval_of(&f2)["decided_by"],
        format!("rule:{rule}").as_str()
    );

    // The operator lists and shows it, counted once.
    let (code, all) = http.get("/v1/rules").await;
    assert_eq!(code, 200, "{all}");
    assert_eq!(ids(&all), vec![rule.clone()]);
    let (code, shown) = http.get(&format!("/v1/rules/{rule}")).await;
    assert_eq!(code, 200, "{shown}");
    assert_eq!(shown["matched"], 1, "{shown}");
    assert_eq!(shown["pattern"], "rm -rf /tmp/x", "{shown}");
    assert_eq!(shown["agent"], "fk", "{shown}");
    assert_eq!(shown["origin"], a1.as_str(), "{shown}");
    let (code, missing) = http.get("/v1/rules/rul_nothing").await;
    assert_eq!(code, 404, "{missing}");
    assert_eq!(missing["error"]["code"], "unknown_rule", "{missing}");

    // fk's token sees it; fk2's does not (scope agent fk), nor may it ask for fk's.
    let fk2_http = http.clone().with_token(Some(&agent_token(&env, "fk2")));
    let (code, mine) = fk_http.get("/v1/rules").await;
    assert_eq!(code, 200, "{mine}");
    assert_eq!(ids(&mine), vec![rule.clone()]);
    let (code, theirs) = fk2_http.get("/v1/rules").await;
    assert_eq!(code, 200, "{theirs}");
    assert!(ids(&theirs).is_empty(), "{theirs}");
    let (code, body) = fk2_http.get("/v1/rules?agent=fk").await;
    assert!(code == 401 || code == 403, "{code} {body}");
    let (code, body) = fk2_http.get(&format!("/v1/rules/{rule}")).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_rule", "{body}");
    // The operator's filter by agent: fk's rules apply to fk only.
    let (_, for_fk2) = http.get("/v1/rules?agent=fk2").await;
    assert!(ids(&for_fk2).is_empty(), "{for_fk2}");
    let (code, body) = http.get("/v1/rules?agent=nobody").await;
    assert_eq!(code, 404, "{body}");

    // No agent's token removes a rule, not even the one that applies to it.
    for token in [&fk_http, &fk2_http] {
        let (code, body) = delete(token, &format!("/v1/rules/{rule}")).await;
        assert!(code == 401 || code == 403, "{code} {body}");
    }
    let (code, _) = http.get(&format!("/v1/rules/{rule}")).await;
    assert_eq!(code, 200);

    // A dashboard login removes it, recorded as the login's.
    let cookie = relay_tests::browser::login_cookie(&env.relay, "alice").await;
    let resp = reqwest::Client::new()
        .delete(format!("{}/v1/rules/{rule}", http.url))
        .header(reqwest::header::COOKIE, &cookie)
        .header("x-relay-dashboard", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "{:?}", resp.text().await);
    assert_eq!(
        removals(&env),
        vec![(rule.clone(), "alice@dashboard".to_string())]
    );
    let (code, body) = delete(&http, &format!("/v1/rules/{rule}")).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_rule", "{body}");

    // Gone: the same command asks a person again.
    let (f3, a3) = asking(&env, "fk", "ask").await;
    assert_eq!(env.approval_of(&f3)["state"], "pending");
    let (code, _) = http
        .post(
            &format!("/v1/approvals/{a3}"),
            &json!({"decision": "decline"}),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(chosen(&env, &f3).await, "cancel");
}

#[tokio::test(flavor = "multi_thread")]
async fn on_an_open_bus_rules_are_read_never_made_or_removed() {
    let nats = NatsServer::start().unwrap();
    let url = nats.url();
    let env = Env::start_with(&["--nats", url.as_str()]).await;
    env.add_acp("fk", FAKE);
    let client = async_nats::connect(nats.url()).await.unwrap();
    let http = env.relay.http();

    // A stranger on the open bus cannot remember a decision.
    let (f1, a1) = asking(&env, "fk", "ask").await;
    let answer = request(
        &client,
        "relay.v1.cmd.approve",
        None,
        json!({"approval": a1, "decision": "accept", "decided_by": "alice",
            "remember": {"scope": "everywhere"}}),
    )
    .await;
    assert_eq!(answer["error"]["code"], "unauthorized", "{answer}");
    assert_eq!(env.approval_of(&f1)["state"], "pending");
    let (code, body) = http
        .post(
            &format!("/v1/approvals/{a1}"),
            &json!({"decision": "accept", "remember": {"scope": "everywhere"}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let rule = body["remembered"].as_str().unwrap().to_string();
    assert_eq!(chosen(&env, &f1).await, "proceed_once");

    // It may read the rules, but not remove one.
    let listed = request(&client, "relay.v1.cmd.rules", None, json!({})).await;
    assert_eq!(ids(&listed), vec![rule.clone()]);
    let answer = request(
        &client,
        "relay.v1.cmd.rule_remove",
        None,
        json!({"rule": rule, "removed_by": "alice"}),
    )
    .await;
    assert_eq!(answer["error"]["code"], "unauthorized", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--nats-request-token-file"), "{message}");
    let (code, _) = http.get(&format!("/v1/rules/{rule}")).await;
    assert_eq!(code, 200);
    assert!(removals(&env).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trusted_bus_remembers_lists_and_removes_rules_as_its_own() {
    let nats = NatsServer::start().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("request-token");
    std::fs::write(&token_file, "req-s3cret").unwrap();
    let url = nats.url();
    let env = Env::start_with(&[
        "--nats",
        url.as_str(),
        "--nats-request-token-file",
        token_file.to_str().unwrap(),
    ])
    .await;
    env.add_acp("fk", FAKE);
    env.add_acp("fk2", FAKE);
    let client = async_nats::connect(nats.url()).await.unwrap();
    let token = Some("req-s3cret");

    // A command not in canonical form: refused, the approval still pending.
    let (f0, a0) = asking(&env, "fk", "ask:rm  -rf /tmp/x").await;
    let answer = request(
        &client,
        "relay.v1.cmd.approve",
        token,
        json!({"approval": a0, "decision": "accept", "decided_by": "alice",
            "remember": {"scope": "session"}}),
    )
    .await;
    assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
    assert_eq!(env.approval_of(&f0)["state"], "pending");
    let answer = request(
        &client,
        "relay.v1.cmd.approve",
        token,
        json!({"approval": a0, "decision": "decline", "decided_by": "alice"}),
    )
    .await;
    assert_eq!(answer["approval"]["decided_by"], "alice@nats", "{answer}");
    assert_eq!(chosen(&env, &f0).await, "cancel");

    // Remembered for fk's session, as the bus's decision.
    let (f1, a1) = asking(&env, "fk", "ask").await;
    let answer = request(
        &client,
        "relay.v1.cmd.approve",
        token,
        json!({"approval": a1, "decision": "accept", "decided_by": "alice",
            "remember": {"scope": "session"}}),
    )
    .await;
    assert_eq!(answer["approval"]["decided_by"], "alice@nats", "{answer}");
    let rule = answer["approval"]["remembered"]
        .as_str()
        .unwrap_or_else(|| panic!("not remembered: {answer}"))
        .to_string();
    assert_eq!(chosen(&env, &f1).await, "proceed_once");
    let f2 = env.ask_no_wait("fk", "ask");
    assert_eq!(chosen(&env, &f2).await, "proceed_once");
    assert_eq!(
        env.approval_of(&f2)["decided_by"],
        format!("rule:{rule}").as_str()
    );

    // Listed for fk (its session), counted once; not for fk2.
    let listed = request(&client, "relay.v1.cmd.rules", token, json!({"agent": "fk"})).await;
    assert_eq!(ids(&listed), vec![rule.clone()]);
    assert_eq!(listed[0]["matched"], 1, "{listed}");
    assert_eq!(listed[0]["scope"], "session", "{listed}");
    assert_eq!(listed[0]["created_by"], "alice@nats", "{listed}");
    let listed = request(
        &client,
        "relay.v1.cmd.rules",
        token,
        json!({"agent": "fk2"}),
    )
    .await;
    assert!(ids(&listed).is_empty(), "{listed}");

    // Removed by the bus, under its own name; a second removal finds nothing; no one
    // removes as Relay's own identities.
    let answer = request(
        &client,
        "relay.v1.cmd.rule_remove",
        token,
        json!({"rule": rule, "removed_by": format!("rule:{rule}")}),
    )
    .await;
    assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
    let answer = request(
        &client,
        "relay.v1.cmd.rule_remove",
        token,
        json!({"rule": rule, "removed_by": "alice"}),
    )
    .await;
    assert_eq!(answer["rule"]["id"], rule.as_str(), "{answer}");
    assert_eq!(
        removals(&env),
        vec![(rule.clone(), "alice@nats".to_string())]
    );
    let answer = request(
        &client,
        "relay.v1.cmd.rule_remove",
        token,
        json!({"rule": rule, "removed_by": "alice"}),
    )
    .await;
    assert_eq!(answer["error"]["code"], "unknown_rule", "{answer}");

    // Gone: fk asks a person again.
    let (f3, a3) = asking(&env, "fk", "ask").await;
    assert_eq!(env.approval_of(&f3)["state"], "pending");
    let answer = request(
        &client,
        "relay.v1.cmd.approve",
        token,
        json!({"approval": a3, "decision": "decline", "decided_by": "alice"}),
    )
    .await;
    assert_eq!(answer["approval"]["state"], "decided", "{answer}");
    assert_eq!(chosen(&env, &f3).await, "cancel");
}
