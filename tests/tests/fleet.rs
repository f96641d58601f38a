//! Claude Code and Pi agents end to end, as first-class as Codex: a real `relay up`, the
//! REAL pinned `claude` and `pi` CLIs, and the one mock model server (Anthropic
//! Messages for both). Then a mixed fleet of all three harnesses at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_mock_model::all_input_text;
use relay_tests::agents::{state, Env};
use relay_tests::procs::{self, group_members, signal, Signal};
use relay_tests::wait_until;
use serde_json::Value;

/// How long a CLI may take to exit once its broker or agent is gone.
const EXIT: Duration = Duration::from_secs(15);

fn item_kinds(updates: &[Value], phase: &str) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["kind"] == "item" && u["phase"] == phase)
        .map(|u| u["item_kind"].as_str().unwrap_or("").to_string())
        .collect()
}

async fn session_id(env: &Env, agent: &str) -> String {
    env.agent(agent).await["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("agent {agent} has no session_id"))
        .to_string()
}

/// A slow text turn streams its deltas while the flight runs, ends with the whole
/// text, and the next turn carries the first to the model.
async fn text_turns(env: &Env, agent: &str) {
    let text = "alpha beta gamma delta epsilon zeta eta theta";
    let id = env.ask_no_wait(agent, &format!("slow: {text}"));
    env.wait_delta(&id).await;
    // Seven more words are 1.75 s away: the flight is still running.
    assert_eq!(state(&env.flight(&id).await), "running");
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert_eq!(f["output"], text);
    let updates = env.updates(&id).await;
    let deltas: String = updates
        .iter()
        .filter(|u| u["kind"] == "delta")
        .map(|u| u["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text);
    assert!(
        updates.iter().position(|u| u["kind"] == "delta").unwrap()
            < updates.iter().position(|u| u["to"] == "completed").unwrap()
    );
    assert!(item_kinds(&updates, "completed").contains(&"agent_message".to_string()));

    let out = env.relay.cli_ok(&["ask", agent, "what did I say?"]);
    assert_eq!(out.trim(), "ok: what did I say?");
    let input = all_input_text(&env.mock.requests().last().cloned().unwrap());
    assert!(input.contains(&format!("slow: {text}")), "{input}");
    assert!(input.contains(&format!("\n{text}")), "{input}");
}

/// The CLI child killed mid-turn fails the flight with its end and stderr tail; the
/// next ask resumes the same session. Then `kill -9` of the broker and a restart: the
/// same session again, and the model gets the earlier turns.
async fn survives_kills(env: &mut Env, agent: &str, program: &str) {
    let out = env
        .relay
        .cli_ok(&["ask", agent, "remember the word pelican"]);
    assert_eq!(out.trim(), "ok: remember the word pelican");
    let session = session_id(env, agent).await;
    env.wait_session_saved(&session, "remember the word pelican")
        .await;

    let id = env.ask_no_wait(agent, "hang here");
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    let child = env.codex_pid(agent).await;
    // The request reached the model: the turn is really in progress.
    wait_until("the hanging request", Duration::from_secs(30), || async {
        env.mock
            .requests()
            .iter()
            .any(|r| r.last_user_text().as_deref() == Some("hang here"))
            .then_some(())
    })
    .await;
    signal(child, Signal::KILL);
    let f = env.wait_flight(&id, 30, |f| state(f) == "failed").await;
    let reason = f["error"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("{program} was killed by signal 9 mid-turn")),
        "{reason}"
    );
    assert!(!reason.contains('\x1b'), "terminal escapes in {reason:?}");

    let out = env.relay.cli(&["ask", agent, "after the crash"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok: after the crash"
    );
    assert_eq!(session_id(env, agent).await, session);
    let input = all_input_text(&env.mock.requests().last().cloned().unwrap());
    assert!(input.contains("remember the word pelican"), "{input}");

    let child = env.codex_pid(agent).await;
    env.relay.kill9();
    assert!(
        procs::wait_gone(child, EXIT).await,
        "{program} {child} outlived relay"
    );
    assert_eq!(group_members(child), Vec::<u32>::new());
    env.relay.restart().unwrap();
    assert_eq!(session_id(env, agent).await, session);
    let out = env.relay.cli_ok(&["ask", agent, "which word?"]);
    assert_eq!(out.trim(), "ok: which word?");
    assert_eq!(session_id(env, agent).await, session);
    let input = all_input_text(&env.mock.requests().last().cloned().unwrap());
    assert!(input.contains("remember the word pelican"), "{input}");
    assert!(input.contains("ok: after the crash"), "{input}");
    // No loss was recorded along the way.
    let events = env.relay.cli_json(&["events", "--json", "-n", "1000"]);
    assert!(
        !events.to_string().contains("thread_lost"),
        "a session was lost: {events}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_text_turns_stream_and_carry_history() {
    let env = Env::start().await;
    env.add_claude("claude-1", &[]);
    text_turns(&env, "claude-1").await;
    let agent = env.agent("claude-1").await;
    assert!(agent["thread_id"].is_null(), "{agent}");
    let session = session_id(&env, "claude-1").await;
    let shown = env.relay.cli_ok(&["agent", "show", "claude-1"]);
    assert!(shown.contains(&format!("session   {session}")), "{shown}");
    assert!(shown.contains("approvals asks before"), "{shown}");
    assert!(shown.contains("steer     no"), "{shown}");
    // A steer is refused up front, with the reason.
    let id = env.ask_no_wait("claude-1", "slow: one two three four five six");
    env.wait_delta(&id).await;
    let out = env.relay.cli(&["steer", &id, "more"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("steer"), "{err}");
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_approvals_accepted_declined_by_policy_and_interrupt() {
    let env = Env::start().await;
    env.add_claude("claude-1", &[]);
    env.add_claude("claude-2", &["--auto-accept", "touch *"]);
    // Claude Code runs read-only commands (`echo hi`) without asking; one that writes
    // asks first.

    // Accepted by a person: the command runs, as an item, and the turn goes on.
    let id = env.ask_no_wait("claude-1", "exec: touch approved");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let a = env.approval_of(&id);
    assert_eq!(
        (a["kind"].as_str(), a["state"].as_str()),
        (Some("command"), Some("pending"))
    );
    // The whole command as it will run: Claude's Bash tool runs it with bash -c.
    assert_eq!(a["detail"], "bash -c 'touch approved'", "{a}");
    assert!(!env.work.join("approved").exists());
    env.relay
        .cli_ok(&["approve", a["id"].as_str().unwrap(), "accept"]);
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(
        f["output"].as_str().unwrap().starts_with("outputs: "),
        "{f}"
    );
    assert!(env.work.join("approved").exists());
    let updates = env.updates(&id).await;
    assert!(item_kinds(&updates, "started").contains(&"command_execution".to_string()));
    assert!(item_kinds(&updates, "completed").contains(&"command_execution".to_string()));
    let d = env.approval_of(&id);
    assert_eq!(
        (d["decision"].as_str(), d["decided_by"].as_str()),
        (Some("accept"), Some("operator"))
    );

    // Declined: the command does not run; the model is told.
    let id = env.ask_no_wait("claude-1", "exec: touch declined");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let a = env.approval_of(&id);
    env.relay
        .cli_ok(&["approve", a["id"].as_str().unwrap(), "decline"]);
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let output = f["output"].as_str().unwrap();
    assert!(output.contains("declined through Relay"), "{output}");
    assert!(!env.work.join("declined").exists());
    let d = env.approval_of(&id);
    assert_eq!(
        (d["decision"].as_str(), d["decided_by"].as_str()),
        (Some("decline"), Some("operator"))
    );

    // Decided by the agent's policy, recorded as such.
    let id = env.ask_no_wait("claude-2", "exec: touch policy-ok");
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(env.work.join("policy-ok").exists());
    let p = env.approval_of(&id);
    assert_eq!(
        (p["decision"].as_str(), p["decided_by"].as_str()),
        (Some("accept"), Some("policy:auto-accept:touch *"))
    );
    // What only looks allowed waits for a person.
    let id = env.ask_no_wait("claude-2", "exec: touch ok; touch pwned");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let a = env.approval_of(&id);
    assert_eq!(a["detail"], "bash -c 'touch ok; touch pwned'", "{a}");
    env.relay
        .cli_ok(&["approve", a["id"].as_str().unwrap(), "decline"]);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(!env.work.join("pwned").exists());

    // Interrupt mid-stream; the session then takes another turn.
    let id = env.ask_no_wait("claude-1", "slow: one two three four five six seven eight");
    env.wait_delta(&id).await;
    env.relay.cli_ok(&["interrupt", &id]);
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(
        (state(&f), f["error"].as_str()),
        ("cancelled", Some("interrupted"))
    );
    let out = env.relay.cli_ok(&["ask", "claude-1", "still there?"]);
    assert_eq!(out.trim(), "ok: still there?");
}

#[tokio::test(flavor = "multi_thread")]
async fn claude_session_survives_a_killed_child_and_kill_9_of_the_broker() {
    let mut env = Env::start().await;
    env.add_claude("claude-1", &[]);
    survives_kills(&mut env, "claude-1", "claude -p (stream-json)").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pi_text_turns_tools_without_approval_steer_and_abort() {
    let env = Env::start().await;
    env.add_pi("pi-1", &[]);
    text_turns(&env, "pi-1").await;

    // Pi runs its tools at once: an item, no approval, the output back to the model.
    let id = env.ask_no_wait("pi-1", "exec: echo from-pi");
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(f["output"].as_str().unwrap().contains("from-pi"), "{f}");
    let updates = env.updates(&id).await;
    assert!(item_kinds(&updates, "completed").contains(&"command_execution".to_string()));
    assert!(!updates.iter().any(|u| u["to"] == "waiting"));
    // Nothing to approve, and `relay approve` says why.
    let out = env.relay.cli(&["approve", &id, "accept"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("runs pi_rpc, which has no approval step"),
        "{err}"
    );
    let shown = env.relay.cli_ok(&["agent", "show", "pi-1"]);
    assert!(
        shown.contains("approvals none: pi_rpc has no approval step"),
        "{shown}"
    );

    // Steer mid-turn: recorded, and the model gets the text within the turn.
    let id = env.ask_no_wait("pi-1", "slow: a b c d e f");
    env.wait_delta(&id).await;
    env.relay.cli_ok(&["steer", &id, "also mention zebras"]);
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let updates = env.updates(&id).await;
    assert!(updates
        .iter()
        .any(|u| u["kind"] == "note" && u["text"] == "steered: also mention zebras"));
    assert!(
        env.mock
            .requests()
            .iter()
            .any(|r| all_input_text(r).contains("also mention zebras")),
        "no model request carried the steer text; flight: {f}"
    );

    // Abort a request that never ends; the session then takes another turn.
    let id = env.ask_no_wait("pi-1", "hang forever");
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    wait_until("the hanging request", Duration::from_secs(30), || async {
        env.mock
            .requests()
            .iter()
            .any(|r| r.last_user_text().as_deref() == Some("hang forever"))
            .then_some(())
    })
    .await;
    env.relay.cli_ok(&["interrupt", &id]);
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(
        (state(&f), f["error"].as_str()),
        ("cancelled", Some("interrupted"))
    );
    let out = env.relay.cli_ok(&["ask", "pi-1", "still there?"]);
    assert_eq!(out.trim(), "ok: still there?");
}

#[tokio::test(flavor = "multi_thread")]
async fn pi_session_survives_a_killed_child_and_kill_9_of_the_broker() {
    let mut env = Env::start().await;
    env.add_pi("pi-1", &[]);
    survives_kills(&mut env, "pi-1", "pi --mode rpc").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mixed_fleet_answers_in_parallel_each_with_its_own_session() {
    let mut env = Env::start().await;
    let agents = [
        ("codex-1", "codex_app_server"),
        ("codex-2", "codex_app_server"),
        ("claude-1", "claude_stream_json"),
        ("claude-2", "claude_stream_json"),
        ("pi-1", "pi_rpc"),
        ("pi-2", "pi_rpc"),
    ];
    for (name, harness) in agents {
        match harness {
            "codex_app_server" => env.add_agent(name, &[]),
            "claude_stream_json" => env.add_claude(name, &[]),
            _ => env.add_pi(name, &[]),
        }
    }
    // Two rounds of slow turns, all agents at once.
    for round in 0..2 {
        let ids: Vec<(&str, String)> = agents
            .iter()
            .map(|(n, _)| {
                (
                    *n,
                    env.ask_no_wait(n, &format!("slow: {n} round {round} a b c")),
                )
            })
            .collect();
        for (n, id) in &ids {
            let f = env
                .wait_flight(id, 120, |f| ["completed", "failed"].contains(&state(f)))
                .await;
            assert_eq!(state(&f), "completed", "{f}");
            assert_eq!(f["output"], format!("{n} round {round} a b c"));
        }
    }
    // Every agent's second turn carried its own first turn, and nobody else's.
    for (n, _) in agents {
        let req = env
            .mock
            .requests()
            .into_iter()
            .rev()
            .find(|r| r.last_user_text().as_deref() == Some(&format!("slow: {n} round 1 a b c")))
            .unwrap();
        let input = all_input_text(&req);
        assert!(input.contains(&format!("{n} round 0")), "{n}: {input}");
        for (other, _) in agents.iter().filter(|(o, _)| *o != n) {
            assert!(
                !input.contains(&format!("{other} round")),
                "{n} saw {other}"
            );
        }
    }
    let mut sessions = std::collections::HashSet::new();
    let mut pids = Vec::new();
    for (n, harness) in agents {
        let a = env.agent(n).await;
        assert_eq!(a["harness"], harness);
        sessions.insert(a["session_id"].as_str().unwrap().to_string());
        pids.push(a["endpoint"]["pid"].as_u64().unwrap() as u32);
    }
    assert_eq!(
        sessions.len(),
        agents.len(),
        "every agent has its own session"
    );
    let status = env.relay.terminate().unwrap();
    assert!(status.success());
    for pid in pids {
        assert!(!procs::alive(pid), "{pid} left running after shutdown");
        assert_eq!(group_members(pid), Vec::<u32>::new(), "left in group {pid}");
    }
}
