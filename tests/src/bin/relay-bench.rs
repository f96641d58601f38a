//! `relay-bench`: Relay's benchmarks (issue 9), each figure next to a baseline measured in
//! the same run, on the same machine. Run it with `ops/bench` (a release build; it writes
//! the table to `ops/BENCHMARKS.md`); `--quick` runs small sizes in well under a minute
//! (the test suite runs it so the bench cannot rot, without asserting any time).
//!
//! Real components only: the `relay` binary beside this one (or `--relay`), a real
//! nats-server per part ([`NatsServer`]), real sled files, and agents served by
//! `relay-instant-codex`, a stand-in `codex app-server` that answers at once and streams
//! on demand (`stream:N:SIZE[:RATE]`). Every process is killed when its handle drops,
//! also when the run is interrupted (SIGINT, SIGTERM).
//!
//! The scenarios run in four parts, each with its own broker and nats-server:
//! - A: 1 delta throughput (runtime -> broker -> NATS subscriber vs raw NATS), 4 bytes on
//!   disk per delta after it, 7 the broker's RSS after it (vs the same broker idle).
//! - B: 2 delta latency at a fixed rate (vs a raw NATS hop at the same rate), 6 replay of
//!   one flight's updates over HTTP (vs reading them raw from sled).
//! - C: 3 invocation throughput at several numbers in flight (vs a raw NATS responder),
//!   then 5 restart on the data dir grown to many flights (vs opening sled alone), with
//!   the listings' times.
//! - D: 7 the broker's RSS with many agents whose sessions are live (vs idle).
//!
//! One file past 600 lines, on purpose: it reads top to bottom as the table it writes
//! (set-up, then the parts in order, each beside its baseline), and the parts share the
//! run's set-up and followers below; what other tools could reuse (quantiles, process
//! sizes, the table) is in `relay_tests::bench`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use prost::Message as _;
use relay_broker::store::{child_key, Store, T};
use relay_protocol::bus::{subjects, CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE};
use relay_protocol::pb;
use relay_runtime::retry::{self, Retryable};
use relay_tests::bench::{self, Goal, Row};
use relay_tests::nats::NatsServer;
use relay_tests::RelayProcess;
use serde_json::{json, Value};
use tokio::sync::oneshot;

#[derive(Parser, Debug)]
#[command(about = "Relay's benchmarks: each figure with a baseline measured in the same run")]
struct Args {
    /// Small sizes (well under a minute): proves every scenario runs, measures little.
    #[arg(long)]
    quick: bool,
    /// The `relay` binary. Default: beside this program.
    #[arg(long)]
    relay: Option<PathBuf>,
    /// Only these scenarios (1-7); the part that measures each runs whole.
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<u8>,
    /// Write the table and the machine's description into this file's "latest run"
    /// section (created if missing; the rest of the file is kept).
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Write the rows as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// 1: deltas in the streamed flight.
    #[arg(long)]
    deltas: Option<u64>,
    /// 1, 2, 6: bytes per delta.
    #[arg(long)]
    delta_size: Option<usize>,
    /// 2: deltas timed (at --latency-rate per second).
    #[arg(long)]
    latency_deltas: Option<u64>,
    /// 2: deltas per second.
    #[arg(long)]
    latency_rate: Option<f64>,
    /// 3: agents the invocations go to.
    #[arg(long)]
    agents: Option<usize>,
    /// 3: invocations per number in flight (fewer if --level-seconds passes first).
    #[arg(long)]
    invocations: Option<usize>,
    /// 3: numbers of invocations in flight.
    #[arg(long, value_delimiter = ',')]
    in_flight: Option<Vec<usize>>,
    /// 3: longest a level may take; a level still running then stops sending.
    #[arg(long)]
    level_seconds: Option<u64>,
    /// 5: flights in the data dir that restarts.
    #[arg(long)]
    restart_flights: Option<usize>,
    /// 5: longest the data dir's generation may take (it stops smaller then, and says so).
    #[arg(long)]
    generate_seconds: Option<u64>,
    /// 6: deltas of the flight read back.
    #[arg(long)]
    replay_deltas: Option<u64>,
    /// 7: agents with live sessions.
    #[arg(long)]
    memory_agents: Option<usize>,
}

/// The sizes of one run.
#[derive(Debug, Clone)]
struct Sizes {
    deltas: u64,
    delta_size: usize,
    latency_deltas: u64,
    latency_rate: f64,
    agents: usize,
    invocations: usize,
    in_flight: Vec<usize>,
    level_seconds: u64,
    restart_flights: usize,
    generate_seconds: u64,
    replay_deltas: u64,
    memory_agents: usize,
}

impl Sizes {
    fn of(args: &Args) -> Sizes {
        fn pick<V>(quick: bool, full: V, small: V) -> V {
            if quick {
                small
            } else {
                full
            }
        }
        let q = args.quick;
        Sizes {
            deltas: args.deltas.unwrap_or(pick(q, 1_000_000, 20_000)),
            delta_size: args.delta_size.unwrap_or(32),
            latency_deltas: args.latency_deltas.unwrap_or(pick(q, 10_000, 1_000)),
            latency_rate: args.latency_rate.unwrap_or(1000.0),
            agents: args.agents.unwrap_or(pick(q, 100, 10)),
            invocations: args.invocations.unwrap_or(pick(q, 10_000, 500)),
            in_flight: args.in_flight.clone().unwrap_or(vec![1, 8, 64, 256]),
            level_seconds: args.level_seconds.unwrap_or(pick(q, 20, 10)),
            restart_flights: args.restart_flights.unwrap_or(pick(q, 100_000, 0)),
            generate_seconds: args.generate_seconds.unwrap_or(pick(q, 240, 10)),
            replay_deltas: args.replay_deltas.unwrap_or(pick(q, 10_000, 2_000)),
            memory_agents: args.memory_agents.unwrap_or(pick(q, 1000, 50)),
        }
    }

    fn describe(&self) -> String {
        format!(
            "1: {} deltas of {} B; 2: {} deltas at {}/s; 3: up to {} invocations (at most {} s) \
             per level over {} agents, {:?} in flight; 5: {} flights wanted (at most {} s of \
             generation); 6: {} deltas; 7: {} agents",
            bench::number(self.deltas as f64),
            self.delta_size,
            bench::number(self.latency_deltas as f64),
            self.latency_rate,
            bench::number(self.invocations as f64),
            self.level_seconds,
            self.agents,
            self.in_flight,
            bench::number(self.restart_flights as f64),
            self.generate_seconds,
            bench::number(self.replay_deltas as f64),
            self.memory_agents,
        )
    }
}

/// What every part needs.
struct Bench {
    relay: PathBuf,
    instant: PathBuf,
    sizes: Sizes,
    tmp: tempfile::TempDir,
}

/// How long a stream may send nothing before it counts as stalled (a deadline against
/// a hang, not a measure).
const STALL: Duration = Duration::from_secs(60);
/// How long one flight of scenario 3 may take to end.
const FLIGHT_DEADLINE: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Dropping the run (on a signal) drops its processes' handles, which kill them.
    tokio::select! {
        r = run(args) => r,
        _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        _ = sigterm.recv() => bail!("terminated"),
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let me = std::env::current_exe()?;
    let relay = args
        .relay
        .clone()
        .unwrap_or_else(|| me.with_file_name("relay"));
    anyhow::ensure!(
        relay.exists(),
        "{} is missing: build it (cargo build --release --bins) or pass --relay",
        relay.display()
    );
    let instant = relay_tests::load::instant_codex_bin();
    anyhow::ensure!(
        instant.exists(),
        "{} is missing: build it (cargo build --release --bins)",
        instant.display()
    );
    let sizes = Sizes::of(&args);
    let b = Bench {
        relay,
        instant,
        sizes: sizes.clone(),
        tmp: tempfile::Builder::new().prefix("relay-bench-").tempdir()?,
    };
    let wanted =
        |s: &[u8]| args.scenarios.is_empty() || s.iter().any(|n| args.scenarios.contains(n));
    say(&format!(
        "{} sizes: {}",
        if args.quick { "quick" } else { "full" },
        sizes.describe()
    ));
    let started = Instant::now();
    let mut rows = Vec::new();
    if wanted(&[1, 4, 7]) {
        rows.extend(part_a(&b).await);
    }
    if wanted(&[2, 6]) {
        rows.extend(part_b(&b).await);
    }
    if wanted(&[3, 5]) {
        rows.extend(part_c(&b).await);
    }
    if wanted(&[7]) {
        rows.extend(part_d(&b).await);
    }
    rows.sort_by_key(|r| r.scenario);
    let took = started.elapsed();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let machine = bench::machine_description(&repo);
    let table = bench::text_table(&rows);
    println!(
        "relay-bench ({}, {:.0} s): {}",
        if args.quick { "quick" } else { "full" },
        took.as_secs_f64(),
        machine
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    print!("{table}");
    for r in rows.iter().filter(|r| !r.detail.is_empty()) {
        println!("  {} {}: {}", r.scenario, r.name, r.detail);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.markdown {
        let mut section = String::from("## Latest run\n\n");
        section.push_str(&format!(
            "`ops/bench{}` on {}, {:.0} s. Sizes: {}.\n\n",
            if args.quick { " --quick" } else { "" },
            utc_now(),
            took.as_secs_f64(),
            sizes.describe()
        ));
        for (k, v) in &machine {
            section.push_str(&format!("- {k}: {v}\n"));
        }
        section.push('\n');
        section.push_str(&bench::markdown_table(&rows));
        let old = std::fs::read_to_string(path).unwrap_or_default();
        std::fs::write(path, bench::replace_latest(&old, &section))
            .with_context(|| format!("writing {}", path.display()))?;
        say(&format!("wrote {}", path.display()));
    }
    let failed: Vec<&Row> = rows.iter().filter(|r| r.value.is_none()).collect();
    if !failed.is_empty() {
        bail!(
            "{} figure(s) missing: {}",
            failed.len(),
            failed
                .iter()
                .map(|r| format!("{} {}", r.scenario, r.name))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

fn say(what: &str) {
    eprintln!("relay-bench: {what}");
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Runs blocking work (starting or stopping a process, sled) without stalling the
/// runtime's other tasks.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}

impl Bench {
    fn start_relay(&self, name: &str, nats: &NatsServer) -> anyhow::Result<RelayProcess> {
        let dir = self.tmp.path().join(name);
        blocking(|| {
            RelayProcess::start_bin(
                &self.relay,
                &dir,
                &["--nats", &nats.url()],
                // The default of `relay up`: the tests' debug logs would cost time.
                &[("RUST_LOG", "info")],
            )
        })
    }

    /// Registers agents served by relay-instant-codex, `concurrency` requests at once.
    async fn add_agents(
        &self,
        relay: &RelayProcess,
        names: &[String],
        wake: &str,
        concurrency: usize,
    ) -> anyhow::Result<()> {
        let api = api(relay);
        let cwd = relay.data_dir.display().to_string();
        let command = self.instant.display().to_string();
        let mut pending = futures::stream::iter(names.iter().cloned().map(|name| {
            let (api, cwd, command) = (api.clone(), cwd.clone(), command.clone());
            async move {
                let spec = json!({
                    "name": name, "harness": "codex_app_server", "cwd": cwd,
                    "command": command, "wake": wake,
                });
                api.post::<_, Value>("/v1/agents", &spec)
                    .await
                    .with_context(|| format!("adding agent {name}"))
            }
        }))
        .buffer_unordered(concurrency.max(1));
        while let Some(r) = pending.next().await {
            r?;
        }
        Ok(())
    }
}

fn api(relay: &RelayProcess) -> relay_cli::client::Client {
    relay_cli::client::Client::new(&relay.api.url, &relay.api.token)
}

/// A NATS client whose subscriptions hold up to 2M messages (the default 64K drops the
/// rest of a fast stream the bench reads a little slower than it comes).
async fn connect(url: &str) -> anyhow::Result<async_nats::Client> {
    Ok(async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 21)
        .connect(url)
        .await?)
}

/// SIZE bytes starting with the time now, as relay-instant-codex writes its deltas.
fn delta_text(size: usize) -> String {
    let mut text = format!("{:020}", now_nanos());
    text.truncate(size);
    while text.len() < size {
        text.push('.');
    }
    text
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Milliseconds since a delta's text was written (its first 20 characters).
fn age_ms(text: &str) -> Option<f64> {
    let sent: u128 = text.get(..20)?.parse().ok()?;
    Some((now_nanos() as f64 - sent as f64) / 1e6)
}

/// Waits before invoking again a broker that answered `overloaded`.
const INVOKE_BACKOFF: retry::ExponentialBuilder =
    retry::forever(Duration::from_millis(5), Duration::from_millis(500));

/// Why an invocation did not give a flight id.
enum NotInvoked {
    /// The broker is busy: asked again.
    Overloaded,
    Failed(anyhow::Error),
}

/// Sends an invocation of `agent` as JSON on `subject` and returns its flight id; a busy
/// broker (`overloaded`) is asked again.
async fn invoke(
    nats: &async_nats::Client,
    subject: String,
    agent: &str,
    task: &str,
) -> anyhow::Result<String> {
    let attempt = || async {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE);
        let request = async_nats::Request::new()
            .payload(
                json!({ "task": task, "requester": "bench" })
                    .to_string()
                    .into(),
            )
            .headers(headers)
            .timeout(Some(Duration::from_secs(30)));
        let reply = nats
            .send_request(subject.clone(), request)
            .await
            .with_context(|| format!("invoking {agent}"))
            .map_err(NotInvoked::Failed)?;
        let body: Value =
            serde_json::from_slice(&reply.payload).map_err(|e| NotInvoked::Failed(e.into()))?;
        if let Some(id) = body["flight"]["id"].as_str() {
            return Ok(id.to_string());
        }
        if body["error"]["code"] != "overloaded" {
            return Err(NotInvoked::Failed(anyhow::anyhow!(
                "invocation of {agent} refused: {body}"
            )));
        }
        Err(NotInvoked::Overloaded)
    };
    match attempt
        .retry(INVOKE_BACKOFF)
        .when(|e| matches!(e, NotInvoked::Overloaded))
        .await
    {
        Ok(id) => Ok(id),
        Err(NotInvoked::Failed(e)) => Err(e),
        Err(NotInvoked::Overloaded) => bail!("invocation of {agent}: still overloaded"),
    }
}

/// What a subscriber saw of one streamed flight.
#[derive(Debug)]
struct Seen {
    deltas: u64,
    first: Option<Instant>,
    last: Option<Instant>,
    /// Age of each delta when it arrived, in ms (if asked for).
    ages_ms: Vec<f64>,
    state: Option<pb::FlightState>,
}

impl Seen {
    fn rate(&self) -> Option<f64> {
        let span = self.last?.duration_since(self.first?).as_secs_f64();
        (self.deltas > 1 && span > 0.0).then(|| (self.deltas - 1) as f64 / span)
    }
}

/// Reads `sub` (the flight updates of an agent, protobuf) until flight `id` ends.
///
/// Deltas that waited for the same commit arrive merged into one update (their texts
/// joined), so deltas are counted by text: each is `size` bytes and starts with its
/// emit time.
async fn follow_flight(
    sub: &mut async_nats::Subscriber,
    id: &str,
    ages: bool,
    size: usize,
) -> anyhow::Result<Seen> {
    let mut seen = Seen {
        deltas: 0,
        first: None,
        last: None,
        ages_ms: Vec::new(),
        state: None,
    };
    loop {
        let Ok(next) = tokio::time::timeout(STALL, sub.next()).await else {
            bail!(
                "flight {id} sent nothing for {STALL:?} after {} deltas",
                seen.deltas
            );
        };
        let Some(m) = next else {
            bail!("the subscription ended");
        };
        let update = pb::FlightUpdate::decode(m.payload.as_ref())?;
        if update.flight != id {
            continue;
        }
        match update.change {
            Some(pb::flight_update::Change::Delta(d)) => {
                let now = Instant::now();
                seen.first.get_or_insert(now);
                seen.last = Some(now);
                let size = size.max(1);
                seen.deltas += (d.text.len() / size).max(1) as u64;
                if ages {
                    for start in (0..d.text.len()).step_by(size) {
                        if let Some(a) = d.text.get(start..).and_then(age_ms) {
                            seen.ages_ms.push(a);
                        }
                    }
                }
            }
            Some(pb::flight_update::Change::State(s)) => {
                let state = pb::FlightState::try_from(s.to).unwrap_or_default();
                if matches!(
                    state,
                    pb::FlightState::Completed
                        | pb::FlightState::Failed
                        | pb::FlightState::Cancelled
                ) {
                    seen.state = Some(state);
                    return Ok(seen);
                }
            }
            _ => {}
        }
    }
}

/// Invokes `agent` with `task` and follows its flight to the end over NATS.
async fn stream_flight(
    nats: &async_nats::Client,
    agent: &str,
    task: &str,
    ages: bool,
) -> anyhow::Result<(String, Seen)> {
    let mut sub = nats.subscribe(subjects::flight(agent, "*")).await?;
    nats.flush().await?;
    let id = invoke(nats, subjects::invoke(agent), agent, task).await?;
    // `stream:N:SIZE[:RATE]`: deltas of SIZE bytes; anything else counts per update.
    let size = task
        .split(':')
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX);
    let seen = follow_flight(&mut sub, &id, ages, size).await?;
    if seen.state != Some(pb::FlightState::Completed) {
        bail!("flight {id} ended {:?}", seen.state);
    }
    Ok((id, seen))
}

/// Raw NATS: `n` payloads like the deltas, published as fast as the client takes them,
/// received by a subscriber on another connection. Deltas/s between the first and the
/// last received, and how many arrived.
async fn raw_throughput(url: &str, n: u64, size: usize) -> anyhow::Result<(Option<f64>, u64)> {
    let rx = connect(url).await?;
    let mut sub = rx.subscribe("bench.raw.deltas").await?;
    rx.flush().await?;
    let tx = connect(url).await?;
    let publisher = tokio::spawn(async move {
        for _ in 0..n {
            tx.publish("bench.raw.deltas", delta_text(size).into())
                .await?;
        }
        tx.flush().await?;
        anyhow::Ok(())
    });
    let (mut first, mut last, mut got) = (None, None, 0u64);
    while got < n {
        match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
            Ok(Some(_)) => {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
                got += 1;
            }
            // Dropped by a slow consumer: count what came.
            _ => break,
        }
    }
    publisher.await??;
    let rate = match (first, last) {
        (Some(f), Some(l)) if got > 1 => Some((got - 1) as f64 / l.duration_since(f).as_secs_f64()),
        _ => None,
    };
    Ok((rate, got))
}

/// Raw NATS at `rate` per second: the age of each payload when it arrives, in ms.
async fn raw_latency(url: &str, n: u64, rate: f64, size: usize) -> anyhow::Result<Vec<f64>> {
    let rx = connect(url).await?;
    let mut sub = rx.subscribe("bench.raw.latency").await?;
    rx.flush().await?;
    let tx = connect(url).await?;
    let publisher = tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        for i in 0..n {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
            tx.publish("bench.raw.latency", delta_text(size).into())
                .await?;
        }
        tx.flush().await?;
        anyhow::Ok(())
    });
    let mut ages = Vec::with_capacity(n as usize);
    while (ages.len() as u64) < n {
        match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
            Ok(Some(m)) => {
                if let Some(a) = std::str::from_utf8(&m.payload).ok().and_then(age_ms) {
                    ages.push(a);
                }
            }
            _ => break,
        }
    }
    publisher.await??;
    Ok(ages)
}

fn rss_mb(pid: u32) -> anyhow::Result<f64> {
    Ok(bench::rss_bytes(pid)? as f64 / 1024.0 / 1024.0)
}

/// The broker's RSS once it has been quiet for a moment.
async fn settled_rss_mb(relay: &RelayProcess) -> anyhow::Result<f64> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    rss_mb(relay.pid())
}

/// A failed part leaves a row without figure for each of its scenarios.
fn failed_rows(e: &anyhow::Error, names: &[(u8, &str)]) -> Vec<Row> {
    say(&format!("FAILED: {e:#}"));
    names.iter().map(|(s, n)| Row::failed(*s, n, e)).collect()
}

// ---- Part A: 1 delta throughput, 4 storage, 7 RSS after the deltas ----

async fn part_a(b: &Bench) -> Vec<Row> {
    match part_a_inner(b).await {
        Ok(rows) => rows,
        Err(e) => failed_rows(
            &e,
            &[
                (1, "delta throughput"),
                (4, "storage per delta"),
                (7, "broker RSS after scenario 1"),
            ],
        ),
    }
}

/// A streaming part's set-up: a nats-server, `relay up`, one agent whose session a first
/// short turn has started (so that what follows measures the stream), a NATS client, and
/// the broker's RSS before any of it.
async fn streaming_part(
    b: &Bench,
    part: &str,
    agent: &str,
) -> anyhow::Result<(NatsServer, RelayProcess, async_nats::Client, f64)> {
    let nats = blocking(NatsServer::start)?;
    let relay = b.start_relay(part, &nats)?;
    let idle = settled_rss_mb(&relay).await?;
    b.add_agents(&relay, &[agent.to_string()], "on_demand", 1)
        .await?;
    let client = connect(&nats.url()).await?;
    stream_flight(&client, agent, "stream:10:32", false).await?;
    Ok((nats, relay, client, idle))
}

async fn part_a_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let agent = "stream-1".to_string();
    let (nats, mut relay, client, idle) = streaming_part(b, "a", &agent).await?;
    say(&format!(
        "1: streaming {} deltas through relay",
        bench::number(s.deltas as f64)
    ));
    let t = Instant::now();
    let (_, seen) = stream_flight(
        &client,
        &agent,
        &format!("stream:{}:{}", s.deltas, s.delta_size),
        false,
    )
    .await?;
    let whole = t.elapsed();
    let after = settled_rss_mb(&relay).await?;
    let status: Value = api(&relay).get("/v1/status").await?;
    say("1: the same through raw NATS");
    let (raw, raw_got) = raw_throughput(&nats.url(), s.deltas, s.delta_size).await?;
    blocking(|| relay.terminate())?;
    let db = relay.data_dir.join("db");
    let bytes = blocking(|| bench::dir_bytes(&db))?;
    let trees = blocking(|| logical_bytes(&db))?;
    let mut rows = Vec::new();
    let mut r1 = Row::new(1, "delta throughput", "deltas/s")
        .baseline("raw NATS pub->sub", raw)
        .goal(Goal::RatioAtLeast(0.3))
        .detail(format!(
            "{} of {} deltas received, {:.1} s from invocation to completion; raw NATS: {} \
             of {} received",
            bench::number(seen.deltas as f64),
            bench::number(s.deltas as f64),
            whole.as_secs_f64(),
            bench::number(raw_got as f64),
            bench::number(s.deltas as f64),
        ));
    if let Some(rate) = seen.rate().filter(|_| seen.deltas == s.deltas) {
        r1 = r1.value(rate);
    } else {
        r1.detail = format!("ERROR: {}", r1.detail);
    }
    rows.push(r1);
    let n = seen.deltas.max(1) as f64;
    rows.push(
        Row::new(4, "storage per delta", "B")
            .value(bytes as f64 / n)
            .baseline("the delta's text", Some(s.delta_size as f64))
            .goal(Goal::AtMost(200.0))
            .detail(format!(
                "db {} MB for {} events after scenario 1 (the broker stopped); stored \
                 key+value bytes per delta: {}; the final answer ({} MB, {} B per delta) is \
                 stored several times among them (item, state change, flight, reply)",
                bench::number(bytes as f64 / 1e6),
                bench::number(status["last_seq"].as_f64().unwrap_or(0.0)),
                trees
                    .iter()
                    .filter(|(_, v)| *v as f64 / n >= 1.0)
                    .map(|(t, v)| format!("{t} {}", bench::number(*v as f64 / n)))
                    .collect::<Vec<_>>()
                    .join(", "),
                bench::number((s.deltas as usize * s.delta_size) as f64 / 1e6),
                s.delta_size,
            )),
    );
    rows.push(
        Row::new(7, "broker RSS after scenario 1", "MB")
            .value(after)
            .baseline("idle relay up", Some(idle))
            .goal(Goal::AtMost(100.0)),
    );
    Ok(rows)
}

/// Key + value bytes stored in each tree of a stopped broker's database.
fn logical_bytes(db: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let store = Store::open(db)?;
    let names = [
        "events",
        "flight_updates",
        "flights",
        "invocations",
        "messages",
    ];
    let trees = [
        T::Events,
        T::FlightUpdates,
        T::Flights,
        T::Invocations,
        T::Messages,
    ];
    let mut out = Vec::new();
    for (name, t) in names.iter().zip(trees) {
        let mut total = 0u64;
        for kv in store.tree(t).iter() {
            let (k, v) = kv?;
            total += (k.len() + v.len()) as u64;
        }
        out.push((name.to_string(), total));
    }
    Ok(out)
}

// ---- Part B: 2 delta latency, 6 replay ----

async fn part_b(b: &Bench) -> Vec<Row> {
    match part_b_inner(b).await {
        Ok(rows) => rows,
        Err(e) => failed_rows(
            &e,
            &[
                (2, "delta latency p50"),
                (2, "delta latency p99"),
                (2, "delta latency max"),
                (6, "replay of one flight"),
            ],
        ),
    }
}

async fn part_b_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let agent = "latency-1".to_string();
    let (nats, mut relay, client, _) = streaming_part(b, "b", &agent).await?;
    say(&format!(
        "2: {} deltas at {}/s through relay",
        bench::number(s.latency_deltas as f64),
        s.latency_rate
    ));
    let (_, seen) = stream_flight(
        &client,
        &agent,
        &format!(
            "stream:{}:{}:{}",
            s.latency_deltas, s.delta_size, s.latency_rate
        ),
        true,
    )
    .await?;
    let mut relay_ms = seen.ages_ms;
    relay_ms.sort_by(|a, b| a.total_cmp(b));
    say("2: the same through raw NATS");
    let mut raw_ms =
        raw_latency(&nats.url(), s.latency_deltas, s.latency_rate, s.delta_size).await?;
    raw_ms.sort_by(|a, b| a.total_cmp(b));
    let mut rows = Vec::new();
    for (name, q, goal) in [
        ("delta latency p50", 0.5, Some(Goal::RatioAtMost(3.0))),
        ("delta latency p99", 0.99, Some(Goal::AtMost(2.0))),
        ("delta latency max", 1.0, None),
    ] {
        let mut r = Row::new(2, name, "ms")
            .baseline("raw NATS hop at the same rate", bench::quantile(&raw_ms, q));
        if let Some(v) = bench::quantile(&relay_ms, q) {
            r = r.value(v);
        }
        if let Some(g) = goal {
            r = r.goal(g);
        }
        if q == 0.5 {
            r = r.detail(format!(
                "harness emit -> subscriber receive; {} relay deltas and {} raw timed",
                bench::number(relay_ms.len() as f64),
                bench::number(raw_ms.len() as f64)
            ));
        }
        rows.push(r);
    }
    say(&format!(
        "6: a flight of {} deltas, read back over HTTP",
        bench::number(s.replay_deltas as f64)
    ));
    let (id, _) = stream_flight(
        &client,
        &agent,
        &format!("stream:{}:{}", s.replay_deltas, s.delta_size),
        false,
    )
    .await?;
    let http = api(&relay);
    let mut times = Vec::new();
    let mut count = 0;
    for _ in 0..6 {
        let t = Instant::now();
        let updates: Vec<Value> = http.get(&format!("/v1/flights/{id}/updates")).await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        count = updates.len();
    }
    let first = times.remove(0);
    blocking(|| relay.terminate())?;
    let db = relay.data_dir.join("db");
    let (raw_ms, raw_bytes, raw_count) = blocking(|| raw_replay(&db, &id))?;
    rows.push(
        Row::new(6, "replay of one flight", "ms")
            .value(bench::median(times).unwrap_or(f64::NAN))
            .baseline("sled range read", Some(raw_ms))
            .goal(Goal::AtMost(50.0))
            .detail(format!(
                "GET /v1/flights/ID/updates, median of 5 after a first one ({first:.1} ms): {} \
                 updates; sled: {} values, {} MB",
                bench::number(count as f64),
                bench::number(raw_count as f64),
                bench::number(raw_bytes as f64 / 1e6),
            )),
    );
    Ok(rows)
}

/// Reads a flight's stored updates raw from a stopped broker's sled: median ms of 5,
/// bytes and values read.
fn raw_replay(db: &Path, flight: &str) -> anyhow::Result<(f64, u64, usize)> {
    let store = Store::open(db)?;
    let mut times = Vec::new();
    let (mut bytes, mut count) = (0, 0);
    for _ in 0..5 {
        let t = Instant::now();
        (bytes, count) = (0, 0);
        for v in store
            .tree(T::FlightUpdates)
            .range(child_key(flight, 1)..=child_key(flight, u64::MAX))
            .values()
        {
            bytes += v?.len() as u64;
            count += 1;
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((bench::median(times).unwrap_or(f64::NAN), bytes, count))
}

// ---- Part C: 3 invocation throughput, 5 restart ----

/// Flights waited for by id, ended by a follower of the flight updates.
#[derive(Default)]
struct Ends {
    slots: Mutex<HashMap<String, Slot>>,
}

enum Slot {
    Waiting(oneshot::Sender<bool>),
    Ended(bool),
}

impl Ends {
    /// Follows `subject` (protobuf flight updates) and ends the flights it sees end.
    async fn follow(
        client: &async_nats::Client,
        subject: &str,
    ) -> anyhow::Result<(Arc<Ends>, tokio::task::JoinHandle<()>)> {
        let ends = Arc::new(Ends::default());
        let mut sub = client.subscribe(subject.to_string()).await?;
        client.flush().await?;
        let e = ends.clone();
        let task = tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let Ok(u) = pb::FlightUpdate::decode(m.payload.as_ref()) else {
                    continue;
                };
                if let Some(pb::flight_update::Change::State(s)) = u.change {
                    match pb::FlightState::try_from(s.to) {
                        Ok(pb::FlightState::Completed) => e.end(u.flight, true),
                        Ok(pb::FlightState::Failed | pb::FlightState::Cancelled) => {
                            e.end(u.flight, false)
                        }
                        _ => {}
                    }
                }
            }
        });
        Ok((ends, task))
    }

    fn end(&self, flight: String, ok: bool) {
        let mut slots = self.slots.lock().unwrap();
        match slots.remove(&flight) {
            Some(Slot::Waiting(tx)) => {
                let _ = tx.send(ok);
            }
            _ => {
                slots.insert(flight, Slot::Ended(ok));
            }
        }
    }

    /// Whether the flight completed, once it ended.
    async fn wait(&self, flight: String) -> anyhow::Result<bool> {
        let rx = {
            let mut slots = self.slots.lock().unwrap();
            if let Some(Slot::Ended(ok)) = slots.get(&flight) {
                let ok = *ok;
                slots.remove(&flight);
                return Ok(ok);
            }
            let (tx, rx) = oneshot::channel();
            slots.insert(flight.clone(), Slot::Waiting(tx));
            rx
        };
        match tokio::time::timeout(FLIGHT_DEADLINE, rx).await {
            Ok(Ok(ok)) => Ok(ok),
            _ => bail!("flight {flight} did not end within {FLIGHT_DEADLINE:?}"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Looped {
    flights: usize,
    failed: usize,
    took: Duration,
}

impl Looped {
    fn rate(&self) -> f64 {
        self.flights as f64 / self.took.as_secs_f64()
    }
}

/// `in_flight` clients, each sending an invocation and waiting for its flight to end
/// before the next, until `n` are sent or `budget` has passed.
async fn closed_loop<F, Fut>(
    n: usize,
    in_flight: usize,
    budget: Duration,
    agents: &[String],
    ends: &Arc<Ends>,
    invoke: F,
) -> anyhow::Result<Looped>
where
    F: Fn(String, usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<String>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let agents = Arc::new(agents.to_vec());
    let started = Instant::now();
    let deadline = started + budget;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..in_flight {
        let (next, done, failed, agents, ends, invoke) = (
            next.clone(),
            done.clone(),
            failed.clone(),
            agents.clone(),
            ends.clone(),
            invoke.clone(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || Instant::now() > deadline {
                    return anyhow::Ok(());
                }
                let agent = agents[i % agents.len()].clone();
                let id = invoke(agent, i).await?;
                if !ends.wait(id).await? {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(Looped {
        flights: done.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        took: started.elapsed(),
    })
}

/// The broker's durable flushes so far (`GET /v1/status`).
async fn flushes(relay: &RelayProcess) -> anyhow::Result<u64> {
    let status: relay_protocol::api::Status = api(relay).get("/v1/status").await?;
    Ok(status.flushes)
}

/// A raw NATS stand-in for the broker: answers every invocation at once with a flight id
/// and publishes that flight's terminal update.
async fn raw_responder(client: async_nats::Client) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut sub = client.subscribe("bench.raw.invoke.>").await?;
    client.flush().await?;
    Ok(tokio::spawn(async move {
        let mut n = 0u64;
        while let Some(m) = sub.next().await {
            n += 1;
            let agent = m
                .subject
                .as_str()
                .trim_start_matches("bench.raw.invoke.")
                .to_string();
            let id = format!("raw-{n}");
            if let Some(reply) = m.reply {
                let body = json!({ "flight": { "id": id } }).to_string();
                let _ = client.publish(reply, body.into()).await;
            }
            let update = pb::FlightUpdate {
                flight: id.clone(),
                agent: agent.clone(),
                seq: 1,
                change: Some(pb::flight_update::Change::State(pb::StateChange {
                    to: pb::FlightState::Completed as i32,
                    reason: None,
                    output: Some("ok".into()),
                })),
                ..Default::default()
            };
            let _ = client
                .publish(
                    format!("bench.raw.flight.{agent}.{id}"),
                    update.encode_to_vec().into(),
                )
                .await;
        }
    }))
}

async fn part_c(b: &Bench) -> Vec<Row> {
    let mut names: Vec<(u8, String)> = b
        .sizes
        .in_flight
        .iter()
        .map(|k| (3, format!("invocations, {k} in flight")))
        .collect();
    names.extend([
        (5, "restart until the API answers".to_string()),
        (5, "GET /v1/flights?live=true after restart".to_string()),
        (5, "GET /v1/status after restart".to_string()),
    ]);
    match part_c_inner(b).await {
        Ok(rows) => rows,
        Err(e) => {
            let names: Vec<(u8, &str)> = names.iter().map(|(s, n)| (*s, n.as_str())).collect();
            failed_rows(&e, &names)
        }
    }
}

async fn part_c_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let nats = blocking(NatsServer::start)?;
    let mut relay = b.start_relay("c", &nats)?;
    let agents: Vec<String> = (0..s.agents).map(|i| format!("inv-{i}")).collect();
    b.add_agents(&relay, &agents, "on_demand", 16).await?;
    let client = connect(&nats.url()).await?;
    let (ends, follower) = Ends::follow(&client, subjects::FLIGHTS_ALL).await?;
    let (raw_ends, raw_follower) = Ends::follow(&client, "bench.raw.flight.>").await?;
    let responder = raw_responder(connect(&nats.url()).await?).await?;
    let via_relay = {
        let c = client.clone();
        move |agent: String, i: usize| {
            let c = c.clone();
            async move {
                let subject = subjects::invoke(&agent);
                invoke(&c, subject, &agent, &format!("bench task {i}")).await
            }
        }
    };
    let via_raw = {
        let c = client.clone();
        move |agent: String, i: usize| {
            let c = c.clone();
            async move {
                let subject = format!("bench.raw.invoke.{agent}");
                invoke(&c, subject, &agent, &format!("bench task {i}")).await
            }
        }
    };
    // Every agent's session starts before anything is timed.
    say(&format!("3: waking {} agents", s.agents));
    let warm = closed_loop(
        s.agents,
        s.agents.min(64),
        Duration::from_secs(600),
        &agents,
        &ends,
        via_relay.clone(),
    )
    .await?;
    anyhow::ensure!(warm.failed == 0, "{} warm-up flights failed", warm.failed);
    let budget = Duration::from_secs(s.level_seconds);
    let mut rows = Vec::new();
    for &k in &s.in_flight {
        say(&format!("3: {k} in flight"));
        let flushes_before = flushes(&relay).await?;
        let relay_run =
            closed_loop(s.invocations, k, budget, &agents, &ends, via_relay.clone()).await?;
        let flushed = flushes(&relay).await? - flushes_before;
        let raw_run = closed_loop(
            s.invocations,
            k,
            budget,
            &agents,
            &raw_ends,
            via_raw.clone(),
        )
        .await?;
        let mut r = Row::new(3, &format!("invocations, {k} in flight"), "flights/s")
            .baseline("raw NATS request + update", Some(raw_run.rate()))
            .detail(format!(
                "{} flights in {:.1} s ({} failed); raw: {} in {:.1} s; durable flushes per \
                 flight: {:.2} ({} flushes)",
                bench::number(relay_run.flights as f64),
                relay_run.took.as_secs_f64(),
                relay_run.failed,
                bench::number(raw_run.flights as f64),
                raw_run.took.as_secs_f64(),
                flushed as f64 / relay_run.flights.max(1) as f64,
                bench::number(flushed as f64),
            ));
        if relay_run.failed == 0 {
            r = r.value(relay_run.rate());
        } else {
            r.detail = format!("ERROR: {}", r.detail);
        }
        if k == 64 {
            r = r.goal(Goal::AtLeast(2000.0));
        }
        rows.push(r);
    }
    responder.abort();
    raw_follower.abort();
    // Scenario 5: grow the data dir, then restart it.
    let status: Value = api(&relay).get("/v1/status").await?;
    let have = status["flights"].as_u64().unwrap_or(0) as usize;
    let mut generation = String::new();
    if s.restart_flights > have {
        let more = s.restart_flights - have;
        say(&format!(
            "5: adding {} flights (at most {} s)",
            bench::number(more as f64),
            s.generate_seconds
        ));
        let g = closed_loop(
            more,
            256,
            Duration::from_secs(s.generate_seconds),
            &agents,
            &ends,
            via_relay.clone(),
        )
        .await?;
        generation = format!(
            "; generated at {} flights/s{}",
            bench::number(g.rate()),
            if g.flights < more {
                format!(
                    ", stopped after {} s short of the {} flights wanted",
                    s.generate_seconds,
                    bench::number(s.restart_flights as f64)
                )
            } else {
                String::new()
            }
        );
    }
    follower.abort();
    let status: Value = api(&relay).get("/v1/status").await?;
    let (flights, events) = (
        status["flights"].as_u64().unwrap_or(0),
        status["last_seq"].as_u64().unwrap_or(0),
    );
    blocking(|| relay.terminate())?;
    let db = relay.data_dir.join("db");
    let db_bytes = blocking(|| bench::dir_bytes(&db))?;
    say(&format!(
        "5: restarting on {} flights, {} events",
        bench::number(flights as f64),
        bench::number(events as f64)
    ));
    let (mut up, mut live, mut stat, mut firsts) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut live_count = 0;
    for _ in 0..3 {
        let t = Instant::now();
        blocking(|| relay.restart())?;
        let http = api(&relay);
        loop {
            if http.get::<Value>("/v1/status").await.is_ok() {
                break;
            }
            if t.elapsed() > Duration::from_secs(120) {
                bail!("the restarted broker did not answer /v1/status within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        up.push(t.elapsed().as_secs_f64());
        for i in 0..6 {
            let t = Instant::now();
            let list: Vec<Value> = http.get("/v1/flights?live=true").await?;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            live_count = list.len();
            if i == 0 {
                firsts.push(ms);
            } else {
                live.push(ms);
            }
            let t = Instant::now();
            http.get::<Value>("/v1/status").await?;
            stat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        blocking(|| relay.terminate())?;
    }
    let (open_s, scan_ms) = blocking(|| open_and_scan(&db))?;
    let sizes = format!(
        "{} flights, {} events, db {} MB{generation}",
        bench::number(flights as f64),
        bench::number(events as f64),
        bench::number(db_bytes as f64 / 1e6)
    );
    rows.push(
        Row::new(5, "restart until the API answers", "s")
            .value(bench::median(up.clone()).unwrap_or(f64::NAN))
            .baseline("sled open alone", Some(open_s))
            .goal(Goal::AtMost(1.0))
            .detail(format!(
                "spawn -> api.json -> /v1/status answers, median of 3 ({}); {sizes}",
                up.iter()
                    .map(|s| format!("{s:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
    );
    rows.push(
        Row::new(5, "GET /v1/flights?live=true after restart", "ms")
            .value(bench::median(live).unwrap_or(f64::NAN))
            .baseline("sled scan of the flights tree", Some(scan_ms))
            .goal(Goal::AtMost(50.0))
            .detail(format!(
                "median of 15; the first after each start: {}; {live_count} live flights listed",
                firsts
                    .iter()
                    .map(|m| format!("{m:.1} ms"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
    );
    rows.push(
        Row::new(5, "GET /v1/status after restart", "ms")
            .value(bench::median(stat).unwrap_or(f64::NAN))
            .goal(Goal::AtMost(50.0)),
    );
    Ok(rows)
}

/// Seconds to open the stopped broker's sled (median of 3), and ms to read every value of
/// its flights tree (what a listing of flights reads).
fn open_and_scan(db: &Path) -> anyhow::Result<(f64, f64)> {
    let mut opens = Vec::new();
    let mut scans = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let store = Store::open(db)?;
        opens.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut bytes = 0;
        for v in store.tree(T::Flights).iter().values() {
            bytes += v?.len();
        }
        scans.push(t.elapsed().as_secs_f64() * 1000.0);
        std::hint::black_box(bytes);
    }
    Ok((
        bench::median(opens).unwrap_or(f64::NAN),
        bench::median(scans).unwrap_or(f64::NAN),
    ))
}

// ---- Part D: 7 RSS with many live sessions ----

async fn part_d(b: &Bench) -> Vec<Row> {
    match part_d_inner(b).await {
        Ok(rows) => rows,
        Err(e) => failed_rows(&e, &[(7, "broker RSS with live agents")]),
    }
}

async fn part_d_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let nats = blocking(NatsServer::start)?;
    let mut relay = b.start_relay("d", &nats)?;
    let idle = settled_rss_mb(&relay).await?;
    say(&format!("7: {} agents kept warm", s.memory_agents));
    let agents: Vec<String> = (0..s.memory_agents).map(|i| format!("mem-{i}")).collect();
    let t = Instant::now();
    b.add_agents(&relay, &agents, "keep_warm", 16).await?;
    // Until every session is up (its agent idle).
    let api = api(&relay);
    loop {
        let list: Vec<Value> = api.get("/v1/agents").await?;
        let idle_agents = list.iter().filter(|a| a["state"] == "idle").count();
        if idle_agents >= s.memory_agents {
            break;
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!(
                "{idle_agents} of {} agents idle after 300 s",
                s.memory_agents
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let woke = t.elapsed();
    let rss = settled_rss_mb(&relay).await?;
    let kids = bench::children(relay.pid());
    let kids_mb: f64 = kids.iter().filter_map(|p| rss_mb(*p).ok()).sum();
    // A clean stop, so that the broker ends its sessions itself.
    blocking(|| relay.terminate())?;
    Ok(vec![Row::new(
        7,
        &format!("broker RSS, {} agents live", s.memory_agents),
        "MB",
    )
    .value(rss)
    .baseline("idle relay up", Some(idle))
    .goal(Goal::AtMost(100.0))
    .detail(format!(
        "all sessions up {:.1} s after the first registration; their {} harness processes \
         hold {} MB more (not counted)",
        woke.as_secs_f64(),
        kids.len(),
        bench::number(kids_mb)
    ))])
}
