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
//! cookie: random, `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's
//! page sends it), named after the port (`relay_login_7777`: cookies are per host,
//! not per port, and two brokers on one host must not log each other out). The URL the
//! page keeps is `/`: no token or code in its history, and a code read from a shell's
//! history is spent. Logins live in memory: they end with the process (the page then
//! says to run `relay open` again) or with `POST /v1/logout`.
//!
//! The cookie stands for the operator on every `/v1` route, with two limits: a request
//! that is not a `GET` must carry `X-Relay-Dashboard: 1`, a header no cross-site form
//! or simple request can set (a second guard against request forgery after
//! `SameSite`), and an approval it decides is recorded as decided by the login's
//! name (`alice@dashboard`), whatever the body says.
//!
//! Every answer of the page carries a Content-Security-Policy that allows only the
//! page's own script and style: text an agent wrote can never run as script, even if
//! some view put it in as HTML by mistake (none does: the page uses `textContent`; its
//! one rich path, `lib/markdown.js`, makes elements itself and gives an `href` only to
//! http(s) URLs).

use relay_protocol::methods::call as m;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use relay_protocol::api::{ErrorCode, LoginInfo, LoginLink};
use relay_protocol::domain::decider;
use serde::Deserialize;

use super::{ApiJson, ApiResult, ApiState, HttpError, Principal, Req};

/// How long a login link works.
pub const CODE_LIFETIME: Duration = Duration::from_secs(120);
/// Login links not yet used, at most (the oldest goes first).
const MAX_CODES: usize = 64;
/// Logins at most (the oldest goes first).
const MAX_LOGINS: usize = 256;
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
        // The safe Markdown renderer (the page's one rich text path).
        "/lib/markdown.js",
        "text/javascript; charset=utf-8",
        include_str!("../../web/lib/markdown.js"),
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

/// The login codes and logins of one broker (in memory).
pub struct WebAuth {
    /// `http://127.0.0.1:PORT`
    origin: String,
    cookie: String,
    state: Mutex<LoginTable>,
}

#[derive(Default)]
struct LoginTable {
    /// code -> (who, when it was made)
    codes: HashMap<String, (String, Instant)>,
    /// login id -> (login, when it was made)
    logins: HashMap<String, (Login, Instant)>,
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

impl WebAuth {
    /// For the broker listening at `origin` (`http://127.0.0.1:PORT`).
    pub fn new(origin: &str) -> WebAuth {
        let port = origin.rsplit(':').next().unwrap_or("0");
        WebAuth {
            origin: origin.trim_end_matches('/').to_string(),
            cookie: format!("relay_login_{port}"),
            state: Mutex::new(LoginTable::default()),
        }
    }

    /// `http://127.0.0.1:PORT`: the broker's own origin.
    pub(super) fn origin(&self) -> &str {
        &self.origin
    }

    fn logins(&self) -> MutexGuard<'_, LoginTable> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new one-time code for `name`.
    fn issue(&self, name: String) -> String {
        let code = random_id();
        let mut logins = self.logins();
        logins
            .codes
            .retain(|_, (_, made)| made.elapsed() < CODE_LIFETIME);
        make_room(&mut logins.codes, MAX_CODES, |(_, made)| *made);
        logins.codes.insert(code.clone(), (name, Instant::now()));
        code
    }

    /// Spends `code`: the new login's id, if the code was good.
    fn spend(&self, code: &str) -> Option<String> {
        let mut logins = self.logins();
        let (name, made) = logins.codes.remove(code)?;
        if made.elapsed() >= CODE_LIFETIME {
            return None;
        }
        let id = random_id();
        make_room(&mut logins.logins, MAX_LOGINS, |(_, made)| *made);
        logins
            .logins
            .insert(id.clone(), (Login { name }, Instant::now()));
        Some(id)
    }

    /// The login the request's cookie names, if any.
    pub fn login(&self, headers: &HeaderMap) -> Option<Login> {
        let id = self.cookie_value(headers)?;
        self.logins().logins.get(id).map(|(s, _)| s.clone())
    }

    fn end(&self, headers: &HeaderMap) {
        if let Some(id) = self.cookie_value(headers) {
            self.logins().logins.remove(id);
        }
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

    fn set_cookie(&self, id: &str) -> String {
        format!("{}={id}; HttpOnly; SameSite=Strict; Path=/", self.cookie)
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

/// `POST /v1/logout`: ends the cookie's login.
pub(super) async fn logout(State(s): State<ApiState>, headers: HeaderMap) -> Response {
    s.web.end(&headers);
    (
        [(header::SET_COOKIE, s.web.clear_cookie())],
        Json(serde_json::json!({})),
    )
        .into_response()
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

    #[test]
    fn a_code_logs_in_once_and_only_its_own_port_cookie_counts() {
        let web = WebAuth::new("http://127.0.0.1:7777");
        let code = web.issue("alice".into());
        let id = web.spend(&code).unwrap();
        assert_eq!(web.spend(&code), None, "a code works once");
        assert_eq!(web.spend("nope"), None);
        let cookie = web.set_cookie(&id);
        assert!(cookie.starts_with(&format!("relay_login_7777={id};")));
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        let login = web.login(&with_cookie(&format!("x=1; relay_login_7777={id}")));
        assert_eq!(login.unwrap().decided_by(), "alice@dashboard");
        assert_eq!(
            web.login(&with_cookie(&format!("relay_login_8888={id}"))),
            None
        );
        assert_eq!(web.login(&with_cookie("relay_login_7777=forged")), None);
        web.end(&with_cookie(&format!("relay_login_7777={id}")));
        assert_eq!(
            web.login(&with_cookie(&format!("relay_login_7777={id}"))),
            None
        );
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
    fn codes_and_logins_are_bounded() {
        let web = WebAuth::new("http://127.0.0.1:1");
        let codes: Vec<String> = (0..MAX_CODES + 5).map(|_| web.issue("a".into())).collect();
        assert_eq!(web.logins().codes.len(), MAX_CODES);
        assert_eq!(web.spend(&codes[0]), None, "the oldest code went first");
        for _ in 0..MAX_LOGINS + 3 {
            let code = web.issue("a".into());
            web.spend(&code).unwrap();
        }
        assert_eq!(web.logins().logins.len(), MAX_LOGINS);
    }
}
