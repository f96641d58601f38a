//! A tmux pane behind the harness seam: [`TmuxLauncher`] starts the agent's command in a
//! detached session and follows the pane; the session delivers tasks into it.

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use relay_protocol::domain::{AgentSpec, ApprovalDecision, Harness};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};

use super::client::{NewSession, Tmux};
use super::sanitize::sanitize;
use crate::access::RelayAccess;
use crate::config::CliConfig;
use crate::error::HarnessError;
use crate::pinned::PinnedCli;
use crate::seam::{
    BoxFuture, Conversation, Endpoint, HarnessInfo, HarnessSession, Launcher, Spawned,
};

/// A tmux pane: interrupt by keys; no steer, approvals, resume or turn ids.
pub const TMUX_INFO: HarnessInfo = HarnessInfo {
    harness: Harness::Tmux,
    name: "tmux",
    program: "a tmux pane",
    capabilities: Harness::Tmux.capabilities(),
};

/// Relay's own tmux server (`tmux -L relay`), apart from the user's default one.
pub const DEFAULT_SOCKET: &str = "relay";

/// What a pane runs when the agent names no command: `sh` from `PATH`, unless
/// `RELAY_TMUX_SHELL` names another program. Nothing is pinned for it.
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

/// How to start an agent in a pane.
#[derive(Debug, Clone)]
pub struct TmuxConfig {
    /// The tmux server's socket name (`-L`).
    pub socket: String,
    /// The tmux session's name.
    pub session: String,
    /// The command (program and arguments), its variables (with the agent's access to
    /// Relay) and directory.
    pub cli: CliConfig,
    /// The pane's columns and rows.
    pub size: (u16, u16),
    /// After a paste, and again after each submit key, how long the pane gets to show a
    /// change before delivery counts as stalled.
    pub confirm_timeout: Duration,
    /// Pane output is sent as one text delta per this period at most.
    pub coalesce: Duration,
}

impl TmuxConfig {
    /// `command` (program first) in session `session` on Relay's socket, 160x45, 5 s to
    /// confirm, output coalesced over 250 ms.
    pub fn new(session: impl Into<String>, cli: CliConfig) -> TmuxConfig {
        TmuxConfig {
            socket: DEFAULT_SOCKET.to_string(),
            session: session.into(),
            cli,
            size: (160, 45),
            confirm_timeout: Duration::from_secs(5),
            coalesce: Duration::from_millis(250),
        }
    }

    /// How `agent` runs in a pane: its command (else a shell) and arguments, variables
    /// with its secrets and its access to Relay, directory; session `relay-NAME`.
    pub fn for_agent(agent: &AgentSpec, relay: Option<&RelayAccess>) -> TmuxConfig {
        TmuxConfig::new(
            session_name(&agent.name),
            CliConfig::for_agent(agent, &PANE_SHELL, relay),
        )
    }
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

/// Makes pane sessions on a socket.
#[derive(Debug, Clone)]
pub struct TmuxLauncher {
    pub socket: String,
}

impl Default for TmuxLauncher {
    fn default() -> Self {
        TmuxLauncher {
            socket: DEFAULT_SOCKET.to_string(),
        }
    }
}

impl TmuxLauncher {
    /// Starts `config`'s command in a new detached session and follows its pane.
    pub async fn spawn_with(config: TmuxConfig) -> Result<Spawned, HarnessError> {
        config.cli.check_program()?;
        let tmux = Tmux::new(&config.socket);
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
        match follow(&tmux, &pane, &config).await {
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

    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>> {
        Box::pin(async move {
            let mut config = TmuxConfig::for_agent(agent, relay);
            config.socket = self.socket.clone();
            TmuxLauncher::spawn_with(config).await
        })
    }
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
async fn follow(tmux: &Tmux, pane: &str, config: &TmuxConfig) -> Result<Spawned, HarnessError> {
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
        delivering: tokio::sync::Mutex::new(()),
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

/// One agent's pane.
struct TmuxSession {
    tmux: Tmux,
    pane: String,
    shared: Arc<Shared>,
    confirm_timeout: Duration,
    /// One delivery at a time: two pastes must not interleave.
    delivering: tokio::sync::Mutex<()>,
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

    /// Pastes `text` (sanitised) and submits it, confirmed by the pane printing
    /// something after the submit key; the key is sent a second time if it did not.
    async fn deliver(&self, text: &str) -> Result<(), HarnessError> {
        let text = sanitize(text);
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
            let mark = *printed.borrow_and_update();
            self.tmux.send_keys(&self.pane, &["Enter"]).await?;
            if self.printed_after(&mut printed, mark).await {
                return Ok(());
            }
        }
        Err(HarnessError::Stalled {
            pane: self.pane.clone(),
            detail: format!(
                "nothing changed within {:?} of the paste and of each of two submit keys",
                self.confirm_timeout
            ),
        })
    }

    /// Whether the pane prints past `mark` within the confirm timeout.
    async fn printed_after(&self, printed: &mut watch::Receiver<u64>, mark: u64) -> bool {
        tokio::time::timeout(self.confirm_timeout, printed.wait_for(|&now| now > mark))
            .await
            .is_ok_and(|seen| seen.is_ok())
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
            if let Err(e) = self.deliver(text).await {
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

    /// Sends `C-c` to the pane and ends the turn as interrupted (a pane says nothing of
    /// its turns).
    fn interrupt<'a>(
        &'a self,
        conversation: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.check_conversation(conversation)?;
            let running = lock(&self.shared.turn).clone();
            if running.as_deref() != Some(turn_id) {
                return Err(HarnessError::NoActiveTurn {
                    detail: format!("turn {turn_id} is not running in pane {}", self.pane),
                });
            }
            self.tmux.send_keys(&self.pane, &["C-c"]).await?;
            *lock(&self.shared.turn) = None;
            self.shared
                .emit(HarnessEvent::TurnCompleted {
                    turn_id: turn_id.to_string(),
                    outcome: TurnOutcome::Interrupted,
                })
                .await;
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

    fn endpoint(&self) -> Endpoint {
        Endpoint::Pane {
            pane: self.pane.clone(),
        }
    }

    /// The pane's last lines of output (a pane has no separate stderr).
    fn stderr_tail(&self) -> String {
        self.shared.tail()
    }

    /// Ends the pane's session and returns once its end is reported.
    fn shutdown(&self) -> BoxFuture<'_, Result<(), HarnessError>> {
        Box::pin(async move {
            let mut gone = self.shared.gone.subscribe();
            if !*gone.borrow_and_update() {
                // Already gone when tmux cannot find it: the reader reports that too.
                let _ = self.tmux.kill_session_of(&self.pane).await;
                let _ = gone.wait_for(|&gone| gone).await;
            }
            Ok(())
        })
    }
}
