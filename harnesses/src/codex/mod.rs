//! The Codex `app-server` adapter: JSON-RPC over the stdio of `codex app-server`.
//!
//! Parts:
//! - [`app_server`]: Codex's own JSON-RPC wire as types (the subset Relay uses), which
//!   only this adapter knows (and the test stand-in `relay-instant-codex`).
//! - [`CodexSession`]: a cheap `Clone` handle on one `codex app-server` child, driven
//!   through the shared owner task of [`crate::stdio`]: each method becomes a call on a
//!   bounded queue ([`crate::stdio::COMMAND_CAPACITY`]; when full it fails at once with
//!   [`HarnessError::Overloaded`]) and waits, with a timeout, for its answer.
//! - The translator (`translate.rs`): Codex notifications and server requests ->
//!   [`HarnessEvent`]s, without I/O; as `CodexWire` it is the owner's [`crate::stdio::Wire`]
//!   and numbers the requests Relay sends.
//! - [`crate::process`]: the child in its own process group, stderr tail, no leaks.
//! - [`CodexLauncher`] (`launcher.rs`): Codex behind the harness seam
//!   ([`crate::seam`]), built on [`CodexSession`]; the runtime uses only that.
//!
//! Data flow: `CodexSession::start_turn` -> a call that writes
//! `{"id":N,"method":"turn/start",...}` -> Codex answers `{"id":N,"result":...}` -> the
//! owner wakes the waiter; meanwhile Codex's notifications (`turn/started`,
//! `item/agentMessage/delta`...) become events on the receiver returned by
//! [`CodexSession::spawn`]. An approval arrives as [`HarnessEvent::ApprovalRequested`]
//! and is answered with [`CodexSession::respond_approval`].
//!
//! Observed with Codex 0.169.0 (and pinned by the tests in `tests/codex.rs`):
//! - An unknown thread id on `thread/resume` is refused with code -32600 and `no rollout
//!   found for thread id <id>` (also when the rollout file was deleted), or `invalid
//!   session id: ...` when it is not a UUID; `turn/start` on a thread not loaded says
//!   `thread not found: <id>`. All of these become [`HarnessError::SessionNotFound`].
//! - A fork (`relay agent fork`, [`CodexSession::fork_thread`]): `thread/fork` with
//!   `threadId` and `lastTurnId` (inclusive; turns after it are left out) copies the
//!   thread's rollout into a new thread (`forkedFromId` set) with the settings given
//!   (`cwd`...); the source thread need not be loaded in this process, and it goes on
//!   unchanged. The turn ids come from `thread/turns/list` (`sortDirection: "asc"`,
//!   `itemsView: "notLoaded"`), which also reads an unloaded thread. Unknown thread:
//!   `thread/turns/list` says `thread not loaded: <id>`, `thread/fork` `no rollout found
//!   for thread id <id>`; an unknown `lastTurnId`: `turn not found: <id>`. No
//!   `thread/rollback` exists in 0.169.0 (only `thread/revert`, which rewrites a thread's
//!   own history), and `lastTurnId` cannot cut before the first turn.
//! - `turn/steer` answers `{turnId}` at once, drops the model request in flight (its
//!   partial text is neither completed nor sent back), and samples again in the same turn
//!   with the steered text as a second user message. With no active turn: -32600 `no
//!   active turn to steer`; `turn/interrupt` likewise says `no active turn to interrupt`.
//! - An approval is the server request `item/commandExecution/requestApproval` with an
//!   integer id (from 0), after the `commandExecution` item has started; `command` is the
//!   wrapped form (`/bin/bash -lc '<script>'`). Its `availableDecisions` does not list
//!   `decline`, but `decline` works: the model gets `exec_command failed: ... rejected by
//!   user`. Codex then sends `serverRequest/resolved`.
//! - Codex runs each command in a session of its own (`setsid`); see [`crate::process`].
//! - Its shell commands run in its sandbox, which refuses every socket (`read-only`):
//!   `relay ask` cannot reach the broker from there. MCP servers Codex hosts run outside
//!   it, so an agent that reaches Relay gets `relay mcp` as MCP server `relay`, through
//!   `-c mcp_servers.relay.{command,args,env_vars,tool_timeout_sec}` overrides
//!   (`app_server_args`). Codex gives an MCP server only a few of its own variables
//!   (`HOME`, `PATH`...) plus those `env_vars` names, which is how the token reaches it
//!   without being on a command line. The server starts with the thread
//!   (`mcpServer/startupStatus/updated` `starting`, then `ready`, before the first model
//!   request; `failed` becomes a warning) and the model sees its tools as namespace
//!   `mcp__relay`.
//! - Before every MCP tool call Codex asks the client: `mcpServer/elicitation/request`, a
//!   form without fields whose `_meta` holds `codex_approval_kind: "mcp_tool_call"`,
//!   `tool_name`, `tool_params`. The translator accepts a call of Relay's own server at
//!   once (`{"action":"accept","content":{}}`; the scoped token bounds what it can do),
//!   makes a call of any other server an [`HarnessEvent::ApprovalRequested`] (`MCP tool
//!   <server>.<tool>` and the arguments; a decline reaches the model as `user rejected
//!   MCP tool call`), and declines any other elicitation (a form or URL for a person),
//!   with a warning: nothing is answered as if a person had filled it in. A tool's result
//!   reaches the model as `Wall time: ... Output:` followed by its text.
//!
//! The wire work is in `translate.rs`, the pipes in [`crate::stdio`], the seam in
//! `launcher.rs`.

pub mod app_server;
mod launcher;
mod translate;

pub use launcher::{CodexLauncher, CODEX_INFO};
/// Codex's stdout read as a [`crate::stdio::Wire`] (public for the fuzz targets).
pub use translate::CodexWire;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use self::app_server::{
    self as wire, method, AskForApproval, ClientInfo, InitializeParams, InitializeResponse,
    Message, SandboxMode, SortDirection, ThreadForkParams, ThreadForkResponse, ThreadResumeParams,
    ThreadResumeResponse, ThreadStartParams, ThreadStartResponse, ThreadTurnsListParams,
    ThreadTurnsListResponse, TurnInterruptParams, TurnInterruptResponse, TurnItemsView,
    TurnStartParams, TurnStartResponse, TurnSteerParams, TurnSteerResponse, UserInput,
};
use relay_protocol::domain::ApprovalDecision;
use relay_protocol::harness::HarnessEvent;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::config::CliConfig;
use crate::error::HarnessError;
use crate::stdio::{Outgoing, StdioChild};

pub use crate::pinned::{CODEX_CLI, CODEX_VERSION};

/// Where the `codex` program is; see [`PinnedCli::program`].
pub fn codex_program(explicit: Option<&str>) -> PathBuf {
    CODEX_CLI.program(explicit)
}

/// How to start `codex app-server` ([`CliConfig::for_agent`] with [`CODEX_CLI`]): the
/// agent's arguments come after `app-server`; its model is the default of the threads
/// it starts.
pub type CodexConfig = CliConfig;

/// The command line after the program: `app-server`, Relay's MCP server when the agent
/// reaches Relay ([`RelayAccess::codex_mcp_args`](crate::RelayAccess::codex_mcp_args)), then the agent's own arguments, which may override
/// any of it.
fn app_server_args(config: &CodexConfig) -> Vec<String> {
    let mut args = vec!["app-server".to_string()];
    if let Some(relay) = &config.relay {
        args.extend(relay.codex_mcp_args());
    }
    args.extend(config.args.iter().cloned());
    args
}

/// How Relay introduces itself in Codex's `initialize`.
const CLIENT_NAME: &str = "relay";

/// Settings of a new thread (and overrides for a resumed one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadOptions {
    pub cwd: Option<PathBuf>,
    /// Falls back to [`CodexConfig::model`].
    pub model: Option<String>,
    /// Defaults to `on-request`: Codex asks before escalating. (`untrusted` is refused by
    /// Codex 0.169.0.)
    pub approval_policy: Option<AskForApproval>,
    /// `None` leaves it to Codex's config.
    pub sandbox: Option<SandboxMode>,
    pub developer_instructions: Option<String>,
}

impl Default for ThreadOptions {
    fn default() -> Self {
        Self {
            cwd: None,
            model: None,
            approval_policy: Some(AskForApproval::OnRequest),
            sandbox: None,
            developer_instructions: None,
        }
    }
}

/// A thread loaded by `thread/resume`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumedThread {
    pub thread_id: String,
    /// Turns the thread already has.
    pub turn_count: usize,
}

/// A handle on one `codex app-server` process. Cheap to clone; when the last clone is
/// dropped the process is shut down (stdin closed, then its group killed after the
/// grace period).
#[derive(Clone)]
pub struct CodexSession {
    child: StdioChild<CodexWire>,
    model: Option<String>,
}

impl std::fmt::Debug for CodexSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodexSession")
            .field("pid", &self.child.pid())
            .finish_non_exhaustive()
    }
}

impl CodexSession {
    /// Starts `codex app-server` and completes the handshake (`initialize`, then
    /// `initialized`). Events of every thread of this process arrive on the receiver; it
    /// must be drained (the owner task waits when it is full).
    pub async fn spawn(
        config: CodexConfig,
    ) -> Result<(CodexSession, mpsc::Receiver<HarnessEvent>), HarnessError> {
        let spec = config.process(app_server_args(&config));
        let (events, event_rx) = mpsc::channel(crate::stdio::EVENT_CAPACITY);
        let child = StdioChild::spawn(
            &spec,
            CodexWire::new(Arc::new(AtomicU64::new(0)), config.relay.is_some()),
            events,
            config.request_timeout,
            config.shutdown_grace,
        )?;
        // Codex's end is always reported: a thread is opened by request, not by starting
        // the process, so there is no start to take back.
        child.arm();
        let pid = child.pid();
        let session = CodexSession {
            child,
            model: config.model.clone(),
        };
        let params = InitializeParams {
            client_info: ClientInfo {
                name: CLIENT_NAME.to_string(),
                title: Some("Relay".to_string()),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
            capabilities: None,
        };
        let handshake = async {
            let init: InitializeResponse = session.request(method::INITIALIZE, &params).await?;
            tracing::debug!(pid, user_agent = %init.user_agent, "codex: initialized");
            session.notify(method::INITIALIZED).await
        };
        if let Err(err) = handshake.await {
            let _ = session.shutdown().await;
            return Err(err);
        }
        Ok((session, event_rx))
    }

    /// The pid of the child (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The last lines Codex wrote on stderr.
    pub fn stderr_tail(&self) -> String {
        self.child.stderr_tail()
    }

    /// Stdout lines that were not JSON-RPC, or whose params did not have the expected
    /// shape. Each was logged and skipped.
    pub fn malformed_lines(&self) -> u64 {
        self.child.malformed_lines()
    }

    /// Commands refused with [`HarnessError::Overloaded`] so far.
    pub fn overloaded_count(&self) -> u64 {
        self.child.overloaded_count()
    }

    /// Starts a thread and returns its id.
    pub async fn start_thread(&self, options: &ThreadOptions) -> Result<String, HarnessError> {
        let params = ThreadStartParams {
            cwd: options.cwd.as_ref().map(|p| p.display().to_string()),
            model: options.model.clone().or_else(|| self.model.clone()),
            approval_policy: options.approval_policy,
            sandbox: options.sandbox,
            base_instructions: None,
            developer_instructions: options.developer_instructions.clone(),
        };
        let res: ThreadStartResponse = self.request(method::THREAD_START, &params).await?;
        Ok(res.thread.id)
    }

    /// Loads a thread from its rollout (typically written by an earlier process), keeping
    /// its settings. [`HarnessError::SessionNotFound`] when Codex has no such thread.
    pub async fn resume_thread(&self, thread_id: &str) -> Result<ResumedThread, HarnessError> {
        self.resume(ThreadResumeParams {
            thread_id: thread_id.to_string(),
            ..Default::default()
        })
        .await
    }

    /// [`resume_thread`](Self::resume_thread) with settings overridden by `options`.
    pub async fn resume_thread_with(
        &self,
        thread_id: &str,
        options: &ThreadOptions,
    ) -> Result<ResumedThread, HarnessError> {
        self.resume(ThreadResumeParams {
            thread_id: thread_id.to_string(),
            cwd: options.cwd.as_ref().map(|p| p.display().to_string()),
            model: options.model.clone().or_else(|| self.model.clone()),
            approval_policy: options.approval_policy,
            sandbox: options.sandbox,
            developer_instructions: options.developer_instructions.clone(),
        })
        .await
    }

    async fn resume(&self, params: ThreadResumeParams) -> Result<ResumedThread, HarnessError> {
        let thread_id = params.thread_id.clone();
        // Full history (no `excludeTurns`): Codex 0.169.0 flags it as deprecated in a
        // `deprecationNotice`, but it is the one call that tells how many turns exist.
        let res: ThreadResumeResponse = self
            .request(method::THREAD_RESUME, &params)
            .await
            .map_err(|e| thread_error(&thread_id, e))?;
        Ok(ResumedThread {
            thread_id: res.thread.id,
            turn_count: res.thread.turns.len(),
        })
    }

    /// Forks `thread_id` (read from its rollout: it need not be loaded here) into a new
    /// thread with `options`' settings, keeping its first `keep_turns` turns: all of them
    /// when `None` or when it has no more, none (a new thread) when 0. Returns the new
    /// thread's id. [`HarnessError::SessionNotFound`] when Codex has no such thread.
    pub async fn fork_thread(
        &self,
        thread_id: &str,
        keep_turns: Option<u32>,
        options: &ThreadOptions,
    ) -> Result<String, HarnessError> {
        let last_turn_id = match keep_turns {
            None => None,
            Some(keep) => {
                let turns = self.first_turns(thread_id, keep.saturating_add(1)).await?;
                if turns.len() <= keep as usize {
                    None
                } else if keep == 0 {
                    // `thread/fork` cannot cut before the first turn: an empty fork is
                    // a new thread (the source was checked to exist above).
                    return self.start_thread(options).await;
                } else {
                    turns.get(keep as usize - 1).cloned()
                }
            }
        };
        let params = ThreadForkParams {
            thread_id: thread_id.to_string(),
            last_turn_id,
            cwd: options.cwd.as_ref().map(|p| p.display().to_string()),
            model: options.model.clone().or_else(|| self.model.clone()),
            approval_policy: options.approval_policy,
            sandbox: options.sandbox,
            developer_instructions: options.developer_instructions.clone(),
            exclude_turns: true,
        };
        let res: ThreadForkResponse = self
            .request(method::THREAD_FORK, &params)
            .await
            .map_err(|e| thread_error(thread_id, e))?;
        Ok(res.thread.id)
    }

    /// The ids of the first `n` turns of `thread_id` (fewer when it has fewer), oldest
    /// first, page by page.
    async fn first_turns(&self, thread_id: &str, n: u32) -> Result<Vec<String>, HarnessError> {
        let mut ids = Vec::new();
        let mut cursor = None;
        loop {
            let params = ThreadTurnsListParams {
                thread_id: thread_id.to_string(),
                cursor,
                limit: Some(n - ids.len() as u32),
                sort_direction: Some(SortDirection::Asc),
                items_view: Some(TurnItemsView::NotLoaded),
            };
            let page: ThreadTurnsListResponse = self
                .request(method::THREAD_TURNS_LIST, &params)
                .await
                .map_err(|e| thread_error(thread_id, e))?;
            let empty = page.data.is_empty();
            ids.extend(page.data.into_iter().map(|t| t.id));
            ids.truncate(n as usize);
            cursor = page.next_cursor;
            if ids.len() >= n as usize || cursor.is_none() || empty {
                return Ok(ids);
            }
        }
    }

    /// Starts a turn with `text` as the user's input and returns the turn id. The turn's
    /// progress and end arrive as events.
    pub async fn start_turn(&self, thread_id: &str, text: &str) -> Result<String, HarnessError> {
        let params = TurnStartParams {
            thread_id: thread_id.to_string(),
            input: vec![UserInput::text(text)],
        };
        let res: TurnStartResponse = self
            .request(method::TURN_START, &params)
            .await
            .map_err(|e| thread_error(thread_id, e))?;
        Ok(res.turn.id)
    }

    /// Adds `text` to the turn in progress. Codex 0.169.0 cuts the model request in flight
    /// short and samples again with the text appended, in the same turn. Refused (an
    /// [`HarnessError::Rpc`]) when `expected_turn_id` is not the active turn.
    pub async fn steer(
        &self,
        thread_id: &str,
        expected_turn_id: &str,
        text: &str,
    ) -> Result<(), HarnessError> {
        let params = TurnSteerParams {
            thread_id: thread_id.to_string(),
            expected_turn_id: expected_turn_id.to_string(),
            input: vec![UserInput::text(text)],
        };
        let _: TurnSteerResponse = self
            .request(method::TURN_STEER, &params)
            .await
            .map_err(|e| thread_error(thread_id, e))?;
        Ok(())
    }

    /// Asks Codex to stop the turn; it then ends with `TurnOutcome::Interrupted`. Refused
    /// (an [`HarnessError::Rpc`]) when no turn is active.
    pub async fn interrupt(&self, thread_id: &str, turn_id: &str) -> Result<(), HarnessError> {
        let params = TurnInterruptParams {
            thread_id: thread_id.to_string(),
            turn_id: turn_id.to_string(),
        };
        let _: TurnInterruptResponse = self
            .request(method::TURN_INTERRUPT, &params)
            .await
            .map_err(|e| thread_error(thread_id, e))?;
        Ok(())
    }

    /// Answers an [`HarnessEvent::ApprovalRequested`]. [`HarnessError::UnknownRequest`]
    /// when it was already answered or settled.
    pub async fn respond_approval(
        &self,
        request_id: &str,
        decision: ApprovalDecision,
    ) -> Result<(), HarnessError> {
        let request_id = request_id.to_string();
        self.child
            .call("approval", move |w| {
                let Some(message) = w.translator.answer(&request_id, decision) else {
                    return Err(HarnessError::UnknownRequest { request_id });
                };
                Ok(Outgoing::send(serde_json::to_value(message)?))
            })
            .await
            .map(drop)
    }

    /// Stops Codex: closes its stdin (its cue to exit), then after the grace period
    /// SIGTERMs and finally SIGKILLs its process group. Returns once it is gone; the
    /// event stream then ends with [`HarnessEvent::ProcessExited`]. Idempotent.
    pub async fn shutdown(&self) -> Result<(), HarnessError> {
        self.child.shutdown().await;
        Ok(())
    }

    async fn notify(&self, method: &'static str) -> Result<(), HarnessError> {
        let message = Message::Notification(wire::Notification {
            method: method.to_string(),
            params: None,
        });
        let message = serde_json::to_value(message)?;
        self.child
            .call(method, move |_| Ok(Outgoing::send(message)))
            .await
            .map(drop)
    }

    async fn request<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &'static str,
        params: &P,
    ) -> Result<R, HarnessError> {
        let params = serde_json::to_value(params)?;
        let value = self
            .child
            .call(method, move |w| w.request(method, params))
            .await
            .inspect_err(|err| tracing::debug!(method, %err, "codex: request refused"))?;
        Ok(serde_json::from_value(value)?)
    }
}

/// Codex's refusals that mean "no such thread" (see the module docs).
fn thread_error(thread_id: &str, err: HarnessError) -> HarnessError {
    match err {
        HarnessError::Rpc { ref message, .. }
            if [
                "no rollout found",
                "thread not found",
                "thread not loaded",
                "invalid thread id",
                "invalid session id",
            ]
            .iter()
            .any(|prefix| message.starts_with(prefix)) =>
        {
            HarnessError::SessionNotFound {
                session_id: thread_id.to_string(),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn not_found_refusals_become_thread_not_found() {
        for message in [
            "no rollout found for thread id 01a2",
            "thread not found: 01a2",
            "thread not loaded: 01a2",
            "invalid session id: invalid character",
        ] {
            let err = thread_error(
                "t",
                HarnessError::Rpc {
                    code: wire::error_code::INVALID_REQUEST,
                    message: message.to_string(),
                },
            );
            assert!(
                matches!(err, HarnessError::SessionNotFound { ref session_id } if session_id == "t")
            );
        }
        let err = thread_error(
            "t",
            HarnessError::Rpc {
                code: wire::error_code::INVALID_REQUEST,
                message: "no active turn to steer".to_string(),
            },
        );
        assert!(matches!(err, HarnessError::Rpc { .. }));
    }

    #[test]
    fn relay_mcp_is_wired_in_with_no_secret_on_the_command_line() {
        let mut config = CodexConfig::new("codex");
        config.args = vec!["-c".into(), "model=\"m\"".into()];
        assert_eq!(
            app_server_args(&config),
            ["app-server", "-c", "model=\"m\""]
        );
        config.relay = Some(crate::RelayAccess {
            agent: "cx".into(),
            url: "http://127.0.0.1:7450".into(),
            token: "relay-agent.cx.s3cret".into(),
            program: "/opt/relay \"x\"/relay".into(),
        });
        let args = app_server_args(&config);
        assert_eq!(
            args,
            [
                "app-server",
                "-c",
                r#"mcp_servers.relay.command="/opt/relay \"x\"/relay""#,
                "-c",
                r#"mcp_servers.relay.args=["mcp"]"#,
                "-c",
                r#"mcp_servers.relay.env_vars=["RELAY_AGENT","RELAY_URL","RELAY_TOKEN"]"#,
                "-c",
                "mcp_servers.relay.tool_timeout_sec=86400",
                "-c",
                "model=\"m\"",
            ]
        );
        assert!(!args.iter().any(|a| a.contains("s3cret")));
    }

    #[test]
    fn explicit_program_wins() {
        assert_eq!(codex_program(Some("/x/codex")), PathBuf::from("/x/codex"));
    }
}
