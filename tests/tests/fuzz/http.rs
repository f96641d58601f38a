//! HTTP requests to a real broker (`relay up`): any route of the method table (its
//! parameters and query random), any method, and headers as a stranger, an agent, a
//! dashboard page or the operator would send them (bearer tokens, login cookies,
//! `Last-Event-ID`, `X-Relay-Dashboard`, content types), with bodies made from the
//! requests' seeds. Every request gets an HTTP answer that is not an internal error, and
//! the broker stays up and panics nowhere.
//!
//! The operator's `agent.add` and `agent.wake` are left out: an agent registered by a
//! random body would start a random program. Their bodies are decoded in-process
//! (`agent_spec_bodies`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;
use relay_protocol::domain::{AgentSpec, ConversationSpec};
use relay_protocol::methods::{MethodId, Verb, METHODS};
use relay_tests::fuzz::{fuzz, json_input, Seen};
use relay_tests::RelayProcess;

use crate::seeds_of;

#[derive(Debug, Clone)]
struct Request {
    route: Index,
    method: Index,
    params: Vec<String>,
    query: Option<String>,
    auth: Auth,
    last_event_id: Option<String>,
    dashboard: bool,
    content_type: Index,
    body: Vec<u8>,
}

#[derive(Debug, Clone)]
enum Auth {
    None,
    Operator,
    Bearer(String),
    AgentShaped(String, String),
    Cookie(String),
    Raw(Vec<u8>),
}

const METHOD_NAMES: [&str; 7] = [
    "GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "G\u{0}T",
];
const CONTENT_TYPES: [&str; 5] = [
    "application/json",
    "",
    "text/plain",
    "application/json; charset=utf-8",
    "multipart/form-data; boundary=x",
];

fn header_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,40}",
        "[0-9]{1,25}",
        "-[0-9]{1,5}",
        Just("18446744073709551616".to_string()),
        ".{0,20}"
    ]
}

fn request(bodies: BoxedStrategy<Vec<u8>>) -> impl Strategy<Value = Request> {
    let auth = prop_oneof![
        1 => Just(Auth::None),
        4 => Just(Auth::Operator),
        1 => header_text().prop_map(Auth::Bearer),
        1 => ("[a-z0-9-]{0,12}", "[ -~]{0,70}").prop_map(|(a, m)| Auth::AgentShaped(a, m)),
        1 => header_text().prop_map(Auth::Cookie),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Auth::Raw),
    ];
    (
        (
            any::<Index>(),
            any::<Index>(),
            prop::collection::vec(
                prop_oneof!["[a-zA-Z0-9_.-]{0,12}", "(%[0-9a-fA-F]{2}|[a-z/.]){0,12}"],
                3,
            ),
        ),
        prop::option::of(prop_oneof![
            "[a-z_]{1,10}=[ -~]{0,12}",
            "after=[0-9]{1,22}",
            "limit=-?[0-9]{1,22}&agent=[a-z]{0,5}",
            "(%[0-9a-fA-F]{2}|[&=a-z]){0,20}"
        ]),
        auth,
        prop::option::of(header_text()),
        any::<bool>(),
        any::<Index>(),
        bodies,
    )
        .prop_map(
            |(
                (route, method, params),
                query,
                auth,
                last_event_id,
                dashboard,
                content_type,
                body,
            )| Request {
                route,
                method,
                params,
                query,
                auth,
                last_event_id,
                dashboard,
                content_type,
                body,
            },
        )
}

/// The route's path, its `{param}`s filled in with the request's.
fn path(route: &str, params: &[String]) -> String {
    let mut out = String::new();
    let mut n = 0;
    for part in route.split('/') {
        if part.is_empty() {
            continue;
        }
        out.push('/');
        if part.starts_with('{') {
            out.push_str(params.get(n).map(String::as_str).unwrap_or("x"));
            n += 1;
        } else {
            out.push_str(part);
        }
    }
    out
}

/// The bytes of `r` to the broker at `addr`, the operator's token being `token`.
fn wire(r: &Request, addr: &str, token: &str) -> Option<Vec<u8>> {
    let method = METHODS[r.route.index(METHODS.len())];
    // Picked from the table's own verb mostly, else any other.
    let verb = match r.method.index(4) {
        0 => *r.method.get(&METHOD_NAMES),
        _ => method.verb.as_str(),
    };
    if matches!(r.auth, Auth::Operator)
        && matches!(method.id, MethodId::AgentAdd | MethodId::AgentWake)
        && verb == Verb::Post.as_str()
    {
        return None;
    }
    let mut target = path(method.route, &r.params);
    if let Some(q) = &r.query {
        target.push('?');
        target.push_str(q);
    }
    let mut head =
        format!("{verb} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n").into_bytes();
    match &r.auth {
        Auth::None => {}
        Auth::Operator => {
            head.extend_from_slice(format!("Authorization: Bearer {token}\r\n").as_bytes())
        }
        Auth::Bearer(t) => {
            head.extend_from_slice(format!("Authorization: Bearer {t}\r\n").as_bytes())
        }
        Auth::AgentShaped(a, m) => head
            .extend_from_slice(format!("Authorization: Bearer relay-agent.{a}.{m}\r\n").as_bytes()),
        Auth::Cookie(c) => {
            let port = addr.rsplit(':').next().unwrap_or("0");
            head.extend_from_slice(format!("Cookie: a=b; relay_login_{port}={c}\r\n").as_bytes());
        }
        Auth::Raw(b) => {
            head.extend_from_slice(b"Authorization: ");
            head.extend(b.iter().filter(|&&c| c != b'\r' && c != b'\n'));
            head.extend_from_slice(b"\r\n");
        }
    }
    if let Some(id) = &r.last_event_id {
        head.extend_from_slice(format!("Last-Event-ID: {id}\r\n").as_bytes());
    }
    if r.dashboard {
        head.extend_from_slice(b"X-Relay-Dashboard: 1\r\n");
    }
    let ct = r.content_type.get(&CONTENT_TYPES);
    if !ct.is_empty() {
        head.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
    }
    head.extend_from_slice(format!("Content-Length: {}\r\n\r\n", r.body.len()).as_bytes());
    head.extend_from_slice(&r.body);
    Some(head)
}

/// The status of the answer to `request` (its head only: a stream's body never ends).
fn send(addr: &str, request: &[u8]) -> Result<u16, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    s.write_all(request).map_err(|e| format!("write: {e}"))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) => {
                return Err(format!(
                    "read: {e} after {:?}",
                    String::from_utf8_lossy(&head)
                ))
            }
        }
    }
    let text = String::from_utf8_lossy(&head);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP status line: {text:?}"))
}

#[test]
fn http_requests_to_a_real_broker() {
    let dir = tempfile::tempdir().expect("a temporary dir");
    let relay = RelayProcess::start(&dir.path().join("data")).expect("relay up");
    let addr = relay
        .api
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let token = relay.api.token.clone();
    let mut seeds = vec![
        r#"{"conversation":"direct.operator.a","author":"operator","body":"hi @a","class":"agent"}"#
            .to_string(),
        r#"{"target":"a","task":"do it","requester":"operator","action":"consult"}"#.to_string(),
        r#"{"decision":"accept","decided_by":"operator"}"#.to_string(),
        r#"{"text":"also"}"#.to_string(),
        r#"{"id":"c1","kind":"group","participants":["operator","a"]}"#.to_string(),
        r#"{"change":{"type":"delta","text":"x"}}"#.to_string(),
        "{}".to_string(),
    ];
    seeds.extend(seeds_of::<relay_protocol::domain::PostMessage>());
    seeds.extend(seeds_of::<relay_protocol::domain::InvokeRequest>());
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let statuses = std::sync::Mutex::new(std::collections::BTreeMap::<u16, u64>::new());
    fuzz("http_requests", 1500, request(json_input(&seeds)), |r| {
        let Some(bytes) = wire(&r, &addr, &token) else {
            return Ok(());
        };
        let status = send(&addr, &bytes).map_err(TestCaseError::fail)?;
        prop_assert!((200..600).contains(&status), "status {status}");
        prop_assert_ne!(status, 500, "an internal error");
        *statuses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status)
            .or_default() += 1;
        Ok(())
    });
    // The requests reached the routes: some answered, some refused by the token guard,
    // some by the body's or the parameters' checks (not all stopped at one door).
    let statuses = statuses.into_inner().unwrap_or_default();
    eprintln!("http_requests: answers by status {statuses:?}");
    for code in [200, 400, 401, 404] {
        assert!(statuses.contains_key(&code), "no {code} among {statuses:?}");
    }
    let (status, _) = tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(relay.http().get("/v1/status"));
    assert_eq!(status, 200, "the broker still answers");
    let log = relay.log_text();
    assert!(!log.contains("panicked"), "the broker panicked:\n{log}");
}

#[test]
fn agent_spec_bodies() {
    let mut seeds = seeds_of::<AgentSpec>();
    seeds.extend(seeds_of::<ConversationSpec>());
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let (agents, conversations) = (Seen::default(), Seen::default());
    fuzz("agent_spec_bodies", 2000, json_input(&seeds), |b| {
        if let Ok(spec) = serde_json::from_slice::<AgentSpec>(&b) {
            agents.hit();
            let again =
                serde_json::to_vec(&spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                serde_json::from_slice::<AgentSpec>(&again).ok(),
                Some(spec.clone())
            );
        }
        if serde_json::from_slice::<ConversationSpec>(&b).is_ok() {
            conversations.hit();
        }
        Ok(())
    });
    // Each decoder got inputs it took, not only ones it refused.
    agents.assert_some("agent_spec_bodies", "decoded as an agent spec");
    conversations.assert_some("agent_spec_bodies", "decoded as a conversation spec");
}
