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
    #[error("{0}")]
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
        })
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
        let text = std::fs::read_to_string(&path).map_err(|e| {
            ClientError::NotFound(format!(
                "cannot read {} ({e}); start a broker with `relay up --data-dir {}`, or set RELAY_URL and RELAY_TOKEN",
                path.display(),
                dir.display()
            ))
        })?;
        let info: ApiInfo = serde_json::from_str(&text)
            .map_err(|e| ClientError::NotFound(format!("{} is not valid: {e}", path.display())))?;
        Client::new(&info.url, &info.token)
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

    /// `req` sent with the token; no answer at all is [`ClientError::Unreachable`].
    async fn call(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        req.bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: self.url.clone(),
                source,
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
    /// the stream ends or `on_event` returns false.
    pub async fn sse(
        &self,
        path: &[&str],
        query: Query<'_>,
        mut on_event: impl FnMut(&str, &str) -> bool,
    ) -> Result<(), ClientError> {
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
        let mut buf: Vec<u8> = Vec::new();
        let (mut kind, mut data) = (String::new(), String::new());
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| ClientError::Protocol(e.to_string()))?;
            buf.extend_from_slice(&chunk);
            while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    if !data.is_empty() && !on_event(&kind, &data) {
                        return Ok(());
                    }
                    kind.clear();
                    data.clear();
                } else if let Some(v) = line.strip_prefix("event:") {
                    kind = v.trim_start().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
        }
        Ok(())
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
