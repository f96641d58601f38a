//! The live view of `relay ask`: the reply as it streams on stdout, and what the agent
//! is doing on stderr. On a terminal that is a status line, redrawn in place and cut to
//! the terminal's width (so it never wraps and fills the scrollback); in a pipe, it is a
//! line for each thing a person would want to know while waiting (a harness note such
//! as "Reconnecting... 2/5", an approval to decide, the broker going away and coming
//! back). An approval is always said on a line of its own, whole, with how to answer it.

use relay_protocol::domain::{FlightChange, FlightState, ItemKind};

use crate::terminal::{cut, errln, inert, one_line, out, outln, write_stderr};

/// How `relay ask` tells what happens on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// A status line, redrawn in place (stderr is a terminal).
    Line,
    /// A line per note, approval or reconnection (stderr is not a terminal).
    Lines,
}

pub struct AskView {
    agent: String,
    status: Status,
    /// Print the streamed text on stdout (not with --json).
    print: bool,
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
    /// The last note said as a line (the same note again is not repeated).
    last_note: Option<String>,
}

impl AskView {
    pub fn new(agent: &str, state: FlightState, status: Status, print: bool) -> AskView {
        AskView {
            agent: agent.to_string(),
            status,
            print,
            state,
            activity: "waiting for the agent".into(),
            printed: false,
            mid_line: false,
            message: String::new(),
            status_shown: false,
            last_print: std::time::Instant::now(),
            last_note: None,
        }
    }

    pub fn apply(&mut self, change: &FlightChange) {
        use relay_protocol::domain::ItemPhase;
        match change {
            FlightChange::Delta { text } => {
                self.message.push_str(text);
                self.activity = "writing".into();
                if self.print {
                    self.print(text);
                }
            }
            FlightChange::Item {
                item_kind, phase, ..
            } => match (item_kind, phase) {
                (ItemKind::AgentMessage, ItemPhase::Started) => {
                    // A new message of the same turn starts on a paragraph of its own.
                    if self.print && self.printed {
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
                    (FlightState::Waiting, Some(reason)) => self.approval(reason),
                    (FlightState::Waking, _) => "starting the agent's session".into(),
                    (FlightState::Queued, _) => "queued behind the agent's other work".into(),
                    _ => "working".into(),
                };
            }
            FlightChange::Note { text, .. } => {
                self.activity = format!("note: {}", one_line(text));
                if self.last_note.as_deref() != Some(text.as_str()) {
                    self.last_note = Some(text.clone());
                    if self.status == Status::Lines {
                        self.line(&format!("{}: {}", self.agent, one_line(text)));
                    }
                }
            }
            _ => {}
        }
    }

    /// An approval the flight waits for, from its state reason (`approval apr_...:
    /// <command>`): said whole on a line of its own; the status line keeps it short.
    fn approval(&mut self, reason: &str) -> String {
        match parse_approval(reason) {
            Some((id, detail)) => {
                self.line(&format!(
                    "{} asks for approval {id}: {}\n  answer: relay approval decide {id} accept|decline",
                    self.agent,
                    one_line(detail)
                ));
                format!("waiting for approval {id} (relay approval decide {id} accept|decline)")
            }
            None => one_line(reason),
        }
    }

    /// Says `text` on stderr as a line, below the streamed text, never over it.
    pub fn line(&mut self, text: &str) {
        self.clear_status();
        if self.mid_line && self.print {
            outln!();
            self.mid_line = false;
        }
        errln!("relay: {text}");
    }

    fn print(&mut self, text: &str) {
        self.clear_status();
        out!("{text}");
        self.printed = true;
        self.mid_line = !text.ends_with('\n');
        self.last_print = std::time::Instant::now();
    }

    /// Redraws the status line (a terminal only), cut to `width` columns.
    pub fn draw_status(&mut self, frame: char, width: usize) {
        if self.status != Status::Line
            || self.state.is_terminal()
            || self.last_print.elapsed() < std::time::Duration::from_millis(400)
        {
            return;
        }
        if self.mid_line && !self.status_shown && self.print {
            // Under the unfinished line, never over it.
            outln!();
            self.mid_line = false;
        }
        let text = format!("{frame} {}: {} ({})", self.agent, self.activity, self.state);
        // One column spare: a line that fills the last column wraps on some terminals.
        let text = cut(&inert(&text), width.saturating_sub(1));
        write_stderr(&format!("\r\x1b[K{text}"));
        self.status_shown = true;
    }

    pub fn clear_status(&mut self) {
        if self.status_shown {
            write_stderr("\r\x1b[K");
            self.status_shown = false;
        }
    }

    /// Ends the streamed text; returns the last agent message if anything streamed.
    pub fn finish(&mut self) -> Option<String> {
        self.clear_status();
        if !self.printed {
            return None;
        }
        if self.mid_line {
            outln!();
            self.mid_line = false;
        }
        Some(std::mem::take(&mut self.message))
    }
}

/// The approval id and the command of a waiting state's reason (`approval apr_...:
/// <command>`).
fn parse_approval(reason: &str) -> Option<(&str, &str)> {
    reason
        .strip_prefix("approval ")
        .and_then(|r| r.split_once(": "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn an_approval_reason_is_read_back() {
        assert_eq!(
            parse_approval("approval apr_123: cargo test -p x\nmore"),
            Some(("apr_123", "cargo test -p x\nmore"))
        );
        assert_eq!(parse_approval("something else"), None);
    }

    #[test]
    fn the_ask_view_follows_the_flight() {
        let mut v = AskView::new("cx", FlightState::Queued, Status::Line, false);
        v.apply(&FlightChange::State {
            to: FlightState::Waking,
            reason: None,
            output: None,
        });
        assert_eq!(v.activity, "starting the agent's session");
        v.apply(&FlightChange::Note {
            text: "Reconnecting... 2/5 (stream disconnected)".into(),
            by: None,
        });
        assert_eq!(
            v.activity,
            "note: Reconnecting... 2/5 (stream disconnected)"
        );
        v.apply(&FlightChange::Delta {
            text: "draft".into(),
        });
        v.apply(&FlightChange::Item {
            item_id: "m2".into(),
            item_kind: ItemKind::AgentMessage,
            phase: relay_protocol::domain::ItemPhase::Started,
            text: None,
            exit_code: None,
        });
        v.apply(&FlightChange::Delta {
            text: "final".into(),
        });
        assert_eq!(v.message, "final", "a new message replaces the last one");
        v.apply(&FlightChange::State {
            to: FlightState::Waiting,
            reason: Some("approval apr_9: rm -rf x".into()),
            output: None,
        });
        assert_eq!(v.state, FlightState::Waiting);
        assert_eq!(
            v.activity,
            "waiting for approval apr_9 (relay approval decide apr_9 accept|decline)"
        );
        // Nothing printed (print = false): nothing to finish.
        assert_eq!(v.finish(), None);
    }
}
