//! The dashboard's remembered decisions and usage in a real headless Chromium (as
//! `dashboard.rs`), served by a real `relay up` with the real pinned Codex CLI against
//! the mock model: an approval is accepted and remembered on the page for the scope the
//! select names, the page says the rule it made, and the same command then runs decided
//! by that rule; the Rules view lists the rule (its pattern as text) and removes it; the
//! flight page shows the flight's usage and cost, and the Usage view its totals by agent
//! and by day.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::agents::{state, Env};
use relay_tests::browser::Browser;
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_is_remembered_on_the_page_and_its_rule_removed_in_the_rules_view() {
    let env = Env::start().await;
    env.add_agent("cx-1", &[]);
    let b = Browser::logged_in(&env.relay, "dashboard-rules", "tester").await;
    b.goto(&format!("{}/#/approvals", env.relay.api.url)).await;
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;

    let id = env.ask_no_wait("cx-1", "exec: echo remember-me");
    let a = env.wait_approval(&id).await;
    let approval = a["id"].as_str().unwrap().to_string();
    let item = format!("li[data-approval=\"{approval}\"]");
    b.wait_text(&format!("{item} .command"), |t| {
        t.contains("echo remember-me")
    })
    .await;
    // Remember for the agent (the select offers every scope).
    let scopes = b
        .js(&format!(
            "[...document.querySelectorAll({})].map(o => o.value)",
            json!(format!("{item} select.remember-scope option"))
        ))
        .await;
    assert_eq!(scopes, json!(["session", "agent", "project", "everywhere"]));
    b.js(&format!(
        "document.querySelector({}).value = 'agent'",
        json!(format!("{item} select.remember-scope"))
    ))
    .await;
    b.click(&format!("{item} button.remember")).await;
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(f["output"].as_str().unwrap().contains("remember-me"), "{f}");
    let decided = env.approval_of(&id);
    assert_eq!(decided["decided_by"], "tester@dashboard");
    let rule = decided["remembered"].as_str().unwrap().to_string();
    b.wait_text(&format!("{item} .remembered"), |t| t.contains(&rule))
        .await;
    let shown = env.relay.cli_json(&["rule", "show", &rule, "--json"]);
    assert_eq!(
        (
            shown["scope"].as_str(),
            shown["agent"].as_str(),
            shown["pattern"].as_str()
        ),
        (Some("agent"), Some("cx-1"), Some("echo remember-me"))
    );

    // The same command runs decided by the rule.
    let again = env.ask_no_wait("cx-1", "exec: echo remember-me");
    env.wait_flight(&again, 60, |f| state(f) == "completed")
        .await;
    assert_eq!(
        env.approval_of(&again)["decided_by"],
        format!("rule:{rule}")
    );

    // The Rules view lists it with its count, and removes it.
    b.goto(&format!("{}/#/rules", env.relay.api.url)).await;
    let row = format!("#rules tr[data-rule=\"{rule}\"]");
    b.wait_text(&format!("{row} .pattern"), |t| t == "echo remember-me")
        .await;
    b.wait_text(&format!("{row} .matched"), |t| t == "1").await;
    assert_eq!(b.text(&format!("{row} .scope")).await, "agent cx-1");
    b.screenshot("rules-view").await;
    b.click(&format!("{row} button.remove-rule")).await;
    b.wait_js(
        &format!("document.querySelector({}) === null", json!(row)),
        |v| v == true,
    )
    .await;
    let gone = env.relay.cli(&["rule", "show", &rule]);
    assert_eq!(gone.status.code(), Some(3));
    let removed = env.events_of("rule_removed");
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(removed[0]["removed_by"], "tester@dashboard");

    // The flight page shows its usage; the Usage view adds the flights up.
    let usage = f["usage"].clone();
    let input = usage["input_tokens"].as_u64().unwrap();
    b.goto(&format!("{}/#/flight/{id}", env.relay.api.url))
        .await;
    let line = b.wait_text("#flight-usage", |t| t.contains("input")).await;
    assert!(line.contains("cost unknown"), "no price table: {line}");
    let report = env.relay.cli_json(&["usage", "--json"]);
    let tokens = report["total"]["tokens"].as_u64().unwrap();
    assert!(tokens > input, "two flights: {report}");
    b.goto(&format!("{}/#/usage", env.relay.api.url)).await;
    let agent_row = b
        .wait_text("#usage-by-agent tbody tr", |t| t.contains("cx-1"))
        .await;
    let total = tokens.to_string();
    assert!(
        agent_row
            .split_whitespace()
            .any(|c| c.replace(',', "") == total),
        "{agent_row} has {total} tokens"
    );
    assert!(
        agent_row.trim_end().ends_with('?'),
        "unknown cost: {agent_row}"
    );
    let day_row = b
        .wait_text("#usage-by-day tbody tr", |t| t.starts_with("20"))
        .await;
    assert!(
        day_row
            .split_whitespace()
            .any(|c| c.replace(',', "") == total),
        "{day_row} has {total} tokens"
    );
}
