//! Chaos: the load of [`crate::load`] against a real `relay up --nats`, a real `relay node`
//! and a real nats-server, while each of the three is killed with SIGKILL and started
//! again at random (seeded) points of the work. Used by the chaos test (`tests/tests/load.rs`) and by
//! `relay-chaos` (`ops/chaos.sh`, the longer run).
//!
//! Half the agents are the broker's own, half the node's; each is served by
//! `relay-instant-codex`, which holds every turn a little (so invocations queue behind a
//! running one) and appends each task it receives to one file: how many times each task
//! really reached a harness. Every attempt of an invocation has its own text
//! ([`load::task_text`]), so a retried request whose first answer was lost is told apart.
//!
//! What it checks, each a list in [`ChaosReport`] that must stay empty: no acknowledged
//! flight missing from the store (lost), none left live (stuck), no task received twice
//! (run twice), no flight failed whose task never reached a harness unless the runtime had
//! recorded its turn's start (the error then says it "may have partly run"), no more
//! flights failed than turns the kills could cut (one running turn per agent of the
//! killed process: a turn that had ended, or not begun, is not failed), every
//! completed flight's output its own task's, no flight cancelled or refused, and
//! `relay doctor` clean (no gap in the log, every projection equal to a rebuild).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::load::{self, FlightEnd, Load, LoadReport, Target};
use crate::nats::NatsServer;
use crate::{relay_cmd_with, NodeProcess, RelayProcess};

mod report;
pub use report::{ChaosReport, Kill, Victim};

/// The instant harness's variables (its module docs): the file of received tasks, and
/// how long each turn is held.
pub const LOG_VAR: &str = "RELAY_INSTANT_CODEX_LOG";
pub const TURN_MS_VAR: &str = "RELAY_INSTANT_CODEX_TURN_MS";
/// The variable that fixes the seed (else a random one, printed).
pub const SEED_VAR: &str = "RELAY_CHAOS_SEED";
/// Set (to anything), the run's directory (data dirs, logs, the harnesses' task log) is
/// kept and its path printed, for a post-mortem.
pub const KEEP_VAR: &str = "RELAY_CHAOS_KEEP";
/// The node's name.
pub const NODE: &str = "n1";

/// One chaos run's shape.
#[derive(Debug, Clone)]
pub struct Chaos {
    /// Every random choice (victims, the points they fall at, downtimes) comes from it.
    pub seed: u64,
    /// Agents; the odd ones live on the node.
    pub agents: usize,
    pub http_clients: usize,
    pub nats_clients: usize,
    pub invocations: usize,
    /// Kills in all, as evenly over the three processes as the count allows.
    pub kills: usize,
    /// How long each turn is held.
    pub turn: Duration,
    /// How long a killed process stays down, drawn from `0..down`.
    pub down: Duration,
    /// A deadline against a hang, not a measure: for the load, then again for the
    /// flights' ends (with up to 10 s between, [`STALLED`]).
    pub within: Duration,
}

impl Chaos {
    /// `RELAY_CHAOS_SEED` if set, else a random seed.
    pub fn seed_from_env() -> anyhow::Result<u64> {
        match std::env::var(SEED_VAR) {
            Ok(s) => s.parse().with_context(|| format!("{SEED_VAR}={s}")),
            Err(_) => Ok(rand::rng().random()),
        }
    }
}

/// The three processes and where they keep things.
struct Fleet {
    tmp: Option<tempfile::TempDir>,
    nats: NatsServer,
    relay: RelayProcess,
    node: NodeProcess,
    runs_log: PathBuf,
}

fn start(chaos: &Chaos) -> anyhow::Result<(Fleet, Vec<String>)> {
    let nats = NatsServer::start()?;
    let tmp = tempfile::Builder::new().prefix("relay-chaos-").tempdir()?;
    let relay = RelayProcess::start_with(&tmp.path().join("data"), &["--nats", &nats.url()], &[])?;
    let node = NodeProcess::start(NODE, &tmp.path().join(NODE), &nats.url(), &relay)?;
    let runs_log = tmp.path().join("runs.log");
    let log_env = format!("{LOG_VAR}={}", runs_log.display());
    let turn_env = format!("{TURN_MS_VAR}={}", chaos.turn.as_millis());
    let agents = (0..chaos.agents)
        .map(|i| {
            let name = format!("chaos-{i}");
            let node = (i % 2 == 1).then_some(NODE);
            load::add_instant_agent(
                &relay,
                &name,
                node,
                &["--env", &log_env, "--env", &turn_env],
            );
            name
        })
        .collect();
    let fleet = Fleet {
        tmp: Some(tmp),
        nats,
        relay,
        node,
        runs_log,
    };
    Ok((fleet, agents))
}

/// Runs the chaos to the end and checks what it left; see the module docs. An `Err` is a
/// run that could not be made (a process that would not start again), not a finding.
pub async fn run(chaos: &Chaos) -> anyhow::Result<ChaosReport> {
    // The clients send as fast as the broker takes invocations, so nearly all of an
    // agent's share queues at once: past the runtime's queue, the surplus would be refused
    // (failed flights that say so), which is not what this run is about.
    let per_agent = chaos.invocations.div_ceil(chaos.agents.max(1));
    anyhow::ensure!(
        per_agent < relay_runtime::AGENT_QUEUE_CAPACITY,
        "{} invocations over {} agents queue {per_agent} per agent, more than an agent's \
         queue takes ({}): give more agents",
        chaos.invocations,
        chaos.agents,
        relay_runtime::AGENT_QUEUE_CAPACITY
    );
    let mut rng = StdRng::seed_from_u64(chaos.seed);
    let (mut fleet, agents) = tokio::task::block_in_place(|| start(chaos))?;
    let load = Load {
        agents,
        http_clients: chaos.http_clients,
        nats_clients: chaos.nats_clients,
        invocations: chaos.invocations,
        nats_url: Some(fleet.nats.url()),
        acked: Default::default(),
        within: chaos.within,
    };
    let target = Target::new(&fleet.relay.data_dir)?;
    let started = Instant::now();
    let runner = {
        let (load, target) = (load.clone(), target.clone());
        tokio::spawn(async move { load::run(&load, &target).await })
    };
    let mut victims: Vec<Victim> = [Victim::Broker, Victim::Node, Victim::Nats]
        .into_iter()
        .cycle()
        .take(chaos.kills)
        .collect();
    victims.shuffle(&mut rng);
    // Each kill falls once the harnesses have received so many tasks (an event to wait
    // for, not a time): random points between 5 % and 85 % of the work.
    let mut marks: Vec<usize> = victims
        .iter()
        .map(|_| rng.random_range(chaos.invocations / 20..chaos.invocations * 17 / 20))
        .collect();
    marks.sort_unstable();
    let mut kills = Vec::new();
    for (victim, mark) in victims.into_iter().zip(marks) {
        let ran = match reach(&fleet.runs_log, mark, &runner, &target).await? {
            Some(ran) => ran,
            // Nothing left to run: no more kills.
            None => break,
        };
        let down = random_below(&mut rng, chaos.down);
        kills.push(Kill {
            victim,
            acked: load.acked.load(Ordering::Relaxed),
            ran,
            after_load: runner.is_finished(),
        });
        // Progress as it happens: a run stopped from outside (a test's timeout) still
        // shows how far it got.
        eprintln!(
            "chaos: {:.1}s: kill -9 of the {victim:?} at {ran} run, {} acked (mark {mark})",
            started.elapsed().as_secs_f64(),
            load.acked.load(Ordering::Relaxed)
        );
        kill_and_restart(&mut fleet, &target, victim, down)
            .await
            .with_context(|| format!("restarting the {victim:?} (seed {})", chaos.seed))?;
    }
    let load_report = match runner.await? {
        Ok(report) => report,
        // The load's deadline: say which flights were still live.
        Err(e) => {
            let states = load::flight_states(&target).await?;
            return Err(e.context(format!("flights still live: {:?}", live(&states))));
        }
    };
    eprintln!(
        "chaos: {:.1}s: every invocation acknowledged; waiting for the flights to end",
        started.elapsed().as_secs_f64()
    );
    let (states, stuck) = wait_terminal(&target, chaos.within).await?;
    let elapsed = started.elapsed();
    let mut report = check(&fleet, &target, &load_report, &states).await?;
    report.stuck = stuck;
    report.seed = chaos.seed;
    let on_node = chaos.agents / 2;
    report.cuttable = kills
        .iter()
        .map(|k| match k.victim {
            Victim::Broker => chaos.agents - on_node,
            Victim::Node => on_node,
            Victim::Nats => 0,
        })
        .sum();
    report.kills = kills;
    report.load = load_report;
    report.elapsed = elapsed;
    // The store as a kill leaves it: its log and projections agree.
    tokio::task::block_in_place(|| {
        fleet.relay.kill9();
        report.doctor = doctor(&fleet.relay);
    });
    if std::env::var_os(KEEP_VAR).is_some() {
        if let Some(tmp) = fleet.tmp.take() {
            eprintln!("chaos: kept {}", tmp.keep().display());
        }
    }
    Ok(report)
}

/// How long, once the load is over and flights are still live, no new task may reach a
/// harness before [`reach`] takes those flights as stuck: the kills stop, and the wait
/// for the flights' ends reports them (the test then also misses kills).
pub const STALLED: Duration = Duration::from_secs(10);

/// Waits until the harnesses have received `mark` tasks; returns how many they have.
/// `None` once the load is over and no flight is live (the mark cannot be reached: some
/// flights ended without running), or once the load is over and nothing has run for
/// [`STALLED`].
async fn reach<T>(
    runs_log: &Path,
    mark: usize,
    runner: &tokio::task::JoinHandle<T>,
    target: &Target,
) -> anyhow::Result<Option<usize>> {
    let mut idle_checked = Instant::now();
    let (mut last_ran, mut last_run) = (0, Instant::now());
    loop {
        let ran = count_lines(runs_log)?;
        if ran >= mark {
            return Ok(Some(ran));
        }
        if ran != last_ran {
            (last_ran, last_run) = (ran, Instant::now());
        }
        if runner.is_finished() && idle_checked.elapsed() >= Duration::from_secs(1) {
            idle_checked = Instant::now();
            let states = load::flight_states(target).await?;
            if states.values().all(|s| load::is_terminal(&s.state)) || last_run.elapsed() >= STALLED
            {
                return Ok(None);
            }
        }
        // Asked often: the kill should land close to its mark.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn count_lines(path: &Path) -> anyhow::Result<usize> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(bytes.iter().filter(|b| **b == b'\n').count()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn random_below(rng: &mut StdRng, max: Duration) -> Duration {
    let ms = max.as_millis() as u64;
    Duration::from_millis(if ms == 0 { 0 } else { rng.random_range(0..ms) })
}

async fn kill_and_restart(
    fleet: &mut Fleet,
    target: &Target,
    victim: Victim,
    down: Duration,
) -> anyhow::Result<()> {
    if victim == Victim::Broker {
        target.up.store(false, Ordering::Relaxed);
    }
    tokio::task::block_in_place(|| match victim {
        Victim::Broker => fleet.relay.kill9(),
        Victim::Node => fleet.node.kill9(),
        Victim::Nats => fleet.nats.kill9(),
    });
    tokio::time::sleep(down).await;
    tokio::task::block_in_place(|| match victim {
        Victim::Broker => fleet.relay.restart(),
        Victim::Node => fleet.node.restart(),
        Victim::Nats => fleet.nats.restart(),
    })?;
    if victim == Victim::Broker {
        target.refresh()?;
        target.up.store(true, Ordering::Relaxed);
    }
    Ok(())
}

/// Waits until no flight is live; returns every flight's state and those still live at
/// the deadline.
async fn wait_terminal(
    target: &Target,
    within: Duration,
) -> anyhow::Result<(BTreeMap<String, FlightEnd>, Vec<String>)> {
    match load::wait_all_terminal(target, within).await {
        Ok(states) => Ok((states, Vec::new())),
        Err(_) => {
            let states = load::flight_states(target).await?;
            let stuck = live(&states);
            Ok((states, stuck))
        }
    }
}

/// The flights of `states` not ended, each as its id and state.
fn live(states: &BTreeMap<String, FlightEnd>) -> Vec<String> {
    states
        .iter()
        .filter(|(_, s)| !load::is_terminal(&s.state))
        .map(|(id, s)| format!("{id} {}", s.state))
        .collect()
}

/// A task: (invocation, attempt) of [`load::task_text`].
type Task = (usize, usize);

/// How many times each task reached a harness, and the lines that name no task.
fn read_runs(path: &Path) -> anyhow::Result<(BTreeMap<Task, usize>, Vec<String>)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut runs = BTreeMap::new();
    let mut strange = Vec::new();
    for line in text.lines() {
        match load::task_of(line) {
            Some(task) => *runs.entry(task).or_insert(0) += 1,
            None => strange.push(format!("a harness received {line:?}")),
        }
    }
    Ok((runs, strange))
}

async fn check(
    fleet: &Fleet,
    target: &Target,
    load_report: &LoadReport,
    states: &BTreeMap<String, FlightEnd>,
) -> anyhow::Result<ChaosReport> {
    let (runs, strange) = read_runs(&fleet.runs_log)?;
    let mut r = ChaosReport {
        flights: states.len(),
        runs: runs.values().sum(),
        wrong: strange,
        ..ChaosReport::default()
    };
    r.lost = load_report
        .flights
        .iter()
        .filter(|id| !states.contains_key(*id))
        .cloned()
        .collect();
    let (url, token) = target.api();
    // Each task's flights (to tell one flight run twice from two flights of one task).
    let mut flights_of: BTreeMap<Task, Vec<String>> = BTreeMap::new();
    let client = reqwest::Client::new();
    for (id, end) in states {
        match end.state.as_str() {
            "completed" => {
                r.completed += 1;
                let output = &end.output;
                let task = output.as_deref().and_then(load::task_of);
                if let Some(task) = task {
                    flights_of
                        .entry(task)
                        .or_default()
                        .push(format!("{id} completed"));
                }
                match task {
                    Some(task) if runs.get(&task).is_some_and(|n| *n >= 1) => {}
                    _ => r.wrong.push(format!(
                        "{id} completed with {output:?}, a task no harness received"
                    )),
                }
            }
            "failed" => {
                let replay: Value = client
                    .get(format!("{url}/v1/replay/flights/{id}"))
                    .bearer_auth(&token)
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let task = replay["invocation"]["task"]
                    .as_str()
                    .and_then(load::task_of);
                let error = end.error.clone().unwrap_or_default();
                if let Some(task) = task {
                    flights_of
                        .entry(task)
                        .or_default()
                        .push(format!("{id} failed: {error}"));
                }
                *r.errors
                    .entry(error.chars().take(100).collect())
                    .or_insert(0) += 1;
                if task.is_some_and(|t| runs.contains_key(&t)) {
                    r.cut += 1;
                    let seen_start = replay["entries"].as_array().is_some_and(|entries| {
                        entries.iter().any(|e| {
                            e["kind"] != "state"
                                || matches!(
                                    e["to"].as_str(),
                                    Some("waking" | "running" | "waiting")
                                )
                        })
                    });
                    if !seen_start {
                        r.cut_unseen += 1;
                    }
                } else if error.contains("may have partly run") {
                    r.cut_at_start += 1;
                } else {
                    r.never_started_failed.push(format!("{id}: {error}"));
                }
            }
            "live" | "queued" | "waking" | "running" | "waiting" => {}
            other => r.wrong.push(format!("{id} ended {other}: {:?}", end.error)),
        }
    }
    r.run_twice = runs
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(task, n)| {
            format!(
                "{} received {n} times, its flights: {:?}",
                load::task_text(task.0, task.1),
                flights_of.get(task)
            )
        })
        .collect();
    Ok(r)
}

/// `relay doctor` on the stopped data dir: `None` if the log has no gap and every
/// projection equals a rebuild from it, else what it said.
fn doctor(relay: &RelayProcess) -> Option<String> {
    let out = relay_cmd_with(&relay.bin, &relay.data_dir, &["doctor", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Some(format!(
            "failed: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let report: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Some(format!("not JSON ({e}): {text}")),
    };
    let clean = report["consistent"] == true
        && report["gaps"] == serde_json::json!([])
        && report["mismatched_trees"] == serde_json::json!([]);
    (!clean).then(|| report.to_string())
}
