//! The live view of `relay ask`: the reply as it streams, and a status line.

use relay_protocol::domain::{FlightChange, FlightState, ItemKind};

use crate::terminal::{inert, one_line, out, outln};

/// What `relay ask` shows: the reply as it streams on stdout, and on a terminal a
/// status line on stderr whenever nothing has printed for a moment (what the agent is
/// doing, and how to answer an approval it waits for).
pub struct AskView {
    state: FlightState,
    /// What the flight is doing, for the status line.
    activity: String,
    /// Anything printed on stdout yet, and whether its last line is unfinished.
    printed: bool,
    mid_line: bool,
    /// The agent message being streamed.
    message: String,
    status_shown: bool,
    last_print: std::time::Instant,
}

impl AskView {
    pub fn new(state: FlightState) -> AskView {
        AskView {
            state,
            activity: "waiting for the agent".into(),
            printed: false,
            mid_line: false,
            message: String::new(),
            status_shown: false,
            last_print: std::time::Instant::now(),
        }
    }

    pub fn apply(&mut self, change: &FlightChange, print: bool) {
        use relay_protocol::domain::ItemPhase;
        match change {
            FlightChange::Delta { text } => {
                self.message.push_str(text);
                if print {
                    self.print(text);
                }
            }
            FlightChange::Item {
                item_kind, phase, ..
            } => match (item_kind, phase) {
                (ItemKind::AgentMessage, ItemPhase::Started) => {
                    // A new message of the same turn starts on a paragraph of its own.
                    if print && self.printed {
                        self.print(if self.mid_line { "\n\n" } else { "\n" });
                    }
                    self.message.clear();
                    self.activity = "writing".into();
                }
                (ItemKind::CommandExecution, ItemPhase::Started) => {
                    self.activity = "running a command".into()
                }
                (ItemKind::FileChange, ItemPhase::Started) => {
                    self.activity = "changing files".into()
                }
                (ItemKind::Reasoning, ItemPhase::Started) => self.activity = "thinking".into(),
                (_, ItemPhase::Completed) => self.activity = "working".into(),
                (other, ItemPhase::Started) => self.activity = other.as_str().replace('_', " "),
            },
            FlightChange::State { to, reason, .. } => {
                self.state = *to;
                self.activity = match (to, reason) {
                    (FlightState::Waiting, Some(reason)) => approval_hint(reason),
                    (FlightState::Waking, _) => "starting the agent's session".into(),
                    _ => "working".into(),
                };
            }
            _ => {}
        }
    }

    fn print(&mut self, text: &str) {
        use std::io::Write;
        self.clear_status();
        out!("{text}");
        let _ = std::io::stdout().flush();
        self.printed = true;
        self.mid_line = !text.ends_with('\n');
        self.last_print = std::time::Instant::now();
    }

    pub fn draw_status(&mut self, agent: &str, frame: char) {
        if self.state.is_terminal()
            || self.last_print.elapsed() < std::time::Duration::from_millis(400)
        {
            return;
        }
        if self.mid_line && !self.status_shown {
            // Under the unfinished line, never over it.
            outln!();
            self.mid_line = false;
        }
        eprint!(
            "\r\x1b[K{}",
            inert(&format!(
                "{frame} {agent}: {} ({})",
                self.activity, self.state
            ))
        );
        self.status_shown = true;
    }

    pub fn clear_status(&mut self) {
        if self.status_shown {
            eprint!("\r\x1b[K");
            self.status_shown = false;
        }
    }

    /// Ends the streamed text; returns the last agent message if anything streamed.
    pub fn finish(&mut self) -> Option<String> {
        if !self.printed {
            return None;
        }
        if self.mid_line {
            outln!();
        }
        Some(std::mem::take(&mut self.message))
    }
}

/// The status line for a flight waiting on an approval, from its state reason
/// (`approval apr_...: <command>`).
fn approval_hint(reason: &str) -> String {
    match reason
        .strip_prefix("approval ")
        .and_then(|r| r.split_once(": "))
    {
        // The whole command on one line: a second line must not hide.
        Some((id, detail)) => format!(
            "waiting for approval of `{}`: relay approve {id} accept|decline",
            one_line(detail)
        ),
        None => reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_status_line_says_how_to_answer_an_approval() {
        assert_eq!(
            approval_hint("approval apr_123: cargo test -p x\nmore"),
            "waiting for approval of `cargo test -p x\\nmore`: relay approve apr_123 accept|decline"
        );
        assert_eq!(approval_hint("something else"), "something else");
    }

    #[test]
    fn the_ask_view_follows_the_flight() {
        let mut v = AskView::new(FlightState::Queued);
        v.apply(
            &FlightChange::State {
                to: FlightState::Waking,
                reason: None,
                output: None,
            },
            false,
        );
        assert_eq!(v.activity, "starting the agent's session");
        v.apply(
            &FlightChange::Delta {
                text: "draft".into(),
            },
            false,
        );
        v.apply(
            &FlightChange::Item {
                item_id: "m2".into(),
                item_kind: ItemKind::AgentMessage,
                phase: relay_protocol::domain::ItemPhase::Started,
                text: None,
            },
            false,
        );
        v.apply(
            &FlightChange::Delta {
                text: "final".into(),
            },
            false,
        );
        assert_eq!(v.message, "final", "a new message replaces the last one");
        v.apply(
            &FlightChange::State {
                to: FlightState::Waiting,
                reason: Some("approval apr_9: rm -rf x".into()),
                output: None,
            },
            false,
        );
        assert_eq!(v.state, FlightState::Waiting);
        assert!(v.activity.contains("relay approve apr_9"), "{}", v.activity);
        // Nothing printed (print = false): nothing to finish.
        assert_eq!(v.finish(), None);
    }
}
