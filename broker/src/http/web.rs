//! The dashboard: its page, embedded in the binary, and how a browser logs in to it.
//!
//! The page (`broker/web/`: HTML, the entry module `app.js` and the modules it imports
//! from `lib/` and `views/`, the generated `api.gen.js`, one style sheet) is compiled in
//! with `include_str!`: `relay up` serves it from its loopback
//! address, with no web server or CDN beside it, offline. It is plain JavaScript over
//! the API: the fleet watch, a flight's watch, the approvals, the replays, by the routes of `api.gen.js`
//! (generated from the method table, `relay_protocol::methods`).
//!
//! ## Logging in
//!
//! A browser never sees the API token. `relay open` (the operator's token) asks
//! `POST /v1/login` for a one-time code, valid for [`CODE_LIFETIME`], and opens
//! `/login?code=CODE`. That route spends the code and answers `303 /` with a login
//! cookie: signed (below), `HttpOnly` (no script reads it), `SameSite=Strict` (no other
//! site's page sends it), named after the port (`relay_login_7777`: cookies are per
//! host, not per port, and two brokers on one host must not log each other out), kept
//! by the browser for the login's lifetime. The URL the page keeps is `/`: no token or
//! code in its history, and a code read from a shell's history is spent.
//!
//! ## What is stored where, and what ends a login
//!
//! The one-time codes live in memory (a restart forgets the unused ones: they last two
//! minutes anyway). A login is not stored at all: its cookie carries its id, name and
//! issue time, signed with HMAC-SHA256 under a key kept in `<data dir>/dashboard.key`
//! (mode 0600; see [`super::login_keys`] for the format and what a wider mode does).
//! So:
//! - a restart (even `kill -9`) ends no login: the page reconnects and stays logged in;
//! - a login expires 30 days after its link was spent (`LOGIN_LIFETIME`);
//! - `POST /v1/logout` ends the cookie's login for good: its id is revoked in memory at
//!   once and written to `<data dir>/dashboard.revoked` (on the blocking pool), read
//!   back at start; entries are dropped once their login would have expired;
//! - `POST /v1/login/revoke` (`relay open --revoke-all`, the operator's token only)
//!   writes a new key and uses it: every login and every unused link ends.
//!
//! Checking a cookie reads only memory: the key and the revocations are loaded at start.
//!
//! The cookie stands for the operator on every `/v1` route, with two limits: a request
//! that is not a `GET` must carry `X-Relay-Dashboard: 1`, a header no cross-site form
//! or simple request can set (a second guard against request forgery after
//! `SameSite`), and an approval it decides is recorded as decided by the login's
//! name (`alice@dashboard`), whatever the body says.
//!
//! Every answer of the page carries a Content-Security-Policy that allows only the
//! page's own script and style: text an agent wrote can never run as script, even if
//! some view put it in as HTML by mistake (none does: the page uses `textContent`).

use relay_protocol::clock;
use relay_protocol::methods::call as m;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use relay_protocol::api::{Empty, ErrorCode, LoginInfo, LoginLink};
use relay_protocol::domain::decider;
use serde::Deserialize;

use super::login_keys::{LoginKeys, Signed, LOGIN_LIFETIME};
use super::{ApiJson, ApiResult, ApiState, HttpError, Principal, Req};
use crate::files::FileError;

/// How long a login link works.
pub const CODE_LIFETIME: Duration = Duration::from_secs(120);
/// Login links not yet used, at most (the oldest goes first).
const MAX_CODES: usize = 64;
/// The header a dashboard login's writes carry.
pub const DASHBOARD_HEADER: &str = "x-relay-dashboard";

/// The page's files: path, content type, text.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../../web/index.html"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/app.js"),
    ),
    (
        "/lib/dom.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/lib/dom.js"),
    ),
    (
        "/lib/api.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/lib/api.js"),
    ),
    (
        "/lib/fleet.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/lib/fleet.js"),
    ),
    (
        "/lib/table.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/lib/table.js"),
    ),
    (
        "/lib/labels.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/lib/labels.js"),
    ),
    (
        "/views/agents.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/views/agents.js"),
    ),
    (
        "/views/flights.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/views/flights.js"),
    ),
    (
        "/views/flight.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/views/flight.js"),
    ),
    (
        "/views/approvals.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/views/approvals.js"),
    ),
    (
        "/views/rules.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/views/rules.js"),
    ),
    (
        "/views/usage.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/views/usage.js"),
    ),
    (
        "/views/conversations.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/views/conversations.js"),
    ),
    (
        "/views/replay.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/views/replay.js"),
    ),
    (
        // The method table's routes and enum names, generated (relay_protocol::methods::js).
        "/api.gen.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/api.gen.js"),
    ),
    (
        "/app.css",
        "text/css; charset=utf-8",
        include_str!("../../web/app.css"),
    ),
    (
        "/favicon.svg",
        "image/svg+xml",
        include_str!("../../web/favicon.svg"),
    ),
];

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; manifest-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

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
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
    fn issue(&self, name: String) -> String {
        let code = random_id();
        let mut codes = self.codes();
        codes.retain(|_, (_, made)| made.elapsed() < CODE_LIFETIME);
        make_room(&mut codes, MAX_CODES, |(_, made)| *made);
        codes.insert(code.clone(), (name, Instant::now()));
        code
    }

    /// Spends `code`: the new login's cookie value, if the code was good.
    fn spend(&self, code: &str) -> Option<String> {
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
    async fn end(&self, headers: &HeaderMap) -> Result<(), HttpError> {
        let Some(login) = self.signed(headers) else {
            return Ok(());
        };
        let keys = self.keys.clone();
        let full = !keys.revoke(&login, clock::now_ms());
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
    async fn revoke_all(&self) -> Result<(), HttpError> {
        self.codes().clear();
        let keys = self.keys.clone();
        relay_infra::storage::read(move || keys.rotate())
            .await
            .map_err(|e| file_error("cannot rotate the dashboard key", e))?
            .map_err(|e| file_error("cannot rotate the dashboard key", e))?;
        // A link made while the key was being written is forgotten too.
        self.codes().clear();
        Ok(())
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

    fn set_cookie(&self, value: &str) -> String {
        format!(
            "{}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
            self.cookie,
            LOGIN_LIFETIME.as_secs()
        )
    }

    fn clear_cookie(&self) -> String {
        format!(
            "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
            self.cookie
        )
    }
}

/// The page's routes (no bearer token: they take the login cookie, or a login code).
pub(super) fn routes() -> Router<ApiState> {
    let mut router = Router::new().route("/login", get(login));
    for (path, _, _) in ASSETS {
        router = router.route(path, get(asset));
    }
    router
}

/// Headers every answer of the page carries.
fn page_headers(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

/// A small page of its own (not logged in, a spent link).
fn notice(status: StatusCode, title: &str, text: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
<link rel=\"stylesheet\" href=\"/app.css\"></head><body class=\"notice\"><main><h1>{title}</h1>\
<p>{text}</p><p>Run <code>relay open</code> for a new login link.</p></main></body></html>"
    );
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response();
    page_headers(&mut response);
    response
}

async fn asset(State(s): State<ApiState>, uri: axum::http::Uri, headers: HeaderMap) -> Response {
    let Some((_, kind, body)) = ASSETS.iter().find(|(path, _, _)| *path == uri.path()) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    // The style sheet is public: the notice pages use it.
    if uri.path() != "/app.css" && s.web.login(&headers).is_none() {
        return notice(
            StatusCode::UNAUTHORIZED,
            "Relay: not logged in",
            "This page shows your agents only to a browser logged in with a login link.",
        );
    }
    let mut response = ([(header::CONTENT_TYPE, *kind)], *body).into_response();
    page_headers(&mut response);
    response
}

#[derive(Deserialize)]
pub(super) struct LoginQuery {
    code: Option<String>,
}

async fn login(State(s): State<ApiState>, Query(q): Query<LoginQuery>) -> Response {
    let Some(id) = q.code.as_deref().and_then(|code| s.web.spend(code)) else {
        return notice(
            StatusCode::UNAUTHORIZED,
            "Relay: this login link does not work",
            "A login link works once, for two minutes; this one was used already, has expired, or is wrong.",
        );
    };
    let mut response = (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/".to_string()),
            (header::SET_COOKIE, s.web.set_cookie(&id)),
        ],
    )
        .into_response();
    page_headers(&mut response);
    response
}

/// `POST /v1/login`: a one-time login link (the operator's token only: a dashboard
/// login or an agent cannot make one).
pub(super) async fn new_login(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    ApiJson(req): ApiJson<Req<m::LoginCreate>>,
) -> ApiResult<LoginLink> {
    if principal != Principal::Operator || login.is_some() {
        return Err(HttpError::new(
            ErrorCode::Unauthorized,
            "a login link takes the operator's token (api.json), not a dashboard login's or an agent's",
        ));
    }
    let name = req.name.unwrap_or_else(|| decider::OPERATOR.into());
    let login = Login { name };
    crate::ops::check_client_decider(&login.decided_by(), crate::ops::Via::Dashboard)?;
    let code = s.web.issue(login.name);
    Ok(Json(LoginLink {
        url: format!("{}/login?code={code}", s.web.origin),
        dashboard: format!("{}/", s.web.origin),
        expires_in_secs: CODE_LIFETIME.as_secs(),
    }))
}

/// `GET /v1/login`: who is calling.
pub(super) async fn whoami(
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
) -> ApiResult<LoginInfo> {
    Ok(Json(match (login, principal) {
        (Some(Extension(web)), _) => LoginInfo {
            decided_by: web.decided_by(),
            name: web.name,
            via: "dashboard".into(),
        },
        (None, Principal::Operator) => LoginInfo {
            name: decider::OPERATOR.into(),
            decided_by: decider::OPERATOR.into(),
            via: decider::OPERATOR.into(),
        },
        (None, Principal::Agent(name)) => LoginInfo {
            decided_by: name.clone(),
            name,
            via: "agent".into(),
        },
    }))
}

/// `POST /v1/logout`: ends the cookie's login, for good (a restart does not bring it
/// back). The cookie is cleared even if its revocation could not be written.
pub(super) async fn logout(State(s): State<ApiState>, headers: HeaderMap) -> Response {
    let ended = s.web.end(&headers).await;
    let mut response = match ended {
        Ok(()) => Json(serde_json::json!({})).into_response(),
        Err(e) => e.into_response(),
    };
    if let Ok(clear) = HeaderValue::from_str(&s.web.clear_cookie()) {
        response.headers_mut().insert(header::SET_COOKIE, clear);
    }
    response
}

/// `POST /v1/login/revoke`: rotates the login key, ending every dashboard login and
/// forgetting the links not yet used (the operator's token only, like a new link).
pub(super) async fn revoke_all(
    State(s): State<ApiState>,
    Extension(principal): Extension<Principal>,
    login: Option<Extension<Login>>,
    ApiJson(_): ApiJson<Req<m::LoginRevokeAll>>,
) -> ApiResult<Empty> {
    if principal != Principal::Operator || login.is_some() {
        return Err(HttpError::new(
            ErrorCode::Unauthorized,
            "ending every login takes the operator's token (api.json), not a dashboard login's or an agent's",
        ));
    }
    s.web.revoke_all().await?;
    tracing::info!("dashboard key rotated: every dashboard login ended");
    Ok(Json(Empty {}))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

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
    fn every_file_of_the_page_is_served() {
        let web = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
        let mut files = Vec::new();
        let mut dirs = vec![web.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        for file in files {
            let rel = file
                .strip_prefix(&web)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let route = if rel == "index.html" {
                "/".to_string()
            } else {
                format!("/{rel}")
            };
            let (_, _, body) = ASSETS
                .iter()
                .find(|(path, _, _)| *path == route)
                .unwrap_or_else(|| panic!("{rel} is not served: add it to ASSETS"));
            assert_eq!(*body, std::fs::read_to_string(&file).unwrap(), "{rel}");
        }
    }

    #[test]
    fn codes_are_bounded() {
        let (_dir, web) = web(1);
        let codes: Vec<String> = (0..MAX_CODES + 5).map(|_| web.issue("a".into())).collect();
        assert_eq!(web.codes().len(), MAX_CODES);
        assert_eq!(web.spend(&codes[0]), None, "the oldest code went first");
    }
}
