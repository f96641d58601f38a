//! Dispatch: flights left by the previous process settled at start, and every new
//! invocation handed to the runtime that serves its agent (this one, or a node's through
//! the remote dispatcher of `nodes.rs`), in commit order.

use std::collections::HashMap;

use relay_protocol::domain::{Agent, Flight, FlightChange, FlightState};
use relay_protocol::event::EventBody;
use relay_protocol::runtime::{Control, Dispatch, Report};
use relay_runtime::DispatchState;

use super::Plane;
use crate::broker::Command;
use crate::error::BrokerError;
use crate::store::T;

impl Plane {
    pub(super) async fn recover(&self) -> Result<(), BrokerError> {
        self.resend_commits().await?;
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
        // What the runtime recorded of each dispatch (started, ended with its report),
        // read before anything is dispatched again: the records read here are of the
        // last process, and forgotten once their flights are settled below.
        let records: HashMap<String, DispatchState> = self
            .runtime
            .threads()
            .dispatches()
            .await
            .map_err(crate::error::runtime_error)?
            .into_iter()
            .map(|(invocation, _, state)| (invocation, state))
            .collect();
        let ended: HashMap<String, Report> = self
            .runtime
            .threads()
            .ended_unsent()
            .await
            .map_err(crate::error::runtime_error)?
            .into_iter()
            .collect();
        for (f, agent, invocation) in live {
            let Some(agent) = agent else {
                self.settle(&f.id, FlightState::Failed, "its agent was removed")
                    .await;
                continue;
            };
            if !self.local(&agent) {
                continue;
            }
            // Queued (or its session was starting: `waking`), but its turn may have
            // started just before the stop: the runtime records a start on disk before
            // the harness sees the task, and such a task is not run twice. One that
            // never started is dispatched again: nothing of it ran.
            let unstarted = matches!(f.state, FlightState::Queued | FlightState::Waking);
            let started = unstarted && records.contains_key(&f.invocation);
            if let Some(Report::Flight { change, .. }) = ended.get(&f.invocation) {
                // Its turn ended before the stop, but the end was not committed: it is
                // recorded now, as the runtime reported it, not run again.
                self.settle_ended(&f, change.clone()).await;
            } else if unstarted && !started {
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
        // Every flight those records were of is settled now (or was already).
        for invocation in records.keys() {
            if let Err(e) = self.runtime.threads().forget_dispatch(invocation).await {
                tracing::warn!(%invocation, error = %e, "cannot forget a dispatch record");
            }
        }
        for a in agents.iter().filter(|a| self.local(a)) {
            // Whatever the agent was doing, its session died with the previous process.
            if a.state != relay_protocol::domain::AgentState::Offline || a.endpoint.is_some() {
                let r = self
                    .broker
                    .execute_internal(Command::UpdateAgent {
                        worktree: None,
                        name: a.spec.name.clone(),
                        state: Some(relay_protocol::domain::AgentState::Offline),
                        thread_id: None,
                        endpoint: Some(None),
                        reason: None,
                        program: None,
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

    /// Records the commits of worktrees whose reports the last process kept but may not
    /// have seen recorded (see `ThreadStore::put_commit_reports`): the broker takes the
    /// same commit once, so a report it has already is nothing new. Each record is
    /// dropped once its reports are in.
    async fn resend_commits(&self) -> Result<(), BrokerError> {
        let threads = self.runtime.threads();
        let kept = threads
            .commit_reports_unsent()
            .await
            .map_err(crate::error::runtime_error)?;
        for (flight, reports) in kept {
            let mut recorded = true;
            for report in reports {
                // The flights' commits only: the branch's state (ahead/behind) in them
                // may be older than what was recorded since, and is reported afresh when
                // the agent's worktree is next looked at.
                let command = match report {
                    Report::Flight { flight, change } => Command::UpdateFlight { flight, change },
                    _ => continue,
                };
                match self.broker.execute_internal(command).await {
                    Ok(_) => {}
                    // Its flight or agent is gone: nothing to record it on.
                    Err(BrokerError::UnknownFlight(_) | BrokerError::UnknownAgent(_)) => {}
                    Err(e) => {
                        tracing::warn!(%flight, error = %e, "a kept commit report was not recorded");
                        recorded = false;
                    }
                }
            }
            if recorded {
                if let Err(e) = threads.forget_commit_reports_durably(&flight).await {
                    tracing::warn!(%flight, error = %e, "cannot drop a kept commit report");
                }
            }
        }
        Ok(())
    }

    /// Records the end a turn reported before a stop that lost it: after `running`
    /// (which a completed turn needs) if the flight never got there.
    async fn settle_ended(&self, f: &Flight, change: FlightChange) {
        // A long answer goes to the log's text files first, as the runtime's worker
        // writes it for a turn it reports (this one came back from the runtime's record,
        // a buffer never written): the storage thread then writes a reference to it.
        if let FlightChange::State {
            output: Some(output),
            ..
        } = &change
        {
            if output.len() >= relay_protocol::domain::shared::LONG_TEXT {
                let store = self.broker.store().clone();
                let (flight, text) = (f.id.clone(), output.clone());
                let written =
                    tokio::task::spawn_blocking(move || store.log().texts().write(&flight, &text))
                        .await;
                if let Ok(Err(e)) = written {
                    tracing::warn!(flight = %f.id, error = %e, "a long answer could not be written first; it is stored with its event");
                }
            }
        }
        let _ = self
            .broker
            .execute_internal(Command::ExpireApprovals {
                flight: f.id.clone(),
                by: "relay:turn-ended".into(),
                request: None,
            })
            .await;
        let completes = matches!(
            change,
            FlightChange::State {
                to: FlightState::Completed,
                ..
            }
        );
        let mut changes = Vec::new();
        if completes && matches!(f.state, FlightState::Queued | FlightState::Waking) {
            changes.push(FlightChange::State {
                to: FlightState::Running,
                reason: None,
                output: None,
            });
        }
        changes.push(change);
        for change in changes {
            let r = self
                .broker
                .execute_internal(Command::UpdateFlight {
                    flight: f.id.clone(),
                    change,
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(flight = %f.id, error = %e, "cannot settle flight");
            }
        }
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
    pub(super) async fn with_secrets(&self, mut agent: Agent) -> Agent {
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

    pub(super) async fn dispatch(
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
    pub(super) async fn dispatch_new(self, from_seq: u64) {
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
        let mut feed = crate::feed::Feed::new(self.broker.clone(), from_seq);
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
                EventBody::AgentRemoved { name, node, force } => {
                    // Stopping its session may take a while: dispatch goes on meanwhile.
                    let control = self.route_to(
                        node.clone()
                            .filter(|n| Some(n.as_str()) != self.runtime.node()),
                        Control::AgentRemoved {
                            force: *force,
                            agent: name.clone(),
                        },
                    );
                    self.tasks.spawn(async move {
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
}
