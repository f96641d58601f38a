//! The rules of conversations, messages and their deliveries: creating a conversation,
//! checking and posting a message, planning a delivery to each agent it mentions (or
//! each participant of a direct conversation), and recording the attempts.

use relay_protocol::domain::{
    parse_mentions, valid_conversation_id, Agent, Conversation, ConversationKind, ConversationSpec,
    Delivery, DeliveryReason, DeliveryState, Flight, Harness, Invocation, Message, PostMessage,
};
use relay_protocol::event::EventBody;

use super::Ctx;
use crate::broker::{new_id, Outcome};
use crate::error::{quote, BrokerError};
use crate::store::T;

impl Ctx<'_, '_> {
    pub(super) fn post_message(&mut self, post: &PostMessage) -> Result<Outcome, BrokerError> {
        let conversation = self.conversation(&post.conversation)?;
        self.check_post(post)?;
        let message = self.post(conversation, post)?;
        Ok(Outcome::Message(message))
    }

    pub(super) fn create_conversation(
        &mut self,
        spec: &ConversationSpec,
    ) -> Result<Outcome, BrokerError> {
        if !valid_conversation_id(&spec.id) {
            return Err(BrokerError::Invalid(format!(
                "conversation id {}: 1 to 200 bytes of dot-separated words of letters, digits, `-` and `_` (like channel.shared)",
                quote(&spec.id)
            )));
        }
        if self.tx.contains(T::Conversations, spec.id.as_bytes())? {
            return Err(BrokerError::ConversationExists(spec.id.clone()));
        }
        if let Some(parent) = &spec.parent {
            self.conversation(parent)?;
        }
        let conversation = Conversation {
            spec: spec.clone(),
            created_at: self.now,
            message_count: 0,
        };
        self.emit(EventBody::ConversationCreated {
            conversation: conversation.clone(),
        })?;
        Ok(Outcome::Conversation(conversation))
    }

    pub(super) fn check_text(&self, what: &'static str, text: &str) -> Result<(), BrokerError> {
        if text.len() > self.config.max_message_bytes {
            return Err(BrokerError::TooLarge {
                what,
                size: text.len(),
                limit: self.config.max_message_bytes,
            });
        }
        if text.trim().is_empty() {
            return Err(BrokerError::Invalid(format!("the {what} is empty")));
        }
        Ok(())
    }

    fn check_post(&self, post: &PostMessage) -> Result<(), BrokerError> {
        self.check_text("message body", &post.body)?;
        if post.author.trim().is_empty() || post.author.len() > 128 {
            return Err(BrokerError::Invalid(
                "a message author is 1 to 128 characters".into(),
            ));
        }
        if let Some(reply_to) = &post.reply_to {
            if !self.tx.contains(T::MessageIds, reply_to.as_bytes())? {
                return Err(BrokerError::UnknownMessage(reply_to.clone()));
            }
        }
        Ok(())
    }

    /// Posts a checked message and plans its deliveries.
    pub(super) fn post(
        &mut self,
        mut conversation: Conversation,
        post: &PostMessage,
    ) -> Result<Message, BrokerError> {
        let message = Message {
            id: new_id("msg"),
            conversation: conversation.spec.id.clone(),
            index: conversation.message_count,
            author: post.author.clone(),
            class: post.class,
            body: post.body.clone(),
            mentions: parse_mentions(&post.body),
            reply_to: post.reply_to.clone(),
            meta: post.meta.clone(),
            created_at: self.now,
        };
        conversation.message_count += 1;
        let mut targets: Vec<(String, DeliveryReason)> = message
            .mentions
            .iter()
            .map(|m| (m.clone(), DeliveryReason::Mention))
            .collect();
        if conversation.spec.kind == ConversationKind::Direct {
            for p in &conversation.spec.participants {
                if !targets.iter().any(|(t, _)| t == p) {
                    targets.push((p.clone(), DeliveryReason::DirectMessage));
                }
            }
        }
        self.emit(EventBody::MessagePosted {
            message: message.clone(),
            conversation,
        })?;
        for (target, reason) in targets {
            if target == message.author {
                continue;
            }
            // Only registered agents get deliveries; a mention of anything else is text.
            if let Some(agent) = self.tx.read::<Agent>(T::Agents, target.as_bytes())? {
                self.plan_delivery(&message.id, &agent, reason)?;
            }
        }
        Ok(message)
    }

    pub(super) fn plan_delivery(
        &mut self,
        message: &str,
        agent: &Agent,
        reason: DeliveryReason,
    ) -> Result<(), BrokerError> {
        let transport = agent.spec.harness;
        let id = relay_protocol::domain::delivery_id(message, &agent.spec.name, reason, transport);
        if self.tx.contains(T::Deliveries, id.as_bytes())? {
            return Ok(());
        }
        self.emit(EventBody::DeliveryPlanned {
            delivery: Delivery {
                id,
                message: message.into(),
                target: agent.spec.name.clone(),
                reason,
                transport,
                state: DeliveryState::Pending,
                attempts: vec![],
            },
        })
    }

    /// Records the attempt on the pending deliveries of a flight's task (its request
    /// message) to its agent: delivered once the turn runs, failed if the flight ended
    /// before.
    pub(super) fn attempt_deliveries(
        &mut self,
        flight: &Flight,
        outcome: Result<(), String>,
    ) -> Result<(), BrokerError> {
        let Some(invocation) = self
            .tx
            .read::<Invocation>(T::Invocations, flight.invocation.as_bytes())?
        else {
            return Ok(());
        };
        // Every transport: the agent may have been removed, or registered again with
        // another harness, since the deliveries were planned.
        let reasons = [
            DeliveryReason::Invocation,
            DeliveryReason::DirectMessage,
            DeliveryReason::Mention,
        ];
        for (reason, transport) in reasons
            .into_iter()
            .flat_map(|r| Harness::ALL.into_iter().map(move |h| (r, h)))
        {
            let id = relay_protocol::domain::delivery_id(
                &invocation.request_message,
                &flight.agent,
                reason,
                transport,
            );
            let Some(mut delivery) = self.tx.read::<Delivery>(T::Deliveries, id.as_bytes())? else {
                continue;
            };
            if delivery.state != DeliveryState::Pending {
                continue;
            }
            delivery.state = if outcome.is_ok() {
                DeliveryState::Delivered
            } else {
                DeliveryState::Failed
            };
            delivery
                .attempts
                .push(relay_protocol::domain::DeliveryAttempt {
                    at: self.now,
                    ok: outcome.is_ok(),
                    error: outcome.clone().err(),
                });
            self.emit(EventBody::DeliveryAttempted { delivery })?;
        }
        Ok(())
    }
}
