//! Waiting for something to happen, the one way the tests do it: ask again and again
//! until the answer is there, or fail naming what never came.
//!
//! A probe answers `Some(value)` or `Ok(value)` when the awaited thing happened, and
//! `None` or `Err(what it saw instead)` when not yet; it is asked again after a pause that
//! grows from [`FIRST_PAUSE`] to [`LONGEST_PAUSE`] (a quick answer is seen quickly, a slow
//! one does not cost a process or a request every few milliseconds).
//!
//! The deadline guards against a hang; it is never a measure. A test that passes does not
//! wait for it, so a slow machine makes a test slower, not red. When it passes, the failure
//! names what was awaited and the last thing the probe saw:
//! `timed out after 60s waiting for flight flt_1 to complete; last seen: {...}`.
//!
//! - [`wait_until`]: async; panics on the deadline (a test's own wait).
//! - [`try_wait_until`]: async; returns [`TimedOut`] instead (a fixture that reports the
//!   failure as its own, or gives up and does something else).
//! - [`wait_until_blocking`] and [`try_wait_until_blocking`]: the same for code without a
//!   runtime (`#[test]`s, the process fixtures' `Drop`).
//! - [`wait_until_every`]: async, at a steady pace, for a cheap probe of a value that
//!   moves fast (an in-process counter), where a wait must end close to a threshold.
//!
//! Async waits run on tokio's clock, so under `tokio::time::pause()` they take no real
//! time.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// The first pause between two probes.
pub const FIRST_PAUSE: Duration = Duration::from_millis(5);
/// The longest pause between two probes.
pub const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// What a probe answers: the awaited value, or (`Err`) what it saw instead.
pub trait Probe<T> {
    /// `Ok(value)` once it happened; else what was seen, if worth saying.
    fn seen(self) -> Result<T, Option<String>>;
}

impl<T> Probe<T> for Option<T> {
    fn seen(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Probe<T> for Result<T, E> {
    fn seen(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// A wait that reached its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    pub within: Duration,
    /// The probe's last answer, if it said what it saw.
    pub last_seen: Option<String>,
}

impl Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.within, self.what
        )?;
        if let Some(seen) = &self.last_seen {
            write!(f, "; last seen: {seen}")?;
        }
        Ok(())
    }
}

impl std::error::Error for TimedOut {}

/// The pauses between probes, up to a deadline.
struct Pacer {
    within: Duration,
    pause: Duration,
    longest: Duration,
}

impl Pacer {
    fn new(within: Duration) -> Pacer {
        Pacer {
            within,
            pause: FIRST_PAUSE,
            longest: LONGEST_PAUSE,
        }
    }

    fn steady(within: Duration, pause: Duration) -> Pacer {
        Pacer {
            within,
            pause,
            longest: pause,
        }
    }

    /// The next pause, given the time since the wait began; `None` once the deadline has
    /// passed. A pause never reaches past the deadline, so the last probe is made at it.
    fn next(&mut self, elapsed: Duration) -> Option<Duration> {
        let left = self.within.checked_sub(elapsed).filter(|l| !l.is_zero())?;
        let pause = self.pause.min(left);
        self.pause = (self.pause * 2).min(self.longest);
        Some(pause)
    }

    fn timed_out(&self, what: impl Display, last_seen: Option<String>) -> TimedOut {
        TimedOut {
            what: what.to_string(),
            within: self.within,
            last_seen,
        }
    }
}

/// Asks `probe` until it answers `Some`/`Ok`, for at most `within`; see the module docs.
pub async fn try_wait_until<T, P, F, Fut>(
    what: impl Display,
    within: Duration,
    probe: F,
) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
    P: Probe<T>,
{
    poll(what, Pacer::new(within), probe).await
}

async fn poll<T, P, F, Fut>(
    what: impl Display,
    mut pacer: Pacer,
    mut probe: F,
) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
    P: Probe<T>,
{
    let start = tokio::time::Instant::now();
    loop {
        let last_seen = match probe().await.seen() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        match pacer.next(start.elapsed()) {
            Some(pause) => tokio::time::sleep(pause).await,
            None => return Err(pacer.timed_out(what, last_seen)),
        }
    }
}

/// [`try_wait_until`], panicking with the [`TimedOut`] message on the deadline.
pub async fn wait_until<T, P, F, Fut>(what: impl Display, within: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
    P: Probe<T>,
{
    try_wait_until(what, within, probe)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`wait_until`], asking every `pause` (not a growing pause): see the module docs.
pub async fn wait_until_every<T, P, F, Fut>(
    pause: Duration,
    what: impl Display,
    within: Duration,
    probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
    P: Probe<T>,
{
    poll(what, Pacer::steady(within, pause), probe)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`try_wait_until`] for code without a runtime: the probe is a plain function, the
/// pauses block the thread.
pub fn try_wait_until_blocking<T, P: Probe<T>>(
    what: impl Display,
    within: Duration,
    mut probe: impl FnMut() -> P,
) -> Result<T, TimedOut> {
    let start = std::time::Instant::now();
    let mut pacer = Pacer::new(within);
    loop {
        let last_seen = match probe().seen() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        match pacer.next(start.elapsed()) {
            Some(pause) => std::thread::sleep(pause),
            None => return Err(pacer.timed_out(what, last_seen)),
        }
    }
}

/// [`try_wait_until_blocking`], panicking with the [`TimedOut`] message on the deadline.
pub fn wait_until_blocking<T, P: Probe<T>>(
    what: impl Display,
    within: Duration,
    probe: impl FnMut() -> P,
) -> T {
    try_wait_until_blocking(what, within, probe).unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::cell::Cell;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_answer_ends_the_wait() {
        let asked = Cell::new(0);
        let got = wait_until("the third probe", Duration::from_secs(60), || async {
            asked.set(asked.get() + 1);
            (asked.get() == 3).then_some("there")
        })
        .await;
        assert_eq!((got, asked.get()), ("there", 3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_names_what_was_awaited_and_the_last_thing_seen() {
        let start = tokio::time::Instant::now();
        let asked = Cell::new(0u32);
        let e = try_wait_until("the flight to complete", Duration::from_secs(1), || async {
            asked.set(asked.get() + 1);
            Err::<(), _>(format!("running ({})", asked.get()))
        })
        .await
        .unwrap_err();
        // 5, 10, 20, 40, 80 ms, then every 100 ms to the deadline, then the last probe.
        let polls = asked.get();
        assert_eq!(
            e,
            TimedOut {
                what: "the flight to complete".into(),
                within: Duration::from_secs(1),
                last_seen: Some(format!("running ({polls})")),
            }
        );
        assert_eq!(polls, 15);
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(
            e.to_string(),
            "timed out after 1s waiting for the flight to complete; last seen: running (15)"
        );
    }

    #[test]
    fn a_blocking_wait_times_out_without_a_runtime() {
        let e = try_wait_until_blocking("nothing", Duration::from_millis(20), || None::<()>)
            .unwrap_err();
        assert_eq!(e.to_string(), "timed out after 20ms waiting for nothing");
        let mut n = 0;
        let got = wait_until_blocking("the second probe", Duration::from_secs(60), || {
            n += 1;
            if n == 2 {
                Ok(n)
            } else {
                Err("not yet")
            }
        });
        assert_eq!(got, 2);
    }
}
