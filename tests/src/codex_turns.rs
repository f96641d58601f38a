//! Scenario 8 of `relay-bench`: a real codex turn through Relay against the same pinned
//! `codex app-server` driven directly, both answered by the same mock model, interleaved
//! so that both see the same machine.
//!
//! - Direct: this process speaks codex's JSON-RPC over stdio itself (`initialize`,
//!   `thread/start`, then `turn/start` per turn), timing from the `turn/start` request to
//!   the first `item/agentMessage/delta` and to `turn/completed`.
//! - `relay ask`: the `relay` CLI run as a person runs it, timing from spawning it to the
//!   first byte of the reply on its stdout and to its exit.
//! - HTTP: `POST /v1/invocations` then the flight's SSE stream, timing to the first
//!   `delta` update and to the terminal one.

// Bench support: a failed step is an error of the run, reported in its row.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use relay_client::Client;
use relay_mock_model::{codex_env, write_codex_home, MockModel, Reply};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::RelayProcess;

/// The reply every turn gets: a few chunks, so there are deltas to time.
pub const REPLY_CHUNKS: [&str; 6] = ["ok", ": this", " is", " the", " mock", " reply"];
/// Longest a turn may take before the run fails (a deadline against a hang).
const TURN_DEADLINE: Duration = Duration::from_secs(120);

/// One timed turn.
#[derive(Debug, Clone, Copy)]
pub struct Turn {
    pub first_delta: Duration,
    pub whole: Duration,
}

/// The timed turns of each way, in the order they ran.
#[derive(Debug, Default)]
pub struct Turns {
    pub direct: Vec<Turn>,
    pub ask: Vec<Turn>,
    pub http: Vec<Turn>,
}

/// A mock model answering [`REPLY_CHUNKS`], and a codex home pointing at it.
pub struct Model {
    pub mock: MockModel,
    pub codex_home: PathBuf,
}

impl Model {
    pub async fn start(dir: &Path) -> anyhow::Result<Model> {
        let mock = MockModel::start().await?;
        mock.set_handler(|_| Reply::chunks(REPLY_CHUNKS));
        let codex_home = dir.join("codex-home");
        write_codex_home(&codex_home, &mock.url())?;
        Ok(Model { mock, codex_home })
    }
}

/// `codex app-server` driven over its stdio by this process, on one thread.
pub struct DirectCodex {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
    thread: String,
    next_id: u64,
}

impl DirectCodex {
    /// Starts `program app-server` with the environment Relay gives its codex children
    /// (PATH, and the agent's CODEX_HOME and HOME) and opens a thread in `cwd`.
    pub async fn start(program: &Path, model: &Model, cwd: &Path) -> anyhow::Result<DirectCodex> {
        let mut cmd = Command::new(program);
        cmd.arg("app-server")
            .current_dir(cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(codex_env(&model.codex_home))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {} app-server", program.display()))?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut codex = DirectCodex {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            thread: String::new(),
            next_id: 0,
        };
        let info =
            json!({"clientInfo": {"name": "relay-bench", "title": "relay-bench", "version": "0"}});
        codex.request("initialize", info).await?;
        codex
            .send(&json!({"jsonrpc": "2.0", "method": "initialized"}))
            .await?;
        let started = codex
            .request("thread/start", json!({"cwd": cwd.display().to_string()}))
            .await?;
        codex.thread = started["thread"]["id"]
            .as_str()
            .context("thread/start answered no thread id")?
            .to_string();
        Ok(codex)
    }

    async fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.stdin.write_all(&line).await?;
        self.stdin.flush().await?;
        Ok(())
    }

    async fn next_message(&mut self) -> anyhow::Result<Value> {
        let line = tokio::time::timeout(TURN_DEADLINE, self.lines.next_line())
            .await
            .context("codex sent nothing in time")??
            .context("codex closed its stdout")?;
        Ok(serde_json::from_str(&line)?)
    }

    /// Sends a request and waits for its answer (notifications meanwhile are dropped).
    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        loop {
            let m = self.next_message().await?;
            if m["id"] == id && m.get("method").is_none() {
                if let Some(e) = m.get("error") {
                    bail!("codex refused {method}: {e}");
                }
                return Ok(m["result"].clone());
            }
        }
    }

    /// One turn, timed from sending `turn/start`.
    pub async fn turn(&mut self, text: &str) -> anyhow::Result<Turn> {
        let t0 = Instant::now();
        self.next_id += 1;
        let params = json!({"threadId": self.thread, "input": [{"type": "text", "text": text}]});
        self.send(&json!({"jsonrpc": "2.0", "id": self.next_id, "method": "turn/start", "params": params}))
            .await?;
        let mut first_delta = None;
        loop {
            let m = self.next_message().await?;
            match m["method"].as_str() {
                Some("item/agentMessage/delta") => {
                    first_delta.get_or_insert_with(|| t0.elapsed());
                }
                Some("turn/completed") => {
                    let status = &m["params"]["turn"]["status"];
                    if status != "completed" {
                        bail!("the direct turn ended {status}");
                    }
                    return Ok(Turn {
                        first_delta: first_delta.context("the direct turn streamed no delta")?,
                        whole: t0.elapsed(),
                    });
                }
                _ if m.get("error").is_some() => bail!("codex answered an error: {m}"),
                _ => {}
            }
        }
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Registers a codex agent on `relay` whose codex uses `model`, and waits for its
/// first turn (which starts its session) to end.
pub async fn add_codex_agent(
    relay: &RelayProcess,
    api: &Client,
    name: &str,
    program: &Path,
    model: &Model,
    cwd: &Path,
) -> anyhow::Result<()> {
    let env: serde_json::Map<String, Value> = codex_env(&model.codex_home)
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    let spec = json!({
        "name": name, "harness": "codex_app_server", "cwd": cwd.display().to_string(),
        "command": program.display().to_string(), "env": env,
    });
    api.post::<_, Value>(&["v1", "agents"], &spec)
        .await
        .with_context(|| format!("adding agent {name}"))?;
    ask(&relay.bin, &relay.data_dir, name, "warm up").await?;
    Ok(())
}

/// One `relay ask`, timed from spawning the CLI to the first byte it prints and to its
/// exit.
pub async fn ask(relay: &Path, data_dir: &Path, agent: &str, text: &str) -> anyhow::Result<Turn> {
    let t0 = Instant::now();
    let mut child = Command::new(relay)
        .args(["ask", agent, text])
        .env("RELAY_DATA_DIR", data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting relay ask")?;
    let mut stdout = child.stdout.take().context("no stdout")?;
    let mut first = [0u8; 1];
    let n = tokio::time::timeout(TURN_DEADLINE, stdout.read(&mut first))
        .await
        .context("relay ask printed nothing in time")??;
    let first_delta = t0.elapsed();
    if n == 0 {
        let out = child.wait_with_output().await?;
        bail!(
            "relay ask printed nothing: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).await?;
    let status = tokio::time::timeout(TURN_DEADLINE, child.wait())
        .await
        .context("relay ask did not exit")??;
    let whole = t0.elapsed();
    if !status.success() {
        bail!("relay ask failed ({status})");
    }
    Ok(Turn { first_delta, whole })
}

/// One invocation over HTTP followed on the flight's SSE stream, timed from the POST.
pub async fn over_http(api: &Client, agent: &str, text: &str) -> anyhow::Result<Turn> {
    let t0 = Instant::now();
    let accepted: Value = api
        .post(
            &["v1", "invocations"],
            &json!({"target": agent, "task": text}),
        )
        .await?;
    let id = accepted["flight"]["id"]
        .as_str()
        .context("the invocation answered no flight id")?
        .to_string();
    let mut first_delta = None;
    let mut ended: Option<String> = None;
    let path = ["v1", "flights", &id, "stream"];
    let follow = api.sse(&path, &[], |kind, data| {
        if kind != "update" {
            return true;
        }
        let Ok(update) = serde_json::from_str::<Value>(data) else {
            return true;
        };
        match update["kind"].as_str() {
            Some("delta") => {
                first_delta.get_or_insert_with(|| t0.elapsed());
                true
            }
            Some("state") => match update["to"].as_str() {
                Some(to @ ("completed" | "failed" | "cancelled")) => {
                    ended = Some(to.to_string());
                    false
                }
                _ => true,
            },
            _ => true,
        }
    });
    tokio::time::timeout(TURN_DEADLINE, follow)
        .await
        .context("the flight did not end in time")??;
    let whole = t0.elapsed();
    match ended.as_deref() {
        Some("completed") => Ok(Turn {
            first_delta: first_delta.context("the flight streamed no delta")?,
            whole,
        }),
        other => bail!("the flight ended {other:?}"),
    }
}

/// Runs `turns` rounds, each one turn of every way, the order rotating per round.
pub async fn interleaved(
    direct: &mut DirectCodex,
    relay: &RelayProcess,
    api: &Client,
    agent: &str,
    turns: usize,
) -> anyhow::Result<Turns> {
    let mut out = Turns::default();
    for round in 0..turns {
        for way in 0..3 {
            let text = format!("turn {round}");
            match (round + way) % 3 {
                0 => out.direct.push(direct.turn(&text).await?),
                1 => out
                    .ask
                    .push(ask(&relay.bin, &relay.data_dir, agent, &text).await?),
                _ => out.http.push(over_http(api, agent, &text).await?),
            }
        }
    }
    Ok(out)
}
