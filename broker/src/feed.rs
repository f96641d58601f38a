//! A gap-free, duplicate-free stream of committed events starting after any seq: it reads
//! the log up to the last published event, then follows the live broadcast, and reads
//! back from the log whenever it falls behind. The NATS publisher, the dispatch plane,
//! watchers and telemetry read it in their own task ([`Feed`]); an SSE stream through a
//! channel ([`follow`]).
//!
//! Each event comes as a shared [`Published`]: live, the writer's own (one per event,
//! for every follower; a large one too, while it is held for them); read back, built
//! from the stored bytes (a large one decoded once for the followers reading it at the
//! same time). Either way its JSON
//! ([`Published::json`]) is the bytes the writer stored, so a follower sends it as it is;
//! for a record that stores a long text by reference, it is encoded on first use.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc};

use crate::broker::{Broker, Published};
use crate::error::BrokerError;

/// Events read from the log per step while catching up.
const CATCH_UP_PAGE: usize = 1024;

/// Streams every committed event with seq > `after`, in order, until the receiver is
/// dropped or the broker stops: a task that runs a [`Feed`] into a channel, for a
/// follower that wants a receiver (an SSE stream).
pub fn follow(broker: Broker, after: u64) -> mpsc::Receiver<Result<Arc<Published>, BrokerError>> {
    let (tx, rx) = mpsc::channel(256);
    let tasks = broker.tasks().clone();
    let mut feed = Feed::new(broker, after);
    tasks.spawn(async move {
        while let Some(item) = feed.recv().await {
            if tx.send(item).await.is_err() {
                return;
            }
        }
    });
    rx
}

type Reading = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Vec<Arc<Published>>, BrokerError>> + Send>,
>;

/// Every committed event with seq > `after`, in order, read by its follower's own task
/// ([`Feed::recv`]): no task in between, so an event reaches the NATS publisher one
/// wake-up sooner than through [`follow`].
///
/// The live buffer is drained only as the follower reads. A large event is held for
/// its followers for at most `HELD_MAX` (1 s), so a follower stalled longer (the
/// publisher waiting on NATS's acknowledgements or on a reconnect) reads it back from
/// the log, as one that lags behind the buffer does. The task of [`follow`] took them
/// at once, and then kept up to 256 of them in its channel for as long as its reader
/// stalled.
pub struct Feed {
    broker: Broker,
    live: broadcast::Receiver<crate::broker::Live>,
    /// The seq of the last event handed out.
    cursor: u64,
    /// Events read back from the log, not handed out yet.
    page: VecDeque<Arc<Published>>,
    /// Reading back from the log (at the start, after a gap or a lag), up to the last
    /// event published when it began; then live. (Not chasing the log's end: a follower
    /// behind a busy writer would read every event back.)
    catching_up: Option<u64>,
    /// A page being read back: kept across a cancelled [`Feed::recv`], so that a
    /// follower cancelled more often than a read takes still moves on.
    reading: Option<Reading>,
    /// An error was handed out, or the broker stopped: nothing follows.
    ended: bool,
}

impl Feed {
    pub fn new(broker: Broker, after: u64) -> Feed {
        // Subscribed before the log is read, so nothing published meanwhile is missed.
        let live = broker.subscribe();
        let mut feed = Feed {
            catching_up: None,
            live,
            broker,
            cursor: after,
            page: VecDeque::new(),
            reading: None,
            ended: false,
        };
        feed.catch_up();
        feed
    }

    /// Reads back from the log up to the last event published now, then goes live.
    fn catch_up(&mut self) {
        self.catching_up = Some(self.broker.last_seq());
    }

    /// The next event; `None` once the broker stopped or after an error. Cancel-safe
    /// (in a `select!`): a read from the log under way and what it read are kept for the
    /// next call, and the cursor moves only with an event handed out.
    pub async fn recv(&mut self) -> Option<Result<Arc<Published>, BrokerError>> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(event) = self.page.pop_front() {
                self.cursor = event.seq;
                return Some(Ok(event));
            }
            if let Some(published) = self.catching_up {
                // Catch up from the log, never past what had been published (flushed).
                if self.reading.is_none() && self.cursor < published {
                    let (store, cursor) = (self.broker.store().clone(), self.cursor);
                    self.reading = Some(Box::pin(async move {
                        store
                            .read(move |s| s.published_after(cursor, CATCH_UP_PAGE))
                            .await
                    }));
                }
                if let Some(read) = self.reading.as_mut() {
                    // Cancelled here, the read goes on and is awaited by the next call.
                    let page = read.await;
                    self.reading = None;
                    match page {
                        Ok(page) => {
                            let before = self.page.len();
                            self.page
                                .extend(page.into_iter().take_while(|e| e.seq <= published));
                            if self.page.len() > before {
                                continue;
                            }
                        }
                        Err(e) => {
                            self.ended = true;
                            return Some(Err(e));
                        }
                    }
                }
                self.catching_up = None;
            }
            // Follow live events until we lag behind the broadcast buffer.
            match self.live.recv().await {
                Ok(live) if live.seq() <= self.cursor => {
                    // Read from the log already: passed by (a held one is let go).
                    let _ = live.take();
                }
                // The next event, in memory (a large one while it is held).
                Ok(live) if live.seq() == self.cursor + 1 => match live.take() {
                    Some(event) => {
                        self.cursor = event.seq;
                        return Some(Ok(event));
                    }
                    // A large event no longer held: read it back from the log.
                    None => self.catch_up(),
                },
                // A gap (we subscribed while the catch-up raced a commit): read it back
                // from the log (a held one is let go: it is read back with the rest).
                Ok(live) => {
                    let _ = live.take();
                    self.catch_up();
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.catch_up(),
                Err(broadcast::error::RecvError::Closed) => self.ended = true,
            }
        }
    }
}

/// Streams the updates of one flight with per-flight seq > `after`, in order and without
/// duplicates, ending after the update that makes it terminal.
pub fn follow_flight(
    broker: Broker,
    flight: relay_protocol::domain::Flight,
    after: u64,
) -> mpsc::Receiver<Result<relay_protocol::domain::FlightUpdate, BrokerError>> {
    use relay_protocol::event::EventBody;
    let (tx, rx) = mpsc::channel(256);
    let tasks = broker.tasks().clone();
    tasks.spawn(async move {
        // Follow the live feed from here; what came before is read from the store.
        let published = broker.last_seq();
        let mut live = Feed::new(broker.clone(), published);
        let mut last = after;
        let id = flight.id.clone();
        let stored = match broker
            .store()
            // Updates past `published` come from the live feed: a batch going into sled
            // meanwhile is past it, so a long flight's catch-up never holds the writer.
            .read_listing(move |s| s.stored_updates(&id, after))
            .await
        {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        for s in stored {
            if s.event_seq > published {
                break; // not flushed yet; it will come through the live feed
            }
            last = s.update.seq;
            let terminal = is_terminal_update(&s.update);
            if tx.send(Ok(s.update)).await.is_err() || terminal {
                return;
            }
        }
        if flight.state.is_terminal() && flight.update_seq <= last {
            return;
        }
        while let Some(item) = live.recv().await {
            let event = match item {
                Ok(e) => e,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            if let EventBody::FlightUpdated { update, .. } = &event.body {
                if update.flight != flight.id || update.seq <= last {
                    continue;
                }
                last = update.seq;
                let terminal = is_terminal_update(update);
                if tx.send(Ok(update.clone())).await.is_err() || terminal {
                    return;
                }
            }
        }
    });
    rx
}

fn is_terminal_update(u: &relay_protocol::domain::FlightUpdate) -> bool {
    matches!(&u.change, relay_protocol::domain::FlightChange::State { to, .. } if to.is_terminal())
}
