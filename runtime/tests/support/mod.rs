//! A scripted in-memory harness behind the seam, and what the worker tests share.
//!
//! [`scripted`] gives a [`Launcher`] to register in the runtime and the [`Script`] that
//! drives it: every call the worker makes through the seam (spawn, open, fork, start a turn,
//! steer, interrupt, answer an approval, shut down) arrives at the test as a [`Call`],
//! in order, and waits for the test's answer; the test sends the harness's events on the
//! sender it got with the spawn. Nothing runs on a timer of its own, so the tests run on
//! paused time and wait for calls and reports, never for time to pass.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use relay_harnesses::seam::{
    BoxFuture, Capabilities, Endpoint, HarnessInfo, HarnessSession, Launcher, OpenedSession,
    Spawned,
};
use relay_harnesses::{HarnessError, Harnesses, RelayAccess};
use relay_protocol::domain::{
    AgentSpec, AgentState, ApprovalDecision, FlightChange, FlightState, ForkSpec, Harness,
};
use relay_protocol::harness::HarnessEvent;
use relay_protocol::runtime::{Control, Report};
use relay_runtime::{Runtime, RuntimeConfig, RuntimeError};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod dispatch;
pub mod drive;
pub mod repo;
pub use dispatch::dispatch;

/// The answer a call waits for.
pub type Reply<T> = oneshot::Sender<Result<T, HarnessError>>;

/// One call through the seam, as the test sees it.
#[derive(Debug)]
pub enum Call {
    /// Answer `Ok` to hand the worker a session whose events come from `events`.
    Spawn {
        agent: Box<AgentSpec>,
        events: mpsc::Sender<HarnessEvent>,
        reply: Reply<()>,
    },
    Open {
        stored: Option<String>,
        reply: Reply<OpenedSession>,
    },
    Fork {
        from: Box<ForkSpec>,
        reply: Reply<OpenedSession>,
    },
    StartTurn {
        conversation: String,
        text: String,
        relay_turn_id: String,
        reply: Reply<String>,
    },
    Steer {
        conversation: String,
        turn_id: String,
        text: String,
        reply: Reply<()>,
    },
    Interrupt {
        conversation: String,
        turn_id: String,
        reply: Reply<()>,
    },
    Approve {
        request_id: String,
        decision: ApprovalDecision,
        reply: Reply<()>,
    },
    /// Answered `Ok` by the fake itself.
    Shutdown,
}

/// The program name in the fake's messages.
pub const PROGRAM: &str = "fake-cli";
/// The pid of every fake session with a process endpoint.
pub const PID: u32 = 4242;

pub struct Scripted {
    info: HarnessInfo,
    endpoint: Endpoint,
    calls: mpsc::UnboundedSender<Call>,
    /// When set, a session's shutdown returns only once this is notified.
    hold_shutdown: Option<Arc<tokio::sync::Notify>>,
}

/// A fake harness registered as `harness`, able to do what `capabilities` say, reached
/// at `endpoint`.
pub fn scripted(
    harness: Harness,
    capabilities: Capabilities,
    endpoint: Endpoint,
) -> (Arc<Scripted>, Script) {
    let (calls, rx) = mpsc::unbounded_channel();
    let launcher = Scripted {
        info: HarnessInfo {
            harness,
            name: "fake",
            program: PROGRAM,
            capabilities,
            screen: false,
        },
        endpoint,
        calls,
        hold_shutdown: None,
    };
    (Arc::new(launcher), Script { calls: rx })
}

/// [`full`], whose sessions' shutdowns (after their [`Call::Shutdown`]) last until the
/// test notifies the `Notify` returned: a harness slow to stop.
pub fn full_slow_to_stop() -> (Arc<Scripted>, Script, Arc<tokio::sync::Notify>) {
    let (launcher, script) = full();
    let gate = Arc::new(tokio::sync::Notify::new());
    let mut launcher = Arc::into_inner(launcher).unwrap();
    launcher.hold_shutdown = Some(gate.clone());
    (Arc::new(launcher), script, gate)
}

/// The fake most tests use: every capability, a process endpoint, registered for
/// Claude Code (any harness but Codex shows the worker is not Codex-only).
pub fn full() -> (Arc<Scripted>, Script) {
    scripted(
        Harness::ClaudeStreamJson,
        Capabilities::ALL,
        Endpoint::Process { pid: PID },
    )
}

/// Sends a call and waits for the test's answer.
async fn ask<T>(
    calls: &mpsc::UnboundedSender<Call>,
    call: impl FnOnce(Reply<T>) -> Call,
) -> Result<T, HarnessError> {
    let (reply, answer) = oneshot::channel();
    calls
        .send(call(reply))
        .map_err(|_| HarnessError::ChannelClosed)?;
    answer.await.map_err(|_| HarnessError::ChannelClosed)?
}

impl Launcher for Scripted {
    fn info(&self) -> HarnessInfo {
        self.info
    }

    fn spawn<'a>(
        &'a self,
        agent: &'a AgentSpec,
        _relay: Option<&'a RelayAccess>,
    ) -> BoxFuture<'a, Result<Spawned, HarnessError>> {
        Box::pin(async move {
            let (events, rx) = mpsc::channel(64);
            ask(&self.calls, |reply| Call::Spawn {
                agent: Box::new(agent.clone()),
                events,
                reply,
            })
            .await?;
            Ok(Spawned {
                session: Arc::new(ScriptedSession {
                    endpoint: self.endpoint.clone(),
                    calls: self.calls.clone(),
                    hold_shutdown: self.hold_shutdown.clone(),
                }),
                events: rx,
            })
        })
    }
}

struct ScriptedSession {
    endpoint: Endpoint,
    calls: mpsc::UnboundedSender<Call>,
    hold_shutdown: Option<Arc<tokio::sync::Notify>>,
}

impl HarnessSession for ScriptedSession {
    fn open<'a>(
        &'a self,
        stored: Option<&'a str>,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        let stored = stored.map(str::to_string);
        Box::pin(ask(&self.calls, |reply| Call::Open { stored, reply }))
    }

    fn fork<'a>(
        &'a self,
        from: &'a ForkSpec,
    ) -> BoxFuture<'a, Result<OpenedSession, HarnessError>> {
        let from = Box::new(from.clone());
        Box::pin(ask(&self.calls, |reply| Call::Fork { from, reply }))
    }

    fn start_turn<'a>(
        &'a self,
        conversation: &'a str,
        text: &'a str,
        relay_turn_id: &'a str,
    ) -> BoxFuture<'a, Result<String, HarnessError>> {
        Box::pin(ask(&self.calls, |reply| Call::StartTurn {
            conversation: conversation.into(),
            text: text.into(),
            relay_turn_id: relay_turn_id.into(),
            reply,
        }))
    }

    fn steer<'a>(
        &'a self,
        conversation: &'a str,
        turn_id: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(ask(&self.calls, |reply| Call::Steer {
            conversation: conversation.into(),
            turn_id: turn_id.into(),
            text: text.into(),
            reply,
        }))
    }

    fn interrupt<'a>(
        &'a self,
        conversation: &'a str,
        turn_id: &'a str,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(ask(&self.calls, |reply| Call::Interrupt {
            conversation: conversation.into(),
            turn_id: turn_id.into(),
            reply,
        }))
    }

    fn respond_approval<'a>(
        &'a self,
        request_id: &'a str,
        decision: ApprovalDecision,
    ) -> BoxFuture<'a, Result<(), HarnessError>> {
        Box::pin(ask(&self.calls, move |reply| Call::Approve {
            request_id: request_id.into(),
            decision,
            reply,
        }))
    }

    fn endpoint(&self) -> Endpoint {
        self.endpoint.clone()
    }

    fn stderr_tail(&self) -> String {
        String::new()
    }

    fn shutdown(&self) -> BoxFuture<'_, Result<(), HarnessError>> {
        let _ = self.calls.send(Call::Shutdown);
        let hold = self.hold_shutdown.clone();
        Box::pin(async move {
            if let Some(hold) = hold {
                hold.notified().await;
            }
            Ok(())
        })
    }
}

/// The test's side of a [`scripted`] harness.
pub struct Script {
    calls: mpsc::UnboundedReceiver<Call>,
}

/// Takes the next call, which must match `$pat`, and gives `$out`.
#[macro_export]
macro_rules! expect_call {
    ($script:expr, $pat:pat => $out:expr) => {
        match $script.next().await {
            $pat => $out,
            other => panic!("expected {}, got {other:?}", stringify!($pat)),
        }
    };
}

impl Script {
    pub async fn next(&mut self) -> Call {
        self.calls.recv().await.expect("the harness is gone")
    }

    /// Whether no call waits (the worker made none since the last one taken).
    pub fn quiet(&mut self) -> bool {
        self.calls.try_recv().is_err()
    }

    /// Answers the next call, a spawn, with a session, and its open with `conversation`
    /// after checking the stored id it was asked to resume. The events' sender.
    pub async fn session_up(
        &mut self,
        stored: Option<&str>,
        conversation: &str,
    ) -> mpsc::Sender<HarnessEvent> {
        let events = expect_call!(self, Call::Spawn { events, reply, .. } => {
            reply.send(Ok(())).unwrap();
            events
        });
        expect_call!(self, Call::Open { stored: asked, reply } => {
            assert_eq!(asked.as_deref(), stored);
            reply
                .send(Ok(OpenedSession {
                    id: conversation.into(),
                    lost: None,
                }))
                .unwrap();
        });
        events
    }

    /// Answers the next call, a turn start, with `turn_id`; the task it was given.
    pub async fn turn_started(&mut self, turn_id: &str) -> String {
        expect_call!(self, Call::StartTurn { text, reply, .. } => {
            reply.send(Ok(turn_id.into())).unwrap();
            text
        })
    }
}

/// The reports of a runtime, as they come.
pub struct Reports(mpsc::Receiver<Report>);

impl Reports {
    pub async fn next(&mut self) -> Report {
        self.0.recv().await.expect("the runtime stopped reporting")
    }

    pub async fn take(&mut self, n: usize) -> Vec<Report> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.next().await);
        }
        out
    }

    /// Whether no report waits.
    pub fn quiet(&mut self) -> bool {
        self.0.try_recv().is_err()
    }
}

/// A runtime driving agents through `launcher` only, on a fresh data dir (kept by the
/// returned guard). No idle limit unless given.
pub fn runtime(
    launcher: Arc<Scripted>,
    idle: Option<std::time::Duration>,
) -> (tempfile::TempDir, Runtime, Reports, CancellationToken) {
    runtime_stalling(launcher, idle, None)
}

/// [`runtime`] with a stall limit too (`RuntimeConfig::turn_stall_timeout`).
pub fn runtime_stalling(
    launcher: Arc<Scripted>,
    idle: Option<std::time::Duration>,
    stall: Option<std::time::Duration>,
) -> (tempfile::TempDir, Runtime, Reports, CancellationToken) {
    runtime_watched(launcher, idle, stall, None)
}

/// [`runtime`] with a stall limit and a quiet note (`RuntimeConfig::turn_quiet_note`).
pub fn runtime_watched(
    launcher: Arc<Scripted>,
    idle: Option<std::time::Duration>,
    stall: Option<std::time::Duration>,
    quiet: Option<std::time::Duration>,
) -> (tempfile::TempDir, Runtime, Reports, CancellationToken) {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, reports, stop) = start(dir.path(), None, launcher, idle, stall, quiet);
    (dir, runtime, reports, stop)
}

/// A runtime on `dir`, keeping its records in `shared` if given.
pub fn runtime_in(
    dir: &std::path::Path,
    shared: Option<relay_infra::storage::Durable>,
    launcher: Arc<Scripted>,
    idle: Option<std::time::Duration>,
) -> (Runtime, Reports, CancellationToken) {
    start(dir, shared, launcher, idle, None, None)
}

fn start(
    dir: &std::path::Path,
    shared: Option<relay_infra::storage::Durable>,
    launcher: Arc<Scripted>,
    idle: Option<std::time::Duration>,
    stall: Option<std::time::Duration>,
    quiet: Option<std::time::Duration>,
) -> (Runtime, Reports, CancellationToken) {
    let stop = CancellationToken::new();
    let (runtime, reports) = Runtime::start_with(
        RuntimeConfig {
            data_dir: dir.to_path_buf(),
            shared_db: shared,
            node: None,
            turn_idle_timeout: idle,
            turn_stall_timeout: stall,
            turn_quiet_note: quiet,
            access: None,
            texts: None,
        },
        Harnesses::default().with(launcher),
        stop.clone(),
    )
    .unwrap();
    (runtime, Reports(reports), stop)
}

pub fn flight(flight: &str, change: FlightChange) -> Report {
    Report::Flight {
        flight: flight.into(),
        change,
    }
}

pub fn state(f: &str, to: FlightState, reason: Option<&str>) -> Report {
    flight(
        f,
        FlightChange::State {
            to,
            reason: reason.map(str::to_string),
            output: None,
        },
    )
}

pub fn agent(state: AgentState) -> Report {
    Report::Agent {
        worktree: None,
        agent: "a1".into(),
        state: Some(state),
        thread_id: None,
        endpoint: None,
        reason: None,
        program: None,
    }
}

/// The agent reported `state` because of `reason`.
pub fn agent_because(state: AgentState, reason: &str) -> Report {
    Report::Agent {
        worktree: None,
        agent: "a1".into(),
        state: Some(state),
        thread_id: None,
        endpoint: None,
        reason: Some(reason.into()),
        program: None,
    }
}

/// The reports of a session coming up with `conversation` on `harness` at `endpoint`.
pub fn came_up(harness: Harness, conversation: &str, endpoint: &Endpoint) -> Vec<Report> {
    vec![
        agent(AgentState::Starting),
        Report::Agent {
            worktree: None,
            agent: "a1".into(),
            state: Some(AgentState::Idle),
            thread_id: Some(conversation.into()),
            endpoint: Some(relay_protocol::domain::Endpoint {
                transport: harness,
                node: None,
                session_id: Some(conversation.into()),
                pid: endpoint.pid(),
                pane: endpoint.pane().map(str::to_string),
            }),
            reason: None,
            program: None,
        },
    ]
}

/// The reports of a turn starting: the flight's session, running. (The agent is not
/// reported busy: the broker derives it from the flight.)
pub fn turn_began(f: &str, conversation: &str, turn_id: &str) -> Vec<Report> {
    vec![
        flight(
            f,
            FlightChange::Session {
                thread_id: Some(conversation.into()),
                turn_id: Some(turn_id.into()),
            },
        ),
        state(f, FlightState::Running, None),
    ]
}

pub fn completed(f: &str, output: &str) -> Report {
    flight(
        f,
        FlightChange::State {
            to: FlightState::Completed,
            reason: None,
            output: Some(output.into()),
        },
    )
}

/// A runtime on the [`full`] fake whose agent `a1` runs flight `f1`'s turn `t1` in
/// conversation `c1`; the reports of getting there are checked and taken.
pub struct Running {
    pub dir: tempfile::TempDir,
    pub runtime: Runtime,
    pub script: Script,
    pub reports: Reports,
    pub events: mpsc::Sender<HarnessEvent>,
    pub stop: CancellationToken,
}

pub async fn running(task: &str, idle: Option<std::time::Duration>) -> Running {
    running_stalling(task, idle, None).await
}

/// [`running`] on a runtime with a stall limit too.
pub async fn running_stalling(
    task: &str,
    idle: Option<std::time::Duration>,
    stall: Option<std::time::Duration>,
) -> Running {
    running_watched(task, idle, stall, None).await
}

/// [`running`] on a runtime with a stall limit and a quiet note.
pub async fn running_watched(
    task: &str,
    idle: Option<std::time::Duration>,
    stall: Option<std::time::Duration>,
    quiet: Option<std::time::Duration>,
) -> Running {
    let (launcher, mut script) = full();
    let (dir, runtime, mut reports, stop) = runtime_watched(launcher, idle, stall, quiet);
    runtime
        .dispatch(dispatch(Harness::ClaudeStreamJson, "f1", task))
        .await
        .unwrap();
    let events = script.session_up(None, "c1").await;
    assert_eq!(script.turn_started("t1").await, task);
    let mut want = vec![state("f1", FlightState::Waking, None)];
    want.extend(came_up(
        Harness::ClaudeStreamJson,
        "c1",
        &Endpoint::Process { pid: PID },
    ));
    want.extend(turn_began("f1", "c1", "t1"));
    assert_eq!(reports.take(want.len()).await, want);
    Running {
        dir,
        runtime,
        script,
        reports,
        events,
        stop,
    }
}

/// Sends `control` from a task of its own: it returns only once the harness has
/// taken it, which the test is the one to answer.
pub fn control_soon(runtime: &Runtime, control: Control) -> JoinHandle<Result<(), RuntimeError>> {
    let runtime = runtime.clone();
    tokio::spawn(async move { runtime.control(control).await })
}
