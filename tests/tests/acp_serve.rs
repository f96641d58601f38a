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

use std::process::Stdio;
use std::time::Duration;

use relay_broker::seal::AgentTokens;
use relay_tests::agents::Env;
use relay_tests::{relay_bin, wait_until};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// The longest a message from `relay acp` may take (a Codex turn answers in seconds).
const WAIT: Duration = Duration::from_secs(90);

/// A test ACP client: `relay acp` as a child, its stdout read line by line.
struct Acp {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    stderr: std::path::PathBuf,
    /// The log of the broker of its data dir (`RelayProcess`'s), shown on a failure.
    broker_log: std::path::PathBuf,
    next_id: i64,
}

impl Acp {
    /// `relay acp AGENT` against the broker of `data_dir`.
    fn spawn(data_dir: &std::path::Path, agent: &str, stderr: std::path::PathBuf) -> Acp {
        Self::spawn_with(data_dir, agent, stderr, &[])
    }

    /// The same with `envs` set (`RELAY_URL`, `RELAY_TOKEN`, `RELAY_AGENT`: an agent's
    /// session).
    fn spawn_with(
        data_dir: &std::path::Path,
        agent: &str,
        stderr: std::path::PathBuf,
        envs: &[(&str, &str)],
    ) -> Acp {
        let err = std::fs::File::create(&stderr).unwrap();
        let mut cmd = Command::new(relay_bin());
        cmd.args(["acp", agent])
            .env("RELAY_DATA_DIR", data_dir)
            .env_remove("RELAY_URL")
            .env_remove("RELAY_TOKEN")
            .env_remove("RELAY_AGENT");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut r = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = r.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Acp {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            broker_log: data_dir.with_extension("log"),
            next_id: 1,
        }
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// What a failure shows: `relay acp`'s stderr and the broker log's tail, both
    /// also kept in a directory of their own (the test's temp dir is deleted).
    fn diagnostics(&self) -> String {
        let log = std::fs::read_to_string(&self.broker_log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(200)..].join("\n");
        let kept = std::env::temp_dir().join(format!(
            "acp-serve-failure-{}-{}",
            std::process::id(),
            self.child.id().unwrap_or_default()
        ));
        let saved = std::fs::create_dir_all(&kept)
            .and_then(|()| std::fs::write(kept.join("acp.err"), self.stderr_text()))
            .and_then(|()| std::fs::write(kept.join("broker.log"), &log));
        let kept = match saved {
            Ok(()) => format!("kept in {}", kept.display()),
            Err(e) => format!("not kept ({e})"),
        };
        format!(
            "stderr:\n{}\nbroker log ({kept}), last 200 lines:\n{tail}",
            self.stderr_text()
        )
    }

    async fn send_line(&mut self, line: &str) {
        self.send_raw(line).await;
        self.send_raw("\n").await;
    }

    /// Writes `text` as it is (a piece of a line, say).
    async fn send_raw(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    async fn send(&mut self, v: Value) {
        self.send_line(&v.to_string()).await;
    }

    async fn request(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// The next message; every line on stdout must be one JSON-RPC message.
    async fn recv(&mut self) -> Value {
        let line = tokio::time::timeout(WAIT, self.lines.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "relay acp said nothing for {WAIT:?}; {}",
                    self.diagnostics()
                )
            })
            .unwrap_or_else(|| panic!("relay acp closed stdout; {}", self.diagnostics()));
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a line that is not JSON ({e}): {line}"));
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        v
    }

    /// Reads until the answer to request `id`: the notifications before it, and the
    /// answer. Requests of `relay acp` are answered with `on_request`'s result.
    async fn until_answer(
        &mut self,
        id: i64,
        mut on_request: impl FnMut(&Value) -> Value,
    ) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let m = self.recv().await;
            if m.get("method").is_some() && m.get("id").is_some() {
                let result = on_request(&m);
                let answer = json!({"jsonrpc": "2.0", "id": m["id"], "result": result});
                self.send(answer).await;
                before.push(m);
            } else if m.get("method").is_some() {
                before.push(m);
            } else if m["id"] == id {
                return (before, m);
            } else {
                panic!("an answer to no request of the test's: {m}");
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> (Vec<Value>, Value) {
        let id = self.request(method, params).await;
        self.until_answer(id, |r| panic!("unexpected request {r}"))
            .await
    }

    async fn initialize(&mut self) -> Value {
        let (_, r) = self
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}, "clientInfo": {"name": "test", "version": "0"}}),
            )
            .await;
        r
    }

    async fn new_session(&mut self) -> String {
        let (_, r) = self
            .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
            .await;
        r["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {r}\n{}", self.stderr_text()))
            .to_string()
    }

    /// Closes stdin and waits for a clean exit.
    async fn close(mut self) {
        drop(self.stdin.take());
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("relay acp did not exit after EOF on stdin")
            .unwrap();
        assert!(
            status.success(),
            "{status}; stderr:\n{}",
            self.stderr_text()
        );
    }
}

/// The kinds of `session/update`s, in order.
fn update_kinds(updates: &[Value]) -> Vec<&str> {
    updates
        .iter()
        .filter(|m| m["method"] == "session/update")
        .map(|m| m["params"]["update"]["sessionUpdate"].as_str().unwrap())
        .collect()
}

/// The text of the updates of `kind`, in order.
fn texts<'a>(updates: &'a [Value], kind: &str) -> Vec<&'a str> {
    updates
        .iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == kind)
        .map(|m| m["params"]["update"]["content"]["text"].as_str().unwrap())
        .collect()
}

/// The statuses `tool_call_update`s gave the tool call `id`, in order.
fn tool_call_statuses<'a>(updates: &'a [Value], id: &Value) -> Vec<&'a str> {
    updates
        .iter()
        .filter(|m| {
            m["params"]["update"]["sessionUpdate"] == "tool_call_update"
                && &m["params"]["update"]["toolCallId"] == id
        })
        .filter_map(|m| m["params"]["update"]["status"].as_str())
        .collect()
}

/// The answer to a permission request: the option of `kind`, by its id.
fn choose(kind: &str) -> impl FnMut(&Value) -> Value + '_ {
    move |req: &Value| {
        assert_eq!(req["method"], "session/request_permission", "{req}");
        let option = req["params"]["options"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} option in {req}"));
        json!({"outcome": {"outcome": "selected", "optionId": option["optionId"]}})
    }
}

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

/// A TCP proxy to the broker whose client-to-broker direction can be held shut: what
/// `relay acp` sends meanwhile waits in it, and goes on once it is open again. The
/// proxy's address in what is sent (the Host header) becomes the broker's, which
/// refuses other hosts.
struct Gate {
    url: String,
    open: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Gate {
    async fn start(broker_url: &str) -> Gate {
        let upstream = broker_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let here = listener.local_addr().unwrap().to_string();
        let url = format!("http://{here}");
        let (open, rx) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, here) = (upstream.clone(), here.clone());
                let rx = rx.clone();
                tokio::spawn(async move {
                    let Ok(broker) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut cr, cw) = client.into_split();
                    let (br, mut bw) = broker.into_split();
                    let back = tokio::spawn(async move {
                        let (mut br, mut cw) = (br, cw);
                        let _ = tokio::io::copy(&mut br, &mut cw).await;
                    });
                    let mut rx = rx;
                    let mut buf = vec![0u8; 16 << 10];
                    loop {
                        let n = match tokio::io::AsyncReadExt::read(&mut cr, &mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let sent = replace(&buf[..n], here.as_bytes(), upstream.as_bytes());
                        if rx.wait_for(|open| *open).await.is_err()
                            || bw.write_all(&sent).await.is_err()
                        {
                            break;
                        }
                    }
                    let _ = bw.shutdown().await;
                    let _ = back.await;
                });
            }
        });
        Gate { url, open, task }
    }

    fn shut(&self) {
        self.open.send_replace(false);
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

/// `bytes` with each `from` replaced by `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

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
