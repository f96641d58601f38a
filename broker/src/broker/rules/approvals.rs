//! The rules of approvals: a request (which puts its running flight to waiting), a
//! decision (which resumes it once none is pending, and may be remembered as a rule, in
//! the same batch), the expiry of those a flight left pending, and the removal of
//! a remembered rule.

use relay_protocol::domain::{
    Approval, ApprovalDecision, ApprovalRequest, ApprovalState, FlightChange, FlightState, Rule,
};
use relay_protocol::event::EventBody;

use super::Ctx;
use crate::broker::{new_id, Outcome};
use crate::error::BrokerError;
use crate::store::T;

impl Ctx<'_, '_> {
    fn pending_approvals(&self, flight: &str) -> Result<Vec<Approval>, BrokerError> {
        let index: Vec<String> = self
            .tx
            .read(T::FlightApprovals, flight.as_bytes())?
            .unwrap_or_default();
        let mut out = Vec::new();
        for id in index {
            if let Some(a) = self.tx.read::<Approval>(T::Approvals, id.as_bytes())? {
                if a.state == ApprovalState::Pending {
                    out.push(a);
                }
            }
        }
        Ok(out)
    }

    pub(super) fn request_approval(
        &mut self,
        agent: &str,
        request: &ApprovalRequest,
    ) -> Result<Outcome, BrokerError> {
        self.agent(agent)?;
        let flight = self.flight(&request.flight)?;
        if flight.agent != agent {
            return Err(BrokerError::NotAgentsFlight {
                flight: flight.id,
                agent: agent.to_string(),
            });
        }
        if flight.state.is_terminal() {
            return Err(BrokerError::FlightTerminal {
                flight: flight.id,
                state: flight.state,
            });
        }
        let approval = Approval {
            id: new_id("apr"),
            agent: agent.into(),
            request: request.clone(),
            state: ApprovalState::Pending,
            decision: None,
            decided_by: None,
            created_at: self.now,
            remembered: None,
            decided_at: None,
        };
        self.emit(EventBody::ApprovalRequested {
            approval: approval.clone(),
        })?;
        if flight.state == FlightState::Running {
            self.update_flight(
                &flight.id,
                &FlightChange::State {
                    to: FlightState::Waiting,
                    reason: Some(format!("approval {}: {}", approval.id, request.detail)),
                    output: None,
                },
            )?;
        }
        Ok(Outcome::Approval(approval))
    }

    pub(super) fn decide_approval(
        &mut self,
        id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        remember: Option<&Rule>,
    ) -> Result<Outcome, BrokerError> {
        let mut approval: Approval = self
            .tx
            .read(T::Approvals, id.as_bytes())?
            .ok_or_else(|| BrokerError::UnknownApproval(id.into()))?;
        if approval.state != ApprovalState::Pending {
            return Err(BrokerError::ApprovalClosed(id.into()));
        }
        approval.state = ApprovalState::Decided;
        approval.decision = Some(decision);
        approval.decided_by = Some(decided_by.into());
        approval.decided_at = Some(self.now);
        let flight = self.flight(&approval.request.flight)?;
        if let Some(rule) = remember {
            // The rule first: the decision names it, and a reader of the log meets the
            // rule before the decision that made it.
            let rule = Rule {
                id: new_id("rul"),
                origin: Some(approval.id.clone()),
                created_by: decided_by.into(),
                created_at: self.now,
                matched: 0,
                last_matched_at: None,
                ..rule.clone()
            };
            approval.remembered = Some(rule.id.clone());
            self.emit(EventBody::RuleAdded { rule })?;
        }
        self.emit(EventBody::ApprovalDecided {
            approval: approval.clone(),
        })?;
        if flight.state == FlightState::Waiting && self.pending_approvals(&flight.id)?.is_empty() {
            self.update_flight(
                &flight.id,
                &FlightChange::State {
                    to: FlightState::Running,
                    reason: Some(format!("approval {id}: {decision} by {decided_by}")),
                    output: None,
                },
            )?;
        }
        Ok(Outcome::Approval(approval))
    }

    /// Closes the approvals of `flight` still pending (those of harness request
    /// `request` only, if given), recorded as closed by `by`.
    pub(super) fn expire_approvals(
        &mut self,
        flight: &str,
        by: &str,
        request: &Option<String>,
    ) -> Result<Outcome, BrokerError> {
        let pending = self.pending_approvals(flight)?;
        let mut closed = Vec::new();
        for mut a in pending.into_iter().filter(|a| {
            request
                .as_ref()
                .is_none_or(|r| *r == a.request.harness_request_id)
        }) {
            a.state = ApprovalState::Expired;
            a.decided_by = Some(by.to_owned());
            a.decided_at = Some(self.now);
            self.emit(EventBody::ApprovalDecided {
                approval: a.clone(),
            })?;
            closed.push(a);
        }
        Ok(Outcome::Approvals(closed))
    }

    pub(super) fn remove_rule(
        &mut self,
        id: &str,
        removed_by: &str,
    ) -> Result<Outcome, BrokerError> {
        let rule: Rule = self
            .tx
            .read(T::Rules, id.as_bytes())?
            .ok_or_else(|| BrokerError::UnknownRule(id.into()))?;
        self.emit(EventBody::RuleRemoved {
            rule: rule.clone(),
            removed_by: removed_by.into(),
        })?;
        Ok(Outcome::Rule(rule))
    }
}
