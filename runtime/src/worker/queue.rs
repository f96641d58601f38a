//! The agent's queued turns, shared by its worker (which takes the next one when no turn
//! runs) and its [`Handle`](super::Handle) (through which the runtime cancels or steers a
//! flight still waiting, without disturbing the turn that runs).

use std::collections::VecDeque;
use std::sync::Mutex;

use relay_protocol::runtime::Dispatch;
use tokio::sync::Notify;

use crate::{RuntimeError, AGENT_QUEUE_CAPACITY};

/// Between a queued flight's task and a steer added to it.
const STEER_SEPARATOR: &str = "\n\n";

/// The agent's queued turns. See the module docs.
#[derive(Default)]
pub struct TurnQueue {
    state: Mutex<QueueState>,
    ready: Notify,
}

#[derive(Default)]
struct QueueState {
    turns: VecDeque<Dispatch>,
    closed: bool,
}

impl TurnQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn push(&self, d: Dispatch) -> Result<(), RuntimeError> {
        let mut q = self.lock();
        if q.closed {
            return Err(RuntimeError::ShuttingDown);
        }
        if q.turns.len() >= AGENT_QUEUE_CAPACITY {
            return Err(RuntimeError::Overloaded(d.agent.spec.name));
        }
        q.turns.push_back(d);
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next turn, waiting for one; `None` once closed and empty. Cancel-safe.
    pub(crate) async fn next(&self) -> Option<Dispatch> {
        loop {
            {
                let mut q = self.lock();
                if let Some(d) = q.turns.pop_front() {
                    return Some(d);
                }
                if q.closed {
                    return None;
                }
            }
            self.ready.notified().await;
        }
    }

    /// Closes the queue and returns what was still in it.
    pub(crate) fn close(&self) -> Vec<Dispatch> {
        let mut q = self.lock();
        q.closed = true;
        q.turns.drain(..).collect()
    }

    /// Takes a flight out of the queue, if it waits there.
    pub fn remove(&self, flight: &str) -> Option<Dispatch> {
        let mut q = self.lock();
        let at = q.turns.iter().position(|d| d.flight.id == flight)?;
        q.turns.remove(at)
    }

    /// Adds `text` to the task of a flight waiting in the queue; `false` if it is not
    /// there. A task that would grow over `max_task_bytes` is left as it is and the steer
    /// refused: steers must not make a task no client could have sent.
    pub fn steer(
        &self,
        flight: &str,
        text: &str,
        max_task_bytes: Option<usize>,
    ) -> Result<bool, RuntimeError> {
        let mut q = self.lock();
        let Some(d) = q.turns.iter_mut().find(|d| d.flight.id == flight) else {
            return Ok(false);
        };
        let size = d.invocation.task.len() + STEER_SEPARATOR.len() + text.len();
        if let Some(limit) = max_task_bytes.filter(|limit| size > *limit) {
            return Err(RuntimeError::TooLarge {
                flight: flight.to_string(),
                size,
                limit,
            });
        }
        d.invocation.task.push_str(STEER_SEPARATOR);
        d.invocation.task.push_str(text);
        Ok(true)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

/// The runtime tests' dispatch builder, shared by path so it is written once.
#[cfg(test)]
#[path = "../../tests/support/dispatch.rs"]
mod test_dispatch;

#[cfg(test)]
mod tests {
    use super::test_dispatch::dispatch as dispatch_to;
    use super::*;
    use relay_protocol::domain::Harness;

    fn dispatch(flight: &str, task: &str) -> Dispatch {
        dispatch_to(Harness::CodexAppServer, flight, task)
    }
    #[test]
    fn steers_of_a_queued_flight_keep_its_task_within_the_limit() {
        let queue = TurnQueue::default();
        queue.push(dispatch("f1", "0123456789")).unwrap();
        // 10 + 2 + 8 = 20 bytes: exactly the limit.
        assert!(queue.steer("f1", "abcdefgh", Some(20)).unwrap());
        // One byte more is refused, and the task stays as it was.
        let err = queue.steer("f1", "x", Some(22)).unwrap_err();
        assert!(
            matches!(err, RuntimeError::TooLarge { ref flight, size: 23, limit: 22 } if flight == "f1"),
            "{err:?}"
        );
        assert!(queue.steer("f1", "", Some(22)).unwrap(), "22 bytes fit");
        assert!(!queue.steer("f2", "x", Some(100)).unwrap(), "not queued");
        assert!(
            queue.steer("f1", &"y".repeat(1000), None).unwrap(),
            "no limit"
        );
        let d = queue.remove("f1").unwrap();
        assert_eq!(
            d.invocation.task,
            format!("0123456789\n\nabcdefgh\n\n\n\n{}", "y".repeat(1000))
        );
    }
}
