//! `relay-chaos`: the chaos test's run (`relay_tests::chaos`), longer and repeatable:
//! `kill -9` of the broker, a `relay node` and nats-server at random (seeded) points under
//! concurrent HTTP and NATS clients; prints each round's figures and every violation, and
//! exits 1 if any round had one. `ops/chaos.sh` builds and runs it.
//!
//!   relay-chaos --agents 40 --invocations 10000 --kills 60 --rounds 3 --seed 42

use std::time::Duration;

use clap::Parser;
use relay_tests::chaos::{self, Chaos};

#[derive(Parser)]
#[command(
    about = "kill -9 of broker, node and nats-server under load; checks nothing is lost, stuck, run twice or failed unstarted"
)]
struct Args {
    /// Seed of round 1 (round N uses seed + N - 1). Default: RELAY_CHAOS_SEED, else random.
    #[arg(long)]
    seed: Option<u64>,
    /// Agents, each served by relay-instant-codex; the odd ones on the node. Each queues
    /// nearly all of its share at once: keep invocations/agents under the agent queue (256).
    #[arg(long, default_value_t = 24)]
    agents: usize,
    /// Concurrent HTTP clients.
    #[arg(long, default_value_t = 16)]
    http: usize,
    /// Concurrent NATS invokers.
    #[arg(long, default_value_t = 16)]
    nats: usize,
    /// Invocations per round.
    #[arg(long, default_value_t = 5000)]
    invocations: usize,
    /// Kills per round (spread evenly over broker, node and nats-server).
    #[arg(long, default_value_t = 30)]
    kills: usize,
    /// How long each turn is held, in ms.
    #[arg(long, default_value_t = 20)]
    turn_ms: u64,
    /// A killed process stays down for a random time below this, in ms.
    #[arg(long, default_value_t = 500)]
    down_ms: u64,
    /// Rounds (each a fresh broker, node and nats-server).
    #[arg(long, default_value_t = 1)]
    rounds: u64,
    /// A round whose load, or then whose flights' ends, take longer than this many
    /// seconds each is a hang.
    #[arg(long, default_value_t = 1800)]
    within: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The `relay` beside this program (target/<profile>/), unless RELAY_BIN says
    // otherwise: set before any thread starts.
    if std::env::var_os("RELAY_BIN").is_none() {
        let beside = std::env::current_exe()?.with_file_name("relay");
        anyhow::ensure!(
            beside.exists(),
            "{} is missing: build it (cargo build -p relay-cli) or set RELAY_BIN",
            beside.display()
        );
        std::env::set_var("RELAY_BIN", beside);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(rounds(args))
}

async fn rounds(args: Args) -> anyhow::Result<()> {
    let first = match args.seed {
        Some(s) => s,
        None => Chaos::seed_from_env()?,
    };
    let mut bad = 0;
    for round in 0..args.rounds {
        let chaos = Chaos {
            seed: first.wrapping_add(round),
            agents: args.agents,
            http_clients: args.http,
            nats_clients: args.nats,
            invocations: args.invocations,
            kills: args.kills,
            turn: Duration::from_millis(args.turn_ms),
            down: Duration::from_millis(args.down_ms),
            within: Duration::from_secs(args.within),
        };
        eprintln!(
            "relay-chaos: round {} of {} (seed {})",
            round + 1,
            args.rounds,
            chaos.seed
        );
        let report = chaos::run(&chaos).await?;
        println!("{report}");
        let violations = report.violations();
        for v in &violations {
            println!("  VIOLATION: {v}");
        }
        if !violations.is_empty() {
            bad += 1;
        }
    }
    if bad > 0 {
        eprintln!(
            "relay-chaos: {bad} of {} rounds had violations",
            args.rounds
        );
        std::process::exit(1);
    }
    eprintln!("relay-chaos: {} rounds held", args.rounds);
    Ok(())
}
