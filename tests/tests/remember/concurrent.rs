//! Many clients at once: sixteen agents (`relay-fake-acp`, whose `ask` prompt asks to
//! run `rm -rf /tmp/x` and runs nothing), sixteen decisions remembered over HTTP at the
//! same time, then the agents asking again while half of the rules are removed: no rule
//! is lost, and every rule's count is exactly the approvals it decided, also after a
//! `kill -9`.

use std::collections::BTreeMap;

use futures::future::join_all;
use relay_tests::agents::{state, Env};
use reqwest::Method;
use serde_json::{json, Value};

use crate::clis::ended;

const AGENTS: usize = 16;

fn rules_by_agent(env: &Env) -> BTreeMap<String, Value> {
    let list = env.relay.cli_json(&["rule", "list", "--json"]);
    list.as_array()
        .unwrap()
        .iter()
        .map(|r| (r["agent"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

/// Asks every agent `ask` at once (over HTTP); the flights, in agent order.
async fn ask_all(env: &Env, names: &[String]) -> Vec<String> {
    let http = env.relay.http();
    let asks = names.iter().map(|name| {
        let http = http.clone();
        async move {
            let body = json!({"target": name, "task": "ask"});
            let (code, v) = http.post("/v1/invocations", &body).await;
            assert_eq!(code, 200, "{v}");
            v["flight"]["id"].as_str().unwrap().to_string()
        }
    });
    join_all(asks).await
}

/// Waits until each flight has ended or waits for a person; the pending approvals.
async fn settle(env: &Env, flights: &[String]) -> Vec<Value> {
    for id in flights {
        env.wait_flight(id, 60, |f| ended(f) || state(f) == "waiting")
            .await;
    }
    let mut pending = Vec::new();
    for id in flights {
        if state(&env.flight(id).await) == "waiting" {
            pending.push(env.wait_approval(id).await);
        }
    }
    pending
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_remembered_decisions_and_removals_at_once() {
    let mut env = Env::start().await;
    let fake = env!("CARGO_BIN_EXE_relay-fake-acp");
    let names: Vec<String> = (0..AGENTS).map(|i| format!("f{i:02}")).collect();
    for name in &names {
        env.add_acp(name, fake);
    }
    let http = env.relay.http();

    // Sixteen approvals, decided and remembered at the same time.
    let first = ask_all(&env, &names).await;
    let pending = settle(&env, &first).await;
    assert_eq!(pending.len(), AGENTS, "{pending:?}");
    let decides = pending.iter().map(|a| {
        let http = http.clone();
        async move {
            let path = format!("/v1/approvals/{}", a["id"].as_str().unwrap());
            let body = json!({"decision": "accept", "remember": {"scope": "agent"}});
            let (code, d) = http.post(&path, &body).await;
            assert_eq!(code, 200, "{d}");
            d
        }
    });
    let decided = join_all(decides).await;
    for id in &first {
        let f = env.wait_flight(id, 60, ended).await;
        assert_eq!(state(&f), "completed", "{f}");
    }
    let rules = rules_by_agent(&env);
    assert_eq!(rules.len(), AGENTS, "{rules:?}");
    for d in &decided {
        let rule = &rules[d["agent"].as_str().unwrap()];
        assert_eq!(d["remembered"], rule["id"], "{d}");
        assert_eq!(
            (rule["pattern"].as_str(), rule["matched"].as_u64()),
            (Some("rm -rf /tmp/x"), Some(0)),
            "{rule}"
        );
    }

    // Every agent asks again while the rules of half of them are removed.
    let removed: Vec<&String> = names[AGENTS / 2..].iter().collect();
    let removals = removed.iter().map(|name| {
        let http = http.clone();
        let path = format!("/v1/rules/{}", rules[name.as_str()]["id"].as_str().unwrap());
        async move {
            let (code, r) = http.request(Method::DELETE, &path, None).await;
            assert_eq!(code, 200, "{r}");
        }
    });
    let (second, _) = tokio::join!(ask_all(&env, &names), join_all(removals));
    let pending = settle(&env, &second).await;
    let declines = pending.iter().map(|a| {
        let http = http.clone();
        async move {
            let path = format!("/v1/approvals/{}", a["id"].as_str().unwrap());
            let (code, d) = http.post(&path, &json!({"decision": "decline"})).await;
            assert_eq!(code, 200, "{d}");
        }
    });
    join_all(declines).await;
    for id in &second {
        env.wait_flight(id, 60, ended).await;
    }

    // A kept rule decided its agent's second approval; a removed one may have, if the
    // ask came first. Each rule's count is what it decided.
    let approvals = env.approvals();
    let decided_by = |rule: &Value| {
        let by = format!("rule:{}", rule["id"].as_str().unwrap());
        approvals.iter().filter(|a| a["decided_by"] == by).count() as u64
    };
    let kept = rules_by_agent(&env);
    assert_eq!(
        kept.keys().collect::<Vec<_>>(),
        names[..AGENTS / 2].iter().collect::<Vec<_>>()
    );
    for rule in kept.values() {
        assert_eq!(
            (rule["matched"].as_u64(), decided_by(rule)),
            (Some(1), 1),
            "{rule}"
        );
    }
    let gone = env.events_of("rule_removed");
    assert_eq!(gone.len(), AGENTS / 2, "{gone:?}");
    for e in &gone {
        let rule = &e["rule"];
        assert!(removed.iter().any(|n| rule["agent"] == n.as_str()), "{e}");
        assert_eq!(rule["matched"].as_u64(), Some(decided_by(rule)), "{e}");
    }
    let asked_again = pending.len();
    let by_rules: u64 = gone.iter().map(|e| decided_by(&e["rule"])).sum();
    assert_eq!(asked_again as u64 + by_rules, (AGENTS / 2) as u64);

    // The rules and their counts survive a `kill -9`.
    env.relay.kill9();
    env.relay.restart().unwrap();
    assert_eq!(rules_by_agent(&env), kept);
}
