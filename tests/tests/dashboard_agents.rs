//! The dashboard as a place to work with agents, in a real headless Chromium (as
//! `dashboard.rs`) against a real `relay up`, with the real pinned Codex and Claude Code
//! on the mock model:
//!
//! - an agent's page asks it from its composer and the reply streams into the page (a
//!   partial text is on the page while the page still shows the flight live), then the
//!   output replaces it, for Codex and for Claude Code; the page shows the agent's usage
//!   today (the mock's token counts, as the broker adds them up) and its budget, set and
//!   cleared from the page (and a bad limit refused with why);
//! - an agent is added from the agents view's form with a worktree of a git repository,
//!   appears, is woken (its worktree branch shown) and removed after a confirm step; a
//!   bad working directory is refused with the broker's own words; the agents view shows
//!   what each agent is doing (its current flight's task);
//! - a conversation's composer asks an agent picked by name: a "working" line shows
//!   while it runs, then the reply arrives linked to the question, and the header's
//!   count is the number of messages shown; ten HTTP clients asking through the same
//!   route at once while the page is open: every question and reply shown once, the
//!   count right, no working line left.
//!
//! Screenshots: `dashboard_agents/agents.png`, `agent-page.png`,
//! `composer-streaming.png`, `conversation.png` under the artifacts dir.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use relay_mock_model::{RecordedRequest, Reply, Usage};
use relay_tests::agents::{script, state, Env};
use relay_tests::browser::Browser;
use serde_json::{json, Value};

/// The test's name for its browser: screenshots go to `<artifacts>/dashboard_agents/`.
const SHOTS: &str = "dashboard_agents";
/// What the mock reports for every model call: input 1200 (300 cached), output 70 (30
/// reasoning).
const USAGE: (u64, u64, u64, u64) = (1200, 300, 70, 30);

/// `stream: WORDS` anywhere in the last user text streams WORDS one every 600 ms (long
/// enough for the page to show the first while the flight runs); the rest as
/// [`script`].
fn handler(req: &RecordedRequest) -> Reply {
    let text = req.last_user_text().unwrap_or_default();
    if let Some(at) = text.find("stream:") {
        let words = text[at + "stream:".len()..]
            .lines()
            .next()
            .unwrap_or("")
            .trim();
        return Reply::slow_chunks(
            words.split_inclusive(' ').map(str::to_string),
            Duration::from_millis(600),
        );
    }
    script(req)
}

async fn env() -> Env {
    let env = Env::start_with_env(
        &[],
        &[
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
        ],
    )
    .await;
    env.mock.set_handler(handler);
    let (input, cached, output, reasoning) = USAGE;
    env.mock
        .set_usage(Some(Usage::new(input, cached, output, reasoning)));
    env
}

/// A browser logged in as `tester`, live, at `#/route`.
async fn page(env: &Env, route: &str) -> Browser {
    let b = Browser::start(SHOTS).await.unwrap();
    let link = env.relay.cli_json(&["open", "--as", "tester", "--json"]);
    b.goto(link["url"].as_str().unwrap()).await;
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
    goto(&b, env, route).await;
    b
}

async fn goto(b: &Browser, env: &Env, route: &str) {
    b.goto(&format!("{}/#/{route}", env.relay.api.url)).await;
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
}

/// Sets the value of the form field `css` as a user's typing would end.
async fn fill(b: &Browser, css: &str, value: &str) {
    b.wait_for(css).await;
    b.js(&format!(
        "(() => {{ const el = document.querySelector({}); el.value = {}; el.dispatchEvent(new Event('change')); return 1; }})()",
        json!(css),
        json!(value)
    ))
    .await;
}

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

#[tokio::test(flavor = "multi_thread")]
async fn agents_are_added_with_a_worktree_woken_and_removed_from_the_page() {
    let env = env().await;
    let repo = env.work.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["config", "user.name", "Test Person"],
        &["config", "user.email", "test@localhost"],
    ] {
        git(&repo, args);
    }
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "start"]);
    env.add_agent("cx", &[]);
    let b = page(&env, "agents").await;
    b.wait_for("#agents tr[data-agent=\"cx\"]").await;

    // What an agent is doing: its current flight's task, first line.
    let busy = env.ask_no_wait("cx", "stream: one two three four five six seven eight");
    let doing = b
        .wait_text(
            &format!("#agents tr[data-agent=\"cx\"] td.doing[data-flight=\"{busy}\"] .task-line"),
            |t| t.contains("stream: one two"),
        )
        .await;
    assert!(doing.starts_with("stream: one two"), "{doing}");
    b.screenshot("agents").await;
    // The agent's name opens its page, not its replay (which stays a link).
    let hrefs = b
        .js("[...document.querySelectorAll('#agents tr[data-agent=\"cx\"] a')].map(a => a.getAttribute('href'))")
        .await;
    assert!(
        hrefs.as_array().unwrap().contains(&json!("#/agent/cx")),
        "{hrefs}"
    );
    assert!(
        hrefs
            .as_array()
            .unwrap()
            .contains(&json!("#/replay/agent/cx")),
        "{hrefs}"
    );

    // Add: a bad working directory is refused with the broker's words.
    b.click("button[data-action=\"add-agent\"]").await;
    fill(&b, "input.add-name", "wt-1").await;
    fill(&b, "select.add-harness", "codex_app_server").await;
    fill(&b, "input.add-cwd", "/no/such/dir").await;
    b.click("button[data-action=\"submit-agent\"]").await;
    let err = b.wait_text(".add-result .error", |t| !t.is_empty()).await;
    let (code, said) = env
        .relay
        .http()
        .post(
            "/v1/agents",
            &json!({"name": "wt-x", "harness": "codex_app_server", "cwd": "/no/such/dir"}),
        )
        .await;
    assert_eq!(code, 400, "{said}");
    let message = said["error"]["message"]
        .as_str()
        .unwrap()
        .replace("wt-x", "wt-1");
    assert!(
        err.contains(&message),
        "the page says {err:?}, the broker {message:?}"
    );

    // Then with a worktree of the repository, on a branch from main, pointed at the mock.
    let codex_home = format!("CODEX_HOME={}", env.codex_home.display());
    fill(&b, "input.add-cwd", &repo.display().to_string()).await;
    fill(&b, "select.add-wake", "on_demand").await;
    fill(&b, "textarea.add-env", &codex_home).await;
    b.js("(() => { const c = document.querySelector('input.add-worktree'); c.click(); return c.checked; })()")
        .await;
    fill(&b, "input.add-base", "main").await;
    b.click("button[data-action=\"submit-agent\"]").await;
    b.wait_for(".add-result a[href=\"#/agent/wt-1\"]").await;
    b.wait_for("#agents tr[data-agent=\"wt-1\"]").await;
    let added = env.agent("wt-1").await;
    assert_eq!(added["worktree"]["base"], "main", "{added}");
    assert_eq!(added["cwd"], repo.display().to_string(), "{added}");
    assert_eq!(added["wake"], "on_demand", "{added}");

    // Woken from its page: its session starts, its worktree branch is shown.
    b.click("#agents tr[data-agent=\"wt-1\"] .name a").await;
    b.wait_for("section[data-view=\"agent\"][data-agent=\"wt-1\"]")
        .await;
    b.click("button[data-action=\"wake\"]").await;
    b.wait_text("#agent-state", |t| t == "idle").await;
    let branch = b
        .wait_text("#agent-branch", |t| t.contains("relay/wt-1"))
        .await;
    assert!(branch.contains("from main"), "{branch}");
    let woke = env.agent("wt-1").await;
    assert_eq!(woke["state"], "idle", "{woke}");

    // Removed after the confirm step.
    b.click("button[data-action=\"remove\"]").await;
    assert_eq!(
        env.agent("wt-1").await["name"],
        "wt-1",
        "not before the confirmation"
    );
    b.click("button[data-action=\"confirm-remove\"]").await;
    b.wait_text(".action-result", |t| t.contains("removed"))
        .await;
    let (code, _) = env.relay.http().get("/v1/agents/wt-1").await;
    assert_eq!(code, 404);
    b.wait_text("section[data-view=\"agent\"] .error", |t| {
        t.contains("No agent wt-1")
    })
    .await;
    let removed = env.events_of("agent_removed");
    assert_eq!(removed.len(), 1, "{removed:?}");

    // Once its flight ended, the agents view says what it did last.
    env.wait_flight(&busy, 90, |f| state(f) == "completed")
        .await;
    b.click(".action-result a[href=\"#/agents\"]").await;
    b.wait_text("#agents tr[data-agent=\"cx\"] td.doing .last-task", |t| {
        t.starts_with("stream: one two")
    })
    .await;

    // Forked from its page at a flight it ran: a new agent from that flight.
    goto(&b, &env, "agent/cx").await;
    b.wait_for(&format!("select.fork-at option[value=\"{busy}\"]"))
        .await;
    fill(&b, "select.fork-at", &busy).await;
    fill(&b, "input.fork-name", "cx-fork").await;
    b.click("button[data-action=\"fork\"]").await;
    b.wait_for(".action-result a[href=\"#/agent/cx-fork\"]")
        .await;
    let fork = env.agent("cx-fork").await;
    assert_eq!(
        (
            fork["fork"]["agent"].as_str(),
            fork["fork"]["flight"].as_str()
        ),
        (Some("cx"), Some(busy.as_str())),
        "{fork}"
    );
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The messages the conversation page shows: id, body, reply_to.
const MESSAGES: &str =
    "[...document.querySelectorAll('#messages li.message')].map(li => ({id: li.dataset.message, \
    body: li.querySelector('pre.body').textContent, \
    replyTo: li.querySelector('.reply-link')?.dataset.replyTo ?? null, \
    replyText: li.querySelector('.reply-link')?.textContent ?? null}))";

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_asks_an_agent_shows_it_working_and_links_the_reply() {
    let env = env().await;
    env.add_agent("cx", &[]);
    env.add_agent("cy", &[]);
    let http = env.relay.http();
    let (code, c) = http
        .post(
            "/v1/conversations",
            &json!({"id": "channel.work", "kind": "channel"}),
        )
        .await;
    assert_eq!(code, 200, "{c}");
    let b = page(&env, "conversation/channel.work").await;
    b.wait_text("#conversation-count", |t| t == "0").await;
    b.wait_js(
        "document.querySelectorAll('select.composer-agent option').length",
        |v| v == 2,
    )
    .await;

    // Ask cx, picked by name: the question is a message here, a working line shows
    // while it runs, then the reply, linked to the question.
    fill(&b, "select.composer-agent", "cx").await;
    let task = "stream: working on it now";
    fill(&b, "textarea.composer-task", task).await;
    b.click("button[data-action=\"ask\"]").await;
    let line = b
        .wait_text("#working li.working", |t| t.contains("cx is working"))
        .await;
    assert!(
        !line.contains("null") && !line.contains("undefined"),
        "{line}"
    );
    b.screenshot("conversation").await;
    b.wait_js(
        "document.querySelectorAll('#messages li.message').length",
        |v| v == 2,
    )
    .await;
    b.wait_js("document.querySelectorAll('#working li').length", |v| {
        v == 0
    })
    .await;
    let shown = b.js(MESSAGES).await;
    let shown = shown.as_array().unwrap();
    assert_eq!(shown[0]["body"], task, "{shown:?}");
    assert_eq!(shown[1]["body"], "working on it now", "{shown:?}");
    assert_eq!(shown[1]["replyTo"], shown[0]["id"], "{shown:?}");
    let reply_text = shown[1]["replyText"].as_str().unwrap();
    assert!(
        reply_text.contains("tester@dashboard") && reply_text.contains(task),
        "{reply_text}"
    );
    b.wait_text("#conversation-count", |t| t == "2").await;
    let (_, list) = http.get("/v1/conversations").await;
    let stored = list
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "channel.work")
        .unwrap()
        .clone();
    assert_eq!(stored["message_count"], 2, "{stored}");
    // The reply link goes to the question.
    b.click(&format!(
        "#messages li[data-message=\"{}\"] .reply-link",
        shown[1]["id"].as_str().unwrap()
    ))
    .await;
    let focused = b.js("document.activeElement.dataset.message").await;
    assert_eq!(focused, shown[0]["id"]);

    // Ten clients ask through the same route at once, the page open: every question
    // and reply shown once, each reply under its question, the count right.
    let mut asks = Vec::new();
    for n in 0..10 {
        let http = http.clone();
        let target = if n % 2 == 0 { "cx" } else { "cy" };
        asks.push(tokio::spawn(async move {
            let (code, body) = http
                .post(
                    "/v1/invocations",
                    &json!({"target": target, "task": format!("many {n}"), "conversation": "channel.work"}),
                )
                .await;
            assert_eq!(code, 200, "{body}");
            body["flight"]["id"].as_str().unwrap().to_string()
        }));
    }
    let mut flights = Vec::new();
    for a in asks {
        flights.push(a.await.unwrap());
    }
    for f in &flights {
        env.wait_flight(f, 120, |f| state(f) == "completed").await;
    }
    b.wait_js(
        "document.querySelectorAll('#messages li.message').length",
        |v| v == 22,
    )
    .await;
    b.wait_js("document.querySelectorAll('#working li').length", |v| {
        v == 0
    })
    .await;
    b.wait_text("#conversation-count", |t| t == "22").await;
    let shown = b.js(MESSAGES).await;
    let shown = shown.as_array().unwrap();
    let ids: HashSet<&str> = shown.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 22, "each message once");
    for n in 0..10 {
        let question = shown
            .iter()
            .filter(|m| m["body"] == format!("many {n}"))
            .collect::<Vec<_>>();
        assert_eq!(question.len(), 1, "many {n}: {shown:?}");
        let answers = shown
            .iter()
            .filter(|m| m["replyTo"] == question[0]["id"])
            .collect::<Vec<_>>();
        assert_eq!(answers.len(), 1, "one reply to many {n}: {shown:?}");
        assert_eq!(answers[0]["body"], format!("ok: many {n}"), "{shown:?}");
    }
    let (_, list) = http.get("/v1/conversations").await;
    let stored = list
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "channel.work")
        .unwrap()
        .clone();
    assert_eq!(stored["message_count"], 22, "{stored}");
    // The conversations list says the same count.
    goto(&b, &env, "conversations").await;
    b.wait_text(
        "#conversations tr[data-conversation=\"channel.work\"] td.num",
        |t| t == "22",
    )
    .await;
}
