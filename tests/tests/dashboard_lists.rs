//! The dashboard's lists in a real headless Chromium (as `dashboard.rs`), served by a
//! real `relay up`: tmux agents (a pane running `sh`, each flight answered with `relay
//! reply`: many flights quickly) and the real pinned Codex CLI against the mock model.
//!
//! - Flights narrow by agent, state, time and text; the hash keeps the filters through
//!   a reload; a live flight of the filtered agent appears, one of another does not.
//! - Usage shows each agent's and each day's tokens as the flights reported them, and
//!   refreshes when a flight ends.
//! - A real Codex approval accepted and remembered with one argument as any
//!   (`--any-arg`), another declined and remembered: the next matching command is
//!   decided by the rule (`rule:<id>`). Rules remembered and removed from the CLI come
//!   and go live on the Rules view; one is removed on the page; a budget is listed with
//!   what was used today, and removed from the page.
//! - Every view fits a 375 px wide window; while a flight streams 1,000s of deltas a
//!   second the flights, agents and flight views do not shift (cumulative layout shift
//!   below 0.1; the long tasks meanwhile are printed as a measurement).
//!
//! Screenshots under `target/test-artifacts/dashboard_lists/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::agents::{state, Env};
use relay_tests::browser::Browser;
use relay_tests::RelayProcess;
use serde_json::{json, Value};

const SHOTS: &str = "dashboard_lists";

/// Goes to the page's route `hash` (`#/flights?...`) and waits until it is live.
async fn open(b: &Browser, relay: &RelayProcess, hash: &str) {
    b.goto(&format!("{}/{hash}", relay.api.url)).await;
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
}

/// The flights the Flights view lists, sorted.
const ROWS: &str =
    "[...document.querySelectorAll('#flights tr[data-flight]')].map(r => r.dataset.flight).sort()";

/// Waits until the Flights view lists exactly `ids` and its count says so.
async fn wait_rows(b: &Browser, ids: &[impl AsRef<str>]) {
    let mut want: Vec<&str> = ids.iter().map(AsRef::as_ref).collect();
    want.sort_unstable();
    b.wait_js(ROWS, |v| v == &json!(want)).await;
    let n = ids.len().to_string();
    b.wait_js(
        "document.querySelector('.flights-view .count').dataset.shown",
        |v| v == n.as_str(),
    )
    .await;
    let count = b.text(".flights-view .count").await;
    assert!(count.starts_with(&format!("{n} shown")), "{count}");
}

/// Picks `value` in the select `css` like a user: a click on its option.
async fn pick(b: &Browser, css: &str, value: &str) {
    b.click(&format!("{css} option[value=\"{value}\"]")).await;
}

/// A tmux agent's flight, answered with `text` so that it completes.
async fn completed(env: &Env, agent: &str, task: &str) -> Value {
    let id = env.ask_no_wait(agent, task);
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    env.relay.cli_ok(&["reply", &id, "done"]);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await
}

#[tokio::test(flavor = "multi_thread")]
async fn flights_narrow_by_agent_state_time_and_text_and_the_link_keeps_them() {
    let env = Env::start().await;
    env.add_tmux("tm-a", "sh", &[]);
    env.add_tmux("tm-b", "sh", &[]);
    let a1 = completed(&env, "tm-a", "alpha parser").await;
    let b1 = completed(&env, "tm-b", "beta needle docs").await;
    let a2 = env.ask_no_wait("tm-a", "alpha second");
    env.wait_flight(&a2, 60, |f| state(f) == "running").await;
    let (a1, b1_at, b1) = (
        a1["id"].as_str().unwrap().to_string(),
        b1["created_at"].as_u64().unwrap(),
        b1["id"].as_str().unwrap().to_string(),
    );
    let b = Browser::logged_in(&env.relay, SHOTS, "tester").await;

    // Everything, then by agent.
    open(&b, &env.relay, "#/flights").await;
    wait_rows(&b, &[&a1, &b1, &a2]).await;
    open(&b, &env.relay, "#/flights?agent=tm-a").await;
    wait_rows(&b, &[&a1, &a2]).await;
    // Each row shows its task.
    b.wait_text(&format!("#flights tr[data-flight=\"{a1}\"] .task"), |t| {
        t.contains("alpha parser")
    })
    .await;
    // By state, picked on the page: the hash keeps both.
    pick(&b, "select[data-filter=\"state\"]", "running").await;
    wait_rows(&b, &[&a2]).await;
    assert_eq!(
        b.js("location.hash").await,
        "#/flights?agent=tm-a&state=running"
    );
    // A reload keeps them (the link is the filter).
    b.client().refresh().await.unwrap();
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
    wait_rows(&b, &[&a2]).await;
    let picked = b
        .js("['agent','state'].map(k => document.querySelector(`select[data-filter=${k}]`).value)")
        .await;
    let dbg = b.js("[location.hash, [...document.querySelectorAll('select[data-filter=agent] option')].map(o => o.value + '/' + o.selected)]").await;
    assert_eq!(picked, json!(["tm-a", "running"]), "{dbg}");

    // By text: `/` goes to the search box; the task matches.
    b.click("button[data-action=\"clear-filters\"]").await;
    wait_rows(&b, &[&a1, &b1, &a2]).await;
    b.js("document.activeElement.blur(), 1").await;
    b.key("/").await;
    b.wait_js("document.activeElement.dataset.filter", |v| v == "q")
        .await;
    b.key("needle").await;
    wait_rows(&b, &[&b1]).await;
    b.wait_js("location.hash", |v| v == "#/flights?q=needle")
        .await;
    b.screenshot("flights-filtered").await;
    // The id matches too, whatever its case.
    open(
        &b,
        &env.relay,
        &format!("#/flights?q={}", a1.to_uppercase()),
    )
    .await;
    wait_rows(&b, &[&a1]).await;

    // By time: flights asked since b1 (a day, a span back from now, or ms).
    open(&b, &env.relay, &format!("#/flights?since={b1_at}")).await;
    wait_rows(&b, &[&b1, &a2]).await;
    open(&b, &env.relay, "#/flights?since=1h").await;
    wait_rows(&b, &[&a1, &b1, &a2]).await;

    // Live: tm-b's new flight appears in tm-b's list, tm-a's does not (asked first,
    // so the page has it by the time tm-b's shows).
    open(&b, &env.relay, "#/flights?agent=tm-b").await;
    wait_rows(&b, &[&b1]).await;
    let a3 = env.ask_no_wait("tm-a", "alpha queued");
    let b2 = env.ask_no_wait("tm-b", "beta live");
    wait_rows(&b, &[&b1, &b2]).await;
    assert_ne!(a3, b2);
    b.wait_text(&format!("#flights tr[data-flight=\"{b2}\"] .task"), |t| {
        t.contains("beta live")
    })
    .await;
}

/// The tokens in a usage cell (`1,234` as 1234).
fn tokens(text: &str) -> u64 {
    text.trim().replace(',', "").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_by_agent_and_day_adds_up_the_flights_and_refreshes_when_one_ends() {
    let env = Env::start().await;
    env.add_agent("cx-1", &[]);
    env.add_agent("cx-2", &[]);
    let mut used = std::collections::BTreeMap::new();
    for (agent, task) in [("cx-1", "hello one"), ("cx-2", "hello two")] {
        let id = env.ask_no_wait(agent, task);
        let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
        let u = &f["usage"];
        let n = u["input_tokens"].as_u64().unwrap() + u["output_tokens"].as_u64().unwrap();
        assert!(n > 0, "{f}");
        *used.entry(agent).or_insert(0) += n;
    }
    let b = Browser::logged_in(&env.relay, SHOTS, "tester").await;
    open(&b, &env.relay, "#/usage").await;
    for (agent, n) in &used {
        let cell = format!("#usage-by-agent tr[data-key=\"{agent}\"] .tokens");
        let shown = b.wait_text(&cell, |t| !t.is_empty()).await;
        assert_eq!(tokens(&shown), *n, "{agent}");
        let href = b
            .js(&format!(
                "document.querySelector({}).getAttribute('href')",
                json!(format!("#usage-by-agent tr[data-key=\"{agent}\"] a"))
            ))
            .await;
        assert_eq!(href, format!("#/agent/{agent}"));
    }
    let total: u64 = used.values().sum();
    let day = env.relay.cli_json(&["usage", "--by", "day", "--json"]);
    let today = day["rows"][0]["key"].as_str().unwrap().to_string();
    let shown = b
        .wait_text(
            &format!("#usage-by-day tr[data-key=\"{today}\"] .tokens"),
            |t| !t.is_empty(),
        )
        .await;
    assert_eq!(tokens(&shown), total);
    let line = b.text("#usage-total").await;
    assert!(
        line.contains(&format!("2 flights, {} tokens", num(total))),
        "{line}"
    );
    b.screenshot("usage").await;

    // A flight ends while the page is open: its tokens are added without a reload.
    let id = env.ask_no_wait("cx-1", "hello three");
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let more = f["usage"]["input_tokens"].as_u64().unwrap()
        + f["usage"]["output_tokens"].as_u64().unwrap();
    let want = used["cx-1"] + more;
    b.wait_text("#usage-by-agent tr[data-key=\"cx-1\"] .tokens", |t| {
        tokens(t) == want
    })
    .await;
    // The last 24 hours: the same flights.
    pick(&b, "select[data-filter=\"since\"]", "24h").await;
    b.wait_text("#usage-total", |t| t.starts_with("3 flights"))
        .await;
}

/// `n` with thousands separators, as the page's locale (en-US in the test browser) says it.
fn num(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The pending approval of flight `id` on the page: its item's selector, once shown.
async fn approval_item(b: &Browser, env: &Env, id: &str) -> String {
    let a = env.wait_approval(id).await;
    let item = format!("li[data-approval=\"{}\"]", a["id"].as_str().unwrap());
    b.wait_for(&format!("{item} button.decline-remember")).await;
    item
}

/// The rule flight `id`'s approval was decided by, and that decision, once it completed.
async fn decided_by_rule(env: &Env, id: &str) -> (String, String) {
    env.wait_flight(id, 60, |f| state(f) == "completed").await;
    let a = env.approval_of(id);
    let by = a["decided_by"].as_str().unwrap();
    let rule = by
        .strip_prefix("rule:")
        .unwrap_or_else(|| panic!("decided by a rule: {a}"));
    (
        rule.to_string(),
        a["decision"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_is_remembered_with_any_argument_or_declined_and_the_next_is_the_rules() {
    let env = Env::start().await;
    env.add_agent("cx-1", &[]);
    let b = Browser::logged_in(&env.relay, SHOTS, "tester").await;
    open(&b, &env.relay, "#/approvals").await;

    // Accept and remember, the first argument as any: the select offers exactly the
    // command and its one plain argument.
    let id = env.ask_no_wait("cx-1", "exec: echo any-arg-one");
    let item = approval_item(&b, &env, &id).await;
    let choices = b
        .js(&format!(
            "[...document.querySelectorAll({})].map(o => o.value)",
            json!(format!("{item} select.remember-any-arg option"))
        ))
        .await;
    assert_eq!(choices, json!(["", "1"]), "echo's one plain argument");
    pick(&b, &format!("{item} select.remember-any-arg"), "1").await;
    pick(&b, &format!("{item} select.remember-scope"), "agent").await;
    b.screenshot("approvals-remember").await;
    b.click(&format!("{item} button.remember")).await;
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let decided = env.approval_of(&id);
    assert_eq!(
        (decided["decision"].as_str(), decided["decided_by"].as_str()),
        (Some("accept"), Some("tester@dashboard")),
        "{decided}"
    );
    let any_rule = decided["remembered"].as_str().unwrap().to_string();
    let shown = env.relay.cli_json(&["rule", "show", &any_rule, "--json"]);
    assert_eq!(
        (shown["decision"].as_str(), shown["pattern"].as_str()),
        (Some("accept"), Some("echo *")),
        "{shown}"
    );
    b.wait_text(&format!("{item} .remembered"), |t| t.contains(&any_rule))
        .await;
    // Another argument: run, decided by that rule (the page shows no approval for it).
    let again = env.ask_no_wait("cx-1", "exec: echo any-arg-two");
    assert_eq!(
        decided_by_rule(&env, &again).await,
        (any_rule.clone(), "accept".to_string())
    );
    let f = env.flight(&again).await;
    assert!(f["output"].as_str().unwrap().contains("any-arg-two"), "{f}");

    // Decline and remember (this exact command, for the agent).
    let id = env.ask_no_wait("cx-1", "exec: touch never-this");
    let item = approval_item(&b, &env, &id).await;
    b.click(&format!("{item} button.decline-remember")).await;
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let decided = env.approval_of(&id);
    assert_eq!(
        (decided["decision"].as_str(), decided["decided_by"].as_str()),
        (Some("decline"), Some("tester@dashboard")),
        "{decided}"
    );
    let decline_rule = decided["remembered"].as_str().unwrap().to_string();
    let shown = env
        .relay
        .cli_json(&["rule", "show", &decline_rule, "--json"]);
    assert_eq!(
        (
            shown["decision"].as_str(),
            shown["pattern"].as_str(),
            shown["scope"].as_str()
        ),
        (Some("decline"), Some("touch never-this"), Some("agent")),
        "{shown}"
    );
    // The same command again: declined by the rule, nobody asked.
    let again = env.ask_no_wait("cx-1", "exec: touch never-this");
    assert_eq!(
        decided_by_rule(&env, &again).await,
        (decline_rule, "decline".to_string())
    );
    assert!(
        env.approvals().iter().all(|a| a["state"] != "pending"),
        "nothing waits for a person"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_budgets_are_listed_live_and_removed() {
    let env = Env::start().await;
    env.add_agent("cx-1", &[]);
    let b = Browser::logged_in(&env.relay, SHOTS, "tester").await;
    open(&b, &env.relay, "#/rules").await;
    b.wait_text("#rules-subtitle .count", |t| t == "(0)").await;

    // Remembered from the CLI while the page shows the Rules view: it appears.
    let mut made = Vec::new();
    for command in ["printf one", "printf two"] {
        let id = env.ask_no_wait("cx-1", &format!("exec: {command}"));
        let a = env.wait_approval(&id).await;
        let approval = a["id"].as_str().unwrap();
        env.relay.cli_ok(&[
            "approval",
            "decide",
            approval,
            "accept",
            "--remember",
            "agent",
        ]);
        let rule = env.approval_of(&id)["remembered"]
            .as_str()
            .unwrap()
            .to_string();
        let row = format!("#rules tr[data-rule=\"{rule}\"]");
        b.wait_text(&format!("{row} .pattern"), |t| t == command)
            .await;
        made.push((rule, row));
    }
    b.wait_text("#rules-subtitle .count", |t| t == "(2)").await;
    // Removed on the page: gone from the page and from the broker.
    let (rule, row) = &made[1];
    b.click(&format!("{row} button[data-action=\"remove-rule\"]"))
        .await;
    b.wait_js(
        &format!("document.querySelector({}) === null", json!(row)),
        |v| v == true,
    )
    .await;
    assert_eq!(
        env.relay.cli(&["rule", "show", rule]).status.code(),
        Some(3)
    );
    b.wait_text("#rules-subtitle .count", |t| t == "(1)").await;

    // A budget: listed live with what was used today, removed from the page.
    env.relay
        .cli_ok(&["agent", "set", "cx-1", "--budget", "200000/day"]);
    let row = "#budgets tr[data-agent=\"cx-1\"]";
    b.wait_text(&format!("{row} .limits"), |t| {
        t.contains("200,000 tokens/day")
    })
    .await;
    let (_, status) = env.relay.http().get("/v1/agents/cx-1/budget").await;
    let today = status["today"]["tokens"].as_u64().unwrap();
    assert!(today > 0, "{status}");
    b.wait_text(&format!("{row} .used"), |t| {
        t.starts_with(&format!("{} of 200,000 tokens", num(today)))
    })
    .await;
    b.screenshot("rules-budgets").await;
    b.click(&format!("{row} button[data-action=\"remove-budget\"]"))
        .await;
    b.wait_js(
        &format!("document.querySelector({}) === null", json!(row)),
        |v| v == true,
    )
    .await;
    let agent = env.relay.cli_json(&["agent", "show", "cx-1", "--json"]);
    let budget = &agent["budget"];
    assert!(
        budget.is_null()
            || budget.as_object().is_some_and(|b| !b
                .keys()
                .any(|k| k.ends_with("_per_day") || k.ends_with("_per_tree"))),
        "{agent}"
    );

    // A rule removed from the CLI goes from the page (the watch's rule_removed).
    let (rule, row) = &made[0];
    env.relay.cli_ok(&["rule", "remove", rule]);
    b.wait_js(
        &format!("document.querySelector({}) === null", json!(row)),
        |v| v == true,
    )
    .await;
    b.wait_text("#rules-subtitle .count", |t| t == "(0)").await;
}

/// Whether the page scrolls sideways: its width beyond the window's, in CSS pixels.
const OVERFLOW: &str = "document.documentElement.scrollWidth - window.innerWidth";

/// The innermost elements reaching past the window's right edge (what makes it scroll
/// sideways), as `tag.class: right edge`, for the failure message.
const STICKING_OUT: &str = "[...document.querySelectorAll('body *')] \
    .filter(e => e.getBoundingClientRect().right > innerWidth + 0.5 \
      && ![...e.children].some(c => c.getBoundingClientRect().right > innerWidth + 0.5)) \
    .slice(0, 8).map(e => `${e.tagName.toLowerCase()}.${[...e.classList].join('.')}: ${Math.round(e.getBoundingClientRect().right)}`)";

#[tokio::test(flavor = "multi_thread")]
async fn every_view_fits_a_phone_width_window() {
    let env = Env::start().await;
    env.add_agent("cx-1", &[]);
    let id = env.ask_no_wait(
        "cx-1",
        "exec: echo a-rather-long-argument-that-would-not-fit-a-phone-screen-at-all-0123456789",
    );
    env.wait_approval(&id).await;
    env.relay
        .cli_ok(&["agent", "set", "cx-1", "--budget", "200000/day"]);
    let b = Browser::logged_in(&env.relay, SHOTS, "tester").await;
    b.set_window_size(375, 812).await;
    assert_eq!(b.js("window.innerWidth").await, 375);
    let conversation = env.flight(&id).await["conversation"]
        .as_str()
        .unwrap()
        .to_string();
    let views = [
        ("agents", "#/agents".to_string(), "#agents tr[data-agent]"),
        (
            "flights",
            "#/flights".to_string(),
            "#flights tr[data-flight]",
        ),
        ("approvals", "#/approvals".to_string(), "li[data-approval]"),
        ("flight", format!("#/flight/{id}"), "#flight"),
        (
            "conversations",
            "#/conversations".to_string(),
            "#conversations tr[data-conversation]",
        ),
        (
            "conversation",
            format!("#/conversation/{conversation}"),
            "#messages li[data-message]",
        ),
        ("rules", "#/rules".to_string(), "#budgets tr[data-agent]"),
        ("usage", "#/usage".to_string(), "#usage-by-agent table"),
        (
            "replay",
            format!("#/replay/flight/{id}"),
            ".replay-view pre.task",
        ),
        ("tree", format!("#/tree/{id}"), "#tree .tree-node"),
    ];
    let mut wide = Vec::new();
    for (name, hash, ready) in &views {
        open(&b, &env.relay, hash).await;
        b.wait_for(ready).await;
        let over = b.js(OVERFLOW).await.as_i64().unwrap();
        b.screenshot(&format!("phone-{name}")).await;
        if over > 0 {
            let sticking = b.js(STICKING_OUT).await;
            wide.push(format!("{name}: {over} px too wide: {sticking}"));
        }
    }
    assert!(wide.is_empty(), "{wide:?}");
    // The header's links are all on screen.
    let off = b
        .js("[...document.querySelectorAll('nav a')].filter(a => a.getBoundingClientRect().right > innerWidth).length")
        .await;
    assert_eq!(off, 0);
}

/// Installs observers of layout shifts and long tasks in the page (`window.__cls`,
/// `window.__long`), from now on.
const OBSERVE: &str = "(() => { window.__cls = 0; window.__shifts = 0; window.__long = 0; \
    new PerformanceObserver(l => { for (const e of l.getEntries()) if (!e.hadRecentInput) { window.__cls += e.value; window.__shifts++; } }).observe({type: 'layout-shift'}); \
    new PerformanceObserver(l => { window.__long += l.getEntries().length; }).observe({type: 'longtask'}); \
    return 1; })()";

#[tokio::test(flavor = "multi_thread")]
async fn streaming_thousands_of_deltas_does_not_shift_the_lists() {
    let env = Env::start().await;
    env.add_tmux("pane-1", "sh", &[]);
    for n in 0..5 {
        completed(&env, "pane-1", &format!("earlier {n}")).await;
    }
    let b = Browser::logged_in(&env.relay, SHOTS, "tester").await;
    let mut measured = Vec::new();
    for view in ["#/flights", "#/agents", "#/flight/"] {
        let id = env.ask_no_wait("pane-1", "stream here");
        env.wait_flight(&id, 60, |f| state(f) == "running").await;
        let hash = if view.ends_with('/') {
            format!("{view}{id}")
        } else {
            view.to_string()
        };
        open(&b, &env.relay, &hash).await;
        b.wait_for(if view == "#/agents" {
            "#agents tr[data-agent]"
        } else if view == "#/flights" {
            "#flights tr[data-flight]"
        } else {
            "#flight"
        })
        .await;
        b.js(OBSERVE).await;
        let (clients, each) = (16, 250);
        let rate = env
            .stream_deltas(&id, clients, each, |c, n| {
                format!("<{c}.{n}> some words of a streamed reply ")
            })
            .await;
        env.relay.cli_ok(&["reply", &id, "done"]);
        env.wait_flight(&id, 60, |f| state(f) == "completed").await;
        // Two frames after the last change, so its shift (if any) is observed.
        b.wait_js(
            "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))",
            |v| v == 1,
        )
        .await;
        let got = b
            .js("({cls: window.__cls, shifts: window.__shifts, long: window.__long})")
            .await;
        let cls = got["cls"].as_f64().unwrap();
        let long = got["long"].as_u64().unwrap();
        println!(
            "measured {view}: {} deltas at {rate:.0}/s; cumulative layout shift {cls:.4} \
             ({} shifts), {long} long tasks",
            clients * each,
            got["shifts"]
        );
        measured.push((view, cls));
        b.screenshot(&format!(
            "stream-{}",
            view.trim_matches(['#', '/']).replace('/', "-")
        ))
        .await;
    }
    // Long tasks (over 50 ms of the page's main thread) are printed, not checked: their
    // count is wall-clock time on a machine shared with the 16 posters and the broker.
    for (view, cls) in measured {
        assert!(cls < 0.1, "{view}: cumulative layout shift {cls}");
    }
}
