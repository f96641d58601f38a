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
//! The scenarios run in parts, each with its own broker and nats-server:
//! - A: 1 delta throughput (runtime -> broker -> NATS subscriber vs raw NATS), 4 bytes on
//!   disk per delta after it, 7 the broker's RSS after it (vs the same broker idle).
//! - B: the fsync floor ([`floor`]: a 4 KiB append + fdatasync on the data dirs'
//!   filesystem, back to back and at the timed deltas' pace), 2 delta latency at a fixed rate (vs a raw NATS hop at the same rate plus
//!   that floor), 6 replay of one flight's updates over HTTP (vs reading them raw from
//!   sled).
//! - C: 3 invocation throughput at several numbers in flight (vs a raw NATS responder),
//!   then 5 restart on the data dir grown to many flights (vs opening sled alone), with
//!   the listings' times.
//! - D: 7 the broker's RSS with many agents whose sessions are live (vs idle).
//! - E: 8 a real codex turn through `relay ask` and over HTTP (vs the same pinned codex
//!   driven directly), against the same mock model, interleaved
//!   ([`relay_tests::codex_turns`]).
//! - F: 9 the noisy neighbour: one agent's latency at a fixed rate beside another's burst
//!   (vs the same agent alone on the same broker).
//! - G: 10 a realistic fleet: many agents streaming short deltas at a modest rate with
//!   answers of a few KB: RSS at the end, latency, bytes per delta.
//! - H: 4 bytes on disk per posted message of about 160 bytes.
//!
//! Stores are measured whichever layout the build keeps ([`common::store_bytes`]), so a
//! build of another commit (`--relay`, the "before" of a change) runs the same scenarios.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod floor;
mod part_a;
mod part_b;
mod part_c;
mod part_d;
mod part_e;
mod part_f;
mod part_g;
mod part_h;

use common::*;
use part_a::part_a;
use part_b::part_b;
use part_c::part_c;
use part_d::part_d;
use part_e::part_e;
use part_f::part_f;
use part_g::part_g;
use part_h::part_h;

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
use relay_protocol::pb;
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
    /// The `relay` binary. Default: beside this program. Another build (of the commit
    /// before a change) runs the same scenarios: the "before" in one session.
    #[arg(long, env = "RELAY_BENCH_RELAY")]
    relay: Option<PathBuf>,
    /// Only these scenarios (1-10); the part that measures each runs whole.
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
    /// 8: timed turns of each way (after a warm-up turn of each).
    #[arg(long)]
    codex_turns: Option<usize>,
    /// 2: appends + fdatasync timed for the fsync floor.
    #[arg(long)]
    fsync_samples: Option<usize>,
    /// 9: deltas of agent A's burst.
    #[arg(long)]
    burst_deltas: Option<u64>,
    /// 9: deltas of agent B timed alone (at --latency-rate per second).
    #[arg(long)]
    neighbour_deltas: Option<u64>,
    /// 10: agents of the fleet.
    #[arg(long)]
    fleet_agents: Option<usize>,
    /// 10: how long the fleet streams (an agent starts a flight only if it ends in time).
    #[arg(long)]
    fleet_seconds: Option<u64>,
    /// 10: deltas per second of each agent.
    #[arg(long)]
    fleet_rate: Option<f64>,
    /// 10: deltas per flight (its answer is their whole text).
    #[arg(long)]
    fleet_flight_deltas: Option<u64>,
    /// 4: messages posted.
    #[arg(long)]
    posted_messages: Option<usize>,
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
    codex_turns: usize,
    fsync_samples: usize,
    neighbour_burst: u64,
    neighbour_alone: u64,
    fleet_agents: usize,
    fleet_seconds: u64,
    fleet_rate: f64,
    fleet_flight_deltas: u64,
    posted_messages: usize,
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
            codex_turns: args.codex_turns.unwrap_or(pick(q, 40, 3)),
            fsync_samples: args.fsync_samples.unwrap_or(pick(q, 1000, 100)),
            neighbour_burst: args.burst_deltas.unwrap_or(pick(q, 1_000_000, 20_000)),
            neighbour_alone: args.neighbour_deltas.unwrap_or(pick(q, 5_000, 500)),
            fleet_agents: args.fleet_agents.unwrap_or(pick(q, 50, 5)),
            fleet_seconds: args.fleet_seconds.unwrap_or(pick(q, 120, 5)),
            fleet_rate: args.fleet_rate.unwrap_or(50.0),
            // 100 deltas of 32 B: an answer of 3.2 KB, one flight every 2 s per agent.
            fleet_flight_deltas: args.fleet_flight_deltas.unwrap_or(100),
            posted_messages: args.posted_messages.unwrap_or(pick(q, 20_000, 500)),
        }
    }

    fn describe(&self) -> String {
        format!(
            "1: {} deltas of {} B; 2: {} deltas at {}/s; 3: up to {} invocations (at most {} s) \
             per level over {} agents, {:?} in flight; 5: {} flights wanted (at most {} s of \
             generation); 6: {} deltas; 7: {} agents; 8: {} codex turns of each way; the \
             fsync floor: {} appends; 9: agent B {} deltas alone, then beside a burst of {}; \
             10: {} agents for {} s, flights of {} deltas at {}/s; 4: {} posted messages",
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
            self.codex_turns,
            self.fsync_samples,
            bench::number(self.neighbour_alone as f64),
            bench::number(self.neighbour_burst as f64),
            self.fleet_agents,
            self.fleet_seconds,
            self.fleet_flight_deltas,
            self.fleet_rate,
            bench::number(self.posted_messages as f64),
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
    let beside = me.with_file_name("relay");
    let relay = args.relay.clone().unwrap_or_else(|| beside.clone());
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
    if wanted(&[8]) {
        rows.extend(part_e(&b).await);
    }
    if wanted(&[9]) {
        rows.extend(part_f(&b).await);
    }
    if wanted(&[10]) {
        rows.extend(part_g(&b).await);
    }
    if wanted(&[4]) {
        rows.extend(part_h(&b).await);
    }
    rows.sort_by_key(|r| r.scenario);
    let took = started.elapsed();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut machine = bench::machine_description(&repo);
    machine.push(("relay".into(), relay_build(&b.relay, &beside)));
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
    output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default()
}

/// Which `relay` ran: its path, its version, when it was built, and the commit of the
/// checkout it was built in (the bench's own for the build beside it), so that a run of
/// a "before" build says what it measured.
fn relay_build(relay: &Path, beside: &Path) -> String {
    let path = relay.display().to_string();
    let version = output(&path, &["--version"]).unwrap_or_else(|| "no --version".into());
    let built = output("date", &["-u", "-r", &path, "+%Y-%m-%d %H:%M UTC"])
        .map(|t| format!("built {t}"))
        .unwrap_or_default();
    let same = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let commit = if same(relay) == same(beside) {
        "the build beside relay-bench (the commit above)".to_string()
    } else {
        let dir = relay.parent().map(|d| d.display().to_string());
        dir.and_then(|d| output("git", &["-C", &d, "rev-parse", "--short=12", "HEAD"]))
            .map(|c| format!("in a checkout at commit {c}"))
            .unwrap_or_else(|| "outside any git checkout (commit unknown)".into())
    };
    format!("{path} ({version}, {built}; {commit})")
}

/// A command's trimmed stdout, if it ran and succeeded.
fn output(program: &str, args: &[&str]) -> Option<String> {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// Runs blocking work (starting or stopping a process, sled) without stalling the
/// runtime's other tasks.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    tokio::task::block_in_place(f)
}
