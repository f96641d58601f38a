//! Who did what, over HTTP against the real `relay` and the real pinned Codex on the mock
//! model: a dashboard login's actions are recorded as `NAME@dashboard` whatever the body
//! says (an ask's requester, a message's author, the `by` of a steer's or an interrupt's
//! note, of an agent's registration, budget, wake, fork and removal); the operator's
//! token's as `operator`. The login's cookie is got as a browser would, with reqwest.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::agents::{state, Env};
use serde_json::{json, Value};

/// The page's requests: the login's cookie and the dashboard's header, no token.
struct Page {
    url: String,
    cookie: String,
    client: reqwest::Client,
}

impl Page {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.url))
            .header("cookie", &self.cookie)
            .header("x-relay-dashboard", "1");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let code = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(code, 200, "{path}: {body}");
        body
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }
}

/// The notes of flight `id` as (text, by).
async fn notes(env: &Env, id: &str) -> Vec<(String, Value)> {
    env.updates(id)
        .await
        .into_iter()
        .filter(|u| u["kind"] == "note")
        .map(|u| (u["text"].as_str().unwrap().to_string(), u["by"].clone()))
        .collect()
}

/// The last event of type `kind` about agent `name`.
fn last_event(env: &Env, kind: &str, name: &str) -> Value {
    env.events_of(kind)
        .into_iter()
        .rev()
        .find(|e| e["agent"]["name"] == name || e["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} of {name}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dashboard_logins_actions_are_recorded_as_its_own_and_the_operators_as_operator() {
    let env = Env::start().await;
    env.add_agent("cx", &[]);
    let page = Page {
        url: env.relay.api.url.clone(),
        cookie: relay_tests::browser::login_cookie(&env.relay, "alice").await,
        client: reqwest::Client::new(),
    };
    let work = env.work.display().to_string();

    // The CLI (the operator's token) adds as `operator`.
    assert_eq!(last_event(&env, "agent_registered", "cx")["by"], "operator");

    // An ask from the page is alice's, whatever requester the body names.
    let asked = page
        .post(
            "/v1/invocations",
            json!({"target": "cx", "task": "hang until interrupted", "requester": "mallory"}),
        )
        .await;
    assert_eq!(
        asked["invocation"]["requester"], "alice@dashboard",
        "{asked}"
    );
    let id = asked["flight"]["id"].as_str().unwrap().to_string();
    env.wait_flight(&id, 60, |f| state(f) == "running").await;

    // Her steer reaches the agent and its note names her; her interrupt too.
    page.post(
        &format!("/v1/flights/{id}/steer"),
        json!({"text": "about zebras"}),
    )
    .await;
    page.post(&format!("/v1/flights/{id}/interrupt"), json!({}))
        .await;
    env.wait_flight(&id, 60, |f| state(f) == "cancelled").await;
    let noted = notes(&env, &id).await;
    assert!(
        noted.contains(&("steered: about zebras".into(), json!("alice@dashboard"))),
        "{noted:?}"
    );
    assert!(
        noted.contains(&("interrupt asked".into(), json!("alice@dashboard"))),
        "{noted:?}"
    );

    // The operator's token: its interrupt is `operator`'s.
    let second = env.ask_no_wait("cx", "hang again");
    env.wait_flight(&second, 60, |f| state(f) == "running")
        .await;
    env.relay.cli_ok(&["interrupt", &second]);
    env.wait_flight(&second, 60, |f| state(f) == "cancelled")
        .await;
    assert!(
        notes(&env, &second)
            .await
            .contains(&("interrupt asked".into(), json!("operator"))),
        "{:?}",
        notes(&env, &second).await
    );

    // A message from the page is hers, whatever author the body names.
    let posted = page
        .post(
            "/v1/messages",
            json!({"conversation": "channel.shared", "author": "operator", "body": "hello all"}),
        )
        .await;
    assert_eq!(posted["message"]["author"], "alice@dashboard", "{posted}");

    // Her agent add, budget, wake, fork and removal: each event names her.
    page.post(
        "/v1/agents",
        json!({"name": "cy", "harness": "codex_app_server", "cwd": work, "wake": "manual",
               "env": {"CODEX_HOME": env.codex_home.display().to_string()}}),
    )
    .await;
    assert_eq!(
        last_event(&env, "agent_registered", "cy")["by"],
        "alice@dashboard"
    );
    page.post(
        "/v1/agents/cy",
        json!({"budget": {"tokens_per_day": 1000, "on_exceed": "finish"}}),
    )
    .await;
    assert_eq!(
        last_event(&env, "agent_updated", "cy")["by"],
        "alice@dashboard"
    );
    let woken = page.post("/v1/agents/cy/wake", json!({})).await;
    assert_eq!(woken["note"]["text"], "wake asked", "{woken}");
    let wake = last_event(&env, "agent_updated", "cy");
    assert!(
        env.events_of("agent_updated")
            .iter()
            .any(|e| e["by"] == "alice@dashboard" && e["agent"]["note"]["text"] == "wake asked"),
        "{wake}"
    );
    page.post("/v1/agents/cx/fork", json!({"name": "cx-fork"}))
        .await;
    assert_eq!(
        last_event(&env, "agent_registered", "cx-fork")["by"],
        "alice@dashboard"
    );
    page.send(reqwest::Method::DELETE, "/v1/agents/cx-fork", None)
        .await;
    assert_eq!(
        last_event(&env, "agent_removed", "cx-fork")["by"],
        "alice@dashboard"
    );

    // The transcripts say who, where it is natural.
    let replay = env.relay.cli_ok(&["replay", "agent", "cx-fork"]);
    assert!(replay.contains("(by alice@dashboard)"), "{replay}");
    assert!(replay.contains("removed (by alice@dashboard)"), "{replay}");
    let replay = env.relay.cli_ok(&["replay", "flight", &id]);
    assert!(
        replay.contains("note: steered: about zebras (by alice@dashboard)"),
        "{replay}"
    );
}
