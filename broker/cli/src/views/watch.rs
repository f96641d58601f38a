//! The text view of `relay watch`: a snapshot, then each event of its scope as it comes.
//! A flight reads like `relay ask`: its streamed text as it streams, anything else on a
//! line of its own in brackets. An agent's and a conversation's events take one line
//! each. Everything of agent or model text goes through [`crate::terminal`].

use relay_protocol::domain::{FlightChange, FlightUpdate};
use relay_protocol::event::{Event, EventBody};
use relay_protocol::watch::{Scope, Snapshot, View};

use super::print_message;
use crate::terminal::{one_line, out, outln};

#[derive(Default)]
pub struct WatchView {
    /// The last line printed is unfinished (streamed text without its newline).
    mid_line: bool,
    /// The flight whose transcript is being shown (an agent's watch switches between
    /// its flights, each under a header line).
    current: Option<String>,
}

impl WatchView {
    pub fn snapshot(&mut self, s: &Snapshot) {
        match &s.view {
            View::Fleet(v) => {
                outln!(
                    "fleet: {} agents, {} flights not ended, {} approvals waiting (at seq {})",
                    v.agents.len(),
                    v.flights.len(),
                    v.approvals.len(),
                    s.seq
                );
                for a in &v.agents {
                    // Busy (a flight of its runs a turn) is derived, not stored.
                    let turning = v
                        .flights
                        .iter()
                        .any(|f| f.agent == a.spec.name && f.state.runs_turn());
                    let state = a.state.shown(turning);
                    outln!("  agent {} ({}): {state}", a.spec.name, a.spec.harness);
                }
                for f in &v.flights {
                    outln!("  flight {} of {}: {}", f.id, f.agent, f.state);
                }
                for a in &v.approvals {
                    print_approval(a);
                }
            }
            View::Flight(v) => {
                let f = &v.flight;
                outln!(
                    "flight {} of {}: {} (at seq {})",
                    f.id,
                    f.agent,
                    f.state,
                    s.seq
                );
                for u in &v.updates {
                    self.update(u);
                }
            }
            View::Agent(v) => {
                let a = &v.agent;
                let turning = v.flights.iter().any(|f| f.flight.state.runs_turn());
                outln!(
                    "agent {} ({}): {}, {} flights not ended (at seq {})",
                    a.spec.name,
                    a.spec.harness,
                    a.state.shown(turning),
                    v.flights.len(),
                    s.seq
                );
                for f in &v.flights {
                    outln!(
                        "  flight {} {}: {}",
                        f.flight.id,
                        f.flight.state,
                        one_line(f.flight.summary.as_deref().unwrap_or(""))
                    );
                }
            }
            View::Conversation(v) => {
                let c = &v.conversation;
                outln!(
                    "conversation {}: {} messages, the last {} below (at seq {})",
                    c.spec.id,
                    c.message_count,
                    v.messages.len(),
                    s.seq
                );
                for m in &v.messages {
                    print_message(m);
                }
            }
        }
    }

    /// One followed event (a flight's update, or an agent's, a conversation's or the
    /// fleet's event). The fleet's flights show their changes of state only.
    pub fn event(&mut self, scope: &Scope, e: &Event) {
        let transcript = matches!(e.body, EventBody::FlightUpdated { .. })
            && matches!(scope, Scope::Flight(_) | Scope::Agent(_));
        if !transcript {
            self.end_line();
        }
        match &e.body {
            EventBody::FlightUpdated { update, .. } if matches!(scope, Scope::Flight(_)) => {
                self.update(update)
            }
            // An agent's flights read as transcripts, each under its id.
            EventBody::FlightUpdated { update, flight } if matches!(scope, Scope::Agent(_)) => {
                if self.current.as_deref() != Some(flight.id.as_str()) {
                    self.end_line();
                    outln!("── flight {} ──", flight.id);
                    self.current = Some(flight.id.clone());
                }
                self.update(update)
            }
            EventBody::FlightUpdated { update, .. }
                if *scope == Scope::Fleet
                    && !matches!(update.change, FlightChange::State { .. }) => {}
            EventBody::ApprovalRequested { approval } | EventBody::ApprovalDecided { approval } => {
                print_approval(approval)
            }
            EventBody::FlightUpdated { update, .. } => outln!(
                "flight {} #{} {}",
                update.flight,
                update.seq,
                describe(&update.change)
            ),
            EventBody::MessagePosted { message: m, .. } => print_message(m),
            EventBody::AgentRegistered { agent } | EventBody::AgentUpdated { agent } => {
                outln!("agent {}: {}", agent.spec.name, agent.state)
            }
            EventBody::AgentRemoved { name, .. } => outln!("agent {name}: removed"),
            EventBody::ThreadLost { agent, reason, .. } => {
                outln!(
                    "agent {agent}: its thread was lost and replaced ({})",
                    one_line(reason)
                )
            }
            EventBody::InvocationCreated { invocation, flight } => {
                self.end_line();
                outln!(
                    "flight {} {} from {}: {}",
                    flight.id,
                    flight.state,
                    invocation.requester,
                    one_line(&invocation.task)
                )
            }
            _ => {}
        }
    }

    /// A flight's update as a transcript: streamed text as is, anything else on a line
    /// of its own in brackets.
    pub fn update(&mut self, u: &FlightUpdate) {
        if let FlightChange::Delta { text } = &u.change {
            out!("{text}");
            self.mid_line = !text.ends_with('\n');
            return;
        }
        self.end_line();
        outln!("[{}]", describe(&u.change));
    }

    /// Ends an unfinished line of streamed text.
    pub fn end_line(&mut self) {
        if self.mid_line {
            outln!();
            self.mid_line = false;
        }
    }
}

/// An approval on one line: its state, agent, flight and command.
fn print_approval(a: &relay_protocol::domain::Approval) {
    let decided = match (&a.decision, &a.decided_by) {
        (Some(d), Some(by)) => format!(" {d} by {by}"),
        _ => String::new(),
    };
    outln!(
        "  approval {} {}{decided}: {} in flight {}: {}",
        a.id,
        a.state,
        a.agent,
        a.request.flight,
        one_line(&a.request.detail)
    );
}

/// A flight change on one line.
fn describe(change: &FlightChange) -> String {
    match change {
        FlightChange::State { to, reason, .. } => match reason {
            Some(r) => format!("{to}: {}", one_line(r)),
            None => to.to_string(),
        },
        FlightChange::Delta { text } => one_line(text),
        FlightChange::Item {
            item_kind,
            phase,
            text,
            ..
        } => match text {
            Some(t) => format!("{} {phase}: {}", item_kind.as_str(), one_line(t)),
            None => format!("{} {phase}", item_kind.as_str()),
        },
        FlightChange::CommandOutput { text, .. } => format!("output: {}", one_line(text)),
        FlightChange::Plan { text } => format!("plan: {}", one_line(text)),
        FlightChange::Diff { text } => format!("diff: {}", one_line(text)),
        FlightChange::Usage(u) => format!("usage: {} in, {} out", u.input_tokens, u.output_tokens),
        FlightChange::Session { thread_id, turn_id } => format!(
            "session: thread {}, turn {}",
            thread_id.as_deref().unwrap_or("-"),
            turn_id.as_deref().unwrap_or("-")
        ),
        FlightChange::Note { text, .. } => format!("note: {}", one_line(text)),
        FlightChange::Commit { commit } => commit.summary(),
        FlightChange::Reverted { revert } => revert.summary(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_protocol::domain::{FlightState, ItemKind, ItemPhase};

    #[test]
    fn a_change_takes_one_line_however_its_text_looks() {
        assert_eq!(
            describe(&FlightChange::State {
                to: FlightState::Failed,
                reason: Some("boom\nsecond line".into()),
                output: None,
            }),
            "failed: boom\\nsecond line"
        );
        assert_eq!(
            describe(&FlightChange::Item {
                item_id: "i".into(),
                item_kind: ItemKind::CommandExecution,
                phase: ItemPhase::Started,
                text: Some("rm -rf x\r\x1b[2Kls".into()),
                exit_code: None,
            }),
            "command_execution started: rm -rf x\\x0d\\x1b[2Kls"
        );
        assert_eq!(
            describe(&FlightChange::Usage(
                relay_protocol::domain::TokenUsage::new(3, 4)
            )),
            "usage: 3 in, 4 out"
        );
    }
}
