//! Codex behind the harness seam ([`crate::seam`]): [`CodexLauncher`] spawns
//! `codex app-server` for an agent, and its session opens the agent's thread (resumed,
//! or started with the loss said; or forked from another agent's thread) and runs turns
//! through [`CodexSession`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use relay_protocol::domain::{AgentSpec, ApprovalDecision, ForkSpec, Harness};

use super::{CodexConfig, CodexSession, ThreadOptions, CODEX_CLI};
use crate::access::RelayAccess;
use crate::error::HarnessError;
use crate::preflight::{config_dir, has_var};
use crate::seam::{
    BoxFuture, Endpoint, HarnessInfo, HarnessSession, Launcher, OpenedSession, Preflight, Spawned,
};

/// Codex app-server: everything the seam offers.
pub const CODEX_INFO: HarnessInfo = HarnessInfo {
    harness: Harness::CodexAppServer,
    name: "codex",
    program: "codex app-server",
    capabilities: Harness::CodexAppServer.capabilities(),
    screen: false,
};

/// Spawns `codex app-server` sessions (the pinned program unless the agent names one).
#[derive(Debug, Clone, Copy, Default)]
pub struct CodexLauncher;

impl Launcher for CodexLauncher {
    fn info(&self) -> HarnessInfo {
        CODEX_INFO
    }

    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>> {
        Box::pin(async move {
            let (session, events) =
                CodexSession::spawn(CodexConfig::for_agent(agent, &CODEX_CLI, relay)).await?;
            let options = ThreadOptions {
                cwd: Some(PathBuf::from(&agent.cwd)),
                model: agent.model.clone(),
                ..ThreadOptions::default()
            };
            Ok(Spawned {
                session: std::sync::Arc::new(CodexAgent { session, options }),
                events,
            })
        })
    }

    fn preflight<'a>(
        &'a self,
        agent: &'a AgentSpec,
    ) -> BoxFuture<'a, Result<Preflight, HarnessError>> {
        Box::pin(crate::preflight::check_cli(
            CodexConfig::for_agent(agent, &CODEX_CLI, None),
            agent,
            credentials,
        ))
    }
}

/// What codex 0.169.0 takes its credentials from, besides `codex login`'s
/// `$CODEX_HOME/auth.json` (`CODEX_HOME` defaults to `~/.codex`).
const CODEX_KEY_VARS: [&str; 3] = ["OPENAI_API_KEY", "CODEX_API_KEY", "CODEX_ACCESS_TOKEN"];

/// Why codex will find no credentials, if none of its ways is there: a key variable of
/// the agent's, `auth.json`, or a config naming another model provider (which has its
/// own auth, not checked here), in `config.toml` or `-c model_provider=...`.
fn credentials(env: &BTreeMap<String, String>, agent: &AgentSpec) -> Option<String> {
    if CODEX_KEY_VARS.iter().any(|k| has_var(env, k)) {
        return None;
    }
    if agent.args.iter().any(|a| a.contains("model_provider")) {
        return None;
    }
    let home = config_dir(env, "CODEX_HOME", ".codex");
    if let Some(home) = &home {
        if home.join("auth.json").is_file() {
            return None;
        }
        let config = std::fs::read_to_string(home.join("config.toml")).unwrap_or_default();
        if top_level_string(&config, "model_provider").is_some_and(|p| p != "openai") {
            return None;
        }
    }
    let auth = match &home {
        Some(home) => home.join("auth.json").display().to_string(),
        None => "$CODEX_HOME/auth.json (no HOME or CODEX_HOME is set)".into(),
    };
    Some(format!(
        "no codex credentials found: no {auth} (run `codex login` as the user relay runs as, or set CODEX_HOME), no {} among the agent's variables (add one with --secret OPENAI_API_KEY), and no other model_provider in its config.toml; its turns will fail until it has one",
        CODEX_KEY_VARS.join(", ")
    ))
}

/// The value of `key = "value"` at the top of a TOML file (before any `[table]`): enough
/// to read `model_provider` without a TOML parser.
fn top_level_string(toml: &str, key: &str) -> Option<String> {
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            return None;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        if k.trim() != key {
            continue;
        }
        let v = v.split('#').next().unwrap_or("").trim();
        return Some(v.trim_matches(|c| c == '"' || c == '\'').to_string());
    }
    None
}

/// One agent's `codex app-server`, with the settings of the threads it starts.
struct CodexAgent {
    session: CodexSession,
    options: ThreadOptions,
}

impl CodexAgent {
    async fn start_thread(&self) -> Result<String, HarnessError> {
        self.session
            .start_thread(&self.options)
            .await
            .map_err(|e| HarnessError::OpenSession {
                action: "cannot start a codex thread".into(),
                source: Box::new(e),
            })
    }
}

impl HarnessSession for CodexAgent {
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        Box::pin(async move {
            let Some(old) = stored else {
                let id = self.start_thread().await?;
                return Ok(OpenedSession { id, lost: None });
            };
            match self.session.resume_thread(old).await {
                Ok(t) => Ok(OpenedSession {
                    id: t.thread_id,
                    lost: None,
                }),
                Err(HarnessError::SessionNotFound { .. }) => Ok(OpenedSession::replacing(
                    old,
                    self.start_thread().await?,
                    &format!("codex no longer has thread {old}"),
                )),
                Err(e) => Err(HarnessError::OpenSession {
                    action: format!("cannot resume codex thread {old}"),
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
            let src = &from.thread_id;
            match self
                .session
                .fork_thread(src, from.keep_turns, &self.options)
                .await
            {
                Ok(id) => Ok(OpenedSession { id, lost: None }),
                Err(HarnessError::SessionNotFound { .. }) => Err(HarnessError::Fork {
                    detail: format!("codex has no thread {src} (agent {})", from.agent),
                }),
                Err(e) => Err(HarnessError::Fork {
                    detail: format!("codex could not fork thread {src}: {e}"),
                }),
            }
        })
    }

    fn start_turn<'a>(
        &'a self,
        session_id: &'a str,
        text: &'a str,
        _relay_turn_id: &'a str,
    ) -> BoxFuture<'a, Result<String, HarnessError>> {
        Box::pin(self.session.start_turn(session_id, text))
    }

    fn steer<'a>(
        &'a self,
        session_id: &'a str,
        turn_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.session
                .steer(session_id, turn_id, text)
                .await
                .map_err(no_active_turn)
        })
    }

    fn interrupt<'a>(
        &'a self,
        session_id: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.session
                .interrupt(session_id, turn_id)
                .await
                .map_err(no_active_turn)
        })
    }

    fn respond_approval<'a>(
        &'a self,
        request_id: &'a str,
        decision: ApprovalDecision,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(self.session.respond_approval(request_id, decision))
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Process {
            pid: self.session.pid(),
        }
    }

    fn stderr_tail(&self) -> String {
        self.session.stderr_tail()
    }

    fn shutdown(&self) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(self.session.shutdown())
    }
}

/// Codex's refusal of a steer or interrupt with no turn active (`no active turn to
/// steer`, `... to interrupt`; see the module docs of [`super`]), typed.
fn no_active_turn(err: HarnessError) -> HarnessError {
    match err {
        HarnessError::Rpc { ref message, .. } if message.contains("no active turn") => {
            HarnessError::NoActiveTurn {
                detail: err.to_string(),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codex::app_server::error_code::INVALID_REQUEST;

    #[test]
    fn credentials_are_found_in_each_way_codex_reads_them_or_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("codex-home");
        std::fs::create_dir_all(&home).unwrap();
        let agent = AgentSpec::new("a", Harness::CodexAppServer, "/w");
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let codex_home = home.display().to_string();
        let bare = env(&[("CODEX_HOME", &codex_home)]);
        let warning = credentials(&bare, &agent).unwrap();
        assert!(
            warning.starts_with(&format!(
                "no codex credentials found: no {}/auth.json",
                codex_home
            )),
            "{warning}"
        );
        // A key among the agent's variables.
        let keyed = env(&[("CODEX_HOME", &codex_home), ("OPENAI_API_KEY", "sk-1")]);
        assert_eq!(credentials(&keyed, &agent), None);
        // The OpenAI provider named: still nothing.
        std::fs::write(home.join("config.toml"), "model_provider = \"openai\"\n").unwrap();
        assert!(credentials(&bare, &agent).is_some());
        // Another provider (its own auth).
        std::fs::write(
            home.join("config.toml"),
            "# a mock\nmodel = \"m\"\nmodel_provider = \"mock\" # here\n[model_providers.mock]\n",
        )
        .unwrap();
        assert_eq!(credentials(&bare, &agent), None);
        std::fs::remove_file(home.join("config.toml")).unwrap();
        // `codex login`'s file, under CODEX_HOME or else ~/.codex.
        std::fs::write(home.join("auth.json"), "{}").unwrap();
        assert_eq!(credentials(&bare, &agent), None);
        let in_home = env(&[("HOME", &dir.path().display().to_string())]);
        assert!(credentials(&in_home, &agent).is_some());
        std::fs::rename(&home, dir.path().join(".codex")).unwrap();
        assert_eq!(credentials(&in_home, &agent), None);
    }

    #[test]
    fn no_active_turn_refusals_are_typed_and_read_as_before() {
        let refusal = |message: &str| HarnessError::Rpc {
            code: INVALID_REQUEST,
            message: message.into(),
        };
        for message in ["no active turn to steer", "no active turn to interrupt"] {
            let err = no_active_turn(refusal(message));
            assert!(matches!(err, HarnessError::NoActiveTurn { .. }), "{err:?}");
            assert_eq!(err.to_string(), refusal(message).to_string());
        }
        assert!(matches!(
            no_active_turn(refusal("thread not found: t")),
            HarnessError::Rpc { .. }
        ));
    }
}
