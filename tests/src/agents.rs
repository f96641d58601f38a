//! The agents' test environment: a `relay up` process, the real pinned CLIs as its
//! agents (Codex, Claude Code, Pi), and one mock model server (Responses for Codex,
//! Messages for the others) scripted by the last user text.

// Test support: a failed step is the failure of the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use relay_client::Client;
use relay_mock_model::{
    claude_env, codex_env, write_codex_home, write_pi_dir, MockModel, RecordedRequest, Reply,
};
use serde_json::{json, Value};

use crate::tmux::TmuxServer;
use crate::{wait_until, RelayProcess};

/// Answers by the last user text: `slow:` streams its words 250 ms apart, `exec:` asks to
/// run the command (escalated in Codex, which makes it ask for approval; with the `Bash`
/// tool in Claude Code, which asks; with `bash` in Pi, which runs it) and then reports its
/// output, `write:PATH CONTENT` writes CONTENT (`\n` for a line break) to PATH in the
/// agent's cwd with the CLI's shell tool ([`Reply::write_file`]; it asks, and
/// [`relay_mock_model::WRITE_FILE_RULE`] accepts) and then answers `wrote PATH: CONTENT`,
/// `edit:PATH CONTENT` writes the new file PATH with the CLI's own edit tool
/// ([`Reply::edit_file`]: Codex's `apply_patch`, with model
/// [`relay_mock_model::CODEX_APPLY_PATCH_MODEL`]; Claude Code's `Write`, PATH absolute;
/// each asks, as a file change) and then answers `edited PATH`,
/// `mcp:SERVER:TOOL ARGS` calls tool TOOL of MCP server SERVER with the JSON
/// object ARGS (see [`mcp_call`]), `hang` never ends, anything else is echoed as
/// `ok: <text>`; `fail` fails the model request.
pub fn script(req: &RecordedRequest) -> Reply {
    let text = req.last_user_text().unwrap_or_default();
    if let Some(call) = text.strip_prefix("mcp:") {
        return mcp_call(req, call);
    }
    if let Some(answer) = text.strip_prefix("answer:") {
        return answer_flight(req, &text, answer);
    }
    if let Some(write) = text.strip_prefix("write:") {
        return write_step(req, write);
    }
    if let Some(edit) = text.strip_prefix("edit:") {
        return edit_step(req, edit);
    }
    if let Some(words) = text.strip_prefix("slow:") {
        Reply::slow_chunks(
            words.trim().split_inclusive(' ').map(str::to_string),
            Duration::from_millis(250),
        )
    } else if let Some(cmd) = text.strip_prefix("exec:") {
        // Only this turn's call counts: earlier turns of the session had theirs. Each
        // call has an id of its own (Claude Code drops a call whose id it saw before).
        let call_id = format!("toolu_{}", req.messages().len());
        match req.tool_output_since_prompt() {
            Some(output) => Reply::text(format!("outputs: {output}")),
            None if req.offers_tool("Bash") => Reply::function_call(
                call_id,
                "Bash",
                &json!({"command": cmd.trim(), "description": "the test asks"}),
            ),
            None if req.offers_tool("bash") => {
                Reply::function_call(call_id, "bash", &json!({"command": cmd.trim()}))
            }
            None => Reply::exec_command_escalated("call_1", cmd.trim(), "the test asks"),
        }
    } else if text.starts_with("fail") {
        Reply::failed("the mock model failed on purpose")
    } else if text.starts_with("hang") {
        Reply::hang()
    } else {
        Reply::text(format!("ok: {text}"))
    }
}

/// What `[mcp:]SERVER:TOOL ARGS` answers: the call of the tool (a `function_call` in
/// namespace `mcp__SERVER` for Codex, a `tool_use` of `mcp__SERVER__TOOL` for Claude
/// Code), then, once the request carries its result, `tool said: <result>`.
fn mcp_call(req: &RecordedRequest, call: &str) -> Reply {
    if let Some(output) = req.tool_output_since_prompt() {
        return Reply::text(format!("tool said: {output}"));
    }
    let (target, args) = call.split_once(' ').unwrap_or((call, "{}"));
    let Some((server, tool)) = target.split_once(':') else {
        return Reply::failed(format!(
            "the test script wants mcp:SERVER:TOOL, not {call:?}"
        ));
    };
    let args: Value = match serde_json::from_str(args) {
        Ok(args) => args,
        Err(e) => return Reply::failed(format!("the test script's arguments: {e}")),
    };
    // Unique per request (Claude Code drops a call whose id it saw before).
    let call_id = format!("toolu_{}", req.messages().len() + req.input().len());
    Reply::mcp_call(call_id, server, tool, &args)
}

/// What `write:PATH CONTENT` answers: the write, then, once the request carries its
/// result, `wrote PATH: CONTENT` (as typed, `\n` and all: one line).
fn write_step(req: &RecordedRequest, spec: &str) -> Reply {
    let spec = spec.lines().next().unwrap_or_default().trim();
    let Some((path, content)) = spec.split_once(' ') else {
        return Reply::failed(format!(
            "the test script wants write:PATH CONTENT, not {spec:?}"
        ));
    };
    if req.tool_output_since_prompt().is_some() {
        return Reply::text(format!("wrote {path}: {content}"));
    }
    // Unique per request (Claude Code drops a call whose id it saw before).
    let call_id = format!("toolu_w{}", req.messages().len() + req.input().len());
    Reply::write_file(call_id, path, &content.replace("\\n", "\n"))
}

/// What `edit:PATH CONTENT` answers: the edit, then, once the request carries its
/// result, `edited PATH`.
fn edit_step(req: &RecordedRequest, spec: &str) -> Reply {
    let spec = spec.lines().next().unwrap_or_default().trim();
    let Some((path, content)) = spec.split_once(' ') else {
        return Reply::failed(format!(
            "the test script wants edit:PATH CONTENT, not {spec:?}"
        ));
    };
    if req.tool_output_since_prompt().is_some() {
        return Reply::text(format!("edited {path}"));
    }
    // Unique per request (Claude Code drops a call whose id it saw before).
    let call_id = format!("toolu_e{}", req.messages().len() + req.input().len());
    Reply::edit_file(call_id, path, &content.replace("\\n", "\n"))
}

/// What `answer:TEXT` answers, for an agent CLI in a tmux pane whose task names its
/// flight (`[Relay flight ID. ...]`, after the text): a call of Relay's MCP `reply`
/// tool with that flight and TEXT's first line, then `tool said: <result>`.
fn answer_flight(req: &RecordedRequest, task: &str, answer: &str) -> Reply {
    let flight = task
        .split("[Relay flight ")
        .nth(1)
        .and_then(|rest| rest.split('.').next());
    let Some(flight) = flight else {
        return Reply::failed(format!("no flight named in the task {task:?}"));
    };
    let answer = answer.lines().next().unwrap_or_default().trim();
    let args = json!({ "flight": flight, "text": answer });
    mcp_call(req, &format!("relay:reply {args}"))
}

pub struct Env {
    pub tmp: tempfile::TempDir,
    pub mock: MockModel,
    pub codex_home: PathBuf,
    /// Claude Code's config dir (`CLAUDE_CONFIG_DIR`; its sessions live there).
    pub claude_dir: PathBuf,
    /// Pi's agent dir (`PI_CODING_AGENT_DIR`: `models.json`, sessions).
    pub pi_dir: PathBuf,
    pub work: PathBuf,
    pub relay: RelayProcess,
    /// The tmux server of this test's tmux agents (`add_tmux`), killed with the test.
    pub tmux: TmuxServer,
}

impl Env {
    pub async fn start() -> Env {
        Self::start_with(&[]).await
    }

    /// With extra `relay up` arguments (`--nats URL`...).
    pub async fn start_with(extra: &[&str]) -> Env {
        Self::start_with_env(extra, &[]).await
    }

    /// With extra `relay up` arguments and environment variables.
    pub async fn start_with_env(extra: &[&str], envs: &[(&str, &str)]) -> Env {
        Self::start_in(None, extra, envs).await
    }

    /// With the data dir at `data` (`None`: in the test's temp dir).
    pub async fn start_in(
        data: Option<&std::path::Path>,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let mock = MockModel::start().await.unwrap();
        mock.set_handler(script);
        let codex_home = tmp.path().join("codex-home");
        write_codex_home(&codex_home, &mock.url()).unwrap();
        let claude_dir = tmp.path().join("claude");
        std::fs::create_dir_all(&claude_dir).unwrap();
        let pi_dir = tmp.path().join("pi");
        write_pi_dir(&pi_dir, &mock.base_url()).unwrap();
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let data = data.map_or_else(|| tmp.path().join("data"), std::path::Path::to_path_buf);
        let relay = RelayProcess::start_with(&data, extra, envs).unwrap();
        Env {
            tmp,
            mock,
            codex_home,
            claude_dir,
            pi_dir,
            work,
            relay,
            tmux: TmuxServer::new(),
        }
    }

    /// Registers a Codex agent (`relay agent add`, with `extra` arguments).
    /// Registers `name`, a real codex whose model provider is a closed port on
    /// 127.0.0.1 (retrying: it streams "Reconnecting..." notes); `relay agent add`'s
    /// output, for its caller to check.
    pub fn add_unreachable_codex(&self, name: &str) -> std::process::Output {
        let home = unreachable_codex_home(self.tmp.path())
            .display()
            .to_string();
        let work = self.work.display().to_string();
        self.relay.cli(&[
            "agent",
            "add",
            name,
            "--harness",
            "codex_app_server",
            "--cwd",
            &work,
            "--env",
            &format!("CODEX_HOME={home}"),
            "--env",
            &format!("HOME={home}"),
        ])
    }

    pub fn add_agent(&self, name: &str, extra: &[&str]) {
        self.add(name, "codex_app_server", codex_env(&self.codex_home), extra);
    }

    /// The events of type `kind` in the whole log (`relay events --json`).
    pub fn events_of(&self, kind: &str) -> Vec<Value> {
        let events = self
            .relay
            .cli_json(&["events", "--since", "0", "-n", "10000", "--json"]);
        let all = events.as_array().cloned().unwrap_or_default();
        all.into_iter().filter(|e| e["type"] == kind).collect()
    }

    /// Registers an ACP agent (`--harness acp`) running `command` (the fake ACP agent).
    pub fn add_acp(&self, name: &str, command: &str) {
        let work = self.work.display().to_string();
        let args = ["agent", "add", name, "--harness", "acp", "--cwd", &work];
        self.relay
            .cli_ok(&[&args[..], &["--command", command]].concat());
    }

    /// Registers a Claude Code agent pointed at the mock.
    pub fn add_claude(&self, name: &str, extra: &[&str]) {
        let env = claude_env(&self.claude_dir, &self.mock.base_url());
        self.add(name, "claude_stream_json", env, extra);
    }

    /// Registers a Pi agent pointed at the mock (`--provider mock --model mock-model`).
    pub fn add_pi(&self, name: &str, extra: &[&str]) {
        let env = write_pi_dir(&self.pi_dir, &self.mock.base_url()).unwrap();
        let mut extra = extra.to_vec();
        extra.extend([
            "--arg",
            "--provider",
            "--arg",
            "mock",
            "--model",
            "mock-model",
        ]);
        self.add(name, "pi_rpc", env, &extra);
    }

    /// Registers a tmux agent running `command` in a pane of this test's tmux server.
    pub fn add_tmux(&self, name: &str, command: &str, extra: &[&str]) {
        let mut args = vec!["--command", command, "--socket", self.tmux.socket()];
        args.extend_from_slice(extra);
        self.add(name, "tmux", Vec::new(), &args);
    }

    fn add(&self, name: &str, harness: &str, env: Vec<(String, String)>, extra: &[&str]) {
        let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let work = self.work.display().to_string();
        let mut args = vec!["agent", "add", name, "--harness", harness, "--cwd", &work];
        for kv in &env {
            args.extend(["--env", kv]);
        }
        args.extend_from_slice(extra);
        self.relay.cli_ok(&args);
    }

    pub fn client(&self) -> Client {
        Client::new(&self.relay.api.url, &self.relay.api.token).unwrap()
    }

    pub fn ask_no_wait(&self, agent: &str, text: &str) -> String {
        self.relay
            .cli_ok(&["ask", agent, "--no-wait", text])
            .trim()
            .to_string()
    }

    pub async fn flight(&self, id: &str) -> Value {
        let (code, f) = self.relay.http().get(&format!("/v1/flights/{id}")).await;
        assert_eq!(code, 200, "{f}");
        f
    }

    pub async fn updates(&self, id: &str) -> Vec<Value> {
        let (_, u) = self
            .relay
            .http()
            .get(&format!("/v1/flights/{id}/updates"))
            .await;
        u.as_array().unwrap().clone()
    }

    /// Streams `clients * each` delta updates into flight `id` from `clients` HTTP
    /// clients posting at once (`text(c, n)` is client `c`'s `n`th delta), each stored
    /// (`200`). Returns the deltas a second it took: a measurement to print, not check.
    pub async fn stream_deltas(
        &self,
        id: &str,
        clients: u32,
        each: u32,
        text: fn(u32, u32) -> String,
    ) -> f64 {
        let started = std::time::Instant::now();
        let mut posters = Vec::new();
        for c in 0..clients {
            let (http, id) = (self.relay.http(), id.to_string());
            posters.push(tokio::spawn(async move {
                for n in 0..each {
                    let change = json!({"kind": "delta", "text": text(c, n)});
                    let (code, body) = http
                        .post(&format!("/v1/flights/{id}/updates"), &change)
                        .await;
                    assert_eq!(code, 200, "{body}");
                }
            }));
        }
        for p in posters {
            p.await.unwrap();
        }
        f64::from(clients * each) / started.elapsed().as_secs_f64()
    }

    /// Polls the flight until `pred` holds (or fails after `secs`, with the flight as
    /// last seen and the broker's log).
    pub async fn wait_flight(&self, id: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_flight_or_show(id, secs, pred, String::new).await
    }

    /// [`Env::wait_flight`], whose failure also shows `more` (the logs of the other
    /// processes in play: a node's, nats-server's).
    pub async fn wait_flight_or_show(
        &self,
        id: &str,
        secs: u64,
        pred: impl Fn(&Value) -> bool,
        more: impl Fn() -> String,
    ) -> Value {
        let waited = crate::try_wait_until(
            format!("flight {id} to get there"),
            Duration::from_secs(secs),
            || async {
                let f = self.flight(id).await;
                if pred(&f) {
                    Ok(f)
                } else {
                    Err(f)
                }
            },
        )
        .await;
        waited.unwrap_or_else(|e| panic!("{e}\nlog:\n{}\n{}", self.relay.log_text(), more()))
    }

    /// Every approval, in any state.
    pub fn approvals(&self) -> Vec<Value> {
        let all = self
            .relay
            .cli_json(&["approvals", "--state", "all", "--json"]);
        all.as_array().unwrap().clone()
    }

    /// The approval (in any state) of a flight.
    pub fn approval_of(&self, flight: &str) -> Value {
        self.find_approval(flight)
            .unwrap_or_else(|| panic!("no approval for {flight}: {:?}", self.approvals()))
    }

    fn find_approval(&self, flight: &str) -> Option<Value> {
        self.approvals().into_iter().find(|a| a["flight"] == flight)
    }

    /// Waits until the flight has asked for an approval, and returns it.
    pub async fn wait_approval(&self, flight: &str) -> Value {
        wait_until(
            format!("an approval of flight {flight}"),
            Duration::from_secs(60),
            || async { self.find_approval(flight) },
        )
        .await
    }

    /// The message of `conversation` whose body is `body` (the request message of an
    /// ask, say).
    pub fn message_with_body(&self, conversation: &str, body: &str) -> Value {
        let messages = self.relay.cli_json(&["read", conversation, "--json"]);
        messages
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["body"] == body)
            .cloned()
            .unwrap_or_else(|| panic!("no message {body:?} in {conversation}: {messages}"))
    }

    /// Waits until the flight has streamed its first delta.
    pub async fn wait_delta(&self, id: &str) {
        wait_until(
            format!("a delta on flight {id}"),
            Duration::from_secs(60),
            || async {
                let updates = self.updates(id).await;
                updates.iter().any(|u| u["kind"] == "delta").then_some(())
            },
        )
        .await
    }

    pub async fn agent(&self, name: &str) -> Value {
        self.relay.http().get(&format!("/v1/agents/{name}")).await.1
    }

    /// Waits until Claude Code or Pi has written `text` to the file of session `session`
    /// (under its config dir, named by the id). Both write their session files behind
    /// the turn: Claude Code a moment after each entry, so a child killed right after a
    /// turn may leave nothing to resume (Relay then records the session as lost).
    pub async fn wait_session_saved(&self, session: &str, text: &str) {
        wait_until(
            format!("session {session} saved with {text:?}"),
            Duration::from_secs(30),
            || async {
                let mut dirs = vec![self.claude_dir.clone(), self.pi_dir.clone()];
                while let Some(dir) = dirs.pop() {
                    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                        let path = entry.path();
                        if path.is_dir() {
                            dirs.push(path);
                        } else if path.to_string_lossy().contains(session)
                            && std::fs::read_to_string(&path).is_ok_and(|s| s.contains(text))
                        {
                            return Some(());
                        }
                    }
                }
                None
            },
        )
        .await
    }

    /// The pid of the agent's CLI child, once its session is up.
    pub async fn codex_pid(&self, name: &str) -> u32 {
        wait_until(
            format!("a child pid for agent {name}"),
            Duration::from_secs(30),
            || async {
                let agent = self.agent(name).await;
                agent["endpoint"]["pid"].as_u64().map(|pid| pid as u32)
            },
        )
        .await
    }
}

/// A CODEX_HOME under `dir` whose model provider is `127.0.0.1:PORT` with nothing
/// listening, retrying 5 times: a codex that cannot reach its model.
fn unreachable_codex_home(dir: &std::path::Path) -> PathBuf {
    let port = {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("a port: {e}"));
        listener
            .local_addr()
            .unwrap_or_else(|e| panic!("its address: {e}"))
            .port()
        // Dropped: the port is closed.
    };
    let home = dir.join("unreachable-codex-home");
    let base_url = format!("http://127.0.0.1:{port}/v1");
    relay_mock_model::write_codex_home_retrying(&home, &base_url, 5)
        .unwrap_or_else(|e| panic!("writing {}: {e}", home.display()));
    home
}

pub fn state(f: &Value) -> &str {
    f["state"].as_str().unwrap_or("")
}
