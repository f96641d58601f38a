//! The link between the broker and a runtime (the harness-session plane).
//!
//! - Dispatch: new invocations of agents served here are read from the gap-free event
//!   feed and handed to the runtime. At start, flights left by the previous process are
//!   settled first: `queued` ones are dispatched again; ones that were mid-turn are
//!   failed with a reason (their harness process died with the broker).
//! - Reports: everything the runtime reports becomes a broker command, enqueued in the
//!   order it arrived. The replies are awaited by a separate drain task, so a stream of
//!   deltas costs one group commit per batch, not one flush per delta.
//! - Approvals: a requested approval is persisted; the agent's policy may decide it at
//!   once (recorded as `policy:...`), otherwise a person does through the API.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use relay_protocol::bus::subjects;
use relay_protocol::domain::{Agent, Approval, Flight, FlightChange, FlightState};
use relay_protocol::event::EventBody;
use relay_protocol::runtime::{Control, Dispatch, Report};
use relay_runtime::retry::{self, Retryable};
use relay_runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::broker::{Broker, Command, Outcome};
use crate::error::{runtime_error, BrokerError};
use crate::ports::FlightControl;
use crate::seal::BusKey;
use crate::store::T;

/// Dispatches for other nodes waiting to be sent.
const REMOTE_DISPATCHES: usize = 4096;
/// Replies waiting to be checked by the drain task.
const PENDING_REPLIES: usize = 8192;
/// Waits between tries to open the node report stream.
const REPORTS_BACKOFF: retry::ExponentialBuilder = retry::forever(
    std::time::Duration::from_millis(200),
    std::time::Duration::from_secs(10),
);

type Reply = oneshot::Receiver<Result<Outcome, BrokerError>>;

enum Pending {
    /// Log a failure; nothing else depends on it.
    Check(Reply, &'static str),
    /// An approval was recorded: apply the agent's policy to it.
    Approval(Reply),
}

/// Connects a broker to its embedded runtime.
#[derive(Clone)]
pub struct Plane {
    broker: Broker,
    runtime: Runtime,
    /// Set once NATS is connected: how agents of other nodes are reached.
    nats: Arc<tokio::sync::OnceCell<(async_nats::Client, BusKey)>>,
    /// Dispatches for other nodes, sent one after another in commit order.
    remote: Arc<tokio::sync::OnceCell<mpsc::Sender<(String, Dispatch)>>>,
    /// NATS is configured (if not yet reached): remote flights wait for it.
    nats_expected: Arc<std::sync::atomic::AtomicBool>,
}

impl Plane {
    /// Settles flights left by a previous process, then starts dispatching and consuming
    /// reports. The returned task ends when the runtime's report channel closes.
    pub async fn start(
        broker: Broker,
        runtime: Runtime,
        reports: mpsc::Receiver<Report>,
    ) -> Result<(Plane, JoinHandle<()>), BrokerError> {
        let plane = Plane {
            broker,
            runtime,
            nats: Arc::new(tokio::sync::OnceCell::new()),
            remote: Arc::new(tokio::sync::OnceCell::new()),
            nats_expected: Arc::default(),
        };
        let from_seq = plane.broker.last_seq();
        // Reports must flow before recovery dispatches anything, or a full report
        // channel would block recovery (and the start) for good.
        let (pending_tx, pending_rx) = mpsc::channel(PENDING_REPLIES);
        let drain = tokio::spawn(plane.clone().drain(pending_rx));
        let consume = tokio::spawn(plane.clone().consume(reports, pending_tx));
        plane.recover().await?;
        tokio::spawn(plane.clone().dispatch_new(from_seq));
        let task = tokio::spawn(async move {
            let _ = consume.await;
            let _ = drain.await;
        });
        Ok((plane, task))
    }

    /// NATS is configured: until it is attached, flights of remote agents stay queued
    /// (and are sent once it is) instead of failing.
    pub fn expect_nats(&self) {
        self.nats_expected
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Connects the plane to NATS: agents of other nodes become reachable. Dispatches
    /// queued for them before this (at start) are sent now.
    pub async fn attach_nats(&self, client: async_nats::Client, key: BusKey) -> anyhow::Result<()> {
        let js = async_nats::jetstream::new(client.clone());
        crate::node::ensure_streams(&js).await?;
        if self.nats.get().is_some() {
            // Attached already (a retried bring-up): one dispatcher, one report reader.
            return Ok(());
        }
        let (remote, mut outbox) = mpsc::channel::<(String, Dispatch)>(REMOTE_DISPATCHES);
        let sender = js.clone();
        let sealing = key.clone();
        tokio::spawn(async move {
            // One at a time, so two invocations of an agent reach its node in order.
            let never = tokio_util::sync::CancellationToken::new();
            while let Some((node, d)) = outbox.recv().await {
                if let Err(e) =
                    crate::node::send_dispatch(&sender, &sealing, &node, &d, &never).await
                {
                    tracing::warn!(flight = %d.flight.id, error = %e, "dispatch to node failed");
                }
            }
        });
        let _ = self.remote.set(remote);
        let _ = self.nats.set((client, key.clone()));
        tokio::spawn(self.clone().consume_node_reports(js, key));
        // Flights of remote agents still queued (made while NATS was not attached, or
        // before a restart): send them; JetStream and the node drop duplicates.
        let queued = self
            .broker
            .store()
            .read(|store| {
                let mut out = Vec::new();
                for f in store
                    .live_flights()?
                    .into_iter()
                    .filter(|f| f.state == FlightState::Queued)
                {
                    if let (Some(agent), Some(inv)) =
                        (store.agent(&f.agent)?, store.invocation(&f.invocation)?)
                    {
                        out.push((f, agent, inv));
                    }
                }
                Ok(out)
            })
            .await?;
        for (f, agent, inv) in queued {
            if !self.local(&agent) {
                self.dispatch(agent, inv, f).await;
            }
        }
        Ok(())
    }

    /// Reports of remote nodes, from JetStream: each is acknowledged once committed.
    ///
    /// A report is applied at most once: the broker keeps, per node, the stream seq of
    /// the last report it applied, in the same transaction, and skips any report at or
    /// below it. That is only right if reports are applied in stream order, so: the
    /// consumer is created anew at every start (delivery then begins at the oldest report
    /// not acknowledged, in order, instead of redelivering old ones after newer ones), and
    /// a report that cannot be submitted is retried in place, never left for redelivery.
    async fn consume_node_reports(self, js: async_nats::jetstream::Context, key: BusKey) {
        let attempt = || report_messages(&js);
        // Tried for ever: no error comes out.
        let Ok(mut messages) = attempt
            .retry(REPORTS_BACKOFF)
            .notify(|e, wait| {
                tracing::error!(error = %e, retry_in = ?wait, "cannot read node reports yet");
            })
            .await
        else {
            return;
        };
        let (acks, mut acks_rx) =
            mpsc::channel::<(Pending, async_nats::jetstream::Message)>(PENDING_REPLIES);
        let this = self.clone();
        tokio::spawn(async move {
            while let Some((pending, msg)) = acks_rx.recv().await {
                this.settle_pending(pending).await;
                if let Err(e) = msg.ack().await {
                    tracing::warn!(error = %e, "report ack failed");
                }
            }
        });
        while let Some(item) = futures::StreamExt::next(&mut messages).await {
            let msg = match item {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "node report stream");
                    continue;
                }
            };
            let node = subjects::report_node(msg.subject.as_str())
                .unwrap_or("")
                .to_string();
            // Only the node itself holds the key its reports are sealed with.
            let report: Report = match key
                .node(&node)
                .open(msg.subject.as_str(), &msg.payload)
                .map_err(|e| e.to_string())
                .and_then(|plain| serde_json::from_slice(&plain).map_err(|e| e.to_string()))
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(subject = %msg.subject, "node report dropped: {e}");
                    let _ = msg.ack().await;
                    continue;
                }
            };
            let source = match msg.info() {
                Ok(info) => Some((node, info.stream_sequence)),
                Err(e) => {
                    tracing::warn!(error = %e, "node report without stream info");
                    None
                }
            };
            let pending = loop {
                match self
                    .submit_report_from(report.clone(), source.clone())
                    .await
                {
                    Ok(p) => break Some(p),
                    Err(BrokerError::ShuttingDown) => break None,
                    Err(e) => {
                        tracing::warn!(error = %e, "node report not recorded; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            };
            let Some(pending) = pending else { return };
            if acks.send((pending, msg)).await.is_err() {
                return;
            }
        }
    }

    fn local(&self, agent: &Agent) -> bool {
        agent.spec.node.as_deref() == self.runtime.node()
    }

    async fn recover(&self) -> Result<(), BrokerError> {
        let (live, agents) = self
            .broker
            .store()
            .read(|store| {
                let mut live = Vec::new();
                for f in store.live_flights()? {
                    let agent = store.agent(&f.agent)?;
                    let invocation = store.invocation(&f.invocation)?;
                    live.push((f, agent, invocation));
                }
                let agents: Vec<Agent> = store.values(T::Agents)?;
                Ok((live, agents))
            })
            .await?;
        for (f, agent, invocation) in live {
            let Some(agent) = agent else {
                self.settle(&f.id, FlightState::Failed, "its agent was removed")
                    .await;
                continue;
            };
            if !self.local(&agent) {
                continue;
            }
            // Queued, but its turn may have started just before the stop: the runtime
            // records a start on disk before the harness sees the task, and such a task
            // is not run twice.
            let started = f.state == FlightState::Queued
                && matches!(
                    self.runtime.threads().dispatch_state(&f.invocation).await,
                    Ok(Some(_))
                );
            if f.state == FlightState::Queued && !started {
                if let Some(inv) = invocation {
                    self.dispatch(agent, inv, f).await;
                }
            } else {
                let _ = self
                    .broker
                    .execute_internal(Command::ExpireApprovals {
                        flight: f.id.clone(),
                        by: "relay:restart".into(),
                        request: None,
                    })
                    .await;
                let reason = if started {
                    "relay stopped just as this flight's turn started, so it may have partly run; \
                     it is not run twice: the agent's thread is kept, ask again to continue"
                        .to_string()
                } else {
                    format!(
                        "relay stopped while this flight was {} (its harness process ended with it); \
                         the agent's thread is kept, ask again to continue",
                        f.state
                    )
                };
                self.settle(&f.id, FlightState::Failed, &reason).await;
            }
        }
        for a in agents.iter().filter(|a| self.local(a)) {
            // Whatever the agent was doing, its session died with the previous process.
            if a.state != relay_protocol::domain::AgentState::Offline || a.endpoint.is_some() {
                let r = self
                    .broker
                    .execute_internal(Command::UpdateAgent {
                        name: a.spec.name.clone(),
                        state: Some(relay_protocol::domain::AgentState::Offline),
                        thread_id: None,
                        endpoint: Some(None),
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(agent = %a.spec.name, error = %e, "cannot reset the agent's state");
                }
            }
            if a.spec.wake == relay_protocol::domain::WakePolicy::KeepWarm {
                if let Err(e) = self.runtime.warm(&self.with_secrets(a.clone()).await) {
                    tracing::warn!(agent = %a.spec.name, error = %e, "cannot warm");
                }
            }
        }
        Ok(())
    }

    async fn settle(&self, flight: &str, to: FlightState, reason: &str) {
        let r = self
            .broker
            .execute_internal(Command::UpdateFlight {
                flight: flight.into(),
                change: FlightChange::State {
                    to,
                    reason: Some(reason.into()),
                    output: None,
                },
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(%flight, error = %e, "cannot settle flight");
        }
    }

    /// The agent with its secret variables filled in, for the runtime that starts it
    /// (the one place they leave the broker's store; to a node, only sealed).
    async fn with_secrets(&self, mut agent: Agent) -> Agent {
        use relay_protocol::domain::{Secrets, SECRET_SHOWN};
        if !agent.spec.env.values().any(|v| v == SECRET_SHOWN) {
            return agent;
        }
        let name = agent.spec.name.clone();
        let read = self
            .broker
            .store()
            .read(move |store| {
                store.get::<std::collections::BTreeMap<String, String>>(
                    crate::store::T::Secrets,
                    name.as_bytes(),
                )
            })
            .await;
        match read {
            Ok(Some(secrets)) => agent.spec.secrets = Secrets(secrets),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(agent = %agent.spec.name, error = %e, "cannot read the agent's secrets")
            }
        }
        agent
    }

    async fn dispatch(
        &self,
        agent: Agent,
        invocation: relay_protocol::domain::Invocation,
        flight: Flight,
    ) {
        let agent = self.with_secrets(agent).await;
        if let Some(node) = agent.spec.node.clone().filter(|_| !self.local(&agent)) {
            let Some(remote) = self.remote.get() else {
                // NATS attaches after recovery, or later when it was down; attach_nats
                // sends every queued remote flight then.
                tracing::debug!(flight = %flight.id, %node, "remote dispatch waits for NATS");
                return;
            };
            let d = Dispatch {
                agent,
                invocation,
                flight,
            };
            if remote.send((node, d)).await.is_err() {
                tracing::warn!("remote dispatcher stopped");
            }
            return;
        }
        let id = flight.id.clone();
        if let Err(e) = self
            .runtime
            .dispatch(Dispatch {
                agent,
                invocation,
                flight,
            })
            .await
        {
            tracing::warn!(flight = %id, error = %e, "dispatch refused");
        }
    }

    /// Dispatches every invocation committed after `from_seq` to a local agent.
    ///
    /// The agents are kept here, from one read of the store (taken after `from_seq`)
    /// and then the agent events of the feed, applied in order: an invocation finds its
    /// agent without a read of the store on the way to its turn.
    async fn dispatch_new(self, from_seq: u64) {
        let mut agents: HashMap<String, Agent> = match self
            .broker
            .store()
            .read(|s| s.values::<Agent>(T::Agents))
            .await
        {
            Ok(list) => list.into_iter().map(|a| (a.spec.name.clone(), a)).collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the agents; dispatch stopped");
                return;
            }
        };
        let mut feed = crate::feed::follow(self.broker.clone(), from_seq);
        while let Some(item) = feed.recv().await {
            let event = match item {
                Ok(e) => e,
                Err(e) => {
                    tracing::error!(error = %e, "event feed failed; dispatch stopped");
                    return;
                }
            };
            match &event.body {
                EventBody::AgentRegistered { agent } | EventBody::AgentUpdated { agent } => {
                    agents.insert(agent.spec.name.clone(), agent.clone());
                }
                EventBody::AgentRemoved { name, .. } => {
                    agents.remove(name);
                }
                _ => {}
            }
            match &event.body {
                EventBody::InvocationCreated { invocation, flight } => {
                    let Some(agent) = agents.get(&invocation.target).cloned() else {
                        continue;
                    };
                    if self.local(&agent) {
                        self.dispatch(agent, invocation.clone(), flight.clone())
                            .await;
                    } else if self.nats.get().is_none()
                        && !self
                            .nats_expected
                            .load(std::sync::atomic::Ordering::Relaxed)
                    {
                        self.settle(
                            &flight.id,
                            FlightState::Failed,
                            &format!(
                                "agent {} is served by node {:?}, but this broker has no NATS connection (start relay up with --nats)",
                                agent.spec.name,
                                agent.spec.node.as_deref().unwrap_or("")
                            ),
                        )
                        .await;
                    } else {
                        // Queued for the remote dispatcher, in order; it waits for NATS
                        // on its own, never holding up local agents.
                        self.dispatch(agent, invocation.clone(), flight.clone())
                            .await;
                    }
                }
                EventBody::AgentRemoved { name, node } => {
                    // Stopping its session may take a while: dispatch goes on meanwhile.
                    let control = self.route_to(
                        node.clone()
                            .filter(|n| Some(n.as_str()) != self.runtime.node()),
                        Control::AgentRemoved {
                            agent: name.clone(),
                        },
                    );
                    tokio::spawn(async move {
                        if let Err(e) = control.await {
                            tracing::debug!(error = %e, "agent removal not delivered");
                        }
                    });
                }
                EventBody::AgentRegistered { agent }
                    if agent.spec.wake == relay_protocol::domain::WakePolicy::KeepWarm =>
                {
                    if let Err(e) = self.wake(agent.clone()).await {
                        tracing::warn!(agent = %agent.spec.name, error = %e, "cannot warm");
                    }
                }
                _ => {}
            }
        }
    }

    async fn consume(self, mut reports: mpsc::Receiver<Report>, pending: mpsc::Sender<Pending>) {
        while let Some(report) = reports.recv().await {
            match self.submit_report(report).await {
                Ok(p) => {
                    let _ = pending.send(p).await;
                }
                Err(e) => tracing::warn!(error = %e, "report not recorded"),
            }
        }
    }

    /// Enqueues the command a report stands for, in arrival order; the returned pending
    /// reply says when it committed.
    async fn submit_report(&self, report: Report) -> Result<Pending, BrokerError> {
        self.submit_report_from(report, None).await
    }

    /// `source` (node, stream seq) makes the command apply at most once.
    async fn submit_report_from(
        &self,
        report: Report,
        source: Option<(String, u64)>,
    ) -> Result<Pending, BrokerError> {
        let wrap = |command: Command| match &source {
            Some((node, seq)) => Command::FromNode {
                node: node.clone(),
                stream_seq: *seq,
                command: Box::new(command),
            },
            None => command,
        };
        let (command, kind) = match report {
            Report::Flight { flight, change } => {
                (Command::UpdateFlight { flight, change }, "flight update")
            }
            Report::Agent {
                agent,
                state,
                thread_id,
                endpoint,
            } => (
                Command::UpdateAgent {
                    name: agent,
                    state,
                    thread_id,
                    endpoint: endpoint.map(Some),
                },
                "agent update",
            ),
            Report::ThreadLost {
                agent,
                old_thread_id,
                new_thread_id,
                reason,
            } => (
                Command::ThreadLost {
                    agent,
                    old_thread_id,
                    new_thread_id,
                    reason,
                },
                "thread lost",
            ),
            Report::ApprovalRequested { agent, request } => {
                let rx = self
                    .broker
                    .submit(wrap(Command::RequestApproval { agent, request }))
                    .await?;
                return Ok(Pending::Approval(rx));
            }
            Report::ApprovalsExpired {
                flight,
                by,
                request,
            } => (
                Command::ExpireApprovals {
                    flight,
                    by: by.unwrap_or_else(|| "relay:turn-ended".into()),
                    request,
                },
                "expire approvals",
            ),
        };
        Ok(Pending::Check(
            self.broker.submit(wrap(command)).await?,
            kind,
        ))
    }

    async fn drain(self, mut pending: mpsc::Receiver<Pending>) {
        while let Some(p) = pending.recv().await {
            self.settle_pending(p).await;
        }
    }

    /// Waits for a submitted report's commit; applies the approval policy where due.
    async fn settle_pending(&self, p: Pending) {
        {
            match p {
                Pending::Check(rx, kind) => match rx.await {
                    Ok(Ok(_)) => {}
                    // A late event of a flight already settled (interrupted, failed at
                    // restart...) is expected; anything else is worth a warning.
                    Ok(Err(e @ BrokerError::FlightTerminal { .. })) => {
                        tracing::debug!(error = %e, "{kind} after the flight ended")
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "{kind} refused"),
                    Err(_) => tracing::debug!("broker stopped before {kind} was committed"),
                },
                Pending::Approval(rx) => {
                    if let Ok(Ok(Outcome::Approval(a))) = rx.await {
                        // Deciding may wait on a node; keep it off the ordered path.
                        let this = self.clone();
                        tokio::spawn(async move { this.apply_policy(a).await });
                    }
                }
            }
        }
    }

    async fn apply_policy(&self, approval: Approval) {
        let Ok(Some(agent)) = self.broker.agent(&approval.agent).await else {
            return;
        };
        let decision = crate::policy::decide(&agent.spec.approval_policy, &approval);
        let Some((decision, by)) = decision else {
            return;
        };
        let control = control(self);
        let decided = crate::ops::decide(
            &self.broker,
            Some(&control),
            &approval.id,
            decision,
            &by,
            true,
        )
        .await;
        if let Err(e) = decided {
            tracing::warn!(approval = %approval.id, error = %e, "policy decision not applied");
        }
    }
}

/// The broker's consumer of node reports, created anew (see `consume_node_reports`).
async fn report_messages(
    js: &async_nats::jetstream::Context,
) -> Result<async_nats::jetstream::consumer::pull::Stream, async_nats::Error> {
    use async_nats::jetstream::consumer;
    let stream = js.get_stream(subjects::REPORT_STREAM).await?;
    // Gone already is fine; any other failure would leave the old delivery order.
    if let Err(e) = stream.delete_consumer(REPORT_CONSUMER).await {
        let gone = matches!(
            e.kind(),
            async_nats::jetstream::stream::ConsumerErrorKind::JetStream(j)
                if j.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_NOT_FOUND
        );
        if !gone {
            return Err(e.into());
        }
    }
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(REPORT_CONSUMER.into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    Ok(consumer.messages().await?)
}

/// The durable consumer the broker reads node reports with.
const REPORT_CONSUMER: &str = "relay-broker";

impl Plane {
    /// Sends a control to the runtime that serves its agent: this one or a node's.
    fn route(&self, control: Control) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let agent = this.broker.agent(control.agent()).await?;
            let node = agent.filter(|a| !this.local(a)).and_then(|a| a.spec.node);
            this.route_to(node, control).await
        })
    }

    /// Sends a control to the runtime of `node` (`None`: this one).
    fn route_to(
        &self,
        node: Option<String>,
        control: Control,
    ) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            match node {
                Some(node) => {
                    let (client, key) = this.nats.get().cloned().ok_or_else(|| {
                        BrokerError::Unavailable(format!(
                            "node {node:?} is only reachable over NATS, and this broker has none"
                        ))
                    })?;
                    crate::node::send_control(&client, &key, &node, &control).await
                }
                None => this.runtime.control(control).await.map_err(runtime_error),
            }
        })
    }
}

impl Plane {
    /// Starts an agent's session now, in whichever runtime serves it.
    fn wake(&self, agent: Agent) -> BoxFuture<'static, Result<(), BrokerError>> {
        let this = self.clone();
        Box::pin(async move {
            let agent = this.with_secrets(agent).await;
            if this.local(&agent) {
                return this.runtime.warm(&agent).map_err(runtime_error);
            }
            this.route(Control::Wake {
                spec: Box::new(agent),
            })
            .await
        })
    }
}

impl FlightControl for Plane {
    fn wake(&self, agent: Agent) -> BoxFuture<'static, Result<(), BrokerError>> {
        Plane::wake(self, agent)
    }

    fn steer(&self, flight: Flight, text: String) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.route(Control::Steer {
            agent: flight.agent,
            flight: flight.id,
            text,
            // A task with the steers added to it obeys the message limit, like the task.
            max_task_bytes: Some(self.broker.config().max_message_bytes),
        })
    }

    fn interrupt(&self, flight: Flight) -> BoxFuture<'static, Result<(), BrokerError>> {
        self.route(Control::Interrupt {
            agent: flight.agent,
            flight: flight.id,
        })
    }

    fn approval_decided(&self, approval: Approval) -> BoxFuture<'static, Result<(), BrokerError>> {
        let Some(decision) = approval.decision else {
            return Box::pin(async { Ok(()) });
        };
        self.route(Control::Approval {
            agent: approval.agent,
            flight: approval.request.flight,
            harness_request_id: approval.request.harness_request_id,
            decision,
        })
    }
}

/// Shares a plane as the API's flight control.
pub fn control(plane: &Plane) -> Arc<dyn FlightControl> {
    Arc::new(plane.clone())
}
