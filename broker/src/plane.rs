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

use std::sync::Arc;

use futures::future::BoxFuture;
use relay_protocol::domain::{
    Agent, Approval, ApprovalDecision, ApprovalKind, Flight, FlightChange, FlightState,
};
use relay_protocol::event::EventBody;
use relay_protocol::runtime::{Control, Dispatch, Report};
use relay_runtime::{Runtime, RuntimeError};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::broker::{Broker, Command, Outcome};
use crate::error::BrokerError;
use crate::http::FlightControl;
use crate::store::T;

/// Replies waiting to be checked by the drain task.
const PENDING_REPLIES: usize = 8192;

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
    nats: Arc<tokio::sync::OnceCell<async_nats::Client>>,
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
        };
        let from_seq = plane.broker.last_seq();
        plane.recover().await?;
        let (pending_tx, pending_rx) = mpsc::channel(PENDING_REPLIES);
        let drain = tokio::spawn(plane.clone().drain(pending_rx));
        let consume = tokio::spawn(plane.clone().consume(reports, pending_tx));
        tokio::spawn(plane.clone().dispatch_new(from_seq));
        let task = tokio::spawn(async move {
            let _ = consume.await;
            let _ = drain.await;
        });
        Ok((plane, task))
    }

    /// Connects the plane to NATS: agents of other nodes become reachable.
    pub async fn attach_nats(&self, client: async_nats::Client) -> Result<(), BrokerError> {
        let _ = self.nats.set(client);
        Ok(())
    }

    fn local(&self, agent: &Agent) -> bool {
        agent.spec.node.as_deref() == self.runtime.node()
    }

    async fn recover(&self) -> Result<(), BrokerError> {
        let store = self.broker.store();
        let flights: Vec<Flight> = store.values(T::Flights)?;
        for f in flights.into_iter().filter(|f| !f.state.is_terminal()) {
            let Some(agent) = store.agent(&f.agent)? else {
                self.settle(&f.id, FlightState::Failed, "its agent was removed")
                    .await;
                continue;
            };
            if !self.local(&agent) {
                continue;
            }
            if f.state == FlightState::Queued {
                if let Some(inv) = store.invocation(&f.invocation)? {
                    self.dispatch(agent, inv, f).await;
                }
            } else {
                let _ = self
                    .broker
                    .execute_internal(Command::ExpireApprovals {
                        flight: f.id.clone(),
                    })
                    .await;
                self.settle(
                    &f.id,
                    FlightState::Failed,
                    &format!(
                        "relay stopped while this flight was {} (its harness process ended with it); \
                         the agent's thread is kept, ask again to continue",
                        f.state
                    ),
                )
                .await;
            }
        }
        let agents: Vec<Agent> = store.values(T::Agents)?;
        for a in agents.iter().filter(|a| self.local(a)) {
            if a.spec.wake == relay_protocol::domain::WakePolicy::KeepWarm {
                if let Err(e) = self.runtime.warm(a) {
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

    async fn dispatch(
        &self,
        agent: Agent,
        invocation: relay_protocol::domain::Invocation,
        flight: Flight,
    ) {
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
    async fn dispatch_new(self, from_seq: u64) {
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
                EventBody::InvocationCreated { invocation, flight } => {
                    let agent = match self.broker.store().agent(&invocation.target) {
                        Ok(Some(a)) => a,
                        _ => continue,
                    };
                    if self.local(&agent) {
                        self.dispatch(agent, invocation.clone(), flight.clone())
                            .await;
                    }
                }
                EventBody::AgentRemoved { name } => {
                    let _ = self
                        .runtime
                        .control(Control::AgentRemoved {
                            agent: name.clone(),
                        })
                        .await;
                }
                _ => {}
            }
        }
    }

    async fn consume(self, mut reports: mpsc::Receiver<Report>, pending: mpsc::Sender<Pending>) {
        while let Some(report) = reports.recv().await {
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
                    match self
                        .broker
                        .submit(Command::RequestApproval { agent, request })
                        .await
                    {
                        Ok(rx) => {
                            let _ = pending.send(Pending::Approval(rx)).await;
                        }
                        Err(e) => tracing::warn!(error = %e, "approval not recorded"),
                    }
                    continue;
                }
                Report::ApprovalsExpired { flight } => {
                    (Command::ExpireApprovals { flight }, "expire approvals")
                }
            };
            match self.broker.submit(command).await {
                Ok(rx) => {
                    let _ = pending.send(Pending::Check(rx, kind)).await;
                }
                Err(e) => tracing::warn!(error = %e, "{kind} not recorded"),
            }
        }
    }

    async fn drain(self, mut pending: mpsc::Receiver<Pending>) {
        while let Some(p) = pending.recv().await {
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
                        self.apply_policy(a).await;
                    }
                }
            }
        }
    }

    async fn apply_policy(&self, approval: Approval) {
        let Ok(Some(agent)) = self.broker.store().agent(&approval.agent) else {
            return;
        };
        let p = &agent.spec.approval_policy;
        let detail = approval.request.detail.trim_start();
        let decision = match approval.request.kind {
            ApprovalKind::Command => {
                if let Some(prefix) = p
                    .decline_command_prefixes
                    .iter()
                    .find(|x| detail.starts_with(x.as_str()))
                {
                    Some((
                        ApprovalDecision::Decline,
                        format!("policy:auto-decline:{prefix}"),
                    ))
                } else {
                    p.accept_command_prefixes
                        .iter()
                        .find(|x| detail.starts_with(x.as_str()))
                        .map(|prefix| {
                            (
                                ApprovalDecision::Accept,
                                format!("policy:auto-accept:{prefix}"),
                            )
                        })
                }
            }
            ApprovalKind::FileChange if p.accept_file_changes => Some((
                ApprovalDecision::Accept,
                "policy:accept_file_changes".to_string(),
            )),
            _ => None,
        };
        let Some((decision, by)) = decision else {
            return;
        };
        match self
            .broker
            .decide_approval_internal(&approval.id, decision, &by)
            .await
        {
            Ok(decided) => {
                if let Err(e) = self.approval_decided(decided).await {
                    tracing::warn!(approval = %approval.id, error = %e, "policy decision not delivered");
                }
            }
            Err(e) => {
                tracing::warn!(approval = %approval.id, error = %e, "policy decision refused")
            }
        }
    }
}

fn runtime_error(e: RuntimeError) -> BrokerError {
    match e {
        RuntimeError::Overloaded(a) => {
            BrokerError::Overloaded(format!("agent {a:?} queue is full"))
        }
        RuntimeError::ShuttingDown => BrokerError::ShuttingDown,
        other => BrokerError::Unavailable(other.to_string()),
    }
}

impl FlightControl for Plane {
    fn steer(&self, flight: Flight, text: String) -> BoxFuture<'static, Result<(), BrokerError>> {
        let runtime = self.runtime.clone();
        Box::pin(async move {
            runtime
                .control(Control::Steer {
                    agent: flight.agent,
                    flight: flight.id,
                    text,
                })
                .await
                .map_err(runtime_error)
        })
    }

    fn interrupt(&self, flight: Flight) -> BoxFuture<'static, Result<(), BrokerError>> {
        let runtime = self.runtime.clone();
        Box::pin(async move {
            runtime
                .control(Control::Interrupt {
                    agent: flight.agent,
                    flight: flight.id,
                })
                .await
                .map_err(runtime_error)
        })
    }

    fn approval_decided(&self, approval: Approval) -> BoxFuture<'static, Result<(), BrokerError>> {
        let runtime = self.runtime.clone();
        Box::pin(async move {
            let Some(decision) = approval.decision else {
                return Ok(());
            };
            runtime
                .control(Control::Approval {
                    agent: approval.agent,
                    flight: approval.request.flight,
                    harness_request_id: approval.request.harness_request_id,
                    decision,
                })
                .await
                .map_err(runtime_error)
        })
    }
}

/// Shares a plane as the API's flight control.
pub fn control(plane: &Plane) -> Arc<dyn FlightControl> {
    Arc::new(plane.clone())
}
