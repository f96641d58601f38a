//! The domain types ([`crate::domain`], [`crate::api`]) as the protobuf messages of
//! [`crate::pb`], for what crosses NATS and nothing else: the requests the broker reads
//! (`*_from_pb`) and the replies, flight updates and messages it sends (`*_to_pb`).
//! Nothing is stored as protobuf (sled holds serde JSON) and a broker and its nodes talk
//! sealed JSON, so no other type has a protobuf form.
//!
//! `*_to_pb` never fails: every domain value has a protobuf form. `*_from_pb` checks what
//! protobuf cannot: an enum field that is `*_UNSPECIFIED` or an integer this build does
//! not know. Those are a [`ConvertError`], which the broker answers as
//! `invalid_request`. Emptiness of required strings (task, author, body, conversation) is
//! not checked here: the broker validates requests the same way whichever interface they
//! came from.

use crate::api::ApiError;
use crate::domain::{
    Action, Approval, ApprovalDecision, Flight, FlightChange, FlightState, FlightUpdate, Harness,
    InvokeRequest, Message, MessageClass, MessageMeta, PostMessage,
};
use crate::pb;
use crate::pb::flight_update::Change;

/// A protobuf message that has no domain form (an enum value this build does not know).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertError(pub String);

impl std::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConvertError {}

// ---- enums ----

/// A domain enum and its protobuf twin, value for value under the same name.
pub trait ProtoEnum: Sized {
    type Pb;
    fn to_pb(self) -> Self::Pb;
    /// The value of a protobuf field; one this build does not know, or the proto's
    /// `*_UNSPECIFIED` zero, is an error naming the field, never a panic.
    fn from_pb(v: i32) -> Result<Self, ConvertError>;
}

/// Implements [`ProtoEnum`] for a domain enum whose variants are listed once, under the
/// same names on both sides (a variant missing here does not compile). Every proto enum
/// goes through it, whether its zero is `*_UNSPECIFIED` (an error when read) or a value.
macro_rules! proto_enum {
    ($what:literal: $dom:ident <-> $pb:ident { $($variant:ident),+ $(,)? }) => {
        impl ProtoEnum for $dom {
            type Pb = pb::$pb;

            fn to_pb(self) -> pb::$pb {
                match self {
                    $($dom::$variant => pb::$pb::$variant,)+
                }
            }

            fn from_pb(v: i32) -> Result<$dom, ConvertError> {
                match pb::$pb::try_from(v) {
                    $(Ok(pb::$pb::$variant) => Ok($dom::$variant),)+
                    #[allow(unreachable_patterns)]
                    _ => Err(ConvertError(format!("{} {v} is not valid", $what))),
                }
            }
        }
    };
}

proto_enum!("harness": Harness <-> Harness {
    CodexAppServer,
    ClaudeStreamJson,
    PiRpc,
    Tmux,
    Acp,
    GeminiAcp,
    OpencodeAcp,
    QwenAcp,
});

proto_enum!("flight state": FlightState <-> FlightState {
    Queued,
    Waking,
    Running,
    Waiting,
    Completed,
    Failed,
    Cancelled,
});

proto_enum!("action": Action <-> Action { Consult, Execute });

proto_enum!("message class": MessageClass <-> MessageClass {
    Agent,
    Status,
    System,
    Log,
    Artifact,
});

proto_enum!("approval decision": ApprovalDecision <-> ApprovalDecision {
    Accept,
    AcceptForSession,
    Decline,
    Cancel,
});

// ---- what the broker sends ----

pub fn flight_to_pb(f: &Flight) -> pb::Flight {
    pb::Flight {
        id: f.id.clone(),
        invocation: f.invocation.clone(),
        agent: f.agent.clone(),
        state: f.state.to_pb() as i32,
        summary: f.summary.clone(),
        output: f.output.as_deref().map(str::to_owned),
        error: f.error.clone(),
        update_seq: f.update_seq,
        thread_id: f.thread_id.clone(),
        turn_id: f.turn_id.clone(),
        parent_flight: f.parent_flight.clone(),
        conversation: f.conversation.clone(),
        reply_message: f.reply_message.clone(),
        created_at: f.created_at,
        updated_at: f.updated_at,
        note: f.note.as_ref().map(|n| n.text.clone()),
        note_at: f.note.as_ref().map(|n| n.at),
    }
}

fn change_to_pb(c: &FlightChange) -> Change {
    match c {
        FlightChange::State { to, reason, output } => Change::State(pb::StateChange {
            to: to.to_pb() as i32,
            reason: reason.clone(),
            output: output.as_deref().map(str::to_owned),
        }),
        FlightChange::Delta { text } => Change::Delta(pb::Delta { text: text.clone() }),
        FlightChange::Item {
            item_id,
            item_kind,
            phase,
            text,
            exit_code,
        } => Change::Item(pb::Item {
            item_id: item_id.clone(),
            item_kind: item_kind.as_str().to_string(),
            phase: phase.as_str().to_string(),
            text: text.as_deref().map(str::to_owned),
            exit_code: *exit_code,
        }),
        FlightChange::CommandOutput { item_id, text } => Change::CommandOutput(pb::CommandOutput {
            item_id: item_id.clone(),
            text: text.clone(),
        }),
        FlightChange::Plan { text } => Change::Plan(pb::Text { text: text.clone() }),
        FlightChange::Diff { text } => Change::Diff(pb::Text { text: text.clone() }),
        FlightChange::Usage(u) => Change::Usage(pb::Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cached_input_tokens: u.cached_input_tokens,
            reasoning_tokens: u.reasoning_tokens,
            model: u.model.clone(),
            cost_micro_usd: u.cost_micro_usd,
        }),
        FlightChange::Session { thread_id, turn_id } => Change::Session(pb::Session {
            thread_id: thread_id.clone(),
            turn_id: turn_id.clone(),
        }),
        FlightChange::Note { text, by } => Change::Note(pb::Note {
            text: text.clone(),
            by: by.clone(),
        }),
        // Serialising these plain structs cannot fail; an empty text if it ever did.
        FlightChange::Commit { commit } => Change::Commit(pb::Text {
            text: serde_json::to_string(commit).unwrap_or_default(),
        }),
        FlightChange::Reverted { revert } => Change::Reverted(pb::Text {
            text: serde_json::to_string(revert).unwrap_or_default(),
        }),
    }
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

/// An empty [`MessageMeta`] is sent as an absent `meta`.
pub fn message_to_pb(m: &Message) -> pb::Message {
    pb::Message {
        id: m.id.clone(),
        conversation: m.conversation.clone(),
        index: m.index,
        author: m.author.clone(),
        class: m.class.to_pb() as i32,
        body: m.body.to_string(),
        mentions: m.mentions.clone(),
        reply_to: m.reply_to.clone(),
        meta: meta_to_pb(&m.meta),
        created_at: m.created_at,
    }
}

fn meta_to_pb(m: &MessageMeta) -> Option<pb::MessageMeta> {
    if m.is_empty() {
        return None;
    }
    Some(pb::MessageMeta {
        invocation: m.invocation.clone(),
        flight: m.flight.clone(),
        harness: m.harness.map(|h| h.to_pb() as i32),
        thread_id: m.thread_id.clone(),
        turn_id: m.turn_id.clone(),
    })
}

/// A message back from its protobuf ([`message_to_pb`]): the same message, every field
/// as it was (the broker's log stores posted messages so).
pub fn message_from_pb(m: pb::Message) -> Result<Message, ConvertError> {
    let meta = match m.meta {
        None => MessageMeta::default(),
        Some(meta) => MessageMeta {
            invocation: meta.invocation,
            flight: meta.flight,
            harness: meta.harness.map(Harness::from_pb).transpose()?,
            thread_id: meta.thread_id,
            turn_id: meta.turn_id,
        },
    };
    Ok(Message {
        id: m.id,
        conversation: m.conversation,
        index: m.index,
        author: m.author,
        class: MessageClass::from_pb(m.class)?,
        body: m.body.into(),
        mentions: m.mentions,
        reply_to: m.reply_to,
        meta,
        created_at: m.created_at,
    })
}

/// `decision` is `APPROVAL_DECISION_UNSPECIFIED` while the approval is undecided; `kind`
/// and `state` are their wire names (`file_change`, `pending`...).
pub fn approval_to_pb(a: &Approval) -> pb::Approval {
    pb::Approval {
        id: a.id.clone(),
        agent: a.agent.clone(),
        flight: a.request.flight.clone(),
        kind: a.request.kind.as_str().to_string(),
        detail: a.request.detail.clone(),
        reason: a.request.reason.clone(),
        state: a.state.as_str().to_string(),
        decision: a
            .decision
            .map_or(pb::ApprovalDecision::Unspecified, ProtoEnum::to_pb) as i32,
        decided_by: a.decided_by.clone(),
        created_at: a.created_at,
        decided_at: a.decided_at,
        harness_request_id: a.request.harness_request_id.clone(),
    }
}

pub fn error_to_pb(e: &ApiError) -> pb::Error {
    pb::Error {
        code: e.code.as_str().to_string(),
        message: e.message.clone(),
    }
}

// ---- what the broker reads ----

/// `target` comes from the subject (`relay.v1.invoke.<agent>`). An empty `requester`
/// becomes `default_requester`, as an absent one does in the JSON form (proto3 cannot
/// tell absent from empty): the bus's [`crate::bus::BUS_ACTOR`] on the bus.
pub fn invoke_request_from_pb(
    target: &str,
    r: &pb::InvokeRequest,
    default_requester: &str,
) -> Result<InvokeRequest, ConvertError> {
    let requester = if r.requester.is_empty() {
        default_requester.to_string()
    } else {
        r.requester.clone()
    };
    Ok(InvokeRequest {
        target: target.to_string(),
        task: r.task.clone(),
        requester,
        action: Action::from_pb(r.action)?,
        conversation: r.conversation.clone(),
        parent_flight: r.parent_flight.clone(),
        timeout_ms: r.timeout_ms,
    })
}

/// The protobuf request has no `meta`: messages posted over NATS carry none.
pub fn post_from_pb(p: &pb::PostMessage) -> Result<PostMessage, ConvertError> {
    Ok(PostMessage {
        conversation: p.conversation.clone(),
        author: p.author.clone(),
        body: p.body.as_str().into(),
        class: MessageClass::from_pb(p.class)?,
        reply_to: p.reply_to.clone(),
        meta: MessageMeta::default(),
    })
}

#[cfg(test)]
mod tests;
