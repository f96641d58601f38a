//! A tmux pane behind the harness seam, its start: [`TmuxConfig`] (how an agent starts in
//! a pane, or which pane it follows; the known CLIs wired to Relay's MCP server) and
//! [`TmuxLauncher`], which starts the agent's command in a detached session (or adopts
//! or attaches a pane) and hands it to the session (`session.rs`).

use std::path::PathBuf;
use std::time::Duration;

use relay_protocol::domain::{Agent, AgentSpec, Harness};

use super::client::{NewSession, Tmux};
use super::output::OutputFifo;
use super::screens::{Judge, KnownCli, ReadyPattern};
use super::session::follow;
use crate::access::RelayAccess;
use crate::config::CliConfig;
use crate::error::HarnessError;
use crate::pinned::{PinnedCli, CLAUDE_CLI, CODEX_CLI};
use crate::seam::{BoxFuture, HarnessInfo, Launcher, Preflight, Screen, Spawned};

/// A tmux pane: interrupt by keys; no steer, approvals, resume or turn ids.
pub const TMUX_INFO: HarnessInfo = HarnessInfo {
    harness: Harness::Tmux,
    name: "tmux",
    program: "a tmux pane",
    capabilities: Harness::Tmux.capabilities(),
    screen: true,
};

/// What Relay's tmux servers are named after: each agent's own is `relay@NAME`
/// ([`PaneSpec::server`](relay_protocol::domain::PaneSpec::server)), apart from the
/// user's default one.
pub use relay_protocol::domain::DEFAULT_TMUX_SOCKET as DEFAULT_SOCKET;

/// What a pane runs when the agent names no command and asked for a shell
/// ([`PaneSpec::shell`](relay_protocol::domain::PaneSpec::shell)): `sh` from `PATH`,
/// unless `RELAY_TMUX_SHELL` names another program. Nothing is pinned for it.
const PANE_SHELL: PinnedCli = PinnedCli {
    name: "sh",
    version: "system",
    override_env: "RELAY_TMUX_SHELL",
};

/// How to start an agent in a pane, or which pane to follow.
#[derive(Debug, Clone)]
pub struct TmuxConfig {
    /// The tmux server: a socket name (`-L`) or path (`-S`, when it holds a `/`). For
    /// an agent's pane that Relay starts, a server of the agent's own
    /// ([`PaneSpec::server`](relay_protocol::domain::PaneSpec::server)).
    pub socket: String,
    /// The server this agent's session was started on before each agent had its own
    /// (the socket all of them shared): a session of the agent's name still running there
    /// is ended when the agent starts, not adopted, since every pane of that server can
    /// read its environment and type into it.
    pub legacy_socket: Option<String>,
    /// The tmux session's name, for a pane Relay starts.
    pub session: String,
    /// A pane started outside Relay to follow instead (`relay agent attach`): never
    /// started or ended by Relay.
    pub target: Option<String>,
    /// The command (program and arguments), its variables (with the agent's access to
    /// Relay) and directory.
    pub cli: CliConfig,
    /// The pane's columns and rows.
    pub size: (u16, u16),
    /// After a paste, and again after each submit key, how long the pane gets to show a
    /// change before delivery counts as stalled; also the longest wait for a pane that
    /// nothing judges ([`judge`](Self::judge)) to be quiet before a paste.
    pub confirm_timeout: Duration,
    /// How long a judged pane gets to show that it is ready before delivery fails
    /// with what its screen shows.
    pub ready_timeout: Duration,
    /// How the pane's screen says it is ready, or held by a screen that needs a
    /// person: the known CLI it runs (a pane Relay starts), the agent's ready pattern.
    /// Judging nothing, the pane is ready once it is quiet.
    pub judge: Judge,
    /// Pane output is sent as one text delta per this period at most.
    pub coalesce: Duration,
    /// Relay's MCP server is wired into the pane's program (a known agent CLI started
    /// by Relay): the task tells the agent to answer with its `reply` tool rather than
    /// `relay reply` from a shell (which a sandboxed CLI cannot run).
    pub mcp: bool,
    /// The key that stops a turn: `C-c`, or `Escape` for the codex TUI, which quits on
    /// a `C-c` at an empty prompt.
    pub interrupt_key: &'static str,
}

impl TmuxConfig {
    /// `command` (program first) in session `session` on Relay's socket, 160x45, 5 s to
    /// confirm, 30 s to be ready (a TUI starting its MCP servers on a busy machine),
    /// output coalesced over 250 ms, no judge of its screen.
    pub fn new(session: impl Into<String>, cli: CliConfig) -> TmuxConfig {
        TmuxConfig {
            socket: DEFAULT_SOCKET.to_string(),
            legacy_socket: None,
            session: session.into(),
            target: None,
            cli,
            size: (160, 45),
            confirm_timeout: Duration::from_secs(5),
            ready_timeout: Duration::from_secs(30),
            judge: Judge::default(),
            coalesce: Duration::from_millis(250),
            mcp: false,
            interrupt_key: "C-c",
        }
    }

    /// How `agent` runs in a pane: its command (or the shell it asked for) and arguments, variables
    /// with its secrets and its access to Relay, directory; session `relay-NAME` on its
    /// [`PaneSpec`](relay_protocol::domain::PaneSpec)'s server, or the pane it was
    /// attached to; its screen judged by its ready pattern and, for a known CLI, by
    /// that CLI's screens.
    ///
    /// A known agent CLI that Relay starts (`codex`, `claude`; a bare name means the
    /// pinned one) gets Relay's MCP server wired in as its app-server twin does, since
    /// its shell may be sandboxed away from Relay (the codex TUI's is).
    ///
    /// Refused: a pane to start with neither a command nor an explicit shell (a record
    /// from before that was refused at registration), and a ready pattern that is not
    /// one.
    pub fn for_agent(
        agent: &AgentSpec,
        relay: Option<&RelayAccess>,
    ) -> Result<TmuxConfig, HarnessError> {
        if let Some(problem) = agent.pane_program_problem() {
            return Err(HarnessError::Config { detail: problem });
        }
        let pane = agent.pane.clone().unwrap_or_default();
        let mut config = TmuxConfig::new(
            session_name(&agent.name),
            CliConfig::for_agent(agent, &PANE_SHELL, relay),
        );
        config.socket = pane.server(&agent.name);
        if pane.target.is_none() {
            config.legacy_socket = Some(pane.socket.clone());
        }
        config.target = pane.target;
        if let Some(pattern) = &pane.ready_pattern {
            let pattern = ReadyPattern::new(pattern).map_err(|e| HarnessError::Config {
                detail: format!("agent {}: {e}", agent.name),
            })?;
            config.judge.pattern = Some(pattern);
        }
        if config.target.is_none() {
            wire_known_cli(&mut config, relay);
        }
        Ok(config)
    }
}

/// The agent CLIs Relay knows how to wire its MCP server into, by program name.
const KNOWN_CLIS: [&PinnedCli; 2] = [&CODEX_CLI, &CLAUDE_CLI];

/// The codex TUI's arguments in a pane Relay drives (facts in `HARNESSES.md`): Relay's
/// MCP server, its tools run without the TUI's own "Allow the relay MCP server…" dialog
/// (Relay's scoped token bounds them, as for the app-server, whose calls of that server
/// Relay accepts); the agent's directory trusted, so no "Trust this folder?" dialog
/// holds the pane (the app-server asks neither); and `--no-daemon`, so that no
/// background app-server outlives the pane.
fn codex_tui_args(cli: &CliConfig, relay: &RelayAccess) -> Vec<String> {
    let mut args = vec!["--no-daemon".to_string()];
    args.extend(relay.codex_mcp_args());
    let server = format!("mcp_servers.{}", crate::access::MCP_SERVER);
    args.extend([
        "-c".to_string(),
        format!("{server}.default_tools_approval_mode=\"approve\""),
    ]);
    if let Some(cwd) = &cli.cwd {
        // An inline table: a quoted dotted key (`projects."/dir".trust_level`) is not
        // taken by this version.
        let dir = serde_json::Value::from(cwd.display().to_string());
        args.extend([
            "-c".to_string(),
            format!("projects={{{dir}={{trust_level=\"trusted\"}}}}"),
        ]);
    }
    args
}

/// When `config` runs a known agent CLI: a bare name becomes the pinned program, its
/// screens judge the pane's, codex is interrupted by `Escape`, and with `relay`, Relay's
/// MCP server goes first among its arguments ([`TmuxConfig::mcp`]).
fn wire_known_cli(config: &mut TmuxConfig, relay: Option<&RelayAccess>) {
    let cli = &mut config.cli;
    let name = cli
        .program
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let Some(known) = KNOWN_CLIS.into_iter().find(|k| k.name == name) else {
        return;
    };
    if cli.program.as_os_str() == known.name {
        cli.program = known.program(None);
    }
    config.judge.cli = KnownCli::by_name(known.name);
    let codex = known.name == CODEX_CLI.name;
    if codex {
        config.interrupt_key = "Escape";
    }
    let Some(relay) = relay else {
        return;
    };
    let mut args = match codex {
        true => codex_tui_args(cli, relay),
        false => relay.claude_mcp_args().to_vec(),
    };
    args.append(&mut cli.args);
    cli.args = args;
    config.mcp = true;
}

/// The tmux session of agent `agent`: `relay-NAME`, with the characters tmux refuses in
/// a session name (`.`, `:`) replaced.
pub fn session_name(agent: &str) -> String {
    let name: String = agent
        .chars()
        .map(|c| if matches!(c, '.' | ':') { '_' } else { c })
        .collect();
    format!("relay-{name}")
}

/// Makes pane sessions, each on a server of its agent's own (or follows the pane an
/// agent was attached to).
#[derive(Debug, Clone, Default)]
pub struct TmuxLauncher;

impl TmuxLauncher {
    /// Follows `config`'s pane: the one it was attached to, else its session's if that
    /// still runs (Relay restarted while the agent kept working), else a new detached
    /// session running its command, its output piped to Relay from its first byte.
    pub async fn spawn_with(config: TmuxConfig) -> Result<Spawned, HarnessError> {
        let tmux = Tmux::new(&config.socket);
        if let Some(target) = &config.target {
            let pane = tmux
                .find_pane(target)
                .await?
                .ok_or_else(|| HarnessError::Tmux {
                    command: "list-panes".into(),
                    stderr: format!("no live pane {target} on tmux server {}", config.socket),
                })?;
            return follow(&tmux, &pane, &config, Ownership::Attached, None).await;
        }
        match tmux.session_pane(&config.session).await? {
            Some((pane, false)) => {
                return follow(&tmux, &pane, &config, Ownership::Adopted, None).await;
            }
            Some((pane, true)) => tmux.kill_session_of(&pane).await?,
            None => {}
        }
        end_legacy_session(&config).await?;
        config.cli.check_program()?;
        let mut command = vec![config.cli.program.display().to_string()];
        command.extend(config.cli.args.iter().cloned());
        let fifo = OutputFifo::new()?;
        let pane = tmux
            .new_session(&NewSession {
                name: &config.session,
                command: &command,
                env: &config.cli.env,
                cwd: config.cli.cwd.as_deref(),
                size: config.size,
                output: Some(fifo.path()),
            })
            .await?;
        match follow(&tmux, &pane, &config, Ownership::Started, Some(fifo)).await {
            Ok(spawned) => Ok(spawned),
            Err(e) => {
                let _ = tmux.kill_session_of(&pane).await;
                Err(e)
            }
        }
    }
}

/// Ends the agent's session left on the server all agents shared before each had its
/// own ([`TmuxConfig::legacy_socket`]), if one runs there: the agent starts again on its
/// own server. Adopting it would keep its token readable by, and its pane open to,
/// every other pane of that server.
async fn end_legacy_session(config: &TmuxConfig) -> Result<(), HarnessError> {
    let Some(legacy) = config.legacy_socket.as_deref() else {
        return Ok(());
    };
    if legacy == config.socket {
        return Ok(());
    }
    let shared = Tmux::new(legacy);
    if let Some((pane, _)) = shared.session_pane(&config.session).await? {
        tracing::warn!(
            session = %config.session, %pane, shared = legacy, own = %config.socket,
            "ending the agent's pane on the tmux server all agents shared; it starts again on a server of its own"
        );
        shared.kill_session_of(&pane).await?;
    }
    Ok(())
}

impl Launcher for TmuxLauncher {
    fn info(&self) -> HarnessInfo {
        TMUX_INFO
    }

    /// The pane the agent's endpoint names (else the one it was attached to), on its
    /// socket: read as it is, whether or not a session of Relay follows it now.
    fn peek<'a>(
        &'a self,
        agent: &'a Agent,
        lines: usize,
    ) -> BoxFuture<'a, Result<Screen, HarnessError>> {
        Box::pin(async move {
            let name = &agent.spec.name;
            let spec = agent.spec.pane.clone().unwrap_or_default();
            let pane = agent
                .endpoint
                .as_ref()
                .and_then(|e| e.pane.clone())
                .or_else(|| spec.target.clone())
                .ok_or_else(|| HarnessError::NoScreen {
                    detail: format!(
                        "agent {name} has no pane yet ({}): it starts with its first task or `relay agent wake {name}`",
                        agent.state
                    ),
                })?;
            let lines = super::peek(&spec.server(name), &pane, lines)
                .await
                .map_err(|e| HarnessError::NoScreen {
                    detail: format!("agent {name}'s pane {pane}: {e}"),
                })?;
            Ok(Screen {
                attach: spec.attach_hint(name, &pane),
                pane,
                lines,
            })
        })
    }

    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>> {
        Box::pin(
            async move { TmuxLauncher::spawn_with(TmuxConfig::for_agent(agent, relay)?).await },
        )
    }

    /// `tmux` itself runs (`tmux -V`), and a pane Relay starts has its directory. The
    /// agent's command is a shell line run in the pane: not run here.
    fn preflight<'a>(
        &'a self,
        agent: &'a AgentSpec,
    ) -> BoxFuture<'a, Result<Preflight, HarnessError>> {
        Box::pin(async move {
            let attached = agent.pane.as_ref().is_some_and(|p| p.target.is_some());
            if !attached {
                let cwd = PathBuf::from(&agent.cwd);
                tokio::task::spawn_blocking(move || crate::preflight::check_cwd(&cwd))
                    .await
                    .map_err(|e| HarnessError::Io(std::io::Error::other(e)))??;
            }
            let tmux = CliConfig::new("tmux");
            let warnings =
                crate::preflight::check_runs(&tmux, "-V", crate::preflight::VERSION_TIMEOUT)
                    .await?
                    .into_iter()
                    .collect();
            Ok(Preflight { warnings })
        })
    }
}

/// How a session came by its pane, which decides what shutting it down does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ownership {
    /// Started now by Relay: ended with the session.
    Started,
    /// Relay's own session, still running from before Relay restarted: ended with the
    /// session, like one it started.
    Adopted,
    /// A pane of the user's (`relay agent attach`): only no longer followed.
    Attached,
}

/// The task as a pane gets it (before sanitising): the text, then which flight it is
/// and how to answer it: the MCP `reply` tool where Relay wired its server in (`mcp`),
/// else `relay reply` from a shell.
pub fn task_text(text: &str, flight: &str, mcp: bool) -> String {
    let how = match mcp {
        true => format!(
            "call the reply tool of the relay MCP server with flight \"{flight}\" and your answer as text"
        ),
        false => format!("run: relay reply {flight} 'YOUR ANSWER'"),
    };
    format!("{text}\n\n[Relay flight {flight}. When you are done, answer it: {how}]")
}
