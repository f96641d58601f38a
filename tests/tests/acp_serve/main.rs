//! `relay acp AGENT` driven by a test ACP client over the child's stdio, against a real
//! broker with a real (pinned) Codex agent and the mock model (scripted by the prompt:
//! `slow:` streams words, `exec:` asks to run a command, `hang` never ends; see
//! `relay_tests::agents::script`):
//!
//! - initialize, session/new, a prompt streamed back in order then `end_turn`;
//! - a permission request answered: allowed, the command runs (and shows as a tool
//!   call); rejected, it does not;
//! - session/cancel of a hanging prompt: `cancelled`;
//! - session/load in a NEW `relay acp` process replays the session's history first;
//! - bad input answered with errors while the process goes on serving;
//! - several sessions prompted at once from one client, each answered with its own;
//! - EOF on stdin ends the process cleanly.
//!
//! And without a Codex: an unknown agent and a broker that is not there are JSON-RPC
//! errors, not a process that dies or hangs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client;
mod elsewhere;
mod gate;

use relay_broker::seal::AgentTokens;
use relay_tests::agents::Env;
use relay_tests::wait_until;
use serde_json::{json, Value};

use client::*;
use gate::*;

#[tokio::test(flavor = "multi_thread")]
async fn an_editor_drives_a_codex_agent_through_relay_acp() {
    let env = Env::start().await;
    env.add_agent("cx", &[]);
    let mut acp = Acp::spawn(&env.relay.data_dir, "cx", env.tmp.path().join("acp-1.err"));

    let init = acp.initialize().await;
    let result = &init["result"];
    assert_eq!(result["protocolVersion"], 1, "{init}");
    assert_eq!(result["agentInfo"]["name"], "relay");
    assert_eq!(result["agentCapabilities"]["loadSession"], true);
    assert_eq!(
        result["agentCapabilities"]["promptCapabilities"]["image"],
        false
    );

    // A prompt streamed back: several chunks, in order, then end_turn.
    let sid = acp.new_session().await;
    assert!(sid.starts_with("acp.operator.cx."), "{sid}");
    let (updates, answer) = acp
        .call(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "slow: one two three four five"}]}),
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let chunks = texts(&updates, "agent_message_chunk");
    assert!(chunks.len() > 1, "one chunk only: {updates:?}");
    assert_eq!(chunks.concat(), "one two three four five", "{updates:?}");
    assert!(updates
        .iter()
        .all(|u| u["params"]["sessionId"] == sid.as_str()));

    // A permission request accepted: the command runs, and shows as a tool call.
    let accepted = env.work.join("acp-accepted");
    let id = acp
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "exec: touch acp-accepted"}]}),
        )
        .await;
    let (updates, answer) = acp.until_answer(id, choose("allow_once")).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let asked: Vec<&Value> = updates
        .iter()
        .filter(|m| m["method"] == "session/request_permission")
        .collect();
    assert_eq!(asked.len(), 1, "{updates:?}");
    let call = &asked[0]["params"]["toolCall"];
    assert!(
        call["title"]
            .as_str()
            .unwrap()
            .contains("touch acp-accepted"),
        "{call}"
    );
    assert_eq!(call["kind"], "execute");
    assert!(accepted.exists(), "the accepted command did not run");
    // The permission's tool call ends once decided (an editor shows it running until
    // it does).
    assert_eq!(
        tool_call_statuses(&updates, &call["toolCallId"]),
        vec!["completed"],
        "{updates:?}"
    );
    let kinds = update_kinds(&updates);
    assert!(kinds.contains(&"tool_call"), "{kinds:?}");
    let done = updates
        .iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "tool_call_update")
        .any(|m| m["params"]["update"]["status"] == "completed");
    assert!(done, "no completed tool call: {updates:?}");
    let a = env.approvals();
    assert_eq!(
        (&a[0]["decision"], &a[0]["decided_by"]),
        (&json!("accept"), &json!("operator")),
        "{a:?}"
    );

    // Rejected: it does not run.
    let id = acp
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "exec: touch acp-declined"}]}),
        )
        .await;
    let (updates, answer) = acp.until_answer(id, choose("reject_once")).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert!(!env.work.join("acp-declined").exists());
    let asked = updates
        .iter()
        .find(|m| m["method"] == "session/request_permission")
        .unwrap_or_else(|| panic!("no permission asked: {updates:?}"));
    assert_eq!(
        tool_call_statuses(&updates, &asked["params"]["toolCall"]["toolCallId"]),
        vec!["failed"],
        "{updates:?}"
    );
    assert!(env
        .approvals()
        .iter()
        .any(|a| a["decision"] == "decline"
            && a["detail"].as_str().unwrap().contains("acp-declined")));

    // Cancel: a prompt that never ends is interrupted and answered `cancelled`.
    let id = acp
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "hang until cancelled"}]}),
        )
        .await;
    let http = env.relay.http();
    let flight = wait_until("the hanging prompt's flight to run", WAIT, || async {
        let (_, flights) = http.get("/v1/flights?agent=cx&live=true").await;
        flights.as_array().and_then(|fs| {
            fs.iter()
                .find(|f| f["conversation"] == sid.as_str() && f["state"] == "running")
                .map(|f| f["id"].as_str().unwrap().to_string())
        })
    })
    .await;
    acp.send(json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}}))
        .await;
    let (_, answer) = acp.until_answer(id, |r| panic!("unexpected {r}")).await;
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    assert_eq!(env.flight(&flight).await["state"], "cancelled");

    // A failed flight answers the prompt with an error carrying the flight's.
    let (_, e) = acp
        .call(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "fail now"}]}),
        )
        .await;
    assert_eq!(e["error"]["data"]["state"], "failed", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("failed on purpose"),
        "{e}"
    );

    // Bad input: answered, and the server goes on.
    acp.send_line("this is not json").await;
    let e = acp.recv().await;
    assert_eq!(
        (&e["id"], &e["error"]["code"]),
        (&Value::Null, &json!(-32700)),
        "{e}"
    );
    let (_, e) = acp.call("no/such/method", json!({})).await;
    assert_eq!(e["error"]["code"], -32601, "{e}");
    let (_, e) = acp
        .call(
            "session/prompt",
            json!({"sessionId": "acp.nobody.none.0", "prompt": [{"type": "text", "text": "hi"}]}),
        )
        .await;
    assert_eq!(e["error"]["code"], -32602, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown session"),
        "{e}"
    );
    let (_, e) = acp
        .call("session/prompt", json!({"prompt": "no session"}))
        .await;
    assert_eq!(e["error"]["code"], -32602, "{e}");
    let (_, e) = acp
        .call(
            "session/load",
            json!({"sessionId": "acp.no.such.1", "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("acp.no.such.1"),
        "{e}"
    );

    // Several sessions prompted at once from one client: each answered with its own.
    let mut asks = Vec::new();
    for n in 0..3 {
        let s = acp.new_session().await;
        let text = format!("session {n} says hello");
        let id = acp
            .request(
                "session/prompt",
                json!({"sessionId": s, "prompt": [{"type": "text", "text": text}]}),
            )
            .await;
        asks.push((id, s, text));
    }
    let mut seen: Vec<Value> = Vec::new();
    let mut answers = std::collections::HashMap::new();
    while answers.len() < asks.len() {
        let m = acp.recv().await;
        if m.get("method").is_some() {
            seen.push(m);
        } else {
            answers.insert(m["id"].as_i64().unwrap(), m);
        }
    }
    for (id, s, text) in &asks {
        assert_eq!(
            answers[id]["result"]["stopReason"], "end_turn",
            "{:?}",
            answers[id]
        );
        let mine: Vec<Value> = seen
            .iter()
            .filter(|m| m["params"]["sessionId"] == s.as_str())
            .cloned()
            .collect();
        assert_eq!(
            texts(&mine, "agent_message_chunk").concat(),
            format!("ok: {text}")
        );
    }
    acp.close().await;

    // A new relay acp process reloads the first session: its history first, then the
    // answer; and it takes a prompt in it.
    let mut again = Acp::spawn(&env.relay.data_dir, "cx", env.tmp.path().join("acp-2.err"));
    again.initialize().await;
    let (replayed, answer) = again
        .call(
            "session/load",
            json!({"sessionId": sid, "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    assert_eq!(answer["result"], json!({}), "{answer}");
    let users = texts(&replayed, "user_message_chunk");
    assert_eq!(
        users,
        vec![
            "slow: one two three four five",
            "exec: touch acp-accepted",
            "exec: touch acp-declined",
            "hang until cancelled",
            "fail now"
        ],
        "{replayed:?}"
    );
    let agents = texts(&replayed, "agent_message_chunk");
    assert_eq!(
        agents.first(),
        Some(&"one two three four five"),
        "{replayed:?}"
    );
    let kinds = update_kinds(&replayed);
    assert_eq!(
        &kinds[..2],
        &["user_message_chunk", "agent_message_chunk"],
        "{kinds:?}"
    );
    let (updates, answer) = again
        .call(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "after the load"}]}),
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(
        texts(&updates, "agent_message_chunk").concat(),
        "ok: after the load"
    );
    again.close().await;

    // With an agent's token (an agent's session runs it): it acts as that agent, in the
    // direct conversation of the two (it may not create one), and cannot be anyone else.
    env.add_agent("helper", &[]);
    let token = AgentTokens::new(env.relay.api.token.as_bytes()).token("helper");
    let envs = [
        ("RELAY_URL", env.relay.api.url.as_str()),
        ("RELAY_TOKEN", token.as_str()),
        ("RELAY_AGENT", "helper"),
    ];
    let err = env.tmp.path().join("acp-agent.err");
    let mut scoped = Acp::spawn_with(&env.relay.data_dir, "cx", err, &envs);
    scoped.initialize().await;
    let sid = scoped.new_session().await;
    assert_eq!(sid, "direct.cx.helper");
    let (updates, answer) = scoped
        .call(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "from helper"}]}),
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(
        texts(&updates, "agent_message_chunk").concat(),
        "ok: from helper"
    );
    assert_eq!(
        env.message_with_body(&sid, "from helper")["author"],
        "helper"
    );

    // An agent's token may not decide approvals: the editor's choice cannot be made,
    // so the permission's tool call is not shown as failed; it ends by the decision
    // made elsewhere (here the operator's), and the next approval is not asked of an
    // editor that cannot decide it.
    let decide_elsewhere = |want: &'static str| {
        let http = env.relay.http();
        async move {
            let id = wait_until("an approval to wait", WAIT, || async {
                let (_, a) = http.get("/v1/approvals").await;
                a.as_array().and_then(|a| {
                    a.iter()
                        .find(|a| a["detail"].as_str().unwrap_or("").contains(want))
                        .map(|a| a["id"].as_str().unwrap().to_string())
                })
            })
            .await;
            let (status, body) = http
                .post(
                    &format!("/v1/approvals/{id}"),
                    &json!({"decision": "accept", "decided_by": "operator"}),
                )
                .await;
            assert_eq!(status, 200, "{body}");
        }
    };
    let id = scoped
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "exec: touch acp-helper-1"}]}),
        )
        .await;
    let asked = loop {
        let m = scoped.recv().await;
        if m["method"] == "session/request_permission" {
            break m;
        }
    };
    let option = asked["params"]["options"][0]["optionId"].clone();
    scoped
        .send(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"outcome": {"outcome": "selected", "optionId": option}}}))
        .await;
    decide_elsewhere("acp-helper-1").await;
    let (updates, answer) = scoped.until_answer(id, |r| panic!("unexpected {r}")).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(
        tool_call_statuses(&updates, &asked["params"]["toolCall"]["toolCallId"]),
        vec!["completed"],
        "{updates:?}"
    );
    let id = scoped
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "exec: touch acp-helper-2"}]}),
        )
        .await;
    decide_elsewhere("acp-helper-2").await;
    let (updates, answer) = scoped
        .until_answer(id, |r| panic!("asked again: {r}"))
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert!(env.work.join("acp-helper-2").exists(), "{updates:?}");
    scoped.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_agent_or_no_broker_is_an_error_not_a_dead_server() {
    let env = Env::start().await;
    let mut acp = Acp::spawn(
        &env.relay.data_dir,
        "nobody",
        env.tmp.path().join("acp.err"),
    );
    acp.initialize().await;
    let (_, e) = acp
        .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
        .await;
    assert!(
        e["error"]["message"].as_str().unwrap().contains("nobody"),
        "{e}"
    );
    assert_eq!(e["error"]["data"]["relay_code"], "unknown_agent", "{e}");
    // Still serving.
    assert_eq!(acp.initialize().await["result"]["protocolVersion"], 1);
    acp.close().await;

    let empty = env.tmp.path().join("no-broker");
    std::fs::create_dir_all(&empty).unwrap();
    let mut acp = Acp::spawn(&empty, "cx", env.tmp.path().join("acp-none.err"));
    assert_eq!(acp.initialize().await["result"]["protocolVersion"], 1);
    let (_, e) = acp
        .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
        .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no broker"),
        "{e}"
    );
    let (_, e) = acp
        .call(
            "session/load",
            json!({"sessionId": "acp.x.y.z", "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no broker"),
        "{e}"
    );
    acp.close().await;
}

/// A line that comes in pieces is read whole, even when requests end while its rest is
/// on its way (a line partly read was lost when a request's task ended meanwhile, and
/// its request never answered).
#[tokio::test(flavor = "multi_thread")]
async fn a_line_in_pieces_is_read_whole_while_requests_end() {
    let tmp = tempfile::tempdir().unwrap();
    let mut acp = Acp::spawn(tmp.path(), "cx", tmp.path().join("acp.err"));
    for _ in 0..20 {
        let id = acp.next_id;
        let last = id + 4;
        acp.next_id += 5;
        let line = |id: i64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {"protocolVersion": 1}}).to_string()
        };
        let whole: Vec<String> = (id..last).map(line).collect();
        let piece = line(last);
        let (first, rest) = piece.split_at(piece.len() / 2);
        // Four requests and half of a fifth: its first half is read while their tasks
        // end; the rest comes once they answered.
        acp.send_raw(&format!("{}\n{first}", whole.join("\n")))
            .await;
        let mut answered = Vec::new();
        for _ in id..last {
            let m = acp.recv().await;
            answered.push(m["id"].as_i64().unwrap_or_else(|| panic!("{m}")));
        }
        answered.sort();
        assert_eq!(answered, (id..last).collect::<Vec<_>>());
        acp.send_line(rest).await;
        let (_, answer) = acp.until_answer(last, |r| panic!("unexpected {r}")).await;
        assert_eq!(answer["result"]["protocolVersion"], 1, "{answer}");
    }
    assert!(
        !acp.stderr_text().contains("bad line"),
        "{}",
        acp.stderr_text()
    );
    acp.close().await;
}

/// ACP: a `session/cancel` right behind its `session/prompt` (an editor's stop button
/// pressed at once) cancels that prompt: it answers `cancelled` and its flight is
/// interrupted, however early the cancel came.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_right_behind_its_prompt_cancels_it() {
    let env = Env::start().await;
    env.add_agent("cx", &[]);
    let mut acp = Acp::spawn(&env.relay.data_dir, "cx", env.tmp.path().join("acp.err"));
    acp.initialize().await;
    let sid = acp.new_session().await;
    let id = acp.next_id;
    acp.next_id += 1;
    // Both in one write, as an editor may send them.
    let prompt = json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "slow: a b c d e f g h i j k l"}]}});
    let cancel =
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}});
    acp.send_line(&format!("{prompt}\n{cancel}")).await;
    let (updates, answer) = acp.until_answer(id, |r| panic!("unexpected {r}")).await;
    assert_eq!(
        answer["result"]["stopReason"], "cancelled",
        "{answer}; {updates:?}"
    );
    let http = env.relay.http();
    let (_, flights) = http.get("/v1/flights?agent=cx").await;
    let flight = flights
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["conversation"] == sid.as_str())
        .unwrap_or_else(|| panic!("no flight in {sid}: {flights}"))
        .clone();
    assert_eq!(flight["state"], "cancelled", "{flight}");

    acp.close().await;

    // A cancelled prompt answers `cancelled` even when what it was doing failed (ACP:
    // the agent must not show a cancellation as an error): here the agent is gone, and
    // the failed invocation surely reaches `relay acp` after the cancel (its calls go
    // through a gate held shut until the cancel is read), so this is the case checked,
    // not a failure that raced ahead of the cancel (answered as the error, rightly).
    let gate = Gate::start(&env.relay.api.url).await;
    let envs = [
        ("RELAY_URL", gate.url.as_str()),
        ("RELAY_TOKEN", env.relay.api.token.as_str()),
    ];
    let err = env.tmp.path().join("acp-gated.err");
    let mut acp = Acp::spawn_with(&env.relay.data_dir, "cx", err, &envs);
    acp.initialize().await;
    let sid = acp.new_session().await;
    let out = env.relay.cli(&["agent", "remove", "cx"]);
    assert!(out.status.success(), "{out:?}");
    gate.shut();
    let id = acp.next_id;
    let read = id + 1;
    acp.next_id += 2;
    let prompt = json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "anyone there?"}]}});
    let cancel =
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}});
    let init = json!({"jsonrpc": "2.0", "id": read, "method": "initialize", "params": {"protocolVersion": 1}});
    acp.send_line(&format!("{prompt}\n{cancel}\n{init}")).await;
    // Lines are read in order: the answer to the line after the cancel says it was read
    // (the prompt cannot answer first: its invocation waits at the gate).
    let (_, answer) = acp.until_answer(read, |r| panic!("unexpected {r}")).await;
    assert_eq!(answer["result"]["protocolVersion"], 1, "{answer}");
    gate.open();
    let (_, answer) = acp.until_answer(id, |r| panic!("unexpected {r}")).await;
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    assert!(
        acp.stderr_text()
            .contains("cancelled prompt ended with an error"),
        "the invocation did not fail: {}",
        acp.stderr_text()
    );
    acp.close().await;
}
