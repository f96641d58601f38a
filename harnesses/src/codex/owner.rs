//! The owner task: the only code that touches the Codex child's pipes.
//!
//! It loops over three sources: [`Command`]s from the session handles (write a request
//! and park its `oneshot` in `pending`, answer an approval, shut down), stdout lines (fed
//! to the [`Translator`]; responses wake their waiter, events go to the event channel,
//! refusals are written back), and the child's exit. When the loop ends, for whatever
//! reason, it stops the child, fails every pending and queued request with
//! [`HarnessError::ProcessExited`], and sends [`HarnessEvent::ProcessExited`] as the very
//! last event.

use std::collections::HashMap;
use std::process::ExitStatus;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use relay_protocol::codex::{self as wire, ApprovalResponse, Message, RequestId};
use relay_protocol::harness::HarnessEvent;
use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot};

use super::translate::{Action, Translator};
use crate::error::HarnessError;
use crate::lines::{LineReader, Overflow};
use crate::process::{ExitInfo, Pipes, Supervised};

/// After the child exits on its own, how long to keep reading stdout for its last lines.
const STDOUT_DRAIN: Duration = Duration::from_secs(1);
/// Longest stdout line taken from Codex; a longer one is skipped and counted as
/// malformed, so a runaway child cannot make Relay buffer without bound.
const MAX_LINE: usize = 64 * 1024 * 1024;
/// After stdout closes, how long the child gets to exit before it is terminated.
const EXIT_AFTER_EOF: Duration = Duration::from_secs(2);

/// What a session handle asks of the owner task.
pub(crate) enum Command {
    Request {
        method: &'static str,
        params: Value,
        reply: oneshot::Sender<Result<Value, HarnessError>>,
    },
    Notify {
        method: &'static str,
    },
    Approve {
        request_id: String,
        decision: wire::ApprovalDecision,
        reply: oneshot::Sender<Result<(), HarnessError>>,
    },
    Shutdown {
        grace: Duration,
        reply: oneshot::Sender<ExitInfo>,
    },
}

/// State shared between the handles and the owner task.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// Set once, when the owner task ends: later requests fail with it.
    pub exit: OnceLock<ExitInfo>,
    pub malformed: Arc<AtomicU64>,
    /// Commands refused with `Overloaded`.
    pub overloaded: AtomicU64,
}

struct Pending {
    method: &'static str,
    reply: oneshot::Sender<Result<Value, HarnessError>>,
}

/// Why the main loop ended.
enum End {
    Exited(std::io::Result<ExitStatus>),
    /// Stdout reached EOF, or stdin broke: the child is going or useless.
    StdoutClosed,
    Shutdown {
        grace: Duration,
        reply: Option<oneshot::Sender<ExitInfo>>,
    },
}

pub(crate) struct Owner {
    process: Supervised,
    stdin: Option<ChildStdin>,
    stdout: LineReader<BufReader<ChildStdout>>,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<HarnessEvent>,
    /// `false` once the event receiver is gone: stop trying to send.
    events_open: bool,
    /// A write to stdin failed: the child is dying or deaf; end the session.
    stdin_broken: bool,
    pending: HashMap<i64, Pending>,
    next_id: i64,
    translator: Translator,
    shared: Arc<Shared>,
    default_grace: Duration,
}

impl Owner {
    pub fn new(
        process: Supervised,
        pipes: Pipes,
        commands: mpsc::Receiver<Command>,
        events: mpsc::Sender<HarnessEvent>,
        shared: Arc<Shared>,
        default_grace: Duration,
    ) -> Self {
        Self {
            process,
            stdin: Some(pipes.stdin),
            stdout: LineReader::new(
                BufReader::new(pipes.stdout),
                MAX_LINE,
                Overflow::Skip(shared.malformed.clone()),
            ),
            commands,
            events,
            events_open: true,
            stdin_broken: false,
            pending: HashMap::new(),
            next_id: 1,
            translator: Translator::new(shared.malformed.clone()),
            shared,
            default_grace,
        }
    }

    pub async fn run(mut self) {
        let end = loop {
            if self.stdin_broken {
                break End::StdoutClosed;
            }
            tokio::select! {
                read = self.stdout.read_line() => match read {
                    Ok(false) => break End::StdoutClosed,
                    Ok(true) => self.take_line().await,
                    Err(err) => {
                        tracing::warn!(%err, "codex: stdout read failed");
                        break End::StdoutClosed;
                    }
                },
                status = self.process.wait() => break End::Exited(status),
                command = self.commands.recv() => match command {
                    Some(Command::Shutdown { grace, reply }) => {
                        break End::Shutdown { grace, reply: Some(reply) };
                    }
                    Some(command) => self.command(command).await,
                    // Every handle is gone: nobody can use the session any more.
                    None => break End::Shutdown { grace: self.default_grace, reply: None },
                },
            }
        };

        let (info, shutdown_reply) = match end {
            End::Exited(status) => {
                self.drain_stdout(STDOUT_DRAIN).await;
                (self.finish(status).await, None)
            }
            End::StdoutClosed => {
                let info = match self.wait_exit(EXIT_AFTER_EOF).await {
                    Some(status) => self.finish(status).await,
                    None => self.process.terminate(self.default_grace).await,
                };
                (info, None)
            }
            End::Shutdown { grace, reply } => {
                // Closing stdin is Codex's cue to exit cleanly; keep reading meanwhile so
                // it never blocks on a full stdout pipe.
                self.stdin = None;
                let info = match self.wait_exit(grace).await {
                    Some(status) => self.finish(status).await,
                    None => self.process.terminate(grace).await,
                };
                (info, reply)
            }
        };

        let _ = self.shared.exit.set(info.clone());
        for (_, pending) in self.pending.drain() {
            let _ = pending.reply.send(Err(info.to_error()));
        }
        // Commands queued behind the one that ended the loop fail too, instead of being
        // dropped (which their waiters would also see, but less precisely).
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Request { reply, .. } => {
                    let _ = reply.send(Err(info.to_error()));
                }
                Command::Approve { reply, .. } => {
                    let _ = reply.send(Err(info.to_error()));
                }
                Command::Shutdown { reply, .. } => {
                    let _ = reply.send(info.clone());
                }
                Command::Notify { .. } => {}
            }
        }
        let last = HarnessEvent::ProcessExited {
            code: info.code,
            signal: info.signal,
            stderr_tail: info.stderr_tail.clone(),
        };
        // The caller of `shutdown` is answered first: a consumer that stopped draining
        // events must not keep it waiting.
        if let Some(reply) = shutdown_reply {
            let _ = reply.send(info);
        }
        self.emit(last).await;
    }

    async fn finish(&mut self, status: std::io::Result<ExitStatus>) -> ExitInfo {
        match status {
            Ok(status) => self.process.finish(status).await,
            Err(err) => {
                tracing::warn!(%err, "codex: waiting for the child failed; terminating it");
                self.process.terminate(self.default_grace).await
            }
        }
    }

    /// Reads stdout (handling lines as usual) until the child exits or `limit` passes.
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
                    self.drain_stdout(STDOUT_DRAIN).await;
                    return Some(status);
                }
                _ = &mut deadline => return None,
            }
        }
    }

    /// Handles the lines still buffered in the pipe after the child exited.
    async fn drain_stdout(&mut self, limit: Duration) {
        let drain = async {
            loop {
                match self.stdout.read_line().await {
                    Ok(false) | Err(_) => break,
                    Ok(true) => self.take_line().await,
                }
            }
        };
        // A grandchild holding the pipe open must not stall the exit report.
        let _ = tokio::time::timeout(limit, drain).await;
    }

    /// Handles the line just read.
    async fn take_line(&mut self) {
        // Borrowed unless the line is not valid UTF-8: no copy per line.
        let actions = self
            .translator
            .handle_line(&String::from_utf8_lossy(self.stdout.line()));
        for action in actions {
            match action {
                Action::Event(event) => self.emit(event).await,
                Action::Response { id, result } => self.resolve(id, result),
                Action::Send(message) => {
                    if let Err(err) = self.write(&message).await {
                        tracing::warn!(%err, "codex: could not answer a server request");
                    }
                }
            }
        }
    }

    fn resolve(&mut self, id: RequestId, result: Result<Value, wire::ErrorObject>) {
        let pending = match &id {
            RequestId::Integer(n) => self.pending.remove(n),
            RequestId::String(_) => None,
        };
        let Some(pending) = pending else {
            // Its waiter timed out and moved on, or Codex answered something we never sent.
            tracing::debug!(%id, "codex: response to no pending request");
            return;
        };
        let result = result.map_err(|e| HarnessError::Rpc {
            code: e.code,
            message: e.message,
        });
        if let Err(err) = &result {
            tracing::debug!(method = pending.method, %err, "codex: request refused");
        }
        let _ = pending.reply.send(result);
    }

    async fn command(&mut self, command: Command) {
        match command {
            Command::Request {
                method,
                params,
                reply,
            } => {
                if reply.is_closed() {
                    return;
                }
                let id = self.next_id;
                self.next_id += 1;
                let message = Message::Request(wire::Request {
                    id: RequestId::Integer(id),
                    method: method.to_string(),
                    params: Some(params),
                });
                // Parked even if the write fails: a broken stdin ends the session, and
                // the waiter then gets the exit (code, signal, stderr) rather than EPIPE.
                let _ = self.write(&message).await;
                self.pending.insert(id, Pending { method, reply });
            }
            Command::Notify { method } => {
                let message = Message::Notification(wire::Notification {
                    method: method.to_string(),
                    params: None,
                });
                if let Err(err) = self.write(&message).await {
                    tracing::warn!(%err, method, "codex: notification not sent");
                }
            }
            Command::Approve {
                request_id,
                decision,
                reply,
            } => {
                let Some(id) = self.translator.take_server_request(&request_id) else {
                    let _ = reply.send(Err(HarnessError::UnknownRequest { request_id }));
                    return;
                };
                let result =
                    serde_json::to_value(ApprovalResponse { decision }).map_err(HarnessError::from);
                let result = match result {
                    Ok(result) => {
                        self.write(&Message::Response(wire::Response { id, result }))
                            .await
                    }
                    Err(err) => Err(err),
                };
                let _ = reply.send(result);
            }
            // Handled by the main loop, which ends on it.
            Command::Shutdown { .. } => {}
        }
    }

    async fn write(&mut self, message: &Message) -> Result<(), HarnessError> {
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
            tracing::warn!(%err, "codex: writing to stdin failed; ending the session");
            self.stdin_broken = true;
            return Err(err.into());
        }
        Ok(())
    }

    async fn emit(&mut self, event: HarnessEvent) {
        if !self.events_open {
            return;
        }
        // Awaiting here is the backpressure: a slow consumer slows reading of stdout,
        // never loses an event.
        if self.events.send(event).await.is_err() {
            tracing::debug!("codex: event receiver dropped; events discarded from now on");
            self.events_open = false;
        }
    }
}
