//! The codex test environment: a `relay up` process, the real pinned codex as its
//! agents, and a mock Responses server scripted by the last user text.

// Test support: a failed step is the failure of the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use relay_cli::client::Client;
use relay_mock_model::{codex_env, write_codex_home, MockModel, RecordedRequest, Reply};
use serde_json::Value;

use crate::{wait_until, RelayProcess};

/// Answers by the last user text: `slow:` streams its words 250 ms apart, `exec:` asks to
/// run the command escalated (then reports the outputs), `hang` never ends, anything else
/// is echoed as `ok: <text>`; `fail` answers `response.failed`.
pub fn script(req: &RecordedRequest) -> Reply {
    let text = req.last_user_text().unwrap_or_default();
    if let Some(words) = text.strip_prefix("slow:") {
        Reply::slow_chunks(
            words.trim().split_inclusive(' ').map(str::to_string),
            Duration::from_millis(250),
        )
    } else if let Some(cmd) = text.strip_prefix("exec:") {
        // Only this turn's call counts: earlier turns of the thread had theirs.
        match outputs_since_last_user(req) {
            None => Reply::exec_command_escalated("call_1", cmd.trim(), "the test asks"),
            Some(output) => Reply::text(format!("outputs: {output}")),
        }
    } else if text.starts_with("fail") {
        Reply::failed("the mock model failed on purpose")
    } else if text.starts_with("hang") {
        Reply::hang()
    } else {
        Reply::text(format!("ok: {text}"))
    }
}

/// The output of a function call made after the last user message, if any.
pub fn outputs_since_last_user(req: &RecordedRequest) -> Option<String> {
    let input = req.input();
    let last_user = input
        .iter()
        .rposition(|i| i["type"] == "message" && i["role"] == "user")?;
    input[last_user..]
        .iter()
        .find(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].to_string())
}

pub struct Env {
    pub tmp: tempfile::TempDir,
    pub mock: MockModel,
    pub codex_home: PathBuf,
    pub work: PathBuf,
    pub relay: RelayProcess,
}

impl Env {
    pub async fn start() -> Env {
        Self::start_with(&[]).await
    }

    /// With extra `relay up` arguments (`--nats URL`...).
    pub async fn start_with(extra: &[&str]) -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let mock = MockModel::start().await.unwrap();
        mock.set_handler(script);
        let codex_home = tmp.path().join("codex-home");
        write_codex_home(&codex_home, &mock.url()).unwrap();
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let relay = RelayProcess::start_with(&tmp.path().join("data"), extra, &[]).unwrap();
        Env {
            tmp,
            mock,
            codex_home,
            work,
            relay,
        }
    }

    pub fn add_agent(&self, name: &str, extra: &[&str]) {
        let env: Vec<String> = codex_env(&self.codex_home)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let work = self.work.display().to_string();
        let mut args = vec![
            "agent",
            "add",
            name,
            "--harness",
            "codex_app_server",
            "--cwd",
            &work,
        ];
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

    /// Polls the flight until `pred` holds (or fails after `secs`, with the flight as
    /// last seen and the broker's log).
    pub async fn wait_flight(&self, id: &str, secs: u64, pred: impl Fn(&Value) -> bool) -> Value {
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
        waited.unwrap_or_else(|e| panic!("{e}\nlog:\n{}", self.relay.log_text()))
    }

    /// The approval (in any state) of a flight.
    pub fn approval_of(&self, flight: &str) -> Value {
        let all = self
            .relay
            .cli_json(&["approvals", "--state", "all", "--json"]);
        all.as_array()
            .unwrap()
            .iter()
            .find(|a| a["flight"] == flight)
            .cloned()
            .unwrap_or_else(|| panic!("no approval for {flight}: {all}"))
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

    /// The pid of the agent's codex child, once its session is up.
    pub async fn codex_pid(&self, name: &str) -> u32 {
        wait_until(
            format!("a codex pid for agent {name}"),
            Duration::from_secs(30),
            || async {
                let agent = self.agent(name).await;
                agent["endpoint"]["pid"].as_u64().map(|pid| pid as u32)
            },
        )
        .await
    }
}

pub fn state(f: &Value) -> &str {
    f["state"].as_str().unwrap_or("")
}
