//! ACP agents behind the harness seam ([`crate::seam`]): [`AcpLauncher`] makes a session
//! for an agent; the session starts the agent's program and `initialize`s it when it is
//! first opened, then opens the agent's session by request (`session/resume`,
//! `session/load` or `session/new`) and drives it through the stdio owner
//! ([`StdioChild`]) with [`AcpWire`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_protocol::acp::{self, method, AgentCapabilities, InitializeResponse};
use relay_protocol::domain::{AgentSpec, ApprovalDecision, Harness, ProgramInfo};
use serde_json::Value;

use super::preset::{credentials, write_settings, AcpConfig, Preset};
use super::quirks;
use super::wire::AcpWire;
use crate::access::{RelayAccess, MCP_ENV, MCP_SERVER};
use crate::error::HarnessError;
use crate::process::lock;
use crate::restartable::{Live, RestartableChild};
use crate::seam::{
    BoxFuture, Endpoint, HarnessInfo, HarnessSession, Launcher, OpenedSession, Preflight, Spawned,
};
use crate::stdio::StdioChild;

/// After a `session/load`, how long its replay must have been quiet before the session
/// is taken as open, and the longest it is waited for.
const REPLAY_QUIET: Duration = Duration::from_millis(300);
const REPLAY_MOST: Duration = Duration::from_secs(10);

/// ACP agents, one launcher per harness (the generic `acp` and each preset).
#[derive(Debug, Clone, Copy)]
pub struct AcpLauncher {
    harness: Harness,
}

impl AcpLauncher {
    /// The launcher of `harness`, one of the ACP ones ([`Harness::is_acp`]).
    pub const fn new(harness: Harness) -> AcpLauncher {
        AcpLauncher { harness }
    }

    /// A session with `config`; the agent starts when it is opened.
    pub fn spawn_with(config: AcpConfig) -> Result<Spawned, HarnessError> {
        config.cli.check_program()?;
        let (child, rx) = RestartableChild::new();
        let session = AcpSession {
            config,
            child,
            program: Mutex::new(None),
        };
        Ok(Spawned {
            session: Arc::new(session),
            events: rx,
        })
    }
}

impl Launcher for AcpLauncher {
    fn info(&self) -> HarnessInfo {
        let preset = Preset::of(self.harness);
        HarnessInfo {
            harness: self.harness,
            name: preset.name(),
            program: preset.program_name(),
            capabilities: self.harness.capabilities(),
            screen: false,
        }
    }

    fn preflight<'a>(
        &'a self,
        agent: &'a AgentSpec,
    ) -> BoxFuture<'a, Result<Preflight, HarnessError>> {
        Box::pin(async move {
            let config = AcpConfig::for_agent(agent, None)?;
            match config.preset {
                // Any program: `--version` may mean nothing to it.
                Preset::Generic => {
                    tokio::task::spawn_blocking(move || config.cli.check_program())
                        .await
                        .map_err(|e| HarnessError::Io(std::io::Error::other(e)))??;
                    Ok(Preflight::default())
                }
                _ => crate::preflight::check_cli(config.cli, agent, credentials).await,
            }
        })
    }

    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>> {
        Box::pin(async move { AcpLauncher::spawn_with(AcpConfig::for_agent(agent, relay)?) })
    }
}

/// What is kept beside the running agent.
#[derive(Clone)]
struct Extra {
    capabilities: AgentCapabilities,
    /// The agent names itself Gemini CLI (see [`quirks`]).
    gemini: bool,
    /// Updates read while no turn ran (a load's replay).
    quiet: Arc<AtomicU64>,
}

/// One agent's ACP process: at most one at a time, all of whose events go to the one
/// stream handed out at spawn.
struct AcpSession {
    config: AcpConfig,
    child: RestartableChild<AcpWire, Extra>,
    program: Mutex<Option<ProgramInfo>>,
}

impl AcpSession {
    fn name(&self) -> &'static str {
        self.config.preset.name()
    }

    /// The child running `session`.
    fn child_of(&self, session: &str) -> Result<StdioChild<AcpWire>, HarnessError> {
        Ok(self.child.live_of(session)?.io)
    }

    /// Starts the agent and `initialize`s it; only then is it armed, so an agent that
    /// never answers ends quietly with the error.
    async fn start(&self) -> Result<(StdioChild<AcpWire>, Extra), HarnessError> {
        if let Some(dir) = self.config.settings.clone() {
            let preset = self.config.preset;
            tokio::task::spawn_blocking(move || write_settings(preset, &dir))
                .await
                .map_err(|e| HarnessError::Io(std::io::Error::other(e)))??;
        }
        let events = self.child.events()?;
        let wire = match self.config.preset {
            Preset::Gemini => AcpWire::titled_by_command(),
            _ => AcpWire::default(),
        };
        let quiet = wire.quiet_counter();
        let initialize = acp::InitializeRequest {
            protocol_version: acp::PROTOCOL_VERSION,
            // Nothing: no file system or terminal of Relay's, so every tool the agent
            // runs is its own, behind its own permission requests.
            client_capabilities: acp::ClientCapabilities::default(),
            client_info: Some(acp::Implementation {
                name: "relay".into(),
                title: None,
                version: env!("CARGO_PKG_VERSION").into(),
            }),
        };
        let (io, answer) = StdioChild::start(
            &self.config.cli.process(self.config.cli.args.clone()),
            wire,
            events,
            self.config.cli.request_timeout,
            self.config.cli.shutdown_grace,
            (method::INITIALIZE, move |w: &mut AcpWire| {
                Ok(w.request(method::INITIALIZE, initialize))
            }),
        )
        .await
        .map_err(|e| HarnessError::OpenSession {
            action: format!("{} did not start as an ACP agent (initialize)", self.name()),
            source: Box::new(e),
        })?;
        let init: InitializeResponse = match serde_json::from_value(answer) {
            Ok(init) => init,
            Err(e) => {
                io.shutdown().await;
                return Err(HarnessError::Rpc {
                    code: acp::RpcError::INVALID_PARAMS,
                    message: format!("{}'s answer to initialize is not ACP's: {e}", self.name()),
                });
            }
        };
        let info = init.agent_info.clone().unwrap_or_default();
        let gemini = info.name.to_ascii_lowercase().contains("gemini");
        *lock(&self.program) = Some(ProgramInfo {
            name: match info.name.is_empty() {
                true => self.name().to_string(),
                false => info.name,
            },
            version: info.version,
            protocol_version: Some(u32::from(init.protocol_version)),
            capabilities: init
                .agent_capabilities
                .names()
                .into_iter()
                .map(str::to_string)
                .collect(),
        });
        let extra = Extra {
            capabilities: init.agent_capabilities,
            gemini,
            quiet,
        };
        Ok((io, extra))
    }

    /// Relay's MCP server for the session, when the agent reaches Relay and takes
    /// stdio servers: `relay mcp` with the variables it needs (in the request, not on a
    /// command line).
    fn mcp_servers(&self) -> Vec<acp::McpServer> {
        let Some(relay) = &self.config.cli.relay else {
            return Vec::new();
        };
        let (command, args) = relay.mcp_command();
        let env = relay
            .env()
            .into_iter()
            .filter(|(k, _)| MCP_ENV.contains(k))
            .map(|(name, value)| acp::NameValue {
                name: name.to_string(),
                value,
            })
            .collect();
        vec![acp::McpServer {
            kind: None,
            name: MCP_SERVER.to_string(),
            command: Some(command),
            args,
            env,
            url: None,
            headers: Vec::new(),
        }]
    }

    fn cwd(&self) -> String {
        self.config
            .cli
            .cwd
            .as_ref()
            .map(|c| c.display().to_string())
            .unwrap_or_else(|| ".".into())
    }

    async fn new_session(&self, io: &StdioChild<AcpWire>) -> Result<String, HarnessError> {
        let params = acp::NewSessionRequest {
            cwd: self.cwd(),
            mcp_servers: self.mcp_servers(),
        };
        let answer = io
            .call(method::SESSION_NEW, move |w| {
                Ok(w.request(method::SESSION_NEW, params))
            })
            .await
            .map_err(|e| HarnessError::OpenSession {
                action: format!("{} could not start a session", self.name()),
                source: Box::new(e),
            })?;
        let r: acp::NewSessionResponse =
            serde_json::from_value(answer).map_err(|e| HarnessError::Rpc {
                code: acp::RpcError::INVALID_PARAMS,
                message: format!("{}'s answer to session/new is not ACP's: {e}", self.name()),
            })?;
        Ok(r.session_id)
    }

    /// Reopens `old` by `session/resume` where offered (no replay), else by
    /// `session/load` (its replay consumed). `Ok(Err(why))` when the agent could not:
    /// it no longer has it, or offers neither.
    async fn reopen(
        &self,
        io: &StdioChild<AcpWire>,
        extra: &Extra,
        old: &str,
    ) -> Result<Result<(), String>, HarnessError> {
        let caps = &extra.capabilities;
        let how = if caps.can_resume() {
            method::SESSION_RESUME
        } else if caps.load_session {
            method::SESSION_LOAD
        } else {
            return Ok(Err(format!(
                "{} offers neither session/resume nor session/load",
                self.name()
            )));
        };
        if how == method::SESSION_LOAD && extra.gemini {
            quirks::gemini_wait_for_next_minute(&self.config.cli.env, old).await;
        }
        let params = acp::LoadSessionRequest {
            session_id: old.to_string(),
            cwd: self.cwd(),
            mcp_servers: self.mcp_servers(),
        };
        let session = old.to_string();
        let answer = io
            .call(how, move |w| {
                w.set_session(&session);
                Ok(w.request(how, params))
            })
            .await;
        match answer {
            Ok(_) => {}
            Err(HarnessError::Rpc { message, code }) => {
                return Ok(Err(format!(
                    "{} could not reopen session {old} ({how}: {message}, code {code})",
                    self.name()
                )))
            }
            Err(e) => return Err(e),
        }
        if how == method::SESSION_LOAD {
            wait_quiet(&extra.quiet).await;
        }
        Ok(Ok(()))
    }
}

/// Waits until no update has come for [`REPLAY_QUIET`] (at most [`REPLAY_MOST`]): a
/// load's replay may arrive after its answer (Gemini CLI sends most of it then).
async fn wait_quiet(counter: &AtomicU64) {
    let deadline = tokio::time::Instant::now() + REPLAY_MOST;
    let mut seen = counter.load(Ordering::Relaxed);
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(REPLAY_QUIET).await;
        let now = counter.load(Ordering::Relaxed);
        if now == seen {
            return;
        }
        seen = now;
    }
}

impl HarnessSession for AcpSession {
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        Box::pin(async move {
            let _one = self.child.opening().await;
            if self.child.is_closed() {
                return Err(HarnessError::ChannelClosed);
            }
            let (io, extra) = match self.child.live() {
                Some(live) => {
                    if let Some(exit) = live.io.exit() {
                        return Err(exit.to_error());
                    }
                    // Already open: never load a session the agent holds (Gemini CLI
                    // would lose it, see `quirks`).
                    if !live.session.is_empty() && stored.is_none_or(|s| s == live.session) {
                        return Ok(OpenedSession {
                            id: live.session,
                            lost: None,
                        });
                    }
                    (live.io, live.extra)
                }
                None => {
                    let (io, extra) = self.start().await?;
                    // Kept at once, so that a shutdown during the rest stops it.
                    self.child.set(Live {
                        io: io.clone(),
                        session: String::new(),
                        extra: extra.clone(),
                    });
                    (io, extra)
                }
            };
            let opened = match stored {
                None => OpenedSession {
                    id: self.new_session(&io).await?,
                    lost: None,
                },
                Some(old) => match self.reopen(&io, &extra, old).await? {
                    Ok(()) => OpenedSession {
                        id: old.to_string(),
                        lost: None,
                    },
                    Err(why) => OpenedSession::replacing(old, self.new_session(&io).await?, &why),
                },
            };
            self.child.set(Live {
                io,
                session: opened.id.clone(),
                extra,
            });
            Ok(opened)
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
            let (session, turn, text) = (
                session_id.to_string(),
                relay_turn_id.to_string(),
                text.to_string(),
            );
            child
                .call(method::SESSION_PROMPT, move |w| {
                    w.prompt(&session, &turn, &text)
                })
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
        let harness = Harness::from_name(self.name()).unwrap_or(Harness::Acp);
        Box::pin(async move {
            Err(HarnessError::Incapable {
                harness,
                what: "add to a running turn (ACP has no steer): interrupt it and ask again, or send a follow-up".into(),
            })
        })
    }

    fn interrupt<'a>(
        &'a self,
        session_id: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            let child = self.child_of(session_id)?;
            let (session, turn) = (session_id.to_string(), turn_id.to_string());
            child
                .call(method::SESSION_CANCEL, move |w| w.cancel(&session, &turn))
                .await?;
            // ACP asks a client that cancels to answer its open permission requests so.
            while child
                .call("cancel permission", AcpWire::cancel_one_pending)
                .await
                .is_ok()
            {}
            Ok(())
        })
    }

    fn respond_approval<'a>(
        &'a self,
        request_id: &'a str,
        decision: ApprovalDecision,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            let live = self
                .child
                .live()
                .ok_or_else(|| HarnessError::UnknownRequest {
                    request_id: request_id.to_string(),
                })?;
            let id = request_id.to_string();
            live.io
                .call("session/request_permission answer", move |w| {
                    w.answer(&id, decision)
                })
                .await
                .map(|_: Value| ())
        })
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Process {
            pid: self.child.pid(),
        }
    }

    fn stderr_tail(&self) -> String {
        self.child.stderr_tail()
    }

    fn program(&self) -> Option<ProgramInfo> {
        lock(&self.program).clone()
    }

    fn shutdown(&self) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            self.child.shutdown().await;
            Ok(())
        })
    }
}
