//! Retrying with backoff, one way for every crate above this one: [`backon`] does the
//! retrying, each call site names its policy with [`forever`] (first wait, doubling, a
//! cap) or [`at_most`] (the same, for a number of tries), and [`until_stopped`] lets a shutdown end the wait between two tries, never a
//! try in flight.
//!
//! ```ignore
//! use relay_infra::retry::{self, Retryable};
//!
//! const BACKOFF: retry::ExponentialBuilder = retry::forever(MS_50, SECS_2);
//!
//! let sent = retry::until_stopped(&stop, |sleeper| {
//!     (|| publish(&subject, &payload))
//!         .retry(BACKOFF)
//!         .sleep(sleeper)
//!         .notify(|e, wait| tracing::warn!(error = %e, retry_in = ?wait, "retrying"))
//! })
//! .await; // None: stopped while waiting to try again
//! ```
//!
//! Where the next try is not a loop but a deadline kept in a task's state (a worker
//! restarting a session that keeps dying), build the policy and take its waits one by one:
//! `forever(first, max).build()` is an iterator of [`Duration`]s.
//!
//! In a task that must be `Send` (anything `tokio::spawn`ed), a try whose future borrows
//! from the function around it is often refused ("implementation of `Send` is not general
//! enough": rustc's limit with higher-ranked lifetimes through backon's generic types).
//! Give each try owned copies (cheap clones, `Arc`s), or pass what it needs mutably as a
//! context ([`RetryableWithContext`]) and take it back from the outcome.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub use backon::{
    BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable, RetryableWithContext,
};
use tokio_util::sync::CancellationToken;

/// Waits of `first`, then twice the last, up to `max`, for as many tries as it takes
/// (no jitter: the waits are what they say).
pub const fn forever(first: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(first)
        .with_max_delay(max)
        .without_max_times()
}

/// Waits of `first`, then twice the last, up to `max`, for at most `retries` tries after
/// the first (no jitter).
pub const fn at_most(retries: usize, first: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_max_times(retries)
}

/// Runs the retry `start` builds with the [`StopSleeper`] it is given (pass it to
/// backon's `.sleep`): `Some(outcome)` when the retry ends by itself, `None` when `stop`
/// fires while it waits between tries. A try in flight when `stop` fires runs to its end;
/// only the wait after it is cut.
pub async fn until_stopped<F: Future>(
    stop: &CancellationToken,
    start: impl FnOnce(StopSleeper) -> F,
) -> Option<F::Output> {
    let stopped = CancellationToken::new();
    let retry = start(StopSleeper {
        stop: stop.clone(),
        stopped: stopped.clone(),
    });
    tokio::select! {
        outcome = retry => Some(outcome),
        _ = stopped.cancelled() => None,
    }
}

/// backon's wait between tries, on tokio's clock, that never ends once `stop` fired (and
/// tells [`until_stopped`], which then drops the retry).
#[derive(Clone)]
pub struct StopSleeper {
    stop: CancellationToken,
    stopped: CancellationToken,
}

impl backon::Sleeper for StopSleeper {
    type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn sleep(&self, wait: Duration) -> Self::Sleep {
        let (stop, stopped) = (self.stop.clone(), self.stopped.clone());
        Box::pin(async move {
            tokio::select! {
                _ = stop.cancelled() => {
                    stopped.cancel();
                    std::future::pending::<()>().await;
                }
                _ = tokio::time::sleep(wait) => {}
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_cap_for_ever() {
        let waits: Vec<Duration> = forever(MS * 50, MS * 300).build().take(6).collect();
        assert_eq!(
            waits.iter().map(|w| w.as_millis()).collect::<Vec<u128>>(),
            vec![50, 100, 200, 300, 300, 300]
        );
    }

    #[test]
    fn a_limited_policy_ends_after_its_retries() {
        let waits: Vec<Duration> = at_most(3, MS * 100, MS * 100).build().collect();
        assert_eq!(waits, vec![MS * 100; 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait_but_not_a_try() {
        let stop = CancellationToken::new();
        let tries = Arc::new(AtomicU32::new(0));
        let attempt = || {
            let (stop, tries) = (stop.clone(), tries.clone());
            async move {
                // The second try is in flight when the stop comes: it still ends.
                if tries.fetch_add(1, Ordering::SeqCst) == 1 {
                    stop.cancel();
                    tokio::time::sleep(MS * 10).await;
                }
                Err::<(), &str>("down")
            }
        };
        let outcome = until_stopped(&stop, |sleeper| {
            attempt.retry(forever(MS * 50, MS * 50)).sleep(sleeper)
        })
        .await;
        assert_eq!(outcome, None);
        assert_eq!(tries.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_outcome_is_returned_as_it_comes() {
        let stop = CancellationToken::new();
        let tries = AtomicU32::new(0);
        let attempt = || async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err("down"),
                n => Ok(n),
            }
        };
        let outcome = until_stopped(&stop, |sleeper| {
            attempt.retry(forever(MS, MS * 2)).sleep(sleeper)
        })
        .await;
        assert_eq!(outcome, Some(Ok(2)));
        let refused = until_stopped(&stop, |sleeper| {
            (|| async { Err::<(), &str>("refused") })
                .retry(forever(MS, MS))
                .sleep(sleeper)
                .when(|e| *e != "refused")
        })
        .await;
        assert_eq!(refused, Some(Err("refused")));
    }
}
