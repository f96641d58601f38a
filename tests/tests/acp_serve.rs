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
            next_id: 1,
        }
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    async fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
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
                    "relay acp said nothing for {WAIT:?}; stderr:\n{}",
                    self.stderr_text()
                )
            })
            .unwrap_or_else(|| panic!("relay acp closed stdout; stderr:\n{}", self.stderr_text()));
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
    let (_, answer) = acp.until_answer(id, choose("reject_once")).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert!(!env.work.join("acp-declined").exists());
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
