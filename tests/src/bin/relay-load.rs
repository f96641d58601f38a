//! `relay-load`: the load of the load tests, as a benchmark that compares `relay`
//! binaries in one run (for example the last release and this build).
//!
//! For every mix of clients and every binary, in turn (interleaved, round after round,
//! so that both see the same machine): a fresh data dir, a real nats-server, `relay up
//! --nats`, agents served by `relay-instant-codex`, then the invocations; it reports
//! flights/s (from the first request until every flight ended) and the longest
//! `GET /v1/status` during the load. A binary that does not finish within `--within`
//! is reported `WEDGED`.
//!
//!   relay-load --relay before=/path/to/old/relay --relay after=target/release/relay

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use relay_tests::load::{self, Load, Target};
use relay_tests::nats::NatsServer;
use relay_tests::RelayProcess;

#[derive(Parser)]
#[command(about = "Compare relay binaries under concurrent invocations (HTTP and NATS)")]
struct Args {
    /// NAME=PATH of a relay binary; give two or more to compare (the first is the
    /// baseline of the ratios). Default: this build's relay.
    #[arg(long = "relay", value_name = "NAME=PATH")]
    relays: Vec<String>,
    /// Agents, each served by relay-instant-codex.
    #[arg(long, default_value_t = 20)]
    agents: usize,
    /// Invocations per run.
    #[arg(long, default_value_t = 2000)]
    invocations: usize,
    /// Client mixes, HTTPxNATS (concurrent HTTP clients x concurrent NATS invokers).
    #[arg(long, value_delimiter = ',', default_value = "1x0,4x0,16x0,0x8,32x64")]
    mix: Vec<String>,
    /// Rounds; each figure is the median of the rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// A run that has not ended after this many seconds is reported WEDGED.
    #[arg(long, default_value_t = 60)]
    within: u64,
}

#[derive(Clone, Debug)]
enum Outcome {
    Done {
        flights_per_s: f64,
        status_max_ms: f64,
    },
    Wedged(String),
}

async fn run_once(
    bin: &std::path::Path,
    agents: usize,
    invocations: usize,
    (http, nats_clients): (usize, usize),
    within: Duration,
) -> anyhow::Result<Outcome> {
    let nats = NatsServer::start()?;
    let tmp = tempfile::tempdir()?;
    let relay =
        RelayProcess::start_bin(bin, &tmp.path().join("data"), &["--nats", &nats.url()], &[])?;
    let agents = load::add_instant_agents(&relay, agents, None);
    let target = Target::new(&relay.data_dir)?;
    let load = Load {
        agents,
        http_clients: http,
        nats_clients,
        invocations,
        nats_url: Some(nats.url()),
        acked: Default::default(),
        within,
    };
    let started = Instant::now();
    let report = match load::run(&load, &target).await {
        Ok(r) => r,
        Err(e) => return Ok(Outcome::Wedged(format!("{e:#}"))),
    };
    if !report.refused.is_empty() {
        bail!(
            "refused: {:?}",
            &report.refused[..report.refused.len().min(3)]
        );
    }
    let left = within.saturating_sub(started.elapsed());
    if let Err(e) = load::wait_all_terminal(&target, left.max(Duration::from_secs(1))).await {
        return Ok(Outcome::Wedged(format!("{e:#}")));
    }
    let took = started.elapsed().as_secs_f64();
    Ok(Outcome::Done {
        flights_per_s: report.flights.len() as f64 / took,
        status_max_ms: report.status_max.as_secs_f64() * 1000.0,
    })
}

fn parse_mix(m: &str) -> anyhow::Result<(usize, usize)> {
    let (h, n) = m
        .split_once('x')
        .with_context(|| format!("a mix is HTTPxNATS, got {m:?}"))?;
    Ok((h.parse()?, n.parse()?))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let relays: Vec<(String, PathBuf)> = if args.relays.is_empty() {
        let me = std::env::current_exe()?;
        vec![("this".into(), me.with_file_name("relay"))]
    } else {
        args.relays
            .iter()
            .map(|r| {
                let (name, path) = r
                    .split_once('=')
                    .with_context(|| format!("--relay is NAME=PATH, got {r:?}"))?;
                Ok((name.to_string(), PathBuf::from(path)))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let mixes: Vec<(String, (usize, usize))> = args
        .mix
        .iter()
        .map(|m| Ok((m.clone(), parse_mix(m)?)))
        .collect::<anyhow::Result<_>>()?;
    let within = Duration::from_secs(args.within);
    // results[mix][relay] = outcomes of the rounds
    let mut results: Vec<Vec<Vec<Outcome>>> = vec![vec![Vec::new(); relays.len()]; mixes.len()];
    for round in 0..args.rounds {
        for (mi, (mix_name, mix)) in mixes.iter().enumerate() {
            for (ri, (name, bin)) in relays.iter().enumerate() {
                // A binary that wedged on this mix is not run on it again.
                if results[mi][ri]
                    .iter()
                    .any(|o| matches!(o, Outcome::Wedged(_)))
                {
                    continue;
                }
                let o = run_once(bin, args.agents, args.invocations, *mix, within).await?;
                eprintln!("round {} mix {mix_name} {name}: {o:?}", round + 1);
                results[mi][ri].push(o);
            }
        }
    }
    println!(
        "{} invocations over {} agents (relay-instant-codex), median of {} rounds; \
         flights/s from the first request until all ended; [longest GET /v1/status]",
        args.invocations, args.agents, args.rounds
    );
    let mut header = format!("{:>14}", "HTTP x NATS");
    for (name, _) in &relays {
        header.push_str(&format!(" | {name:>26}"));
    }
    if relays.len() > 1 {
        header.push_str(&format!(" | {:>8}", "ratio"));
    }
    println!("{header}");
    for (mi, (mix_name, _)) in mixes.iter().enumerate() {
        let mut line = format!("{mix_name:>14}");
        let mut rates = Vec::new();
        for outcomes in &results[mi] {
            if outcomes.iter().any(|o| matches!(o, Outcome::Wedged(_))) {
                line.push_str(&format!(" | {:>26}", "WEDGED"));
                rates.push(None);
                continue;
            }
            let done = |field: fn(f64, f64) -> f64| {
                median(
                    outcomes
                        .iter()
                        .filter_map(|o| match o {
                            Outcome::Done {
                                flights_per_s,
                                status_max_ms,
                            } => Some(field(*flights_per_s, *status_max_ms)),
                            Outcome::Wedged(_) => None,
                        })
                        .collect(),
                )
            };
            let (rate, status) = (done(|rate, _| rate), done(|_, status| status));
            line.push_str(&format!(" | {rate:>9.0} flights/s [{status:>6.1} ms]"));
            rates.push(Some(rate));
        }
        if let (Some(Some(first)), Some(Some(last))) = (rates.first(), rates.last()) {
            if rates.len() > 1 {
                line.push_str(&format!(" | {:>7.2}x", last / first));
            }
        } else if rates.len() > 1 {
            line.push_str(&format!(" | {:>8}", "-"));
        }
        println!("{line}");
    }
    for (mi, (mix_name, _)) in mixes.iter().enumerate() {
        for (ri, outcomes) in results[mi].iter().enumerate() {
            for o in outcomes {
                if let Outcome::Wedged(why) = o {
                    println!("WEDGED {} at {mix_name}: {why}", relays[ri].0);
                }
            }
        }
    }
    Ok(())
}
