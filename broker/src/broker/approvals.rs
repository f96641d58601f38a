//! The broker's calls that decide approvals (a client's, rejected when the queue is full;
//! Relay's own, waiting for room), with the rule a decision is remembered as, and the call
//! that removes a remembered rule.

use relay_protocol::domain::{Approval, ApprovalDecision, Rule};

use super::{Broker, Command, Outcome};
use crate::error::BrokerError;

impl Broker {
    /// Decides an approval for a client (rejected with `Overloaded` when the queue is
    /// full).
    pub async fn decide_approval(
        &self,
        id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Approval, BrokerError> {
        self.decide(id, decision, decided_by, None, false).await
    }

    /// [`Broker::decide_approval`] for Relay's own policies: waits for queue room.
    pub async fn decide_approval_internal(
        &self,
        id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
    ) -> Result<Approval, BrokerError> {
        self.decide(id, decision, decided_by, None, true).await
    }

    /// Decides an approval and, with `remember`, records the rule it is remembered as in
    /// the same batch (`rule_added`, then `approval_decided` naming the rule).
    /// `internal`: Relay's own decision, which waits for queue room.
    pub async fn decide(
        &self,
        id: &str,
        decision: ApprovalDecision,
        decided_by: &str,
        remember: Option<Rule>,
        internal: bool,
    ) -> Result<Approval, BrokerError> {
        let command = Command::DecideApproval {
            id: id.into(),
            decision,
            decided_by: decided_by.into(),
            remember: remember.map(Box::new),
        };
        let outcome = if internal {
            self.execute_internal(command).await
        } else {
            self.execute(command).await
        };
        expect_outcome!(async { outcome }, Approval)
    }

    /// Removes remembered rule `id` (`rule_removed`, naming `removed_by`); the removed
    /// rule as it was.
    pub async fn remove_rule(&self, id: &str, removed_by: &str) -> Result<Rule, BrokerError> {
        expect_outcome!(
            self.execute(Command::RemoveRule {
                id: id.into(),
                removed_by: removed_by.into(),
            }),
            Rule
        )
    }
}
