//! A `text/event-stream` parser as the HTML standard defines it ("event stream
//! interpretation"), fed the body's chunks as they come, with bounded buffers.
//!
//! Lines end with CRLF, LF or CR (a CR at the end of a chunk and the LF starting the
//! next are one line end); a BOM at the start of the stream is dropped; a line starting
//! with `:` is a comment; `field: value` loses one space after the colon, a line
//! without a colon is a field with an empty value. `event` sets the event's type
//! (`message` when none), each `data` line appends to its data (joined with `\n`), `id`
//! sets the last event id (kept across events, and across connections by
//! [`SseParser::resuming`]; one holding a NUL is ignored), `retry` the reconnection
//! time (digits only); other fields are ignored. A blank line dispatches the event
//! (none when it has no data, yet an `id` it carried still counts). An event cut off by
//! the end of the stream is not dispatched.
//!
//! Bytes are kept only while their line is incomplete, each copied once, so a large
//! chunk costs its length once. A line or an event's data over [`SseLimits`] is an
//! [`SseError`], not unbounded memory.

use std::time::Duration;

/// The largest event's data the client takes: the broker sends a note to read an
/// event from the log instead of one larger.
pub const MAX_SSE_EVENT: usize = 16 << 20;

/// How large a line and an event's data may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseLimits {
    /// Bytes of one line, its line end excluded.
    pub line: usize,
    /// Bytes of one event's data (its lines joined).
    pub event: usize,
}

impl Default for SseLimits {
    fn default() -> Self {
        SseLimits {
            // A data line of the largest event, with its field name.
            line: MAX_SSE_EVENT + 64,
            event: MAX_SSE_EVENT,
        }
    }
}

/// A stream over its limits: the stream cannot go on (what follows is mid-event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("a line of the event stream is over {limit} bytes")]
    LineTooLong { limit: usize },
    #[error("an event of the event stream is over {limit} bytes")]
    EventTooLarge { limit: usize },
}

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its type: the last `event:` field, `message` when it had none.
    pub event: String,
    /// Its `data:` lines joined with `\n`.
    pub data: String,
    /// The last event id when it was dispatched: its own `id:`, else the one before
    /// (what a reconnecting client sends as `Last-Event-ID`); empty when none was set.
    pub id: String,
}

/// The parser of one stream (see the module docs).
#[derive(Debug, Default)]
pub struct SseParser {
    limits: SseLimits,
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    /// The last line ended with CR: an LF first thing next is its CRLF's.
    after_cr: bool,
    /// A line was read already: a BOM can only start the first.
    started: bool,
    kind: String,
    data: String,
    /// Whether a `data` field came (an empty one makes an event with empty data).
    has_data: bool,
    /// The last event id buffer: what `id:` fields set.
    id_buffer: String,
    /// The last event id: the buffer as it was at the last dispatch.
    last_id: String,
    retry: Option<Duration>,
}

impl SseParser {
    /// A parser with `limits`.
    pub fn new(limits: SseLimits) -> SseParser {
        SseParser {
            limits,
            ..SseParser::default()
        }
    }

    /// A parser of a reconnection's stream: its last event id is the one the previous
    /// connection ended with, until the stream sets another (as browsers keep it).
    pub fn resuming(limits: SseLimits, last_id: &str) -> SseParser {
        SseParser {
            id_buffer: last_id.to_string(),
            last_id: last_id.to_string(),
            ..SseParser::new(limits)
        }
    }

    /// The last event id as of the last blank line (an event's end), whether or not that
    /// event had data; empty when none was set.
    pub fn last_event_id(&self) -> &str {
        &self.last_id
    }

    /// The reconnection time the stream asked for (`retry:`), if it did.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Takes a chunk of the body, calling `on_event` for each event it completes; false
    /// when `on_event` asked to stop (the rest of the chunk is not read).
    pub fn feed(
        &mut self,
        chunk: &[u8],
        on_event: &mut impl FnMut(&SseEvent) -> bool,
    ) -> Result<bool, SseError> {
        let mut rest = chunk;
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if let Some(tail) = rest.strip_prefix(b"\n") {
                rest = tail;
            }
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (head, tail) = rest.split_at(pos);
            let cr = tail[0] == b'\r';
            rest = &tail[1..];
            if cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    // The LF, if any, is in the next chunk.
                    None => self.after_cr = true,
                }
            }
            let go_on = if self.partial.is_empty() {
                self.check_line(head.len())?;
                self.line(head, on_event)?
            } else {
                self.check_line(self.partial.len() + head.len())?;
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(head);
                let go_on = self.line(&line, on_event)?;
                // The buffer's allocation is kept for the next partial line.
                line.clear();
                self.partial = line;
                go_on
            };
            if !go_on {
                return Ok(false);
            }
        }
        self.check_line(self.partial.len() + rest.len())?;
        self.partial.extend_from_slice(rest);
        Ok(true)
    }

    fn check_line(&self, len: usize) -> Result<(), SseError> {
        if len > self.limits.line {
            return Err(SseError::LineTooLong {
                limit: self.limits.line,
            });
        }
        Ok(())
    }

    /// One whole line, without its line end.
    fn line(
        &mut self,
        bytes: &[u8],
        on_event: &mut impl FnMut(&SseEvent) -> bool,
    ) -> Result<bool, SseError> {
        let text = String::from_utf8_lossy(bytes);
        let mut line: &str = &text;
        if !self.started {
            self.started = true;
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if line.is_empty() {
            return Ok(self.dispatch(on_event));
        }
        if line.starts_with(':') {
            return Ok(true);
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.kind = value.to_string(),
            "data" => {
                let len = self.data.len() + usize::from(self.has_data) + value.len();
                if len > self.limits.event {
                    return Err(SseError::EventTooLarge {
                        limit: self.limits.event,
                    });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.id_buffer = value.to_string(),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                if let Ok(ms) = value.parse::<u64>() {
                    self.retry = Some(Duration::from_millis(ms));
                }
            }
            _ => {}
        }
        Ok(true)
    }

    /// The blank line: the event so far, if it has data.
    fn dispatch(&mut self, on_event: &mut impl FnMut(&SseEvent) -> bool) -> bool {
        if self.last_id != self.id_buffer {
            self.last_id.clone_from(&self.id_buffer);
        }
        let kind = std::mem::take(&mut self.kind);
        if !std::mem::take(&mut self.has_data) {
            return true;
        }
        let event = SseEvent {
            event: if kind.is_empty() {
                "message".to_string()
            } else {
                kind
            },
            data: std::mem::take(&mut self.data),
            id: self.last_id.clone(),
        };
        on_event(&event)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    fn parse_with(p: &mut SseParser, chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut got = Vec::new();
        for c in chunks {
            p.feed(c, &mut |e: &SseEvent| {
                got.push(e.clone());
                true
            })
            .unwrap();
        }
        got
    }

    fn parse(chunks: &[&[u8]]) -> Vec<SseEvent> {
        parse_with(&mut SseParser::default(), chunks)
    }

    fn ev(event: &str, data: &str, id: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
            id: id.into(),
        }
    }

    #[test]
    fn events_are_parsed_across_chunks() {
        let whole: &[u8] =
            b": keep-alive\n\nid: 3\nevent: update\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: l1\ndata:l2\n\n";
        let expected = vec![ev("update", "{\"a\":1}", "3"), ev("x", "l1\nl2", "3")];
        assert_eq!(parse(&[whole]), expected);
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(parse(&bytes), expected, "one byte at a time");
        // A character split between chunks stays whole.
        let text = "data: é\n\n".as_bytes();
        assert_eq!(
            parse(&[&text[..7], &text[7..]]),
            vec![ev("message", "é", "")]
        );
    }

    #[test]
    fn the_last_event_id_is_kept_across_events_until_set_again() {
        let got =
            parse(&[b"id: 7\ndata: a\n\ndata: b\n\nid: 9\nevent: e\ndata: c\n\nid\ndata: d\n\n"]);
        assert_eq!(
            got,
            vec![
                ev("message", "a", "7"),
                ev("message", "b", "7"),
                ev("e", "c", "9"),
                // `id` with no value empties it.
                ev("message", "d", ""),
            ]
        );
        // An id holding a NUL is ignored; an event without data dispatches nothing, yet
        // its id counts.
        let mut p = SseParser::default();
        assert_eq!(
            parse_with(&mut p, &[b"id: 4\n\nid: x\0y\ndata: z\n\n"]),
            vec![ev("message", "z", "4")]
        );
        assert_eq!(p.last_event_id(), "4");
        // A reconnection's parser starts from the previous connection's id.
        let mut p = SseParser::resuming(SseLimits::default(), "12");
        assert_eq!(
            parse_with(&mut p, &[b"data: q\n\n"]),
            vec![ev("message", "q", "12")]
        );
    }

    #[test]
    fn retry_takes_only_digits() {
        let mut p = SseParser::default();
        parse_with(&mut p, &[b"retry: 1500\n\n"]);
        assert_eq!(p.retry(), Some(Duration::from_millis(1500)));
        for bad in [
            &b"retry: 15s\n"[..],
            b"retry:\n",
            b"retry: -1\n",
            b"retry: 1 \n",
        ] {
            parse_with(&mut p, &[bad]);
            assert_eq!(p.retry(), Some(Duration::from_millis(1500)), "{bad:?}");
        }
        parse_with(&mut p, &[b"retry:20\n"]);
        assert_eq!(p.retry(), Some(Duration::from_millis(20)));
    }

    #[test]
    fn data_lines_join_with_newlines_and_an_empty_data_is_an_event() {
        assert_eq!(
            parse(&[b"data\n\ndata:\ndata:\n\ndata:  two spaces\ndata: x \n\n"]),
            vec![
                ev("message", "", ""),
                ev("message", "\n", ""),
                // One space after the colon goes, the rest stays.
                ev("message", " two spaces\nx ", ""),
            ]
        );
    }

    #[test]
    fn comments_and_unknown_fields_are_skipped() {
        assert_eq!(
            parse(&[b":comment\n: data: no\nfoo: bar\nDATA: no\ndata: yes\n:\n\n"]),
            vec![ev("message", "yes", "")]
        );
    }

    #[test]
    fn cr_lf_and_crlf_each_end_a_line() {
        let expected = vec![ev("a", "1", ""), ev("b", "2", "")];
        for text in [
            &b"event: a\ndata: 1\n\nevent: b\ndata: 2\n\n"[..],
            b"event: a\rdata: 1\r\revent: b\rdata: 2\r\r",
            b"event: a\r\ndata: 1\r\n\r\nevent: b\r\ndata: 2\r\n\r\n",
            b"event: a\rdata: 1\n\r\nevent: b\r\ndata: 2\r\r",
        ] {
            assert_eq!(parse(&[text]), expected, "{text:?}");
            // A CRLF split between chunks is one line end, not two.
            let split: Vec<&[u8]> = text.chunks(1).collect();
            assert_eq!(parse(&split), expected, "{text:?} byte by byte");
        }
        // CR CR is two line ends: the second one dispatches.
        assert_eq!(parse(&[b"data: x\r", b"\r"]), vec![ev("message", "x", "")]);
    }

    #[test]
    fn a_bom_is_dropped_at_the_start_only() {
        let bom = "\u{feff}";
        let text = format!("{bom}data: a\n\ndata: {bom}b\n\n");
        assert_eq!(
            parse(&[text.as_bytes()]),
            vec![
                ev("message", "a", ""),
                ev("message", &format!("{bom}b"), "")
            ]
        );
        // Split inside the BOM.
        let b = text.as_bytes();
        assert_eq!(
            parse(&[&b[..1], &b[1..2], &b[2..]])[0],
            ev("message", "a", "")
        );
        // A BOM not at the start makes the field unknown.
        assert_eq!(parse(&[format!("\n{bom}data: a\n\n").as_bytes()]), vec![]);
    }

    #[test]
    fn an_event_cut_off_by_the_end_is_not_dispatched() {
        let mut p = SseParser::default();
        assert_eq!(
            parse_with(&mut p, &[b"id: 1\ndata: whole\n\nid: 2\ndata: cut"]).len(),
            1
        );
        // Its id was read, yet it is not the last event id: the event never came.
        assert_eq!(p.last_event_id(), "1");
    }

    #[test]
    fn stopping_stops_at_that_event() {
        let mut p = SseParser::default();
        let mut seen = Vec::new();
        let go_on = p
            .feed(b"data: 1\n\ndata: 2\n\ndata: 3\n\n", &mut |e: &SseEvent| {
                seen.push(e.data.clone());
                e.data != "2"
            })
            .unwrap();
        assert!(!go_on);
        assert_eq!(seen, ["1", "2"]);
    }

    #[test]
    fn a_line_or_an_event_over_the_limit_is_refused() {
        let limits = SseLimits {
            line: 16,
            event: 20,
        };
        // A line with no end yet, in one chunk and over several.
        let mut p = SseParser::new(limits);
        let r = p.feed(&[b'x'; 17], &mut |_: &SseEvent| true);
        assert_eq!(r, Err(SseError::LineTooLong { limit: 16 }));
        let mut p = SseParser::new(limits);
        assert_eq!(p.feed(&[b'x'; 10], &mut |_: &SseEvent| true), Ok(true));
        let r = p.feed(&[b'x'; 7], &mut |_: &SseEvent| true);
        assert_eq!(r, Err(SseError::LineTooLong { limit: 16 }));
        // An ended line over the limit.
        let mut p = SseParser::new(limits);
        let r = p.feed(b"data: 0123456789abcdef\n", &mut |_: &SseEvent| true);
        assert_eq!(r, Err(SseError::LineTooLong { limit: 16 }));
        // Lines within the limit whose data together is over the event's.
        let mut p = SseParser::new(limits);
        let r = p.feed(
            b"data: 0123456789\ndata: 0123456789\n",
            &mut |_: &SseEvent| true,
        );
        assert_eq!(r, Err(SseError::EventTooLarge { limit: 20 }));
        // At the limits exactly it passes.
        let mut p = SseParser::new(limits);
        let got = parse_with(&mut p, &[b"data:0123456789\ndata:012345678\n\n"]);
        assert_eq!(got[0].data.len(), 20);
        // The default limit, as the client meets it.
        let mut p = SseParser::default();
        let big = vec![b'x'; MAX_SSE_EVENT + 65];
        assert!(matches!(
            p.feed(&big, &mut |_: &SseEvent| true),
            Err(SseError::LineTooLong { .. })
        ));
    }

    #[test]
    fn a_large_chunk_of_many_lines_is_read_in_one_pass() {
        // 200k events in one chunk: linear, where draining a buffer per line was not.
        let one = "id: 1\nevent: e\ndata: 0123456789\n\n";
        let text = one.repeat(200_000);
        let mut n = 0;
        SseParser::default()
            .feed(text.as_bytes(), &mut |_: &SseEvent| {
                n += 1;
                true
            })
            .unwrap();
        assert_eq!(n, 200_000);
    }

    proptest! {
        /// However the body is cut into chunks, the events are the same.
        #[test]
        fn chunk_boundaries_do_not_matter(cuts in proptest::collection::vec(0usize..400, 0..12)) {
            let text = "\u{feff}: c\r\nid: 1\r\nevent: a\r\ndata: x\r\ndata: é\r\n\r\nretry: 5\rdata\r\rid: 2\nevent: b\ndata: {\"k\":[1,2]}\n\n:\ndata: end\r\n\r\n";
            let bytes = text.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut at = 0;
            for c in cuts {
                chunks.push(&bytes[at..c]);
                at = c;
            }
            chunks.push(&bytes[at..]);
            let mut p = SseParser::default();
            let got = parse_with(&mut p, &chunks);
            prop_assert_eq!(got, vec![
                ev("a", "x\né", "1"),
                ev("message", "", "1"),
                ev("b", "{\"k\":[1,2]}", "2"),
                ev("message", "end", "2"),
            ]);
            prop_assert_eq!(p.retry(), Some(Duration::from_millis(5)));
        }
    }
}
