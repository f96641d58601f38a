//! Claude Code behind the harness seam ([`crate::seam`]): [`ClaudeLauncher`] makes a
//! session for an agent, and the session starts `claude -p` when it opens the agent's
//! session (resumed with `--resume`, or new with `--session-id`, the loss said).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use relay_protocol::domain::{AgentSpec, ApprovalDecision, ForkSpec, Harness};
use tokio::sync::watch;

use super::config::{command, ClaudeConfig, Start};
use super::wire::{cannot_steer, ClaudeWire, Running};
use super::CLAUDE_CLI;
use crate::access::RelayAccess;
use crate::error::HarnessError;
use crate::restartable::{Live, RestartableChild};
use crate::seam::{
    BoxFuture, Endpoint, HarnessInfo, HarnessSession, Launcher, Lost, OpenedSession, Preflight,
    Spawned,
};
use crate::stdio::StdioChild;

/// Claude Code: approvals, resume and interrupt; no steer, no turn ids of its own.
pub const CLAUDE_INFO: HarnessInfo = HarnessInfo {
    harness: Harness::ClaudeStreamJson,
    name: "claude",
    program: "claude -p (stream-json)",
    capabilities: Harness::ClaudeStreamJson.capabilities(),
    screen: false,
};

/// The variables Claude Code 2.1.197 takes a key or token from.
const CLAUDE_KEY_VARS: [&str; 3] = [
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
];

/// Why Claude Code will find no credentials, if none of its ways is there: a key
/// variable of the agent's, a cloud provider chosen (`CLAUDE_CODE_USE_BEDROCK`,
/// `..._VERTEX`: its own credentials, not checked here), `claude login`'s
/// `.credentials.json` in its config dir (`CLAUDE_CONFIG_DIR`, else `~/.claude`), or an
/// `apiKeyHelper` in its `settings.json`.
pub(crate) fn credentials(
    env: &std::collections::BTreeMap<String, String>,
    _agent: &AgentSpec,
) -> Option<String> {
    use crate::preflight::{config_dir, has_var};
    if CLAUDE_KEY_VARS.iter().any(|k| has_var(env, k))
        || ["CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX"]
            .iter()
            .any(|k| has_var(env, k))
    {
        return None;
    }
    let dir = config_dir(env, "CLAUDE_CONFIG_DIR", ".claude");
    if let Some(dir) = &dir {
        let settings = std::fs::read_to_string(dir.join("settings.json")).unwrap_or_default();
        if dir.join(".credentials.json").is_file() || settings.contains("\"apiKeyHelper\"") {
            return None;
        }
    }
    let file = match &dir {
        Some(dir) => dir.join(".credentials.json").display().to_string(),
        None => "$CLAUDE_CONFIG_DIR/.credentials.json (no HOME or CLAUDE_CONFIG_DIR is set)".into(),
    };
    Some(format!(
        "no Claude Code credentials found: no {file} (run `claude` and log in as the user relay runs as, or set CLAUDE_CONFIG_DIR), and no {} among the agent's variables (add one with --secret ANTHROPIC_API_KEY); its turns will fail until it has one",
        CLAUDE_KEY_VARS.join(", ")
    ))
}

/// What Claude Code says on stderr for a `--resume` id it has no conversation for.
const NO_CONVERSATION: &str = "No conversation found";

/// Makes `claude -p` sessions (the pinned program unless the agent names one).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClaudeLauncher;

impl Launcher for ClaudeLauncher {
    fn info(&self) -> HarnessInfo {
        CLAUDE_INFO
    }

    fn preflight<'a>(
        &'a self,
        agent: &'a AgentSpec,
    ) -> BoxFuture<'a, Result<Preflight, HarnessError>> {
        Box::pin(crate::preflight::check_cli(
            ClaudeConfig::for_agent(agent, &CLAUDE_CLI, None),
            agent,
            credentials,
        ))
    }

    /// Checks that the program is there; the process itself starts in `open`.
    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>> {
        Box::pin(async move {
            let config = ClaudeConfig::for_agent(agent, &CLAUDE_CLI, relay);
            config.check_program()?;
            let (child, rx) = RestartableChild::new();
            let session = ClaudeSession { config, child };
            Ok(Spawned {
                session: Arc::new(session),
                events: rx,
            })
        })
    }
}

/// One agent's Claude Code session: at most one `claude` process, started by `open`.
struct ClaudeSession {
    config: ClaudeConfig,
    child: RestartableChild<ClaudeWire, Watched>,
}

/// The `claude` process of an open session.
type Child = Live<ClaudeWire, Watched>;

/// What the session watches of its `claude` process's wire.
#[derive(Clone)]
struct Watched {
    running: watch::Receiver<Option<Running>>,
    /// Stdout lines that were not stream-json (each logged when skipped).
    malformed: Arc<AtomicU64>,
}

impl ClaudeSession {
    /// Starts `claude` on `start` and does the handshake. Only then is the process's end
    /// reported as `ProcessExited`: a process that refuses the session ends quietly.
    async fn start(&self, start: Start<'_>) -> Result<Child, HarnessError> {
        let events = self.child.events()?;
        let wire = ClaudeWire::new().with_relay_mcp(self.config.relay.is_some());
        let running = wire.running();
        let malformed = wire.malformed();
        let session = match start {
            Start::New(id) | Start::Resume(id) | Start::Fork { id, .. } => id.to_string(),
        };
        let (io, _) = StdioChild::start(
            &command(&self.config, &start),
            wire,
            events,
            self.config.request_timeout,
            self.config.shutdown_grace,
            ("initialize", |wire: &mut ClaudeWire| wire.initialize()),
        )
        .await?;
        Ok(Live {
            io,
            session,
            extra: Watched { running, malformed },
        })
    }

    async fn start_new(&self) -> Result<Child, HarnessError> {
        let id = uuid::Uuid::new_v4().to_string();
        self.start(Start::New(&id))
            .await
            .map_err(|e| open_error("cannot start a claude session", e))
    }

    async fn open_child(
        &self,
        stored: Option<&str>,
    ) -> Result<(Child, Option<Lost>), HarnessError> {
        let Some(old) = stored else {
            return Ok((self.start_new().await?, None));
        };
        // Claude Code's ids are hyphenated lowercase uuids; it refuses anything else.
        let session_id =
            uuid::Uuid::parse_str(old).is_ok_and(|u| u.hyphenated().to_string() == old);
        let why = if !session_id {
            format!("{old} is not a Claude Code session id")
        } else {
            match self.start(Start::Resume(old)).await {
                Ok(child) => return Ok((child, None)),
                Err(HarnessError::ProcessExited { stderr_tail, .. })
                    if stderr_tail.contains(NO_CONVERSATION) =>
                {
                    let said = stderr_tail
                        .lines()
                        .find(|l| l.contains(NO_CONVERSATION))
                        .unwrap_or(NO_CONVERSATION)
                        .trim()
                        .to_string();
                    format!("claude has no conversation {old} ({said})")
                }
                Err(e) => {
                    return Err(open_error(
                        &format!("cannot resume claude session {old}"),
                        e,
                    ))
                }
            }
        };
        let child = self.start_new().await?;
        let lost = Lost::replaced(old, &child.session, &why);
        Ok((child, Some(lost)))
    }
}

impl ClaudeSession {
    /// Starts `claude` on a fork of `from`'s session (see [`super::fork`]).
    async fn fork_child(&self, from: &ForkSpec) -> Result<Child, HarnessError> {
        let src = from.thread_id.clone();
        let (cwd, keep) = (from.cwd.clone(), from.keep_turns);
        let mut env: std::collections::BTreeMap<String, String> = crate::process::inherited_env()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        env.extend(self.config.env.clone());
        let config_dir = crate::preflight::config_dir(&env, "CLAUDE_CONFIG_DIR", ".claude")
            .ok_or_else(|| HarnessError::Fork {
                detail: "no CLAUDE_CONFIG_DIR or HOME to find claude's sessions in".into(),
            })?;
        // Reading the transcript is blocking file I/O.
        let found = tokio::task::spawn_blocking(move || {
            let path = super::fork::find_transcript(&config_dir, &cwd, &src)?;
            let at = match keep {
                None | Some(0) => None,
                Some(keep) => {
                    let text = std::fs::read_to_string(&path).map_err(|e| HarnessError::Fork {
                        detail: format!("cannot read {}: {e}", path.display()),
                    })?;
                    super::fork::cut_after_turn(&text, keep)?
                }
            };
            Ok::<_, HarnessError>((path, at))
        })
        .await
        .map_err(|e| HarnessError::Io(std::io::Error::other(e)))??;
        if from.keep_turns == Some(0) {
            // Nothing kept: a new session (the source was found above).
            return self.start_new().await;
        }
        let (path, at) = found;
        let id = uuid::Uuid::new_v4().to_string();
        let start = Start::Fork {
            id: &id,
            from: &path.display().to_string(),
            at: at.as_deref(),
        };
        self.start(start).await.map_err(|e| HarnessError::Fork {
            detail: format!("claude could not fork session {}: {e}", from.thread_id),
        })
    }
}

/// A failed step of opening a session, named; a program that cannot start says so
/// by itself.
fn open_error(action: &str, err: HarnessError) -> HarnessError {
    match err {
        e @ HarnessError::Spawn { .. } => e,
        e => HarnessError::OpenSession {
            action: action.to_string(),
            source: Box::new(e),
        },
    }
}

impl HarnessSession for ClaudeSession {
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        Box::pin(async move {
            let _one = self.child.opening().await;
            if self.child.is_closed() {
                return Err(HarnessError::ChannelClosed);
            }
            if let Some(child) = self.child.live() {
                return Err(HarnessError::Incapable {
                    harness: Harness::ClaudeStreamJson,
                    what: format!(
                        "open a second conversation in a session (it has {})",
                        child.session
                    ),
                });
            }
            let (child, lost) = self.open_child(stored).await?;
            let id = child.session.clone();
            self.child.set(child);
            Ok(OpenedSession { id, lost })
        })
    }

    fn fork<'a>(
        &'a self,
        from: &'a ForkSpec,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        Box::pin(async move {
            let _one = self.child.opening().await;
            if self.child.is_closed() {
                return Err(HarnessError::ChannelClosed);
            }
            if let Some(child) = self.child.live() {
                return Err(HarnessError::Fork {
                    detail: format!("this session already holds conversation {}", child.session),
                });
            }
            let child = self.fork_child(from).await?;
            let id = child.session.clone();
            self.child.set(child);
            Ok(OpenedSession { id, lost: None })
        })
    }

    fn start_turn<'a>(
        &'a self,
        session_id: &'a str,
        text: &'a str,
        relay_turn_id: &'a str,
    ) -> BoxFuture<'a, Result<String, HarnessError>> {
        Box::pin(async move {
            let child = self.child.live_of(session_id)?;
            // A turn being interrupted ends in a moment: wait for that rather than
            // refuse the next turn (the runtime moves on right after it interrupts).
            let mut running = child.extra.running.clone();
            if running.borrow().as_ref().is_some_and(|r| r.interrupting) {
                let ended = running.wait_for(Option::is_none);
                let _ = tokio::time::timeout(self.config.request_timeout, ended).await;
            }
            let (turn, text) = (relay_turn_id.to_string(), text.to_string());
            child
                .io
                .call("start turn", move |wire| wire.start_turn(&turn, &text))
                .await?;
            Ok(relay_turn_id.to_string())
        })
    }

    fn steer<'a>(
        &'a self,
        _session_id: &'a str,
        _turn_id: &'a str,
        _text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async { Err(cannot_steer()) })
    }

    fn interrupt<'a>(
        &'a self,
        session_id: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            let child = self.child.live_of(session_id)?;
            let turn = turn_id.to_string();
            child
                .io
                .call("interrupt", move |wire| wire.interrupt(&turn))
                .await?;
            Ok(())
        })
    }

    fn respond_approval<'a>(
        &'a self,
        request_id: &'a str,
        decision: ApprovalDecision,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            let Some(child) = self.child.live() else {
                return Err(HarnessError::UnknownRequest {
                    request_id: request_id.to_string(),
                });
            };
            let id = request_id.to_string();
            child
                .io
                .call("approval", move |wire| wire.respond(&id, decision))
                .await?;
            Ok(())
        })
    }

    /// The `claude` process; pid 0 before `open` started one.
    fn endpoint(&self) -> Endpoint {
        Endpoint::Process {
            pid: self.child.pid(),
        }
    }

    fn stderr_tail(&self) -> String {
        self.child.stderr_tail()
    }

    fn shutdown(&self) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            if let Some(child) = self.child.shutdown().await {
                let skipped =
                    child.extra.malformed.load(Ordering::Relaxed) + child.io.malformed_lines();
                if skipped > 0 {
                    tracing::warn!(skipped, session = %child.session, "claude wrote stdout lines that were not stream-json");
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn credentials_are_a_key_a_login_file_or_a_helper_else_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let agent = AgentSpec::new("c", Harness::ClaudeStreamJson, "/w");
        let config = dir.path().display().to_string();
        let mut env = BTreeMap::from([("CLAUDE_CONFIG_DIR".to_string(), config.clone())]);
        let warning = credentials(&env, &agent).unwrap();
        assert!(
            warning.starts_with(&format!(
                "no Claude Code credentials found: no {config}/.credentials.json"
            )),
            "{warning}"
        );
        std::fs::write(dir.path().join("settings.json"), r#"{"apiKeyHelper":"k"}"#).unwrap();
        assert_eq!(credentials(&env, &agent), None);
        std::fs::remove_file(dir.path().join("settings.json")).unwrap();
        std::fs::write(dir.path().join(".credentials.json"), "{}").unwrap();
        assert_eq!(credentials(&env, &agent), None);
        std::fs::remove_file(dir.path().join(".credentials.json")).unwrap();
        env.insert("ANTHROPIC_API_KEY".into(), "***".into());
        assert_eq!(credentials(&env, &agent), None);
    }
}
