//! The flight page in a real headless Chromium, served by a real `relay up`, with the
//! real pinned Codex CLI and Claude Code against the mock model:
//!
//! - the task is at the top with who asked; the reply is rendered Markdown, shown once,
//!   and a hostile reply (`<script>`, `<img onerror>`, a javascript: link, terminal
//!   escapes) stays inert on the page;
//! - steering a running Codex flight from the page reaches the model (its next request
//!   carries the steer text); Claude Code, which cannot be steered, shows the refusal;
//! - a follow-up from an ended flight's page is a new flight of the same agent in the
//!   same session (the same thread or session id; the model sees the earlier turn);
//! - a command (accepted inline on the page) shows its command line, its output and its
//!   exit status; a flight that wrote two files in an agent's worktree shows its
//!   commit's diff file by file, with added lines marked.
//!
//! Screenshots: `dashboard_flight/` under `target/test-artifacts/` (the reply, the steer
//! box, a flight with its diff).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "workspace/repo.rs"]
mod repo;

use relay_mock_model::{RecordedRequest, Reply};
use relay_tests::agents::{self, state, Env};
use relay_tests::browser::Browser;
use serde_json::{json, Value};

/// A reply in Markdown with hostile parts; `REPLY-MARK` appears once in it.
const REPLY: &str =
    "## Result heading\n\nHere is **bold**, a [safe link](https://example.com/docs) \
and a [bad link](javascript:window.__pwned=3).\n\n- item one\n- item two\n\n\
<script>window.__pwned = 1</script> <img src=x onerror=\"window.__pwned=2\">\n\n\
`code` and \u{1b}[31mred\u{1b}[0m REPLY-MARK";

/// The agents' script, and `markdown...`: the Markdown reply above.
fn script(req: &RecordedRequest) -> Reply {
    let text = req.last_user_text().unwrap_or_default();
    if text.starts_with("markdown") {
        return Reply::text(REPLY);
    }
    agents::script(req)
}

async fn env() -> Env {
    let env = Env::start().await;
    env.mock.set_handler(script);
    env
}

/// Opens flight `id`'s page and waits for it to show that flight.
async fn open_flight(b: &Browser, env: &Env, id: &str) {
    b.goto(&format!("{}/#/flight/{id}", env.relay.api.url))
        .await;
    b.wait_for(&format!("#flight[data-flight=\"{id}\"]")).await;
}

async fn wait_state(b: &Browser, want: &str) {
    b.wait_js("document.querySelector('#flight')?.dataset.state", |v| {
        v == want
    })
    .await;
}

/// Types `text` into the box of the control `action` and sends it with Enter.
async fn send(b: &Browser, action: &str, text: &str) {
    b.click(&format!("form[data-action=\"{action}\"] input"))
        .await;
    b.key(text).await;
    b.key(&fantoccini::key::Key::Enter.to_string()).await;
}

/// The reply on the page: rendered once, Markdown, nothing active, escapes shown.
async fn reply_is_rendered_once_and_inert(b: &Browser) {
    b.wait_text("#flight-text", |t| t.contains("REPLY-MARK"))
        .await;
    let seen = b
        .js(r#"(() => {
            const page = document.querySelector('#flight');
            const reply = document.querySelector('#flight-text');
            return {
              marks: page.textContent.split('REPLY-MARK').length - 1,
              h2: reply.querySelector('h2')?.textContent,
              strong: reply.querySelector('strong')?.textContent,
              items: [...reply.querySelectorAll('ul > li')].map((li) => li.textContent),
              hrefs: [...page.querySelectorAll('#flight-text [href]')].map((a) => a.getAttribute('href')),
              rel: reply.querySelector('a[href]')?.getAttribute('rel'),
              active: document.querySelectorAll('script:not([src]), #flight img, #flight iframe').length,
              on: [...page.querySelectorAll('*')].filter((e) => [...e.attributes].some((a) => /^on/i.test(a.name))).length,
              ctl: [...reply.querySelectorAll('.ctl')].map((s) => s.textContent),
              shownScript: reply.textContent.includes('<script>window.__pwned = 1</script>'),
              pwned: window.__pwned ?? 0,
            };
        })()"#)
        .await;
    assert_eq!(seen["marks"], 1, "the reply is shown once: {seen}");
    assert_eq!(seen["h2"], "Result heading", "{seen}");
    assert_eq!(seen["strong"], "bold", "{seen}");
    assert_eq!(seen["items"], json!(["item one", "item two"]), "{seen}");
    assert_eq!(seen["hrefs"], json!(["https://example.com/docs"]), "{seen}");
    assert_eq!(seen["rel"], "noopener noreferrer", "{seen}");
    assert_eq!(seen["active"], 0, "{seen}");
    assert_eq!(seen["on"], 0, "{seen}");
    assert_eq!(seen["ctl"], json!(["\\x1b", "\\x1b"]), "{seen}");
    assert_eq!(seen["shownScript"], true, "{seen}");
    assert_eq!(seen["pwned"], 0, "{seen}");
}

/// Follows up on the ended flight `first` from its page: the new flight's id, once it
/// completed, after checking that the model saw the earlier turn.
async fn follow_up(b: &Browser, env: &Env, first: &str, earlier: &str) -> Value {
    let task = "follow-up FOLLOW-MARK";
    send(b, "follow-up", task).await;
    // The page moves to the new flight, which shows its task.
    let next = b
        .wait_js("location.hash", |v| {
            v.as_str()
                .is_some_and(|h| h.starts_with("#/flight/") && !h.ends_with(first))
        })
        .await;
    let next = next
        .as_str()
        .unwrap()
        .trim_start_matches("#/flight/")
        .to_string();
    b.wait_for(&format!("#flight[data-flight=\"{next}\"]"))
        .await;
    b.wait_text("#flight-task .task", |t| t.contains("FOLLOW-MARK"))
        .await;
    // Who asked, as the log has it (`tester@dashboard` once the broker records the
    // login as the requester of what the page asks).
    let asked = env.relay.cli_json(&["replay", "flight", &next, "--json"]);
    let who = b.text("#flight-task .requester").await;
    assert_eq!(who, asked["invocation"]["requester"].as_str().unwrap());
    let f = env
        .wait_flight(&next, 60, |f| state(f) == "completed")
        .await;
    assert_eq!(f["agent"], env.flight(first).await["agent"]);
    wait_state(b, "completed").await;
    // The model got the earlier turn with the follow-up: the same session goes on.
    let asked = env.mock.requests_prompted("FOLLOW-MARK");
    assert!(!asked.is_empty());
    assert!(
        asked.iter().any(|r| r.carries(earlier)),
        "the follow-up's request does not carry the earlier turn"
    );
    f
}

#[tokio::test(flavor = "multi_thread")]
async fn codex_flight_page_renders_the_reply_once_steers_and_follows_up() {
    let env = env().await;
    env.add_agent("cx-1", &[]);
    let b = Browser::logged_in(&env.relay, "dashboard_flight", "tester").await;

    // The reply: Markdown, once, inert.
    let id = env.ask_no_wait("cx-1", "markdown please FIRST-MARK");
    open_flight(&b, &env, &id).await;
    b.wait_text("#flight-task .task", |t| t.contains("FIRST-MARK"))
        .await;
    wait_state(&b, "completed").await;
    reply_is_rendered_once_and_inert(&b).await;
    b.screenshot("codex-reply").await;

    // A follow-up continues the session: the same Codex thread.
    let first = env.flight(&id).await;
    let next = follow_up(&b, &env, &id, "FIRST-MARK").await;
    assert!(first["thread_id"].is_string(), "{first}");
    assert_eq!(next["thread_id"], first["thread_id"], "{next}");

    // Steering a running flight from the page reaches the model.
    let id = env.ask_no_wait("cx-1", "slow: s1 s2 s3 s4 s5 s6 s7 s8 s9 s10 s11 s12");
    open_flight(&b, &env, &id).await;
    b.wait_text("#flight-text", |t| t.contains("s2")).await;
    b.click("form[data-action=\"steer\"] input").await;
    b.key("also mention zebras").await;
    b.screenshot("composer-steer").await;
    b.key(&fantoccini::key::Key::Enter.to_string()).await;
    b.wait_text("form[data-action=\"steer\"] .result", |t| {
        t.contains("Sent")
    })
    .await;
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(
        env.mock
            .requests()
            .iter()
            .any(|r| r.carries("also mention zebras")),
        "no model request carried the steer text: {f}"
    );
    // Ended: no steer nor interrupt, a follow-up box instead.
    wait_state(&b, "completed").await;
    let shown = b
        .js("['steer', 'interrupt', 'follow-up'].map((a) => !document.querySelector(`form[data-action=\"${a}\"]`).hidden)")
        .await;
    assert_eq!(shown, json!([false, false, true]));
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_flight_page_renders_the_reply_once_refuses_a_steer_and_follows_up() {
    let env = env().await;
    env.add_claude("cc-1", &[]);
    let b = Browser::logged_in(&env.relay, "dashboard_flight", "tester").await;

    let id = env.ask_no_wait("cc-1", "markdown please FIRST-MARK");
    open_flight(&b, &env, &id).await;
    wait_state(&b, "completed").await;
    reply_is_rendered_once_and_inert(&b).await;
    let first = env.flight(&id).await;
    let session = env.agent("cc-1").await["session_id"].clone();
    assert!(session.is_string(), "{first}");
    follow_up(&b, &env, &id, "FIRST-MARK").await;
    assert_eq!(env.agent("cc-1").await["session_id"], session);

    // Claude Code cannot be steered: the page says why, and the flight goes on.
    let id = env.ask_no_wait("cc-1", "slow: c1 c2 c3 c4 c5 c6 c7 c8 c9 c10");
    open_flight(&b, &env, &id).await;
    b.wait_text("#flight-text", |t| t.contains("c2")).await;
    send(&b, "steer", "more please").await;
    let err = b
        .wait_text("form[data-action=\"steer\"] .error", |t| {
            t.contains("steer")
        })
        .await;
    assert!(!err.is_empty());
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_shows_output_and_exit_status_and_two_files_show_a_diff_each() {
    let env = Env::start_with_env(&[], repo::GIT_ENV).await;
    env.mock.set_handler(script);
    let _repo = repo::Repo::init(&env.work);
    env.add_agent("cx-w", &["--worktree"]);
    let b = Browser::logged_in(&env.relay, "dashboard_flight", "tester").await;

    let cmd = "printf 'one\\n' > a.txt && printf 'two\\nthree\\n' > b.txt && echo wrote-both";
    let id = env.ask_no_wait("cx-w", &format!("exec: {cmd}"));
    open_flight(&b, &env, &id).await;
    // Codex asks: accepted inline, on the flight's page.
    let a = env.wait_approval(&id).await;
    let item = format!(
        "#flight li[data-approval=\"{}\"]",
        a["id"].as_str().unwrap()
    );
    b.click(&format!("{item} button.accept")).await;
    env.wait_flight(&id, 90, |f| {
        state(f) == "completed" && f["commit"]["head"].is_string()
    })
    .await;
    wait_state(&b, "completed").await;

    // The command: its line, its output, its exit status as the record has it.
    let cmd_item = "#flight-items li[data-kind=\"command_execution\"]";
    b.wait_text(&format!("{cmd_item} .item-output"), |t| {
        t.contains("wrote-both")
    })
    .await;
    let line = b.text(&format!("{cmd_item} .command")).await;
    assert!(line.contains("printf"), "{line}");
    let updates = env.updates(&id).await;
    let exit = updates
        .iter()
        .find(|u| {
            u["kind"] == "item"
                && u["item_kind"] == "command_execution"
                && u["phase"] == "completed"
        })
        .map(|u| u["exit_code"].clone())
        .unwrap();
    let shown = b
        .wait_js(
            &format!("document.querySelector('{cmd_item} .exit')?.dataset.exit"),
            |v| v.is_string(),
        )
        .await;
    // Codex reports every command's exit code; the page shows the recorded one.
    assert_eq!(exit.as_i64(), Some(0), "{updates:?}");
    assert_eq!(shown, "0");

    // The diff, file by file.
    b.wait_for("#flight-diff details.diff-file[data-file=\"b.txt\"]")
        .await;
    let files = b
        .js(
            r#"[...document.querySelectorAll('#flight-diff details.diff-file')].map((d) => ({
            file: d.dataset.file,
            open: d.open,
            added: [...d.querySelectorAll('.diff-line.add')].map((l) => l.textContent),
            removed: d.querySelectorAll('.diff-line.del').length,
        }))"#,
        )
        .await;
    assert_eq!(
        files,
        json!([
            {"file": "a.txt", "open": true, "added": ["+one"], "removed": 0},
            {"file": "b.txt", "open": true, "added": ["+two", "+three"], "removed": 0},
        ])
    );
    b.js("document.querySelector('#flight-items').scrollIntoView()")
        .await;
    b.screenshot("flight-with-diff").await;
}
