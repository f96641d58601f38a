//! What happens elsewhere while an editor works: an approval decided by someone else, a
//! broker that restarts or starts late.

use super::*;

/// A permission request the editor leaves open while the approval is decided elsewhere
/// (`relay approval decide`, the dashboard): the flight goes on and ends, the
/// permission's tool call ends by that decision (an editor closes its dialog), the
/// prompt answers, and the editor's late answer is ignored.
#[tokio::test(flavor = "multi_thread")]
async fn a_permission_decided_elsewhere_ends_its_tool_call_in_the_editor() {
    let env = Env::start().await;
    env.add_agent("cx", &[]);
    let mut acp = Acp::spawn(&env.relay.data_dir, "cx", env.tmp.path().join("acp.err"));
    acp.initialize().await;
    let sid = acp.new_session().await;
    let id = acp
        .request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": "exec: touch acp-elsewhere"}]}),
        )
        .await;
    let asked = loop {
        let m = acp.recv().await;
        if m["method"] == "session/request_permission" {
            break m;
        }
        assert!(m.get("id").is_none() || m.get("method").is_some(), "{m}");
    };
    let approval = asked["params"]["toolCall"]["toolCallId"].clone();
    let (status, body) = env
        .relay
        .http()
        .post(
            &format!("/v1/approvals/{}", approval.as_str().unwrap()),
            &json!({"decision": "accept", "decided_by": "operator"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (updates, answer) = acp.until_answer(id, |r| panic!("unexpected {r}")).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert!(env.work.join("acp-elsewhere").exists());
    assert_eq!(
        tool_call_statuses(&updates, &approval),
        vec!["completed"],
        "{updates:?}"
    );
    // The request no one waits for any more is withdrawn (ACP's `$/cancel_request`).
    assert!(
        updates
            .iter()
            .any(|m| m["method"] == "$/cancel_request" && m["params"]["requestId"] == asked["id"]),
        "{updates:?}"
    );
    // The editor answers late: nothing to do, and the server goes on.
    acp.send(json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"outcome": {"outcome": "cancelled"}}}))
        .await;
    assert_eq!(acp.initialize().await["result"]["protocolVersion"], 1);
    acp.close().await;
}

/// A `relay acp` lives as long as the editor; the broker may restart under it (on
/// another port, found again through the data dir's api.json) or start after it: its
/// sessions go on, and a new one opens, without restarting the editor's agent.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_that_restarts_or_starts_late_is_found_again() {
    let mut env = Env::start().await;
    env.add_agent("cx", &[]);
    let mut acp = Acp::spawn(&env.relay.data_dir, "cx", env.tmp.path().join("acp.err"));
    acp.initialize().await;
    let sid = acp.new_session().await;
    let prompt = |text: &str| json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]});
    let (_, answer) = acp.call("session/prompt", prompt("before")).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let old = env.relay.api.url.clone();
    env.relay.restart().unwrap();
    assert_ne!(
        env.relay.api.url, old,
        "the broker came back on the same port"
    );
    let (updates, answer) = acp.call("session/prompt", prompt("after")).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(texts(&updates, "agent_message_chunk").concat(), "ok: after");
    assert!(acp.new_session().await.starts_with("acp.operator.cx."));
    acp.close().await;

    // No broker when the editor started it: an error, then the broker once it is up.
    let late = env.tmp.path().join("late");
    std::fs::create_dir_all(&late).unwrap();
    let mut acp = Acp::spawn(&late, "cx", env.tmp.path().join("acp-late.err"));
    acp.initialize().await;
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
    let mut broker = relay_tests::RelayProcess::start_with(&late, &[], &[]).unwrap();
    let (_, e) = acp
        .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
        .await;
    // This broker has no agent cx: it answered, which is what is asked of it here.
    assert_eq!(e["error"]["data"]["relay_code"], "unknown_agent", "{e}");
    acp.close().await;
    broker.kill9();
}
