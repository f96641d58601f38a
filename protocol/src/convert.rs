//! Conversions between the serde domain types ([`crate::domain`], [`crate::api`]) and the
//! protobuf types of [`crate::pb`].
//!
//! `*_to_pb` never fails: every domain value has a protobuf form. `*_from_pb` checks what
//! protobuf cannot: an enum field that is `*_UNSPECIFIED` or an integer this build does
//! not know, a missing `oneof`, an unknown item phase. Those are a [`ConvertError`], which
//! the broker answers as `invalid_request`. Emptiness of required strings (task, author,
//! body, conversation) is not checked here: the broker validates requests the same way
//! whichever interface they came from.
//!
//! Events convert with [`event_to_proto`] and [`event_from_proto`]; the latter refuses an
//! event newer than [`EVENT_VERSION`] with [`EventError::TooNew`].

use crate::api::ApiError;
use crate::domain::{
    Action, Agent, AgentSpec, AgentState, Approval, ApprovalDecision, ApprovalKind, ApprovalPolicy,
    ApprovalRequest, ApprovalState, Binding, Conversation, ConversationKind, ConversationSpec,
    Delivery, DeliveryAttempt, DeliveryReason, DeliveryState, Endpoint, Flight, FlightChange,
    FlightState, FlightUpdate, Harness, Invocation, InvokeRequest, ItemKind, ItemPhase, Message,
    MessageClass, MessageMeta, PostMessage, WakePolicy,
};
use crate::event::{Event, EventBody, EVENT_VERSION};
use crate::pb;
use crate::pb::event::Body;
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

/// A sub-message proto3 lets be absent but the domain requires.
fn required<'a, T>(m: Option<&'a T>, what: &str) -> Result<&'a T, ConvertError> {
    m.ok_or_else(|| ConvertError(format!("{what} is missing")))
}

/// Why a [`pb::Event`] has no domain form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventError {
    /// Written by a newer Relay: its encoding version is above [`EVENT_VERSION`].
    TooNew { version: u32 },
    /// A field has no domain form (bad enum value, missing body or record...).
    Invalid(ConvertError),
}

impl std::fmt::Display for EventError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventError::TooNew { version } => write!(
                f,
                "event version {version} is newer than this build's {EVENT_VERSION}"
            ),
            EventError::Invalid(e) => write!(f, "invalid event: {e}"),
        }
    }
}

impl std::error::Error for EventError {}

impl From<ConvertError> for EventError {
    fn from(e: ConvertError) -> Self {
        EventError::Invalid(e)
    }
}

// ---- enums ----

/// A domain enum and its protobuf enum, mapped both ways: `to(domain) -> pb`, and
/// `from(i32)`, where a value this build does not know (or the proto's `UNSPECIFIED`
/// zero) is a typed error naming the field, never a panic. Variants are listed once,
/// under the same name on both sides.
macro_rules! pb_enum {
    (
        $to_vis:vis $to:ident / $from_vis:vis $from:ident: $what:literal,
        $dom:ident <-> $pb:ident { $($variant:ident),+ $(,)? }
    ) => {
        $to_vis fn $to(v: $dom) -> pb::$pb {
            match v {
                $($dom::$variant => pb::$pb::$variant,)+
            }
        }

        $from_vis fn $from(v: i32) -> Result<$dom, ConvertError> {
            match pb::$pb::try_from(v) {
                $(Ok(pb::$pb::$variant) => Ok($dom::$variant),)+
                #[allow(unreachable_patterns)]
                _ => Err(invalid($what, v)),
            }
        }
    };
}

pb_enum! {
    pub harness_to_pb / harness_from_pb: "harness",
    Harness <-> Harness {
        CodexAppServer,
        ClaudeStreamJson,
        PiRpc,
        Tmux,
    }
}

pb_enum! {
    action_to_pb / action_from_pb: "action",
    Action <-> Action {
        Consult,
        Execute,
    }
}

pb_enum! {
    class_to_pb / class_from_pb: "message class",
    MessageClass <-> MessageClass {
        Agent,
        Status,
        System,
        Log,
        Artifact,
    }
}

pb_enum! {
    pub decision_to_pb / pub decision_from_pb: "approval decision",
    ApprovalDecision <-> ApprovalDecision {
        Accept,
        AcceptForSession,
        Decline,
        Cancel,
    }
}

pb_enum! {
    wake_to_pb / wake_from_pb: "wake policy",
    WakePolicy <-> WakePolicy {
        OnDemand,
        KeepWarm,
        Manual,
    }
}

pb_enum! {
    agent_state_to_pb / agent_state_from_pb: "agent state",
    AgentState <-> AgentState {
        Offline,
        Starting,
        Idle,
        Busy,
        Failed,
    }
}

pb_enum! {
    conversation_kind_to_pb / conversation_kind_from_pb: "conversation kind",
    ConversationKind <-> ConversationKind {
        Channel,
        Direct,
        Group,
        Thread,
        System,
    }
}

pb_enum! {
    delivery_reason_to_pb / delivery_reason_from_pb: "delivery reason",
    DeliveryReason <-> DeliveryReason {
        Mention,
        DirectMessage,
        Invocation,
    }
}

pb_enum! {
    delivery_state_to_pb / delivery_state_from_pb: "delivery state",
    DeliveryState <-> DeliveryState {
        Pending,
        Delivered,
        Failed,
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

fn approval_kind_to_pb(k: ApprovalKind) -> &'static str {
    match k {
        ApprovalKind::Command => "command",
        ApprovalKind::FileChange => "file_change",
        ApprovalKind::Other => "other",
    }
}

fn approval_kind_from_pb(s: &str) -> Result<ApprovalKind, ConvertError> {
    match s {
        "command" => Ok(ApprovalKind::Command),
        "file_change" => Ok(ApprovalKind::FileChange),
        "other" => Ok(ApprovalKind::Other),
        _ => Err(ConvertError(format!(
            "approval kind {s:?} is not valid; expected \"command\", \"file_change\" or \"other\""
        ))),
    }
}

fn approval_state_to_pb(s: ApprovalState) -> &'static str {
    match s {
        ApprovalState::Pending => "pending",
        ApprovalState::Decided => "decided",
        ApprovalState::Expired => "expired",
    }
}

fn approval_state_from_pb(s: &str) -> Result<ApprovalState, ConvertError> {
    match s {
        "pending" => Ok(ApprovalState::Pending),
        "decided" => Ok(ApprovalState::Decided),
        "expired" => Ok(ApprovalState::Expired),
        _ => Err(ConvertError(format!(
            "approval state {s:?} is not valid; expected \"pending\", \"decided\" or \"expired\""
        ))),
    }
}

// ---- agents ----

fn endpoint_to_pb(e: &Endpoint) -> pb::Endpoint {
    pb::Endpoint {
        transport: harness_to_pb(e.transport) as i32,
        node: e.node.clone(),
        session_id: e.session_id.clone(),
        pid: e.pid,
        pane: e.pane.clone(),
    }
}

fn endpoint_from_pb(e: &pb::Endpoint) -> Result<Endpoint, ConvertError> {
    Ok(Endpoint {
        transport: harness_from_pb(e.transport)?,
        node: e.node.clone(),
        session_id: e.session_id.clone(),
        pid: e.pid,
        pane: e.pane.clone(),
    })
}

/// The default policy is sent as an absent `approval_policy`; `env` goes out as a
/// protobuf map, whose order is not kept (the domain's is sorted anyway).
pub fn agent_to_pb(a: &Agent) -> pb::Agent {
    let s = &a.spec;
    let policy = &s.approval_policy;
    pb::Agent {
        name: s.name.clone(),
        harness: harness_to_pb(s.harness) as i32,
        cwd: s.cwd.clone(),
        model: s.model.clone(),
        node: s.node.clone(),
        wake: wake_to_pb(s.wake) as i32,
        state: agent_state_to_pb(a.state) as i32,
        thread_id: a.thread_id.clone(),
        endpoint: a.endpoint.as_ref().map(endpoint_to_pb),
        created_at: a.created_at,
        updated_at: a.updated_at,
        command: s.command.clone(),
        args: s.args.clone(),
        env: s.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        approval_policy: (policy != &ApprovalPolicy::default()).then(|| pb::ApprovalPolicy {
            accept_commands: policy.accept_commands.clone(),
            decline_commands: policy.decline_commands.clone(),
            accept_file_changes: policy.accept_file_changes,
        }),
    }
}

pub fn agent_from_pb(a: &pb::Agent) -> Result<Agent, ConvertError> {
    let approval_policy = a
        .approval_policy
        .as_ref()
        .map(|p| ApprovalPolicy {
            accept_commands: p.accept_commands.clone(),
            decline_commands: p.decline_commands.clone(),
            accept_file_changes: p.accept_file_changes,
        })
        .unwrap_or_default();
    Ok(Agent {
        spec: AgentSpec {
            name: a.name.clone(),
            harness: harness_from_pb(a.harness)?,
            cwd: a.cwd.clone(),
            model: a.model.clone(),
            node: a.node.clone(),
            wake: wake_from_pb(a.wake)?,
            command: a.command.clone(),
            args: a.args.clone(),
            env: a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            // Secret values never travel in protobuf (the bus publishes these).
            secrets: Default::default(),
            approval_policy,
        },
        state: agent_state_from_pb(a.state)?,
        thread_id: a.thread_id.clone(),
        endpoint: a.endpoint.as_ref().map(endpoint_from_pb).transpose()?,
        created_at: a.created_at,
        updated_at: a.updated_at,
    })
}

// ---- conversations ----

pub fn conversation_to_pb(c: &Conversation) -> pb::Conversation {
    pb::Conversation {
        id: c.spec.id.clone(),
        kind: conversation_kind_to_pb(c.spec.kind) as i32,
        title: c.spec.title.clone(),
        participants: c.spec.participants.clone(),
        parent: c.spec.parent.clone(),
        created_at: c.created_at,
        message_count: c.message_count,
    }
}

pub fn conversation_from_pb(c: &pb::Conversation) -> Result<Conversation, ConvertError> {
    Ok(Conversation {
        spec: ConversationSpec {
            id: c.id.clone(),
            kind: conversation_kind_from_pb(c.kind)?,
            title: c.title.clone(),
            participants: c.participants.clone(),
            parent: c.parent.clone(),
        },
        created_at: c.created_at,
        message_count: c.message_count,
    })
}

// ---- deliveries and bindings ----

pub fn delivery_to_pb(d: &Delivery) -> pb::Delivery {
    pb::Delivery {
        id: d.id.clone(),
        message: d.message.clone(),
        target: d.target.clone(),
        reason: delivery_reason_to_pb(d.reason) as i32,
        transport: harness_to_pb(d.transport) as i32,
        state: delivery_state_to_pb(d.state) as i32,
        attempts: d
            .attempts
            .iter()
            .map(|a| pb::DeliveryAttempt {
                at: a.at,
                ok: a.ok,
                error: a.error.clone(),
            })
            .collect(),
    }
}

pub fn delivery_from_pb(d: &pb::Delivery) -> Result<Delivery, ConvertError> {
    Ok(Delivery {
        id: d.id.clone(),
        message: d.message.clone(),
        target: d.target.clone(),
        reason: delivery_reason_from_pb(d.reason)?,
        transport: harness_from_pb(d.transport)?,
        state: delivery_state_from_pb(d.state)?,
        attempts: d
            .attempts
            .iter()
            .map(|a| DeliveryAttempt {
                at: a.at,
                ok: a.ok,
                error: a.error.clone(),
            })
            .collect(),
    })
}

pub fn binding_to_pb(b: &Binding) -> pb::Binding {
    pb::Binding {
        id: b.id.clone(),
        conversation: b.conversation.clone(),
        kind: b.kind.clone(),
        target: b.target.clone(),
        created_at: b.created_at,
    }
}

pub fn binding_from_pb(b: &pb::Binding) -> Binding {
    Binding {
        id: b.id.clone(),
        conversation: b.conversation.clone(),
        kind: b.kind.clone(),
        target: b.target.clone(),
        created_at: b.created_at,
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
            item_kind: item_kind.as_str().to_string(),
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
            item_kind: ItemKind::from_name(&i.item_kind),
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
    pb::Approval {
        id: a.id.clone(),
        agent: a.agent.clone(),
        flight: a.request.flight.clone(),
        kind: approval_kind_to_pb(a.request.kind).to_string(),
        detail: a.request.detail.clone(),
        reason: a.request.reason.clone(),
        state: approval_state_to_pb(a.state).to_string(),
        decision: a
            .decision
            .map_or(pb::ApprovalDecision::Unspecified, decision_to_pb) as i32,
        decided_by: a.decided_by.clone(),
        created_at: a.created_at,
        decided_at: a.decided_at,
        harness_request_id: a.request.harness_request_id.clone(),
    }
}

/// `APPROVAL_DECISION_UNSPECIFIED` is no decision; `kind` and `state` must be one of
/// the strings [`approval_to_pb`] writes.
pub fn approval_from_pb(a: &pb::Approval) -> Result<Approval, ConvertError> {
    let decision = match pb::ApprovalDecision::try_from(a.decision) {
        Ok(pb::ApprovalDecision::Unspecified) => None,
        _ => Some(decision_from_pb(a.decision)?),
    };
    Ok(Approval {
        id: a.id.clone(),
        agent: a.agent.clone(),
        request: ApprovalRequest {
            flight: a.flight.clone(),
            kind: approval_kind_from_pb(&a.kind)?,
            detail: a.detail.clone(),
            reason: a.reason.clone(),
            harness_request_id: a.harness_request_id.clone(),
        },
        state: approval_state_from_pb(&a.state)?,
        decision,
        decided_by: a.decided_by.clone(),
        created_at: a.created_at,
        decided_at: a.decided_at,
    })
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

pub fn invocation_to_pb(i: &Invocation) -> pb::Invocation {
    pb::Invocation {
        id: i.id.clone(),
        requester: i.requester.clone(),
        target: i.target.clone(),
        action: action_to_pb(i.action) as i32,
        task: i.task.clone(),
        conversation: i.conversation.clone(),
        request_message: i.request_message.clone(),
        parent_flight: i.parent_flight.clone(),
        depth: i.depth,
        timeout_ms: i.timeout_ms,
        created_at: i.created_at,
    }
}

pub fn invocation_from_pb(i: &pb::Invocation) -> Result<Invocation, ConvertError> {
    Ok(Invocation {
        id: i.id.clone(),
        requester: i.requester.clone(),
        target: i.target.clone(),
        action: action_from_pb(i.action)?,
        task: i.task.clone(),
        conversation: i.conversation.clone(),
        request_message: i.request_message.clone(),
        parent_flight: i.parent_flight.clone(),
        depth: i.depth,
        timeout_ms: i.timeout_ms,
        created_at: i.created_at,
    })
}

// ---- events ----

/// The event stamped with this build's [`EVENT_VERSION`]. A flight update's
/// `flight_after` is left unset: the flight travels once, in `FlightUpdated.flight`.
pub fn event_to_proto(e: &Event) -> pb::Event {
    let body = match &e.body {
        EventBody::AgentRegistered { agent } => Body::AgentRegistered(pb::AgentRegistered {
            agent: Some(agent_to_pb(agent)),
        }),
        EventBody::AgentUpdated { agent } => Body::AgentUpdated(pb::AgentUpdated {
            agent: Some(agent_to_pb(agent)),
        }),
        EventBody::AgentRemoved { name, node } => Body::AgentRemoved(pb::AgentRemoved {
            name: name.clone(),
            node: node.clone(),
        }),
        EventBody::ThreadLost {
            agent,
            old_thread_id,
            new_thread_id,
            reason,
        } => Body::ThreadLost(pb::ThreadLost {
            agent: agent.clone(),
            old_thread_id: old_thread_id.clone(),
            new_thread_id: new_thread_id.clone(),
            reason: reason.clone(),
        }),
        EventBody::ConversationCreated { conversation } => {
            Body::ConversationCreated(pb::ConversationCreated {
                conversation: Some(conversation_to_pb(conversation)),
            })
        }
        EventBody::MessagePosted {
            message,
            conversation,
        } => Body::MessagePosted(pb::MessagePosted {
            message: Some(message_to_pb(message)),
            conversation: Some(conversation_to_pb(conversation)),
        }),
        EventBody::DeliveryPlanned { delivery } => Body::DeliveryPlanned(pb::DeliveryPlanned {
            delivery: Some(delivery_to_pb(delivery)),
        }),
        EventBody::DeliveryAttempted { delivery } => {
            Body::DeliveryAttempted(pb::DeliveryAttempted {
                delivery: Some(delivery_to_pb(delivery)),
            })
        }
        EventBody::InvocationCreated { invocation, flight } => {
            Body::InvocationCreated(pb::InvocationCreated {
                invocation: Some(invocation_to_pb(invocation)),
                flight: Some(flight_to_pb(flight)),
            })
        }
        EventBody::FlightUpdated { update, flight } => {
            let mut update = update_to_pb(update, flight);
            update.flight_after = None;
            Body::FlightUpdated(pb::FlightUpdated {
                update: Some(update),
                flight: Some(flight_to_pb(flight)),
            })
        }
        EventBody::BindingCreated { binding } => Body::BindingCreated(pb::BindingCreated {
            binding: Some(binding_to_pb(binding)),
        }),
        EventBody::ApprovalRequested { approval } => {
            Body::ApprovalRequested(pb::ApprovalRequested {
                approval: Some(approval_to_pb(approval)),
            })
        }
        EventBody::ApprovalDecided { approval } => Body::ApprovalDecided(pb::ApprovalDecided {
            approval: Some(approval_to_pb(approval)),
        }),
    };
    pb::Event {
        version: u32::from(EVENT_VERSION),
        seq: e.seq,
        at: e.at,
        body: Some(body),
    }
}

/// Version 0 (unset) reads as 1; a version above [`EVENT_VERSION`] is
/// [`EventError::TooNew`], checked before anything else. A missing body or record, or a
/// value with no domain form, is [`EventError::Invalid`].
pub fn event_from_proto(e: pb::Event) -> Result<Event, EventError> {
    let version = e.version.max(1);
    if version > u32::from(EVENT_VERSION) {
        return Err(EventError::TooNew { version });
    }
    let body = required(e.body.as_ref(), "event body")?;
    let body = match body {
        Body::AgentRegistered(b) => EventBody::AgentRegistered {
            agent: agent_from_pb(required(b.agent.as_ref(), "agent_registered.agent")?)?,
        },
        Body::AgentUpdated(b) => EventBody::AgentUpdated {
            agent: agent_from_pb(required(b.agent.as_ref(), "agent_updated.agent")?)?,
        },
        Body::AgentRemoved(b) => EventBody::AgentRemoved {
            name: b.name.clone(),
            node: b.node.clone(),
        },
        Body::ThreadLost(b) => EventBody::ThreadLost {
            agent: b.agent.clone(),
            old_thread_id: b.old_thread_id.clone(),
            new_thread_id: b.new_thread_id.clone(),
            reason: b.reason.clone(),
        },
        Body::ConversationCreated(b) => EventBody::ConversationCreated {
            conversation: conversation_from_pb(required(
                b.conversation.as_ref(),
                "conversation_created.conversation",
            )?)?,
        },
        Body::MessagePosted(b) => EventBody::MessagePosted {
            message: message_from_pb(required(b.message.as_ref(), "message_posted.message")?)?,
            conversation: conversation_from_pb(required(
                b.conversation.as_ref(),
                "message_posted.conversation",
            )?)?,
        },
        Body::DeliveryPlanned(b) => EventBody::DeliveryPlanned {
            delivery: delivery_from_pb(required(
                b.delivery.as_ref(),
                "delivery_planned.delivery",
            )?)?,
        },
        Body::DeliveryAttempted(b) => EventBody::DeliveryAttempted {
            delivery: delivery_from_pb(required(
                b.delivery.as_ref(),
                "delivery_attempted.delivery",
            )?)?,
        },
        Body::InvocationCreated(b) => EventBody::InvocationCreated {
            invocation: invocation_from_pb(required(
                b.invocation.as_ref(),
                "invocation_created.invocation",
            )?)?,
            flight: flight_from_pb(required(b.flight.as_ref(), "invocation_created.flight")?)?,
        },
        Body::FlightUpdated(b) => {
            let (update, after) =
                update_from_pb(required(b.update.as_ref(), "flight_updated.update")?)?;
            let flight = match b.flight.as_ref() {
                Some(f) => flight_from_pb(f)?,
                None => after
                    .ok_or_else(|| ConvertError("flight_updated.flight is missing".to_string()))?,
            };
            EventBody::FlightUpdated { update, flight }
        }
        Body::BindingCreated(b) => EventBody::BindingCreated {
            binding: binding_from_pb(required(b.binding.as_ref(), "binding_created.binding")?),
        },
        Body::ApprovalRequested(b) => EventBody::ApprovalRequested {
            approval: approval_from_pb(required(
                b.approval.as_ref(),
                "approval_requested.approval",
            )?)?,
        },
        Body::ApprovalDecided(b) => EventBody::ApprovalDecided {
            approval: approval_from_pb(required(
                b.approval.as_ref(),
                "approval_decided.approval",
            )?)?,
        },
    };
    Ok(Event {
        v: EVENT_VERSION,
        seq: e.seq,
        at: e.at,
        body,
    })
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
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeMap;

    use super::*;
    use crate::api::ErrorCode;

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
                item_kind: ItemKind::CommandExecution,
                phase: ItemPhase::Started,
                text: Some("ls".into()),
            },
            FlightChange::Item {
                item_id: "it_1".into(),
                item_kind: ItemKind::CommandExecution,
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
                harness_request_id: "7".into(),
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

    // ---- events ----

    fn agent_full() -> Agent {
        Agent {
            spec: AgentSpec {
                name: "codex-1".into(),
                harness: Harness::CodexAppServer,
                cwd: "/work".into(),
                model: Some("gpt-5".into()),
                node: Some("node-a".into()),
                wake: WakePolicy::KeepWarm,
                command: Some("/usr/bin/codex".into()),
                args: vec!["--x".into(), "y".into()],
                env: BTreeMap::from([
                    ("A".to_string(), "1".to_string()),
                    ("B".to_string(), String::new()),
                ]),
                secrets: Default::default(),
                approval_policy: ApprovalPolicy {
                    accept_commands: vec!["ls".into(), "git status".into()],
                    decline_commands: vec!["rm".into()],
                    accept_file_changes: true,
                },
            },
            state: AgentState::Busy,
            thread_id: Some("th_1".into()),
            endpoint: Some(Endpoint {
                transport: Harness::Tmux,
                node: Some("node-a".into()),
                session_id: Some("s1".into()),
                pid: Some(4242),
                pane: Some("%3".into()),
            }),
            created_at: 10,
            updated_at: 20,
        }
    }

    fn agent_bare() -> Agent {
        Agent {
            spec: AgentSpec {
                name: "pi".into(),
                harness: Harness::PiRpc,
                cwd: String::new(),
                model: None,
                node: None,
                wake: WakePolicy::OnDemand,
                command: None,
                args: vec![],
                env: BTreeMap::new(),
                secrets: Default::default(),
                approval_policy: ApprovalPolicy::default(),
            },
            state: AgentState::Offline,
            thread_id: None,
            endpoint: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn conversation_full() -> Conversation {
        Conversation {
            spec: ConversationSpec {
                id: "thread.x".into(),
                kind: ConversationKind::Thread,
                title: Some("a thread".into()),
                participants: vec!["pi".into(), "codex-1".into()],
                parent: Some("channel.shared".into()),
            },
            created_at: 3,
            message_count: 4,
        }
    }

    fn conversation_bare() -> Conversation {
        Conversation {
            spec: ConversationSpec {
                id: "channel.shared".into(),
                kind: ConversationKind::Channel,
                title: None,
                participants: vec![],
                parent: None,
            },
            created_at: 0,
            message_count: 0,
        }
    }

    fn delivery_full() -> Delivery {
        Delivery {
            id: "dlv_1".into(),
            message: "msg_1".into(),
            target: "codex-1".into(),
            reason: DeliveryReason::DirectMessage,
            transport: Harness::ClaudeStreamJson,
            state: DeliveryState::Failed,
            attempts: vec![
                DeliveryAttempt {
                    at: 5,
                    ok: false,
                    error: Some("down".into()),
                },
                DeliveryAttempt {
                    at: 6,
                    ok: true,
                    error: None,
                },
            ],
        }
    }

    fn delivery_bare() -> Delivery {
        Delivery {
            id: "dlv_2".into(),
            message: "msg_2".into(),
            target: "pi".into(),
            reason: DeliveryReason::Mention,
            transport: Harness::PiRpc,
            state: DeliveryState::Pending,
            attempts: vec![],
        }
    }

    fn approval_pending() -> Approval {
        Approval {
            id: "apr_1".into(),
            agent: "codex-1".into(),
            request: ApprovalRequest {
                flight: "flt_1".into(),
                kind: ApprovalKind::Command,
                detail: "ls -la".into(),
                reason: None,
                harness_request_id: "17".into(),
            },
            state: ApprovalState::Pending,
            decision: None,
            decided_by: None,
            created_at: 5,
            decided_at: None,
        }
    }

    fn approval_decided() -> Approval {
        Approval {
            request: ApprovalRequest {
                kind: ApprovalKind::Other,
                reason: Some("why".into()),
                ..approval_pending().request
            },
            state: ApprovalState::Decided,
            decision: Some(ApprovalDecision::Decline),
            decided_by: Some("policy:decline_commands".into()),
            decided_at: Some(6),
            ..approval_pending()
        }
    }

    fn invocation_full() -> Invocation {
        Invocation {
            id: "inv_1".into(),
            requester: "pi".into(),
            target: "codex-1".into(),
            action: Action::Execute,
            task: "fix it".into(),
            conversation: "direct.pi.codex-1".into(),
            request_message: "msg_1".into(),
            parent_flight: Some("flt_0".into()),
            depth: 2,
            timeout_ms: Some(9000),
            created_at: 7,
        }
    }

    fn invocation_bare() -> Invocation {
        Invocation {
            action: Action::Consult,
            parent_flight: None,
            depth: 0,
            timeout_ms: None,
            ..invocation_full()
        }
    }

    /// Every [`EventBody`] variant, most of them twice (options all set, options all unset).
    fn all_bodies() -> Vec<EventBody> {
        let mut out = vec![
            EventBody::AgentRemoved {
                name: "codex-1".into(),
                node: None,
            },
            EventBody::AgentRemoved {
                name: "far-1".into(),
                node: Some("gpu-box".into()),
            },
            EventBody::ThreadLost {
                agent: "codex-1".into(),
                old_thread_id: "th_old".into(),
                new_thread_id: "th_new".into(),
                reason: "rollout missing".into(),
            },
            EventBody::BindingCreated {
                binding: Binding {
                    id: "bnd_1".into(),
                    conversation: "channel.shared".into(),
                    kind: "nats".into(),
                    target: "relay.v1.mirror.shared".into(),
                    created_at: 8,
                },
            },
        ];
        for agent in [agent_full(), agent_bare()] {
            out.push(EventBody::AgentRegistered {
                agent: agent.clone(),
            });
            out.push(EventBody::AgentUpdated { agent });
        }
        for conversation in [conversation_full(), conversation_bare()] {
            out.push(EventBody::ConversationCreated {
                conversation: conversation.clone(),
            });
            out.push(EventBody::MessagePosted {
                message: bare_meta_message(),
                conversation,
            });
        }
        for delivery in [delivery_full(), delivery_bare()] {
            out.push(EventBody::DeliveryPlanned {
                delivery: delivery.clone(),
            });
            out.push(EventBody::DeliveryAttempted { delivery });
        }
        for (invocation, flight) in [
            (invocation_full(), flight_full()),
            (invocation_bare(), flight_bare()),
        ] {
            out.push(EventBody::InvocationCreated { invocation, flight });
        }
        for (i, change) in all_changes().into_iter().enumerate() {
            out.push(EventBody::FlightUpdated {
                update: FlightUpdate {
                    flight: "flt_1".into(),
                    agent: "codex-1".into(),
                    seq: i as u64 + 1,
                    at: 100 + i as u64,
                    change,
                },
                flight: if i % 2 == 0 {
                    flight_full()
                } else {
                    flight_bare()
                },
            });
        }
        for approval in [approval_pending(), approval_decided()] {
            out.push(EventBody::ApprovalRequested {
                approval: approval.clone(),
            });
            out.push(EventBody::ApprovalDecided { approval });
        }
        out
    }

    fn sample_event() -> Event {
        Event {
            v: EVENT_VERSION,
            seq: 1,
            at: 2,
            body: EventBody::AgentRemoved {
                name: "x".into(),
                node: None,
            },
        }
    }

    #[test]
    fn every_event_body_round_trips_through_bytes() {
        let bodies = all_bodies();
        let mut seen: Vec<&str> = bodies.iter().map(EventBody::type_name).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 13, "a variant is missing: {seen:?}");

        for (i, body) in bodies.into_iter().enumerate() {
            let e = Event {
                v: EVENT_VERSION,
                seq: i as u64 + 1,
                at: 1_700_000_000_000 + i as u64,
                body,
            };
            let wire = reencode(&event_to_proto(&e));
            assert_eq!(wire.version, u32::from(EVENT_VERSION));
            assert_eq!(event_from_proto(wire).unwrap(), e);
        }
    }

    #[test]
    fn flight_updated_sends_the_flight_once() {
        let e = Event {
            v: EVENT_VERSION,
            seq: 1,
            at: 2,
            body: EventBody::FlightUpdated {
                update: FlightUpdate {
                    flight: "flt_1".into(),
                    agent: "codex-1".into(),
                    seq: 3,
                    at: 4,
                    change: FlightChange::Delta { text: "x".into() },
                },
                flight: flight_full(),
            },
        };
        let mut wire = event_to_proto(&e);
        let Some(Body::FlightUpdated(b)) = wire.body.as_mut() else {
            panic!("not flight_updated: {wire:?}");
        };
        assert_eq!(b.update.as_ref().unwrap().flight_after, None);
        // A writer that put the flight only in `flight_after` is read the same.
        let flight = b.flight.take();
        b.update.as_mut().unwrap().flight_after = flight;
        assert_eq!(event_from_proto(wire.clone()).unwrap(), e);

        if let Some(Body::FlightUpdated(b)) = wire.body.as_mut() {
            b.update.as_mut().unwrap().flight_after = None;
        }
        assert_eq!(
            event_from_proto(wire).unwrap_err(),
            EventError::Invalid(ConvertError("flight_updated.flight is missing".into()))
        );
    }

    #[test]
    fn event_versions_zero_reads_as_one_and_newer_is_refused() {
        let e = sample_event();
        let mut wire = event_to_proto(&e);
        wire.version = 0;
        assert_eq!(event_from_proto(wire.clone()).unwrap(), e);

        let newer = u32::from(EVENT_VERSION) + 1;
        wire.version = newer;
        let err = event_from_proto(wire.clone()).unwrap_err();
        assert_eq!(err, EventError::TooNew { version: newer });
        assert_eq!(
            err.to_string(),
            format!("event version {newer} is newer than this build's {EVENT_VERSION}")
        );

        // Too new wins over a body this build cannot read.
        wire.body = None;
        assert_eq!(
            event_from_proto(wire).unwrap_err(),
            EventError::TooNew { version: newer }
        );
    }

    #[test]
    fn every_new_enum_value_round_trips() {
        for k in [
            ConversationKind::Channel,
            ConversationKind::Direct,
            ConversationKind::Group,
            ConversationKind::Thread,
            ConversationKind::System,
        ] {
            let c = Conversation {
                spec: ConversationSpec {
                    kind: k,
                    ..conversation_bare().spec
                },
                ..conversation_bare()
            };
            assert_eq!(conversation_from_pb(&conversation_to_pb(&c)).unwrap(), c);
        }
        for reason in [
            DeliveryReason::Mention,
            DeliveryReason::DirectMessage,
            DeliveryReason::Invocation,
        ] {
            for state in [
                DeliveryState::Pending,
                DeliveryState::Delivered,
                DeliveryState::Failed,
            ] {
                let d = Delivery {
                    reason,
                    state,
                    ..delivery_bare()
                };
                assert_eq!(delivery_from_pb(&delivery_to_pb(&d)).unwrap(), d);
            }
        }
        for state in [
            AgentState::Offline,
            AgentState::Starting,
            AgentState::Idle,
            AgentState::Busy,
            AgentState::Failed,
        ] {
            for wake in [
                WakePolicy::OnDemand,
                WakePolicy::KeepWarm,
                WakePolicy::Manual,
            ] {
                let mut a = agent_bare();
                a.state = state;
                a.spec.wake = wake;
                assert_eq!(agent_from_pb(&agent_to_pb(&a)).unwrap(), a);
            }
        }
        for kind in [
            ApprovalKind::Command,
            ApprovalKind::FileChange,
            ApprovalKind::Other,
        ] {
            for state in [
                ApprovalState::Pending,
                ApprovalState::Decided,
                ApprovalState::Expired,
            ] {
                let mut a = approval_decided();
                a.request.kind = kind;
                a.state = state;
                assert_eq!(approval_from_pb(&approval_to_pb(&a)).unwrap(), a);
            }
        }
        // The default policy is an absent message.
        assert_eq!(agent_to_pb(&agent_bare()).approval_policy, None);
    }

    #[test]
    fn bad_event_fields_are_errors_not_panics() {
        fn invalid_event(body: Body) -> EventError {
            let mut wire = event_to_proto(&sample_event());
            wire.body = Some(body);
            event_from_proto(wire).unwrap_err()
        }
        fn invalid_msg(s: &str) -> EventError {
            EventError::Invalid(ConvertError(s.into()))
        }

        let mut wire = event_to_proto(&sample_event());
        wire.body = None;
        assert_eq!(
            event_from_proto(wire).unwrap_err(),
            invalid_msg("event body is missing")
        );
        assert_eq!(
            invalid_event(Body::AgentRegistered(pb::AgentRegistered { agent: None })),
            invalid_msg("agent_registered.agent is missing")
        );
        assert_eq!(
            invalid_event(Body::MessagePosted(pb::MessagePosted {
                message: Some(message_to_pb(&bare_meta_message())),
                conversation: None,
            })),
            invalid_msg("message_posted.conversation is missing")
        );

        let mut c = conversation_to_pb(&conversation_bare());
        for v in [0, 6, -1] {
            c.kind = v;
            assert_eq!(
                invalid_event(Body::ConversationCreated(pb::ConversationCreated {
                    conversation: Some(c.clone()),
                })),
                invalid_msg(&format!("conversation kind {v} is not valid"))
            );
        }

        let good = delivery_to_pb(&delivery_bare());
        for (d, msg) in [
            (
                pb::Delivery {
                    reason: 0,
                    ..good.clone()
                },
                "delivery reason 0 is not valid",
            ),
            (
                pb::Delivery {
                    state: 9,
                    ..good.clone()
                },
                "delivery state 9 is not valid",
            ),
            (
                pb::Delivery {
                    transport: 0,
                    ..good
                },
                "harness 0 is not valid",
            ),
        ] {
            assert_eq!(delivery_from_pb(&d).unwrap_err(), ConvertError(msg.into()));
            assert_eq!(
                invalid_event(Body::DeliveryAttempted(pb::DeliveryAttempted {
                    delivery: Some(d),
                })),
                invalid_msg(msg)
            );
        }

        let good = agent_to_pb(&agent_full());
        for (a, msg) in [
            (
                pb::Agent {
                    state: 5,
                    ..good.clone()
                },
                "agent state 5 is not valid",
            ),
            (
                pb::Agent {
                    wake: 3,
                    ..good.clone()
                },
                "wake policy 3 is not valid",
            ),
            (
                pb::Agent {
                    harness: 0,
                    ..good.clone()
                },
                "harness 0 is not valid",
            ),
            (
                pb::Agent {
                    endpoint: Some(pb::Endpoint::default()),
                    ..good
                },
                "harness 0 is not valid",
            ),
        ] {
            assert_eq!(
                invalid_event(Body::AgentUpdated(pb::AgentUpdated { agent: Some(a) })),
                invalid_msg(msg)
            );
        }

        let good = approval_to_pb(&approval_decided());
        for (a, msg) in [
            (
                pb::Approval {
                    decision: 9,
                    ..good.clone()
                },
                "approval decision 9 is not valid".to_string(),
            ),
            (
                pb::Approval {
                    kind: "shell".into(),
                    ..good.clone()
                },
                "approval kind \"shell\" is not valid; expected \"command\", \"file_change\" or \"other\"".to_string(),
            ),
            (
                pb::Approval {
                    state: String::new(),
                    ..good
                },
                "approval state \"\" is not valid; expected \"pending\", \"decided\" or \"expired\"".to_string(),
            ),
        ] {
            assert_eq!(
                invalid_event(Body::ApprovalRequested(pb::ApprovalRequested {
                    approval: Some(a),
                })),
                invalid_msg(&msg)
            );
        }

        let mut inv = invocation_to_pb(&invocation_full());
        inv.action = 4;
        assert_eq!(
            invalid_event(Body::InvocationCreated(pb::InvocationCreated {
                invocation: Some(inv),
                flight: Some(flight_to_pb(&flight_bare())),
            })),
            invalid_msg("action 4 is not valid")
        );
        let mut f = flight_to_pb(&flight_bare());
        f.state = 0;
        assert_eq!(
            invalid_event(Body::InvocationCreated(pb::InvocationCreated {
                invocation: Some(invocation_to_pb(&invocation_full())),
                flight: Some(f),
            })),
            invalid_msg("flight state 0 is not valid")
        );
        assert_eq!(
            invalid_event(Body::FlightUpdated(pb::FlightUpdated {
                update: Some(pb::FlightUpdate::default()),
                flight: Some(flight_to_pb(&flight_bare())),
            })),
            invalid_msg("flight update has no change")
        );
        assert_eq!(
            invalid_msg("x").to_string(),
            "invalid event: x",
            "Display names the cause"
        );
    }
}
