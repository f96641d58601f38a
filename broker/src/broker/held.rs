//! A large event held in memory, briefly, for the subscribers following live
//! ([`Live::InLog`](super::Live::InLog)). An event too large for the live buffer (a long
//! answer: its item, the completing update, the reply) used to go out as its seq alone,
//! and every subscriber read it back from the log: the NATS publisher, dispatch and
//! telemetry each read a 32 MB answer's three records at once, on two cores (pages of
//! 170-290 ms each, ops/BENCHMARKS.md part 17), every other flight's updates waiting
//! behind them in each of them. The writer has that event in memory
//! already; it now hands it to each subscriber that follows live, and lets go of it once
//! each of them has taken it, or after [`HELD_MAX`] at most (a subscriber that fell
//! behind, or never looks), so the buffer still never keeps a long text: a subscriber
//! that comes too late reads the event from the log, as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::Published;

/// Longest a large event is held for the subscribers that have not taken it yet.
pub const HELD_MAX: Duration = Duration::from_secs(1);

/// A large event, held until each subscriber that was following live when it was
/// published has taken it ([`Held::take`]), or until [`Held::release`].
#[derive(Debug)]
pub struct Held {
    seq: u64,
    event: Mutex<Option<Arc<Published>>>,
    /// Subscribers that have not taken it yet.
    waiting: AtomicUsize,
}

impl Held {
    /// `event`, held for `subscribers` takers (none: not held at all).
    pub(super) fn new(event: Arc<Published>, subscribers: usize) -> Held {
        Held {
            seq: event.seq,
            event: Mutex::new((subscribers > 0).then_some(event)),
            waiting: AtomicUsize::new(subscribers),
        }
    }

    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The event while it is held (each subscriber takes it once, even to pass it by):
    /// the last taker lets go of it. `None`: read it from the log.
    pub fn take(&self) -> Option<Arc<Published>> {
        let mut event = self.event.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = event.clone();
        let before = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if matches!(before, Ok(1) | Err(_)) {
            *event = None;
        }
        taken
    }

    /// Lets go of the event (after [`HELD_MAX`]): a subscriber that takes it later reads
    /// it from the log.
    pub fn release(&self) {
        *self.event.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Whether the event is still held.
    pub fn is_held(&self) -> bool {
        self.event
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use relay_protocol::event::{Event, EventBody, EVENT_VERSION};

    fn held(subscribers: usize) -> Held {
        let event = Event {
            v: EVENT_VERSION,
            seq: 9,
            at: 1,
            by: None,
            body: EventBody::AgentRemoved {
                name: "a".into(),
                node: None,
                force: false,
            },
        };
        Held::new(Arc::new(Published::encode(event).unwrap().0), subscribers)
    }

    /// Each subscriber counted gets the event once; the last lets go of it, and a taker
    /// past the count (or after a release) is told to read the log.
    #[test]
    fn the_last_subscriber_to_take_a_held_event_lets_go_of_it() {
        let h = held(3);
        assert_eq!(h.seq(), 9);
        for _ in 0..2 {
            assert_eq!(h.take().unwrap().seq, 9);
            assert!(h.is_held());
        }
        assert!(h.take().is_some());
        assert!(!h.is_held(), "the last taker lets go");
        assert!(h.take().is_none(), "a late taker reads the log");

        let h = held(2);
        h.release();
        assert!(h.take().is_none(), "released: read from the log");

        let nobody = held(0);
        assert!(!nobody.is_held(), "no subscriber: nothing held");
        assert!(nobody.take().is_none());
    }

    /// Taken from many threads at once, it is handed to exactly as many as were
    /// counted, and let go of after.
    #[test]
    fn a_held_event_taken_from_many_threads_is_handed_out_once_each() {
        let h = held(16);
        let got = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..32 {
                s.spawn(|| {
                    if h.take().is_some() {
                        got.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(got.load(Ordering::SeqCst), 16);
        assert!(!h.is_held());
    }
}
