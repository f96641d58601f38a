//! Reports: what the runtime reports becomes a broker command, enqueued in arrival
//! order (each flight's waiting deltas merged first: `merge`); the replies are awaited apart (`drain`), and an approval that was recorded gets
//! its agent's policy applied (`apply_policy`), then its remembered rules.

use relay_protocol::domain::{
    Approval, ApprovalDecision, ApprovalPolicy, ApprovalState, FlightChange,
};
use relay_protocol::event::EventBody;
use relay_protocol::runtime::Report;
use tokio::sync::{broadcast, mpsc, oneshot};
use tracing::Instrument;

use super::{control, merge, Plane};
use crate::broker::{Broker, Command, Live, Outcome};
use crate::error::BrokerError;

/// Replies waiting to be checked by the drain task.
pub(super) const PENDING_REPLIES: usize = 8192;
/// Most replies the drain takes at once.
const DRAIN_RUN: usize = 1024;

type Reply = oneshot::Receiver<Result<Outcome, BrokerError>>;

pub(super) enum Pending {
    /// Log a failure; nothing else depends on it.
    Check(Reply, &'static str),
    /// The end of a flight of the embedded runtime: once committed, the runtime's
    /// record of its dispatch is no longer needed (see `Worker::report`).
    Ended(Reply, String),
    /// An approval was recorded: apply the agent's policy to it.
    Approval(Reply),
    /// Streamed output of a flight (any change but a state change): if it ended the
    /// flight (its output cap), interrupt the turn that streams it.
    Streamed(Reply),
}

/// The span of what a report of a flight causes (`flight = flt_...`): its submission,
/// the wait for its commit and the policy applied to its approval log within it. A
/// report of no flight (an agent's state) has none.
pub(super) fn flight_span(report: &Report) -> tracing::Span {
    let flight = match report {
        Report::Flight { flight, .. } | Report::ApprovalsExpired { flight, .. } => flight,
        Report::ApprovalRequested { request, .. } => &request.flight,
        _ => return tracing::Span::none(),
    };
    tracing::info_span!("flight", flight = %flight)
}

/// Where a node's report was in JetStream.
#[derive(Debug, Clone)]
pub(super) struct ReportSource {
    /// The node it came from (by its subject).
    pub node: String,
    /// The report stream's identity (its creation time, ns since the epoch).
    pub stream: i64,
    /// Its seq in that stream.
    pub seq: u64,
}

impl Plane {
    pub(super) async fn consume(
        self,
        mut reports: mpsc::Receiver<Report>,
        pending: mpsc::Sender<(Pending, tracing::Span)>,
    ) {
        let mut waiting = Vec::with_capacity(merge::DRAIN_MAX);
        while let Some(first) = reports.recv().await {
            // Everything waiting, each flight's streamed text merged (see `merge`).
            waiting.push(first);
            while waiting.len() < merge::DRAIN_MAX {
                match reports.try_recv() {
                    Ok(r) => waiting.push(r),
                    Err(_) => break,
                }
            }
            for report in merge::merge_deltas(waiting.drain(..)) {
                let span = flight_span(&report);
                match self.submit_report(report).instrument(span.clone()).await {
                    Ok(p) => {
                        let _ = pending.send((p, span)).await;
                    }
                    Err(e) => span.in_scope(|| tracing::warn!(error = %e, "report not recorded")),
                }
            }
        }
    }

    /// Enqueues the command a report stands for, in arrival order; the returned pending
    /// reply says when it committed.
    async fn submit_report(&self, report: Report) -> Result<Pending, BrokerError> {
        self.submit_report_from(report, None).await
    }

    /// `source` (where in JetStream the report was) makes the command apply at most once.
    pub(super) async fn submit_report_from(
        &self,
        report: Report,
        source: Option<ReportSource>,
    ) -> Result<Pending, BrokerError> {
        let wrap = |command: Command| match &source {
            Some(s) => Command::FromNode {
                node: s.node.clone(),
                stream: s.stream,
                stream_seq: s.seq,
                command: Box::new(command),
            },
            None => command,
        };
        let (command, kind) = match report {
            Report::Flight { flight, change } => {
                let ends = matches!(&change, FlightChange::State { to, .. } if to.is_terminal());
                if ends && source.is_none() {
                    let rx = self
                        .broker
                        .submit(Command::UpdateFlight {
                            flight: flight.clone(),
                            change,
                        })
                        .await?;
                    return Ok(Pending::Ended(rx, flight));
                }
                let streamed = !matches!(change, FlightChange::State { .. });
                let command = Command::UpdateFlight { flight, change };
                if streamed {
                    return Ok(Pending::Streamed(self.broker.submit(wrap(command)).await?));
                }
                (command, "flight update")
            }
            Report::Agent {
                agent,
                state,
                thread_id,
                endpoint,
                reason,
                program,
                worktree,
            } => (
                Command::UpdateAgent {
                    name: agent,
                    state,
                    thread_id,
                    endpoint: endpoint.map(Some),
                    reason,
                    program,
                    worktree: worktree.map(|w| *w),
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

    /// Settles the submitted reports in order. The runtime's records of the flights that
    /// ended are dropped per run of replies taken at once, in one job: one per flight
    /// held every reply behind it, and with them the reports (the channel fills).
    pub(super) async fn drain(self, mut pending: mpsc::Receiver<(Pending, tracing::Span)>) {
        let mut taken = Vec::with_capacity(DRAIN_RUN);
        while pending.recv_many(&mut taken, DRAIN_RUN).await > 0 {
            let mut ended = Vec::new();
            for (p, span) in taken.drain(..) {
                ended.extend(self.settle_pending(p).instrument(span).await);
            }
            // Kept otherwise: the next start settles each flight from it.
            if let Err(e) = self.runtime.threads().forget_flights(ended).await {
                tracing::warn!(error = %e, "cannot forget the dispatch records of flights that ended");
            }
        }
    }

    /// Waits for a submitted report's commit; applies the approval policy where due.
    /// The flight whose end it committed, for the runtime's record of its dispatch to
    /// be dropped.
    pub(super) async fn settle_pending(&self, p: Pending) -> Option<String> {
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
                Pending::Ended(rx, flight) => {
                    let committed = match rx.await {
                        Ok(Ok(_)) => true,
                        Ok(Err(e @ BrokerError::FlightTerminal { .. })) => {
                            tracing::debug!(error = %e, "flight end after the flight ended");
                            true
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "flight update refused");
                            false
                        }
                        Err(_) => false,
                    };
                    if committed {
                        tracing::debug!("flight ended");
                        return Some(flight);
                    }
                }
                Pending::Streamed(rx) => match rx.await {
                    Ok(Ok(Outcome::Flight(r))) if r.applied && r.flight.state.is_terminal() => {
                        // The broker ended the flight (its output cap, its agent's budget): stop the turn.
                        let control = control(self);
                        self.tasks.spawn(
                            async move {
                            let id = r.flight.id.clone();
                            if let Err(e) = control.interrupt(r.flight).await {
                                tracing::warn!(flight = %id, error = %e, "the turn of a flight the broker ended (its output cap or its budget) was not interrupted");
                            }
                        }
                            .in_current_span(),
                        );
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e @ BrokerError::FlightTerminal { .. })) => {
                        tracing::debug!(error = %e, "flight update after the flight ended")
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "flight update refused"),
                    Err(_) => {
                        tracing::debug!("broker stopped before a flight update was committed")
                    }
                },
                Pending::Approval(rx) => {
                    if let Ok(Ok(Outcome::Approval(a))) = rx.await {
                        // Deciding may wait on a node; keep it off the ordered path.
                        let this = self.clone();
                        self.tasks
                            .spawn(async move { this.apply_policy(a).await }.in_current_span());
                    }
                }
            }
        }
        None
    }

    async fn apply_policy(&self, approval: Approval) {
        let Ok(Some(agent)) = self.broker.agent(&approval.agent).await else {
            return;
        };
        let decision = crate::policy::decide(&agent.spec.approval_policy, &approval);
        let control = control(self);
        let Some((decision, by)) = decision else {
            // Then the remembered decisions; else a person.
            match crate::remembered::decide(&self.broker, Some(&control), &approval, &agent).await {
                Ok(Some(_)) => {}
                Ok(None) => self.waits_for_person(&agent.spec.approval_policy, approval),
                Err(e) => {
                    tracing::warn!(approval = %approval.id, error = %e, "remembered decision not applied");
                    self.waits_for_person(&agent.spec.approval_policy, approval);
                }
            }
            return;
        };
        let decided = crate::ops::decide(
            &self.broker,
            Some(&control),
            &approval.id,
            decision,
            &by,
            None,
            None,
        )
        .await;
        if let Err(e) = decided {
            tracing::warn!(approval = %approval.id, error = %e, "policy decision not applied");
        }
    }
}

impl Plane {
    /// No rule decided `approval`: tell the user (`--notify-command`), and decline it
    /// if nobody answers within the agent's timeout (see [`crate::alerts`]). The timeout
    /// is a task of its own, which ends as soon as the approval is decided (by anyone,
    /// or expired with its turn), or with the plane.
    fn waits_for_person(&self, policy: &ApprovalPolicy, approval: Approval) {
        if let Some(notifier) = &self.notifier {
            notifier.approval_waits(&approval, &self.tasks);
        }
        let Some(secs) = policy.timeout_secs else {
            return;
        };
        let this = self.clone();
        // Subscribed before the task starts: a decision from now on is seen.
        let live = self.broker.subscribe();
        self.timers.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(secs)) => {}
                () = closed(&this.broker, live, &approval.id) => return,
            }
            let decided = crate::ops::decide(
                &this.broker,
                Some(&control(&this)),
                &approval.id,
                ApprovalDecision::Decline,
                &crate::alerts::timeout_decider(secs),
                None,
                None,
            )
            .await;
            match decided {
                Ok(_) => {
                    tracing::info!(approval = %approval.id, secs, "approval declined at its timeout")
                }
                // Someone decided first, or its turn ended.
                Err(BrokerError::ApprovalClosed(_)) => {}
                Err(e) => {
                    tracing::warn!(approval = %approval.id, error = %e, "approval timeout not applied")
                }
            }
        });
    }
}

/// Resolves once approval `id` is no longer pending: decided by anyone, or expired with
/// its turn (both publish `approval_decided`), or the broker is gone. `live` is a
/// subscription taken before the approval could be decided after it was read; after a
/// lag, the store says.
async fn closed(broker: &Broker, mut live: broadcast::Receiver<Live>, id: &str) {
    let mut check = true;
    loop {
        if check {
            let id = id.to_string();
            match broker.store().read(move |s| s.approval(&id)).await {
                Ok(Some(a)) if a.state == ApprovalState::Pending => {}
                // Decided, gone, or unreadable (the timeout's decide will say).
                _ => return,
            }
        }
        check = match live.recv().await {
            Ok(live) => match live.take().as_deref().map(|e| &e.body) {
                Some(EventBody::ApprovalDecided { approval }) => approval.id == id,
                Some(_) => false,
                // No longer in memory: the store knows.
                None => true,
            },
            // Missed: the store knows.
            Err(broadcast::error::RecvError::Lagged(_)) => true,
            Err(broadcast::error::RecvError::Closed) => return,
        };
    }
}
