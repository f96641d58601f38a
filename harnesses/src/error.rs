//! The one error type of this crate. Callers match on variants, never on message text.

use std::time::Duration;

use relay_protocol::domain::Harness;

/// Why a harness operation failed.
///
/// Retryable (the same call may succeed later): [`Overloaded`](Self::Overloaded),
/// [`Timeout`](Self::Timeout), [`NoActiveTurn`](Self::NoActiveTurn) and
/// [`TurnRunning`](Self::TurnRunning) on the same session; [`ProcessExited`](Self::ProcessExited)
/// and [`ChannelClosed`](Self::ChannelClosed) after spawning a new session. The others
/// are answers, not accidents: retrying the same call gives the same error.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The agent program could not be started (missing, not executable). Not retryable
    /// until the configuration changes.
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// The agent's working directory is missing, or not a directory: nothing can start
    /// in it. Not retryable until it is there.
    #[error("the agent's working directory {cwd} {problem}")]
    Cwd { cwd: String, problem: String },
    /// The program starts but its check failed: `PROGRAM --version` (run before an agent
    /// is registered) exited with an error or was killed. Not retryable until the
    /// configuration changes.
    #[error("{program} does not run: `{program} {flag}` {problem}")]
    DoesNotRun {
        program: String,
        flag: String,
        problem: String,
    },
    /// The agent process is gone; the request in flight died with it. Retryable with a new
    /// session.
    #[error(
        "agent process exited (code {code:?}, signal {signal:?}); stderr tail:\n{stderr_tail}"
    )]
    ProcessExited {
        code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
    },
    /// The agent answered the request with a JSON-RPC error. Not retryable.
    #[error("agent refused the request: {message} (code {code})")]
    Rpc { code: i64, message: String },
    /// The agent does not know this session (never existed here; Codex: its thread's
    /// rollout file is gone). Not retryable: start a new session instead. (The message
    /// keeps Codex's word, which flight failures have always said.)
    #[error("thread {session_id} not found")]
    SessionNotFound { session_id: String },
    /// Opening the agent's harness session failed; `action` says which step (resuming
    /// the stored one, starting one). Retryable as its `source` is.
    #[error("{action}: {source}")]
    OpenSession {
        action: String,
        #[source]
        source: Box<HarnessError>,
    },
    /// No turn is running to steer or interrupt. Right after a turn start, Codex may not
    /// have made the turn active yet: retryable for a moment. `detail` is the agent's own
    /// refusal.
    #[error("{detail}")]
    NoActiveTurn { detail: String },
    /// A turn is still running, and this CLI runs one at a time (Claude Code: a second
    /// user message would be queued, or folded into the running turn). Retryable once the
    /// turn has ended.
    #[error("turn {turn_id} is still running")]
    TurnRunning { turn_id: String },
    /// The harness cannot do this at all; its [`Capabilities`](crate::Capabilities) say
    /// so, and the runtime does not ask. Not retryable.
    #[error("{harness} cannot {what}")]
    Incapable { harness: Harness, what: String },
    /// The session cannot start as a fork of another ([`crate::seam::HarnessSession::fork`]):
    /// the harness has no fork, or the session to fork is not found. Not retryable.
    #[error("cannot fork the session: {detail}")]
    Fork { detail: String },
    /// This runtime has no adapter for the harness. Not retryable.
    #[error("harness {harness} is not supported by this runtime yet (only {supported})")]
    Unsupported { harness: Harness, supported: String },
    /// An approval answer named a request that is not pending (already answered, or
    /// settled by the agent when its turn ended). Not retryable.
    #[error("no pending agent request {request_id}")]
    UnknownRequest { request_id: String },
    /// No answer within the configured time. Retryable; the late answer is dropped.
    #[error("{method} timed out after {after:?}")]
    Timeout { method: String, after: Duration },
    /// The session was shut down; its owner task no longer takes commands. Retryable with
    /// a new session.
    #[error("session closed")]
    ChannelClosed,
    /// The session's command queue is full: rejected rather than queued without bound.
    /// Retryable after a short wait.
    #[error("session overloaded: too many commands in flight")]
    Overloaded,
    /// Writing to or reading from the agent failed.
    #[error("agent i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A tmux command failed: `command` is its name (`new-session`), `stderr` what tmux
    /// said. Not retryable as such (a missing pane stays missing).
    #[error("tmux {command}: {stderr}")]
    Tmux { command: String, stderr: String },
    /// A pane did not take a task: after the paste and the submit key (sent twice), its
    /// screen did not change. Not retryable on this pane as it is; a person should look.
    #[error("pane {pane} stalled: {detail}")]
    Stalled { pane: String, detail: String },
    /// A pane was not given a task: its screen needs a person first (a sign-in, a trust
    /// question), or it did not show that it was ready within the ready timeout.
    /// `detail` says which, what it shows and how to get past it; nothing was pasted.
    /// Not retryable until a person acts.
    #[error("stalled: {detail}")]
    NotReady { pane: String, detail: String },
    /// The agent's configuration cannot be run as it is (a tmux agent with no program,
    /// a ready pattern that is not one). Not retryable until it changes.
    #[error("{detail}")]
    Config { detail: String },
    /// The agent's screen cannot be shown (`relay agent peek`): its pane has not started
    /// yet, or reading it failed. `detail` says which, for a person. Retryable once the
    /// pane runs.
    #[error("{detail}")]
    NoScreen { detail: String },
    /// A message could not be encoded, or a result did not have the expected shape.
    #[error("agent json: {0}")]
    Json(#[from] serde_json::Error),
}

impl HarnessError {
    /// `true` for the variants documented as retryable on this or a new session.
    pub fn is_retryable(&self) -> bool {
        match self {
            HarnessError::OpenSession { source, .. } => source.is_retryable(),
            other => matches!(
                other,
                HarnessError::ProcessExited { .. }
                    | HarnessError::Timeout { .. }
                    | HarnessError::ChannelClosed
                    | HarnessError::Overloaded
                    | HarnessError::NoActiveTurn { .. }
                    | HarnessError::TurnRunning { .. }
            ),
        }
    }
}
