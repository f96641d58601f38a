//! Load: a real `relay up` (and a real `relay node`), a real nats-server, 20 agents whose
//! harness answers at once, 32 HTTP clients and 64 NATS invokers sending 2,000
//! invocations together. Every acknowledged invocation must end, `GET /v1/status` must
//! keep answering all along, and the store must equal a rebuild from its log, also when
//! the broker is killed with SIGKILL three times during the load. And chaos: the broker,
//! a node and nats-server killed with SIGKILL at random points under 32 clients, where
//! nothing may be lost, stuck, run twice or failed that had not started
//! (`relay_tests::chaos`; `ops/chaos.sh` is the longer run).
//!
//! Nothing here asserts a time: the figures are printed (`--nocapture`) for the record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::Rng;
use relay_tests::chaos::{self, Chaos, SEED_VAR};
use relay_tests::load::{self, Load, LoadReport, Target};
use relay_tests::nats::NatsServer;
use relay_tests::wait::wait_until_every;
use relay_tests::{relay_cmd, NodeProcess, RelayProcess};

const AGENTS: usize = 20;
const HTTP_CLIENTS: usize = 32;
const NATS_CLIENTS: usize = 64;
const INVOCATIONS: usize = 2000;
/// A deadline against a hang, not a measure: the load takes seconds.
const WITHIN: Duration = Duration::from_secs(300);

fn load(nats: &NatsServer, agents: Vec<String>) -> Load {
    Load {
        agents,
        http_clients: HTTP_CLIENTS,
        nats_clients: NATS_CLIENTS,
        invocations: INVOCATIONS,
        nats_url: Some(nats.url()),
        acked: Default::default(),
        within: WITHIN,
    }
}

fn print(what: &str, report: &LoadReport, done: Duration) {
    eprintln!(
        "{what}: {} flights acknowledged in {:.2}s ({:.0}/s), all ended after {:.2}s ({:.0} flights/s); \
         {} overloaded, {} unreachable; probed {} times, longest /v1/status {:.1} ms, /v1/agents {:.1} ms",
        report.flights.len(),
        report.submit_time.as_secs_f64(),
        report.flights.len() as f64 / report.submit_time.as_secs_f64(),
        done.as_secs_f64(),
        report.flights.len() as f64 / done.as_secs_f64(),
        report.overloaded,
        report.unreachable,
        report.status_probes,
        report.status_max.as_secs_f64() * 1000.0,
        report.read_max.as_secs_f64() * 1000.0,
    );
}

/// Every acknowledged flight is in the store and ended as `expected` says.
fn check_flights(
    report: &LoadReport,
    states: &BTreeMap<String, load::FlightEnd>,
    expected: impl Fn(&str) -> bool,
) {
    assert!(report.refused.is_empty(), "refused: {:?}", report.refused);
    let mut wrong = Vec::new();
    for id in &report.flights {
        let end = states
            .get(id)
            .unwrap_or_else(|| panic!("acknowledged flight {id} is not in the store"));
        if !expected(&end.state) {
            wrong.push((id, end));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} flights ended otherwise, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// `relay doctor` on the stopped data dir: the log has no gap and every projection equals
/// a rebuild from it.
fn doctor(relay: &RelayProcess) -> serde_json::Value {
    let out = relay_cmd(&relay.data_dir, &["doctor", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "relay doctor failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(report["consistent"], true, "{report}");
    assert_eq!(report["gaps"], serde_json::json!([]), "{report}");
    assert_eq!(
        report["mismatched_trees"],
        serde_json::json!([]),
        "{report}"
    );
    report
}

async fn run_and_check(relay: &mut RelayProcess, load: Load, what: &str) {
    let target = Target::new(&relay.data_dir).unwrap();
    let started = std::time::Instant::now();
    let report = load::run(&load, &target)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nbroker log tail:\n{}", tail(&relay.log_text())));
    let states = load::wait_all_terminal(&target, WITHIN)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nbroker log tail:\n{}", tail(&relay.log_text())));
    print(what, &report, started.elapsed());
    assert_eq!(report.flights.len(), INVOCATIONS);
    assert_eq!(
        report.status_hangs, 0,
        "/v1/status or /v1/agents stopped answering"
    );
    assert!(report.status_probes > 0);
    check_flights(&report, &states, |s| s == "completed");
    relay.terminate().unwrap();
    let doc = doctor(relay);
    assert!(
        doc["events"].as_u64().unwrap() > INVOCATIONS as u64,
        "{doc}"
    );
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A nats-server, `relay up --nats` and, with `node`, a `relay node` of that name serving
/// the agents; 20 instant agents; the load ready to run.
struct Setup {
    _tmp: tempfile::TempDir,
    nats: NatsServer,
    relay: RelayProcess,
    /// Kept alive (serving its agents) as long as the setup.
    _node: Option<NodeProcess>,
    load: Load,
}

fn setup(node: Option<&str>) -> Setup {
    let nats = NatsServer::start().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let relay =
        RelayProcess::start_with(&tmp.path().join("data"), &["--nats", &nats.url()], &[]).unwrap();
    let node_process =
        node.map(|n| NodeProcess::start(n, &tmp.path().join(n), &nats.url(), &relay).unwrap());
    let agents = load::add_instant_agents(&relay, AGENTS, node);
    let load = load(&nats, agents);
    Setup {
        _tmp: tmp,
        nats,
        relay,
        _node: node_process,
        load,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_broker_serves_32_http_clients_and_64_nats_invokers() {
    let mut s = setup(None);
    run_and_check(&mut s.relay, s.load.clone(), "embedded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_serves_the_same_load() {
    let mut s = setup(Some("n1"));
    // The node (in `s`) serves every agent until the end.
    run_and_check(&mut s.relay, s.load.clone(), "node").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_the_broker_three_times_under_load_loses_nothing() {
    let Setup {
        _tmp,
        nats: _nats,
        mut relay,
        _node: _,
        load,
    } = setup(None);
    let target = Target::new(&relay.data_dir).unwrap();
    let started = std::time::Instant::now();
    let runner = {
        let (load, target) = (load.clone(), target.clone());
        tokio::spawn(async move { load::run(&load, &target).await })
    };
    // Three kills at random points of the load, each once that many invocations were
    // acknowledged (an event to wait for, not a time).
    let mut marks: Vec<usize> = (0..3)
        .map(|_| rand::rng().random_range(INVOCATIONS / 10..INVOCATIONS * 9 / 10))
        .collect();
    marks.sort_unstable();
    let mut kills = 0;
    for mark in marks {
        // Asked often: the kill should land close to its mark.
        wait_until_every(
            Duration::from_millis(5),
            format!("{mark} acknowledged invocations, or the end of the load"),
            WITHIN,
            || async {
                (load.acked.load(Ordering::Relaxed) >= mark || runner.is_finished()).then_some(())
            },
        )
        .await;
        if runner.is_finished() {
            break;
        }
        target.up.store(false, Ordering::Relaxed);
        tokio::task::block_in_place(|| {
            relay.kill9();
            relay.restart().unwrap();
        });
        target.refresh().unwrap();
        target.up.store(true, Ordering::Relaxed);
        kills += 1;
    }
    let report = runner.await.unwrap().unwrap();
    let states = load::wait_all_terminal(&target, WITHIN)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nbroker log tail:\n{}", tail(&relay.log_text())));
    print(&format!("kill -9 x{kills}"), &report, started.elapsed());
    assert_eq!(kills, 3, "the load ended before the third kill");
    assert_eq!(
        report.status_hangs, 0,
        "/v1/status or /v1/agents stopped answering"
    );
    // None stays live, none is lost. A flight fails only because a kill cut a turn that
    // had started (it is not run twice); one still queued is dispatched again after
    // the restart and completes. (Several flights of one agent can be cut by one kill:
    // a turn's start is on disk at once, its reports a little later.)
    check_flights(&report, &states, |s| s == "completed" || s == "failed");
    let failed: Vec<_> = report
        .flights
        .iter()
        .filter(|id| states[*id].state == "failed")
        .collect();
    for id in &failed {
        let error = states[*id].error.clone().unwrap_or_default();
        let cut_turn = error.starts_with("relay stopped just as this flight's turn started")
            || ["waking", "running", "waiting"]
                .iter()
                .any(|s| error.starts_with(&format!("relay stopped while this flight was {s}")));
        assert!(cut_turn, "{id} failed: {error}");
    }
    // (A queued flight failed at restart would read "... was queued" and fail the check
    // above.) A sanity bound on top: cut turns are a small part of the load.
    assert!(
        failed.len() <= INVOCATIONS / 10,
        "{} flights failed for {kills} kills",
        failed.len()
    );
    eprintln!(
        "acknowledged flights: {} completed, {} failed by a kill",
        report.flights.len() - failed.len(),
        failed.len()
    );
    // The store as a kill leaves it: its log and projections agree.
    relay.kill9();
    doctor(&relay);
}

/// Chaos: `kill -9` of the broker, the node and nats-server, each three times in a seeded
/// random order at random points of the work, under 32 concurrent clients (16 HTTP, 16 NATS) over 8 agents,
/// half of them the node's, each turn held a little so invocations queue behind it.
/// Nothing lost, nothing stuck, nothing run twice, no flight failed that never started,
/// and `relay doctor` clean (`relay_tests::chaos`). The seed is printed; set
/// `RELAY_CHAOS_SEED` to repeat its choices. `ops/chaos.sh` is the longer run.
#[tokio::test(flavor = "multi_thread")]
async fn chaos_kill_9_of_broker_node_and_nats_loses_nothing_and_fails_only_cut_turns() {
    let seed = Chaos::seed_from_env().unwrap();
    eprintln!("chaos seed {seed} (set {SEED_VAR}={seed} to repeat its choices)");
    let chaos = Chaos {
        seed,
        agents: 8,
        http_clients: 16,
        nats_clients: 16,
        invocations: CHAOS_INVOCATIONS,
        kills: CHAOS_KILLS,
        turn: Duration::from_millis(20),
        down: Duration::from_millis(500),
        // The load's and then the ends' deadline, each: both together (and the 10 s that
        // may pass between them, `chaos::STALLED`) well within nextest's timeout
        // (.config/nextest.toml), so a hang fails with the report of what is stuck rather
        // than being killed from outside with nothing said.
        within: CHAOS_WITHIN,
    };
    let report = chaos::run(&chaos)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: {e:#}"));
    eprintln!("{report}");
    let violations = report.violations();
    assert!(
        violations.is_empty(),
        "seed {seed}:\n{}\n{report}",
        violations.join("\n")
    );
    assert_eq!(report.kills.len(), CHAOS_KILLS, "{report}");
    assert_eq!(report.load.flights.len(), CHAOS_INVOCATIONS, "{report}");
    // Every completed flight's task reached a harness once: the runs are at least those.
    assert!(report.runs >= report.completed, "{report}");
}

const CHAOS_INVOCATIONS: usize = 900;
const CHAOS_WITHIN: Duration = Duration::from_secs(100);
const CHAOS_KILLS: usize = 9;
