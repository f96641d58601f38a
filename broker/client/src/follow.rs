//! [`Follow`]: an SSE stream followed across reconnections. When the stream ends or
//! breaks (the broker restarted, even after `kill -9`; it stopped; the connection
//! reset), the broker is found again ([`Client::rediscover`]: a restarted broker may
//! listen on another port) and the stream opened again with `Last-Event-ID` set to the
//! id of the last event received, so the broker goes on right after it: the follower
//! misses nothing and sees nothing twice. The broker's streams all take `Last-Event-ID`
//! as their `after`.

use std::time::{Duration, Instant};

use crate::client::{read_sse, Client, ClientError, Ended, Query};
use crate::sse::{SseEvent, SseLimits, SseParser};

/// The first pause before reconnecting (unless the stream's `retry:` said otherwise).
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The pause doubles up to this while the broker stays away.
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// How a [`Follow`] waits for a broker that went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// Give up once the broker has been away this long (the last error is returned);
    /// `None`: never (`tail -F`).
    pub give_up_after: Option<Duration>,
    /// A first connection that fails for a reason worth retrying ([`ClientError::is_transient`])
    /// is waited for too; otherwise its error is returned at once.
    pub wait_for_first: bool,
}

/// What a [`Follow`] tells its caller.
#[derive(Debug)]
pub enum Followed<'a> {
    /// An event of the stream.
    Event(&'a SseEvent),
    /// The stream ended or broke, or the broker cannot be reached (why): following
    /// again when it is back. Once per outage.
    Lost(&'a ClientError),
    /// The stream is open again after [`Followed::Lost`].
    Back,
}

/// A stream followed across reconnections (see the module docs). Not `Debug`: it holds
/// the token.
pub struct Follow {
    client: Client,
    path: Vec<String>,
    query: Vec<(String, String)>,
    reconnect: Reconnect,
    limits: SseLimits,
    /// The id of the last event received: `Last-Event-ID` on a reconnection.
    last_id: String,
}

impl Client {
    /// The SSE stream at `path` with `query` (the first connection's position, if any),
    /// followed across reconnections as `reconnect` says: see [`Follow::run`].
    pub fn follow(&self, path: &[&str], query: Query<'_>, reconnect: Reconnect) -> Follow {
        Follow {
            client: self.clone(),
            path: path.iter().map(|s| s.to_string()).collect(),
            query: query
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            reconnect,
            limits: SseLimits::default(),
            last_id: String::new(),
        }
    }
}

impl Follow {
    /// Reads the stream, calling `on` for each event and each outage, until `on`
    /// returns false (`Ok`). Errors: a refusal of the broker (a 4xx: an unknown flight,
    /// a bad position), a stream over its limits, a first connection that fails (unless
    /// [`Reconnect::wait_for_first`]), or the last error once the broker has been away
    /// for [`Reconnect::give_up_after`].
    pub async fn run(
        &mut self,
        mut on: impl FnMut(Followed<'_>) -> bool,
    ) -> Result<(), ClientError> {
        let mut connected = false;
        let mut lost_since: Option<Instant> = None;
        let mut retry: Option<Duration> = None;
        let mut pause = FIRST_PAUSE;
        loop {
            let path: Vec<&str> = self.path.iter().map(String::as_str).collect();
            let query: Vec<(&str, String)> = self
                .query
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect();
            let broke = match self.client.open_sse(&path, &query, &self.last_id).await {
                Ok(resp) => {
                    connected = true;
                    if lost_since.take().is_some() && !on(Followed::Back) {
                        return Ok(());
                    }
                    let mut parser = SseParser::resuming(self.limits, &self.last_id);
                    let ended = read_sse(resp, &mut parser, |e| on(Followed::Event(e))).await;
                    // Where the next connection starts: the last event's id (also one
                    // without data, which `on` never saw).
                    self.last_id = parser.last_event_id().to_string();
                    // A server's `retry:` is taken up to the longest pause, so a huge one
                    // cannot hold a follower past its give-up time.
                    retry = parser.retry().map(|r| r.min(MAX_PAUSE)).or(retry);
                    pause = retry.unwrap_or(FIRST_PAUSE);
                    match ended? {
                        Ended::Stopped => return Ok(()),
                        Ended::Closed(source) => ClientError::Closed {
                            url: self.client.url().to_string(),
                            source,
                        },
                    }
                }
                Err(e) if e.is_transient() && (connected || self.reconnect.wait_for_first) => e,
                Err(e) => return Err(e),
            };
            match lost_since {
                None => {
                    lost_since = Some(Instant::now());
                    if !on(Followed::Lost(&broke)) {
                        return Ok(());
                    }
                }
                Some(since) => {
                    if self
                        .reconnect
                        .give_up_after
                        .is_some_and(|limit| since.elapsed() > limit)
                    {
                        return Err(broke);
                    }
                }
            }
            // An overloaded broker's Retry-After is honoured.
            tokio::time::sleep(pause.max(broke.retry_after().unwrap_or_default())).await;
            pause = (pause * 2).min(MAX_PAUSE.max(retry.unwrap_or_default()));
            self.client = self.client.rediscover();
        }
    }

    /// The client as last found (after a restart, the broker's new address).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The id of the last event received (empty before the first).
    pub fn last_event_id(&self) -> &str {
        &self.last_id
    }
}
