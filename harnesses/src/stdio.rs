//! One agent CLI that speaks JSON lines over its stdio (Codex's app-server JSON-RPC,
//! Claude Code's stream-json, Pi's RPC mode), driven by an owner task that is the only
//! code touching its pipes.
//!
//! An adapter supplies a [`Wire`]: it reads each stdout line into [`Action`]s (events,
//! answers to the adapter's own requests, lines to write back) and keeps whatever state
//! its protocol needs (the turn running, pending permission requests). The adapter's
//! handle, [`StdioChild`], runs closures on that state inside the owner task
//! ([`StdioChild::call`]): each returns the line to write and, for a request, the id of
//! the answer to wait for. So the wire state is never shared or locked.
//!
//! When the child goes away, for whatever reason, the owner fails every waiter with the
//! exit (code, signal, stderr tail), and, once the adapter has [armed](StdioChild::arm)
//! the child, sends [`HarnessEvent::ProcessExited`] as the very last event. A child that
//! dies before it is armed (a stored session the CLI refuses to resume) only fails its
//! waiters, so the runtime never sees a session end that never began.
//!
//! While another agent of the process streams, a burst on stdout is read at a shared
//! pace ([`crate::ration`]): one agent's flood cannot take every core from the others.
//!
//! Over 600 lines: the handle and its owner task share private state; ~100 are tests.

use std::collections::HashMap;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use relay_protocol::harness::HarnessEvent;
use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot};

use crate::error::HarnessError;
use crate::lines::{LineReader, Overflow};
use crate::process::{ExitInfo, Pipes, ProcessSpec, StderrTail, Supervised};
use crate::ration::Ration;

/// Events buffered for a session's consumer before the owner stops reading the child's
/// stdout (the backpressure: a slow consumer slows the child, never loses an event).
pub const EVENT_CAPACITY: usize = 1024;
/// Commands queued to one child's owner before callers get [`HarnessError::Overloaded`].
pub const COMMAND_CAPACITY: usize = 64;
/// Longest stdout line taken; a longer one is skipped and counted as malformed.
const MAX_LINE: usize = 64 * 1024 * 1024;
/// A stdout line at least this long is parsed off the worker's other tasks (`take_line`).
const LONG_LINE: usize = 1 << 20;
/// After the child exits on its own, how long to keep reading stdout for its last lines.
const STDOUT_DRAIN: Duration = Duration::from_secs(1);
/// After stdout closes, how long the child gets to exit before it is terminated.
const EXIT_AFTER_EOF: Duration = Duration::from_secs(2);

/// What the owner does with one piece of a stdout line.
#[derive(Debug)]
pub enum Action {
    Event(HarnessEvent),
    /// The answer to the request written with `awaits: Some(id)`.
    Answer {
        id: String,
        result: Result<Value, HarnessError>,
    },
    /// A line to write back at once (e.g. refusing a request the adapter cannot serve).
    Send(Value),
    /// The line was not the protocol's (not JSON, or a known message of the wrong
    /// shape), for this reason: logged, counted in [`StdioChild::malformed_lines`] and
    /// skipped.
    Malformed(String),
}

/// A protocol's reading of stdout, and its state. Runs inside the owner task only.
pub trait Wire: Send + 'static {
    /// How log lines and errors name the CLI ("claude").
    const NAME: &'static str;
    /// Reads one stdout line (not empty) into actions.
    fn line(&mut self, line: &str, out: &mut Vec<Action>);

    /// The counter this wire adds its malformed lines to, if it counts them: the owner
    /// adds the lines too long to read, and [`StdioChild::malformed_lines`] reads it.
    fn malformed_counter(&self) -> Option<Arc<AtomicU64>> {
        None
    }
}

/// What a [`StdioChild::call`] closure asks the owner to write.
#[derive(Debug)]
pub struct Outgoing {
    pub message: Value,
    /// Wait for the [`Action::Answer`] with this id; `None` answers `Value::Null` once
    /// the line is written.
    pub awaits: Option<String>,
    /// Events the writing settles, sent before the line is written (so before
    /// anything the CLI answers to it).
    pub events: Vec<HarnessEvent>,
}

impl Outgoing {
    /// A line that is answered once written.
    pub fn send(message: Value) -> Self {
        Self {
            message,
            awaits: None,
            events: Vec::new(),
        }
    }

    /// The same, with `event` sent before it is written.
    pub fn with_event(mut self, event: HarnessEvent) -> Self {
        self.events.push(event);
        self
    }

    /// A request answered by the [`Action::Answer`] with `id`.
    pub fn request(message: Value, id: impl Into<String>) -> Self {
        Self {
            message,
            awaits: Some(id.into()),
            events: Vec::new(),
        }
    }
}

type Build<W> = Box<dyn FnOnce(&mut W) -> Result<Outgoing, HarnessError> + Send>;

enum Command<W> {
    Call {
        what: &'static str,
        build: Build<W>,
        reply: oneshot::Sender<Result<Value, HarnessError>>,
    },
    Shutdown {
        grace: Duration,
        reply: oneshot::Sender<ExitInfo>,
    },
}

#[derive(Default)]
struct Shared {
    exit: OnceLock<ExitInfo>,
    malformed: Arc<AtomicU64>,
    /// Calls refused with [`HarnessError::Overloaded`].
    overloaded: AtomicU64,
    /// Windows its stdout was held to the end of, beside another agent's stream
    /// ([`crate::ration`]).
    rationed: AtomicU64,
    /// Send [`HarnessEvent::ProcessExited`] when the child ends.
    armed: AtomicBool,
}

/// A handle on one child and its owner task. Dropping the last clone shuts the child
/// down (stdin closed, then its group killed after the grace period).
pub struct StdioChild<W: Wire> {
    commands: mpsc::Sender<Command<W>>,
    shared: Arc<Shared>,
    pid: u32,
    stderr: StderrTail,
    timeout: Duration,
    grace: Duration,
}

impl<W: Wire> Clone for StdioChild<W> {
    fn clone(&self) -> Self {
        Self {
            commands: self.commands.clone(),
            shared: self.shared.clone(),
            pid: self.pid,
            stderr: self.stderr.clone(),
            timeout: self.timeout,
            grace: self.grace,
        }
    }
}

impl<W: Wire> StdioChild<W> {
    /// Starts `spec` with `wire` reading its stdout; its events go to `events`.
    /// `timeout` bounds every [`call`](Self::call); `grace` is how long the child gets to
    /// exit after stdin closes (and again after SIGTERM) on shutdown.
    pub fn spawn(
        spec: &ProcessSpec,
        wire: W,
        events: mpsc::Sender<HarnessEvent>,
        timeout: Duration,
        grace: Duration,
    ) -> Result<Self, HarnessError> {
        let (process, pipes) = Supervised::spawn(spec)?;
        let pid = process.pid();
        let stderr = process.stderr_tail();
        let shared = Arc::new(Shared {
            malformed: wire.malformed_counter().unwrap_or_default(),
            ..Shared::default()
        });
        let (commands, command_rx) = mpsc::channel(COMMAND_CAPACITY);
        let owner = Owner::new(
            process,
            pipes,
            wire,
            command_rx,
            events,
            shared.clone(),
            grace,
        );
        tokio::spawn(owner.run());
        Ok(Self {
            commands,
            shared,
            pid,
            stderr,
            timeout,
            grace,
        })
    }

    /// Spawns `spec` like [`spawn`](Self::spawn), then does the CLI's handshake with
    /// `handshake` (a [`call`](Self::call)) and only then [arms](Self::arm) the child, so
    /// that a CLI refusing its start (a session it does not have) ends quietly: the
    /// handshake's error is returned and the child is gone. Returns the child and the
    /// handshake's answer.
    pub async fn start(
        spec: &ProcessSpec,
        wire: W,
        events: mpsc::Sender<HarnessEvent>,
        timeout: Duration,
        grace: Duration,
        handshake: (
            &'static str,
            impl FnOnce(&mut W) -> Result<Outgoing, HarnessError> + Send + 'static,
        ),
    ) -> Result<(Self, Value), HarnessError> {
        let child = Self::spawn(spec, wire, events, timeout, grace)?;
        let (what, build) = handshake;
        let answer = match child.call(what, build).await {
            Ok(answer) => answer,
            Err(err) => {
                child.shutdown().await;
                return Err(err);
            }
        };
        child.arm();
        // Gone between its answer and being armed: its end was not reported, so it is
        // this start's error.
        if let Some(exit) = child.exit() {
            return Err(exit.to_error());
        }
        Ok((child, answer))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn stderr_tail(&self) -> String {
        self.stderr.snapshot()
    }

    /// Stdout lines that were not the protocol's JSON; each was logged and skipped.
    pub fn malformed_lines(&self) -> u64 {
        self.shared.malformed.load(Ordering::Relaxed)
    }

    /// Windows its stdout was held to the end of beside another agent's stream
    /// ([`crate::ration`]).
    pub fn rationed_windows(&self) -> u64 {
        self.shared.rationed.load(Ordering::Relaxed)
    }

    /// Calls refused with [`HarnessError::Overloaded`] so far.
    pub fn overloaded_count(&self) -> u64 {
        self.shared.overloaded.load(Ordering::Relaxed)
    }

    /// From now on the child's end is reported as [`HarnessEvent::ProcessExited`].
    pub fn arm(&self) {
        self.shared.armed.store(true, Ordering::Release);
    }

    /// How the child ended, once it has.
    pub fn exit(&self) -> Option<ExitInfo> {
        self.shared.exit.get().cloned()
    }

    /// Runs `build` on the wire state in the owner task, writes the line it returns and
    /// waits (at most the timeout) for its answer. `what` names the call in errors.
    pub async fn call(
        &self,
        what: &'static str,
        build: impl FnOnce(&mut W) -> Result<Outgoing, HarnessError> + Send + 'static,
    ) -> Result<Value, HarnessError> {
        if let Some(info) = self.shared.exit.get() {
            return Err(info.to_error());
        }
        let (reply, rx) = oneshot::channel();
        let command = Command::Call {
            what,
            build: Box::new(build),
            reply,
        };
        match self.commands.try_send(command) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.shared.overloaded.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(pid = self.pid, cli = W::NAME, "command queue full");
                return Err(HarnessError::Overloaded);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(self.gone()),
        }
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(self.gone()),
            Err(_) => Err(HarnessError::Timeout {
                method: what.to_string(),
                after: self.timeout,
            }),
        }
    }

    fn gone(&self) -> HarnessError {
        self.shared
            .exit
            .get()
            .map(ExitInfo::to_error)
            .unwrap_or(HarnessError::ChannelClosed)
    }

    /// Closes stdin, waits for the child to exit (SIGTERM, then SIGKILL of its tree after
    /// the grace period) and returns how it ended. Idempotent.
    pub async fn shutdown(&self) -> ExitInfo {
        if let Some(info) = self.shared.exit.get() {
            return info.clone();
        }
        let (reply, rx) = oneshot::channel();
        let sent = self
            .commands
            .send(Command::Shutdown {
                grace: self.grace,
                reply,
            })
            .await;
        match (sent, rx.await) {
            (Ok(()), Ok(info)) => info,
            // The owner ended meanwhile; it set the exit before dropping the reply.
            _ => self.shared.exit.get().cloned().unwrap_or(ExitInfo {
                code: None,
                signal: None,
                stderr_tail: self.stderr.snapshot(),
            }),
        }
    }
}

/// Why the main loop ended.
enum End {
    Exited(std::io::Result<ExitStatus>),
    StdoutClosed,
    Shutdown {
        grace: Duration,
        reply: Option<oneshot::Sender<ExitInfo>>,
    },
}

struct Owner<W: Wire> {
    process: Supervised,
    stdin: Option<ChildStdin>,
    stdout: LineReader<BufReader<ChildStdout>>,
    wire: W,
    commands: mpsc::Receiver<Command<W>>,
    events: mpsc::Sender<HarnessEvent>,
    events_open: bool,
    stdin_broken: bool,
    pending: HashMap<String, oneshot::Sender<Result<Value, HarnessError>>>,
    shared: Arc<Shared>,
    grace: Duration,
    actions: Vec<Action>,
    ration: Ration,
}

impl<W: Wire> Owner<W> {
    fn new(
        process: Supervised,
        pipes: Pipes,
        wire: W,
        commands: mpsc::Receiver<Command<W>>,
        events: mpsc::Sender<HarnessEvent>,
        shared: Arc<Shared>,
        grace: Duration,
    ) -> Self {
        Self {
            process,
            stdin: Some(pipes.stdin),
            stdout: LineReader::new(
                BufReader::new(pipes.stdout),
                MAX_LINE,
                Overflow::Skip(shared.malformed.clone()),
            ),
            wire,
            commands,
            events,
            events_open: true,
            stdin_broken: false,
            pending: HashMap::new(),
            shared,
            grace,
            actions: Vec::new(),
            ration: Ration::new(),
        }
    }

    async fn run(mut self) {
        let end = loop {
            if self.stdin_broken {
                break End::StdoutClosed;
            }
            tokio::select! {
                read = self.stdout.read_line() => match read {
                    Ok(false) => break End::StdoutClosed,
                    Ok(true) => {
                        self.take_line().await;
                        self.keep_pace().await;
                    }
                    Err(err) => {
                        tracing::warn!(%err, cli = W::NAME, "stdout read failed");
                        break End::StdoutClosed;
                    }
                },
                status = self.process.wait() => break End::Exited(status),
                command = self.commands.recv() => match command {
                    Some(Command::Shutdown { grace, reply }) => {
                        break End::Shutdown { grace, reply: Some(reply) };
                    }
                    Some(Command::Call { what, build, reply }) => self.call(what, build, reply).await,
                    None => break End::Shutdown { grace: self.grace, reply: None },
                },
            }
        };

        let (info, shutdown_reply) = match end {
            End::Exited(status) => {
                self.drain_stdout().await;
                (self.finish(status).await, None)
            }
            End::StdoutClosed => {
                let info = match self.wait_exit(EXIT_AFTER_EOF).await {
                    Some(status) => self.finish(status).await,
                    None => self.process.terminate(self.grace).await,
                };
                (info, None)
            }
            End::Shutdown { grace, reply } => {
                // Closing stdin is the CLI's cue to exit; keep reading meanwhile so it
                // never blocks on a full stdout pipe.
                self.stdin = None;
                let info = match self.wait_exit(grace).await {
                    Some(status) => self.finish(status).await,
                    None => self.process.terminate(grace).await,
                };
                (info, reply)
            }
        };

        let _ = self.shared.exit.set(info.clone());
        for (_, reply) in self.pending.drain() {
            let _ = reply.send(Err(info.to_error()));
        }
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Call { reply, .. } => {
                    let _ = reply.send(Err(info.to_error()));
                }
                Command::Shutdown { reply, .. } => {
                    let _ = reply.send(info.clone());
                }
            }
        }
        let last = HarnessEvent::ProcessExited {
            code: info.code,
            signal: info.signal,
            stderr_tail: info.stderr_tail.clone(),
        };
        if let Some(reply) = shutdown_reply {
            let _ = reply.send(info);
        }
        if self.shared.armed.load(Ordering::Acquire) {
            self.emit(last).await;
        }
    }

    async fn finish(&mut self, status: std::io::Result<ExitStatus>) -> ExitInfo {
        match status {
            Ok(status) => self.process.finish(status).await,
            Err(err) => {
                tracing::warn!(%err, cli = W::NAME, "waiting for the child failed; terminating it");
                self.process.terminate(self.grace).await
            }
        }
    }

    async fn wait_exit(&mut self, limit: Duration) -> Option<std::io::Result<ExitStatus>> {
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        let mut stdout_open = true;
        loop {
            tokio::select! {
                read = self.stdout.read_line(), if stdout_open => match read {
                    Ok(false) | Err(_) => stdout_open = false,
                    Ok(true) => self.take_line().await,
                },
                status = self.process.wait() => {
                    self.drain_stdout().await;
                    return Some(status);
                }
                _ = &mut deadline => return None,
            }
        }
    }

    async fn drain_stdout(&mut self) {
        let drain = async {
            loop {
                match self.stdout.read_line().await {
                    Ok(false) | Err(_) => break,
                    Ok(true) => self.take_line().await,
                }
            }
        };
        let _ = tokio::time::timeout(STDOUT_DRAIN, drain).await;
    }

    /// Waits out the rest of the window when this stdout has taken its share of it
    /// beside another agent's stream ([`crate::ration`]).
    async fn keep_pace(&mut self) {
        let Some(until) = self.ration.line(std::time::Instant::now()) else {
            return;
        };
        if self.shared.rationed.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::debug!(
                cli = W::NAME,
                pid = self.process.pid(),
                "stdout read at a shared pace while another agent streams"
            );
        }
        // A wait from now, not a deadline: tokio's clock may be paused (tests), and a
        // `std` instant given to it would move that clock by all the real time passed.
        tokio::time::sleep(until.saturating_duration_since(std::time::Instant::now())).await;
    }

    async fn take_line(&mut self) {
        let line = self.stdout.text();
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let mut actions = std::mem::take(&mut self.actions);
        // A line of megabytes (a long answer's JSON) takes tens of milliseconds to parse:
        // the tasks queued on this worker (another agent's deltas among them) move to
        // another thread meanwhile (ops/BENCHMARKS.md part 19). Not on a runtime of one
        // thread, which has nowhere to move them.
        // (The runtime's flavour asked only then: not for each of a burst's lines.)
        let long = line.len() >= LONG_LINE
            && tokio::runtime::Handle::current().runtime_flavor()
                == tokio::runtime::RuntimeFlavor::MultiThread;
        if long {
            tokio::task::block_in_place(|| self.wire.line(line, &mut actions));
        } else {
            self.wire.line(line, &mut actions);
        }
        for action in actions.drain(..) {
            match action {
                Action::Event(event) => self.emit(event).await,
                Action::Answer { id, result } => match self.pending.remove(&id) {
                    Some(reply) => {
                        let _ = reply.send(result);
                    }
                    None => tracing::debug!(%id, cli = W::NAME, "answer to no pending request"),
                },
                Action::Send(message) => {
                    if let Err(err) = self.write(&message).await {
                        tracing::warn!(%err, cli = W::NAME, "could not answer the CLI");
                    }
                }
                Action::Malformed(reason) => {
                    self.shared.malformed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%reason, cli = W::NAME, "stdout line skipped");
                }
            }
        }
        self.actions = actions;
    }

    async fn call(
        &mut self,
        what: &'static str,
        build: Build<W>,
        reply: oneshot::Sender<Result<Value, HarnessError>>,
    ) {
        if reply.is_closed() {
            return;
        }
        let outgoing = match build(&mut self.wire) {
            Ok(outgoing) => outgoing,
            Err(err) => {
                let _ = reply.send(Err(err));
                return;
            }
        };
        for event in outgoing.events {
            self.emit(event).await;
        }
        let written = self.write(&outgoing.message).await;
        match (outgoing.awaits, written) {
            // Parked even if the write failed: a broken stdin ends the session, and the
            // waiter then gets the exit (code, signal, stderr) rather than EPIPE.
            (Some(id), _) => {
                self.pending.insert(id, reply);
            }
            (None, Ok(())) => {
                let _ = reply.send(Ok(Value::Null));
            }
            (None, Err(err)) => {
                tracing::debug!(%err, what, cli = W::NAME, "write failed");
                let _ = reply.send(Err(err));
            }
        }
    }

    async fn write(&mut self, message: &Value) -> Result<(), HarnessError> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(HarnessError::ChannelClosed);
        };
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        let written = async {
            stdin.write_all(&line).await?;
            stdin.flush().await
        };
        if let Err(err) = written.await {
            tracing::warn!(%err, cli = W::NAME, "writing to stdin failed; ending the session");
            self.stdin_broken = true;
            return Err(err.into());
        }
        Ok(())
    }

    async fn emit(&mut self, event: HarnessEvent) {
        if !self.events_open {
            return;
        }
        // Awaiting is the backpressure: a slow consumer slows reading of stdout, never
        // loses an event.
        if self.events.send(event).await.is_err() {
            self.events_open = false;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    struct Silent;

    impl Wire for Silent {
        const NAME: &'static str = "silent";
        fn line(&mut self, _: &str, _: &mut Vec<Action>) {}
    }

    /// A handle whose "owner" is the returned receiver, driven by the test.
    fn detached(capacity: usize) -> (StdioChild<Silent>, mpsc::Receiver<Command<Silent>>) {
        let (commands, rx) = mpsc::channel(capacity);
        let child = StdioChild {
            commands,
            shared: Arc::new(Shared::default()),
            pid: 0,
            stderr: StderrTail::default(),
            timeout: Duration::from_secs(30),
            grace: Duration::from_secs(1),
        };
        (child, rx)
    }

    fn request(_: &mut Silent) -> Result<Outgoing, HarnessError> {
        Ok(Outgoing::request(Value::Null, "1"))
    }

    #[tokio::test]
    async fn a_full_queue_is_rejected_not_waited_on() {
        let (child, _rx) = detached(1);
        let first = tokio::spawn({
            let child = child.clone();
            async move { child.call("first", request).await }
        });
        tokio::task::yield_now().await;
        assert!(matches!(
            child.call("second", request).await,
            Err(HarnessError::Overloaded)
        ));
        assert_eq!(child.overloaded_count(), 1);
        first.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_calls_time_out() {
        let (child, _rx) = detached(4);
        match child.call("turn/start", request).await {
            Err(HarnessError::Timeout { method, after }) => {
                assert_eq!(
                    (method.as_str(), after),
                    ("turn/start", Duration::from_secs(30))
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_gone_owner_fails_calls_with_its_exit() {
        let (child, rx) = detached(4);
        drop(rx);
        assert!(matches!(
            child.call("x", request).await,
            Err(HarnessError::ChannelClosed)
        ));
        let _ = child.shared.exit.set(ExitInfo {
            code: Some(1),
            signal: None,
            stderr_tail: "boom".into(),
        });
        assert!(matches!(
            child.call("x", request).await,
            Err(HarnessError::ProcessExited { code: Some(1), ref stderr_tail, .. }) if stderr_tail == "boom"
        ));
        // The answer channel dropped unanswered (owner ended mid-call) gives the same.
        let (child2, mut rx2) = detached(4);
        let call = tokio::spawn({
            let child2 = child2.clone();
            async move { child2.call("interrupt", request).await }
        });
        let command = rx2.recv().await;
        let _ = child2.shared.exit.set(ExitInfo {
            code: None,
            signal: Some(9),
            stderr_tail: String::new(),
        });
        drop(command);
        assert!(matches!(
            call.await.unwrap(),
            Err(HarnessError::ProcessExited {
                signal: Some(9),
                ..
            })
        ));
        // Shutdown of an ended child answers its exit at once.
        drop(rx2);
        assert_eq!(child2.shutdown().await.signal, Some(9));
    }
}
