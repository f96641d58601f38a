//! The link between the broker and a runtime (the harness-session plane).
//!
//! - Dispatch: new invocations of agents served here are read from the gap-free event
//!   feed and handed to the runtime. At start, flights left by the previous process are
//!   settled first: `queued` ones (and `waking` ones whose turn had not started) are
//!   dispatched again; ones that were mid-turn are failed with a reason (their harness
//!   process died with the broker).
//! - Reports: everything the runtime reports becomes a broker command, enqueued in the
//!   order it arrived, except that the reports waiting together are taken at once and
//!   each flight's streamed text among them merged (`merge.rs`): a flight's burst then
//!   holds no other flight's next delta behind thousands of its own. The replies are
//!   awaited by a separate drain task, so a stream of deltas costs one group commit per
//!   batch, not one flush per delta.
//! - Approvals: a requested approval is persisted; the agent's policy may decide it at
//!   once (recorded as `policy:...`), otherwise a person does through the API, told by
//!   the notify command, or the agent's approval timeout declines it
//!   ([`crate::alerts`]).
//! - Tasks: every task the plane spawns is its own ([`crate::tasks`]); they end once the
//!   runtime's report channel has closed and the last reports are settled, and an
//!   approval's timeout ends as soon as the approval is decided.
//!
//! This file holds [`Plane`] and its start; `dispatch.rs` the dispatch of flights (and
//! recovery at start), `reports.rs` the reports of the embedded runtime and the approval
//! policies, `merge.rs` the merging of streamed text, `nodes.rs` the link to nodes over NATS (dispatches out, reports in over
//! JetStream), `controls.rs` the controls (steer, interrupt, approvals, wake) routed to
//! the runtime serving an agent.

use std::sync::Arc;

use relay_protocol::domain::Agent;
use relay_protocol::runtime::{Dispatch, Report};
use relay_runtime::Runtime;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::alerts::Notifier;
use crate::broker::Broker;
use crate::error::BrokerError;
use crate::ports::FlightControl;
use crate::seal::BusKey;
use crate::tasks::Tasks;

mod controls;
mod dispatch;
mod merge;
mod nodes;
mod reports;

pub use nodes::AttachError;

use reports::PENDING_REPLIES;

/// Connects a broker to its embedded runtime.
#[derive(Clone)]
pub struct Plane {
    broker: Broker,
    runtime: Runtime,
    /// Set once NATS is connected: how agents of other nodes are reached.
    nats: Arc<tokio::sync::OnceCell<(async_nats::Client, BusKey)>>,
    /// Dispatches for other nodes, sent one after another in commit order.
    remote: Arc<tokio::sync::OnceCell<mpsc::Sender<(String, Dispatch)>>>,
    /// NATS is configured (if not yet reached): remote flights wait for it.
    nats_expected: Arc<std::sync::atomic::AtomicBool>,
    /// Runs the user's command when an approval waits for a person.
    notifier: Option<Notifier>,
    /// The plane's tasks (dispatch, reports, nodes, policies), ended once the runtime's
    /// report channel has closed and its reports are settled.
    tasks: Tasks,
    /// The approval timeouts waiting (see `reports.rs`): each ends when its approval is
    /// decided, at its timeout, or with the plane.
    timers: Tasks,
}

impl Plane {
    /// Settles flights left by a previous process, then starts dispatching and consuming
    /// reports. The returned task ends when the runtime's report channel closes.
    pub async fn start(
        broker: Broker,
        runtime: Runtime,
        reports: mpsc::Receiver<Report>,
        notifier: Option<Notifier>,
    ) -> Result<(Plane, JoinHandle<()>), BrokerError> {
        let stop = CancellationToken::new();
        let plane = Plane {
            broker,
            runtime,
            nats: Arc::new(tokio::sync::OnceCell::new()),
            remote: Arc::new(tokio::sync::OnceCell::new()),
            nats_expected: Arc::default(),
            notifier,
            tasks: Tasks::new(&stop),
            timers: Tasks::new(&stop),
        };
        let from_seq = plane.broker.last_seq();
        // Reports must flow before recovery dispatches anything, or a full report
        // channel would block recovery (and the start) for good.
        let (pending_tx, pending_rx) = mpsc::channel(PENDING_REPLIES);
        // The two end on their own, when the report channel closes.
        let drain = plane.tasks.track(plane.clone().drain(pending_rx));
        let consume = plane
            .tasks
            .track(plane.clone().consume(reports, pending_tx));
        plane.recover().await?;
        plane.tasks.spawn(plane.clone().dispatch_new(from_seq));
        // The broker's, since it waits for the plane's own.
        let (tasks, timers) = (plane.tasks.clone(), plane.timers.clone());
        let task = plane.broker.tasks().track(async move {
            let _ = consume.await;
            let _ = drain.await;
            stop.cancel();
            tasks.stopped().await;
            timers.stopped().await;
        });
        Ok((plane, task))
    }

    /// NATS is configured: until it is attached, flights of remote agents stay queued
    /// (and are sent once it is) instead of failing.
    pub fn expect_nats(&self) {
        self.nats_expected
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Approval timeouts still waiting (each a task; see `reports.rs`).
    pub fn approval_timers(&self) -> usize {
        self.timers.len()
    }

    fn local(&self, agent: &Agent) -> bool {
        agent.spec.node.as_deref() == self.runtime.node()
    }
}

/// Shares a plane as the API's flight control.
pub fn control(plane: &Plane) -> Arc<dyn FlightControl> {
    Arc::new(plane.clone())
}
