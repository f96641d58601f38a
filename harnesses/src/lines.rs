//! Bounded line reading of a child's output: every read of an agent's stdout or stderr
//! goes through a [`LineReader`], so a child that writes without end, with or without
//! newlines, cannot make Relay buffer without bound.
//!
//! A line longer than the bound is handled as its [`Overflow`] says: skipped whole and
//! counted (a protocol line cut short is garbage: Codex's stdout), or kept cut to its
//! first bytes, returned as soon as they have arrived, and the rest discarded as it
//! arrives (a log line: stderr).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What [`LineReader`] does with a line longer than its bound.
#[derive(Debug, Clone)]
pub enum Overflow {
    /// Drop the whole line and add one to this count (it was malformed).
    Skip(Arc<AtomicU64>),
    /// Return the line's first bytes at once, marked [`LineReader::truncated`], and
    /// discard the rest of it as it arrives.
    Truncate,
}

/// Lines of `reader`, none longer than `max` bytes (not counting the newline).
#[derive(Debug)]
pub struct LineReader<R> {
    reader: R,
    /// The line being read, without its newline. A partly read line survives a
    /// `select!` that another branch won. Never holds (nor allocates) more than `max`.
    line: Vec<u8>,
    max: usize,
    overflow: Overflow,
    /// Discarding the rest of a line over `max` bytes.
    discarding: bool,
    /// `line` is the start of a longer line ([`Overflow::Truncate`]).
    truncated: bool,
    /// `line` was returned: the next read starts a new one.
    returned: bool,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(reader: R, max: usize, overflow: Overflow) -> Self {
        LineReader {
            reader,
            line: Vec::new(),
            max,
            overflow,
            discarding: false,
            truncated: false,
            returned: false,
        }
    }

    /// Reads the next line into [`LineReader::line`]: `true` when there is one (the
    /// last may lack its newline), `false` at EOF. Cancel-safe: what was read stays.
    pub async fn read_line(&mut self) -> io::Result<bool> {
        if self.returned {
            self.line.clear();
            self.truncated = false;
            self.returned = false;
        }
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                if self.discarding {
                    // EOF inside an overlong line: dropped all the same, or already
                    // returned cut.
                    self.discarding = false;
                    self.skipped();
                }
                self.returned = true;
                return Ok(!self.line.is_empty());
            }
            // `memchr`, not a byte-at-a-time `position`: in a burst, finding the newline
            // was most of this function's own time on the owner task.
            let (n, ends_line) = match memchr::memchr(b'\n', available) {
                Some(i) => (i + 1, true),
                None => (available.len(), false),
            };
            let text = &available[..n - usize::from(ends_line)];
            let mut cut = false;
            if !self.discarding {
                let room = self.max - self.line.len();
                if text.len() <= room {
                    push_bounded(&mut self.line, text, self.max);
                } else {
                    match self.overflow {
                        Overflow::Skip(_) => self.line = Vec::new(),
                        Overflow::Truncate => {
                            push_bounded(&mut self.line, &text[..room], self.max);
                            self.truncated = true;
                            cut = true;
                        }
                    }
                    // A cut line whose newline came with it has nothing left to discard.
                    self.discarding = !(cut && ends_line);
                }
            }
            self.reader.consume(n);
            if cut {
                // Returned before the rest arrives, which may be never.
                self.returned = true;
                return Ok(true);
            }
            if ends_line {
                if self.discarding {
                    self.discarding = false;
                    self.skipped();
                    continue;
                }
                self.returned = true;
                return Ok(true);
            }
        }
    }

    /// The line read last, without its newline.
    pub fn line(&self) -> &[u8] {
        &self.line
    }

    /// [`LineReader::line`] as text, invalid UTF-8 replaced. Checked by the standard
    /// library's validation, which takes ASCII a word at a time, before the lossy
    /// conversion's byte-by-byte walk, which only a line with invalid bytes needs: a
    /// harness's lines are nearly all valid, and a burst is 350,000 of them a second
    /// (the lossy walk alone was 3 % of the async workers' samples, BENCHMARKS part 20).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match std::str::from_utf8(&self.line) {
            Ok(text) => std::borrow::Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(&self.line),
        }
    }

    /// Whether [`LineReader::line`] is only the start of a longer line.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// An overlong line ended (EOF or newline) while being discarded.
    fn skipped(&self) {
        if let Overflow::Skip(count) = &self.overflow {
            count.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(max = self.max, "an overlong output line was skipped");
        }
    }
}

/// Appends `bytes` to `line`, growing it as `Vec` would but never past `max` bytes of
/// capacity. The caller checked that they fit.
fn push_bounded(line: &mut Vec<u8>, bytes: &[u8], max: usize) {
    let needed = line.len() + bytes.len();
    if needed > line.capacity() {
        let target = line.capacity().saturating_mul(2).min(max).max(needed);
        line.reserve_exact(target - line.len());
    }
    line.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tokio::io::{AsyncReadExt, BufReader};

    use super::*;

    /// Every line of `reader` (lossy UTF-8), and whether each was cut.
    async fn all_lines<R: AsyncBufRead + Unpin>(lines: &mut LineReader<R>) -> Vec<(String, bool)> {
        let mut got = Vec::new();
        while lines.read_line().await.unwrap() {
            got.push((lines.text().into_owned(), lines.truncated()));
        }
        got
    }

    fn owned(lines: &[(&str, bool)]) -> Vec<(String, bool)> {
        lines.iter().map(|(l, t)| (l.to_string(), *t)).collect()
    }

    #[tokio::test]
    async fn a_line_is_text_as_it_is_or_with_its_invalid_bytes_replaced() {
        let input: &[u8] = b"plain \xc3\xa9\n\xffbad \xc3\n";
        let mut lines = LineReader::new(input, 100, Overflow::Truncate);
        assert!(lines.read_line().await.unwrap());
        assert!(matches!(
            lines.text(),
            std::borrow::Cow::Borrowed("plain é")
        ));
        assert!(lines.read_line().await.unwrap());
        assert_eq!(lines.text(), "\u{FFFD}bad \u{FFFD}");
        assert!(!lines.read_line().await.unwrap());
    }

    #[tokio::test]
    async fn overlong_lines_are_skipped_and_counted() {
        let input: &[u8] = b"short\nway too long for the limit\n\nok\nexactly 10\nend";
        // A tiny buffer, so lines arrive in several pieces.
        let skipped = Arc::new(AtomicU64::new(0));
        let mut lines = LineReader::new(
            BufReader::with_capacity(4, input),
            10,
            Overflow::Skip(skipped.clone()),
        );
        assert_eq!(
            all_lines(&mut lines).await,
            owned(&[
                ("short", false),
                ("", false),
                ("ok", false),
                ("exactly 10", false),
                ("end", false)
            ])
        );
        assert_eq!(skipped.load(Ordering::Relaxed), 1);
        // An overlong last line without a newline is dropped and counted too.
        let mut lines = LineReader::new(
            BufReader::new(&b"a\nmuch too long at the end"[..]),
            10,
            Overflow::Skip(skipped.clone()),
        );
        assert_eq!(all_lines(&mut lines).await, owned(&[("a", false)]));
        assert_eq!(skipped.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn overlong_lines_are_cut() {
        let input: &[u8] =
            b"short\nway too long for the limit\nexactly 10\n11 is over!\nlast one is long";
        for capacity in [4, 8192] {
            let mut lines = LineReader::new(
                BufReader::with_capacity(capacity, input),
                10,
                Overflow::Truncate,
            );
            assert_eq!(
                all_lines(&mut lines).await,
                owned(&[
                    ("short", false),
                    ("way too lo", true),
                    ("exactly 10", false),
                    ("11 is over", true),
                    ("last one i", true),
                ]),
                "buffer of {capacity}"
            );
        }
    }

    /// 64 MiB without a newline, then a short line: the reader never holds more than
    /// its bound, whichever the overflow.
    #[tokio::test]
    async fn a_huge_line_without_newline_never_grows_the_buffer_past_the_bound() {
        const MAX: usize = 2000;
        let huge = || {
            BufReader::new(
                tokio::io::repeat(b'x')
                    .take(64 << 20)
                    .chain(&b"\nshort\n"[..]),
            )
        };

        let mut lines = LineReader::new(huge(), MAX, Overflow::Truncate);
        assert!(lines.read_line().await.unwrap());
        assert_eq!((lines.line().len(), lines.truncated()), (MAX, true));
        assert!(lines.line().iter().all(|&b| b == b'x'));
        assert!(lines.line.capacity() <= MAX, "{}", lines.line.capacity());
        assert!(lines.read_line().await.unwrap());
        assert_eq!((lines.line(), lines.truncated()), (&b"short"[..], false));
        assert!(lines.line.capacity() <= MAX, "{}", lines.line.capacity());
        assert!(!lines.read_line().await.unwrap());

        let skipped = Arc::new(AtomicU64::new(0));
        let mut lines = LineReader::new(huge(), MAX, Overflow::Skip(skipped.clone()));
        assert!(lines.read_line().await.unwrap());
        assert_eq!((lines.line(), lines.truncated()), (&b"short"[..], false));
        assert!(lines.line.capacity() <= MAX, "{}", lines.line.capacity());
        assert_eq!(skipped.load(Ordering::Relaxed), 1);
        assert!(!lines.read_line().await.unwrap());
    }

    /// A line that grows in small pieces up to the bound allocates no more than it.
    #[tokio::test]
    async fn a_line_up_to_the_bound_allocates_at_most_the_bound() {
        let input = [vec![b'y'; 1000], b"\n".to_vec()].concat();
        let mut lines = LineReader::new(
            BufReader::with_capacity(3, &input[..]),
            1000,
            Overflow::Truncate,
        );
        assert!(lines.read_line().await.unwrap());
        assert_eq!((lines.line().len(), lines.truncated()), (1000, false));
        assert_eq!(lines.line.capacity(), 1000);
    }

    /// A read that loses a `select!` keeps what it read; the next one goes on.
    #[tokio::test]
    async fn a_cancelled_read_loses_nothing() {
        let (mut tx, rx) = tokio::io::duplex(64);
        let mut lines = LineReader::new(BufReader::new(rx), 100, Overflow::Truncate);
        tokio::io::AsyncWriteExt::write_all(&mut tx, b"first half, ")
            .await
            .unwrap();
        tokio::select! {
            biased;
            _ = lines.read_line() => panic!("no line yet"),
            _ = std::future::ready(()) => {}
        }
        // Polled once above: it took what was there and waits for more.
        tokio::io::AsyncWriteExt::write_all(&mut tx, b"second half\n")
            .await
            .unwrap();
        assert!(lines.read_line().await.unwrap());
        assert_eq!(lines.line(), b"first half, second half");
    }
}
