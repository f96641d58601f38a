//! [`Client`]: requests to one broker's HTTP API with its token, and its SSE streams
//! read with [`crate::sse`]. It finds the broker through `<data-dir>/api.json`, or
//! `RELAY_URL` + `RELAY_TOKEN` ([`Client::discover`]), and finds it again after a
//! restart ([`Client::rediscover`]).

use futures::StreamExt;
use relay_protocol::api::{ApiError, ApiInfo, ErrorBody, ErrorCode, API_FILE};
use relay_protocol::methods::{Answer, Call, Verb};
use reqwest::Url;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::data_dir::DataDir;
use crate::sse::{SseError, SseEvent, SseParser};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no broker found: {0}")]
    NotFound(String),
    #[error("cannot reach the broker at {url}: {source} (is `relay up` running?)")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The broker took the connection and closed it without an answer: past its
    /// connection limit it refuses with a 429 it does not wait to be read, and a broker
    /// being stopped drops its connections.
    #[error("the broker at {url} closed the connection without answering: it is overloaded (too many connections) or stopping; try again")]
    Closed {
        url: String,
        #[source]
        source: Option<reqwest::Error>,
    },
    /// The broker answered 429 or 503: it is there, but cannot take the request now.
    #[error("the broker at {url} is overloaded; retry {}: {} ({})", retry_in(*.retry_after), .error.message, .error.code)]
    Overloaded {
        url: String,
        /// Its `Retry-After`, when it sent one (in seconds).
        retry_after: Option<std::time::Duration>,
        error: ApiError,
    },
    #[error("{}", describe_api(.0))]
    Api(ApiError),
    #[error("unexpected answer from the broker: {0}")]
    Protocol(String),
    /// An event stream over the parser's limits (see [`crate::sse::SseLimits`]).
    #[error("the broker's event stream cannot be read: {0}")]
    Stream(#[from] SseError),
}

impl ClientError {
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api(e) | ClientError::Overloaded { error: e, .. } => Some(e.code),
            _ => None,
        }
    }

    /// How long the broker asked to be left alone (`Retry-After`), if it did.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ClientError::Overloaded { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The broker is not there or cannot take the request now: worth trying again
    /// (a restart, a moment of overload).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. }
            | ClientError::Closed { .. }
            | ClientError::Overloaded { .. } => true,
            ClientError::Api(e) => {
                matches!(e.code, ErrorCode::Overloaded | ErrorCode::Unavailable)
            }
            ClientError::NotFound(_) | ClientError::Protocol(_) | ClientError::Stream(_) => false,
        }
    }
}

/// A broker's error as the CLI says it: an overload says so first, so it never reads
/// like a broker that cannot be reached.
fn describe_api(e: &ApiError) -> String {
    match e.code {
        ErrorCode::Overloaded => format!(
            "the broker is overloaded, try again in a moment: {} ({})",
            e.message, e.code
        ),
        _ => e.to_string(),
    }
}

/// When to retry, as [`ClientError::Overloaded`] says it.
fn retry_in(after: Option<std::time::Duration>) -> String {
    match after {
        Some(d) if d.as_secs() > 0 => format!("in {} s", d.as_secs()),
        _ => "in a moment".into(),
    }
}

/// A query: names and values, form-encoded into the URL by [`Url`].
pub type Query<'a> = &'a [(&'a str, String)];

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The broker's URL as given, without a trailing `/`: what messages show.
    url: String,
    /// The same, parsed: every request's URL is built from it.
    base: Url,
    token: String,
    /// The api.json it was found through, read again by [`Client::rediscover`] (a
    /// restarted broker may listen on another port).
    api_file: Option<std::path::PathBuf>,
}

impl Client {
    /// A client of the broker at `url`; [`ClientError::NotFound`] if `url` is not an
    /// HTTP URL that paths can be added to.
    pub fn new(url: &str, token: &str) -> Result<Client, ClientError> {
        let url = url.trim_end_matches('/');
        let base = Url::parse(url)
            .ok()
            .filter(|u| !u.cannot_be_a_base())
            .ok_or_else(|| ClientError::NotFound(format!("the broker URL {url:?} is not a URL")))?;
        Ok(Client {
            http: reqwest::Client::new(),
            url: url.to_string(),
            base,
            token: token.to_string(),
            api_file: None,
        })
    }

    /// The client of the broker as the api.json it came from says now (a restarted
    /// broker on another port); itself when it came from RELAY_URL, or the file cannot
    /// be read yet (the broker not back).
    pub fn rediscover(&self) -> Client {
        self.api_file
            .as_deref()
            .and_then(|path| Client::from_api_file(path).ok())
            .unwrap_or_else(|| self.clone())
    }

    fn from_api_file(path: &std::path::Path) -> Result<Client, ClientError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClientError::NotFound(format!("cannot read {} ({e})", path.display())))?;
        let info: ApiInfo = serde_json::from_str(&text)
            .map_err(|e| ClientError::NotFound(format!("{} is not valid: {e}", path.display())))?;
        let mut client = Client::new(&info.url, &info.token)?;
        client.api_file = Some(path.to_path_buf());
        Ok(client)
    }

    /// The broker of a `--data-dir` given on the command line (its api.json); else
    /// `url` + `token` (`RELAY_URL` + `RELAY_TOKEN`), which go together; else the
    /// api.json of `RELAY_DATA_DIR` or the default data dir.
    pub fn discover(
        data_dir: DataDir,
        url: Option<String>,
        token: Option<String>,
    ) -> Result<Client, ClientError> {
        if !matches!(data_dir, DataDir::Given(_)) {
            match (url, token) {
                (Some(url), Some(token)) => return Client::new(&url, &token),
                (Some(_), None) => {
                    return Err(ClientError::NotFound(
                        "RELAY_URL is set but RELAY_TOKEN is not: set both, or neither to use the data dir's api.json".into(),
                    ))
                }
                (None, Some(_)) => {
                    return Err(ClientError::NotFound(
                        "RELAY_TOKEN is set but RELAY_URL is not: set both, or neither to use the data dir's api.json".into(),
                    ))
                }
                (None, None) => {}
            }
        }
        let dir = data_dir.path();
        let path = dir.join(API_FILE);
        if !path.exists() {
            let relative = std::env::var_os("RELAY_DATA_DIR")
                .is_some_and(|d| std::path::Path::new(&d).is_relative());
            return Err(ClientError::NotFound(format!(
                "{} has no {API_FILE}, so no broker has run with it: start one with `relay up{}`, or set RELAY_URL and RELAY_TOKEN{}",
                dir.display(),
                if dir == crate::data_dir::default_path() {
                    String::new()
                } else {
                    format!(" --data-dir {}", dir.display())
                },
                if relative {
                    " (RELAY_DATA_DIR is a relative path: it names another directory wherever you cd; make it absolute)"
                } else {
                    ""
                }
            )));
        }
        Client::from_api_file(&path)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL of `path` (segments, each escaped as one by [`Url`]) under the broker's,
    /// with `query`.
    pub fn endpoint(&self, path: &[&str], query: Query) -> Url {
        let mut url = self.base.clone();
        // `new` refused a URL that cannot be a base, the only error here.
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(path);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// `req` sent with the token; no connection is [`ClientError::Unreachable`], a
    /// connection closed with no answer [`ClientError::Closed`].
    async fn transmit(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        req.bearer_auth(&self.token).send().await.map_err(|source| {
            let url = self.url.clone();
            if source.is_builder() {
                // A request that could not be made (a query that does not encode): a
                // bug of the caller, not a broker to wait for.
                ClientError::Protocol(format!("the request cannot be made: {source}"))
            } else if source.is_connect() {
                ClientError::Unreachable { url, source }
            } else {
                ClientError::Closed {
                    url,
                    source: Some(source),
                }
            }
        })
    }

    /// Sends `req` and reads its JSON answer. A `read` (a `GET`) the broker closed without
    /// answering is sent once more: when too many connections wait for their request
    /// heads, the broker pushes out the oldest, and a client's may be among them before
    /// its head was read (a crowd of half-sent heads, `relay status` in the middle). A
    /// read asked again changes nothing; a write is not asked again (it may be done).
    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        read: bool,
    ) -> Result<T, ClientError> {
        let again = if read { req.try_clone() } else { None };
        let resp = match (self.transmit(req).await, again) {
            (Err(ClientError::Closed { .. }), Some(again)) => self.transmit(again).await?,
            (resp, _) => resp?,
        };
        let status = resp.status();
        let retry_after = retry_after(resp.headers());
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if status.is_success() {
            serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))
        } else {
            Err(self.error_from(status, retry_after, &bytes))
        }
    }

    /// Calls method `M` of the method table ([`relay_protocol::methods`]): its verb and
    /// route come from the table, `params` fill the route's `{name}`s in order, and
    /// `request` is the query of a `GET` or the JSON body of a `POST`.
    pub async fn call<M: Call>(
        &self,
        params: &[&str],
        request: &M::Request,
    ) -> Result<M::Response, ClientError> {
        let m = M::method();
        if m.answer == Answer::Stream {
            return Err(ClientError::Protocol(format!(
                "{} is a stream: read it with Client::follow or Client::sse",
                m.name
            )));
        }
        let url = self.endpoint(&Self::path::<M>(params)?, &[]);
        let req = match m.verb {
            Verb::Get => self.http.get(url).query(request),
            Verb::Post => self.http.post(url).json(request),
            // A DELETE says what it asks in its query (`?force=true`), as a GET does.
            Verb::Delete => self.http.delete(url).query(request),
        };
        self.send(req, matches!(m.verb, Verb::Get)).await
    }

    /// The path segments of method `M` with `params` filled in (for a stream: see
    /// [`Client::sse`] and [`Client::follow`]). Too few or too many `params` is a
    /// [`ClientError::Protocol`] that names the method.
    pub fn path<'a, M: Call>(params: &[&'a str]) -> Result<Vec<&'a str>, ClientError> {
        M::method().segments(params).map_err(ClientError::Protocol)
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &[&str]) -> Result<T, ClientError> {
        self.get_query(path, &[]).await
    }

    pub async fn get_query<T: DeserializeOwned>(
        &self,
        path: &[&str],
        query: Query<'_>,
    ) -> Result<T, ClientError> {
        self.send(self.http.get(self.endpoint(path, query)), true)
            .await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &[&str],
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(self.http.post(self.endpoint(path, &[])).json(body), false)
            .await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &[&str]) -> Result<T, ClientError> {
        self.send(self.http.delete(self.endpoint(path, &[])), false)
            .await
    }

    /// Opens an SSE stream and calls `on_event(event_type, data)` for each event until
    /// the stream ends ([`SseEnd::Closed`]: the broker ended it, or went away in the
    /// middle) or `on_event` returns false ([`SseEnd::Stopped`]). An event over
    /// [`crate::sse::MAX_SSE_EVENT`] is a [`ClientError::Stream`] (the broker sends a
    /// note to read a large event from the log instead). One connection: see
    /// [`Client::follow`] for a stream followed across reconnections.
    pub async fn sse(
        &self,
        path: &[&str],
        query: Query<'_>,
        mut on_event: impl FnMut(&str, &str) -> bool,
    ) -> Result<SseEnd, ClientError> {
        let resp = self.open_sse(path, query, "").await?;
        let mut parser = SseParser::default();
        let ended = read_sse(resp, &mut parser, |e| on_event(&e.event, &e.data)).await?;
        Ok(match ended {
            Ended::Stopped => SseEnd::Stopped,
            Ended::Closed(_) => SseEnd::Closed,
        })
    }

    /// The response of an SSE stream, `last_event_id` (unless empty) sent as
    /// `Last-Event-ID`; a failed one is its error.
    pub(crate) async fn open_sse(
        &self,
        path: &[&str],
        query: Query<'_>,
        last_event_id: &str,
    ) -> Result<reqwest::Response, ClientError> {
        let mut req = self
            .http
            .get(self.endpoint(path, query))
            .header("accept", "text/event-stream");
        if !last_event_id.is_empty() {
            req = req.header("last-event-id", last_event_id);
        }
        let resp = self.transmit(req).await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let retry_after = retry_after(resp.headers());
            let bytes = resp.bytes().await.unwrap_or_default();
            return Err(self.error_from(status, retry_after, &bytes));
        }
        Ok(resp)
    }
}

/// How one connection's stream ended, inside the crate.
pub(crate) enum Ended {
    /// `on_event` had what it wanted.
    Stopped,
    /// The body ended (the broker ended the stream) or broke (the error).
    Closed(Option<reqwest::Error>),
}

/// Reads `resp`'s body through `parser` until `on_event` says stop or the body ends.
pub(crate) async fn read_sse(
    resp: reqwest::Response,
    parser: &mut SseParser,
    mut on_event: impl FnMut(&SseEvent) -> bool,
) -> Result<Ended, ClientError> {
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        // A body cut in the middle (the broker killed, the connection reset) is the
        // end of this stream; the caller decides whether to follow it again.
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return Ok(Ended::Closed(Some(e))),
        };
        if !parser.feed(&chunk, &mut on_event)? {
            return Ok(Ended::Stopped);
        }
    }
    Ok(Ended::Closed(None))
}

/// How an SSE stream ended (see [`Client::sse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseEnd {
    /// The caller had what it wanted.
    Stopped,
    /// The broker ended the stream, or the connection went.
    Closed,
}

impl Client {
    /// The typed API error in a failed response, or the raw text when there is none. A
    /// 429 or 503 is [`ClientError::Overloaded`], typed body or not (a proxy's, say),
    /// except a typed refusal that is no overload: `budget_exceeded` is a 429 too, but
    /// trying again changes nothing until the budget resets or is raised.
    fn error_from(
        &self,
        status: reqwest::StatusCode,
        retry_after: Option<std::time::Duration>,
        body: &[u8],
    ) -> ClientError {
        let typed = serde_json::from_slice::<ErrorBody>(body)
            .ok()
            .map(|b| b.error);
        match status.as_u16() {
            429 | 503
                if !typed.as_ref().is_none_or(|e| {
                    matches!(e.code, ErrorCode::Overloaded | ErrorCode::Unavailable)
                }) =>
            {
                typed.map_or_else(
                    || ClientError::Protocol(status.to_string()),
                    ClientError::Api,
                )
            }
            429 | 503 => ClientError::Overloaded {
                url: self.url.clone(),
                retry_after,
                error: typed.unwrap_or_else(|| ApiError {
                    code: if status.as_u16() == 429 {
                        ErrorCode::Overloaded
                    } else {
                        ErrorCode::Unavailable
                    },
                    message: format!("HTTP {status}: {}", String::from_utf8_lossy(body).trim()),
                }),
            },
            _ => match typed {
                Some(e) => ClientError::Api(e),
                None => ClientError::Protocol(format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(body)
                )),
            },
        }
    }
}

/// Most a `Retry-After` is taken as: a broker's (or a proxy's) huge one must not park a
/// client for hours.
const MAX_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// A `Retry-After` in seconds (the form the broker sends; an HTTP date is not read).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<std::time::Duration> {
    let secs = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(std::time::Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests;
