//! Pi behind the harness seam ([`crate::seam`]): [`PiLauncher`] makes a session for an
//! agent; the session starts `pi --mode rpc` when it opens the session, and drives
//! it through the stdio owner ([`StdioChild`]) with [`PiWire`].

use std::sync::Arc;

use relay_protocol::domain::{AgentSpec, ApprovalDecision, ForkSpec, Harness};
use serde_json::Value;

use super::config::{command, Open, PiConfig};
use super::wire::{PiWire, REFUSED};
use super::PI_CLI;
use crate::access::RelayAccess;
use crate::error::HarnessError;
use crate::restartable::{Live, RestartableChild};
use crate::seam::{
    BoxFuture, Endpoint, HarnessInfo, HarnessSession, Launcher, OpenedSession, Preflight, Spawned,
};
use crate::stdio::StdioChild;

/// Pi RPC: steer and abort, resume by `--session`; no approvals (its tools run at once)
/// and no turn ids.
pub const PI_INFO: HarnessInfo = HarnessInfo {
    harness: Harness::PiRpc,
    name: "pi",
    program: "pi --mode rpc",
    capabilities: Harness::PiRpc.capabilities(),
    screen: false,
};

/// The variables pi 0.73.1 takes a provider's key from (`pi-ai`'s `env-api-keys.js`).
const PI_KEY_VARS: [&str; 29] = [
    "ANTHROPIC_OAUTH_TOKEN",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "DEEPSEEK_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_CLOUD_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GROQ_API_KEY",
    "CEREBRAS_API_KEY",
    "XAI_API_KEY",
    "OPENROUTER_API_KEY",
    "AI_GATEWAY_API_KEY",
    "ZAI_API_KEY",
    "MISTRAL_API_KEY",
    "MINIMAX_API_KEY",
    "MINIMAX_CN_API_KEY",
    "MOONSHOT_API_KEY",
    "HF_TOKEN",
    "FIREWORKS_API_KEY",
    "OPENCODE_API_KEY",
    "KIMI_API_KEY",
    "CLOUDFLARE_API_KEY",
    "XIAOMI_API_KEY",
    "COPILOT_GITHUB_TOKEN",
    "GH_TOKEN",
    "GITHUB_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
];

/// Why pi will find no credentials, if none of its ways is there: a provider's key
/// variable of the agent's, `pi`'s `/login` file `auth.json`, or a `models.json` (its
/// own providers, each with its key) in its agent dir (`PI_CODING_AGENT_DIR`, else
/// `~/.pi/agent`).
pub(crate) fn credentials(
    env: &std::collections::BTreeMap<String, String>,
    _agent: &AgentSpec,
) -> Option<String> {
    use crate::preflight::{config_dir, has_var};
    if PI_KEY_VARS.iter().any(|k| has_var(env, k)) {
        return None;
    }
    let dir = config_dir(env, "PI_CODING_AGENT_DIR", ".pi/agent");
    if let Some(dir) = &dir {
        if dir.join("auth.json").is_file() || dir.join("models.json").is_file() {
            return None;
        }
    }
    let where_ = match &dir {
        Some(dir) => dir.display().to_string(),
        None => "$PI_CODING_AGENT_DIR (no HOME or PI_CODING_AGENT_DIR is set)".into(),
    };
    Some(format!(
        "no pi credentials found: no auth.json or models.json in {where_} (run `pi` and /login as the user relay runs as, or set PI_CODING_AGENT_DIR), and no provider key (ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY...) among the agent's variables (add one with --secret); its turns will fail until it has one"
    ))
}

/// What pi says on stderr, before it exits, when `--session` names no session it has.
const NO_SESSION: &str = "No session found matching";

/// Makes `pi --mode rpc` sessions (the pinned program unless the agent names one).
#[derive(Debug, Clone, Copy, Default)]
pub struct PiLauncher;

impl PiLauncher {
    /// A session with `config`; pi starts when it is opened.
    pub fn spawn_with(config: PiConfig) -> Result<Spawned, HarnessError> {
        config.check_program()?;
        let (child, rx) = RestartableChild::new();
        let session = PiSession { config, child };
        Ok(Spawned {
            session: Arc::new(session),
            events: rx,
        })
    }
}

impl Launcher for PiLauncher {
    fn info(&self) -> HarnessInfo {
        PI_INFO
    }

    fn preflight<'a>(
        &'a self,
        agent: &'a AgentSpec,
    ) -> BoxFuture<'a, Result<Preflight, HarnessError>> {
        Box::pin(crate::preflight::check_cli(
            PiConfig::for_agent(agent, &PI_CLI, None),
            agent,
            credentials,
        ))
    }

    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>> {
        Box::pin(async move { PiLauncher::spawn_with(PiConfig::for_agent(agent, &PI_CLI, relay)) })
    }
}

/// One agent's pi: at most one child at a time, all of whose events go to the one
/// stream handed out at spawn.
struct PiSession {
    config: PiConfig,
    child: RestartableChild<PiWire>,
}

impl PiSession {
    /// The child running `session`.
    fn child_of(&self, session: &str) -> Result<StdioChild<PiWire>, HarnessError> {
        Ok(self.child.live_of(session)?.io)
    }

    /// Starts pi on `open`, asks its session id and arms it: from then on its end is
    /// the session's. On failure the child is gone, unarmed.
    async fn start(&self, open: Open<'_>) -> Result<String, HarnessError> {
        let events = self.child.events()?;
        let (child, state) = StdioChild::start(
            &command(&self.config, open),
            PiWire::default(),
            events,
            self.config.request_timeout,
            self.config.shutdown_grace,
            ("get_state", |wire: &mut PiWire| Ok(wire.get_state())),
        )
        .await?;
        let id = match session_id(state) {
            Ok(id) => id,
            Err(e) => {
                child.shutdown().await;
                return Err(e);
            }
        };
        self.child.set(Live {
            io: child,
            session: id.clone(),
            extra: (),
        });
        Ok(id)
    }

    async fn start_new(&self) -> Result<String, HarnessError> {
        self.start(Open::New)
            .await
            .map_err(|e| HarnessError::OpenSession {
                action: "cannot start a pi session".into(),
                source: Box::new(e),
            })
    }
}

impl PiSession {
    /// Starts pi on a fork of `from`'s session: `--fork` copies all of it into a new
    /// session here; when turns are to be left out, pi's `fork` at the first user
    /// message left out switches to a newer session holding what came before it, and
    /// the whole copy, Relay's own intermediate, is deleted. Returns the session's id.
    async fn fork_child(&self, from: &ForkSpec) -> Result<String, HarnessError> {
        let src = &from.thread_id;
        let copy = match self.start(Open::Fork(src)).await {
            Ok(id) => id,
            Err(HarnessError::ProcessExited { stderr_tail, .. })
                if stderr_tail.contains(NO_SESSION) =>
            {
                return Err(HarnessError::Fork {
                    detail: format!("pi has no session {src} (agent {})", from.agent),
                })
            }
            Err(e) => return Err(e),
        };
        let Some(keep) = from.keep_turns else {
            return Ok(copy);
        };
        let child = self.child_of(&copy)?;
        let messages = child
            .call("get_fork_messages", |wire| Ok(wire.fork_messages()))
            .await?;
        let entries: Vec<String> = messages
            .get("messages")
            .and_then(Value::as_array)
            .map(|m| {
                m.iter()
                    .filter_map(|e| e.get("entryId").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        // The first user message left out: pi keeps what came before it.
        let Some(cut) = entries.get(keep as usize).cloned() else {
            return Ok(copy);
        };
        let state = child.call("get_state", |wire| Ok(wire.get_state())).await?;
        let copy_file = state
            .get("sessionFile")
            .and_then(Value::as_str)
            .map(std::path::PathBuf::from);
        let forked = child.call("fork", move |wire| Ok(wire.fork(&cut))).await?;
        if forked.get("cancelled").and_then(Value::as_bool) == Some(true) {
            return Err(HarnessError::Fork {
                detail: "a pi extension cancelled the fork".into(),
            });
        }
        let id = session_id(child.call("get_state", |wire| Ok(wire.get_state())).await?)?;
        self.child.set(Live {
            io: child,
            session: id.clone(),
            extra: (),
        });
        if let Some(file) = copy_file.filter(|f| intermediate(f, src, &copy, &id)) {
            let removed = tokio::task::spawn_blocking(move || std::fs::remove_file(&file)).await;
            if let Ok(Err(err)) = removed {
                tracing::warn!(%err, session = %copy, "pi: cannot delete the fork's whole copy");
            }
        }
        Ok(id)
    }
}

/// Whether `file`, the session file pi named for the copy `copy` of session `src`
/// before the fork switched to session `now`, is that intermediate copy and nothing
/// else: a copy distinct from both, whose file names it (pi's files are
/// `<time>_<id>.jsonl`). Never the source's, nor the session now in use.
fn intermediate(file: &std::path::Path, src: &str, copy: &str, now: &str) -> bool {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    !copy.is_empty()
        && copy != src
        && copy != now
        && name.ends_with(".jsonl")
        && name.contains(copy)
        && !name.contains(src)
        && !name.contains(now)
}

/// The `sessionId` of a `get_state` answer.
fn session_id(state: Value) -> Result<String, HarnessError> {
    state
        .get("sessionId")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .ok_or_else(|| HarnessError::Rpc {
            code: REFUSED,
            message: format!("pi's get_state has no sessionId: {state}"),
        })
}

impl HarnessSession for PiSession {
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        Box::pin(async move {
            let _one = self.child.opening().await;
            if let Some(Live {
                io: child,
                session: open,
                ..
            }) = self.child.live()
            {
                // Pi holds one session for its life; its end is already reported.
                if let Some(exit) = child.exit() {
                    return Err(exit.to_error());
                }
                if stored.is_some_and(|s| s != open) {
                    return Err(HarnessError::Rpc {
                        code: REFUSED,
                        message: format!(
                            "this pi session holds conversation {open}; open another in a new session"
                        ),
                    });
                }
                return Ok(OpenedSession {
                    id: open,
                    lost: None,
                });
            }
            let Some(old) = stored else {
                let id = self.start_new().await?;
                return Ok(OpenedSession { id, lost: None });
            };
            match self.start(Open::Resume(old)).await {
                Ok(id) => Ok(OpenedSession { id, lost: None }),
                Err(HarnessError::ProcessExited { stderr_tail, .. })
                    if stderr_tail.contains(NO_SESSION) =>
                {
                    Ok(OpenedSession::replacing(
                        old,
                        self.start_new().await?,
                        &format!("pi has no session {old} (it keeps one only once a turn ran)"),
                    ))
                }
                Err(e) => Err(HarnessError::OpenSession {
                    action: format!("cannot resume pi session {old}"),
                    source: Box::new(e),
                }),
            }
        })
    }

    fn fork<'a>(
        &'a self,
        from: &'a ForkSpec,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        Box::pin(async move {
            let _one = self.child.opening().await;
            if let Some(live) = self.child.live() {
                return Err(HarnessError::Fork {
                    detail: format!(
                        "this pi session already holds conversation {}",
                        live.session
                    ),
                });
            }
            let err = match self.fork_child(from).await {
                Ok(id) => return Ok(OpenedSession { id, lost: None }),
                Err(e @ HarnessError::Fork { .. }) => e,
                Err(e) => HarnessError::Fork {
                    detail: format!("pi could not fork session {}: {e}", from.thread_id),
                },
            };
            // A child started for the fork must not go on as a session of its own.
            if let Some(live) = self.child.live() {
                live.io.shutdown().await;
            }
            Err(err)
        })
    }

    fn start_turn<'a>(
        &'a self,
        session_id: &'a str,
        text: &'a str,
        relay_turn_id: &'a str,
    ) -> BoxFuture<'a, Result<String, HarnessError>> {
        Box::pin(async move {
            let child = self.child_of(session_id)?;
            let (turn, text) = (relay_turn_id.to_string(), text.to_string());
            child
                .call("prompt", move |wire| wire.prompt(&turn, &text))
                .await?;
            Ok(relay_turn_id.to_string())
        })
    }

    fn steer<'a>(
        &'a self,
        session_id: &'a str,
        turn_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            let child = self.child_of(session_id)?;
            let (turn, text) = (turn_id.to_string(), text.to_string());
            child
                .call("steer", move |wire| wire.steer(&turn, &text))
                .await?;
            Ok(())
        })
    }

    fn interrupt<'a>(
        &'a self,
        session_id: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            let child = self.child_of(session_id)?;
            let turn = turn_id.to_string();
            child.call("abort", move |wire| wire.abort(&turn)).await?;
            Ok(())
        })
    }

    fn respond_approval<'a>(
        &'a self,
        request_id: &'a str,
        _decision: ApprovalDecision,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        crate::seam::never_pending(request_id)
    }

    /// The pid of pi, or 0 before the session is opened.
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
            self.child.shutdown().await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use relay_protocol::harness::HarnessEvent;

    use super::*;

    #[test]
    fn credentials_are_a_provider_key_or_pis_own_files_else_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let agent = AgentSpec::new("p", Harness::PiRpc, "/w");
        let home = dir.path().display().to_string();
        let mut env = std::collections::BTreeMap::from([("HOME".to_string(), home.clone())]);
        let warning = credentials(&env, &agent).unwrap();
        assert!(
            warning.contains(&format!("no auth.json or models.json in {home}/.pi/agent")),
            "{warning}"
        );
        let agent_dir = dir.path().join(".pi/agent");
        std::fs::create_dir_all(&agent_dir).unwrap();
        std::fs::write(agent_dir.join("auth.json"), "{}").unwrap();
        assert_eq!(credentials(&env, &agent), None);
        std::fs::remove_file(agent_dir.join("auth.json")).unwrap();
        env.insert("GEMINI_API_KEY".into(), "g".into());
        assert_eq!(credentials(&env, &agent), None);
    }

    #[tokio::test]
    async fn a_missing_program_fails_the_spawn_and_approvals_are_never_pending() {
        let missing = PiLauncher::spawn_with(PiConfig::new("/nonexistent/pi"));
        assert!(matches!(missing, Err(HarnessError::Spawn { .. })));
        let mut unknown = PiConfig::new("relay-no-such-program");
        unknown.env.insert("PATH".into(), "/nonexistent".into());
        assert!(matches!(
            PiLauncher::spawn_with(unknown),
            Err(HarnessError::Spawn { .. })
        ));

        let Spawned {
            session,
            mut events,
        } = PiLauncher::spawn_with(PiConfig::new("/bin/sh")).unwrap();
        assert!(matches!(
            session
                .respond_approval("r1", ApprovalDecision::Accept)
                .await,
            Err(HarnessError::UnknownRequest { .. })
        ));
        assert!(matches!(
            session.start_turn("c", "hi", "t1").await,
            Err(HarnessError::SessionNotFound { .. })
        ));
        assert_eq!(session.endpoint(), Endpoint::Process { pid: 0 });
        // Never opened: shutting down still ends the stream with the exit.
        session.shutdown().await.unwrap();
        session.shutdown().await.unwrap();
        assert!(matches!(
            events.recv().await,
            Some(HarnessEvent::ProcessExited { .. })
        ));
        assert!(events.recv().await.is_none());
    }

    #[test]
    fn only_the_forks_intermediate_copy_is_deleted() {
        let p = |n: &str| std::path::PathBuf::from(format!("/s/--w--/{n}"));
        let file = p("2026-01-01T00-00-00-000Z_c0py.jsonl");
        assert!(intermediate(&file, "src1", "c0py", "n3w"));
        // pi opened the source itself, or the fork did not switch: never deleted.
        assert!(!intermediate(&p("t_src1.jsonl"), "src1", "src1", "n3w"));
        assert!(!intermediate(&file, "src1", "c0py", "c0py"));
        // A file that is not the copy's.
        assert!(!intermediate(&p("t_src1.jsonl"), "src1", "c0py", "n3w"));
        assert!(!intermediate(&p("t_n3w.jsonl"), "src1", "c0py", "n3w"));
        assert!(!intermediate(&p("c0py"), "src1", "c0py", "n3w"));
        assert!(!intermediate(&file, "src1", "", "n3w"));
    }
}
