//! The tasks a part of the process spawns, owned: each is tracked, and ended when the
//! part stops, so a shutdown waits for every task it started and leaves none behind.
//!
//! [`Tasks::spawn`] runs a task until its end or the stop, whichever comes first (at the
//! stop it is dropped at its next await); [`Tasks::track`] runs one that must end on its
//! own (a writer committing what is queued, an answer to a request), given the stop to
//! watch if it waits for anything. [`Tasks::stopped`] fires the stop and waits for all.
//!
//! The one spawn in the broker outside this is the signal handler
//! ([`crate::shutdown::on_signals`]): it must outlive the drain, to force the exit at a
//! second signal.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Tasks owned by one part of the process (the broker, the plane, a server). Clone
/// freely: the clones share the tasks and the stop.
#[derive(Clone, Debug)]
pub struct Tasks {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Tasks {
    /// Tasks ended when `parent` fires or [`Tasks::stopped`] is called (which does not
    /// fire `parent`).
    pub fn new(parent: &CancellationToken) -> Tasks {
        Tasks {
            tracker: TaskTracker::new(),
            stop: parent.child_token(),
        }
    }

    /// Runs `task` until it ends or the stop fires; `None`: stopped first.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<Option<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let stop = self.stop.clone();
        self.tracker
            .spawn(async move { stop.run_until_cancelled(task).await })
    }

    /// Runs `task` to its end, tracked but never cut: for a task that finishes on its own
    /// (it watches [`Tasks::stop_token`] itself if it waits for anything).
    pub fn track<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(task)
    }

    /// [`Tasks::track`] on an OS thread of its own, named `name`, not on the async
    /// workers: for a short loop on the path of every update (the broker's writer) that
    /// must not wait its turn behind whatever keeps the workers busy. The kernel runs a
    /// thread that mostly sleeps as soon as it wakes; a task waits for a worker to finish
    /// the task it is polling, and those before it in the queue. `task` must not need
    /// the tokio runtime's context (no timers, no `tokio::spawn`): channels only.
    pub fn track_on_thread<F>(&self, name: &str, task: F) -> std::io::Result<JoinHandle<()>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (done, ended) = tokio::sync::oneshot::channel();
        let thread_name = name.to_string();
        std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                // A panic goes to whoever awaits the handle, as a task's does.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    futures::executor::block_on(task)
                }));
                let _ = done.send(ran);
            })?;
        let name = name.to_string();
        Ok(self.tracker.spawn(async move {
            match ended.await {
                Ok(Ok(())) => {}
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                Err(_) => {
                    tracing::error!(thread = %name, "a task's thread ended without finishing it")
                }
            }
        }))
    }

    /// The stop these tasks end at.
    pub fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    /// Tasks still running.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Fires the stop and waits until every task has ended. Tasks spawned afterwards end
    /// at once ([`Tasks::spawn`]) or are waited for too, if they start before the last
    /// one ends.
    pub async fn stopped(&self) {
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[tokio::test]
    async fn a_stop_ends_spawned_tasks_and_waits_for_tracked_ones() {
        let tasks = Tasks::new(&CancellationToken::new());
        let forever = tasks.spawn(std::future::pending::<()>());
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let stop = tasks.stop_token().clone();
        let own = tasks.track(async move {
            stop.cancelled().await;
            tx.send(7).unwrap();
        });
        let done = tasks.spawn(async { 1 });
        assert_eq!(done.await.unwrap(), Some(1));
        assert_eq!(tasks.len(), 2);
        tasks.stopped().await;
        assert!(tasks.is_empty());
        assert_eq!(forever.await.unwrap(), None);
        own.await.unwrap();
        assert_eq!(rx.await.unwrap(), 7);
        // Spawned after the stop: ends at once.
        assert_eq!(
            tasks.spawn(std::future::pending::<()>()).await.unwrap(),
            None
        );
    }

    /// A task on a thread of its own is tracked as a task is: a stop waits for it, it
    /// runs on a thread of that name, and its panic reaches whoever awaits its handle.
    #[tokio::test]
    async fn a_task_on_its_own_thread_is_waited_for_and_its_panic_is_told() {
        let tasks = Tasks::new(&CancellationToken::new());
        let stop = tasks.stop_token().clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let own = tasks
            .track_on_thread("relay-test-thread", async move {
                stop.cancelled().await;
                let name = std::thread::current().name().map(str::to_string);
                tx.send(name).unwrap();
            })
            .unwrap();
        assert_eq!(tasks.len(), 1);
        tasks.stopped().await;
        assert!(tasks.is_empty());
        own.await.unwrap();
        assert_eq!(rx.await.unwrap().as_deref(), Some("relay-test-thread"));

        let tasks = Tasks::new(&CancellationToken::new());
        let panics = tasks
            .track_on_thread("relay-test-panic", async { panic!("the writer broke") })
            .unwrap();
        let e = panics.await.unwrap_err();
        assert!(e.is_panic(), "{e}");
        let message = e.into_panic();
        assert_eq!(message.downcast_ref::<&str>(), Some(&"the writer broke"));
    }
}
