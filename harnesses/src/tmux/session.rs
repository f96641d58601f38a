//! A tmux pane behind the harness seam, its session: [`follow`] makes it on a pane
//! (its output followed by `output.rs`), and `TmuxSession` waits for the pane to be
//! ready, delivers each task into it and ends the turn when the agent answers through
//! Relay, at its timeout or by interrupt.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use relay_protocol::domain::{ApprovalDecision, Harness};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use tokio::sync::{mpsc, watch};

use super::client::Tmux;
use super::launch::{task_text, Ownership, TmuxConfig};
use super::output::{open_fifo, read_output, settle, OutputFifo, Shared, EVENT_CAPACITY};
use super::sanitize::sanitize;
use super::screens::{last_lines, Judge, KnownCli, Readiness};
use crate::error::HarnessError;
use crate::process::lock;
use crate::seam::{BoxFuture, Endpoint, HarnessSession, OpenedSession, Spawned};

/// How long a pane's output must be quiet before a paste counts as shown.
const PASTE_QUIET: Duration = Duration::from_millis(150);

/// How long a pane that keeps printing (a spinner, an animation) prints before its
/// screen is judged anyway.
const READY_BUSY: Duration = Duration::from_secs(1);

/// How many of a pane's last lines an error says it showed.
const SCREEN_LINES: usize = 6;

/// What a TUI shows in its input box for a long paste not yet submitted (codex: `[Pasted
/// Content 3047 chars]`, Claude Code: `[Pasted text #1 ...]`): while one shows, the task
/// has not been taken.
const PASTE_MARKERS: [&str; 2] = ["[Pasted Content", "[Pasted text"];

/// Follows `pane`'s output through `piped`, the FIFO it was started piped into (a pane
/// Relay started), else a new one piped now; starts the reader, and makes the session.
///
/// A pane Relay started was followed from its first byte: its program's bracketed paste
/// mode is known, off until it turns it on. Another one's is what Relay remembered on
/// the pane, else unknown until its program sets it again.
pub(super) async fn follow(
    tmux: &Tmux,
    pane: &str,
    config: &TmuxConfig,
    ownership: Ownership,
    piped: Option<OutputFifo>,
) -> Result<Spawned, HarnessError> {
    let (fifo, bracketed) = match piped {
        Some(fifo) => (fifo, Some(false)),
        None => {
            let fifo = OutputFifo::new()?;
            let remembered = tmux.bracketed_paste(pane).await.unwrap_or(None);
            tmux.pipe_output(pane, fifo.path()).await?;
            (fifo, remembered)
        }
    };
    let output = open_fifo(fifo).await?;
    let (events, rx) = mpsc::channel(EVENT_CAPACITY);
    let shared = Arc::new(Shared {
        turn: Mutex::new(None),
        events: Mutex::new(Some(events)),
        tail: Mutex::new(VecDeque::new()),
        printed: watch::Sender::new(0),
        gone: watch::Sender::new(false),
        bracketed: Mutex::new(bracketed),
    });
    tokio::spawn(read_output(
        output,
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
    fn check_session(&self, session_id: &str) -> Result<(), HarnessError> {
        match session_id == self.pane {
            true => Ok(()),
            false => Err(HarnessError::SessionNotFound {
                session_id: session_id.to_string(),
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

    /// How a person looks at the pane: `tmux -L relay@tm-1 attach -t %3`.
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

    /// Pastes `task` (sanitised), with its flight and how to answer ([`task_text`]), and
    /// submits it, confirmed by the pane changing after the submit key: something
    /// printed, a screen other than before, and no collapsed paste still waiting in a
    /// TUI's input box. The key is sent a second time if not.
    ///
    /// A task of more than one line goes only to a program that has bracketed paste on
    /// (else each of its line breaks would reach it as an Enter, a submit or a command of
    /// its own), and is refused otherwise, nothing pasted ([`Self::paste_problem`]).
    async fn deliver(&self, task: &str, flight: &str) -> Result<(), HarnessError> {
        let multi_line = sanitize(task).contains('\n');
        let text = sanitize(&task_text(task, flight, self.mcp));
        self.ready().await?;
        if multi_line {
            if let Some(why) = self.paste_problem() {
                return Err(HarnessError::Incapable {
                    harness: Harness::Tmux,
                    what: why,
                });
            }
        }
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

    /// Why a task's line breaks cannot be pasted into the pane as text now, if they
    /// cannot: its program has not turned bracketed paste on (tmux brackets a paste only
    /// then, and tmux 3.3 says nothing of the mode: Relay follows it in the pane's
    /// output), or Relay has not seen it say either way.
    fn paste_problem(&self) -> Option<String> {
        let why = match *lock(&self.shared.bracketed) {
            Some(true) => return None,
            Some(false) => "its program has not turned bracketed paste on".to_string(),
            None => "Relay has not seen whether its program has bracketed paste on (it began following the pane after the program started)".to_string(),
        };
        Some(format!(
            "paste a task of several lines into pane {} as text: {why}, so each line break would reach it as an Enter of its own; send the task as one line, or run a program there that turns bracketed paste on",
            self.pane
        ))
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
    /// A pane holds no session to resume: the session is the pane (its id).
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        Box::pin(async move {
            let id = self.pane.clone();
            Ok(match stored.filter(|old| *old != id) {
                Some(old) => {
                    OpenedSession::replacing(old, id, "a tmux pane keeps no conversation to resume")
                }
                None => OpenedSession { id, lost: None },
            })
        })
    }

    /// Starts the turn (its events first, so the pane's output from the paste on is the
    /// turn's), then delivers the task; a delivery that fails ends the turn failed.
    fn start_turn<'a>(
        &'a self,
        session_id: &'a str,
        text: &'a str,
        relay_turn_id: &'a str,
    ) -> BoxFuture<'a, Result<String, HarnessError>> {
        Box::pin(async move {
            self.check_session(session_id)?;
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
            if let Err(e) = self.deliver(text, relay_turn_id).await {
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
        _session_id: &'a str,
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
        session_id: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.check_session(session_id)?;
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
        session_id: &'a str,
        turn_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(async move {
            self.check_session(session_id)?;
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
