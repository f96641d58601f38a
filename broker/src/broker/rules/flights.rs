//! The rules of invocations and flights: an invocation (its depth and cycle checks, its
//! conversation, its request message and its queued flight; the loop rules and the
//! record of a new invocation serve a mention's consult too, see `messages.rs`), and
//! every update of a flight: whether it may happen (state transitions, a flight that
//! ended, the output cap, the same session or commit again), the reply it posts, and the
//! consults that reply's mentions start. The flight after an update is the protocol's
//! fold ([`Flight::apply`]), the one every reader of the updates uses too. A usage change
//! is costed and checked against its agent's budget in `budgets.rs`.

use relay_protocol::api::{InvokeAccepted, UpdateResult};
use relay_protocol::domain::{
    cap_files, id_token, streamed_bytes, truncate_bytes, Agent, ConversationKind, ConversationSpec,
    DeliveryReason, Flight, FlightChange, FlightState, FlightUpdate, Invocation, InvokeRequest,
    Message, MessageClass, MessageMeta, Note, PostMessage, SharedStr, MAX_LISTED_FILES,
    MAX_RECORDED_PATCH,
};
use relay_protocol::event::EventBody;

use super::Ctx;
use crate::broker::{new_id, Outcome};
use crate::error::{BadInput, BrokerError};
use crate::store::T;

impl Ctx<'_, '_> {
    pub(super) fn invoke(&mut self, req: &InvokeRequest) -> Result<Outcome, BrokerError> {
        let agent = self.agent(&req.target)?;
        self.check_text("task", &req.task)?;
        if req.requester.trim().is_empty() || req.requester.len() > 128 {
            return Err(BadInput::Length("requester").into());
        }
        // Asking oneself is refused whether or not a flight runs (a loop of one).
        if req.requester == req.target {
            return Err(BrokerError::SelfAsk {
                agent: req.target.clone(),
            });
        }
        if let Some(parent) = &req.parent_flight {
            self.check_parent(&req.requester, parent)?;
        }
        self.may_invoke(&req.requester, &agent)?;
        let depth = self.loop_depth(&req.target, req.parent_flight.as_deref())?;
        self.check_budget(&agent, req.parent_flight.as_deref())?;
        let conversation = match &req.conversation {
            Some(id) => self.conversation(id)?,
            None => {
                let (a, b) = if req.requester <= req.target {
                    (&req.requester, &req.target)
                } else {
                    (&req.target, &req.requester)
                };
                let id = format!("direct.{}.{}", id_token(a), id_token(b));
                match self.tx.conversation(&id)? {
                    Some(c) => c,
                    None => match self.create_conversation(&ConversationSpec {
                        id,
                        kind: ConversationKind::Direct,
                        title: None,
                        participants: vec![a.clone(), b.clone()],
                        parent: None,
                    })? {
                        Outcome::Conversation(c) => c,
                        _ => return Err(BrokerError::Internal("conversation".into())),
                    },
                }
            }
        };
        let invocation_id = new_id("inv");
        let flight_id = new_id("flt");
        let request = self.post(
            conversation.clone(),
            PostMessage {
                conversation: conversation.spec.id.clone(),
                author: req.requester.clone(),
                body: req.task.as_str().into(),
                class: MessageClass::Agent,
                reply_to: None,
                meta: MessageMeta {
                    invocation: Some(invocation_id.clone()),
                    flight: Some(flight_id.clone()),
                    harness: Some(agent.spec.harness),
                    ..Default::default()
                },
            },
            Some(&req.target),
        )?;
        self.plan_delivery(&request.id, &agent, DeliveryReason::Invocation)?;
        let invocation = Invocation {
            id: invocation_id,
            requester: req.requester.clone(),
            target: req.target.clone(),
            action: req.action,
            task: req.task.clone(),
            conversation: conversation.spec.id.clone(),
            request_message: request.id,
            parent_flight: req.parent_flight.clone(),
            depth,
            timeout_ms: req.timeout_ms,
            created_at: self.now,
        };
        Ok(Outcome::Invoked(
            self.create_invocation(invocation, flight_id)?,
        ))
    }

    /// Whether `requester` may invoke `target` now: the target's allow list names it
    /// ([`AgentSpec::allows`](relay_protocol::domain::AgentSpec::allows); a requester that
    /// is no registered agent is the operator), and the target's queue has room (else
    /// `overloaded`, with nothing written). Shared by an ask and a mention.
    pub(super) fn may_invoke(&self, requester: &str, target: &Agent) -> Result<(), BrokerError> {
        let is_agent = self.tx.contains(T::Agents, requester.as_bytes())?;
        if !target.spec.allows(requester, is_agent) {
            let allowed = target.spec.allowed_from();
            return Err(BrokerError::NotAllowed {
                requester: requester.to_string(),
                target: target.spec.name.clone(),
                allowed: allowed
                    .iter()
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let name = &target.spec.name;
        let delta = self.live_delta.get(name).copied().unwrap_or(0);
        let live = (self.live.get(name) as i64 + delta).max(0) as u64;
        // Its turn and a full queue behind it.
        if live > self.config.agent_queue as u64 {
            return Err(BrokerError::AgentQueueFull {
                agent: name.clone(),
                live,
                limit: self.config.agent_queue,
            });
        }
        Ok(())
    }

    /// An agent links what it asks only to the flight it is running (or waiting in, for
    /// an approval): a flight of its still queued would let it start a chain outside the
    /// loop rules, one of another agent's would speak for that agent. A requester that
    /// is no agent (the operator) may name any flight its chain should continue.
    pub(super) fn check_parent(&self, requester: &str, parent: &str) -> Result<(), BrokerError> {
        if !self.tx.contains(T::Agents, requester.as_bytes())? {
            return Ok(());
        }
        let flight = self.flight(parent)?;
        let what = if flight.agent != requester {
            format!("agent {:?}'s", flight.agent)
        } else if !matches!(flight.state, FlightState::Running | FlightState::Waiting) {
            flight.state.to_string()
        } else {
            return Ok(());
        };
        Err(BrokerError::ParentNotRunning {
            agent: requester.to_string(),
            flight: parent.to_string(),
            what,
        })
    }

    /// The loop rules of an invocation of `target` made from flight `parent`: its depth
    /// (0 without a parent, the parent's + 1), refused when `target` runs `parent` itself
    /// (asking oneself), works on a flight of the chain already (a cycle), or when deeper
    /// than the limit. Shared by an ask
    /// and a mention, so neither can start a loop the other would have stopped.
    pub(super) fn loop_depth(
        &self,
        target: &str,
        parent: Option<&str>,
    ) -> Result<u32, BrokerError> {
        let Some(parent) = parent else {
            return Ok(0);
        };
        let mut depth = 1u32;
        let mut cursor = Some(parent.to_string());
        while let Some(id) = cursor {
            let f = self.flight_head(&id)?;
            if f.agent == target && id == parent {
                return Err(BrokerError::SelfAsk {
                    agent: target.to_string(),
                });
            }
            if f.agent == target {
                return Err(BrokerError::Cycle {
                    agent: target.to_string(),
                });
            }
            cursor = f.parent_flight;
            if cursor.is_some() {
                depth += 1;
            }
        }
        if depth > self.config.max_depth {
            return Err(BrokerError::DepthLimit {
                depth,
                limit: self.config.max_depth,
            });
        }
        Ok(depth)
    }

    /// Records an invocation with its flight, `queued`: the one place both are made (an
    /// ask, a mention). The dispatcher sends the flight to its agent's runtime when it
    /// reads this event (at start too, while the flight is still queued).
    pub(super) fn create_invocation(
        &mut self,
        invocation: Invocation,
        flight_id: String,
    ) -> Result<InvokeAccepted, BrokerError> {
        let mut flight = Flight::queued(flight_id, &invocation);
        flight.root_flight = self.root_of(invocation.parent_flight.as_deref())?;
        self.emit(EventBody::InvocationCreated {
            invocation: invocation.clone(),
            flight: flight.clone(),
        })?;
        Ok(InvokeAccepted { invocation, flight })
    }

    pub(super) fn update_flight(
        &mut self,
        flight_id: &str,
        change: &FlightChange,
    ) -> Result<Outcome, BrokerError> {
        // The patch is kept in the log with its update and goes out with every copy of
        // it (watch, SSE, NATS): bounded here whoever sent it, as the runtime bounds it.
        // So is its list of files.
        if let FlightChange::Commit { commit } = change {
            let long_patch = commit
                .patch
                .as_ref()
                .is_some_and(|p| p.len() > MAX_RECORDED_PATCH);
            if long_patch || commit.files.len() > MAX_LISTED_FILES {
                let mut bounded = (**commit).clone();
                if let Some(p) = bounded.patch.as_mut().filter(|_| long_patch) {
                    truncate_bytes(p, MAX_RECORDED_PATCH);
                    bounded.patch_truncated = true;
                }
                bounded.more_files += cap_files(&mut bounded.files);
                let bounded = FlightChange::Commit {
                    commit: Box::new(bounded),
                };
                return self.update_flight(flight_id, &bounded);
            }
        }
        let mut flight = self.flight(flight_id)?;
        let unchanged = |flight: Flight| {
            Ok(Outcome::Flight(UpdateResult {
                applied: false,
                flight,
            }))
        };
        // First whether the change may happen at all (the fold, `Flight::apply`, applies
        // what was recorded and checks nothing).
        if let FlightChange::State { to, .. } = change {
            if flight.state == *to {
                // The same state again (a retry, a replayed report): nothing new.
                return unchanged(flight);
            }
        }
        // What a flight did to its agent's worktree is recorded whenever it is known:
        // also after the flight ended (a commit made after a restart, a revert). The same
        // commit again (a report replayed after a restart) changes nothing.
        let worktree_change = matches!(
            change,
            FlightChange::Commit { .. } | FlightChange::Reverted { .. }
        );
        match change {
            FlightChange::Commit { commit } => {
                let mut kept = (**commit).clone();
                kept.patch = None;
                kept.reverted_by = flight.commit.as_ref().and_then(|c| c.reverted_by.clone());
                if flight.commit.as_ref() == Some(&kept) {
                    return unchanged(flight);
                }
            }
            FlightChange::Reverted { revert } => {
                let Some(commit) = flight.commit.as_ref() else {
                    return Err(BrokerError::Invalid(format!(
                        "flight {} has no commit to revert",
                        flight.id
                    )));
                };
                if commit.reverted_by.as_ref() == Some(revert) {
                    return unchanged(flight);
                }
            }
            _ => {}
        }
        // Usage too: a turn ended by its budget still reports what it used.
        let late = worktree_change || matches!(change, FlightChange::Usage(_));
        if flight.state.is_terminal() && !late {
            return Err(BrokerError::FlightTerminal {
                flight: flight.id,
                state: flight.state,
            });
        }
        let cap = self.config.max_flight_output;
        if flight.output_bytes.saturating_add(streamed_bytes(change)) > cap {
            return self.cap_output(flight, change, cap);
        }
        let mut reply: Option<SharedStr> = None;
        // The task reached the agent (its turn runs) or never will (ended before).
        let mut delivered: Option<Result<(), String>> = None;
        match change {
            FlightChange::State { to, reason, output } => {
                if !flight.state.can_transition(*to) {
                    return Err(BrokerError::IllegalTransition {
                        flight: flight.id,
                        from: flight.state,
                        to: *to,
                    });
                }
                if matches!(flight.state, FlightState::Queued | FlightState::Waking) {
                    delivered = match to {
                        FlightState::Running | FlightState::Waiting | FlightState::Completed => {
                            Some(Ok(()))
                        }
                        FlightState::Failed | FlightState::Cancelled => Some(Err(reason
                            .clone()
                            .unwrap_or_else(|| format!("the flight was {to} before its turn")))),
                        FlightState::Queued | FlightState::Waking => None,
                    };
                }
                if *to == FlightState::Completed {
                    reply = output.clone().filter(|t| !t.trim().is_empty());
                }
            }
            // The ids it has already: nothing new.
            FlightChange::Session { thread_id, turn_id }
                if (thread_id.is_none() || thread_id == &flight.thread_id)
                    && (turn_id.is_none() || turn_id == &flight.turn_id) =>
            {
                return unchanged(flight);
            }
            _ => {}
        }
        // The reply is posted before the completion is recorded (its event comes first),
        // with the ids of the turn that made it (a state change moves none of them).
        let reply_message = match reply {
            Some(text) => Some(self.post_reply(&flight, text)?),
            None => None,
        };
        // A damaged record may hold the largest seq: refuse rather than wrap or panic.
        let seq = flight.update_seq.checked_add(1).ok_or_else(|| {
            BrokerError::Corrupt(format!(
                "flight {} has the largest update seq; no update can follow it (run `relay doctor`)",
                flight.id
            ))
        })?;
        let update = FlightUpdate {
            flight: flight.id.clone(),
            agent: flight.agent.clone(),
            seq,
            at: self.now,
            change: change.clone(),
        };
        // Whether the last update was streamed text is kept by the writer, not in the
        // record.
        let last_was_delta =
            matches!(change, FlightChange::Delta { .. }) && self.last_was_delta(&flight)?;
        flight.apply_recorded(
            &update,
            reply_message.as_ref().map(|m| m.id.as_str()),
            last_was_delta,
        );
        self.emit(EventBody::FlightUpdated {
            update,
            flight: flight.clone(),
        })?;
        if let Some(outcome) = delivered {
            self.attempt_deliveries(&flight, outcome)?;
        }
        if let (FlightChange::Note { .. }, Some(note)) = (change, &flight.note) {
            self.agent_noted(&flight.agent, note, &flight.id)?;
        }
        // The agents its reply mentions are consulted, as children of this flight (once
        // it is recorded as completed).
        if let Some(message) = reply_message {
            self.consult_mentions(message)?;
        }
        Ok(Outcome::Flight(UpdateResult {
            applied: true,
            flight,
        }))
    }
}

impl Ctx<'_, '_> {
    /// Posts `text`, the answer of `flight`'s turn, in the conversation it was asked in,
    /// as a reply to the request.
    fn post_reply(&mut self, flight: &Flight, text: SharedStr) -> Result<Message, BrokerError> {
        let invocation: Invocation = self
            .tx
            .read(T::Invocations, flight.invocation.as_bytes())?
            .ok_or_else(|| {
                BrokerError::Corrupt(format!("flight {} has no invocation", flight.id))
            })?;
        let conversation = self.conversation(&invocation.conversation)?;
        let harness = self
            .tx
            .read::<Agent>(T::Agents, flight.agent.as_bytes())?
            .map(|a| a.spec.harness);
        self.post(
            conversation,
            PostMessage {
                conversation: invocation.conversation.clone(),
                author: flight.agent.clone(),
                body: text,
                class: MessageClass::Agent,
                reply_to: Some(invocation.request_message.clone()),
                meta: MessageMeta {
                    invocation: Some(invocation.id.clone()),
                    flight: Some(flight.id.clone()),
                    harness,
                    thread_id: flight.thread_id.clone(),
                    turn_id: flight.turn_id.clone(),
                },
            },
            None,
        )
    }

    /// A change that would take `flight` past the output cap: what of streamed text or
    /// command output still fits is kept (so nothing before the cap is lost), then the
    /// flight fails naming the cap. The plane interrupts its turn when it sees a flight
    /// ended by a change that was not a state change.
    fn cap_output(
        &mut self,
        flight: Flight,
        change: &FlightChange,
        cap: u64,
    ) -> Result<Outcome, BrokerError> {
        let room = usize::try_from(cap.saturating_sub(flight.output_bytes)).unwrap_or(usize::MAX);
        let fits = |text: &str| {
            let mut end = room.min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text[..end].to_string()
        };
        let head = match change {
            FlightChange::Delta { text } => Some(FlightChange::Delta { text: fits(text) }),
            FlightChange::CommandOutput { item_id, text } => Some(FlightChange::CommandOutput {
                item_id: item_id.clone(),
                text: fits(text),
            }),
            _ => None,
        };
        if let Some(head) = head.filter(|h| streamed_bytes(h) > 0) {
            self.update_flight(&flight.id, &head)?;
        }
        let reason = format!(
            "the flight's output passed the cap of {cap} bytes per flight (relay up --max-flight-output); what it streamed before the cap is kept, and its turn was interrupted"
        );
        tracing::warn!(flight = %flight.id, agent = %flight.agent, cap, "a flight passed the output cap; it fails");
        self.update_flight(
            &flight.id,
            &FlightChange::State {
                to: FlightState::Failed,
                reason: Some(reason),
                output: None,
            },
        )
    }

    /// Keeps a flight's note as its agent's latest (an agent removed since keeps none).
    fn agent_noted(&mut self, agent: &str, note: &Note, flight: &str) -> Result<(), BrokerError> {
        let Some(mut agent) = self.tx.read::<Agent>(T::Agents, agent.as_bytes())? else {
            return Ok(());
        };
        agent.note = Some(Note {
            flight: Some(flight.to_string()),
            ..note.clone()
        });
        agent.updated_at = self.now;
        self.emit(EventBody::AgentUpdated { agent })
    }
}
