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
//! (mode 0600; see [`super::login_keys`] for the format and what a wider mode does;
//! [`super::login`] holds the codes and ends logins). So:
//! - a restart (even `kill -9`) ends no login: the page reconnects and stays logged in;
//! - a login expires 30 days after its link was spent (`LOGIN_LIFETIME`);
//! - `POST /v1/logout` ends the cookie's login for good: its id is revoked in memory at
//!   once and written to `<data dir>/dashboard.revoked` (on the blocking pool), read
//!   back at start; entries are dropped once their login would have expired;
//! - `POST /v1/login/revoke` (`relay open --revoke-all`, the operator's token only)
//!   writes a new key and uses it: every login and every unused link ends.
//!
//! Checking a cookie reads only memory: the key and the revocations are loaded at start.
//! A logout or revoke-all also ends every live stream (SSE) a dashboard login has open:
//! the browser reconnects each, resuming from its last event, and a login that ended
//! is then refused (the page says so) instead of watching on.
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

use relay_protocol::methods::call as m;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use relay_protocol::api::{Empty, ErrorCode, LoginInfo, LoginLink};
use relay_protocol::domain::decider;
use serde::Deserialize;

use super::login::{Login, CODE_LIFETIME};
use super::{ApiJson, ApiResult, ApiState, HttpError, Principal, Req};

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
        url: format!("{}/login?code={code}", s.web.origin()),
        dashboard: format!("{}/", s.web.origin()),
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
}
