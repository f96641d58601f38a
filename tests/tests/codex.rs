//! The codex plane end to end: a real `relay up`, the REAL pinned `codex app-server`, and
//! the mock Responses server. Each test has its own data dir, CODEX_HOME and mock.
//!
//! Over 600 lines: the codex plane's end-to-end specification, one test per behaviour.
//! The shared set-up lives in `relay_tests`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use relay_mock_model::all_input_text;
use relay_tests::agents::{state, Env};
use relay_tests::procs::{self, group_members, signal, Signal};
use relay_tests::wait_until;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread")]
async fn a_text_turn_streams_deltas_as_flight_updates_and_replies() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let id = env.ask_no_wait("codex-1", "slow: alpha beta gamma delta epsilon");

    // Follow the flight live; when the first delta arrives the flight is still running.
    let client = env.client();
    let mut seen: Vec<Value> = Vec::new();
    let mut state_at_first_delta = None;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let stream_id = id.clone();
    let follower = tokio::spawn(async move {
        client
            .sse(&["v1", "flights", &stream_id, "stream"], &[], |_, data| {
                tx.send(serde_json::from_str::<Value>(data).unwrap())
                    .is_ok()
            })
            .await
            .unwrap();
    });
    while let Some(u) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("updates stopped")
    {
        if u["kind"] == "delta" && state_at_first_delta.is_none() {
            state_at_first_delta = Some(state(&env.flight(&id).await).to_string());
        }
        seen.push(u);
    }
    follower.await.unwrap();
    assert_eq!(state_at_first_delta.as_deref(), Some("running"));

    // Every update, in order, gap-free; the stream ends with the completion.
    let seqs: Vec<u64> = seen.iter().map(|u| u["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let deltas: Vec<&str> = seen
        .iter()
        .filter(|u| u["kind"] == "delta")
        .map(|u| u["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        deltas,
        vec!["alpha ", "beta ", "gamma ", "delta ", "epsilon"]
    );
    let last = seen.last().unwrap();
    assert_eq!(
        (last["kind"].as_str(), last["to"].as_str()),
        (Some("state"), Some("completed"))
    );
    // The stored updates are the same as the streamed ones.
    assert_eq!(env.updates(&id).await, seen);

    let flight = env.flight(&id).await;
    assert_eq!(state(&flight), "completed");
    assert_eq!(flight["output"], "alpha beta gamma delta epsilon");
    let thread = env.agent("codex-1").await["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(flight["thread_id"], thread.as_str());

    // The reply is in the conversation, linked to the request.
    let msgs = env
        .relay
        .cli_json(&["read", "direct.codex-1.operator", "--json"]);
    let msgs = msgs.as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0]["body"], "slow: alpha beta gamma delta epsilon");
    assert_eq!(msgs[1]["author"], "codex-1");
    assert_eq!(msgs[1]["body"], "alpha beta gamma delta epsilon");
    assert_eq!(msgs[1]["reply_to"], msgs[0]["id"]);
    assert_eq!(msgs[1]["meta"]["flight"], id.as_str());
    assert_eq!(msgs[1]["meta"]["invocation"], flight["invocation"]);
    assert_eq!(msgs[1]["meta"]["harness"], "codex_app_server");
    assert_eq!(msgs[1]["meta"]["thread_id"], thread.as_str());

    // `relay ask` prints the reply and exits 0; --json prints the final flight.
    let out = env.relay.cli(&["ask", "codex-1", "say hi"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok: say hi");
    let f = env.relay.cli_json(&["ask", "codex-1", "--json", "again"]);
    assert_eq!(
        (f["state"].as_str(), f["agent"].as_str()),
        (Some("completed"), Some("codex-1"))
    );
    assert_eq!(f["output"], "ok: again");
}

/// How long a codex may take to exit once its broker or agent is gone.
const EXIT: Duration = Duration::from_secs(15);

/// `kill -9` of the broker, then a start on the same data dir. The orphaned codex sees
/// its stdin close and exits before: nothing is left running.
async fn kill9_and_restart(env: &mut Env, codex: u32) {
    env.relay.kill9();
    assert!(
        procs::wait_gone(codex, EXIT).await,
        "codex {codex} outlived relay"
    );
    env.relay.restart().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_the_agent_continues_the_same_thread() {
    let mut env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let out = env
        .relay
        .cli_ok(&["ask", "codex-1", "remember the word pelican"]);
    assert_eq!(out.trim(), "ok: remember the word pelican");
    let thread = env.agent("codex-1").await["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    let codex = env.codex_pid("codex-1").await;

    kill9_and_restart(&mut env, codex).await;
    let agent = env.agent("codex-1").await;
    assert_eq!(agent["thread_id"], thread.as_str());
    // Its session died with the old process: offline, no stale pid.
    assert_eq!(
        (agent["state"].as_str(), agent["endpoint"].is_null()),
        (Some("offline"), true),
        "{agent}"
    );

    let out = env.relay.cli_ok(&["ask", "codex-1", "which word?"]);
    assert_eq!(out.trim(), "ok: which word?");
    assert_eq!(env.agent("codex-1").await["thread_id"], thread.as_str());
    let last = env.mock.requests().last().cloned().unwrap();
    let input = all_input_text(&last);
    assert!(input.contains("remember the word pelican"), "{input}");
    assert!(input.contains("ok: remember the word pelican"), "{input}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_mid_turn_leaves_no_flight_running() {
    let mut env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let id = env.ask_no_wait("codex-1", "hang on");
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    let codex = env.codex_pid("codex-1").await;
    kill9_and_restart(&mut env, codex).await;
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(state(&f), "failed");
    let reason = f["error"].as_str().unwrap();
    assert!(
        reason.contains("relay stopped while this flight was running"),
        "{reason}"
    );
    // The agent still works, on the same thread.
    let out = env.relay.cli_ok(&["ask", "codex-1", "still there?"]);
    assert_eq!(out.trim(), "ok: still there?");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_codex_fails_the_flight_and_the_next_ask_resumes_the_thread() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    env.relay.cli_ok(&["ask", "codex-1", "first words"]);
    let thread = env.agent("codex-1").await["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    let id = env.ask_no_wait("codex-1", "hang here");
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    let codex = env.codex_pid("codex-1").await;
    signal(codex, Signal::KILL);
    let f = env.wait_flight(&id, 30, |f| state(f) == "failed").await;
    let reason = f["error"].as_str().unwrap();
    assert!(reason.contains("killed by signal 9"), "{reason}");
    // Codex always writes a few lines on stderr at start (its log, sandbox warnings).
    assert!(reason.contains("stderr tail:\n"), "{reason}");
    assert!(!reason.contains('\x1b'), "terminal escapes in {reason:?}");

    let out = env.relay.cli(&["ask", "codex-1", "after the crash"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok: after the crash"
    );
    let agent = env.agent("codex-1").await;
    assert_eq!(agent["thread_id"], thread.as_str());
    assert_ne!(agent["endpoint"]["pid"].as_u64(), Some(codex as u64));
    let input = all_input_text(&env.mock.requests().last().cloned().unwrap());
    assert!(input.contains("first words"), "{input}");
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_cancels_and_steer_reaches_the_model() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    // Interrupt a slow stream.
    let id = env.ask_no_wait("codex-1", "slow: one two three four five six seven eight");
    env.wait_delta(&id).await;
    env.relay.cli_ok(&["interrupt", &id]);
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(state(&f), "cancelled");
    assert_eq!(f["error"], "interrupted");
    let out = env.relay.cli(&["interrupt", &id]);
    assert!(
        !out.status.success(),
        "interrupting an ended flight is an error"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("flight_terminal"));

    // Steer a slow stream: accepted, recorded, and the model gets the text.
    let id = env.ask_no_wait("codex-1", "slow: a b c d e f");
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
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_accepted_declined_and_by_policy() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    env.add_agent("codex-2", &["--auto-accept", "echo *"]);

    // Accepted by a person: the command runs and its output goes back to the model.
    let id = env.ask_no_wait("codex-1", "exec: echo relay-approved");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let a = env.approval_of(&id);
    assert_eq!(
        (a["kind"].as_str(), a["state"].as_str()),
        (Some("command"), Some("pending"))
    );
    assert!(a["detail"]
        .as_str()
        .unwrap()
        .contains("echo relay-approved"));
    env.relay
        .cli_ok(&["approve", a["id"].as_str().unwrap(), "accept"]);
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(
        f["output"].as_str().unwrap().contains("relay-approved"),
        "{f}"
    );
    let d = env.approval_of(&id);
    assert_eq!(
        (d["decision"].as_str(), d["decided_by"].as_str()),
        (Some("accept"), Some("operator"))
    );
    let out = env
        .relay
        .cli(&["approve", a["id"].as_str().unwrap(), "decline"]);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("approval_closed")
    );

    // Declined: the command does not run; the model is told.
    let id = env.ask_no_wait("codex-1", "exec: echo should-not-run > /dev/null; echo ran");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let a = env.approval_of(&id);
    env.relay
        .cli_ok(&["approve", a["id"].as_str().unwrap(), "decline"]);
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let output = f["output"].as_str().unwrap();
    assert!(!output.contains("Process exited with code 0"), "{output}");
    // The model was told the user refused (the mock reports the call's output).
    assert!(output.contains("rejected by user"), "{output}");
    let d = env.approval_of(&id);
    assert_eq!(
        (d["decision"].as_str(), d["decided_by"].as_str()),
        (Some("decline"), Some("operator"))
    );

    // Decided by the agent's policy, recorded as such.
    let id = env.ask_no_wait("codex-2", "exec: echo policy-ok");
    let f = env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    assert!(f["output"].as_str().unwrap().contains("policy-ok"), "{f}");
    let p = env.approval_of(&id);
    assert_eq!(p["decided_by"], "policy:auto-accept:echo *");
    assert_eq!(p["decision"], "accept");

    // What only looks like an allowed command waits for a person: the policy sees the
    // whole command codex will run, not the part that looks harmless.
    for smuggled in [
        "echo ok; touch pwned",
        "env BASH_ENV=/tmp/evil.sh /bin/bash -c 'echo ok'",
        "echo --help",
    ] {
        let id = env.ask_no_wait("codex-2", &format!("exec: {smuggled}"));
        env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
        let a = env.approval_of(&id);
        assert_eq!(a["state"], "pending", "{smuggled}: {a}");
        assert!(
            a["detail"].as_str().unwrap().starts_with("/bin/bash -lc "),
            "the approval shows the whole command: {a}"
        );
        env.relay
            .cli_ok(&["approve", a["id"].as_str().unwrap(), "decline"]);
        env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    }
    assert!(!env.work.join("pwned").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_cannot_decide_as_a_policy_or_as_relay() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let id = env.ask_no_wait("codex-1", "exec: echo decided-by-a-person");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    let a = env.approval_of(&id);
    let path = format!("/v1/approvals/{}", a["id"].as_str().unwrap());
    let http = env.relay.http();
    for claimed in [
        "policy:auto-accept:echo",
        "relay:turn-ended",
        "Policy:anything",
        "codex:withdrawn",
        // Every harness's and a dashboard login's names are Relay's to record too.
        "claude:withdrawn",
        "pi:withdrawn",
        "alice@dashboard",
    ] {
        let (code, body) = http
            .post(&path, &json!({"decision": "accept", "decided_by": claimed}))
            .await;
        assert_eq!(code, 400, "{claimed}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("not allowed") && message.contains("your own name"),
            "{message}"
        );
    }
    // Nothing was decided: the approval is pending and the turn still waits for it.
    assert_eq!(env.approval_of(&id)["state"], "pending");
    assert_eq!(state(&env.flight(&id).await), "waiting");

    // A person's decision without a name is recorded as the operator's, as before.
    let (code, body) = http.post(&path, &json!({"decision": "accept"})).await;
    assert_eq!(code, 200, "{body}");
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
    let d = env.approval_of(&id);
    assert_eq!(
        (d["decision"].as_str(), d["decided_by"].as_str()),
        (Some("accept"), Some("operator"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_pending_when_the_turn_ends_expires() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let id = env.ask_no_wait("codex-1", "exec: echo never-decided");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    env.relay.cli_ok(&["interrupt", &id]);
    env.wait_flight(&id, 30, |f| state(f) == "cancelled").await;
    let a = wait_until(
        format!("the approval of flight {id} to expire"),
        Duration::from_secs(10),
        || async {
            let a = env.approval_of(&id);
            if a["state"] == "expired" {
                Ok(a)
            } else {
                Err(a)
            }
        },
    )
    .await;
    assert_eq!(a["decided_by"], "relay:turn-ended", "{a}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_agents_in_parallel_each_with_its_own_thread() {
    let mut env = Env::start().await;
    let names: Vec<String> = (0..10).map(|i| format!("codex-{i}")).collect();
    for n in &names {
        env.add_agent(n, &[]);
    }
    // Slow turns (about 2 s each): one after another they would never overlap.
    let ids: Vec<String> = names
        .iter()
        .map(|n| env.ask_no_wait(n, &format!("slow: hello from {n} a b c d e")))
        .collect();
    // The most turns seen running at once, in one listing.
    let most_running = std::cell::Cell::new(0);
    wait_until("every flight to end", Duration::from_secs(120), || async {
        let flights = env.relay.cli_json(&["flights", "--json", "-n", "100"]);
        let states: Vec<String> = flights
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["state"].as_str().unwrap_or("").to_string())
            .collect();
        let running = states.iter().filter(|s| *s == "running").count();
        most_running.set(most_running.get().max(running));
        if states.iter().all(|s| s == "completed" || s == "failed") {
            Ok(())
        } else {
            Err(format!("{states:?}"))
        }
    })
    .await;
    let most_running = most_running.get();
    assert!(
        most_running >= 3,
        "at most {most_running} turns ran at once"
    );
    for (n, id) in names.iter().zip(&ids) {
        let f = env
            .wait_flight(id, 120, |f| {
                json!(["completed", "failed"])
                    .as_array()
                    .unwrap()
                    .contains(&f["state"])
            })
            .await;
        assert_eq!(state(&f), "completed", "{f}");
        assert_eq!(f["output"], format!("hello from {n} a b c d e"));
    }
    let mut threads = std::collections::HashSet::new();
    let mut pids = Vec::new();
    for n in &names {
        let a = env.agent(n).await;
        threads.insert(a["thread_id"].as_str().unwrap().to_string());
        pids.push(a["endpoint"]["pid"].as_u64().unwrap() as u32);
    }
    assert_eq!(threads.len(), 10, "every agent has its own thread");
    let status = env.relay.terminate().unwrap();
    assert!(status.success());
    for pid in pids {
        assert!(
            !procs::alive(pid),
            "codex {pid} left running after shutdown"
        );
        // Nor anything it started in its group (the native codex under the launcher).
        assert_eq!(group_members(pid), Vec::<u32>::new(), "left in group {pid}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn turns_of_one_agent_run_one_at_a_time() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let first = env.ask_no_wait("codex-1", "slow: a b c d e");
    let second = env.ask_no_wait("codex-1", "second in line");
    env.wait_delta(&first).await;
    // While the first turn streams, the second waits in the agent's queue.
    assert_eq!(state(&env.flight(&second).await), "queued");
    env.wait_flight(&first, 60, |f| state(f) == "completed")
        .await;
    let f = env
        .wait_flight(&second, 60, |f| state(f) == "completed")
        .await;
    assert_eq!(f["output"], "ok: second in line");
    // Both turns are on the same thread, in order.
    let input = all_input_text(&env.mock.requests().last().cloned().unwrap());
    let (a, b) = (
        input.find("slow: a b c d e").unwrap(),
        input.find("second in line").unwrap(),
    );
    assert!(a < b, "{input}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_turn_fails_the_flight_with_the_harness_error() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let out = env.relay.cli(&["ask", "codex-1", "fail please"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("failed"), "{stderr}");
    let f = env
        .relay
        .cli_json(&["flights", "--agent", "codex-1", "--json"]);
    let f = f.as_array().unwrap().last().unwrap().clone();
    assert_eq!(state(&f), "failed");
    assert!(
        f["error"].as_str().unwrap().contains("failed on purpose"),
        "{f}"
    );
    // The agent keeps working afterwards.
    assert_eq!(
        env.relay.cli_ok(&["ask", "codex-1", "and now?"]).trim(),
        "ok: and now?"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_thread_is_replaced_and_recorded_as_an_event() {
    let mut env = Env::start().await;
    env.add_agent("codex-1", &[]);
    env.relay.cli_ok(&["ask", "codex-1", "before the loss"]);
    let old = env.agent("codex-1").await["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    env.relay.terminate().unwrap();
    // Codex forgets the thread: its rollout files are gone.
    std::fs::remove_dir_all(env.codex_home.join("sessions")).unwrap();
    env.relay.restart().unwrap();
    assert_eq!(
        env.relay
            .cli_ok(&["ask", "codex-1", "after the loss"])
            .trim(),
        "ok: after the loss"
    );
    let new = env.agent("codex-1").await["thread_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(new, old);
    let lost = env.events_of("thread_lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["old_thread_id"], old.as_str());
    assert_eq!(lost[0]["new_thread_id"], new.as_str());
    assert!(lost[0]["reason"].as_str().unwrap().contains(&old));
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_an_agent_mid_turn_fails_its_flight() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let id = env.ask_no_wait("codex-1", "hang around");
    env.wait_flight(&id, 60, |f| state(f) == "running").await;
    let codex = env.codex_pid("codex-1").await;
    env.relay.cli_ok(&["agent", "remove", "codex-1"]);
    let f = env.wait_flight(&id, 30, |f| state(f) != "running").await;
    assert_eq!(state(&f), "failed");
    assert!(f["error"].as_str().unwrap().contains("removed"), "{f}");
    assert!(
        procs::wait_gone(codex, EXIT).await,
        "codex {codex} outlived its agent"
    );
    // An agent added again under the same name starts a thread of its own.
    env.add_agent("codex-1", &[]);
    env.relay.cli_ok(&["ask", "codex-1", "fresh start"]);
    let input = all_input_text(&env.mock.requests().last().cloned().unwrap());
    assert!(!input.contains("hang around"), "{input}");
}

#[tokio::test(flavor = "multi_thread")]
async fn relay_ask_prints_the_reply_and_exits_by_how_the_flight_ended() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    // Streamed word by word, then the end of the line.
    let out = env.relay.cli(&["ask", "codex-1", "slow: one two three"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one two three\n");

    // A steered turn: what streamed first is not the reply; the reply is printed last.
    let ask = std::process::Command::new(relay_tests::relay_bin())
        .args(["ask", "codex-1", "slow: a b c d e f g h i j"])
        .env("RELAY_DATA_DIR", &env.relay.data_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let id = wait_until(
        "the live flight of the ask",
        Duration::from_secs(60),
        || async {
            let flights = env.relay.cli_json(&["flights", "--live", "--json"]);
            let first = flights.as_array().unwrap().first().cloned();
            first.map(|f| f["id"].as_str().unwrap().to_string())
        },
    )
    .await;
    env.wait_delta(&id).await;
    env.relay.cli_ok(&["steer", &id, "about zebras"]);
    let out = tokio::task::spawn_blocking(move || ask.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().last(),
        Some("ok: about zebras"),
        "{stdout:?}"
    );
    assert!(
        stdout.starts_with("a "),
        "the text streamed first: {stdout:?}"
    );

    // A failed flight: exit code 1, the reason on stderr; --json has every field.
    let out = env.relay.cli(&["ask", "codex-1", "fail now"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("failed") && stderr.contains("failed on purpose"),
        "{stderr}"
    );
    let out = env.relay.cli(&["ask", "codex-1", "--json", "fail again"]);
    assert_eq!(out.status.code(), Some(1));
    let f: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (f["state"].as_str(), f["agent"].as_str()),
        (Some("failed"), Some("codex-1"))
    );
    assert!(f.get("output").is_some_and(Value::is_null), "{f}");
    assert!(
        f["error"].as_str().unwrap().contains("failed on purpose"),
        "{f}"
    );
    assert!(f["id"].as_str().unwrap().starts_with("flt_"), "{f}");

    // The task from stdin.
    let mut ask = std::process::Command::new(relay_tests::relay_bin())
        .args(["ask", "codex-1", "-"])
        .env("RELAY_DATA_DIR", &env.relay.data_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = ask.stdin.take().unwrap();
        stdin.write_all(b"from stdin\n").unwrap();
    }
    let out = ask.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok: from stdin"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queued_flight_can_be_interrupted_or_steered_before_its_turn() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    let first = env.ask_no_wait("codex-1", "slow: a b c d e f");
    let second = env.ask_no_wait("codex-1", "never to run");
    let third = env.ask_no_wait("codex-1", "third task");
    env.wait_delta(&first).await;
    assert_eq!(state(&env.flight(&second).await), "queued");

    env.relay.cli_ok(&["steer", &third, "plus this"]);
    env.relay.cli_ok(&["interrupt", &second]);
    let f = env.flight(&second).await;
    assert_eq!(state(&f), "cancelled", "cancelled at once: {f}");
    assert_eq!(f["error"], "interrupted before its turn started");

    let f = env
        .wait_flight(&third, 60, |f| state(f) == "completed")
        .await;
    assert_eq!(f["output"], "ok: third task\n\nplus this");
    assert_eq!(state(&env.flight(&first).await), "completed");
    assert_eq!(state(&env.flight(&second).await), "cancelled");
    assert!(
        !env.mock
            .requests()
            .iter()
            .any(|r| all_input_text(r).contains("never to run")),
        "the interrupted task reached the model"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn steers_obey_the_message_limit_and_so_does_a_queued_task_with_its_steers() {
    let env = Env::start_with(&["--max-message-bytes", "1024"]).await;
    env.add_agent("codex-1", &[]);
    let first = env.ask_no_wait("codex-1", "hang until interrupted");
    let second = env.ask_no_wait("codex-1", "queued task");
    env.wait_flight(&first, 60, |f| state(f) == "running").await;
    assert_eq!(state(&env.flight(&second).await), "queued");
    let http = env.relay.http();
    let steer = |id: &str, text: String| {
        let path = format!("/v1/flights/{id}/steer");
        let http = &http;
        async move { http.post(&path, &json!({ "text": text })).await }
    };

    // A steer over the message limit is refused as a message over it would be, on the
    // running flight and on the queued one.
    for id in [&first, &second] {
        let (code, body) = steer(id, "x".repeat(1025)).await;
        assert_eq!(code, 413, "{body}");
        assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("steer text is 1025 bytes"),
            "{body}"
        );
    }

    // Steers that fit one by one are added to the queued task until it would grow over
    // the limit: "queued task" (11) + 2 + 500 + 2 + 400 = 915 bytes; 200 more are
    // refused, 100 more (1017) fit.
    let (a, b, c, d) = (
        "a".repeat(500),
        "b".repeat(400),
        "c".repeat(200),
        "d".repeat(100),
    );
    for text in [&a, &b] {
        let (code, body) = steer(&second, text.clone()).await;
        assert_eq!(code, 200, "{body}");
    }
    let (code, body) = steer(&second, c).await;
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("task with its steers is 1117 bytes, over the limit of 1024"),
        "{message}"
    );
    let (code, body) = steer(&second, d.clone()).await;
    assert_eq!(code, 200, "{body}");

    // The queued flight runs with its task and the steers that were accepted.
    env.relay.cli_ok(&["interrupt", &first]);
    let f = env
        .wait_flight(&second, 60, |f| state(f) == "completed")
        .await;
    assert_eq!(f["output"], format!("ok: queued task\n\n{a}\n\n{b}\n\n{d}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_that_hears_nothing_is_failed_by_the_idle_watchdog() {
    let env = Env::start_with(&["--turn-idle-timeout", "2"]).await;
    env.add_agent("codex-1", &[]);
    let id = env.ask_no_wait("codex-1", "hang forever");
    let f = env.wait_flight(&id, 60, |f| state(f) == "failed").await;
    // Failed by the watchdog of 2 s (the mock model never answers), whatever the time the
    // machine took to get there.
    let reason = f["error"].as_str().unwrap();
    assert!(reason.contains("sent nothing for 2 s"), "{reason}");
    // The agent goes on: the stuck request was dropped with the turn.
    assert_eq!(
        env.relay.cli_ok(&["ask", "codex-1", "awake?"]).trim(),
        "ok: awake?"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_warm_and_manual_agents_follow_their_wake_policy() {
    let env = Env::start().await;
    // keep_warm: its session starts without a turn, and comes back when it dies.
    env.add_agent("warm-1", &["--wake", "keep_warm"]);
    let pid = env.codex_pid("warm-1").await;
    assert!(procs::alive(pid));
    signal(pid, Signal::KILL);
    wait_until(
        "agent warm-1 to be idle again with a new codex",
        Duration::from_secs(60),
        || async {
            let a = env.agent("warm-1").await;
            let new = a["endpoint"]["pid"].as_u64();
            if new.is_some_and(|new| new as u32 != pid) && a["state"] == "idle" {
                Ok(())
            } else {
                Err(a)
            }
        },
    )
    .await;
    assert_eq!(
        env.relay.cli_ok(&["ask", "warm-1", "warm?"]).trim(),
        "ok: warm?"
    );

    // manual: no turn until someone wakes it.
    env.add_agent("manual-1", &["--wake", "manual"]);
    let out = env.relay.cli(&["ask", "manual-1", "anyone?"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("relay agent wake manual-1"), "{stderr}");
    env.relay.cli_ok(&["agent", "wake", "manual-1"]);
    env.codex_pid("manual-1").await;
    assert_eq!(
        env.relay.cli_ok(&["ask", "manual-1", "now?"]).trim(),
        "ok: now?"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn terminal_escapes_from_the_model_are_shown_escaped() {
    let env = Env::start().await;
    env.add_agent("codex-1", &[]);
    // What a terminal would show as `echo harmless`, the rest erased.
    let id = env.ask_no_wait("codex-1", "exec: rm -rf ~/x\r\x1b[2Kecho harmless");
    env.wait_flight(&id, 60, |f| state(f) == "waiting").await;
    for args in [&["approvals"][..], &["flights"][..], &["flight", &id][..]] {
        let out = env.relay.cli_ok(args);
        assert!(
            !out.contains('\x1b') && !out.contains('\r'),
            "relay {args:?} printed raw escapes: {out:?}"
        );
        if args[0] == "approvals" {
            assert!(
                out.contains("rm -rf ~/x\\x0d\\x1b[2Kecho harmless"),
                "{out:?}"
            );
        }
    }
    let a = env.approval_of(&id);
    env.relay
        .cli_ok(&["approve", a["id"].as_str().unwrap(), "decline"]);
    env.wait_flight(&id, 60, |f| state(f) == "completed").await;
}
