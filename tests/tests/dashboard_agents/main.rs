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
//!
//! Parts: `agent_page` (the agent's page and its composer), `agents` (the agents view:
//! add, wake, remove, fork), `conversations` (asking from a conversation, and ten
//! clients at once); the mock's script and the page helpers are here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_page;
mod agents;
mod conversations;

use std::time::Duration;

use relay_mock_model::{RecordedRequest, Reply, Usage};
use relay_tests::agents::{script, Env};
use relay_tests::browser::Browser;
use serde_json::json;

/// The test's name for its browser: screenshots go to `<artifacts>/dashboard_agents/`.
pub const SHOTS: &str = "dashboard_agents";
/// What the mock reports for every model call: input 1200 (300 cached), output 70 (30
/// reasoning).
pub const USAGE: (u64, u64, u64, u64) = (1200, 300, 70, 30);

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

pub async fn env() -> Env {
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
pub async fn page(env: &Env, route: &str) -> Browser {
    let b = Browser::logged_in(&env.relay, SHOTS, "tester").await;
    goto(&b, env, route).await;
    b
}

pub async fn goto(b: &Browser, env: &Env, route: &str) {
    b.goto(&format!("{}/#/{route}", env.relay.api.url)).await;
    b.wait_js("document.body.dataset.live", |v| v == "true")
        .await;
}

/// Sets the value of the form field `css` as a user's typing would end.
pub async fn fill(b: &Browser, css: &str, value: &str) {
    b.wait_for(css).await;
    b.js(&format!(
        "(() => {{ const el = document.querySelector({}); el.value = {}; el.dispatchEvent(new Event('change')); return 1; }})()",
        json!(css),
        json!(value)
    ))
    .await;
}
