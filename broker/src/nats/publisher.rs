//! The NATS publisher: every committed flight update and message, in order from a saved
//! cursor, flight updates through the `RELAY_FLIGHTS` stream with acknowledgement;
//! events too large for NATS trimmed, events it never takes skipped.
//!
//! Each update's `Nats-Msg-Id` is keyed with the bus key ([`StreamIds`]), so no client
//! can take an update's id before the broker publishes it. A `duplicate` acknowledgement
//! is expected for a re-publish (after a restart or a lost acknowledgement); one for an
//! update the stream holds something else under is an alarm: logged as an error and
//! counted ([`Counters::forged_ids`]).

use std::future::IntoFuture;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;

use prost::Message as _;
use relay_infra::retry::{self, RetryableWithContext};
use relay_protocol::bus::{
    json_type_name, subjects, type_name, CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE, SEQ_HEADER,
    TYPE_HEADER,
};
use relay_protocol::convert;
use relay_protocol::event::EventBody;
use relay_protocol::pb;
use tokio_util::sync::CancellationToken;

use super::service::Counters;
use crate::broker::{Broker, Published};
use crate::seal::StreamIds;

mod trim;
use trim::{text_bytes, trim_texts};

/// Flight updates published to the stream whose acknowledgement is outstanding, at most.
const ACK_WINDOW: usize = 4096;
/// How long to wait for the stream to acknowledge an update before publishing again.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times in a row the stream may refuse one update before it is skipped.
const STREAM_REFUSALS: u32 = 5;
/// How long a stopping publisher waits for NATS to take what it was given.
const FINAL_FLUSH: Duration = Duration::from_secs(3);
/// Waits between tries to publish an event while NATS is unreachable.
const PUBLISH_BACKOFF: retry::ExponentialBuilder =
    retry::forever(Duration::from_millis(50), Duration::from_secs(2));

/// Publishes every committed flight update and message, from the seq saved in
/// `cursor_file` (or the current end of the log), until `shutdown` fires.
///
/// Flight updates go to the `RELAY_FLIGHTS` stream (and its subscribers) with
/// acknowledgement; the cursor only moves past an update once the stream has it, and an
/// update not acknowledged is published again from there (`Nats-Msg-Id` makes the stream
/// keep one copy; plain subscribers may see it twice and drop it by `seq`). An event that
/// NATS can never take (a subject it refuses, a payload over its limit even trimmed) is
/// logged, counted and skipped: one bad event must not stop the bus.
pub async fn publish(
    client: async_nats::Client,
    broker: Broker,
    cursor_file: PathBuf,
    counters: Arc<Counters>,
    ids: StreamIds,
    shutdown: CancellationToken,
) {
    let js = async_nats::jetstream::new(client.clone());
    let start = std::fs::read_to_string(&cursor_file)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| broker.last_seq());
    let mut publisher = Publisher {
        client: client.clone(),
        js,
        counters,
        ids,
        acks: std::collections::VecDeque::new(),
        handed: start,
        failing: (0, 0),
        done: start,
    };
    let mut feed = crate::feed::Feed::new(broker.clone(), start);
    let (saved, saver) = cursor_saver(cursor_file, start);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        if publisher.acks.len() >= ACK_WINDOW {
            if let Err(from) = publisher.settle(Wait::Yes).await {
                feed = crate::feed::Feed::new(broker.clone(), from);
            }
            continue;
        }
        let item = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {
                // Only what NATS already answered: waiting here for the last
                // acknowledgements held the next events back (3-7 ms at times).
                match publisher.settle(Wait::No).await {
                    // Saved by its own task: a file's sync must not hold back
                    // the next events (it took milliseconds, 5 times a second).
                    Ok(()) => {
                        let done = publisher.done;
                        saved.send_if_modified(|seq| std::mem::replace(seq, done) != done);
                    }
                    Err(from) => feed = crate::feed::Feed::new(broker.clone(), from),
                }
                continue;
            }
            i = feed.recv() => i,
        };
        let event = match item {
            Some(Ok(event)) => event,
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot read the event log; NATS publishing stopped");
                break;
            }
            None => break,
        };
        // Tried until NATS takes it (what it never will is skipped inside `publish`), so
        // the outcome is `Ok`; only a stop while waiting between tries ends it. Each try
        // owns the publisher and the event and hands them back: a future borrowing them
        // is not `Send` to the compiler through backon's generic types.
        let seq = event.seq;
        let published = retry::until_stopped(&shutdown, |sleeper| {
            (|(mut p, event): (Publisher, Arc<Published>)| async move {
                let outcome = p.publish(&event).await;
                ((p, event), outcome)
            })
            .retry(PUBLISH_BACKOFF)
            .sleep(sleeper)
            .context((publisher, event))
            .notify(|e, _| {
                tracing::warn!(seq, error = %e, "NATS publish failed; retrying");
            })
        })
        .await;
        let Some(((p, _), _taken)) = published else {
            return;
        };
        publisher = p;
    }
    if tokio::time::timeout(FINAL_FLUSH, publisher.settle(Wait::Yes))
        .await
        .is_ok_and(|r| r.is_ok())
    {
        saved.send_replace(publisher.done);
    } else {
        tracing::warn!("NATS did not take the last events before the stop; they are published again at the next start");
    }
    // The saver writes what it was last given, then ends.
    drop(saved);
    let _ = saver.await;
}

/// The task that saves the publisher's cursor: the latest seq it is given, once per
/// change (changes while a save runs fold into the next), and the last one before it
/// ends (when the sender drops).
fn cursor_saver(
    path: PathBuf,
    start: u64,
) -> (tokio::sync::watch::Sender<u64>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = tokio::sync::watch::channel(start);
    let task = tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let seq = *rx.borrow_and_update();
            save_cursor(&path, seq).await;
        }
    });
    (tx, task)
}

struct Publisher {
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
    counters: Arc<Counters>,
    ids: StreamIds,
    /// Flight updates handed to the stream, oldest first.
    acks: std::collections::VecDeque<Handed>,
    /// The last event handed to NATS.
    handed: u64,
    /// The update whose acknowledgement failed last, and how many times in a row.
    failing: (u64, u32),
    /// Every event up to this one is with NATS (acknowledged by the stream where it
    /// goes to the stream).
    done: u64,
}

impl Publisher {
    /// Publishes one committed event on its subjects (nothing for most event types). An
    /// error is a connection problem worth retrying; what can never be published is
    /// skipped here.
    async fn publish(&mut self, event: &relay_protocol::event::Event) -> Result<(), String> {
        // The server's limit, as of the connection's last word from it (an atomic read:
        // a copy of the server's info each event was 1 % of the publisher's time at 64
        // flights in flight).
        let max = self.client.max_payload();
        match &event.body {
            EventBody::FlightUpdated { update, flight } => {
                // Copied only if they must be trimmed to fit (rare): not once per update.
                let mut update = std::borrow::Cow::Borrowed(update);
                let mut flight = std::borrow::Cow::Borrowed(flight);
                let mut trimmed = false;
                // Texts alone past the server's limit (a long answer): cut before
                // anything is encoded, not after encoding them whole twice.
                if max > 0 && text_bytes(&update, &flight) > max {
                    trim_texts(update.to_mut(), flight.to_mut());
                    trimmed = true;
                }
                loop {
                    match self.publish_update(event.seq, &update, &flight, max).await {
                        Ok(()) => break,
                        Err(Unpublishable::TooLarge) if !trimmed => {
                            trim_texts(update.to_mut(), flight.to_mut());
                            trimmed = true;
                        }
                        Err(Unpublishable::Retry(e)) => return Err(e),
                        Err(e) => {
                            self.skip(event, &e);
                            break;
                        }
                    }
                }
            }
            // A body alone past the server's limit cannot go: not encoded for nothing.
            EventBody::MessagePosted { message, .. } if max > 0 && message.body.len() > max => {
                self.skip(event, &Unpublishable::TooLarge);
            }
            EventBody::MessagePosted { message, .. } => {
                let mut headers = HeaderMap::new();
                headers.insert(SEQ_HEADER, event.seq.to_string().as_str());
                headers.insert(TYPE_HEADER, type_name::<pb::Message>().as_str());
                let result = self
                    .client
                    .publish_with_headers(
                        subjects::conversation(&message.conversation),
                        headers,
                        convert::message_to_pb(message).encode_to_vec().into(),
                    )
                    .await;
                if let Err(e) = result {
                    match e.kind() {
                        async_nats::client::PublishErrorKind::Send => return Err(e.to_string()),
                        _ => self.skip(event, &Unpublishable::Refused(e.to_string())),
                    }
                }
            }
            _ => {}
        }
        self.counters.published.fetch_add(1, Ordering::Relaxed);
        self.handed = event.seq;
        Ok(())
    }

    async fn publish_update(
        &mut self,
        seq: u64,
        update: &relay_protocol::domain::FlightUpdate,
        flight: &relay_protocol::domain::Flight,
        max: usize,
    ) -> Result<(), Unpublishable> {
        let pb_bytes = convert::update_to_pb(update, flight).encode_to_vec();
        // Encoded straight from the records (`json!` built a `Value` of each first: about
        // 2 % of the broker's samples at 64 flights in flight).
        #[derive(serde::Serialize)]
        struct Mirror<'a> {
            update: &'a relay_protocol::domain::FlightUpdate,
            flight: &'a relay_protocol::domain::Flight,
        }
        // Sized once, not grown from 128 bytes (the JSON is about twice the protobuf).
        let mut json = Vec::with_capacity(2 * pb_bytes.len() + 256);
        serde_json::to_writer(&mut json, &Mirror { update, flight })
            .map_err(|e| Unpublishable::Refused(e.to_string()))?;
        // Room for the headers; the server's limit covers them too.
        if max > 0 && pb_bytes.len().max(json.len()) + 1024 > max {
            return Err(Unpublishable::TooLarge);
        }
        let mut headers = HeaderMap::new();
        headers.insert(SEQ_HEADER, seq.to_string().as_str());
        headers.insert(TYPE_HEADER, type_name::<pb::FlightUpdate>().as_str());
        // The stream drops a re-publish of the same update (after a restart, a lost ack),
        // and only the broker can make the id (see the module docs).
        let id = self.ids.flight_update(&update.flight, update.seq);
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        let payload = bytes::Bytes::from(pb_bytes);
        let ack = self
            .js
            .publish_with_headers(
                subjects::flight(&update.agent, &update.flight),
                headers.clone(),
                payload.clone(),
            )
            .await
            .map_err(|e| match e.kind() {
                async_nats::jetstream::context::PublishErrorKind::MaxPayloadExceeded => {
                    Unpublishable::TooLarge
                }
                _ => Unpublishable::Retry(e.to_string()),
            })?;
        self.acks.push_back(Handed {
            seq,
            id,
            digest: digest(&payload),
            ack: ack.into_future(),
            at: tokio::time::Instant::now(),
        });
        let mut json_headers = headers;
        json_headers.insert(TYPE_HEADER, json_type_name::<pb::FlightUpdate>().as_str());
        json_headers.insert(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE);
        // The JSON mirror rides on the same connection: if it breaks, the stream's
        // acknowledgement fails too and both are published again from there.
        if let Err(e) = self
            .client
            .publish_with_headers(
                subjects::flight_json(&update.agent, &update.flight),
                json_headers,
                json.into(),
            )
            .await
        {
            tracing::debug!(error = %e, "JSON flight update not published");
        }
        Ok(())
    }

    fn skip(&self, event: &relay_protocol::event::Event, why: &Unpublishable) {
        self.counters.unpublishable.fetch_add(1, Ordering::Relaxed);
        tracing::error!(seq = event.seq, event = event.body.type_name(), error = %why, "event not published on NATS; skipped (the log still has it)");
    }

    /// Takes the stream's acknowledgements of what was handed, in order: all of them
    /// ([`Wait::Yes`]), or those already answered ([`Wait::No`]); `done` moves up to the
    /// first still waiting. On a missing one, returns the seq to publish again after.
    /// An update the stream keeps refusing ([`STREAM_REFUSALS`] times in a row: a stream
    /// deleted or limited under it) is skipped, so the publisher never loops on it.
    async fn settle(&mut self, wait: Wait) -> Result<(), u64> {
        while let Some(front) = self.acks.front_mut() {
            let due = front.at + ACK_TIMEOUT;
            // `None`: no answer in time.
            let answer = match wait {
                Wait::Yes => tokio::time::timeout_at(due, &mut front.ack).await.ok(),
                // One poll: an answer already here is taken; one on its way is left for
                // later, unless it is overdue.
                Wait::No => match futures::FutureExt::now_or_never(&mut front.ack) {
                    Some(answer) => Some(answer),
                    None if tokio::time::Instant::now() >= due => None,
                    None => break,
                },
            };
            let Some(handed) = self.acks.pop_front() else {
                break;
            };
            let seq = handed.seq;
            let why = match answer {
                Some(Ok(ack)) if ack.duplicate => {
                    let dup = Duplicate {
                        seq,
                        id: &handed.id,
                        digest: &handed.digest,
                        stream_seq: ack.sequence,
                    };
                    check_duplicate(&self.js, &self.counters, dup).await;
                    continue;
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => e.to_string(),
                None => "no acknowledgement in time".into(),
            };
            self.failing = match self.failing {
                (s, n) if s == seq => (s, n + 1),
                _ => (seq, 1),
            };
            if self.failing.1 >= STREAM_REFUSALS {
                self.counters.unpublishable.fetch_add(1, Ordering::Relaxed);
                tracing::error!(seq, error = %why, "the flight stream keeps refusing an update; it is skipped (the log still has it)");
                continue;
            }
            tracing::warn!(seq, error = %why, "the flight stream did not take an update; publishing again from it");
            self.acks.clear();
            let from = seq - 1;
            self.handed = from;
            self.done = from;
            return Err(from);
        }
        // Everything before the first update still waiting is with NATS once it has
        // the plain publishes among them.
        let upto = self.acks.front().map_or(self.handed, |h| h.seq - 1);
        if self.done != upto {
            if self.client.flush().await.is_err() {
                return Ok(());
            }
            self.done = upto;
        }
        Ok(())
    }
}

/// A duplicate acknowledgement: the update at `seq`, published under `id`, is already
/// in the stream at `stream_seq`.
struct Duplicate<'a> {
    seq: u64,
    id: &'a str,
    digest: &'a Digest,
    stream_seq: u64,
}

/// The stream said it already holds an update under `id`, at `stream_seq`: a
/// re-publish of this very update is expected; anything else there means someone
/// else made one of the broker's ids (its bus key is known outside it), and the
/// broker's update is not in the stream: an alarm.
async fn check_duplicate(
    js: &async_nats::jetstream::Context,
    counters: &Counters,
    dup: Duplicate<'_>,
) {
    let Duplicate {
        seq,
        id,
        digest,
        stream_seq,
    } = dup;
    // A handle without the stream-info round trip: the read below fails the same
    // way if the stream is gone.
    let stored = match js.get_stream_no_info(subjects::FLIGHT_STREAM).await {
        Ok(stream) => stream
            .get_raw_message(stream_seq)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let stored = match stored {
        Ok(m) => m,
        Err(e) => {
            // Aged out or removed since: nothing to compare, and nothing to alarm on.
            tracing::debug!(seq, stream_seq, error = %e, "a duplicate flight update could not be checked");
            return;
        }
    };
    let same_seq = stored
        .headers
        .get(SEQ_HEADER)
        .is_some_and(|v| v.as_str() == seq.to_string());
    if same_seq && self::digest(&stored.payload) == *digest {
        return;
    }
    let alarms = counters.forged_ids.fetch_add(1, Ordering::Relaxed) + 1;
    tracing::error!(
        alarms,
        seq,
        msg_id = id,
        stream_seq,
        subject = %stored.subject,
        "ALARM: the flight stream holds a message the broker never published under the id of one of its updates, and dropped the broker's as a duplicate; only a holder of the bus key (<data-dir>/bus.key) can make these ids: treat it as leaked (replace it and the node keys) and read this flight over HTTP"
    );
}

/// A flight update handed to the stream, waiting for its acknowledgement.
struct Handed {
    /// Its event's global seq.
    seq: u64,
    /// Its `Nats-Msg-Id`.
    id: String,
    /// The SHA-256 of what was published, to tell a re-publish from a forgery on a
    /// duplicate (not the payload: up to [`ACK_WINDOW`] of them would be held).
    digest: Digest,
    ack: <async_nats::jetstream::context::PublishAckFuture as IntoFuture>::IntoFuture,
    /// When it was handed: its acknowledgement is due [`ACK_TIMEOUT`] after.
    at: tokio::time::Instant,
}

/// Whether settling waits for acknowledgements still on their way.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Until each came (or its [`ACK_TIMEOUT`] passed): the window is full, or a stop.
    Yes,
    /// No: settles those already answered (or overdue), and leaves the rest for later.
    No,
}

type Digest = [u8; 32];

fn digest(payload: &[u8]) -> Digest {
    use sha2::Digest as _;
    sha2::Sha256::digest(payload).into()
}

/// Why an event did not go out.
#[derive(Debug, thiserror::Error)]
enum Unpublishable {
    #[error("over the NATS server's max_payload")]
    TooLarge,
    #[error("refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Retry(String),
}

/// Saves the publisher's cursor ([`crate::files::write_private`]), off the async
/// workers; a cursor not saved only means some updates are published again.
async fn save_cursor(path: &std::path::Path, seq: u64) {
    let path = path.to_owned();
    let saved = tokio::task::spawn_blocking(move || {
        crate::files::write_private(&path, seq.to_string().as_bytes())
    })
    .await;
    if let Ok(Err(e)) = saved {
        tracing::debug!(error = %e, "NATS cursor not saved");
    }
}
