//! Conversions between the serde domain types ([`crate::domain`], [`crate::api`]) and the
//! protobuf types of [`crate::pb`].
//!
//! `*_to_pb` never fails: every domain value has a protobuf form. `*_from_pb` checks what
//! protobuf cannot: an enum field that is `*_UNSPECIFIED` or an integer this build does
//! not know, a missing `oneof`, an unknown item phase. Those are a [`ConvertError`], which
//! the broker answers as `invalid_request`. Emptiness of required strings (task, author,
//! body, conversation) is not checked here: the broker validates requests the same way
//! whichever interface they came from.

use crate::api::ApiError;
use crate::domain::{
    Action, Approval, ApprovalDecision, ApprovalKind, ApprovalState, Flight, FlightChange,
    FlightState, FlightUpdate, Harness, InvokeRequest, ItemPhase, Message, MessageClass,
    MessageMeta, PostMessage,
};
use crate::pb;
use crate::pb::flight_update::Change;

/// A protobuf message that has no domain form (bad enum value, missing `oneof`...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertError(pub String);

impl std::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConvertError {}

fn invalid(what: &str, v: i32) -> ConvertError {
    ConvertError(format!("{what} {v} is not valid"))
}

// ---- enums ----

pub fn harness_to_pb(h: Harness) -> pb::Harness {
    match h {
        Harness::CodexAppServer => pb::Harness::CodexAppServer,
        Harness::ClaudeStreamJson => pb::Harness::ClaudeStreamJson,
        Harness::PiRpc => pb::Harness::PiRpc,
        Harness::Tmux => pb::Harness::Tmux,
    }
}

fn harness_from_pb(v: i32) -> Result<Harness, ConvertError> {
    match pb::Harness::try_from(v) {
        Ok(pb::Harness::CodexAppServer) => Ok(Harness::CodexAppServer),
        Ok(pb::Harness::ClaudeStreamJson) => Ok(Harness::ClaudeStreamJson),
        Ok(pb::Harness::PiRpc) => Ok(Harness::PiRpc),
        Ok(pb::Harness::Tmux) => Ok(Harness::Tmux),
        Ok(pb::Harness::Unspecified) | Err(_) => Err(invalid("harness", v)),
    }
}

pub fn flight_state_to_pb(s: FlightState) -> pb::FlightState {
    match s {
        FlightState::Queued => pb::FlightState::Queued,
        FlightState::Waking => pb::FlightState::Waking,
        FlightState::Running => pb::FlightState::Running,
        FlightState::Waiting => pb::FlightState::Waiting,
        FlightState::Completed => pb::FlightState::Completed,
        FlightState::Failed => pb::FlightState::Failed,
        FlightState::Cancelled => pb::FlightState::Cancelled,
    }
}

/// `None` for `FLIGHT_STATE_UNSPECIFIED` and for integers this build does not know.
pub fn flight_state_from_pb(v: i32) -> Option<FlightState> {
    match pb::FlightState::try_from(v).ok()? {
        pb::FlightState::Unspecified => None,
        pb::FlightState::Queued => Some(FlightState::Queued),
        pb::FlightState::Waking => Some(FlightState::Waking),
        pb::FlightState::Running => Some(FlightState::Running),
        pb::FlightState::Waiting => Some(FlightState::Waiting),
        pb::FlightState::Completed => Some(FlightState::Completed),
        pb::FlightState::Failed => Some(FlightState::Failed),
        pb::FlightState::Cancelled => Some(FlightState::Cancelled),
    }
}

fn flight_state_required(v: i32) -> Result<FlightState, ConvertError> {
    flight_state_from_pb(v).ok_or_else(|| invalid("flight state", v))
}

fn action_to_pb(a: Action) -> pb::Action {
    match a {
        Action::Consult => pb::Action::Consult,
        Action::Execute => pb::Action::Execute,
    }
}

fn action_from_pb(v: i32) -> Result<Action, ConvertError> {
    match pb::Action::try_from(v) {
        Ok(pb::Action::Consult) => Ok(Action::Consult),
        Ok(pb::Action::Execute) => Ok(Action::Execute),
        Err(_) => Err(invalid("action", v)),
    }
}

fn class_to_pb(c: MessageClass) -> pb::MessageClass {
    match c {
        MessageClass::Agent => pb::MessageClass::Agent,
        MessageClass::Status => pb::MessageClass::Status,
        MessageClass::System => pb::MessageClass::System,
        MessageClass::Log => pb::MessageClass::Log,
        MessageClass::Artifact => pb::MessageClass::Artifact,
    }
}

fn class_from_pb(v: i32) -> Result<MessageClass, ConvertError> {
    match pb::MessageClass::try_from(v) {
        Ok(pb::MessageClass::Agent) => Ok(MessageClass::Agent),
        Ok(pb::MessageClass::Status) => Ok(MessageClass::Status),
        Ok(pb::MessageClass::System) => Ok(MessageClass::System),
        Ok(pb::MessageClass::Log) => Ok(MessageClass::Log),
        Ok(pb::MessageClass::Artifact) => Ok(MessageClass::Artifact),
        Err(_) => Err(invalid("message class", v)),
    }
}

pub fn decision_to_pb(d: ApprovalDecision) -> pb::ApprovalDecision {
    match d {
        ApprovalDecision::Accept => pb::ApprovalDecision::Accept,
        ApprovalDecision::AcceptForSession => pb::ApprovalDecision::AcceptForSession,
        ApprovalDecision::Decline => pb::ApprovalDecision::Decline,
        ApprovalDecision::Cancel => pb::ApprovalDecision::Cancel,
    }
}

pub fn decision_from_pb(v: i32) -> Result<ApprovalDecision, ConvertError> {
    match pb::ApprovalDecision::try_from(v) {
        Ok(pb::ApprovalDecision::Accept) => Ok(ApprovalDecision::Accept),
        Ok(pb::ApprovalDecision::AcceptForSession) => Ok(ApprovalDecision::AcceptForSession),
        Ok(pb::ApprovalDecision::Decline) => Ok(ApprovalDecision::Decline),
        Ok(pb::ApprovalDecision::Cancel) => Ok(ApprovalDecision::Cancel),
        Ok(pb::ApprovalDecision::Unspecified) | Err(_) => Err(invalid("approval decision", v)),
    }
}

fn phase_to_pb(p: ItemPhase) -> &'static str {
    match p {
        ItemPhase::Started => "started",
        ItemPhase::Completed => "completed",
    }
}

fn phase_from_pb(s: &str) -> Result<ItemPhase, ConvertError> {
    match s {
        "started" => Ok(ItemPhase::Started),
        "completed" => Ok(ItemPhase::Completed),
        _ => Err(ConvertError(format!(
            "item phase {s:?} is not valid; expected \"started\" or \"completed\""
        ))),
    }
}

// ---- flights ----

pub fn flight_to_pb(f: &Flight) -> pb::Flight {
    pb::Flight {
        id: f.id.clone(),
        invocation: f.invocation.clone(),
        agent: f.agent.clone(),
        state: flight_state_to_pb(f.state) as i32,
        summary: f.summary.clone(),
        output: f.output.clone(),
        error: f.error.clone(),
        update_seq: f.update_seq,
        thread_id: f.thread_id.clone(),
        turn_id: f.turn_id.clone(),
        parent_flight: f.parent_flight.clone(),
        conversation: f.conversation.clone(),
        reply_message: f.reply_message.clone(),
        created_at: f.created_at,
        updated_at: f.updated_at,
    }
}

pub fn flight_from_pb(f: &pb::Flight) -> Result<Flight, ConvertError> {
    Ok(Flight {
        id: f.id.clone(),
        invocation: f.invocation.clone(),
        agent: f.agent.clone(),
        state: flight_state_required(f.state)?,
        summary: f.summary.clone(),
        output: f.output.clone(),
        error: f.error.clone(),
        update_seq: f.update_seq,
        thread_id: f.thread_id.clone(),
        turn_id: f.turn_id.clone(),
        parent_flight: f.parent_flight.clone(),
        conversation: f.conversation.clone(),
        reply_message: f.reply_message.clone(),
        created_at: f.created_at,
        updated_at: f.updated_at,
    })
}

fn change_to_pb(c: &FlightChange) -> Change {
    match c {
        FlightChange::State { to, reason, output } => Change::State(pb::StateChange {
            to: flight_state_to_pb(*to) as i32,
            reason: reason.clone(),
            output: output.clone(),
        }),
        FlightChange::Delta { text } => Change::Delta(pb::Delta { text: text.clone() }),
        FlightChange::Item {
            item_id,
            item_kind,
            phase,
            text,
        } => Change::Item(pb::Item {
            item_id: item_id.clone(),
            item_kind: item_kind.clone(),
            phase: phase_to_pb(*phase).to_string(),
            text: text.clone(),
        }),
        FlightChange::CommandOutput { item_id, text } => Change::CommandOutput(pb::CommandOutput {
            item_id: item_id.clone(),
            text: text.clone(),
        }),
        FlightChange::Plan { text } => Change::Plan(pb::Text { text: text.clone() }),
        FlightChange::Diff { text } => Change::Diff(pb::Text { text: text.clone() }),
        FlightChange::Usage {
            input_tokens,
            output_tokens,
        } => Change::Usage(pb::Usage {
            input_tokens: *input_tokens,
            output_tokens: *output_tokens,
        }),
        FlightChange::Session { thread_id, turn_id } => Change::Session(pb::Session {
            thread_id: thread_id.clone(),
            turn_id: turn_id.clone(),
        }),
        FlightChange::Note { text } => Change::Note(pb::Text { text: text.clone() }),
    }
}

fn change_from_pb(c: &Change) -> Result<FlightChange, ConvertError> {
    Ok(match c {
        Change::State(s) => FlightChange::State {
            to: flight_state_required(s.to)?,
            reason: s.reason.clone(),
            output: s.output.clone(),
        },
        Change::Delta(d) => FlightChange::Delta {
            text: d.text.clone(),
        },
        Change::Item(i) => FlightChange::Item {
            item_id: i.item_id.clone(),
            item_kind: i.item_kind.clone(),
            phase: phase_from_pb(&i.phase)?,
            text: i.text.clone(),
        },
        Change::CommandOutput(o) => FlightChange::CommandOutput {
            item_id: o.item_id.clone(),
            text: o.text.clone(),
        },
        Change::Plan(t) => FlightChange::Plan {
            text: t.text.clone(),
        },
        Change::Diff(t) => FlightChange::Diff {
            text: t.text.clone(),
        },
        Change::Usage(u) => FlightChange::Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
        },
        Change::Session(s) => FlightChange::Session {
            thread_id: s.thread_id.clone(),
            turn_id: s.turn_id.clone(),
        },
        Change::Note(t) => FlightChange::Note {
            text: t.text.clone(),
        },
    })
}

/// The update as published: the change plus the flight as it is after it.
pub fn update_to_pb(u: &FlightUpdate, flight_after: &Flight) -> pb::FlightUpdate {
    pb::FlightUpdate {
        flight: u.flight.clone(),
        agent: u.agent.clone(),
        seq: u.seq,
        at: u.at,
        flight_after: Some(flight_to_pb(flight_after)),
        change: Some(change_to_pb(&u.change)),
    }
}

/// The update and, when the message carries it, the flight after it.
pub fn update_from_pb(
    u: &pb::FlightUpdate,
) -> Result<(FlightUpdate, Option<Flight>), ConvertError> {
    let change = u
        .change
        .as_ref()
        .ok_or_else(|| ConvertError("flight update has no change".to_string()))?;
    let update = FlightUpdate {
        flight: u.flight.clone(),
        agent: u.agent.clone(),
        seq: u.seq,
        at: u.at,
        change: change_from_pb(change)?,
    };
    let after = u.flight_after.as_ref().map(flight_from_pb).transpose()?;
    Ok((update, after))
}

// ---- messages ----

fn meta_to_pb(m: &MessageMeta) -> Option<pb::MessageMeta> {
    if m.is_empty() {
        return None;
    }
    Some(pb::MessageMeta {
        invocation: m.invocation.clone(),
        flight: m.flight.clone(),
        harness: m.harness.map(|h| harness_to_pb(h) as i32),
        thread_id: m.thread_id.clone(),
        turn_id: m.turn_id.clone(),
    })
}

fn meta_from_pb(m: Option<&pb::MessageMeta>) -> Result<MessageMeta, ConvertError> {
    let Some(m) = m else {
        return Ok(MessageMeta::default());
    };
    Ok(MessageMeta {
        invocation: m.invocation.clone(),
        flight: m.flight.clone(),
        harness: m.harness.map(harness_from_pb).transpose()?,
        thread_id: m.thread_id.clone(),
        turn_id: m.turn_id.clone(),
    })
}

/// An empty [`MessageMeta`] is sent as an absent `meta`.
pub fn message_to_pb(m: &Message) -> pb::Message {
    pb::Message {
        id: m.id.clone(),
        conversation: m.conversation.clone(),
        index: m.index,
        author: m.author.clone(),
        class: class_to_pb(m.class) as i32,
        body: m.body.clone(),
        mentions: m.mentions.clone(),
        reply_to: m.reply_to.clone(),
        meta: meta_to_pb(&m.meta),
        created_at: m.created_at,
    }
}

pub fn message_from_pb(m: &pb::Message) -> Result<Message, ConvertError> {
    Ok(Message {
        id: m.id.clone(),
        conversation: m.conversation.clone(),
        index: m.index,
        author: m.author.clone(),
        class: class_from_pb(m.class)?,
        body: m.body.clone(),
        mentions: m.mentions.clone(),
        reply_to: m.reply_to.clone(),
        meta: meta_from_pb(m.meta.as_ref())?,
        created_at: m.created_at,
    })
}

/// The protobuf request has no `meta`: messages posted over NATS carry none.
pub fn post_from_pb(p: &pb::PostMessage) -> Result<PostMessage, ConvertError> {
    Ok(PostMessage {
        conversation: p.conversation.clone(),
        author: p.author.clone(),
        body: p.body.clone(),
        class: class_from_pb(p.class)?,
        reply_to: p.reply_to.clone(),
        meta: MessageMeta::default(),
    })
}

// ---- approvals ----

/// `decision` is `APPROVAL_DECISION_UNSPECIFIED` while the approval is undecided.
pub fn approval_to_pb(a: &Approval) -> pb::Approval {
    let kind = match a.request.kind {
        ApprovalKind::Command => "command",
        ApprovalKind::FileChange => "file_change",
        ApprovalKind::Other => "other",
    };
    let state = match a.state {
        ApprovalState::Pending => "pending",
        ApprovalState::Decided => "decided",
        ApprovalState::Expired => "expired",
    };
    pb::Approval {
        id: a.id.clone(),
        agent: a.agent.clone(),
        flight: a.request.flight.clone(),
        kind: kind.to_string(),
        detail: a.request.detail.clone(),
        reason: a.request.reason.clone(),
        state: state.to_string(),
        decision: a
            .decision
            .map_or(pb::ApprovalDecision::Unspecified, decision_to_pb) as i32,
        decided_by: a.decided_by.clone(),
        created_at: a.created_at,
        decided_at: a.decided_at,
    }
}

// ---- invocations ----

/// `target` comes from the subject (`relay.v1.invoke.<agent>`). An empty `requester`
/// becomes `operator`, as an absent one does in the JSON form (proto3 cannot tell absent
/// from empty).
pub fn invoke_request_from_pb(
    target: &str,
    r: &pb::InvokeRequest,
) -> Result<InvokeRequest, ConvertError> {
    let requester = if r.requester.is_empty() {
        "operator".to_string()
    } else {
        r.requester.clone()
    };
    Ok(InvokeRequest {
        target: target.to_string(),
        task: r.task.clone(),
        requester,
        action: action_from_pb(r.action)?,
        conversation: r.conversation.clone(),
        parent_flight: r.parent_flight.clone(),
        timeout_ms: r.timeout_ms,
    })
}

/// `target` is not part of the message: it goes in the subject.
pub fn invoke_request_to_pb(r: &InvokeRequest) -> pb::InvokeRequest {
    pb::InvokeRequest {
        task: r.task.clone(),
        requester: r.requester.clone(),
        action: action_to_pb(r.action) as i32,
        conversation: r.conversation.clone(),
        parent_flight: r.parent_flight.clone(),
        timeout_ms: r.timeout_ms,
    }
}

// ---- errors ----

pub fn error_to_pb(e: &ApiError) -> pb::Error {
    pb::Error {
        code: e.code.as_str().to_string(),
        message: e.message.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ErrorCode;
    use crate::domain::ApprovalRequest;

    fn flight_full() -> Flight {
        Flight {
            id: "flt_1".into(),
            invocation: "inv_1".into(),
            agent: "codex-1".into(),
            state: FlightState::Running,
            summary: Some("thinking".into()),
            output: Some("done".into()),
            error: Some("boom".into()),
            update_seq: 7,
            thread_id: Some("th_1".into()),
            turn_id: Some("tu_1".into()),
            parent_flight: Some("flt_0".into()),
            conversation: "direct.operator.codex-1".into(),
            reply_message: Some("msg_9".into()),
            created_at: 100,
            updated_at: 200,
        }
    }

    fn flight_bare() -> Flight {
        Flight {
            id: "flt_2".into(),
            invocation: "inv_2".into(),
            agent: "pi".into(),
            state: FlightState::Queued,
            summary: None,
            output: None,
            error: None,
            update_seq: 0,
            thread_id: None,
            turn_id: None,
            parent_flight: None,
            conversation: "channel.shared".into(),
            reply_message: None,
            created_at: 1,
            updated_at: 1,
        }
    }

    fn all_changes() -> Vec<FlightChange> {
        vec![
            FlightChange::State {
                to: FlightState::Completed,
                reason: Some("why".into()),
                output: Some("answer".into()),
            },
            FlightChange::State {
                to: FlightState::Waiting,
                reason: None,
                output: None,
            },
            FlightChange::Delta { text: "hel".into() },
            FlightChange::Item {
                item_id: "it_1".into(),
                item_kind: "command".into(),
                phase: ItemPhase::Started,
                text: Some("ls".into()),
            },
            FlightChange::Item {
                item_id: "it_1".into(),
                item_kind: "command".into(),
                phase: ItemPhase::Completed,
                text: None,
            },
            FlightChange::CommandOutput {
                item_id: "it_1".into(),
                text: "a\nb\n".into(),
            },
            FlightChange::Plan {
                text: "1. do".into(),
            },
            FlightChange::Diff { text: "+x".into() },
            FlightChange::Usage {
                input_tokens: 12,
                output_tokens: 34,
            },
            FlightChange::Session {
                thread_id: Some("th".into()),
                turn_id: Some("tu".into()),
            },
            FlightChange::Session {
                thread_id: None,
                turn_id: None,
            },
            FlightChange::Note {
                text: "respawned".into(),
            },
        ]
    }

    /// Through the encoded bytes too, so absent vs default survives the wire.
    fn reencode<M: prost::Message + Default>(m: &M) -> M {
        M::decode(m.encode_to_vec().as_slice()).unwrap()
    }

    #[test]
    fn every_flight_change_round_trips() {
        let after = flight_full();
        for (i, change) in all_changes().into_iter().enumerate() {
            let u = FlightUpdate {
                flight: "flt_1".into(),
                agent: "codex-1".into(),
                seq: i as u64 + 1,
                at: 1000 + i as u64,
                change,
            };
            let wire = reencode(&update_to_pb(&u, &after));
            assert_eq!(update_from_pb(&wire).unwrap(), (u, Some(after.clone())));
        }
    }

    #[test]
    fn update_without_flight_after_converts() {
        let u = FlightUpdate {
            flight: "flt_1".into(),
            agent: "a".into(),
            seq: 1,
            at: 2,
            change: FlightChange::Delta { text: "x".into() },
        };
        let mut wire = update_to_pb(&u, &flight_bare());
        wire.flight_after = None;
        assert_eq!(update_from_pb(&wire).unwrap(), (u, None));
    }

    #[test]
    fn flights_round_trip_with_all_options_some_and_none() {
        for f in [flight_full(), flight_bare()] {
            let wire = reencode(&flight_to_pb(&f));
            assert_eq!(flight_from_pb(&wire).unwrap(), f);
        }
        for s in FlightState::ALL {
            let mut f = flight_bare();
            f.state = s;
            assert_eq!(flight_from_pb(&flight_to_pb(&f)).unwrap(), f);
            assert_eq!(flight_state_from_pb(flight_state_to_pb(s) as i32), Some(s));
        }
    }

    #[test]
    fn messages_round_trip() {
        let full = Message {
            id: "msg_1".into(),
            conversation: "channel.shared".into(),
            index: 3,
            author: "codex-1".into(),
            class: MessageClass::Artifact,
            body: "hi @pi".into(),
            mentions: vec!["pi".into()],
            reply_to: Some("msg_0".into()),
            meta: MessageMeta {
                invocation: Some("inv_1".into()),
                flight: Some("flt_1".into()),
                harness: Some(Harness::PiRpc),
                thread_id: Some("th".into()),
                turn_id: Some("tu".into()),
            },
            created_at: 42,
        };
        let bare = Message {
            id: "msg_2".into(),
            conversation: "direct.a.b".into(),
            index: 0,
            author: "operator".into(),
            class: MessageClass::Agent,
            body: String::new(),
            mentions: vec![],
            reply_to: None,
            meta: MessageMeta::default(),
            created_at: 0,
        };
        for m in [full, bare] {
            let wire = reencode(&message_to_pb(&m));
            assert_eq!(message_from_pb(&wire).unwrap(), m);
        }
        assert_eq!(message_to_pb(&bare_meta_message()).meta, None);
    }

    fn bare_meta_message() -> Message {
        Message {
            id: "m".into(),
            conversation: "c".into(),
            index: 0,
            author: "a".into(),
            class: MessageClass::Log,
            body: "b".into(),
            mentions: vec![],
            reply_to: None,
            meta: MessageMeta::default(),
            created_at: 0,
        }
    }

    #[test]
    fn invoke_requests_round_trip() {
        let r = InvokeRequest {
            target: "codex-1".into(),
            task: "fix it".into(),
            requester: "pi".into(),
            action: Action::Execute,
            conversation: Some("thread.x".into()),
            parent_flight: Some("flt_0".into()),
            timeout_ms: Some(5000),
        };
        let wire = reencode(&invoke_request_to_pb(&r));
        assert_eq!(invoke_request_from_pb("codex-1", &wire).unwrap(), r);

        // Empty fields pass through (the broker validates); empty requester is the default.
        let empty = invoke_request_from_pb("pi", &pb::InvokeRequest::default()).unwrap();
        assert_eq!(
            empty,
            InvokeRequest {
                target: "pi".into(),
                task: String::new(),
                requester: "operator".into(),
                action: Action::Consult,
                conversation: None,
                parent_flight: None,
                timeout_ms: None,
            }
        );
    }

    #[test]
    fn posts_convert() {
        let p = pb::PostMessage {
            conversation: "channel.shared".into(),
            author: "pi".into(),
            body: "hello".into(),
            class: pb::MessageClass::Status as i32,
            reply_to: Some("msg_1".into()),
        };
        assert_eq!(
            post_from_pb(&p).unwrap(),
            PostMessage {
                conversation: "channel.shared".into(),
                author: "pi".into(),
                body: "hello".into(),
                class: MessageClass::Status,
                reply_to: Some("msg_1".into()),
                meta: MessageMeta::default(),
            }
        );
        let empty = post_from_pb(&pb::PostMessage::default()).unwrap();
        assert_eq!(empty.author, "");
        assert_eq!(empty.class, MessageClass::Agent);
    }

    #[test]
    fn approvals_and_decisions_convert() {
        for d in [
            ApprovalDecision::Accept,
            ApprovalDecision::AcceptForSession,
            ApprovalDecision::Decline,
            ApprovalDecision::Cancel,
        ] {
            assert_eq!(decision_from_pb(decision_to_pb(d) as i32).unwrap(), d);
        }
        let mut a = Approval {
            id: "apr_1".into(),
            agent: "codex-1".into(),
            request: ApprovalRequest {
                flight: "flt_1".into(),
                kind: ApprovalKind::FileChange,
                detail: "edit a.rs".into(),
                reason: Some("needs write".into()),
                harness_request_id: "7".into(),
            },
            state: ApprovalState::Pending,
            decision: None,
            decided_by: None,
            created_at: 5,
            decided_at: None,
        };
        assert_eq!(
            approval_to_pb(&a),
            pb::Approval {
                id: "apr_1".into(),
                agent: "codex-1".into(),
                flight: "flt_1".into(),
                kind: "file_change".into(),
                detail: "edit a.rs".into(),
                reason: Some("needs write".into()),
                state: "pending".into(),
                decision: pb::ApprovalDecision::Unspecified as i32,
                decided_by: None,
                created_at: 5,
                decided_at: None,
            }
        );
        a.state = ApprovalState::Decided;
        a.decision = Some(ApprovalDecision::AcceptForSession);
        a.decided_by = Some("operator".into());
        a.decided_at = Some(9);
        let wire = approval_to_pb(&a);
        assert_eq!(wire.state, "decided");
        assert_eq!(wire.decision, pb::ApprovalDecision::AcceptForSession as i32);
        assert_eq!(wire.decided_by.as_deref(), Some("operator"));
        assert_eq!(wire.decided_at, Some(9));
    }

    #[test]
    fn errors_convert() {
        let e = ApiError {
            code: ErrorCode::UnknownFlight,
            message: "no flight flt_x".into(),
        };
        assert_eq!(
            error_to_pb(&e),
            pb::Error {
                code: "unknown_flight".into(),
                message: "no flight flt_x".into(),
            }
        );
        assert_eq!(harness_to_pb(Harness::Tmux), pb::Harness::Tmux);
    }

    #[test]
    fn bad_enums_are_errors_not_panics() {
        assert_eq!(flight_state_from_pb(0), None);
        assert_eq!(flight_state_from_pb(99), None);
        assert_eq!(flight_state_from_pb(-1), None);

        let mut f = flight_to_pb(&flight_bare());
        f.state = 0;
        assert_eq!(
            flight_from_pb(&f).unwrap_err().to_string(),
            "flight state 0 is not valid"
        );
        f.state = 42;
        assert_eq!(
            flight_from_pb(&f).unwrap_err(),
            ConvertError("flight state 42 is not valid".into())
        );

        assert_eq!(
            decision_from_pb(0).unwrap_err(),
            ConvertError("approval decision 0 is not valid".into())
        );
        assert!(decision_from_pb(5).is_err());

        let mut m = message_to_pb(&bare_meta_message());
        m.class = 9;
        assert_eq!(
            message_from_pb(&m).unwrap_err(),
            ConvertError("message class 9 is not valid".into())
        );
        m.class = 0;
        m.meta = Some(pb::MessageMeta {
            harness: Some(0),
            ..Default::default()
        });
        assert_eq!(
            message_from_pb(&m).unwrap_err(),
            ConvertError("harness 0 is not valid".into())
        );

        let p = pb::PostMessage {
            class: -3,
            ..Default::default()
        };
        assert!(post_from_pb(&p).is_err());

        let r = pb::InvokeRequest {
            action: 2,
            ..Default::default()
        };
        assert_eq!(
            invoke_request_from_pb("x", &r).unwrap_err(),
            ConvertError("action 2 is not valid".into())
        );
    }

    #[test]
    fn bad_updates_are_errors() {
        let u = FlightUpdate {
            flight: "flt_1".into(),
            agent: "a".into(),
            seq: 1,
            at: 2,
            change: FlightChange::State {
                to: FlightState::Running,
                reason: None,
                output: None,
            },
        };
        let good = update_to_pb(&u, &flight_bare());

        let mut missing = good.clone();
        missing.change = None;
        assert_eq!(
            update_from_pb(&missing).unwrap_err(),
            ConvertError("flight update has no change".into())
        );

        let mut bad_state = good.clone();
        bad_state.change = Some(Change::State(pb::StateChange {
            to: 0,
            reason: None,
            output: None,
        }));
        assert_eq!(
            update_from_pb(&bad_state).unwrap_err(),
            ConvertError("flight state 0 is not valid".into())
        );

        let mut bad_phase = good.clone();
        bad_phase.change = Some(Change::Item(pb::Item {
            item_id: "i".into(),
            item_kind: "k".into(),
            phase: "halfway".into(),
            text: None,
        }));
        assert!(update_from_pb(&bad_phase)
            .unwrap_err()
            .0
            .contains("item phase \"halfway\""));

        let mut bad_after = good;
        if let Some(f) = bad_after.flight_after.as_mut() {
            f.state = 77;
        }
        assert_eq!(
            update_from_pb(&bad_after).unwrap_err(),
            ConvertError("flight state 77 is not valid".into())
        );
    }
}
