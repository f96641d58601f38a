//! How the client commands show what the broker answers: JSON, one-line
//! summaries; the live views of `relay ask` ([`ask`]) and `relay watch` ([`watch`]);
//! the transcripts of `relay replay` ([`replay`]).

use relay_protocol::event::Event;
use serde::Serialize;

use crate::terminal::{jsonln, outln};

pub mod ask;
pub mod replay;
pub mod table;
pub mod watch;

/// `v` as pretty JSON on stdout.
pub fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    jsonln!(&serde_json::to_string_pretty(v)?);
    Ok(())
}

/// A message as `relay read` and `relay watch` show it: `[index] author: body`.
pub fn print_message(m: &relay_protocol::domain::Message) {
    let reply = m
        .reply_to
        .as_deref()
        .map(|r| format!(" (reply to {r})"))
        .unwrap_or_default();
    outln!("[{}] {}{}: {}", m.index, m.author, reply, m.body);
}

/// A one-line description of the NATS connection (`relay status`).
pub fn describe_nats(nats: &relay_protocol::api::NatsStatus) -> String {
    use relay_protocol::api::NatsStatus;
    match nats {
        NatsStatus::Disabled => "disabled (start with --nats URL)".into(),
        // An agent's token is not told where the bus is.
        NatsStatus::Connected { url } if url.is_empty() => "connected".into(),
        NatsStatus::Connected { url } => format!("connected to {url}"),
        NatsStatus::Disconnected {
            url,
            since_ms,
            error,
        } => {
            let secs = relay_protocol::clock::now_ms().saturating_sub(*since_ms) / 1000;
            let mut line = match url.as_str() {
                "" => format!("disconnected for {secs} s"),
                url => format!("disconnected from {url} for {secs} s"),
            };
            if let Some(e) = error {
                line.push_str(&format!(" (last error: {e})"));
            }
            line
        }
    }
}

/// What an event is about, on one line (`relay events`).
pub fn describe_event(e: &Event) -> String {
    use relay_protocol::event::EventBody as B;
    match &e.body {
        B::AgentRegistered { agent } | B::AgentUpdated { agent } => agent.spec.name.clone(),
        B::AgentRemoved { name, .. } => name.clone(),
        B::ThreadLost { agent, reason, .. } => format!("{agent}: {reason}"),
        B::ConversationCreated { conversation } => conversation.spec.id.clone(),
        B::MessagePosted { message, .. } => format!(
            "{} {}: {}",
            message.conversation,
            message.author,
            message.body.lines().next().unwrap_or("")
        ),
        B::DeliveryPlanned { delivery } | B::DeliveryAttempted { delivery } => {
            format!("{} -> {}", delivery.message, delivery.target)
        }
        B::InvocationCreated { flight, .. } => format!("{} {}", flight.id, flight.agent),
        B::FlightUpdated { update, flight } => {
            format!("{} #{} {}", flight.id, update.seq, flight.state)
        }
        B::BindingCreated { binding } => format!("{} {}", binding.conversation, binding.target),
        B::ApprovalRequested { approval } | B::ApprovalDecided { approval } => {
            format!("{} {}", approval.id, approval.request.detail)
        }
        B::RuleAdded { rule } => format!(
            "{} {} {} {}",
            rule.id, rule.scope, rule.decision, rule.pattern
        ),
        B::RuleRemoved { rule, removed_by } => format!("{} by {removed_by}", rule.id),
    }
}

/// `what`, and who asked for it where recorded (a dashboard login, the operator...).
pub(crate) fn by_whom(what: &str, by: &Option<String>) -> String {
    by.as_ref()
        .map_or(what.to_string(), |b| format!("{what} (by {b})"))
}

/// A flight's note, and who asked for what it records (a steer, an interrupt).
pub(crate) fn note_line(text: &str, by: &Option<String>) -> String {
    by_whom(&format!("note: {text}"), by)
}
