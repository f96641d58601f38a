//! Fair reading beside a burst: while another agent of this process streams, an agent's
//! stdout is read at most [`LINES_PER_WINDOW`] lines per [`WINDOW`]; alone, an agent is
//! read as fast as it writes.
//!
//! Why: on 2 cores, one agent streaming as fast as it can (ops/bench 9: 1,000,000
//! deltas at about 230,000 a second) keeps both cores busy reading, storing and
//! publishing its lines, and every other agent's delta queues behind that work at each
//! step: its harness line, its batch, its commit, its publication (ops/BENCHMARKS.md part
//! 20). Reading the burst at a bounded pace leaves CPU free for everyone else's deltas
//! (part 21: the neighbour's p99 went from 10-12 ms to under 4 ms, the burst from about
//! 290,000 to 64,000 deltas a second). A model streams a few hundred deltas a second:
//! only a runaway stream (or a benchmark) is ever slowed, and only while another agent
//! of the process has written a line in the last [`STREAMING`] (any line: an agent
//! that prints a status line now and then counts while it does).
//!
//! Nothing is lost or reordered: lines not read yet wait in the pipe, and the child
//! blocks on a full pipe as it does behind any slow reader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// How often a reader's pace is counted anew.
pub const WINDOW: Duration = Duration::from_millis(1);
/// Most lines a reader takes per [`WINDOW`] while another reader streams: at most
/// 128,000 a second (about 64,000 measured, since a timer's wait ends on its next
/// millisecond), hundreds of times what a model streams. Beside a stream at 1,000 a
/// second, this held its p99 under 4 ms where 200 a window gave 4.6 ms (part 21).
pub const LINES_PER_WINDOW: u32 = 128;
/// A reader that took a line this recently is streaming.
pub const STREAMING: Duration = Duration::from_millis(100);

/// The stdout readers of one process and when each last started a window.
#[derive(Default)]
pub struct Readers {
    last: Mutex<HashMap<u64, Instant>>,
    next_id: AtomicU64,
}

/// The readers of this process: every agent's stdout shares one CPU budget.
static READERS: LazyLock<Arc<Readers>> = LazyLock::new(Arc::default);

impl Readers {
    /// Notes that `id` reads at `now`; whether another reader streams.
    fn touch(&self, id: u64, now: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.insert(id, now);
        last.iter()
            .any(|(&other, &at)| other != id && now.saturating_duration_since(at) < STREAMING)
    }

    fn leave(&self, id: u64) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.remove(&id);
    }
}

/// One reader's pace. Dropping it takes the reader out of its [`Readers`].
pub struct Ration {
    readers: Arc<Readers>,
    id: u64,
    /// The current window's end, once a line started one.
    window_end: Option<Instant>,
    lines: u32,
    /// Another reader streamed when the window started.
    shared: bool,
    /// Windows this reader was held to the end of.
    pauses: u64,
}

impl Ration {
    /// A reader among the process's readers.
    pub fn new() -> Ration {
        Ration::among(READERS.clone())
    }

    /// A reader among `readers` (tests keep theirs apart from the process's).
    pub fn among(readers: Arc<Readers>) -> Ration {
        let id = readers.next_id.fetch_add(1, Ordering::Relaxed);
        Ration {
            readers,
            id,
            window_end: None,
            lines: 0,
            shared: false,
            pauses: 0,
        }
    }

    /// Counts a line read at `now`: `Some(until)` when the reader has taken its share of
    /// this window and must wait until `until` before reading on.
    pub fn line(&mut self, now: Instant) -> Option<Instant> {
        let end = match self.window_end {
            Some(end) if now < end => end,
            _ => {
                // One look at the others per window (per line at a model's pace).
                self.shared = self.readers.touch(self.id, now);
                self.lines = 0;
                *self.window_end.insert(now + WINDOW)
            }
        };
        self.lines += 1;
        if self.shared && self.lines >= LINES_PER_WINDOW {
            self.window_end = None;
            self.pauses += 1;
            return Some(end);
        }
        None
    }

    /// Windows this reader was held to the end of so far.
    pub fn pauses(&self) -> u64 {
        self.pauses
    }
}

impl Default for Ration {
    fn default() -> Ration {
        Ration::new()
    }
}

impl Drop for Ration {
    fn drop(&mut self) {
        self.readers.leave(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `n` lines at `now` and returns the pauses asked for.
    fn burst(r: &mut Ration, now: Instant, n: u32) -> Vec<Instant> {
        (0..n).filter_map(|_| r.line(now)).collect()
    }

    #[test]
    fn a_reader_alone_is_never_held_however_fast() {
        let readers = Arc::new(Readers::default());
        let mut a = Ration::among(readers.clone());
        let t = Instant::now();
        assert!(burst(&mut a, t, 100 * LINES_PER_WINDOW).is_empty());
        // Another reader that has not read for longer than STREAMING is not streaming.
        let mut b = Ration::among(readers);
        assert_eq!(b.line(t), None);
        let later = t + STREAMING + WINDOW;
        assert!(burst(&mut a, later, 10 * LINES_PER_WINDOW).is_empty());
        assert_eq!(a.pauses(), 0);
    }

    #[test]
    fn beside_a_streaming_reader_a_burst_waits_for_the_end_of_its_window() {
        let readers = Arc::new(Readers::default());
        let t = Instant::now();
        let mut b = Ration::among(readers.clone());
        assert_eq!(b.line(t), None);
        let mut a = Ration::among(readers.clone());
        let start = t + Duration::from_micros(10);
        // Its share of the window, then the end of that window.
        assert!(burst(&mut a, start, LINES_PER_WINDOW - 1).is_empty());
        assert_eq!(a.line(start), Some(start + WINDOW));
        // The next line starts the next window, with a share of its own.
        let next = start + WINDOW;
        assert_eq!(burst(&mut a, next, LINES_PER_WINDOW), vec![next + WINDOW]);
        assert_eq!(a.pauses(), 2);
        // The slow reader, at a model's pace, is never held.
        for i in 0..1000 {
            assert_eq!(b.line(t + WINDOW * i), None);
        }
        assert_eq!(b.pauses(), 0);
        // Once the other has gone, the burst is read at its own pace again.
        drop(b);
        let after = next + WINDOW * 2;
        assert!(burst(&mut a, after, 10 * LINES_PER_WINDOW).is_empty());
    }

    #[test]
    fn many_readers_at_once_each_keep_their_own_count() {
        let readers = Arc::new(Readers::default());
        let t = Instant::now();
        let n = 8;
        let (joined, done) = (
            Arc::new(std::sync::Barrier::new(n)),
            Arc::new(std::sync::Barrier::new(n)),
        );
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (readers, joined, done) = (readers.clone(), joined.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut r = Ration::among(readers);
                    assert_eq!(r.line(t), None);
                    joined.wait();
                    // Everyone streams: each is held once per full window.
                    let mut pauses = 0;
                    // Every window within STREAMING of the others' first lines.
                    for w in 1..=50u32 {
                        pauses += burst(&mut r, t + WINDOW * w, LINES_PER_WINDOW).len();
                        std::thread::yield_now();
                    }
                    done.wait();
                    pauses
                })
            })
            .collect();
        let pauses: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(pauses, vec![50; n]);
        assert!(readers.last.lock().unwrap().is_empty());
    }
}
