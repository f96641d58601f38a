//! An agent's page: its composer streams a reply in place (Codex and Claude Code), its
//! usage today and budget, its rules.

use relay_tests::agents::{state, Env};
use relay_tests::browser::Browser;
use serde_json::{json, Value};

use crate::{env, fill, goto, page, USAGE};

/// The newest ask entry under the composer: its state, streamed text and output.
const ASK: &str = "(() => { const li = [...document.querySelectorAll('li.ask')].pop(); if (!li) return null; \
    return {flight: li.dataset.flight, state: li.dataset.state, \
    stream: li.querySelector('.ask-stream').textContent, streamShown: !li.querySelector('.ask-stream').hidden, \
    output: li.querySelector('.ask-output').textContent}; })()";

/// Asks the agent whose page is open from its composer and checks the reply streams in
/// place: a partial text while the page shows the flight live, then the whole output
/// instead. Returns the flight.
async fn ask_and_watch_it_stream(b: &Browser, env: &Env, shot: Option<&str>) -> Value {
    let words = [
        "alpha", "bravo", "charlie", "delta", "echo", "golf", "hotel", "foxtrot",
    ];
    fill(
        b,
        "textarea.composer-task",
        &format!("stream: {}", words.join(" ")),
    )
    .await;
    b.click("button[data-action=\"ask\"]").await;
    let partial = b
        .wait_js(ASK, |v| {
            let text = v["stream"].as_str().unwrap_or("");
            text.contains("alpha") && !text.contains("foxtrot")
        })
        .await;
    // Seen in one look: part of the reply on the page, the page's flight still live.
    assert!(
        matches!(
            partial["state"].as_str(),
            Some("running" | "waking" | "queued" | "waiting")
        ),
        "the partial reply is shown while the flight runs: {partial}"
    );
    assert_eq!(partial["streamShown"], true, "{partial}");
    if let Some(shot) = shot {
        b.screenshot(shot).await;
    }
    let id = partial["flight"].as_str().unwrap().to_string();
    let done = b
        .wait_js(ASK, |v| {
            v["state"] == "completed" && !v["output"].as_str().unwrap_or("").is_empty()
        })
        .await;
    let f = env.flight(&id).await;
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(f["output"].as_str().unwrap().trim(), words.join(" "), "{f}");
    // The reply is shown once: the output, the streamed text hidden.
    assert_eq!(
        done["output"].as_str().unwrap().trim(),
        words.join(" "),
        "{done}"
    );
    assert_eq!(done["streamShown"], false, "{done}");
    // Asked by the login.
    let flights = env.events_of("invocation_created");
    let created = flights
        .iter()
        .find(|e| e["flight"]["id"] == id.as_str())
        .unwrap();
    assert_eq!(
        created["invocation"]["requester"], "tester@dashboard",
        "{created}"
    );
    // The entry links to its flight's page.
    let href = b
        .js(&format!("document.querySelector('li.ask[data-flight=\"{id}\"] a[href^=\"#/flight/\"]').getAttribute('href')"))
        .await;
    assert_eq!(href, format!("#/flight/{id}"));
    f
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_page_asks_streams_the_reply_and_shows_usage_and_budget() {
    let env = env().await;
    env.add_agent("cx", &[]);
    env.add_claude("cl", &[]);
    let b = page(&env, "agent/cx").await;
    b.wait_text("#agent-state", |t| !t.is_empty()).await;
    b.wait_text("#agent-usage", |t| t.contains("0 tokens"))
        .await;
    assert!(b.text("#agent-budget").await.contains("No budget"));

    // Codex: the reply streams in, then the usage of that flight shows.
    let f = ask_and_watch_it_stream(&b, &env, Some("composer-streaming")).await;
    let usage = &f["usage"];
    assert_eq!(
        (
            usage["input_tokens"].as_u64(),
            usage["output_tokens"].as_u64()
        ),
        (Some(USAGE.0), Some(USAGE.2)),
        "one model call of the mock's counts: {f}"
    );
    let tokens = USAGE.0 + USAGE.2;
    let shown = b
        .wait_js(
            "document.querySelector('#agent-usage').dataset.tokens",
            |v| v == &json!(tokens.to_string()),
        )
        .await;
    assert_eq!(shown, json!(tokens.to_string()));
    let line = b.text("#agent-usage").await;
    assert!(
        line.contains("1,270 tokens") && line.contains("1 flight"),
        "{line}"
    );
    let (code, report) = env.relay.http().get("/v1/usage?by=agent&agent=cx").await;
    assert_eq!(code, 200, "{report}");
    assert_eq!(report["total"]["tokens"], tokens, "{report}");
    // Its recent flights list it, linked.
    b.wait_for(&format!(
        "#agent-flights tr[data-flight=\"{}\"] a",
        f["id"].as_str().unwrap()
    ))
    .await;
    // The session the flight ran in.
    let session = b.wait_text("#agent-session", |t| !t.is_empty()).await;
    assert_eq!(
        session,
        env.agent("cx").await["session_id"].as_str().unwrap()
    );

    // A budget set from the page, as `relay agent set --budget ...` would.
    fill(&b, "input.budget-limits", "200000/day $5/day 50k/tree").await;
    fill(&b, "select.budget-on", "interrupt").await;
    b.click("button[data-action=\"set-budget\"]").await;
    b.wait_text("#agent-budget", |t| t.contains("200,000 tokens/day"))
        .await;
    let (_, status) = env.relay.http().get("/v1/agents/cx/budget").await;
    assert_eq!(
        status["budget"],
        json!({"tokens_per_day": 200000, "cost_micro_usd_per_day": 5000000,
            "tokens_per_tree": 50000, "on_exceed": "interrupt"}),
        "{status}"
    );
    assert_eq!(status["today"]["tokens"], tokens, "{status}");
    let budget = b.text("#agent-budget").await;
    assert!(
        budget.contains("$5.000000/day")
            && budget.contains("50,000 tokens/tree")
            && budget.contains("interrupted"),
        "{budget}"
    );
    b.screenshot("agent-page").await;
    // A bad limit is refused on the page with why; the budget stays.
    fill(&b, "input.budget-limits", "5/week").await;
    b.click("button[data-action=\"set-budget\"]").await;
    let err = b
        .wait_text(".budget-result .error", |t| !t.is_empty())
        .await;
    assert!(err.contains("5/week") && err.contains("day"), "{err}");
    // Cleared.
    b.click("button[data-action=\"clear-budget\"]").await;
    b.wait_text("#agent-budget", |t| t.contains("No budget"))
        .await;
    let (_, status) = env.relay.http().get("/v1/agents/cx/budget").await;
    assert!(status["budget"].is_null(), "{status}");

    // A rule for this agent (an approval accepted and remembered) is listed on its page
    // and removed from there.
    let asked = env.ask_no_wait("cx", "exec: echo ruled");
    let approval = env.wait_approval(&asked).await;
    let (code, decided) = env
        .relay
        .http()
        .post(
            &format!("/v1/approvals/{}", approval["id"].as_str().unwrap()),
            &json!({"decision": "accept", "remember": {"scope": "agent"}}),
        )
        .await;
    assert_eq!(code, 200, "{decided}");
    env.wait_flight(&asked, 90, |f| state(f) == "completed")
        .await;
    let rule = env.approval_of(&asked)["remembered"]
        .as_str()
        .unwrap()
        .to_string();
    let row = format!("#agent-rules tr[data-rule=\"{rule}\"]");
    let shown = b.wait_text(&row, |t| t.contains("echo ruled")).await;
    assert!(shown.contains("agent cx"), "{shown}");
    b.click(&format!("{row} button[data-action=\"remove-rule\"]"))
        .await;
    b.wait_text("#agent-rules", |t| t.contains("No rules"))
        .await;
    let (code, _) = env.relay.http().get(&format!("/v1/rules/{rule}")).await;
    assert_eq!(code, 404);

    // Claude Code: the same composer, the reply streams in too.
    goto(&b, &env, "agent/cl").await;
    b.wait_text("#agent-title", |t| t.contains("cl")).await;
    let f = ask_and_watch_it_stream(&b, &env, None).await;
    let tokens = f["usage"]["input_tokens"].as_u64().unwrap()
        + f["usage"]["output_tokens"].as_u64().unwrap();
    b.wait_js(
        "document.querySelector('#agent-usage').dataset.tokens",
        |v| v == &json!(tokens.to_string()),
    )
    .await;
}
