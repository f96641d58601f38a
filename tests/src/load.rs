//! Load against a real `relay up`: many HTTP clients and NATS invokers at once, agents
//! served by `relay-instant-codex` (a stand-in `codex app-server` that answers at once),
//! and a probe of `GET /v1/status` all along. Used by the load tests and by `relay-load`.
//!
//! Invocations are numbered; clients take the next number until all are sent. A request
//! the broker refused with `overloaded`, or that could not reach it (a broker killed on
//! purpose), is sent again: only the flights whose invocation was acknowledged count, and
//! every one of them must end in a terminal state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use relay_infra::retry::{self, Retryable};
use relay_protocol::api::{ApiInfo, API_FILE};
use relay_protocol::bus::{subjects, CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE};
use serde_json::{json, Value};

use crate::RelayProcess;

/// The stand-in's variable that holds each stream before its first delta until N of its
/// processes have reached it (`DIR:N`; see relay-instant-codex).
pub const STREAM_BARRIER_VAR: &str = "RELAY_INSTANT_CODEX_STREAM_BARRIER";

/// The stand-in harness binary: `RELAY_INSTANT_CODEX_BIN`, else beside the running
/// program (`relay-load`), else beside `relay`.
pub fn instant_codex_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RELAY_INSTANT_CODEX_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(me) = std::env::current_exe() {
        let beside = me.with_file_name("relay-instant-codex");
        if beside.exists() {
            return beside;
        }
    }
    crate::relay_bin().with_file_name("relay-instant-codex")
}

/// Registers `n` agents `load-0`.. served by the instant harness (on `node` if given).
pub fn add_instant_agents(relay: &RelayProcess, n: usize, node: Option<&str>) -> Vec<String> {
    (0..n)
        .map(|i| {
            let name = format!("load-{i}");
            add_instant_agent(relay, &name, node, &[]);
            name
        })
        .collect()
}

/// Registers one agent served by the instant harness (on `node` if given), with `extra`
/// arguments of `relay agent add` (`--env K=V`...).
pub fn add_instant_agent(relay: &RelayProcess, name: &str, node: Option<&str>, extra: &[&str]) {
    let bin = instant_codex_bin().display().to_string();
    let cwd = relay.data_dir.display().to_string();
    let mut args = vec![
        "agent",
        "add",
        name,
        "--harness",
        "codex_app_server",
        "--cwd",
        &cwd,
        "--command",
        &bin,
    ];
    if let Some(node) = node {
        args.extend(["--node", node]);
    }
    args.extend_from_slice(extra);
    relay.cli_ok(&args);
}

/// The task of invocation `i`, sent for the `attempt`th time (from 0). Each attempt has
/// its own text: a request whose answer was lost (a broker killed under it) may still
/// have made a flight, and the harness's log of received tasks then tells that flight's
/// run from the retry's.
pub fn task_text(i: usize, attempt: usize) -> String {
    format!("load task {i} try {attempt}")
}

/// The `(invocation, attempt)` of a [`task_text`] found in `text` (a harness may see the
/// task with more around it).
pub fn task_of(text: &str) -> Option<(usize, usize)> {
    let rest = &text[text.find("load task ")? + "load task ".len()..];
    let mut words = rest.split_whitespace();
    let i = words.next()?.parse().ok()?;
    if words.next()? != "try" {
        return None;
    }
    let attempt = words.next()?.parse().ok()?;
    Some((i, attempt))
}

#[derive(Debug, Clone)]
pub struct Load {
    pub agents: Vec<String>,
    pub http_clients: usize,
    pub nats_clients: usize,
    pub invocations: usize,
    /// `None`: no NATS invokers.
    pub nats_url: Option<String>,
    /// Invocations acknowledged so far (to act at a point of the load).
    pub acked: Arc<AtomicUsize>,
    /// A deadline against a hang (the load fails past it), not a measure.
    pub within: Duration,
}

#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    /// Flights of acknowledged invocations.
    pub flights: Vec<String>,
    /// Requests answered `overloaded` (and sent again).
    pub overloaded: u64,
    /// Requests that could not reach the broker (and were sent again).
    pub unreachable: u64,
    /// Requests refused for another reason (a bug: nothing else should refuse them).
    pub refused: Vec<String>,
    /// From the first request to the last acknowledgement.
    pub submit_time: Duration,
    /// Probes made (`GET /v1/status`, which reads counters, then `GET /v1/agents`, which
    /// reads the store), and the longest answer of each.
    pub status_probes: u64,
    pub status_max: Duration,
    pub read_max: Duration,
    /// Probes that got no answer within [`PROBE_TIMEOUT`] while the broker was up.
    pub status_hangs: u64,
}

/// A status probe that takes longer than this counts as a hang.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one invocation request may take before it is given up (and sent again).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The broker's address and token, refreshed from `api.json`.
#[derive(Clone)]
pub struct Target {
    data_dir: PathBuf,
    api: Arc<RwLock<(String, String)>>,
    /// False while the broker is down on purpose (probes that fail then are expected).
    pub up: Arc<AtomicBool>,
}

impl Target {
    pub fn new(data_dir: &Path) -> anyhow::Result<Target> {
        let t = Target {
            data_dir: data_dir.to_path_buf(),
            api: Arc::new(RwLock::new((String::new(), String::new()))),
            up: Arc::new(AtomicBool::new(true)),
        };
        t.refresh()?;
        Ok(t)
    }

    pub fn refresh(&self) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(self.data_dir.join(API_FILE))
            .with_context(|| format!("reading {}", self.data_dir.join(API_FILE).display()))?;
        let api: ApiInfo = serde_json::from_str(&text)?;
        if let Ok(mut a) = self.api.write() {
            *a = (api.url, api.token);
        }
        Ok(())
    }

    fn get(&self) -> (String, String) {
        self.api.read().map(|a| a.clone()).unwrap_or_default()
    }

    /// The broker's URL and token, as last read.
    pub fn api(&self) -> (String, String) {
        self.get()
    }
}

enum Sent {
    Accepted(String),
    Overloaded,
    Unreachable,
    Refused(String),
}

async fn http_invoke(client: &reqwest::Client, target: &Target, agent: &str, task: &str) -> Sent {
    let (url, token) = target.get();
    let resp = client
        .post(format!("{url}/v1/invocations"))
        .bearer_auth(token)
        .json(&json!({ "target": agent, "task": task, "requester": "load" }))
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(_) => return Sent::Unreachable,
    };
    let status = resp.status().as_u16();
    let body: Value = match resp.json().await {
        Ok(v) => v,
        Err(_) => return Sent::Unreachable,
    };
    match status {
        200 => match body["flight"]["id"].as_str() {
            Some(id) => Sent::Accepted(id.to_string()),
            None => Sent::Refused(format!("no flight id in {body}")),
        },
        429 => Sent::Overloaded,
        // A broker stopping under the request.
        503 => Sent::Unreachable,
        _ => Sent::Refused(format!("HTTP {status}: {body}")),
    }
}

async fn nats_invoke(client: &async_nats::Client, agent: &str, task: &str) -> Sent {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE);
    let request = async_nats::Request::new()
        .payload(
            json!({ "task": task, "requester": "load" })
                .to_string()
                .into(),
        )
        .headers(headers)
        .timeout(Some(REQUEST_TIMEOUT));
    let reply = match client.send_request(subjects::invoke(agent), request).await {
        Ok(r) => r,
        Err(_) => return Sent::Unreachable,
    };
    let body: Value = match serde_json::from_slice(&reply.payload) {
        Ok(v) => v,
        Err(e) => return Sent::Refused(format!("reply is not JSON: {e}")),
    };
    if let Some(id) = body["flight"]["id"].as_str() {
        return Sent::Accepted(id.to_string());
    }
    match body["error"]["code"].as_str() {
        Some("overloaded") => Sent::Overloaded,
        Some("shutting_down") => Sent::Unreachable,
        _ => Sent::Refused(body.to_string()),
    }
}

/// Waits before sending an invocation again that the broker could not take yet.
const SEND_BACKOFF: retry::ExponentialBuilder =
    retry::forever(Duration::from_millis(5), Duration::from_millis(500));

struct Shared {
    next: AtomicUsize,
    flights: Mutex<Vec<String>>,
    refused: Mutex<Vec<String>>,
    overloaded: AtomicU64,
    unreachable: AtomicU64,
}

impl Shared {
    /// Sends invocation after invocation until all are taken; retries what did not land.
    async fn client<F, Fut>(&self, load: &Load, send: F)
    where
        F: Fn(String, String) -> Fut,
        Fut: std::future::Future<Output = Sent>,
    {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= load.invocations {
                return;
            }
            let agent = load.agents[i % load.agents.len()].clone();
            let attempts = AtomicUsize::new(0);
            // Sent again after a wait while the broker says it is busy, or is restarting.
            let attempt = || async {
                let task = task_text(i, attempts.fetch_add(1, Ordering::Relaxed));
                let busy = match send(agent.clone(), task).await {
                    Sent::Overloaded => &self.overloaded,
                    Sent::Unreachable => &self.unreachable,
                    landed => return Ok(landed),
                };
                busy.fetch_add(1, Ordering::Relaxed);
                Err(())
            };
            let landed = attempt.retry(SEND_BACKOFF).await;
            match landed {
                Ok(Sent::Accepted(id)) => {
                    if let Ok(mut f) = self.flights.lock() {
                        f.push(id);
                    }
                    load.acked.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Sent::Refused(why)) => {
                    if let Ok(mut r) = self.refused.lock() {
                        r.push(why);
                    }
                }
                // Tried until it lands.
                _ => {}
            }
        }
    }
}

/// Runs the load to the end (every invocation acknowledged or refused), with a status
/// probe alongside. Does not wait for the flights to end: see [`wait_all_terminal`].
pub async fn run(load: &Load, target: &Target) -> anyhow::Result<LoadReport> {
    let shared = Arc::new(Shared {
        next: AtomicUsize::new(0),
        flights: Mutex::new(Vec::new()),
        refused: Mutex::new(Vec::new()),
        overloaded: AtomicU64::new(0),
        unreachable: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let probe = tokio::spawn(status_probe(target.clone(), stop.clone()));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..load.http_clients {
        let (shared, load, target) = (shared.clone(), load.clone(), target.clone());
        tasks.spawn(async move {
            let client = reqwest::Client::new();
            shared
                .client(&load, |agent, task| {
                    let (client, target) = (client.clone(), target.clone());
                    async move {
                        let sent = http_invoke(&client, &target, &agent, &task).await;
                        if matches!(sent, Sent::Unreachable) {
                            let _ = target.refresh();
                        }
                        sent
                    }
                })
                .await
        });
    }
    if let (Some(url), true) = (&load.nats_url, load.nats_clients > 0) {
        let nats = async_nats::connect(url).await?;
        for _ in 0..load.nats_clients {
            let (shared, load, nats) = (shared.clone(), load.clone(), nats.clone());
            tasks.spawn(async move {
                shared
                    .client(&load, |agent, task| {
                        let nats = nats.clone();
                        async move { nats_invoke(&nats, &agent, &task).await }
                    })
                    .await
            });
        }
    }
    let all_sent = async {
        while let Some(r) = tasks.join_next().await {
            r?;
        }
        anyhow::Ok(())
    };
    if tokio::time::timeout(load.within, all_sent).await.is_err() {
        stop.store(true, Ordering::Relaxed);
        let Probed { probes, hangs, .. } = probe.await?;
        bail!(
            "the load did not finish within {:?}: {} of {} invocations acknowledged, \
             {} overloaded, {} unreachable; /v1/status answered {probes} times and hung {hangs} times",
            load.within,
            load.acked.load(Ordering::Relaxed),
            load.invocations,
            shared.overloaded.load(Ordering::Relaxed),
            shared.unreachable.load(Ordering::Relaxed),
        );
    }
    let submit_time = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let probed = probe.await?;
    let flights = shared.flights.lock().map(|f| f.clone()).unwrap_or_default();
    let refused = shared.refused.lock().map(|r| r.clone()).unwrap_or_default();
    Ok(LoadReport {
        flights,
        overloaded: shared.overloaded.load(Ordering::Relaxed),
        unreachable: shared.unreachable.load(Ordering::Relaxed),
        refused,
        submit_time,
        status_probes: probed.probes,
        status_max: probed.status_max,
        read_max: probed.read_max,
        status_hangs: probed.hangs,
    })
}

/// What the probe saw.
#[derive(Debug, Default, Clone, Copy)]
struct Probed {
    probes: u64,
    status_max: Duration,
    read_max: Duration,
    hangs: u64,
}

/// `GET /v1/status` and `GET /v1/agents` again and again until `stop`.
async fn status_probe(target: Target, stop: Arc<AtomicBool>) -> Probed {
    let client = reqwest::Client::new();
    let mut p = Probed::default();
    while !stop.load(Ordering::Relaxed) {
        let (url, token) = target.get();
        let was_up = target.up.load(Ordering::Relaxed);
        let mut answered = true;
        for (path, max) in [
            ("/v1/status", &mut p.status_max),
            ("/v1/agents", &mut p.read_max),
        ] {
            let t = Instant::now();
            let r = client
                .get(format!("{url}{path}"))
                .bearer_auth(&token)
                .timeout(PROBE_TIMEOUT)
                .send()
                .await;
            let took = t.elapsed();
            match r {
                Ok(resp) if resp.status().is_success() => *max = (*max).max(took),
                Err(e) if e.is_timeout() && was_up && target.up.load(Ordering::Relaxed) => {
                    p.hangs += 1;
                    answered = false;
                }
                _ => {
                    // The broker is down on purpose, or restarting: look for it again.
                    let _ = target.refresh();
                    answered = false;
                }
            }
        }
        if answered {
            p.probes += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p
}

/// How a flight stands: its state, its output and, if it failed, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightEnd {
    pub state: String,
    pub output: Option<String>,
    pub error: Option<String>,
}

/// Every flight's state, by id (one listing).
pub async fn flight_states(target: &Target) -> anyhow::Result<BTreeMap<String, FlightEnd>> {
    let (url, token) = target.get();
    let list: Value = reqwest::Client::new()
        .get(format!("{url}/v1/flights?limit=100000000"))
        .bearer_auth(token)
        .timeout(PROBE_TIMEOUT)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let Some(list) = list.as_array() else {
        bail!("/v1/flights is not a list: {list}")
    };
    Ok(list
        .iter()
        .filter_map(|f| {
            let end = FlightEnd {
                state: f["state"].as_str()?.to_string(),
                output: f["output"].as_str().map(str::to_string),
                error: f["error"].as_str().map(str::to_string),
            };
            Some((f["id"].as_str()?.to_string(), end))
        })
        .collect())
}

pub fn is_terminal(state: &str) -> bool {
    matches!(state, "completed" | "failed" | "cancelled")
}

/// Waits until no flight of the broker is live (checked again and again; `within` is a
/// deadline against a hang, not a measure), then returns every flight's state.
pub async fn wait_all_terminal(
    target: &Target,
    within: Duration,
) -> anyhow::Result<BTreeMap<String, FlightEnd>> {
    let waited = crate::try_wait_until("every flight to end", within, || async {
        let states = match flight_states(target).await {
            Ok(states) => states,
            Err(e) => return Ok(Err(e)),
        };
        let live: Vec<_> = states
            .iter()
            .filter(|(_, s)| !is_terminal(&s.state))
            .collect();
        if live.is_empty() {
            return Ok(Ok(states));
        }
        Err(format!(
            "{} flights still live, e.g. {:?}",
            live.len(),
            live.iter().take(5).collect::<Vec<_>>()
        ))
    })
    .await;
    waited?
}
