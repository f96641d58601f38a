//! The remembered rules on the bus, in JSON only: `relay.v1.cmd.rules` lists them (as
//! `GET /v1/rules`), `relay.v1.cmd.rule_remove` removes one (a trusted bus only, as
//! approving is; recorded as removed by `nats` or `NAME@nats`).

use bytes::Bytes;
use relay_protocol::bus::RuleAnswer;
use relay_protocol::methods::{self, call as m, MethodId};

use super::{bus_body, Answer, Service};
use crate::error::BrokerError;

/// Whether `subject` is answered in JSON whatever the request's content type.
pub(super) fn json_only(subject: &str) -> bool {
    matches!(
        methods::by_subject(subject).map(|(m, _)| m.id),
        Some(MethodId::RuleList | MethodId::RuleRemove)
    )
}

impl Service {
    pub(super) async fn rules(
        &self,
        id: MethodId,
        msg: &async_nats::Message,
    ) -> Result<Answer, BrokerError> {
        let body = match id {
            MethodId::RuleList => {
                let q = bus_body::<m::RuleList>(msg)?;
                let rules = crate::remembered::list(&self.broker, q.agent.as_deref()).await?;
                serde_json::to_vec(&rules)
            }
            _ => {
                let b = bus_body::<m::RuleRemove>(msg)?;
                self.trusted("removing a remembered rule")?;
                let rule = crate::remembered::remove(
                    &self.broker,
                    &b.rule,
                    &b.removed_by,
                    crate::ops::Via::Bus,
                )
                .await?;
                serde_json::to_vec(&RuleAnswer { rule })
            }
        };
        Ok(Answer::Json(Bytes::from(body.map_err(|e| {
            BrokerError::Internal(format!("a rule's JSON: {e}"))
        })?)))
    }
}
