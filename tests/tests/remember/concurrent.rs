//! Many clients at once: sixteen agents (`relay-fake-acp`, whose `ask` prompt asks to
//! run `rm -rf /tmp/x` and runs nothing), sixteen decisions remembered over HTTP at the
//! same time, then the agents asking again while half of the rules are removed: no rule
//! is lost, and every rule's count is exactly the approvals it decided, also after a
//! `kill -9`. And what each agent was told (the fake says which option it got) is what
//! its approval records: an accept with its rule or a person's decision, never an
//! approval closed undecided behind an answer the agent got.

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

/// What the agent did (the fake says which option it was given) is what the approval
/// records: an accept, or a person's decline; never an approval expired undecided.
async fn agent_got_what_was_recorded(env: &Env, flights: &[String]) {
    for id in flights {
        let f = env.flight(id).await;
        let a = env.approval_of(id);
        let output = f["output"].as_str().unwrap_or_default();
        let recorded = match a["decision"].as_str() {
            Some("accept") => "chose proceed_once;",
            Some("decline") => "chose cancel;",
            _ => "no decision",
        };
        assert!(
            state(&f) == "completed" && output.starts_with(recorded),
            "the agent was told otherwise than recorded:\n{}",
            explain(env, &a).await
        );
    }
}

/// An approval, its flight and the broker's log lines of the flight (a failure's story).
async fn explain(env: &Env, approval: &Value) -> String {
    let id = approval["flight"].as_str().unwrap();
    let flight = env.flight(id).await;
    let log = env.relay.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(id)).collect();
    format!(
        "approval now: {:#}\nflight: {flight:#}\nlog:\n{}",
        env.approval_of(id),
        lines.join("\n")
    )
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
            http.post(&path, &body).await
        }
    });
    let mut decided = Vec::new();
    for (a, (code, d)) in pending.iter().zip(join_all(decides).await) {
        assert_eq!(code, 200, "{d}\n{}", explain(&env, a).await);
        decided.push(d);
    }
    for id in &first {
        let f = env.wait_flight(id, 60, ended).await;
        assert_eq!(state(&f), "completed", "{f}");
    }
    agent_got_what_was_recorded(&env, &first).await;
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
    // A rule may decide an approval after it was seen waiting (its removal came after
    // the ask): the person's decline then comes too late, and says so.
    let declines = pending.iter().map(|a| {
        let http = http.clone();
        async move {
            let path = format!("/v1/approvals/{}", a["id"].as_str().unwrap());
            http.post(&path, &json!({"decision": "decline"})).await
        }
    });
    for (a, (code, d)) in pending.iter().zip(join_all(declines).await) {
        let late = matches!(
            d["error"]["code"].as_str(),
            Some("approval_closed" | "unavailable")
        );
        assert!(code == 200 || late, "{d}\n{}", explain(&env, a).await);
    }
    for id in &second {
        env.wait_flight(id, 60, ended).await;
    }
    agent_got_what_was_recorded(&env, &second).await;

    // A kept rule decided its agent's second approval; a removed one may have, if the
    // ask came first, else a person did. Each rule's count is exactly what it decided.
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
    let by_people = approvals
        .iter()
        .filter(|a| second.iter().any(|f| a["flight"] == f.as_str()))
        .filter(|a| a["decided_by"] == "operator")
        .count() as u64;
    let by_removed: u64 = gone.iter().map(|e| decided_by(&e["rule"])).sum();
    assert_eq!(
        by_people + by_removed,
        (AGENTS / 2) as u64,
        "{approvals:#?}"
    );

    // The rules and their counts survive a `kill -9`.
    env.relay.kill9();
    env.relay.restart().unwrap();
    assert_eq!(rules_by_agent(&env), kept);
}
