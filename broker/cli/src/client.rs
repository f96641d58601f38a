//! The HTTP client behind the CLI's client commands. It finds the broker through
//! `<data-dir>/api.json`, or `RELAY_URL` + `RELAY_TOKEN` ([`Client::discover`]).

use futures::StreamExt;
use relay_broker::server::{ApiInfo, API_FILE};
use relay_protocol::api::{ApiError, ErrorBody, ErrorCode};
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

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Client {
    pub fn new(url: &str, token: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            url: url.trim_end_matches('/').to_string(),
            token: token.to_string(),
        }
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
                (Some(url), Some(token)) => return Ok(Client::new(&url, &token)),
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
        Ok(Client::new(&info.url, &info.token))
    }

    pub fn url(&self) -> &str {
        &self.url
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

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(self.http.get(format!("{}{path}", self.url)))
            .await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(self.http.post(format!("{}{path}", self.url)).json(body))
            .await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(self.http.delete(format!("{}{path}", self.url)))
            .await
    }

    /// Opens an SSE stream and calls `on_event(event_type, data)` for each event until
    /// the stream ends or `on_event` returns false.
    pub async fn sse(
        &self,
        path: &str,
        mut on_event: impl FnMut(&str, &str) -> bool,
    ) -> Result<(), ClientError> {
        let resp = self
            .call(
                self.http
                    .get(format!("{}{path}", self.url))
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

/// `s` as one path segment of a URL, percent-encoded.
pub fn enc(s: &str) -> String {
    // Path segments: ids and names are restricted, but be safe with anything else.
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
