//! The fold: the flight after one of its updates ([`Flight::apply`]), and the text rules
//! it applies (summaries, the tail of streamed text, a clipped note, the bytes a change
//! streams). One function for everyone who computes a flight from its updates: the
//! broker's rules use it to make the flight they record, so a reader that folds the same
//! updates (a watch, the publisher, a replay) cannot drift from the writer.
//!
//! What is the rules' and not the fold's: whether an update may happen at all (the state
//! machine, a flight that ended, the output cap, the same session or commit again). The
//! fold applies what was recorded.

use super::{Flight, FlightChange, FlightState, FlightUpdate, ItemKind, ItemPhase, Note};

/// Longest live summary kept on a flight, in characters.
pub const SUMMARY_CHARS: usize = 160;
/// Longest note kept on a flight and its agent, in bytes (the update itself keeps all
/// of it).
pub const NOTE_BYTES: usize = 2048;

impl Flight {
    /// Applies `update` as the broker records it: a record never keeps `streaming`
    /// (whether the last update was a delta is the writer's to know: `last_was_delta`),
    /// so it is set for the fold and cleared after. What the broker's rules do, and what
    /// a reader that folds stored deltas onto a record does to end with the same flight.
    pub fn apply_recorded(
        &mut self,
        update: &FlightUpdate,
        reply: Option<&str>,
        last_was_delta: bool,
    ) -> bool {
        self.streaming = matches!(update.change, FlightChange::Delta { .. }) && last_was_delta;
        let applied = self.apply(update, reply);
        self.streaming = false;
        applied
    }

    /// Applies `update` (the flight's next one: its `seq` above [`Flight::update_seq`]).
    /// An update at or below `update_seq` is in the flight already and changes nothing
    /// (`false`): so a reader that rolls a snapshot forward over updates it may have seen
    /// ends with the same flight. `reply`: the id of the reply message a completion
    /// posted (it is not in the update).
    pub fn apply(&mut self, update: &FlightUpdate, reply: Option<&str>) -> bool {
        if update.seq <= self.update_seq {
            return false;
        }
        let change = &update.change;
        self.output_bytes = self.output_bytes.saturating_add(streamed_bytes(change));
        // Streamed text accumulates; after anything else it starts afresh.
        let extends = self.streaming;
        self.streaming = false;
        match change {
            FlightChange::Commit { commit } => {
                let mut kept = (**commit).clone();
                // The patch stays in the log with its update; a revert made before this
                // commit was recorded again (a report replayed after a restart) holds.
                kept.patch = None;
                kept.reverted_by = self.commit.as_ref().and_then(|c| c.reverted_by.clone());
                self.commit = Some(kept);
            }
            FlightChange::Reverted { revert } => {
                if let Some(commit) = self.commit.as_mut() {
                    commit.reverted_by = Some(revert.clone());
                }
            }
            FlightChange::State { to, reason, output } => {
                self.state = *to;
                match to {
                    FlightState::Completed => self.output = output.clone(),
                    FlightState::Failed | FlightState::Cancelled => {
                        self.error = reason.clone();
                        self.summary = reason.as_deref().map(summarize);
                    }
                    _ => {
                        if let Some(r) = reason {
                            self.summary = Some(summarize(r));
                        }
                    }
                }
            }
            FlightChange::Delta { text } => {
                let mut s = if extends {
                    self.summary.take().unwrap_or_default()
                } else {
                    String::new()
                };
                s.push_str(text);
                self.summary = Some(tail(&s, SUMMARY_CHARS));
                // An ended flight streams no more: nothing to extend.
                self.streaming = !self.state.is_terminal();
            }
            // Streamed text shows itself through the deltas that follow.
            FlightChange::Item {
                item_kind,
                phase: ItemPhase::Started,
                text,
                ..
            } if !matches!(
                item_kind,
                ItemKind::AgentMessage | ItemKind::UserMessage | ItemKind::Reasoning
            ) =>
            {
                self.summary = Some(summarize(&match text {
                    Some(t) => format!("{item_kind}: {t}"),
                    None => item_kind.to_string(),
                }));
            }
            FlightChange::Session { thread_id, turn_id } => {
                if thread_id.is_some() {
                    self.thread_id = thread_id.clone();
                }
                if turn_id.is_some() {
                    self.turn_id = turn_id.clone();
                }
            }
            FlightChange::Note { text, .. } => {
                self.summary = Some(summarize(text));
                self.note = Some(Note {
                    text: clip(text, NOTE_BYTES),
                    at: update.at,
                    flight: None,
                });
            }
            FlightChange::Usage(usage) => self.usage = Some(usage.clone()),
            FlightChange::Item { .. }
            | FlightChange::CommandOutput { .. }
            | FlightChange::Plan { .. }
            | FlightChange::Diff { .. } => {}
        }
        if let Some(id) = reply {
            self.reply_message = Some(id.to_string());
        }
        self.update_seq = update.seq;
        self.updated_at = update.at;
        true
    }
}

/// What a change streams, as the output cap counts it: its text (a state change's
/// final output or reason is not streaming, and the task echoed back as a user-message
/// item is bounded by the message limit already: they count nothing).
pub fn streamed_bytes(change: &FlightChange) -> u64 {
    let n = match change {
        FlightChange::Item {
            item_kind: ItemKind::UserMessage,
            ..
        } => 0,
        FlightChange::Delta { text }
        | FlightChange::CommandOutput { text, .. }
        | FlightChange::Plan { text }
        | FlightChange::Diff { text }
        | FlightChange::Note { text, .. } => text.len(),
        FlightChange::Item { text, .. } => text.as_ref().map_or(0, |t| t.len()),
        FlightChange::State { .. }
        | FlightChange::Usage { .. }
        | FlightChange::Session { .. }
        | FlightChange::Commit { .. }
        | FlightChange::Reverted { .. } => 0,
    };
    n as u64
}

/// The first line of `s`, cut to [`SUMMARY_CHARS`].
pub fn summarize(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    match line.char_indices().nth(SUMMARY_CHARS) {
        Some((i, _)) => {
            let head = &line[..i];
            // At the last word boundary, unless that throws most of it away.
            let head = match head.rfind(' ') {
                Some(space) if space >= i / 2 => &head[..space],
                _ => head,
            };
            format!("{}…", head.trim_end())
        }
        None => line.to_string(),
    }
}

/// The last `n` characters of `s`, on one line; when cut, from the start of a word and
/// marked with `…` (never the middle of a word, unless one word is all there is).
/// Reads `s` from its end, no further than its last `n` characters: a merged delta of
/// 12 KiB mapped and counted whole, for each update, was a sixth of the storage thread's
/// time in a burst.
pub fn tail(s: &str, n: usize) -> String {
    let flat = |t: &str| -> String { t.chars().map(|c| if c == '\n' { ' ' } else { c }).collect() };
    // Where the last `n` characters start, when `s` has more than `n`.
    let start = match n.checked_sub(1) {
        None => (!s.is_empty()).then_some(s.len()),
        Some(before) => match s.char_indices().rev().nth(before) {
            Some((i, _)) if i > 0 => Some(i),
            _ => None,
        },
    };
    let Some(start) = start else {
        return flat(s);
    };
    let cut = flat(&s[start..]);
    let from_word = match cut.find(' ') {
        Some(space) if space < cut.len() / 2 => cut[space..].trim_start(),
        _ => cut.as_str(),
    };
    format!("…{from_word}")
}

/// `text` cut to at most `max` bytes (at a character boundary), with `…(N bytes)` saying
/// how long it was when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…({} bytes)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_rules() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("abcdef", 3), "abc…(6 bytes)");
        assert_eq!(clip("héllo", 2), "h…(6 bytes)");
        assert_eq!(summarize("first\nsecond"), "first");
        let long = format!("{} tail", "word ".repeat(40));
        let s = summarize(&long);
        assert!(
            s.ends_with("word…") && s.chars().count() <= SUMMARY_CHARS + 1,
            "{s}"
        );
        assert_eq!(tail("a\nb", 10), "a b");
        assert_eq!(tail("one two three", 9), "…three");
    }

    /// `tail` as it was, reading the whole text: the one read from the end must agree.
    fn tail_whole(s: &str, n: usize) -> String {
        let flat: String = s.chars().map(|c| if c == '\n' { ' ' } else { c }).collect();
        let count = flat.chars().count();
        if count <= n {
            return flat;
        }
        let cut: String = flat.chars().skip(count - n).collect();
        let from_word = match cut.find(' ') {
            Some(space) if space < cut.len() / 2 => cut[space..].trim_start(),
            _ => cut.as_str(),
        };
        format!("…{from_word}")
    }

    #[test]
    fn the_tail_read_from_the_end_is_the_tail_of_the_whole() {
        let texts = [
            String::new(),
            "a".into(),
            "one two three".into(),
            "héllo wörld\nçava 日本語 テキスト\n\n end".into(),
            "word ".repeat(50),
            "x".repeat(200),
            format!("{}\n{}", "é".repeat(90), "ü ".repeat(45)),
        ];
        for text in &texts {
            for n in [0, 1, 2, 5, 9, 13, 79, 80, 81, 100, 199, 200, 201, 500] {
                assert_eq!(tail(text, n), tail_whole(text, n), "{text:?} {n}");
            }
        }
    }
}
