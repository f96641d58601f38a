//! The rules of conversations, messages and their deliveries: creating a conversation,
//! checking and posting a message, planning a delivery to each participant of a direct
//! conversation (one per message and agent: an ask's target gets only its invocation's),
//! consulting each agent a message mentions, and recording the attempts.
//!
//! Mentions: a conversational (`agent` class) message posted by a client, or an agent's
//! reply, consults every registered agent it mentions (`@name`, by the rules of
//! [`relay_protocol::domain::mention`]: not in code or quoted lines, and in a reply an
//! agent posts from its flight not a name the answered message mentioned unless the
//! reply addresses it; not its author; once each): an invocation (action `consult`,
//! requester the author, the message itself as its request, so the reply is posted in
//! reply to it) with its queued flight, and a `mention` delivery that the flight settles
//! as it starts (or fails). A message posted during a flight of its author's
//! (`meta.flight`: an agent's reply, or what it sends from its turn with its session's
//! token) makes the consults children of that flight, so the loop rules of an ask hold
//! ([`Ctx::loop_depth`]). A mention those rules refuse does not fail the post, which
//! stands: its delivery fails with the reason, Relay answers the message with a `system`
//! message saying why, and the post's answer lists it. The answer also lists the names
//! that are not agents and the mentions the rules skipped (with why), so no mention
//! turns into text unsaid. An invocation's task message (an ask) and machine-made
//! messages (`status`, `system`, `log`, `artifact`) consult nobody: their mentions are
//! text.

use relay_protocol::api::{MentionRefused, MentionSkipped, MessagePosted};
use relay_protocol::domain::{
    mention, parse_mentions, valid_conversation_id, Action, Agent, Conversation, ConversationKind,
    ConversationSpec, Delivery, DeliveryReason, DeliveryState, Flight, Harness, Invocation,
    MentionSkip, Message, MessageClass, PostMessage,
};
use relay_protocol::event::EventBody;

use super::Ctx;
use crate::broker::{new_id, Outcome};
use crate::error::{BadInput, BrokerError};
use crate::store::T;

impl Ctx<'_, '_> {
    pub(super) fn post_message(&mut self, post: &PostMessage) -> Result<Outcome, BrokerError> {
        let conversation = self.conversation(&post.conversation)?;
        self.check_post(post)?;
        // What an agent says from a flight continues that flight's chain: only the one it
        // is running (see `check_parent`).
        if let Some(flight) = &post.meta.flight {
            self.check_parent(&post.author, flight)?;
        }
        let message = self.post(conversation, post.clone(), None)?;
        Ok(Outcome::Posted(self.consult_mentions(message)?))
    }

    pub(super) fn create_conversation(
        &mut self,
        spec: &ConversationSpec,
    ) -> Result<Outcome, BrokerError> {
        if !valid_conversation_id(&spec.id) {
            return Err(BadInput::ConversationId(spec.id.clone()).into());
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
            return Err(BadInput::Empty(what).into());
        }
        Ok(())
    }

    fn check_post(&self, post: &PostMessage) -> Result<(), BrokerError> {
        self.check_text("message body", &post.body)?;
        if post.author.trim().is_empty() || post.author.len() > 128 {
            return Err(BadInput::Length("message author").into());
        }
        if let Some(reply_to) = &post.reply_to {
            if self.message_by_id(reply_to)?.is_none() {
                return Err(BrokerError::UnknownMessage(reply_to.clone()));
            }
        }
        Ok(())
    }

    /// Posts a checked message and plans its deliveries to the participants of a direct
    /// conversation: one delivery per participant and message. A mentioned one's is
    /// planned by its consult ([`Ctx::consult_mentions`]), and `asked`, the target of the
    /// ask whose task this message is, gets its invocation's: two deliveries of one message
    /// to one agent, settled together, were two events more per flight saying the same.
    pub(super) fn post(
        &mut self,
        conversation: Conversation,
        post: PostMessage,
        asked: Option<&str>,
    ) -> Result<Message, BrokerError> {
        let message = Message {
            // Its event's seq: the next, as nothing is emitted before it.
            id: crate::store::message_id(self.next_seq),
            conversation: conversation.spec.id.clone(),
            index: conversation.message_count,
            author: post.author,
            class: post.class,
            mentions: parse_mentions(&post.body),
            body: post.body,
            reply_to: post.reply_to,
            meta: post.meta,
            created_at: self.now,
        };
        let participants: Vec<String> = match conversation.spec.kind {
            ConversationKind::Direct => conversation
                .spec
                .participants
                .iter()
                .filter(|p| {
                    **p != message.author
                        && !message.mentions.contains(p)
                        && asked != Some(p.as_str())
                })
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        // The message alone: its conversation's count is its index plus one.
        self.emit(EventBody::MessagePosted {
            message: message.clone(),
            conversation: None,
        })?;
        for target in participants {
            // Only registered agents get deliveries.
            if let Some(agent) = self.tx.read::<Agent>(T::Agents, target.as_bytes())? {
                self.plan_delivery(&message.id, &agent, DeliveryReason::DirectMessage)?;
            }
        }
        Ok(message)
    }

    /// Consults every registered agent `message` mentions by the mention rules, other
    /// than its author: a planned `mention` delivery and a consult invocation with its
    /// queued flight each, or, when the loop rules refuse it, the delivery failed and a
    /// `system` answer saying why (see the module header). Returns the post's answer: the
    /// flights started, the refusals, the names that are not agents and the mentions
    /// the rules skipped.
    pub(super) fn consult_mentions(
        &mut self,
        message: Message,
    ) -> Result<MessagePosted, BrokerError> {
        let mut started = Vec::new();
        let mut refused = Vec::new();
        let mut unknown = Vec::new();
        let mut skipped = Vec::new();
        // Nothing to judge: not an agent's message, or one with no `@` at all (most
        // replies), whose flight and answered message need not be read (about 4 % of
        // the storage thread's time at 64 flights in flight).
        if message.class != MessageClass::Agent || !mention::may_mention(&message.body) {
            return Ok(MessagePosted {
                message,
                flights: started,
                refused,
                unknown,
                skipped,
            });
        }
        // Said by an agent during its own flight: the consults are that flight's children.
        let parent = match &message.meta.flight {
            Some(id) => self
                .tx
                .flight_without_output(id)?
                .filter(|f| f.agent == message.author)
                .map(|f| f.id),
            None => None,
        };
        // An agent's reply from its flight: the reply rule weighs what it repeats of
        // the message it answers.
        let answered = match (&parent, &message.reply_to) {
            (Some(_), Some(id)) => self.message_by_id(id)?.map(|m| m.body),
            _ => None,
        };
        for (name, skip) in mention::judge(&message.body, answered.as_deref()) {
            let agent = self.tx.read::<Agent>(T::Agents, name.as_bytes())?;
            let agent = match (skip, agent) {
                // Code and quotes are text: worth a word only when they name an agent
                // (a `@decorator` in a code block is no one's concern).
                (Some(reason @ (MentionSkip::Code | MentionSkip::Quote)), agent) => {
                    if agent.is_some() && name != message.author {
                        skipped.push(MentionSkipped { name, reason });
                    }
                    continue;
                }
                _ if name == message.author => {
                    skipped.push(MentionSkipped {
                        name,
                        reason: MentionSkip::Author,
                    });
                    continue;
                }
                (_, None) => {
                    unknown.push(name);
                    continue;
                }
                (Some(reason), Some(_)) => {
                    skipped.push(MentionSkipped { name, reason });
                    continue;
                }
                (None, Some(agent)) => agent,
            };
            let name = &name;
            let delivery = self.plan_delivery(&message.id, &agent, DeliveryReason::Mention)?;
            let depth = match self
                .may_invoke(&message.author, &agent)
                .and_then(|()| self.loop_depth(name, parent.as_deref()))
                .and_then(|d| self.check_budget(&agent, parent.as_deref()).map(|()| d))
            {
                Ok(depth) => depth,
                Err(
                    e @ (BrokerError::Cycle { .. }
                    | BrokerError::SelfAsk { .. }
                    | BrokerError::DepthLimit { .. }
                    | BrokerError::NotAllowed { .. }
                    | BrokerError::AgentQueueFull { .. }
                    | BrokerError::BudgetExceeded { .. }),
                ) => {
                    let why = format!("{name} was not consulted: {e}");
                    self.settle_delivery(&delivery, Err(why.clone()))?;
                    let conversation = self.conversation(&message.conversation)?;
                    self.post(
                        conversation,
                        PostMessage {
                            conversation: message.conversation.clone(),
                            author: RELAY_AUTHOR.into(),
                            body: why.into(),
                            class: MessageClass::System,
                            reply_to: Some(message.id.clone()),
                            meta: Default::default(),
                        },
                        None,
                    )?;
                    refused.push(MentionRefused {
                        agent: name.clone(),
                        error: e.to_api(),
                    });
                    continue;
                }
                Err(e) => return Err(e),
            };
            let invocation = Invocation {
                id: new_id("inv"),
                requester: message.author.clone(),
                target: name.clone(),
                action: Action::Consult,
                task: mention_task(&message),
                conversation: message.conversation.clone(),
                request_message: message.id.clone(),
                parent_flight: parent.clone(),
                depth,
                timeout_ms: None,
                created_at: self.now,
            };
            started.push(self.create_invocation(invocation, new_id("flt"))?.flight);
        }
        Ok(MessagePosted {
            message,
            flights: started,
            refused,
            unknown,
            skipped,
        })
    }

    /// The message with id `id`, if there is one: posted in this batch (not in the log
    /// yet), or read from the log.
    fn message_by_id(&self, id: &str) -> Result<Option<Message>, BrokerError> {
        let in_batch = self.events.iter().rev().find_map(|(e, _)| match &e.body {
            relay_protocol::event::EventBody::MessagePosted { message, .. } if message.id == id => {
                Some(message.clone())
            }
            _ => None,
        });
        match in_batch {
            Some(m) => Ok(Some(m)),
            None => self.tx.message(id),
        }
    }

    /// Plans a delivery (once: its id is deterministic) and returns its id.
    pub(super) fn plan_delivery(
        &mut self,
        message: &str,
        agent: &Agent,
        reason: DeliveryReason,
    ) -> Result<String, BrokerError> {
        let transport = agent.spec.harness;
        let id = relay_protocol::domain::delivery_id(message, &agent.spec.name, reason, transport);
        self.planned
            .push((message.into(), agent.spec.name.clone(), id.clone()));
        if self.tx.contains(T::Deliveries, id.as_bytes())? {
            return Ok(id);
        }
        self.emit(EventBody::DeliveryPlanned {
            delivery: Delivery {
                id: id.clone(),
                message: message.into(),
                target: agent.spec.name.clone(),
                reason,
                transport,
                state: DeliveryState::Pending,
                attempts: vec![],
            },
        })?;
        Ok(id)
    }

    /// Records the attempt on the pending deliveries of a flight's task (its request
    /// message) to its agent: delivered once the turn runs, failed if the flight ended
    /// before. Those planned while this broker ran are kept with the flight (one read
    /// each); for the others, every id the task may have is read.
    pub(super) fn attempt_deliveries(
        &mut self,
        flight: &Flight,
        outcome: Result<(), String>,
    ) -> Result<(), BrokerError> {
        // Planned while this broker ran: their ids are kept with the flight.
        if let Some(mut kept) = self.kept(&flight.id) {
            if let Some(ids) = kept.deliveries.replace(Vec::new()) {
                for id in &ids {
                    self.settle_delivery(id, outcome.clone())?;
                }
                self.streaming_delta.insert(flight.id.clone(), Some(kept));
                return Ok(());
            }
        }
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
            self.settle_delivery(&id, outcome.clone())?;
        }
        Ok(())
    }

    /// Records the one attempt of delivery `id` if it is planned and still pending:
    /// delivered, or failed with the reason.
    fn settle_delivery(
        &mut self,
        id: &str,
        outcome: Result<(), String>,
    ) -> Result<(), BrokerError> {
        let Some(mut delivery) = self.tx.read::<Delivery>(T::Deliveries, id.as_bytes())? else {
            return Ok(());
        };
        if delivery.state != DeliveryState::Pending {
            return Ok(());
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
                error: outcome.err(),
            });
        self.emit(EventBody::DeliveryAttempted { delivery })
    }
}

/// Who Relay's own messages are from (a refused mention's answer).
const RELAY_AUTHOR: &str = relay_protocol::domain::decider::RELAY_AUTHOR;

/// A mentioned agent's task: the message, with who said it and where, since the agent
/// sees only its task (the conversation is not in its session).
fn mention_task(message: &Message) -> String {
    format!(
        "{} mentioned you in conversation {} (message {}); your answer is posted there, in reply to it:\n\n{}",
        message.author, message.conversation, message.id, message.body
    )
}
