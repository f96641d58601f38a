//! The dashboard's logins as the broker holds them ([`WebAuth`]): the one-time login
//! codes (in memory), the login cookie (signed and checked by [`super::login_keys`]),
//! and the end of a login (a logout, a revoke-all), which also ends the live streams
//! the dashboard's logins have open. What is stored where, and what a restart, a logout
//! and a revoke-all do: `web`'s header.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap};
use axum::response::Response;
use relay_protocol::api::ErrorCode;
use relay_protocol::clock;
use tokio_util::sync::CancellationToken;

use super::login_keys::{LoginKeys, Signed, LOGIN_LIFETIME};
use super::HttpError;
use crate::files::FileError;

/// How long a login link works.
pub const CODE_LIFETIME: Duration = Duration::from_secs(120);
/// Login links not yet used, at most (the oldest goes first).
const MAX_CODES: usize = 64;

/// A browser logged in through a login link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub name: String,
}

impl Login {
    /// Who its decisions are recorded as.
    pub fn decided_by(&self) -> String {
        relay_protocol::domain::decider::dashboard(&self.name)
    }
}

/// The login codes (in memory) and the signed logins (see [`login_keys`]) of one broker.
pub struct WebAuth {
    /// `http://127.0.0.1:PORT`
    origin: String,
    cookie: String,
    /// code -> (who, when it was made)
    codes: Mutex<HashMap<String, (String, Instant)>>,
    keys: Arc<LoginKeys>,
    /// Cancelled (and replaced) by every logout and revoke-all: the live streams of the
    /// dashboard's logins end then; a login still good reconnects (the browser does,
    /// resuming from its last event), an ended one is refused.
    streams: Mutex<CancellationToken>,
}

/// Removes the oldest entry of `map` while it holds `max` or more.
fn make_room<V>(map: &mut HashMap<String, V>, max: usize, made: impl Fn(&V) -> Instant) {
    while map.len() >= max {
        let Some(oldest) = map
            .iter()
            .min_by_key(|(_, v)| made(v))
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        map.remove(&oldest);
    }
}

fn random_id() -> String {
    let bytes: [u8; 32] = rand::random();
    relay_protocol::hex::encode(&bytes)
}

/// A file of the login keys could not be written: the answer says so (the login ended
/// in memory all the same).
fn file_error(doing: &str, e: impl std::fmt::Display) -> HttpError {
    tracing::error!(error = %e, "{doing}");
    HttpError::new(ErrorCode::Internal, format!("{doing}: {e}"))
}

impl WebAuth {
    /// For the broker listening at `origin` (`http://127.0.0.1:PORT`), its logins signed
    /// with the key of `data_dir` (made if missing). Blocking: reads and may write files.
    pub fn open(origin: &str, data_dir: &Path) -> Result<WebAuth, FileError> {
        let port = origin.rsplit(':').next().unwrap_or("0");
        Ok(WebAuth {
            origin: origin.trim_end_matches('/').to_string(),
            cookie: format!("relay_login_{port}"),
            codes: Mutex::new(HashMap::new()),
            keys: Arc::new(LoginKeys::open(data_dir, clock::now_ms())?),
            streams: Mutex::new(CancellationToken::new()),
        })
    }

    /// `http://127.0.0.1:PORT`: the broker's own origin.
    pub(super) fn origin(&self) -> &str {
        &self.origin
    }

    fn codes(&self) -> MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.codes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new one-time code for `name`.
    pub(super) fn issue(&self, name: String) -> String {
        let code = random_id();
        let mut codes = self.codes();
        codes.retain(|_, (_, made)| made.elapsed() < CODE_LIFETIME);
        make_room(&mut codes, MAX_CODES, |(_, made)| *made);
        codes.insert(code.clone(), (name, Instant::now()));
        code
    }

    /// Spends `code`: the new login's cookie value, if the code was good.
    pub(super) fn spend(&self, code: &str) -> Option<String> {
        let (name, made) = self.codes().remove(code)?;
        if made.elapsed() >= CODE_LIFETIME {
            return None;
        }
        Some(self.keys.sign(&self.cookie, &name, clock::now_ms()))
    }

    /// The login the request's cookie names, if any (memory only: no file is read).
    pub fn login(&self, headers: &HeaderMap) -> Option<Login> {
        self.signed(headers).map(|s| Login { name: s.name })
    }

    fn signed(&self, headers: &HeaderMap) -> Option<Signed> {
        let value = self.cookie_value(headers)?;
        self.keys.verify(&self.cookie, value, clock::now_ms())
    }

    /// Ends the cookie's login for good: refused from now on, and its revocation written
    /// (on the blocking pool) so a restart does not bring it back.
    pub(super) async fn end(&self, headers: &HeaderMap) -> Result<(), HttpError> {
        let Some(login) = self.signed(headers) else {
            return Ok(());
        };
        let keys = self.keys.clone();
        let full = !keys.revoke(&login, clock::now_ms());
        self.end_streams();
        if full {
            tracing::warn!(
                "too many dashboard logouts kept; rotating the dashboard key (every login ends)"
            );
        }
        relay_infra::storage::read(move || if full { keys.rotate() } else { keys.save() })
            .await
            .map_err(|e| file_error("cannot keep the logout", e))?
            .map_err(|e| file_error("cannot keep the logout", e))
    }

    /// Ends every login: a new key (written on the blocking pool, then used), and the
    /// login links not yet spent forgotten.
    pub(super) async fn revoke_all(&self) -> Result<(), HttpError> {
        self.codes().clear();
        let keys = self.keys.clone();
        relay_infra::storage::read(move || keys.rotate())
            .await
            .map_err(|e| file_error("cannot rotate the dashboard key", e))?
            .map_err(|e| file_error("cannot rotate the dashboard key", e))?;
        // A link made while the key was being written is forgotten too.
        self.codes().clear();
        self.end_streams();
        Ok(())
    }

    /// `response` (of a dashboard login's request), ending at the next logout or
    /// revoke-all if it is a live stream (SSE).
    pub(super) fn stream_until_logins_end(&self, response: Response) -> Response {
        let streaming = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if !streaming {
            return response;
        }
        let ends = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (parts, body) = response.into_parts();
        let body = futures::StreamExt::take_until(body.into_data_stream(), ends.cancelled_owned());
        Response::from_parts(parts, axum::body::Body::from_stream(body))
    }

    /// Ends every dashboard stream open now (see `streams`).
    fn end_streams(&self) {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        streams.cancel();
        *streams = CancellationToken::new();
    }

    fn cookie_value<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(name, _)| *name == self.cookie)
            .map(|(_, value)| value)
    }

    pub(super) fn set_cookie(&self, value: &str) -> String {
        format!(
            "{}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
            self.cookie,
            LOGIN_LIFETIME.as_secs()
        )
    }

    pub(super) fn clear_cookie(&self) -> String {
        format!(
            "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
            self.cookie
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use axum::http::HeaderValue;

    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(value).unwrap());
        h
    }

    fn web(port: u16) -> (tempfile::TempDir, WebAuth) {
        let dir = tempfile::tempdir().unwrap();
        let web = WebAuth::open(&format!("http://127.0.0.1:{port}"), dir.path()).unwrap();
        (dir, web)
    }

    #[tokio::test]
    async fn a_code_logs_in_once_and_only_its_own_port_cookie_counts() {
        let (dir, web) = web(7777);
        let code = web.issue("alice".into());
        let value = web.spend(&code).unwrap();
        assert_eq!(web.spend(&code), None, "a code works once");
        assert_eq!(web.spend("nope"), None);
        let cookie = web.set_cookie(&value);
        assert!(cookie.starts_with(&format!("relay_login_7777={value};")));
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        let login = web.login(&with_cookie(&format!("x=1; relay_login_7777={value}")));
        assert_eq!(login.unwrap().decided_by(), "alice@dashboard");
        assert_eq!(
            web.login(&with_cookie(&format!("relay_login_8888={value}"))),
            None
        );
        // Another port's broker on the same data dir (its key) does not take it either.
        let other = WebAuth::open("http://127.0.0.1:8888", dir.path()).unwrap();
        assert_eq!(
            other.login(&with_cookie(&format!("relay_login_8888={value}"))),
            None
        );
        assert_eq!(web.login(&with_cookie("relay_login_7777=forged")), None);
        // A restart (the same data dir, the same port) keeps it.
        let again = WebAuth::open("http://127.0.0.1:7777", dir.path()).unwrap();
        let cookie = with_cookie(&format!("relay_login_7777={value}"));
        assert!(again.login(&cookie).is_some());
        assert!(web.end(&cookie).await.is_ok());
        assert_eq!(web.login(&cookie), None);
        let again = WebAuth::open("http://127.0.0.1:7777", dir.path()).unwrap();
        assert_eq!(again.login(&cookie), None, "a logout outlives a restart");
    }

    #[tokio::test]
    async fn revoke_all_ends_every_login_and_unspent_link() {
        let (dir, web) = web(7777);
        let cookies: Vec<HeaderMap> = (0..3)
            .map(|_| {
                let code = web.issue("a".into());
                with_cookie(&format!("relay_login_7777={}", web.spend(&code).unwrap()))
            })
            .collect();
        let unspent = web.issue("a".into());
        assert!(web.revoke_all().await.is_ok());
        for c in &cookies {
            assert_eq!(web.login(c), None);
        }
        assert_eq!(web.spend(&unspent), None, "a link made before is forgotten");
        let fresh = web.spend(&web.issue("a".into())).unwrap();
        let fresh = with_cookie(&format!("relay_login_7777={fresh}"));
        assert!(web.login(&fresh).is_some());
        let again = WebAuth::open("http://127.0.0.1:7777", dir.path()).unwrap();
        assert_eq!(again.login(&cookies[0]), None);
        assert!(again.login(&fresh).is_some());
    }

    /// Every file of `broker/web/` is served (a module left out would fail to load).

    #[test]
    fn codes_are_bounded() {
        let (_dir, web) = web(1);
        let codes: Vec<String> = (0..MAX_CODES + 5).map(|_| web.issue("a".into())).collect();
        assert_eq!(web.codes().len(), MAX_CODES);
        assert_eq!(web.spend(&codes[0]), None, "the oldest code went first");
    }
}
