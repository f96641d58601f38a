//! The agents view: what each agent does, add (with a worktree), wake, remove, fork.

use relay_tests::agents::state;
use serde_json::json;

use crate::{env, fill, goto, page};

#[tokio::test(flavor = "multi_thread")]
async fn agents_are_added_with_a_worktree_woken_and_removed_from_the_page() {
    let env = env().await;
    let repo = env.work.join("repo");
    relay_tests::git::repo(&repo);
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

    // Busy while a flight of its runs its turn, idle after: derived from the flights (the
    // page from the live flights it holds, the API from the broker's), never stored.
    let hang = env.ask_no_wait("cx", "hang until interrupted");
    env.wait_flight(&hang, 90, |f| state(f) == "running").await;
    goto(&b, &env, "agents").await;
    let cell = "#agents tr[data-agent=\"cx\"] td.state";
    b.wait_text(cell, |t| t == "busy").await;
    assert_eq!(env.agent("cx").await["state"], "busy");
    let (code, said) = env
        .relay
        .http()
        .post(&format!("/v1/flights/{hang}/interrupt"), &json!({}))
        .await;
    assert!((200..300).contains(&code), "{code} {said}");
    env.wait_flight(&hang, 90, |f| state(f) == "cancelled")
        .await;
    b.wait_text(cell, |t| t == "idle").await;
    assert_eq!(env.agent("cx").await["state"], "idle");
    let stored: Vec<_> = env
        .events_of("agent_updated")
        .into_iter()
        .filter(|e| e["agent"]["state"] == "busy")
        .collect();
    assert_eq!(stored, Vec::<serde_json::Value>::new());
}
