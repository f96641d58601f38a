//! `relay-fixture-v1`: makes the v1 fixture of issue 30's migration test
//! (`tests/fixtures/v1/`, see `relay_tests::fixture`). A real `relay up` with a real
//! nats-server, a `relay node`, a tmux pane agent, a worktree agent and the real pinned
//! Codex against the mock model is driven through the CLI and HTTP through every kind of
//! event; the broker is stopped cleanly, its data dir packed (`data.tar.gz`); the archive
//! is unpacked elsewhere (where none of the agents' files are) and a broker started on
//! it, whose answers to every reader are recorded, twice, and must agree
//! (`expected.json`, with the commit this ran at).
//!
//! Run it on the code whose store it records (v1), after `cargo build -p relay-cli -p
//! relay-tests --bins`: `target/debug/relay-fixture-v1 [--out DIR]`.

// A generator, not a product: a failed step ends it with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use relay_mock_model::{CODEX_APPLY_PATCH_MODEL, WRITE_FILE_RULE};
use relay_tests::agents::{state, Env};
use relay_tests::fixture::{self, Expected};
use relay_tests::nats::{json_request, NatsServer};
use relay_tests::{git, NodeProcess, RelayProcess};
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    /// Where to write `data.tar.gz` and `expected.json`.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The tmux pane's agent (as `tests/tmux.rs` has it): collects a task's lines until
/// Relay's trailer names its flight, then answers `done: <first line>` with `relay reply`.
const PANE_AGENT: &str = r#"#!/bin/sh
esc=$(printf '\033')
printf '\033[?2004hagent> '
task=
while IFS= read -r line; do
  line=${line#"$esc[200~"}
  line=${line%"$esc[201~"}
  case $line in
    "[Relay flight "*)
      flight=${line#"[Relay flight "}
      flight=${flight%%.*}
      first=$(printf '%s\n' "$task" | head -n 1)
      relay reply "$flight" "done: $first"
      task=
      printf 'agent> ' ;;
    *) task="$task$line
" ;;
  esac
done
"#;

/// Git without this machine's configuration, for the broker's worktrees.
const GIT_ENV: &[(&str, &str)] = &[
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
];

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The `relay` beside this program, unless RELAY_BIN says otherwise: set before any
    // thread starts.
    if std::env::var_os("RELAY_BIN").is_none() {
        let beside = std::env::current_exe()?.with_file_name("relay");
        anyhow::ensure!(beside.exists(), "{} is missing", beside.display());
        std::env::set_var("RELAY_BIN", beside);
    }
    let out = args.out.unwrap_or_else(fixture::dir);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(generate(&out))
}

async fn generate(out: &Path) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let scratch = tempfile::tempdir()?;
    let data = scratch.path().join("data");
    let last_seq = drive(&data).await?;
    eprintln!(
        "driven in {:?}; last seq {last_seq} before the stop",
        started.elapsed()
    );

    // A v1 broker's first start after its stop still writes (an agent whose session
    // ended with the stop loses its endpoint): started and stopped until a start writes
    // nothing, the data is what v1 leaves at rest.
    let settled = settle(&data).await?;

    std::fs::create_dir_all(out)?;
    let tar = out.join(fixture::DATA_TAR);
    fixture::pack(&data, &tar)?;
    eprintln!(
        "{}: {} bytes",
        tar.display(),
        std::fs::metadata(&tar)?.len()
    );

    // Recorded where the checker will look: the archive unpacked anew, nothing else.
    let check = tempfile::tempdir()?;
    let unpacked = fixture::unpack(&tar, check.path())?;
    // Opening the data writes nothing (the broker's clean stop wrote its agents'
    // offline states already): a second start finds the log as the first left it.
    let mut relay = RelayProcess::start(&unpacked)?;
    let opened = fixture::all_events(&relay).await?;
    relay.terminate()?;
    anyhow::ensure!(
        opened.len() as u64 == settled,
        "the first start on the packed data wrote events: {} after {settled}",
        opened.len()
    );
    let mut relay = RelayProcess::start(&unpacked)?;
    let events = fixture::all_events(&relay).await?;
    anyhow::ensure!(
        events == opened,
        "a start on the packed data wrote events: {} then {}",
        opened.len(),
        events.len()
    );
    let keys = fixture::keys(&events);
    let first = fixture::collect(&relay, &keys).await?;
    let second = fixture::collect(&relay, &keys).await?;
    for (k, v) in &first {
        anyhow::ensure!(
            second.get(k) == Some(v),
            "{k} answered differently twice:\n{}",
            fixture::diff(v, second.get(k).map_or("", String::as_str))
        );
    }
    let after = fixture::all_events(&relay).await?;
    anyhow::ensure!(after.len() == events.len(), "reading wrote events");
    relay.terminate()?;

    let expected = Expected {
        commit: commit(),
        excluded: fixture::exclusions(),
        event_types: fixture::event_types(&events),
        outputs: first,
    };
    let path = out.join(fixture::EXPECTED);
    std::fs::write(&path, serde_json::to_string_pretty(&expected)? + "\n")?;
    eprintln!(
        "{}: {} outputs, {} bytes; events by type {:?}; in {:?}",
        path.display(),
        expected.outputs.len(),
        std::fs::metadata(&path)?.len(),
        expected.event_types,
        started.elapsed()
    );
    Ok(())
}

/// `git rev-parse HEAD` of this checkout, `+dirty` when it has changes.
fn commit() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .current_dir(dir)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let head = run(&["rev-parse", "HEAD"]);
    // The fixture's own files change with each run: not the code's changes.
    let status = run(&["status", "--porcelain", "--untracked-files=no"]);
    let dirty = status.lines().any(|l| !l.contains("tests/fixtures/"));
    if dirty {
        format!("{head}+dirty")
    } else {
        head
    }
}

fn terminal(f: &Value) -> bool {
    matches!(state(f), "completed" | "failed" | "cancelled")
}

/// Asks `agent` `text` and waits for the flight to end; its id and the flight.
async fn ask(env: &Env, agent: &str, extra: &[&str], text: &str) -> (String, Value) {
    let mut args = vec!["ask", agent, "--no-wait"];
    args.extend_from_slice(extra);
    args.push(text);
    let id = env.relay.cli_ok(&args).trim().to_string();
    let f = env.wait_flight(&id, 90, terminal).await;
    (id, f)
}

/// Asks `agent` to run `cmd` (Codex asks for approval), decides it with `decision`
/// (and `extra`: `--remember agent`), waits for the end.
async fn approved(env: &Env, agent: &str, cmd: &str, decision: &str, extra: &[&str]) -> String {
    let id = env.ask_no_wait(agent, &format!("exec: {cmd}"));
    let a = env.wait_approval(&id).await;
    let approval = a["id"].as_str().unwrap();
    let mut args = vec!["approval", "decide", approval, decision];
    args.extend_from_slice(extra);
    env.relay.cli_ok(&args);
    let f = env.wait_flight(&id, 90, terminal).await;
    eprintln!("{cmd} {decision}: {}", state(&f));
    id
}

/// Asks `cx` to run a command and declines it from a dashboard login (decided by
/// `tester@dashboard`).
async fn declined_on_the_dashboard(env: &Env) -> anyhow::Result<()> {
    let id = env.ask_no_wait("cx", "exec: echo declined-once");
    let a = env.wait_approval(&id).await;
    let cookie = relay_tests::browser::login_cookie(&env.relay, "tester").await;
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/v1/approvals/{}",
            env.relay.api.url,
            a["id"].as_str().unwrap()
        ))
        .header("cookie", cookie)
        .header("x-relay-dashboard", "1")
        .json(&json!({"decision": "decline"}))
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "{}", resp.text().await?);
    let f = env.wait_flight(&id, 90, terminal).await;
    eprintln!("declined on the dashboard: {}", state(&f));
    Ok(())
}

/// Drives a broker on `data` through every event kind, and stops it; its last seq.
async fn drive(data: &Path) -> anyhow::Result<u64> {
    let nats = NatsServer::start()?;
    let prices_dir = tempfile::tempdir()?;
    let prices = prices_dir.path().join("prices.json");
    std::fs::write(
        &prices,
        r#"{"models": {"mock-model": {"input": "1000", "output": 2000}}}"#,
    )?;
    let url = nats.url();
    let up = ["--nats", url.as_str(), "--prices", prices.to_str().unwrap()];
    let mut env = Env::start_in(Some(data), &up, GIT_ENV).await;
    git::repo(&env.work);
    let r = &env.relay;

    // Conversations and messages, a reply, a mention.
    r.cli_ok(&["conversation", "add", "team"]);
    let hello = r.cli_json(&["send", "--to", "team", "--json", "hello team"]);
    let hello_id = hello["message"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    r.cli_ok(&[
        "send",
        "--to",
        "team",
        "--reply-to",
        &hello_id,
        "hello back",
    ]);

    // A Codex agent: completed, with an approval accepted and one declined, a command
    // that fails, a remembered decision and its rule removed, a steer, an interrupt, a
    // failed turn, usage (priced) and a budget.
    env.add_agent("cx", &["--model", "mock-model"]);
    let (first, _) = ask(&env, "cx", &["--conversation", "team"], "first question").await;
    approved(&env, "cx", "echo accepted-once", "accept", &[]).await;
    declined_on_the_dashboard(&env).await?;
    approved(&env, "cx", "false", "accept", &[]).await;
    approved(
        &env,
        "cx",
        "echo remembered",
        "accept",
        &["--remember", "agent"],
    )
    .await;
    let (by_rule, _) = ask(&env, "cx", &[], "exec: echo remembered").await;
    let decided = env.approval_of(&by_rule);
    eprintln!("decided by {}", decided["decided_by"]);
    let rules = r.cli_json(&["rule", "list", "--json"]);
    let rule = rules[0]["id"].as_str().unwrap().to_string();
    r.cli_ok(&["rule", "remove", &rule]);

    let steered = env.ask_no_wait("cx", "slow: a b c d e f");
    env.wait_delta(&steered).await;
    r.cli_ok(&["steer", &steered, "also mention zebras"]);
    env.wait_flight(&steered, 90, terminal).await;
    let cancelled = env.ask_no_wait("cx", "slow: one two three four five six seven eight");
    env.wait_delta(&cancelled).await;
    r.cli_ok(&["interrupt", &cancelled]);
    env.wait_flight(&cancelled, 60, terminal).await;
    ask(&env, "cx", &[], "fail please").await;
    r.cli_ok(&["agent", "set", "cx", "--budget", "10m/day"]);
    // A mention in the conversation starts a consult flight.
    let posted = r.cli_json(&["send", "--to", "team", "--json", "@cx what do you think?"]);
    let consult = posted["flights"][0]["id"].as_str().unwrap().to_string();
    env.wait_flight(&consult, 90, terminal).await;

    // Fork, wake, remove.
    r.cli_ok(&["agent", "fork", "cx", "cx-fork", "--at", &first]);
    env.add_agent("sleeper", &["--wake", "manual"]);
    r.cli_ok(&["agent", "wake", "sleeper"]);
    env.codex_pid("sleeper").await;
    env.add_agent("temp", &[]);
    r.cli_ok(&["agent", "remove", "temp"]);

    // A worktree agent whose flight commits.
    env.add_agent("wt", &["--worktree", "--auto-accept", WRITE_FILE_RULE]);
    let (wrote, f) = ask(&env, "wt", &[], "write:one.txt first file").await;
    anyhow::ensure!(state(&f) == "completed", "{f}");
    env.wait_flight(&wrote, 60, |f| f["commit"]["head"].is_string())
        .await;
    // Its commit reverted (a `reverted` update).
    env.relay.cli_ok(&["revert", &wrote]);
    env.wait_flight(&wrote, 60, |f| {
        f["commit"]["reverted_by"]["commit"].is_string()
    })
    .await;

    // Codex's own edit tool (apply_patch): file_change items and a diff, committed on
    // a second worktree; a model without a price (usage with no cost).
    env.add_agent(
        "patcher",
        &[
            "--worktree",
            "--accept-file-changes",
            "--model",
            CODEX_APPLY_PATCH_MODEL,
        ],
    );
    let (patched, f) = ask(&env, "patcher", &[], "edit:by-patcher.txt patched in").await;
    anyhow::ensure!(state(&f) == "completed", "{f}");
    env.wait_flight(&patched, 60, |f| f["commit"]["head"].is_string())
        .await;

    // A tmux pane agent.
    let script = env.tmp.path().join("pane-agent.sh");
    std::fs::write(&script, PANE_AGENT)?;
    env.add_tmux("pane", &format!("sh {}", script.display()), &[]);
    let (_, f) = ask(&env, "pane", &[], "hello pane").await;
    anyhow::ensure!(state(&f) == "completed", "{f}");

    // An agent served by a node over NATS.
    let node_dir = env.tmp.path().join("node-n1");
    let mut node = NodeProcess::start("n1", &node_dir, &url, &env.relay)?;
    env.add_agent("remote", &["--node", "n1"]);
    let (_, f) = ask(&env, "remote", &[], "hello node").await;
    anyhow::ensure!(state(&f) == "completed", "{f}\n{}", node.log_text());

    // The bus: an invocation and a message over NATS (JSON).
    let bus = async_nats::connect(&url).await?;
    let accepted = json_request(
        &bus,
        "relay.v1.invoke.remote",
        None,
        json!({"task": "asked over the bus", "requester": "bus-client"}),
    )
    .await;
    let over_bus = accepted["flight"]["id"].as_str().unwrap().to_string();
    env.wait_flight(&over_bus, 90, terminal).await;
    json_request(
        &bus,
        "relay.v1.cmd.post",
        None,
        json!({"conversation": "team", "author": "bus-client", "body": "posted over the bus"}),
    )
    .await;
    drop(bus);

    // The thread lost: Codex forgets its sessions while the broker is down.
    env.relay.terminate()?;
    std::fs::remove_dir_all(env.codex_home.join("sessions"))?;
    env.relay.restart()?;
    let (_, f) = ask(&env, "cx", &["--conversation", "team"], "after the loss").await;
    anyhow::ensure!(state(&f) == "completed", "{f}");
    anyhow::ensure!(
        !env.events_of("thread_lost").is_empty(),
        "no thread_lost event"
    );

    let last = quiet(&env.relay).await?;
    env.relay.terminate()?;
    node.terminate()?;
    drop(nats);
    Ok(last)
}

/// Starts and stops a broker on `data` (no bus, no agents' files changed) until a start
/// finds the log as the stop before left it; that last seq.
async fn settle(data: &Path) -> anyhow::Result<u64> {
    let mut before = None;
    for _ in 0..4 {
        let mut relay = RelayProcess::start(data)?;
        let seq = quiet(&relay).await?;
        let at_start = fixture::all_events(&relay).await?.len() as u64;
        relay.terminate()?;
        if before == Some(at_start) && at_start == seq {
            return Ok(seq);
        }
        before = Some(seq);
    }
    anyhow::bail!("every start of the broker writes events")
}

/// Waits until nothing more is written (a commit or an agent's idle state can come a
/// moment after a flight's end): the last seq, once it held for a second.
async fn quiet(relay: &RelayProcess) -> anyhow::Result<u64> {
    let mut last = (0, std::time::Instant::now());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, s) = relay.http().get("/v1/status").await;
        let seq = s["last_seq"].as_u64().unwrap_or(0);
        let live = s["live_flights"].as_u64().unwrap_or(1);
        if seq != last.0 || live != 0 {
            last = (seq, std::time::Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(1) {
            return Ok(seq);
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the broker never went quiet"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
