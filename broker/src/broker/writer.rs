//! The writer: the one task every command goes through. It takes the commands waiting
//! (up to [`MAX_BATCH`]), merges streamed deltas ([`coalesce_deltas`]), runs the rules of
//! the whole batch ([`transact`]: its events appended to the log, its records written to
//! sled key by key, `store::direct`), flushes once, and then publishes the events and
//! answers the callers ([`settle`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use relay_infra::disk::{Full, Room};
use relay_infra::storage::{Ran, StorageError};
use relay_protocol::clock::now_ms;
use relay_protocol::domain::FlightChange;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::rules::Ctx;
use super::{
    BrokerConfig, Command, Held, Inner, Live, LiveByAgent, Outcome, Pending, DELTA_MERGE_MAX,
    HELD_MAX, LIVE_EVENT_MAX, MAX_BATCH,
};
use crate::error::BrokerError;
use crate::store::{pair_value, Published, Store, T};

pub(super) struct Writer {
    pub(super) store: Store,
    pub(super) config: BrokerConfig,
    pub(super) next_seq: u64,
    /// Cancelled when a flush failed and the writer stopped, for
    /// [`Broker::failed`](super::Broker::failed).
    pub(super) failure: CancellationToken,
    /// Live flights per agent (see [`LiveByAgent`]).
    pub(super) live: Arc<LiveByAgent>,
    /// What the writer keeps of each live flight, as committed (see [`Streaming`]).
    pub(super) streaming: Arc<Streaming>,
}

/// What the writer keeps of each live flight ([`Kept`]), so that no rule reads back from
/// the log what it just wrote. Entries go when their flight ends.
pub(super) type Streaming = std::sync::Mutex<HashMap<String, Kept>>;

/// Of one live flight: whether its last committed update was streamed text (a delta
/// follows on from it; `None`: not known here, as for a flight whose last update came
/// before this broker started: it is looked up in the log, where it is on disk), its
/// last text that a later event may repeat, stored once ([`crate::store::Source`]), and
/// its last update as stored, which the next may be stored as a change of
/// ([`crate::store::Last`]), and the deliveries of its task still to settle.
#[derive(Debug, Clone, Default)]
pub(super) struct Kept {
    pub(super) delta: Option<bool>,
    pub(super) text: Option<crate::store::Source>,
    pub(super) last: Option<crate::store::Last>,
    /// The ids of the deliveries of its task (its request message, to its agent) that
    /// this broker planned, settled as its turn starts or it ends before
    /// (`Ctx::attempt_deliveries`). `None`: planned before this broker started; every id
    /// the task may have is looked up (it was about a tenth of the storage thread's time
    /// at 64 flights in flight).
    pub(super) deliveries: Option<Vec<String>>,
}

type Reply = oneshot::Sender<Result<Outcome, BrokerError>>;

/// The callers of one command of a batch: several when deltas were merged.
type Replies = Vec<Reply>;

/// A batch's commands, with streamed text merged: consecutive deltas of one flight
/// (no other kind of command between them) become one delta with their texts joined
/// (up to [`DELTA_MERGE_MAX`] bytes a slice), answered to each of their callers. A flight streaming faster than commits complete
/// thus writes one update per commit instead of one per delta, with nothing of its text
/// lost or reordered; at a slower pace each delta stays its own update. Node reports
/// (`FromNode`, each with its stream seq) are never merged, nor a client's delta with
/// Relay's (they may write to different depths of the disk's reserve).
fn coalesce_deltas(
    batch: impl Iterator<Item = Pending>,
) -> (Vec<Command>, Vec<Room>, Vec<Replies>) {
    let mut commands: Vec<Command> = Vec::new();
    let mut rooms: Vec<Room> = Vec::new();
    let mut replies: Vec<Replies> = Vec::new();
    // flight id -> index of its last command in `commands`, while that is a delta.
    let mut open: HashMap<String, usize> = HashMap::new();
    for p in batch {
        if let Command::UpdateFlight {
            flight,
            change: FlightChange::Delta { text },
        } = &p.command
        {
            if let Some(&i) = open.get(flight).filter(|&&i| rooms[i] == p.room) {
                if let Command::UpdateFlight {
                    change: FlightChange::Delta { text: merged },
                    ..
                } = &mut commands[i]
                {
                    // Joined while the slice has room; else the delta starts the next.
                    if merged.len() + text.len() <= DELTA_MERGE_MAX {
                        merged.push_str(text);
                        replies[i].push(p.reply);
                        continue;
                    }
                }
            }
            open.insert(flight.clone(), commands.len());
        } else {
            // Anything else may concern a flight with an open run of deltas: later
            // deltas must come after it, so every run ends here.
            open.clear();
        }
        commands.push(p.command);
        rooms.push(p.room);
        replies.push(vec![p.reply]);
    }
    (commands, rooms, replies)
}

/// What became of a batch, for the writer.
struct Settled {
    /// Seqs the batch took (taken even if the flush failed).
    events: u64,
    /// The flush failed: the writer stops.
    failed: bool,
}

impl Writer {
    pub(super) async fn run(
        mut self,
        mut rx: mpsc::Receiver<Pending>,
        broker: std::sync::Weak<Inner>,
        shutdown: CancellationToken,
    ) {
        let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH);
        loop {
            let first = tokio::select! {
                biased;
                p = rx.recv() => p,
                _ = shutdown.cancelled() => {
                    // Commit what is already queued, then stop taking commands.
                    rx.close();
                    rx.recv().await
                }
            };
            let Some(first) = first else { break };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(p) => batch.push(p),
                    Err(_) => break,
                }
            }
            let (commands, rooms, replies) = coalesce_deltas(batch.drain(..));
            let settled = self.commit(commands, rooms, replies, &broker).await;
            // The batch is applied whatever the flush says, so its seqs
            // are taken either way: never write other events under them.
            self.next_seq += settled.events;
            if settled.failed {
                rx.close();
                while let Ok(p) = rx.try_recv() {
                    let _ = p.reply.send(Err(BrokerError::ShuttingDown));
                }
                self.failure.cancel();
                break;
            }
        }
        if let Err(e) = self.store.flush().await {
            tracing::error!(error = %e, "final flush failed");
        }
        tracing::debug!("broker writer stopped");
    }

    /// Commits a batch: its writes and its flush run as one job on the storage
    /// thread (grouped with whatever else waits there), off the async workers. Right
    /// after the flush, still on that thread, the events are published and the callers
    /// answered; the writer then hears what became of the batch.
    async fn commit(
        &mut self,
        commands: Vec<Command>,
        rooms: Vec<Room>,
        replies: Vec<Replies>,
        broker: &std::sync::Weak<Inner>,
    ) -> Settled {
        let first_seq = self.next_seq;
        let (store, config, live) = (self.store.clone(), self.config.clone(), self.live.clone());
        let streaming = self.streaming.clone();
        let (done, settled) = oneshot::channel();
        let broker = broker.clone();
        let queued = relay_infra::storage::Storage::global()
            // Refused whole only below the reserve's floor; under the reserve, the
            // batch's client commands are refused one by one in `transact`.
            .submit_relay_then(
                self.store.durable().clone(),
                move |short| {
                    let refused = |i: usize| match (&short, rooms[i]) {
                        (Some(full), Room::AboveReserve) => Some(full.clone()),
                        _ => None,
                    };
                    transact(
                        &store, &config, &live, &streaming, first_seq, &commands, refused,
                    )
                },
                // A batch refused whole wrote nothing (and a failed one was taken back
                // from the log before any of it reached sled): no flush for it.
                |result| matches!(result, Ok(r) if r.wrote),
                move |ran| {
                    let _ = done.send(settle(ran, replies, &broker));
                },
            )
            .await;
        match (queued, settled.await) {
            (Ok(()), Ok(settled)) => settled,
            _ => {
                // The storage thread is gone (its callers were told by their dropped
                // answer): nothing more can be stored.
                tracing::error!("the storage thread stopped; the broker stops accepting commands");
                Settled {
                    events: 0,
                    failed: true,
                }
            }
        }
    }
}

/// On the storage thread, after a batch's flush: publishes its events and answers its
/// callers (or tells them it failed). Published before the callers hear back, so a
/// caller that reads the log or subscribes right after its answer sees its own events.
fn settle(
    ran: Ran<Result<BatchResult, BrokerError>>,
    replies: Vec<Replies>,
    broker: &std::sync::Weak<Inner>,
) -> Settled {
    let fail_all = |replies: Vec<Replies>, message: String| {
        for reply in replies.into_iter().flatten() {
            let _ = reply.send(Err(BrokerError::Internal(message.clone())));
        }
    };
    let (result, flushed) = match ran {
        Ok((Ok(result), flushed)) => (result, flushed),
        // The batch failed: a rule refused it before any of it reached sled, and the log
        // took back what it got of it (a batch whose keys failed midway in sled is taken
        // back from the log too, and the next start rebuilds sled: see
        // `store::direct`). A storage error, or a failed flush of the group, means the
        // disk failed: stop.
        Ok((Err(e), flushed)) => {
            let failed =
                matches!(e, BrokerError::Storage(_) | BrokerError::Log(_)) || flushed.is_err();
            if failed {
                tracing::error!(error = %e, "storage failed; the broker stops accepting commands");
            }
            fail_all(replies, format!("commit failed: {e}"));
            return Settled { events: 0, failed };
        }
        // Refused before it ran: the disk is under its reserve. Nothing was written, the
        // store is intact: refuse the callers, and go on (writes resume with space).
        Err(e @ StorageError::Full(_)) => {
            tracing::warn!(error = %e, "disk full; a batch of commands was refused");
            for reply in replies.into_iter().flatten() {
                let _ = reply.send(Err(BrokerError::StorageThread(e.clone())));
            }
            return Settled {
                events: 0,
                failed: false,
            };
        }
        // The job panicked, or its group's flush failed. A panic may have left the
        // batch in the log and part of it in sled: stop, as after a storage error (the
        // next start rebuilds sled from the log, or catches it up).
        Err(e) => {
            tracing::error!(error = %e, "a batch could not be committed");
            fail_all(replies, format!("commit failed: {e}"));
            return Settled {
                events: 0,
                failed: matches!(
                    e,
                    StorageError::Flush(_) | StorageError::Journal(_) | StorageError::Panicked(_)
                ),
            };
        }
    };
    let events = result.events.len() as u64;
    if let Err(e) = flushed {
        // The batch may or may not reach the disk: tell nobody it did, and stop taking
        // commands (the store's state is no longer known).
        tracing::error!(error = %e, "flush failed; the broker stops accepting commands");
        fail_all(
            replies,
            "the disk flush failed; nothing of this batch is known to be stored".into(),
        );
        return Settled {
            events,
            failed: true,
        };
    }
    if let Some(inner) = broker.upgrade() {
        if let Some(last) = result.events.last() {
            inner.last_seq.store(last.0.seq, Ordering::Release);
        }
        for (published, stored) in result.events {
            inner.counts.apply(&published.event);
            inner.live.apply(&published.event);
            // Every subscriber shares this one `Published`, its JSON as stored. What is
            // kept in memory is the wire JSON (and the event): a record that stores an
            // answer by reference is small in the log, not here.
            // (No wire JSON yet: one too large to encode here; see `Published::json`.)
            let live = match published.encoded_len() {
                Some(json) if stored.len().max(json) <= LIVE_EVENT_MAX => {
                    Live::Event(Arc::new(published))
                }
                // Too large for the buffer: held for whoever follows live now, briefly.
                _ => {
                    let held = Arc::new(Held::new(
                        Arc::new(published),
                        inner.events.receiver_count(),
                    ));
                    if held.is_held() {
                        let release = held.clone();
                        inner.runtime.spawn(async move {
                            tokio::time::sleep(HELD_MAX).await;
                            release.release();
                        });
                    }
                    Live::InLog(held)
                }
            };
            // No subscriber is fine: the log has it.
            let _ = inner.events.send(live);
        }
    }
    for (replies, outcome) in replies.into_iter().zip(result.outcomes) {
        // Merged deltas: every caller hears the one outcome.
        let mut replies = replies.into_iter();
        let first = replies.next();
        for reply in replies {
            let _ = reply.send(match &outcome {
                Ok(o) => Ok(o.clone()),
                Err(e) => Err(e.duplicate()),
            });
        }
        if let Some(reply) = first {
            let _ = reply.send(outcome);
        }
    }
    Settled {
        events,
        failed: false,
    }
}

/// Runs the rules of every command of a batch as ONE batch (on the storage thread),
/// written to sled key by key after the log has it ([`Store::direct`]). A command that
/// fails after emitting part of its events is a bug in a rule (rules validate before
/// they emit); the batch is then run again without it, so that no command is ever half
/// applied.
fn transact(
    store: &Store,
    config: &BrokerConfig,
    live: &LiveByAgent,
    streaming: &Streaming,
    first_seq: u64,
    commands: &[Command],
    refused: impl Fn(usize) -> Option<Full>,
) -> Result<BatchResult, BrokerError> {
    // A command refused for the disk's space is left out before it runs.
    let mut left_out: Vec<Option<BrokerError>> = (0..commands.len())
        .map(|i| refused(i).map(|full| BrokerError::StorageThread(StorageError::Full(full))))
        .collect();
    if left_out.iter().any(Option::is_some) {
        tracing::warn!("disk under its reserve: clients' commands are refused");
    }
    // Only this thread appends: the log's end is where this batch's events will go.
    let first_pos = store.log().end();
    // Written without a sled transaction (see `store::direct`).
    let committed = loop {
        let partial = RefCell::new(None);
        let run = |tx: &crate::store::Tx<'_>| {
            let mut ctx = Ctx {
                tx,
                config,
                live,
                live_delta: HashMap::new(),
                streaming,
                streaming_delta: HashMap::new(),
                next_seq: first_seq,
                next_pos: first_pos,
                now: now_ms(),
                events: Vec::new(),
                planned: Vec::new(),
                by: None,
            };
            let mut outcomes = Vec::with_capacity(commands.len());
            for (i, command) in commands.iter().enumerate() {
                if left_out[i].is_some() {
                    outcomes.push(None);
                    continue;
                }
                let emitted = ctx.events.len();
                match ctx.run(command) {
                    // A storage error fails the batch.
                    Err(e @ BrokerError::Storage(_)) => return Err(e),
                    Err(e) if ctx.events.len() > emitted => {
                        *partial.borrow_mut() = Some((i, e));
                        return Err(BrokerError::Internal("a command was half applied".into()));
                    }
                    outcome => outcomes.push(Some(outcome)),
                }
            }
            if let Some((last, _)) = ctx.events.last() {
                crate::store::Sink::put(
                    tx,
                    T::Meta,
                    crate::store::APPLIED_KEY,
                    pair_value(last.seq, ctx.next_pos).to_vec(),
                )?;
                // The log gets the batch before sled gets any of it (a batch run again
                // without a command that failed halfway: what the earlier run appended
                // is taken back first). So a crash leaves the log at or ahead of sled,
                // never behind: a restart catches sled up instead of rebuilding it.
                // Synced by the group commit before anyone hears of it.
                let log = store.log();
                log.rewind(first_pos, first_seq - 1)
                    .and_then(|()| {
                        log.append(ctx.events.iter().map(|(e, bytes)| (e.seq, &bytes[..])))
                    })
                    .map_err(|e| BrokerError::Log(e.to_string()))?;
            }
            Ok((outcomes, ctx.events, ctx.streaming_delta))
        };
        let committed = store.direct(run);
        match partial.into_inner() {
            Some((i, e)) => {
                tracing::error!(command = ?commands[i], error = %e, "a command failed after writing; it is left out of its batch");
                left_out[i] = Some(e);
            }
            None => break committed,
        }
    };
    // Nothing of the batch was committed: take back what the log got of it, so that no
    // group commit syncs it. (A batch written without a transaction whose keys failed
    // midway left part of itself in sled, above the log's end once taken back: the next
    // start rebuilds sled, see `store::direct`.)
    if committed.is_err() {
        store
            .log()
            .rewind(first_pos, first_seq - 1)
            .map_err(|e| BrokerError::Log(e.to_string()))?;
    }
    let (outcomes, events, streamed) = committed?;
    if let Ok(mut streaming) = streaming.lock() {
        for (flight, last) in streamed {
            match last {
                Some(kept) => streaming.insert(flight, kept),
                None => {
                    // It ended: no later event of it carries its long texts.
                    store.log().texts().forget(&flight);
                    streaming.remove(&flight)
                }
            };
        }
    }
    // Node reports move their node's cursor even when refused.
    let wrote = !events.is_empty()
        || commands
            .iter()
            .any(|c| matches!(c, Command::FromNode { .. }));
    Ok(BatchResult {
        wrote,
        outcomes: outcomes
            .into_iter()
            .zip(left_out)
            .map(|(outcome, left_out)| match (outcome, left_out) {
                (Some(outcome), _) => outcome,
                (None, Some(e)) => Err(e),
                (None, None) => Err(BrokerError::Internal("command not run".into())),
            })
            .collect(),
        events,
    })
}

/// What a batch came to.
struct BatchResult {
    outcomes: Vec<Result<Outcome, BrokerError>>,
    /// With its encoding (the log record's payload; see [`Published`]).
    events: Vec<(Published, bytes::Bytes)>,
    /// Whether the batch wrote anything (events, or a node's report cursor).
    wrote: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn delta(
        flight: &str,
        text: &str,
    ) -> (Pending, oneshot::Receiver<Result<Outcome, BrokerError>>) {
        let (reply, rx) = oneshot::channel();
        let command = Command::UpdateFlight {
            flight: flight.into(),
            change: FlightChange::Delta { text: text.into() },
        };
        let pending = Pending {
            command,
            room: Room::DownToFloor,
            reply,
        };
        (pending, rx)
    }

    #[test]
    fn a_burst_in_one_batch_is_cut_into_slices_that_subscribers_take_from_memory() {
        // 3,000 deltas of 100 B from flight a, one of flight b among them.
        let mut batch = Vec::new();
        let mut waiting = Vec::new();
        for i in 0..3000 {
            let (p, rx) = delta("a", &format!("{i:>99}|"));
            batch.push(p);
            waiting.push(rx);
            if i == 1500 {
                let (p, rx) = delta("b", "b's own");
                batch.push(p);
                waiting.push(rx);
            }
        }
        let (commands, _, replies) = coalesce_deltas(batch.into_iter());
        let mut a = String::new();
        let mut b = Vec::new();
        for c in &commands {
            let Command::UpdateFlight {
                flight,
                change: FlightChange::Delta { text },
            } = c
            else {
                panic!("not a delta: {c:?}")
            };
            assert!(text.len() <= DELTA_MERGE_MAX, "a slice of {} B", text.len());
            match flight.as_str() {
                "a" => a.push_str(text),
                _ => b.push(text.clone()),
            }
        }
        let want: String = (0..3000).map(|i| format!("{i:>99}|")).collect();
        assert_eq!(a, want, "nothing lost or reordered");
        assert_eq!(b, vec!["b's own".to_string()]);
        // 300,000 B in slices of at most 12 KiB: more than one, far fewer than 3,000.
        assert!(
            commands.len() > 300_000 / DELTA_MERGE_MAX,
            "{}",
            commands.len()
        );
        assert!(commands.len() < 100, "{}", commands.len());
        // Every caller is answered by the slice its delta went into.
        assert_eq!(replies.iter().map(Vec::len).sum::<usize>(), 3001);
    }
}
