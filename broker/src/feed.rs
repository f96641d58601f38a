//! A gap-free, duplicate-free stream of committed events starting after any seq: it reads
//! the log up to the last published event, then follows the live broadcast, and reads
//! back from the log whenever it falls behind. SSE and NATS publishers use it.
//!
//! Each event comes as a shared [`Published`]: live, the writer's own (one per event,
//! for every follower; a large one too, while it is held for them); read back, built
//! from the stored bytes (a large one decoded once for the followers reading it at the
//! same time). Either way its JSON
//! ([`Published::json`]) is the bytes the writer stored, so a follower sends it as it is;
//! for a record that stores a long text by reference, it is encoded on first use.

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc};

use crate::broker::{Broker, Published};
use crate::error::BrokerError;

/// Events read from the log per step while catching up.
const CATCH_UP_PAGE: usize = 1024;

/// Streams every committed event with seq > `after`, in order, until the receiver is
/// dropped or the broker stops.
pub fn follow(broker: Broker, after: u64) -> mpsc::Receiver<Result<Arc<Published>, BrokerError>> {
    let (tx, rx) = mpsc::channel(256);
    let tasks = broker.tasks().clone();
    tasks.spawn(async move {
        // Subscribe before reading the log, so nothing published meanwhile is missed.
        let mut live = broker.subscribe();
        let mut cursor = after;
        loop {
            // Catch up from the log, never past what has been published (flushed).
            let published = broker.last_seq();
            while cursor < published {
                let page = match broker
                    .store()
                    .read(move |s| s.published_after(cursor, CATCH_UP_PAGE))
                    .await
                {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                if page.is_empty() {
                    break;
                }
                for event in page {
                    if event.seq > published {
                        break;
                    }
                    cursor = event.seq;
                    if tx.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
            }
            // Follow live events until we lag behind the broadcast buffer.
            loop {
                match live.recv().await {
                    Ok(live) if live.seq() <= cursor => {
                        // Read from the log already: passed by (a held one is let go).
                        let _ = live.take();
                        continue;
                    }
                    // The next event, in memory (a large one while it is held).
                    Ok(live) if live.seq() == cursor + 1 => match live.take() {
                        Some(event) => {
                            cursor = event.seq;
                            if tx.send(Ok(event)).await.is_err() {
                                return;
                            }
                        }
                        // A large event no longer held: read it back from the log.
                        None => break,
                    },
                    // A gap (we subscribed while the catch-up raced a commit): read it
                    // back from the log.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    rx
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
        let mut live = follow(broker.clone(), published);
        let mut last = after;
        let id = flight.id.clone();
        let stored = match broker
            .store()
            .read(move |s| s.stored_updates(&id, after))
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
