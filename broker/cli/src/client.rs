//! The HTTP client behind the CLI's client commands. It finds the broker through
//! `<data-dir>/api.json`, or `RELAY_URL` + `RELAY_TOKEN` ([`Client::discover`]).

use futures::StreamExt;
use relay_broker::server::{ApiInfo, API_FILE};
use relay_protocol::api::{ApiError, ErrorBody, ErrorCode};
use reqwest::Url;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::data_dir::DataDir;

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
    #[error("{}", describe_api(.0))]
    Api(ApiError),
    #[error("unexpected answer from the broker: {0}")]
    Protocol(String),
}

impl ClientError {
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api(e) => Some(e.code),
            _ => None,
        }
    }

    /// The broker is not there or cannot take the request now: worth trying again
    /// (a restart, a moment of overload).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } | ClientError::Closed { .. } => true,
            ClientError::Api(e) => {
                matches!(e.code, ErrorCode::Overloaded | ErrorCode::Unavailable)
            }
            ClientError::NotFound(_) | ClientError::Protocol(_) => false,
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
    async fn call(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        req.bearer_auth(&self.token).send().await.map_err(|source| {
            let url = self.url.clone();
            if source.is_connect() {
                ClientError::Unreachable { url, source }
            } else {
                ClientError::Closed {
                    url,
                    source: Some(source),
                }
            }
        })
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let resp = self.call(req).await?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if status.is_success() {
            serde_json::from_slice(&bytes).map_err(|e| ClientError::Protocol(e.to_string()))
        } else {
            Err(error_from(status, &bytes))
        }
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &[&str]) -> Result<T, ClientError> {
        self.get_query(path, &[]).await
    }

    pub async fn get_query<T: DeserializeOwned>(
        &self,
        path: &[&str],
        query: Query<'_>,
    ) -> Result<T, ClientError> {
        self.send(self.http.get(self.endpoint(path, query))).await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &[&str],
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(self.http.post(self.endpoint(path, &[])).json(body))
            .await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &[&str]) -> Result<T, ClientError> {
        self.send(self.http.delete(self.endpoint(path, &[]))).await
    }

    /// Opens an SSE stream and calls `on_event(event_type, data)` for each event until
    /// the stream ends ([`SseEnd::Closed`]: the broker ended it, or went away in the
    /// middle) or `on_event` returns false ([`SseEnd::Stopped`]). An event larger than
    /// [`MAX_SSE_EVENT`] is a [`ClientError::Protocol`] (the broker sends a note to read
    /// a large event from the log instead).
    pub async fn sse(
        &self,
        path: &[&str],
        query: Query<'_>,
        mut on_event: impl FnMut(&str, &str) -> bool,
    ) -> Result<SseEnd, ClientError> {
        let resp = self
            .call(
                self.http
                    .get(self.endpoint(path, query))
                    .header("accept", "text/event-stream"),
            )
            .await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let bytes = resp.bytes().await.unwrap_or_default();
            return Err(error_from(status, &bytes));
        }
        let mut body = resp.bytes_stream();
        let mut parser = SseParser::default();
        while let Some(chunk) = body.next().await {
            // A body cut in the middle (the broker killed, the connection reset) is the
            // end of this stream; the caller decides whether to follow it again.
            let Ok(chunk) = chunk else {
                return Ok(SseEnd::Closed);
            };
            if !parser.feed(&chunk, &mut on_event)? {
                return Ok(SseEnd::Stopped);
            }
        }
        Ok(SseEnd::Closed)
    }
}

/// How an SSE stream ended (see [`Client::sse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseEnd {
    /// The caller had what it wanted.
    Stopped,
    /// The broker ended the stream, or the connection went.
    Closed,
}

/// The largest SSE event the client takes (data lines together).
pub const MAX_SSE_EVENT: usize = 16 << 20;

/// A `text/event-stream` parser: lines end with LF or CRLF; `event:` and `data:` make an
/// event, a blank line ends it; comments (`:`) and other fields are skipped. Bytes are
/// kept only until their line is whole, so a large chunk costs its length once.
#[derive(Default)]
struct SseParser {
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    kind: String,
    data: String,
}

impl SseParser {
    /// Takes a chunk; false when `on_event` asked to stop.
    fn feed(
        &mut self,
        chunk: &[u8],
        on_event: &mut impl FnMut(&str, &str) -> bool,
    ) -> Result<bool, ClientError> {
        let mut rest = chunk;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(pos);
            rest = &tail[1..];
            let line = if self.partial.is_empty() {
                String::from_utf8_lossy(head).into_owned()
            } else {
                self.partial.extend_from_slice(head);
                let line = String::from_utf8_lossy(&self.partial).into_owned();
                self.partial.clear();
                line
            };
            if !self.line(line.strip_suffix('\r').unwrap_or(&line), on_event)? {
                return Ok(false);
            }
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() + self.data.len() > MAX_SSE_EVENT {
            return Err(ClientError::Protocol(format!(
                "an event of the broker's stream is over {MAX_SSE_EVENT} bytes"
            )));
        }
        Ok(true)
    }

    fn line(
        &mut self,
        line: &str,
        on_event: &mut impl FnMut(&str, &str) -> bool,
    ) -> Result<bool, ClientError> {
        if line.is_empty() {
            let go_on = self.data.is_empty() || on_event(&self.kind, &self.data);
            self.kind.clear();
            self.data.clear();
            return Ok(go_on);
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.kind = value.to_string(),
            "data" => {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                if self.data.len() > MAX_SSE_EVENT {
                    return Err(ClientError::Protocol(format!(
                        "an event of the broker's stream is over {MAX_SSE_EVENT} bytes"
                    )));
                }
            }
            _ => {}
        }
        Ok(true)
    }
}

/// The typed API error in a failed response, or the raw text when there is none.
fn error_from(status: reqwest::StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => ClientError::Api(b.error),
        Err(_) => {
            ClientError::Protocol(format!("HTTP {status}: {}", String::from_utf8_lossy(body)))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parse(chunks: &[&[u8]]) -> Vec<(String, String)> {
        let mut p = SseParser::default();
        let mut got = Vec::new();
        for c in chunks {
            p.feed(c, &mut |k: &str, d: &str| {
                got.push((k.to_string(), d.to_string()));
                true
            })
            .unwrap();
        }
        got
    }

    #[test]
    fn sse_events_are_parsed_across_chunks() {
        let whole: &[u8] =
            b": keep-alive\n\nid: 3\nevent: update\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: l1\ndata:l2\n\n";
        let expected = vec![
            ("update".to_string(), "{\"a\":1}".to_string()),
            ("x".to_string(), "l1\nl2".to_string()),
        ];
        assert_eq!(parse(&[whole]), expected);
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(parse(&bytes), expected, "one byte at a time");
        // A character split between chunks stays whole.
        let text = "data: é\n\n".as_bytes();
        assert_eq!(
            parse(&[&text[..7], &text[7..]]),
            vec![(String::new(), "é".into())]
        );
    }

    #[test]
    fn an_event_over_the_limit_is_refused() {
        let mut p = SseParser::default();
        let big = vec![b'x'; MAX_SSE_EVENT + 1];
        let r = p.feed(&big, &mut |_: &str, _: &str| true);
        assert!(matches!(r, Err(ClientError::Protocol(_))));
    }

    #[test]
    fn urls_are_built_by_the_url_type() {
        let c = Client::new("http://127.0.0.1:7450/", "t").unwrap();
        assert_eq!(c.url(), "http://127.0.0.1:7450");
        assert_eq!(
            c.endpoint(&["v1", "agents", "a b/c?d%e#f"], &[]).as_str(),
            "http://127.0.0.1:7450/v1/agents/a%20b%2Fc%3Fd%25e%23f"
        );
        assert_eq!(
            c.endpoint(
                &["v1", "flights"],
                &[("agent", "x&y=z".into()), ("limit", "5".into())]
            )
            .as_str(),
            "http://127.0.0.1:7450/v1/flights?agent=x%26y%3Dz&limit=5"
        );
        let under = Client::new("http://h:1/relay", "t").unwrap();
        assert_eq!(
            under.endpoint(&["v1", "status"], &[]).as_str(),
            "http://h:1/relay/v1/status"
        );
        assert!(matches!(
            Client::new("not a url", "t"),
            Err(ClientError::NotFound(_))
        ));
    }
}
