//! The harness seam: what every agent CLI's adapter offers the runtime, and the registry
//! ([`Harnesses`]) that finds the adapter of an agent's [`Harness`].
//!
//! Shaped by the CLIs Relay drives (facts in `HARNESSES.md`):
//!
//! | | session | turn ids | steer | interrupt | approvals | endpoint |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | Codex app-server | `thread/resume` or `thread/start`, by request | Codex's | `turn/steer` | `turn/interrupt` | server requests | pid |
//! | Claude Code stream-json | `--resume` / `--session-id` at process start | none | no | control request | `can_use_tool` | pid |
//! | Pi RPC | `--session` at process start | none | `steer` | `abort` | none (tools run at once) | pid |
//! | tmux pane | none to resume | none | no | keys | none | pane |
//! | ACP agent | `session/resume`, `session/load` or `session/new`, by request | none | no | `session/cancel` | `session/request_permission` | pid |
//!
//! So the seam has two halves:
//! - a [`Launcher`] per harness: its [`HarnessInfo`] (names and [`Capabilities`]),
//!   [`Launcher::spawn`], which starts a session for an agent and hands back the
//!   session and its event stream, and [`Launcher::peek`] for a harness whose session
//!   is a screen (a tmux pane);
//! - the [`HarnessSession`] it spawned: [`open`](HarnessSession::open) the agent's
//!   session (resume the stored id, or start one and say why the old one was
//!   lost), [`start_turn`](HarnessSession::start_turn), steer, interrupt, answer an
//!   approval, the live [`Endpoint`], the stderr tail, shut down.
//!
//! An adapter whose CLI takes the session at process start (Claude Code, Pi) starts
//! or restarts its child in `open`; the event stream it handed out at `spawn` stays the
//! same. A CLI without turn ids uses the id Relay passes to `start_turn` and stamps its
//! events with it. What a harness cannot do is declared in its [`Capabilities`], and the
//! runtime refuses it with a reason instead of calling the adapter.
//!
//! Methods return boxed futures, so the runtime holds any adapter as
//! `Arc<dyn HarnessSession>` and picks the launcher by the agent's [`Harness`] at run time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use relay_protocol::domain::{Agent, AgentSpec, ApprovalDecision, Harness, ProgramInfo};
use relay_protocol::harness::HarnessEvent;
use tokio::sync::mpsc;

use crate::access::RelayAccess;
use crate::error::HarnessError;
pub use crate::preflight::Preflight;

/// The future of a seam method.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

// What a harness can do lives with the harness names in the protocol (the CLI and the
// API say it too); re-exported here for the adapters.
pub use relay_protocol::domain::Capabilities;

/// [`HarnessSession::respond_approval`] of a harness that never asks (Pi, a tmux pane):
/// no request of its is ever pending.
pub fn never_pending<'a>(request_id: &str) -> BoxFuture<'a, Result<(), HarnessError>> {
    let request_id = request_id.to_string();
    Box::pin(async move { Err(HarnessError::UnknownRequest { request_id }) })
}

/// What the runtime knows of a harness before it spawns anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarnessInfo {
    pub harness: Harness,
    /// How messages name the agent program ("codex").
    pub name: &'static str,
    /// How messages name its process ("codex app-server").
    pub program: &'static str,
    pub capabilities: Capabilities,
    /// Its session is a screen a person could look at (a tmux pane), which
    /// [`Launcher::peek`] shows (`relay agent peek`). Without, `peek` is refused.
    pub screen: bool,
}

/// What an agent's screen shows now ([`Launcher::peek`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Screen {
    /// Where it is (a tmux pane, `%3`).
    pub pane: String,
    /// How a person looks at it themselves (`tmux -L relay@tm-1 attach -t %3`).
    pub attach: String,
    /// Its last lines as plain text (no escape codes), oldest first.
    pub lines: Vec<String>,
}

/// Where a live session can be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A child process (also its process group).
    Process { pid: u32 },
    /// A tmux pane (`session:window.pane`).
    Pane { pane: String },
}

impl Endpoint {
    pub fn pid(&self) -> Option<u32> {
        match self {
            Endpoint::Process { pid } => Some(*pid),
            Endpoint::Pane { .. } => None,
        }
    }

    pub fn pane(&self) -> Option<&str> {
        match self {
            Endpoint::Process { .. } => None,
            Endpoint::Pane { pane } => Some(pane),
        }
    }
}

/// The harness session a [`HarnessSession`] opened: what the agent CLI calls its
/// session (Claude Code, Pi) or thread (Codex), or the pane (tmux). Not Relay's own
/// conversations ([`relay_protocol::domain::Conversation`]), which are between agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedSession {
    /// Its id, to store and resume later.
    pub id: String,
    /// Set when the stored session could not be resumed and this one was started
    /// instead.
    pub lost: Option<Lost>,
}

/// A stored session the harness could not resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub old_id: String,
    /// Why, for a person: what was lost, and what replaced it.
    pub reason: String,
}

impl Lost {
    /// Stored session `old` replaced by `new`, because of `why` (for a person: "codex
    /// no longer has thread X"). The one wording of every harness's loss.
    pub fn replaced(old: &str, new: &str, why: &str) -> Lost {
        Lost {
            old_id: old.to_string(),
            reason: format!("{why}; started {new} without the earlier conversation"),
        }
    }
}

impl OpenedSession {
    /// The new session `new`, started because stored `old` could not be resumed.
    pub fn replacing(old: &str, new: String, why: &str) -> OpenedSession {
        let lost = Lost::replaced(old, &new, why);
        OpenedSession {
            id: new,
            lost: Some(lost),
        }
    }
}

/// A session and the events of everything it runs. The stream must be drained (the
/// adapter stops reading its child when it is full) and ends with
/// [`HarnessEvent::ProcessExited`] when the session is gone.
pub struct Spawned {
    pub session: Arc<dyn HarnessSession>,
    pub events: mpsc::Receiver<HarnessEvent>,
}

/// One harness: spawns its sessions. Registered in [`Harnesses`] under
/// [`HarnessInfo::harness`].
pub trait Launcher: Send + Sync {
    fn info(&self) -> HarnessInfo;

    /// Starts a session for `agent` (its program, arguments, variables and secrets,
    /// directory, model), reaching Relay through `relay` when given (see
    /// [`crate::access`]). [`HarnessError::Spawn`] when the program cannot be started.
    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>>;

    /// Checks on this host, before `agent` is registered, what would make its sessions
    /// fail: an error refuses it ([`HarnessError::Cwd`], [`HarnessError::Spawn`],
    /// [`HarnessError::DoesNotRun`]); warnings do not (its credentials not found). See
    /// [`crate::preflight`]. By default, its working directory only.
    fn preflight<'a>(
        &'a self,
        agent: &'a AgentSpec,
    ) -> BoxFuture<'a, Result<Preflight, HarnessError>> {
        let cwd = std::path::PathBuf::from(&agent.cwd);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || crate::preflight::check_cwd(&cwd))
                .await
                .map_err(|e| HarnessError::Io(std::io::Error::other(e)))??;
            Ok(Preflight::default())
        })
    }

    /// The last `lines` lines `agent`'s screen shows now, for a harness with one
    /// ([`HarnessInfo::screen`]); `agent` as the broker knows it (its endpoint names
    /// where the screen is). It needs no live session: the screen may outlive Relay's.
    /// [`HarnessError::NoScreen`] when there is none yet or it cannot be read; by
    /// default (no screen) [`HarnessError::Incapable`].
    fn peek<'a>(
        &'a self,
        agent: &'a Agent,
        lines: usize,
    ) -> BoxFuture<'a, Result<Screen, HarnessError>> {
        let _ = (agent, lines);
        let harness = self.info().harness;
        Box::pin(async move {
            Err(HarnessError::Incapable {
                harness,
                what: "show a screen".into(),
            })
        })
    }
}

/// A live session of one agent. Cheap to share (`Arc`); every method may be called from
/// any task while the events are drained elsewhere.
pub trait HarnessSession: Send + Sync {
    /// Opens the agent's session: resumes `stored` (a harness with `resume`), or
    /// starts one; a stored one that cannot be resumed is reported in
    /// [`OpenedSession::lost`], never hidden.
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>>;

    /// Opens a new session that is a fork of another agent's session (`relay agent
    /// fork`): a copy of `from.thread_id`'s conversation, cut after its first
    /// `from.keep_turns` turns (all of them when `None`), that goes on apart from it. Used
    /// instead of [`open`](Self::open) for a forked agent's first session; its id is
    /// stored and resumed like any other. By default [`HarnessError::Fork`] (a
    /// harness without [`relay_protocol::domain::Capabilities::fork`]).
    fn fork<'a>(
        &'a self,
        from: &'a relay_protocol::domain::ForkSpec,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        let _ = from;
        Box::pin(async move {
            Err(HarnessError::Fork {
                detail: "this harness cannot fork a session".into(),
            })
        })
    }

    /// Starts a turn of session `session_id` with `text` as the user's input and returns the
    /// turn's id: the harness's own (with `turn_ids`), else `relay_turn_id`. The turn's
    /// progress and end arrive as events carrying that id.
    fn start_turn<'a>(
        &'a self,
        session_id: &'a str,
        text: &'a str,
        relay_turn_id: &'a str,
    ) -> BoxFuture<'a, Result<String, HarnessError>>;

    /// Adds `text` to the running turn. [`HarnessError::NoActiveTurn`] when `turn_id` is
    /// not running.
    fn steer<'a>(
        &'a self,
        session_id: &'a str,
        turn_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>>;

    /// Asks the harness to stop the turn; it then ends with
    /// [`TurnOutcome::Interrupted`](relay_protocol::harness::TurnOutcome::Interrupted).
    /// [`HarnessError::NoActiveTurn`] when no turn runs (yet: right after
    /// `start_turn`, Codex may not have made it active).
    fn interrupt<'a>(
        &'a self,
        session_id: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>>;

    /// Ends the running turn with `text` as its answer, given by the agent through Relay
    /// (`relay reply`), for a harness whose turns end only that way
    /// ([`Capabilities::reply`]); the turn then completes with `text`. The others have
    /// no turn waiting for a reply ([`HarnessError::NoActiveTurn`]; the runtime does not
    /// ask them).
    fn reply<'a>(
        &'a self,
        _session_id: &'a str,
        turn_id: &'a str,
        _text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        let detail = format!("turn {turn_id} ends on its own, not by a reply through Relay");
        Box::pin(async move { Err(HarnessError::NoActiveTurn { detail }) })
    }

    /// Answers a [`HarnessEvent::ApprovalRequested`]. [`HarnessError::UnknownRequest`]
    /// when it is no longer pending.
    fn respond_approval<'a>(
        &'a self,
        request_id: &'a str,
        decision: ApprovalDecision,
    ) -> BoxFuture<'a, Result<(), HarnessError>>;

    /// Where the session is reachable now.
    fn endpoint(&self) -> Endpoint;

    /// The last lines the agent wrote on stderr (empty where there is none).
    fn stderr_tail(&self) -> String;

    /// What the agent's program said of itself when it started (an ACP agent's
    /// `initialize`), once the session is open; `None` for a harness that says nothing.
    fn program(&self) -> Option<ProgramInfo> {
        None
    }

    /// Stops the session and returns once it is gone; the events then end with
    /// [`HarnessEvent::ProcessExited`]. Idempotent.
    fn shutdown(&self) -> BoxFuture<'_, Result<(), HarnessError>>;
}
