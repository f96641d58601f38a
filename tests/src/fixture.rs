//! The v1 fixture (issue 30's migration test): a data dir written by v1 code through the
//! real broker, with every event kind (`relay-fixture-v1` makes it), and what every reader
//! answered on it: listings, flights and their updates, replays (HTTP and the CLI's text
//! and `--json`), watches and the whole event stream. A later broker opened on the same
//! data must answer the same bytes.
//!
//! The expected outputs are keyed by the request that makes them (`GET /v1/flights`,
//! `CLI replay flight ID --json`, `SSE-ALL /v1/watch?flight=ID`...), so the checker asks
//! exactly what the generator asked: [`fetch`] is the one place that turns a key into
//! bytes, for both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::RelayProcess;

/// Where the fixture lives: `tests/fixtures/v1`.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/v1")
}

/// The packed data dir (`data/` inside).
pub const DATA_TAR: &str = "data.tar.gz";
/// The recorded outputs.
pub const EXPECTED: &str = "expected.json";

/// Fields of `GET /v1/status` that differ per start, not per data: dropped before the
/// comparison (`data_dir` is where the dir was unpacked).
pub const STATUS_EXCLUDED: &[&str] = &[
    "version",
    "data_dir",
    "uptime_ms",
    "flushes",
    "disk",
    "nats",
];

/// Files of a stopped data dir that are not data: the running broker's address, token
/// and pid (`api.json`, written at each start), its lock, the dashboard's login key and
/// revoked logins (secrets of one machine), logs. Left out of the tarball.
pub const NOT_DATA: &[&str] = &[
    "api.json",
    "relay.pid",
    "relay.lock",
    "dashboard.key",
    "dashboard.revoked",
    "*.sock",
    "*.log",
];

/// What the fixture records, besides the outputs.
pub fn exclusions() -> Vec<String> {
    let mut out: Vec<String> = STATUS_EXCLUDED
        .iter()
        .map(|f| format!("GET /v1/status: field {f} (differs per start or per machine)"))
        .collect();
    out.extend([
        "SSE: comment lines (keep-alives, sent on a timer) are dropped".to_string(),
        "SSE-FIRST: only the first event (the snapshot) of a watch that never ends".to_string(),
        "GET /v1/agents/NAME/budget: today's use and resets_at depend on today".to_string(),
        "GET /v1/flights/ID/diff, /v1/agents/NAME/diff, /peek: read git or tmux now, not the data"
            .to_string(),
        "GET /metrics: counters since the process started".to_string(),
        "GET /v1/flights?since=30m and other durations: relative to now (an absolute ms is recorded)"
            .to_string(),
        "CLI: run with TZ=UTC and NO_COLOR=1; stdout and the exit code (stderr only on failure)"
            .to_string(),
        "CLI text that says relative times (flight list, approvals, rule list, agent show, flight show): only their --json"
            .to_string(),
        "GET /v1/events/{seq}: no such route in v1".to_string(),
        "relay events --json: the CLI prints GET /v1/events, compared already (and 500 KB more)"
            .to_string(),
    ]);
    out.extend(
        NOT_DATA
            .iter()
            .map(|f| format!("data.tar.gz: {f} left out")),
    );
    out
}

/// `expected.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Expected {
    /// The commit of the code that generated it (`+dirty` when the tree had changes).
    pub commit: String,
    /// What is not compared, and why.
    pub excluded: Vec<String>,
    /// How many events of each `type` the data holds.
    pub event_types: BTreeMap<String, u64>,
    /// Request key -> the exact text answered.
    pub outputs: BTreeMap<String, String>,
}

/// Reads `tests/fixtures/v1/expected.json`.
pub fn load_expected() -> anyhow::Result<Expected> {
    let path = dir().join(EXPECTED);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| path.display().to_string())
}

/// Unpacks the fixture's data dir into `dest`; the data dir (`dest/data`).
pub fn unpack_v1(dest: &Path) -> anyhow::Result<PathBuf> {
    unpack(&dir().join(DATA_TAR), dest)
}

/// Unpacks the archive `tar` (of [`pack`]) into `dest`; the data dir (`dest/data`).
pub fn unpack(tar: &Path, dest: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dest)?;
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(tar)
        .arg("-C")
        .arg(dest)
        .output()
        .context("running tar")?;
    if !out.status.success() {
        bail!(
            "tar -xzf {}: {}",
            tar.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(dest.join("data"))
}

/// Packs the stopped data dir `data` as `out` (its files under `data/`, sorted, owner
/// and times fixed so the same files give the same archive), without [`NOT_DATA`].
pub fn pack(data: &Path, out: &Path) -> anyhow::Result<()> {
    let parent = data.parent().context("the data dir has no parent")?;
    let staged = parent.join("fixture-stage");
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir_all(&staged)?;
    let copy = Command::new("cp")
        .arg("-a")
        .arg(data)
        .arg(staged.join("data"))
        .status()?;
    anyhow::ensure!(copy.success(), "cp -a {}", data.display());
    let mut cmd = Command::new("tar");
    cmd.arg("--sort=name")
        .arg("--mtime=@0")
        .arg("--owner=0")
        .arg("--group=0")
        .arg("--numeric-owner");
    for f in NOT_DATA {
        cmd.arg(format!("--exclude={f}"));
    }
    cmd.arg("-czf").arg(out).arg("-C").arg(&staged).arg("data");
    let status = cmd.status()?;
    let _ = std::fs::remove_dir_all(&staged);
    anyhow::ensure!(status.success(), "tar -czf {}", out.display());
    Ok(())
}

/// Every event, from the paged `GET /v1/events`.
pub async fn all_events(relay: &RelayProcess) -> anyhow::Result<Vec<Value>> {
    let http = relay.http();
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let (code, page) = http
            .try_request(
                reqwest::Method::GET,
                &format!("/v1/events?after={after}&limit=1000"),
                None,
            )
            .await?;
        anyhow::ensure!(code == 200, "GET /v1/events: {code} {page}");
        let page = page.as_array().cloned().unwrap_or_default();
        let Some(last) = page.last().and_then(|e| e["seq"].as_u64()) else {
            return Ok(events);
        };
        after = last;
        events.extend(page);
    }
}

/// How many events of each `type`.
pub fn event_types(events: &[Value]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for e in events {
        let t = e["type"].as_str().unwrap_or("?").to_string();
        *counts.entry(t).or_insert(0) += 1;
    }
    counts
}

/// The request keys to record for the data `events` describe: every listing, and each
/// agent, conversation, flight and rule the log ever named.
pub fn keys(events: &[Value]) -> Vec<String> {
    let mut agents = Vec::new();
    let mut conversations = Vec::new();
    let mut flights = Vec::new();
    let mut rules = Vec::new();
    let mut created = Vec::new();
    for e in events {
        let push = |list: &mut Vec<String>, v: &Value| {
            if let Some(s) = v.as_str() {
                if !list.iter().any(|x| x == s) {
                    list.push(s.to_string());
                }
            }
        };
        match e["type"].as_str().unwrap_or("") {
            "agent_registered" => push(&mut agents, &e["agent"]["name"]),
            "conversation_created" => push(&mut conversations, &e["conversation"]["id"]),
            "invocation_created" => {
                push(&mut flights, &e["flight"]["id"]);
                created.extend(e["flight"]["created_at"].as_u64());
            }
            "rule_added" => push(&mut rules, &e["rule"]["id"]),
            _ => {}
        }
    }
    let last_seq = events.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
    let mut k: Vec<String> = [
        "GET /v1/status",
        "GET /v1/agents",
        "GET /v1/conversations",
        "GET /v1/flights",
        "GET /v1/flights?limit=3",
        "GET /v1/flights?live=true",
        "GET /v1/flights?state=completed&limit=1000",
        "GET /v1/flights?state=failed",
        "GET /v1/flights?state=cancelled",
        "GET /v1/flights?q=ok&limit=1000",
        "GET /v1/flights?q=PANE",
        "GET /v1/flights?q=nothing-has-this",
        "GET /v1/approvals",
        "GET /v1/approvals?state=all",
        "GET /v1/approvals?state=pending",
        "GET /v1/approvals?state=decided",
        "GET /v1/approvals?state=expired",
        "GET /v1/rules",
        "GET /v1/usage?since=0",
        "GET /v1/usage?by=agent&since=0",
        "GET /v1/usage?by=conversation&since=0",
        "GET /v1/usage?by=tree&since=0",
        "GET /v1/usage?by=day&since=0",
        "GET /v1/usage?by=node&since=0",
        "SSE-FIRST /v1/watch?fleet=true",
        // The CLI's listings: text where it says no relative time ("1m ago"), JSON.
        "CLI agent list",
        "CLI agent list --json",
        "CLI conversation list",
        "CLI flight list --json",
        "CLI approvals --state all --json",
        "CLI rule list --json",
        "CLI usage --since 2020-01-01",
        "CLI usage --since 2020-01-01 --by agent --json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // `since` as an absolute time: the middle flight's creation, and one ms after it.
    created.sort_unstable();
    if let Some(mid) = created.get(created.len() / 2) {
        k.push(format!("GET /v1/flights?since={mid}&limit=1000"));
        k.push(format!("GET /v1/flights?since={}&q=ok", mid + 1));
        k.push(format!("GET /v1/usage?by=agent&since={mid}"));
    }
    k.push(format!("GET /v1/events?after=0&limit={}", last_seq.max(1)));
    k.push(format!("GET /v1/events?after={}&limit=5", last_seq / 2));
    k.push(format!("SSE-UNTIL {last_seq} /v1/events/stream?after=0"));
    k.push(format!(
        "SSE-UNTIL {last_seq} /v1/events/stream?after={}",
        last_seq.saturating_sub(10)
    ));
    for a in &agents {
        k.push(format!("GET /v1/agents/{a}"));
        k.push(format!("GET /v1/flights?agent={a}&limit=1000"));
        k.push(format!("GET /v1/rules?agent={a}"));
        k.push(format!("GET /v1/usage?by=agent&since=0&agent={a}"));
        k.push(format!("GET /v1/replay/agents/{a}"));
        k.push(format!("CLI replay agent {a}"));
        k.push(format!("CLI replay agent {a} --json"));
        k.push(format!("CLI agent show {a} --json"));
        k.push(format!("SSE-FIRST /v1/watch?agent={a}"));
    }
    for c in &conversations {
        k.push(format!("GET /v1/conversations/{c}/messages?limit=1000"));
        k.push(format!("GET /v1/conversations/{c}/messages?limit=2"));
        k.push(format!("GET /v1/replay/conversations/{c}"));
        k.push(format!("CLI replay conversation {c}"));
        k.push(format!("CLI replay conversation {c} --json"));
        k.push(format!("CLI read {c}"));
        k.push(format!("CLI read {c} --json"));
        k.push(format!("SSE-FIRST /v1/watch?conversation={c}"));
    }
    for f in &flights {
        k.push(format!("GET /v1/flights/{f}"));
        k.push(format!("GET /v1/flights/{f}/updates"));
        k.push(format!("GET /v1/flights/{f}/tree"));
        k.push(format!("GET /v1/replay/flights/{f}"));
        k.push(format!("CLI replay flight {f}"));
        k.push(format!("CLI replay flight {f} --json"));
        k.push(format!("CLI flight show {f} --json"));
        k.push(format!("SSE-ALL /v1/flights/{f}/stream"));
        k.push(format!("SSE-ALL /v1/watch?flight={f}"));
    }
    for r in &rules {
        k.push(format!("GET /v1/rules/{r}"));
    }
    k
}

/// Every output of `keys`, as `relay` answers now.
pub async fn collect(
    relay: &RelayProcess,
    keys: &[String],
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for key in keys {
        let text = fetch(relay, key).await.with_context(|| key.clone())?;
        out.insert(key.clone(), text);
    }
    Ok(out)
}

/// How long one request may take.
const WITHIN: Duration = Duration::from_secs(30);

/// What `relay` answers to one key, as text: `GET PATH` the status line and the body as
/// sent (`/v1/status` without [`STATUS_EXCLUDED`]); `CLI ARGS` the exit code and stdout;
/// `SSE-ALL PATH` the stream to its end, `SSE-FIRST PATH` its first event,
/// `SSE-UNTIL SEQ PATH` up to the event whose `id:` is SEQ (comments dropped).
pub async fn fetch(relay: &RelayProcess, key: &str) -> anyhow::Result<String> {
    let (verb, rest) = key.split_once(' ').context("a key is VERB ARGS")?;
    match verb {
        "GET" => get(relay, rest).await,
        "CLI" => cli(relay, rest).await,
        "SSE-ALL" => sse(relay, rest, Stop::End).await,
        "SSE-FIRST" => sse(relay, rest, Stop::First).await,
        "SSE-UNTIL" => {
            let (seq, path) = rest.split_once(' ').context("SSE-UNTIL SEQ PATH")?;
            sse(relay, path, Stop::Id(seq.to_string())).await
        }
        _ => bail!("unknown key verb {verb}"),
    }
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().timeout(WITHIN).build()?)
}

async fn get(relay: &RelayProcess, path: &str) -> anyhow::Result<String> {
    let resp = client()?
        .get(format!("{}{path}", relay.api.url))
        .bearer_auth(&relay.api.token)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let body = resp.text().await?;
    let body = if path == "/v1/status" {
        let mut v: Value = serde_json::from_str(&body)?;
        if let Some(map) = v.as_object_mut() {
            for f in STATUS_EXCLUDED {
                map.remove(*f);
            }
        }
        v.to_string()
    } else {
        body
    };
    Ok(format!("{status}\n{body}"))
}

async fn cli(relay: &RelayProcess, args: &str) -> anyhow::Result<String> {
    let args: Vec<String> = args.split(' ').map(str::to_string).collect();
    let bin = relay.bin.clone();
    let data = relay.data_dir.clone();
    // The CLI blocks: off the async workers.
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin)
            .args(&args)
            .env("RELAY_DATA_DIR", data)
            .env("TZ", "UTC")
            .env("NO_COLOR", "1")
            .env_remove("RELAY_URL")
            .env_remove("RELAY_TOKEN")
            .stdin(std::process::Stdio::null())
            .output()
    })
    .await??;
    let code = out.status.code().map_or("signal".into(), |c| c.to_string());
    let mut text = format!("exit {code}\n{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        text.push_str(&format!(
            "\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

enum Stop {
    End,
    First,
    Id(String),
}

async fn sse(relay: &RelayProcess, path: &str, stop: Stop) -> anyhow::Result<String> {
    let resp = client()?
        .get(format!("{}{path}", relay.api.url))
        .bearer_auth(&relay.api.token)
        .send()
        .await?;
    let status = resp.status().as_u16();
    if status != 200 {
        // An error is a JSON body, not a stream.
        return Ok(format!("{status}\n{}", resp.text().await?));
    }
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut out = format!("{status}\n");
    let read = async {
        loop {
            // Whole events first: each ends with a blank line.
            while let Some(end) = find_blank_line(&buf) {
                let block: Vec<u8> = buf.drain(..end).collect();
                let block = String::from_utf8_lossy(&block);
                let kept: Vec<&str> = block
                    .lines()
                    .filter(|l| !l.is_empty() && !l.starts_with(':'))
                    .collect();
                if kept.is_empty() {
                    continue;
                }
                out.push_str(&kept.join("\n"));
                out.push_str("\n\n");
                let done = match &stop {
                    Stop::End => false,
                    Stop::First => true,
                    Stop::Id(id) => kept
                        .iter()
                        .any(|l| l.strip_prefix("id:").map(str::trim) == Some(id)),
                };
                if done {
                    return Ok(());
                }
            }
            match stream.next().await {
                Some(chunk) => buf.extend_from_slice(&chunk?),
                None if matches!(stop, Stop::End) => {
                    // What is left without a blank line after it, as sent.
                    out.push_str(&String::from_utf8_lossy(&buf));
                    return Ok(());
                }
                None => bail!("the stream ended early: {out}"),
            }
        }
    };
    tokio::time::timeout(WITHIN, read)
        .await
        .map_err(|_| anyhow::anyhow!("the stream took over {WITHIN:?}: {out}"))??;
    Ok(out)
}

/// The end (past the blank line) of the first event in `buf`, if it holds a whole one.
fn find_blank_line(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Fetches every output of `expected` from `relay` and compares it byte for byte; fails
/// with a readable diff of each that differs (and of the keys `relay`'s own log would
/// ask that the fixture does not have, or the other way round).
pub async fn assert_outputs_equal(relay: &RelayProcess, expected: &Expected) {
    let mut failures = Vec::new();
    match all_events(relay).await {
        Ok(events) => {
            let now: Vec<String> = keys(&events);
            let want: Vec<&String> = expected.outputs.keys().collect();
            let mut now_sorted: Vec<&String> = now.iter().collect();
            now_sorted.sort();
            if now_sorted != want {
                let missing: Vec<_> = want.iter().filter(|k| !now.contains(k)).collect();
                let extra: Vec<_> = now.iter().filter(|k| !want.contains(k)).collect();
                failures.push(format!(
                    "the log names other things than the fixture's: keys missing now {missing:?}, new keys {extra:?}"
                ));
            }
        }
        Err(e) => failures.push(format!("reading the events: {e:#}")),
    }
    for (key, want) in &expected.outputs {
        match fetch(relay, key).await {
            Ok(got) if &got == want => {}
            Ok(got) => failures.push(format!("{key}:\n{}", diff(want, &got))),
            Err(e) => failures.push(format!("{key}: {e:#}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} outputs differ from the v1 fixture (generated at {}):\n\n{}",
        failures.len(),
        expected.outputs.len(),
        expected.commit,
        failures.join("\n\n")
    );
}

/// A readable difference: JSON bodies pretty-printed, then the lines around the first
/// and last that differ.
pub fn diff(want: &str, got: &str) -> String {
    let (pw, pg) = (pretty(want), pretty(got));
    if pw == pg {
        let at = want
            .bytes()
            .zip(got.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(want.len().min(got.len()));
        let show = |s: &str| {
            s.get(at.saturating_sub(40)..(at + 80).min(s.len()))
                .unwrap_or("")
                .to_string()
        };
        return format!(
            "  the same JSON values, other bytes (key order, spacing?) from byte {at}:\n  - {}\n  + {}",
            show(want),
            show(got)
        );
    }
    let (w, g): (Vec<&str>, Vec<&str>) = (pw.lines().collect(), pg.lines().collect());
    let head = w.iter().zip(&g).take_while(|(a, b)| a == b).count();
    let tail = w[head..]
        .iter()
        .rev()
        .zip(g[head..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let from = head.saturating_sub(3);
    let mut out = Vec::new();
    for l in &w[from..head] {
        out.push(format!("    {l}"));
    }
    let cap = 40;
    for l in w[head..w.len() - tail].iter().take(cap) {
        out.push(format!("  - {l}"));
    }
    for l in g[head..g.len() - tail].iter().take(cap) {
        out.push(format!("  + {l}"));
    }
    for l in w[w.len() - tail..].iter().take(3) {
        out.push(format!("    {l}"));
    }
    out.join("\n")
}

/// Each line of `s`, JSON ones pretty-printed (a `GET`'s body is one line).
fn pretty(s: &str) -> String {
    s.lines()
        .map(|l| {
            let json = l.strip_prefix("data:").map_or(l, str::trim_start);
            match serde_json::from_str::<Value>(json) {
                Ok(v @ (Value::Object(_) | Value::Array(_))) => {
                    serde_json::to_string_pretty(&v).unwrap_or_else(|_| l.to_string())
                }
                _ => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}
