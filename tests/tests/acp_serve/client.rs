//! The test ACP client: `relay acp` as a child, spoken to over its stdio.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use relay_tests::relay_bin;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// The longest a message from `relay acp` may take (a Codex turn answers in seconds).
pub const WAIT: Duration = Duration::from_secs(90);

/// A test ACP client: `relay acp` as a child, its stdout read line by line.
pub struct Acp {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub lines: mpsc::UnboundedReceiver<String>,
    pub stderr: std::path::PathBuf,
    /// The log of the broker of its data dir (`RelayProcess`'s), shown on a failure.
    pub broker_log: std::path::PathBuf,
    pub next_id: i64,
}

impl Acp {
    /// `relay acp AGENT` against the broker of `data_dir`.
    pub fn spawn(data_dir: &std::path::Path, agent: &str, stderr: std::path::PathBuf) -> Acp {
        Self::spawn_with(data_dir, agent, stderr, &[])
    }

    /// The same with `envs` set (`RELAY_URL`, `RELAY_TOKEN`, `RELAY_AGENT`: an agent's
    /// session).
    pub fn spawn_with(
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

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// What a failure shows: `relay acp`'s stderr and the broker log's tail, both
    /// also kept in a directory of their own (the test's temp dir is deleted).
    pub fn diagnostics(&self) -> String {
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

    pub async fn send_line(&mut self, line: &str) {
        self.send_raw(line).await;
        self.send_raw("\n").await;
    }

    /// Writes `text` as it is (a piece of a line, say).
    pub async fn send_raw(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).await.unwrap();
        stdin.flush().await.unwrap();
    }

    pub async fn send(&mut self, v: Value) {
        self.send_line(&v.to_string()).await;
    }

    pub async fn request(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// The next message; every line on stdout must be one JSON-RPC message.
    pub async fn recv(&mut self) -> Value {
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
    pub async fn until_answer(
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

    pub async fn call(&mut self, method: &str, params: Value) -> (Vec<Value>, Value) {
        let id = self.request(method, params).await;
        self.until_answer(id, |r| panic!("unexpected request {r}"))
            .await
    }

    pub async fn initialize(&mut self) -> Value {
        let (_, r) = self
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}, "clientInfo": {"name": "test", "version": "0"}}),
            )
            .await;
        r
    }

    pub async fn new_session(&mut self) -> String {
        let (_, r) = self
            .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
            .await;
        r["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {r}\n{}", self.stderr_text()))
            .to_string()
    }

    /// Closes stdin and waits for a clean exit.
    pub async fn close(mut self) {
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
pub fn update_kinds(updates: &[Value]) -> Vec<&str> {
    updates
        .iter()
        .filter(|m| m["method"] == "session/update")
        .map(|m| m["params"]["update"]["sessionUpdate"].as_str().unwrap())
        .collect()
}

/// The text of the updates of `kind`, in order.
pub fn texts<'a>(updates: &'a [Value], kind: &str) -> Vec<&'a str> {
    updates
        .iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == kind)
        .map(|m| m["params"]["update"]["content"]["text"].as_str().unwrap())
        .collect()
}

/// The statuses `tool_call_update`s gave the tool call `id`, in order.
pub fn tool_call_statuses<'a>(updates: &'a [Value], id: &Value) -> Vec<&'a str> {
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
pub fn choose(kind: &str) -> impl FnMut(&Value) -> Value + '_ {
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
