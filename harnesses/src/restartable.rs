//! [`RestartableChild`]: the one child process of a session whose CLI speaks over its
//! stdio and takes the session at process start (Claude Code's `--resume`, Pi's
//! `--session`), or opens it by a request right after (an ACP agent's `session/new` or
//! `session/load`). Each such adapter's [`HarnessSession`](crate::HarnessSession) is
//! this plus its own protocol:
//!
//! - no child until `open` starts one, and at most one at a time ([`Self::set`]);
//! - every child's events on the one stream handed out at spawn ([`Self::new`]): a child
//!   is started with [`Self::events`], so a failed start (a stored session refused) is
//!   followed by a new child on the same stream, and the runtime sees one session;
//! - one `open` or `shutdown` at a time ([`Self::opening`]), so that a shutdown stops
//!   the child an `open` in progress starts;
//! - [`Self::shutdown`] ends the stream exactly once: the child's owner task sends
//!   `ProcessExited` last, or, when no child ever ran, it is sent here.
//!
//! `X` is what the adapter keeps beside each child (its wire's watch of the running
//! turn, counters); `()` when nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use relay_protocol::harness::HarnessEvent;
use tokio::sync::mpsc;

use crate::error::HarnessError;
use crate::process::lock;
use crate::stdio::{StdioChild, Wire, EVENT_CAPACITY};

/// The live child of a [`RestartableChild`]: its pipes' owner, the session it holds,
/// and what the adapter keeps with it.
pub struct Live<W: Wire, X> {
    pub io: StdioChild<W>,
    /// The harness session id it runs (Claude Code's session id, Pi's `sessionId`).
    pub session: String,
    pub extra: X,
}

impl<W: Wire, X: Clone> Clone for Live<W, X> {
    fn clone(&self) -> Self {
        Live {
            io: self.io.clone(),
            session: self.session.clone(),
            extra: self.extra.clone(),
        }
    }
}

/// At most one child at a time, all of whose events go to one stream. See the module.
pub struct RestartableChild<W: Wire, X = ()> {
    /// Cloned into each child's owner task; taken at shutdown, so the stream ends once
    /// the last child's owner has.
    events: Mutex<Option<mpsc::Sender<HarnessEvent>>>,
    live: Mutex<Option<Live<W, X>>>,
    /// One `open` or `shutdown` at a time.
    opening: tokio::sync::Mutex<()>,
    /// Shut down: no child starts any more.
    closed: AtomicBool,
}

impl<W: Wire, X: Clone> RestartableChild<W, X> {
    /// No child yet, and the receiver of the stream every child's events go to (to hand
    /// out in [`Spawned`](crate::Spawned)).
    pub fn new() -> (Self, mpsc::Receiver<HarnessEvent>) {
        let (events, rx) = mpsc::channel(EVENT_CAPACITY);
        let this = RestartableChild {
            events: Mutex::new(Some(events)),
            live: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
        };
        (this, rx)
    }

    /// Held by `open` while it starts a child, and by [`Self::shutdown`].
    pub async fn opening(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.opening.lock().await
    }

    /// [`Self::shutdown`] was called: no child is to start.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The stream's sender, to start a child with; [`HarnessError::ChannelClosed`] once
    /// shut down.
    pub fn events(&self) -> Result<mpsc::Sender<HarnessEvent>, HarnessError> {
        lock(&self.events)
            .clone()
            .ok_or(HarnessError::ChannelClosed)
    }

    /// Keeps `live` as the child (once it is armed: from then on its end is the
    /// session's end).
    pub fn set(&self, live: Live<W, X>) {
        *lock(&self.live) = Some(live);
    }

    /// The child, if one runs (or ran).
    pub fn live(&self) -> Option<Live<W, X>> {
        lock(&self.live).clone()
    }

    /// The child running `session`; [`HarnessError::SessionNotFound`] when it holds
    /// another session, or there is none.
    pub fn live_of(&self, session: &str) -> Result<Live<W, X>, HarnessError> {
        self.live()
            .filter(|live| live.session == session)
            .ok_or_else(|| HarnessError::SessionNotFound {
                session_id: session.to_string(),
            })
    }

    /// The child's pid, or 0 before one started.
    pub fn pid(&self) -> u32 {
        self.live().map_or(0, |live| live.io.pid())
    }

    /// The child's last stderr lines (empty before one started).
    pub fn stderr_tail(&self) -> String {
        self.live()
            .map(|live| live.io.stderr_tail())
            .unwrap_or_default()
    }

    /// Stops the child (after an `open` in progress, so that its child is the one
    /// stopped) and ends the stream; idempotent. Returns the child on the first call,
    /// for the adapter to say what it saw of it.
    pub async fn shutdown(&self) -> Option<Live<W, X>> {
        let _one = self.opening.lock().await;
        let first = !self.closed.swap(true, Ordering::AcqRel);
        let events = lock(&self.events).take();
        match self.live() {
            // Armed: its owner task sends `ProcessExited` last.
            Some(live) => {
                live.io.shutdown().await;
                first.then_some(live)
            }
            // Nothing ran (or nothing was kept): the stream still ends as promised.
            None => {
                if let Some(events) = events {
                    let _ = events.try_send(HarnessEvent::ProcessExited {
                        code: None,
                        signal: None,
                        stderr_tail: String::new(),
                    });
                }
                None
            }
        }
    }
}
