//! The CLIs' own file edits (not a shell command): the mock's `edit:PATH CONTENT`
//! ([`relay_mock_model::Reply::edit_file`]) makes Codex call its `apply_patch` tool (the
//! agent runs model [`CODEX_APPLY_PATCH_MODEL`], for which Codex offers it) and Claude
//! Code its `Write` tool. Each CLI asks for a file change approval, which the agent's
//! `--accept-file-changes` accepts; each reports the change as its own event while the
//! turn runs (a `file_change` item; Codex also its `turn/diff/updated` as a `diff`
//! update), recorded on the flight before its terminal state; the flight's commit on the
//! agent's branch then holds the file.

use relay_mock_model::CODEX_APPLY_PATCH_MODEL;
use relay_tests::agents::{state, Env};
use serde_json::Value;

use crate::repo::{env_with_repo, wait_commit, wait_ended, worktree_of, write_prompt, Repo};

/// The prompt that makes the scripted model write the new file `path` holding `content`
/// with the CLI's own edit tool.
fn edit_prompt(path: &str, content: &str) -> String {
    format!("edit:{}", &write_prompt(path, content)["write:".len()..])
}

/// The registration arguments: a worktree, file changes accepted by the policy.
const ARGS: [&str; 2] = ["--worktree", "--accept-file-changes"];

#[tokio::test(flavor = "multi_thread")]
async fn codex_apply_patch_shows_on_the_flight_while_it_runs_and_lands_in_its_commit() {
    let (env, repo) = env_with_repo().await;
    env.add_agent(
        "cx",
        &[&ARGS[..], &["--model", CODEX_APPLY_PATCH_MODEL]].concat(),
    );
    // Relative: apply_patch resolves it in the agent's cwd, its worktree. At the top:
    // under the read-only sandbox of the tests' Codex home, an approved patch may write
    // the file but not make a new folder ("Failed to create parent directories").
    let rel = "by-cx.txt";
    let content = "patched in\nby codex\n";
    let flight = env.ask_no_wait("cx", &edit_prompt(rel, content));
    let f = wait_ended(&env, &flight).await;
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(f["output"], format!("edited {rel}"), "{f}");
    // The tool the model called was apply_patch, a freeform tool, and it applied.
    let (calls, results) = edit_round(&env, &flight);
    assert_eq!(calls, ["custom_tool_call apply_patch"]);
    assert!(
        results[0].contains(&format!("Success. Updated the following files:\nA {rel}")),
        "{results:?}"
    );

    let updates = env.updates(&flight).await;
    let end = terminal_seq(&updates, &f);
    let items = file_change_items(&updates);
    assert!(!items.is_empty(), "no file_change item: {updates:?}");
    for item in &items {
        assert!(item["seq"].as_u64().unwrap() < end, "after the end: {item}");
    }
    // Codex's item names the file it changes.
    assert!(
        items.iter().any(|i| text(i).contains("by-cx.txt")),
        "{items:?}"
    );
    // Codex's turn/diff/updated: the turn's diff so far, the new file in it.
    let diffs: Vec<&Value> = updates.iter().filter(|u| u["kind"] == "diff").collect();
    assert!(!diffs.is_empty(), "no diff update: {updates:?}");
    for d in &diffs {
        assert!(d["seq"].as_u64().unwrap() < end, "after the end: {d}");
    }
    let last = text(diffs[diffs.len() - 1]);
    assert!(
        last.contains(rel) && last.contains("+by codex"),
        "the diff: {last}"
    );
    check_approval(&env, &flight, "by-cx.txt");
    check_commit(&env, &repo, "cx", &flight, rel, content).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_code_write_shows_on_the_flight_while_it_runs_and_lands_in_its_commit() {
    let (env, repo) = env_with_repo().await;
    env.add_claude("cl", &ARGS);
    // Write takes an absolute path: the file in the agent's worktree (made at `add`).
    let wt = worktree_of(&env, "cl").await;
    let wt = std::path::PathBuf::from(wt["path"].as_str().unwrap());
    let rel = "notes/by-cl.txt";
    let abs = wt.join(rel).display().to_string();
    let content = "written\nby claude code\n";
    let flight = env.ask_no_wait("cl", &edit_prompt(&abs, content));
    let f = wait_ended(&env, &flight).await;
    assert_eq!(state(&f), "completed", "{f}");
    assert_eq!(f["output"], format!("edited {abs}"), "{f}");
    let (calls, results) = edit_round(&env, &flight);
    assert_eq!(calls, ["tool_use Write"]);
    assert!(results[0].contains(&abs), "{results:?}");

    let updates = env.updates(&flight).await;
    let end = terminal_seq(&updates, &f);
    let items = file_change_items(&updates);
    // Started, then completed with the tool's result: both while the turn ran.
    let phases: Vec<&str> = items.iter().filter_map(|i| i["phase"].as_str()).collect();
    assert_eq!(phases, ["started", "completed"], "{items:?}");
    for item in &items {
        assert!(item["seq"].as_u64().unwrap() < end, "after the end: {item}");
    }
    let done = text(items[1]);
    assert!(done.starts_with(&format!("Write {abs}")), "{done}");
    check_approval(&env, &flight, &abs);
    check_commit(&env, &repo, "cl", &flight, rel, content).await;
}

/// The tool calls the model made in the flight's turn, as the CLI sent them back in its
/// next request (`custom_tool_call NAME` for Responses, `tool_use NAME` for Messages),
/// and the tools' results. The test's only agent made every request.
fn edit_round(env: &Env, flight: &str) -> (Vec<String>, Vec<String>) {
    let last = env
        .mock
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.tool_output_since_prompt().is_some())
        .unwrap_or_else(|| panic!("no request of flight {flight} carries a tool result"));
    let responses = last
        .input()
        .iter()
        .filter(|i| {
            matches!(
                i["type"].as_str(),
                Some("custom_tool_call" | "function_call")
            )
        })
        .map(|i| format!("{} {}", text_of(&i["type"]), text_of(&i["name"])));
    let messages = last
        .messages()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| format!("tool_use {}", text_of(&b["name"])));
    let results = last.function_call_outputs().into_iter().map(|(_, out)| out);
    (responses.chain(messages).collect(), results.collect())
}

fn text_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// An update's `text`.
fn text(update: &Value) -> &str {
    text_of(&update["text"])
}

/// The seq of the update that moved the flight to its terminal state.
fn terminal_seq(updates: &[Value], flight: &Value) -> u64 {
    let end = updates
        .iter()
        .find(|u| u["kind"] == "state" && u["to"] == flight["state"]);
    let end = end.unwrap_or_else(|| panic!("no terminal state update: {updates:?}"));
    end["seq"].as_u64().unwrap()
}

/// The flight's `file_change` item updates, in order.
fn file_change_items(updates: &[Value]) -> Vec<&Value> {
    updates
        .iter()
        .filter(|u| u["kind"] == "item" && u["item_kind"] == "file_change")
        .collect()
}

/// The flight's one approval: a file change naming `path`, accepted by the policy.
fn check_approval(env: &Env, flight: &str, path: &str) {
    let approval = env.approval_of(flight);
    assert_eq!(approval["kind"], "file_change", "{approval}");
    let detail = text_of(&approval["detail"]);
    assert!(detail.contains(path), "{approval}");
    assert_eq!(
        approval["decided_by"], "policy:accept_file_changes",
        "{approval}"
    );
    assert_eq!(approval["decision"], "accept", "{approval}");
}

/// The flight's commit on `relay/NAME` holds the new file `rel` with `content`, and
/// `flight show --json` names it; the main checkout is untouched.
async fn check_commit(env: &Env, repo: &Repo, name: &str, flight: &str, rel: &str, content: &str) {
    let f = wait_commit(env, flight, 30).await;
    let sha = f["commit"]["commit"].as_str().unwrap().to_string();
    assert_eq!(repo.head(&format!("relay/{name}")), sha, "{f}");
    assert_eq!(repo.files_of(&sha), vec![rel.to_string()]);
    assert_eq!(repo.file_at(&sha, rel), content);
    let shown = env.relay.cli_json(&["flight", "show", flight, "--json"]);
    let files: Vec<&str> = shown["commit"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    assert_eq!(files, [rel], "{shown}");
    assert_eq!(shown["commit"]["commit"], sha, "{shown}");
    assert!(!repo.path.join(rel).exists(), "the main checkout has it");
    assert_eq!(repo.status(), "");
}
