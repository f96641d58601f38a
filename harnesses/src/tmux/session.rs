//! A tmux pane behind the harness seam: [`TmuxLauncher`] starts the agent's command in a
//! detached session and follows the pane; the session delivers tasks into it.
//!
//! Over 600 lines, whole on purpose: launching, the readiness wait, delivery and turn end
//! all work on one pane's shared state (`Shared`), which a split would expose across modules.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_protocol::domain::{Agent, AgentSpec, ApprovalDecision, Harness};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};

use super::client::{NewSession, Tmux};
use super::sanitize::sanitize;
use super::screens::{last_lines, Judge, KnownCli, Readiness, ReadyPattern};
use crate::access::RelayAccess;
use crate::config::CliConfig;
use crate::error::HarnessError;
use crate::pinned::{PinnedCli, CLAUDE_CLI, CODEX_CLI};
use crate::process::lock;
use crate::seam::{
    BoxFuture, Conversation, Endpoint, HarnessInfo, HarnessSession, Launcher, Preflight, Screen,
    Spawned,
};

/// A tmux pane: interrupt by keys; no steer, approvals, resume or turn ids.
pub const TMUX_INFO: HarnessInfo = HarnessInfo {
    harness: Harness::Tmux,
    name: "tmux",
    program: "a tmux pane",
    capabilities: Harness::Tmux.capabilities(),
    screen: true,
};

/// Relay's own tmux server (`tmux -L relay`), apart from the user's default one.
pub use relay_protocol::domain::DEFAULT_TMUX_SOCKET as DEFAULT_SOCKET;

/// What a pane runs when the agent names no command and asked for a shell
/// ([`PaneSpec::shell`](relay_protocol::domain::PaneSpec::shell)): `sh` from `PATH`,
/// unless `RELAY_TMUX_SHELL` names another program. Nothing is pinned for it.
const PANE_SHELL: PinnedCli = PinnedCli {
    name: "sh",
    version: "system",
    override_env: "RELAY_TMUX_SHELL",
};

/// How many lines of the pane's rendered output a session keeps for its exit report.
const TAIL_LINES: usize = 40;

/// How many events the stream holds before the output reader waits for the runtime.
const EVENT_CAPACITY: usize = 256;

/// How long the output reader waits for tmux's `cat` to open the FIFO.
const PIPE_OPEN: Duration = Duration::from_secs(10);

/// How long a pane's output must be quiet before a paste counts as shown.
const PASTE_QUIET: Duration = Duration::from_millis(150);

/// How long a pane's output must be quiet before it counts as ready for a task (a TUI
/// done drawing, a REPL showing its prompt).
const READY_QUIET: Duration = Duration::from_millis(300);

/// How long a pane that keeps printing (a spinner, an animation) prints before its
/// screen is judged anyway.
const READY_BUSY: Duration = Duration::from_secs(1);

/// How many of a pane's last lines an error says it showed.
const SCREEN_LINES: usize = 6;

/// What a TUI shows in its input box for a long paste not yet submitted (codex: `[Pasted
/// Content 3047 chars]`, Claude Code: `[Pasted text #1 ...]`): while one shows, the task
/// has not been taken.
const PASTE_MARKERS: [&str; 2] = ["[Pasted Content", "[Pasted text"];

/// How to start an agent in a pane, or which pane to follow.
#[derive(Debug, Clone)]
pub struct TmuxConfig {
    /// The tmux server: a socket name (`-L`) or path (`-S`, when it holds a `/`).
    pub socket: String,
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
        config.socket = pane.socket;
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

/// Makes pane sessions, on the server each agent names (Relay's own by default).
#[derive(Debug, Clone, Default)]
pub struct TmuxLauncher;

impl TmuxLauncher {
    /// Follows `config`'s pane: the one it was attached to, else its session's if that
    /// still runs (Relay restarted while the agent kept working), else a new detached
    /// session running its command.
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
            return follow(&tmux, &pane, &config, Ownership::Attached).await;
        }
        match tmux.session_pane(&config.session).await? {
            Some((pane, false)) => {
                return follow(&tmux, &pane, &config, Ownership::Adopted).await;
            }
            Some((pane, true)) => tmux.kill_session_of(&pane).await?,
            None => {}
        }
        config.cli.check_program()?;
        let mut command = vec![config.cli.program.display().to_string()];
        command.extend(config.cli.args.iter().cloned());
        let pane = tmux
            .new_session(&NewSession {
                name: &config.session,
                command: &command,
                env: &config.cli.env,
                cwd: config.cli.cwd.as_deref(),
                size: config.size,
            })
            .await?;
        match follow(&tmux, &pane, &config, Ownership::Started).await {
            Ok(spawned) => Ok(spawned),
            Err(e) => {
                let _ = tmux.kill_session_of(&pane).await;
                Err(e)
            }
        }
    }
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
            let lines = super::peek(&spec.socket, &pane, lines).await.map_err(|e| {
                HarnessError::NoScreen {
                    detail: format!("agent {name}'s pane {pane}: {e}"),
                }
            })?;
            Ok(Screen {
                attach: spec.attach_hint(&pane),
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
enum Ownership {
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

/// What the session and its output reader share.
struct Shared {
    /// The turn the pane's output belongs to.
    turn: Mutex<Option<String>>,
    /// Taken by the reader once it has reported the pane's end.
    events: Mutex<Option<mpsc::Sender<HarnessEvent>>>,
    /// The last lines of rendered output.
    tail: Mutex<VecDeque<String>>,
    /// Bytes the pane has printed since it was followed.
    printed: watch::Sender<u64>,
    /// Set once the reader has reported the pane's end.
    gone: watch::Sender<bool>,
}

impl Shared {
    fn sender(&self) -> Option<mpsc::Sender<HarnessEvent>> {
        lock(&self.events).clone()
    }

    async fn emit(&self, event: HarnessEvent) {
        if let Some(events) = self.sender() {
            let _ = events.send(event).await;
        }
    }

    fn tail(&self) -> String {
        lock(&self.tail)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Adds rendered `text` to the tail.
    fn remember(&self, text: &str) {
        let mut tail = lock(&self.tail);
        let mut parts = text.split('\n');
        if let Some(first) = parts.next() {
            match tail.back_mut() {
                Some(last) => last.push_str(first),
                None => tail.push_back(first.to_string()),
            }
        }
        for line in parts {
            tail.push_back(line.to_string());
        }
        while tail.len() > TAIL_LINES {
            tail.pop_front();
        }
    }
}

/// Pipes `pane`'s output into a FIFO in a private directory, starts the reader, and
/// makes the session.
async fn follow(
    tmux: &Tmux,
    pane: &str,
    config: &TmuxConfig,
    ownership: Ownership,
) -> Result<Spawned, HarnessError> {
    let dir = tempfile::Builder::new().prefix("relay-tmux-").tempdir()?;
    let fifo = dir.path().join("output");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
    )
    .map_err(std::io::Error::from)?;
    tmux.pipe_output(pane, &fifo).await?;
    let output = open_fifo(fifo).await?;
    let (events, rx) = mpsc::channel(EVENT_CAPACITY);
    let shared = Arc::new(Shared {
        turn: Mutex::new(None),
        events: Mutex::new(Some(events)),
        tail: Mutex::new(VecDeque::new()),
        printed: watch::Sender::new(0),
        gone: watch::Sender::new(false),
    });
    tokio::spawn(read_output(
        output,
        dir,
        tmux.clone(),
        pane.to_string(),
        shared.clone(),
        config.coalesce,
    ));
    let session = TmuxSession {
        tmux: tmux.clone(),
        pane: pane.to_string(),
        shared,
        confirm_timeout: config.confirm_timeout,
        ready_timeout: config.ready_timeout,
        judge: config.judge.clone(),
        delivering: tokio::sync::Mutex::new(()),
        ownership,
        mcp: config.mcp,
        interrupt_key: config.interrupt_key,
    };
    Ok(Spawned {
        session: Arc::new(session),
        events: rx,
    })
}

/// Opens the FIFO for reading once tmux's `cat` has it open for writing: a reader opened
/// before any writer would see end of file at once, so the open blocks (on the blocking
/// pool) until the writer comes. If it never does, the open is released by opening the
/// write end here.
async fn open_fifo(fifo: PathBuf) -> Result<pipe::Receiver, HarnessError> {
    let path = fifo.clone();
    let open = tokio::task::spawn_blocking(move || std::fs::File::open(path));
    match tokio::time::timeout(PIPE_OPEN, open).await {
        Ok(Ok(file)) => Ok(pipe::Receiver::from_file(file?)?),
        Ok(Err(join)) => Err(HarnessError::Io(std::io::Error::other(join))),
        Err(_) => {
            let _ = pipe::OpenOptions::new().open_sender(&fifo);
            Err(HarnessError::Tmux {
                command: "pipe-pane".into(),
                stderr: format!("the pane's output did not reach Relay within {PIPE_OPEN:?}"),
            })
        }
    }
}

/// What [`strip_ansi_escapes::Writer`] renders: the printable text and newlines.
#[derive(Clone, Default)]
struct Rendered(Arc<Mutex<Vec<u8>>>);

impl Write for Rendered {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads what the pane prints until tmux closes the pipe (the pane is gone): counts it
/// (delivery confirms by it), renders it to plain text (one escape parser across reads,
/// so a sequence split between two reads is still removed), and sends it to the running
/// turn as text deltas, at most one per `coalesce`. Then reports the pane's end.
async fn read_output(
    mut output: pipe::Receiver,
    dir: tempfile::TempDir,
    tmux: Tmux,
    pane: String,
    shared: Arc<Shared>,
    coalesce: Duration,
) {
    let rendered = Rendered::default();
    let mut parser = strip_ansi_escapes::Writer::new(rendered.clone());
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending = String::new();
    let mut tick = tokio::time::interval(coalesce);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            read = output.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    shared.printed.send_modify(|printed| *printed += n as u64);
                    let _ = parser.write_all(&buf[..n]).and_then(|()| parser.flush());
                    let bytes = std::mem::take(&mut *lock(&rendered.0));
                    let text = String::from_utf8_lossy(&bytes);
                    shared.remember(&text);
                    pending.push_str(&text);
                }
            },
            _ = tick.tick(), if !pending.is_empty() => send_output(&shared, &mut pending).await,
        }
    }
    send_output(&shared, &mut pending).await;
    drop(dir);
    let alive = tmux.pane_alive(&pane).await.unwrap_or(false);
    let why = if alive {
        format!("pane {pane} no longer sends its output to Relay")
    } else {
        format!("pane {pane} is gone")
    };
    let stderr_tail = format!("{why}; its last output:\n{}", shared.tail());
    // Taken: the stream ends once the session's own clones are dropped.
    let events = lock(&shared.events).take();
    if let Some(events) = events {
        let _ = events
            .send(HarnessEvent::ProcessExited {
                code: None,
                signal: None,
                stderr_tail,
            })
            .await;
    }
    shared.gone.send_replace(true);
}

/// Sends `pending` to the running turn, if one runs; else it is only in the tail.
async fn send_output(shared: &Shared, pending: &mut String) {
    let text = std::mem::take(pending);
    let turn = lock(&shared.turn).clone();
    if let (Some(turn_id), false) = (turn, text.is_empty()) {
        shared
            .emit(HarnessEvent::TextDelta {
                item_id: format!("{turn_id}-pane"),
                turn_id,
                delta: text,
            })
            .await;
    }
}

/// Waits until the pane's output has been quiet for [`READY_QUIET`], or `deadline`, or
/// (with `busy`) until it has printed without a pause for that long.
async fn settle(
    printed: &mut watch::Receiver<u64>,
    deadline: tokio::time::Instant,
    busy: Option<Duration>,
) {
    let busy_until = busy.map(|b| tokio::time::Instant::now() + b);
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline || busy_until.is_some_and(|b| now >= b) {
            return;
        }
        match tokio::time::timeout(READY_QUIET, printed.changed()).await {
            Ok(Ok(())) => continue,
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// One agent's pane.
struct TmuxSession {
    tmux: Tmux,
    pane: String,
    shared: Arc<Shared>,
    confirm_timeout: Duration,
    ready_timeout: Duration,
    judge: Judge,
    /// One delivery at a time: two pastes must not interleave.
    delivering: tokio::sync::Mutex<()>,
    ownership: Ownership,
    /// Relay's MCP server is wired into the pane's program.
    mcp: bool,
    interrupt_key: &'static str,
}

impl TmuxSession {
    fn check_conversation(&self, conversation: &str) -> Result<(), HarnessError> {
        match conversation == self.pane {
            true => Ok(()),
            false => Err(HarnessError::ThreadNotFound {
                thread_id: conversation.to_string(),
            }),
        }
    }

    /// Waits until the pane is ready for a task, or says why it is not.
    ///
    /// It shows something first (when Relay started it). A pane nothing judges is then
    /// ready once quiet for [`READY_QUIET`], and still busy after the confirm timeout it
    /// gets the task anyway (a clock or spinner may never stop). A judged pane
    /// ([`Judge`]) is looked at each time its output settles (quiet, or busy for
    /// [`READY_BUSY`]): ready, it gets the task; at a screen that needs a person (a
    /// sign-in, a trust question), delivery fails at once saying which and how to get
    /// past it; neither within the ready timeout, it fails with the screen's last lines.
    /// Nothing is pasted in either failure.
    async fn ready(&self) -> Result<(), HarnessError> {
        let mut printed = self.shared.printed.subscribe();
        let start = tokio::time::Instant::now();
        let quiet_deadline = start + self.confirm_timeout;
        let deadline = match self.judge.judges() {
            true => start + self.ready_timeout,
            false => quiet_deadline,
        };
        // It may have drawn before its output reached Relay: the screen says so.
        if self.ownership == Ownership::Started
            && *printed.borrow() == 0
            && self
                .tmux
                .capture(&self.pane)
                .await
                .is_ok_and(|screen| screen.trim().is_empty())
        {
            let _ = tokio::time::timeout_at(deadline, printed.wait_for(|&n| n > 0)).await;
        }
        printed.borrow_and_update();
        if !self.judge.judges() {
            settle(&mut printed, quiet_deadline, None).await;
            return Ok(());
        }
        let mut waited = false;
        loop {
            settle(&mut printed, deadline, Some(READY_BUSY)).await;
            let screen = self.tmux.capture(&self.pane).await?;
            match self.judge.judge(&screen) {
                Readiness::Ready => return Ok(()),
                Readiness::Blocked(cli, blocker) => {
                    return Err(HarnessError::NotReady {
                        pane: self.pane.clone(),
                        detail: blocker.explain(cli, &self.pane, &self.look()),
                    });
                }
                Readiness::NotYet if tokio::time::Instant::now() >= deadline => {
                    return Err(HarnessError::NotReady {
                        pane: self.pane.clone(),
                        detail: self.not_ready(&screen),
                    });
                }
                // Nothing new to look at until the pane prints again.
                Readiness::NotYet => {
                    if !waited {
                        waited = true;
                        tracing::info!(pane = %self.pane, "pane not ready for a task yet; waiting for its ready screen");
                    }
                    let _ = tokio::time::timeout_at(deadline, printed.changed()).await;
                }
            }
        }
    }

    /// How a person looks at the pane: `tmux -L relay attach -t %3`.
    fn look(&self) -> String {
        let [flag, socket] = relay_protocol::domain::tmux_socket_args(self.tmux.socket());
        format!("tmux {flag} {socket} attach -t {}", self.pane)
    }

    /// Why a judged pane showing `screen` at the ready timeout is not ready.
    fn not_ready(&self, screen: &str) -> String {
        let what = match (&self.judge.pattern, self.judge.cli) {
            (Some(p), _) => format!("its ready pattern {:?}", p.as_str()),
            (None, Some(KnownCli::Codex)) => "codex's prompt (› )".to_string(),
            (None, Some(KnownCli::Claude)) => "claude's prompt (❯ )".to_string(),
            (None, None) => "its prompt".to_string(),
        };
        format!(
            "pane {} did not show {what} within {} s; look at it ({}); its screen ends: {}",
            self.pane,
            self.ready_timeout.as_secs(),
            self.look(),
            last_lines(screen, SCREEN_LINES)
        )
    }

    /// Pastes `text` (sanitised) and submits it, confirmed by the pane changing after
    /// the submit key: something printed, a screen other than before, and no collapsed
    /// paste still waiting in a TUI's input box. The key is sent a second time if not.
    async fn deliver(&self, text: &str) -> Result<(), HarnessError> {
        let text = sanitize(text);
        self.ready().await?;
        let mut printed = self.shared.printed.subscribe();
        let before = *printed.borrow_and_update();
        let buffer = format!("relay-{}", uuid::Uuid::new_v4());
        self.tmux.paste(&self.pane, &buffer, &text).await?;
        // Let the paste's own echo pass, so that it is not taken for the answer to Enter.
        if self.printed_after(&mut printed, before).await {
            while tokio::time::timeout(PASTE_QUIET, printed.changed())
                .await
                .is_ok_and(|changed| changed.is_ok())
            {}
        }
        for _ in 0..2 {
            let screen = self.tmux.screen(&self.pane).await?;
            let mark = *printed.borrow_and_update();
            self.tmux.send_keys(&self.pane, &["Enter"]).await?;
            if self.printed_after(&mut printed, mark).await
                && self.taken(&screen, &mut printed).await?
            {
                return Ok(());
            }
        }
        Err(HarnessError::Stalled {
            pane: self.pane.clone(),
            detail: format!(
                "the pane did not take the task within {:?} of the paste and of each of two submit keys",
                self.confirm_timeout
            ),
        })
    }

    /// Whether the pane, which printed after the submit key, took the task: its screen
    /// (once its output settles) is not the one before the key (text or cursor), and
    /// shows no collapsed paste still waiting to be submitted.
    async fn taken(
        &self,
        before: &str,
        printed: &mut watch::Receiver<u64>,
    ) -> Result<bool, HarnessError> {
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        loop {
            let _ = tokio::time::timeout(PASTE_QUIET, printed.changed()).await;
            let now = self.tmux.screen(&self.pane).await?;
            let waiting = PASTE_MARKERS.iter().any(|m| now.contains(m));
            if now != before && !waiting {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            // Nothing new to look at until the pane prints again.
            if tokio::time::timeout_at(deadline, printed.changed())
                .await
                .is_err()
            {
                return Ok(false);
            }
        }
    }

    /// Whether the pane prints past `mark` within the confirm timeout.
    async fn printed_after(&self, printed: &mut watch::Receiver<u64>, mark: u64) -> bool {
        tokio::time::timeout(self.confirm_timeout, printed.wait_for(|&now| now > mark))
            .await
            .is_ok_and(|seen| seen.is_ok())
    }

    fn not_running(&self, turn_id: &str) -> HarnessError {
        HarnessError::NoActiveTurn {
            detail: format!("turn {turn_id} is not running in pane {}", self.pane),
        }
    }

    /// Ends the running turn `turn_id` with `outcome`, or says it is not running.
    async fn end_turn(&self, turn_id: &str, outcome: TurnOutcome) -> Result<(), HarnessError> {
        {
            let mut running = lock(&self.shared.turn);
            if running.as_deref() != Some(turn_id) {
                return Err(self.not_running(turn_id));
            }
            *running = None;
        }
        self.shared
            .emit(HarnessEvent::TurnCompleted {
                turn_id: turn_id.to_string(),
                outcome,
            })
            .await;
        Ok(())
    }
}

impl HarnessSession for TmuxSession {
    /// A pane holds no conversation to resume: the conversation is the pane (its id).
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Conversation, HarnessError>> {
        Box::pin(async move {
            let id = self.pane.clone();
            Ok(match stored.filter(|old| *old != id) {
                Some(old) => {
                    Conversation::replacing(old, id, "a tmux pane keeps no conversation to resume")
                }
                None => Conversation { id, lost: None },
            })
        })
    }

    /// Starts the turn (its events first, so the pane's output from the paste on is the
    /// turn's), then delivers the task; a delivery that fails ends the turn failed.
    fn start_turn<'a>(
        &'a self,
        conversation: &'a str,
        text: &'a str,
        relay_turn_id: &'a str,
    ) -> BoxFuture<'a, Result<String, HarnessError>> {
        Box::pin(async move {
            self.check_conversation(conversation)?;
            let _one = self.delivering.lock().await;
            if *self.shared.gone.borrow() {
                return Err(HarnessError::ChannelClosed);
            }
            let turn_id = relay_turn_id.to_string();
            self.shared
                .emit(HarnessEvent::TurnStarted {
                    turn_id: turn_id.clone(),
                })
                .await;
            *lock(&self.shared.turn) = Some(turn_id.clone());
            if let Err(e) = self
                .deliver(&task_text(text, relay_turn_id, self.mcp))
                .await
            {
                // A pane that went during the delivery (tmux then fails, or the server
                // with it) is said to be gone, not a tmux error.
                let e = match self.tmux.pane_alive(&self.pane).await {
                    Ok(false) => HarnessError::ProcessExited {
                        code: None,
                        signal: None,
                        stderr_tail: format!(
                            "pane {} is gone; its last output:\n{}",
                            self.pane,
                            self.shared.tail()
                        ),
                    },
                    _ => e,
                };
                *lock(&self.shared.turn) = None;
                self.shared
                    .emit(HarnessEvent::TurnCompleted {
                        turn_id,
                        outcome: TurnOutcome::Failed {
                            error: e.to_string(),
                        },
                    })
                    .await;
                return Err(e);
            }
            Ok(turn_id)
        })
    }

    fn steer<'a>(
        &'a self,
        _conversation: &'a str,
        _turn_id: &'a str,
        _text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            Err(HarnessError::Incapable {
                harness: Harness::Tmux,
                what: "steer".into(),
            })
        })
    }

    /// Sends `C-c` (`Escape` to codex) to the pane and ends the turn as interrupted (a
    /// pane says nothing of its turns).
    fn interrupt<'a>(
        &'a self,
        conversation: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.check_conversation(conversation)?;
            if lock(&self.shared.turn).as_deref() != Some(turn_id) {
                return Err(self.not_running(turn_id));
            }
            self.tmux
                .send_keys(&self.pane, &[self.interrupt_key])
                .await?;
            self.end_turn(turn_id, TurnOutcome::Interrupted).await
        })
    }

    /// The agent answered (`relay reply`): the turn completes with its answer.
    fn reply<'a>(
        &'a self,
        conversation: &'a str,
        turn_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.check_conversation(conversation)?;
            let outcome = TurnOutcome::Completed {
                text: text.to_string(),
            };
            self.end_turn(turn_id, outcome).await
        })
    }

    fn respond_approval<'a>(
        &'a self,
        request_id: &'a str,
        _decision: ApprovalDecision,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        crate::seam::never_pending(request_id)
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Pane {
            pane: self.pane.clone(),
        }
    }

    /// The pane's last lines of output (a pane has no separate stderr).
    fn stderr_tail(&self) -> String {
        self.shared.tail()
    }

    /// Ends the pane's session (a pane Relay started), or only stops following it (a
    /// pane the agent was attached to), and returns once its end is reported.
    fn shutdown(&self) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            let mut gone = self.shared.gone.subscribe();
            if !*gone.borrow_and_update() {
                // Already gone when tmux cannot find it: the reader reports that too.
                let _ = match self.ownership {
                    Ownership::Attached => self.tmux.stop_pipe(&self.pane).await,
                    Ownership::Started | Ownership::Adopted => {
                        self.tmux.kill_session_of(&self.pane).await
                    }
                };
                let _ = gone.wait_for(|&gone| gone).await;
            }
            Ok(())
        })
    }
}
