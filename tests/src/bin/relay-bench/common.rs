//! What every part uses: starting brokers and agents, invoking and following flights, the raw NATS baselines, RSS.

use super::*;

impl Bench {
    pub(crate) fn start_relay(
        &self,
        name: &str,
        nats: &NatsServer,
    ) -> anyhow::Result<RelayProcess> {
        let dir = self.tmp.path().join(name);
        blocking(|| {
            RelayProcess::start_bin(
                &self.relay,
                &dir,
                // Scenario 1's flight streams 32 MB, and scenario 9's burst as much: over
                // relay up's default cap of 8 MiB per flight, which would fail them.
                &["--nats", &nats.url(), "--max-flight-output", "1073741824"],
                // The default of `relay up` (unless RELAY_TEST_LOG says otherwise).
                &[("RUST_LOG", &relay_tests::test_log_filter("info"))],
            )
        })
    }

    /// Registers agents served by relay-instant-codex, `concurrency` requests at once.
    pub(crate) async fn add_agents(
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
                api.post::<_, Value>(&["v1", "agents"], &spec)
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

pub(crate) fn api(relay: &RelayProcess) -> relay_client::Client {
    relay_client::Client::new(&relay.api.url, &relay.api.token).unwrap()
}

/// A NATS client whose subscriptions hold up to 2M messages (the default 64K drops the
/// rest of a fast stream the bench reads a little slower than it comes).
pub(crate) async fn connect(url: &str) -> anyhow::Result<async_nats::Client> {
    Ok(async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 21)
        .connect(url)
        .await?)
}

/// SIZE bytes starting with the time now, as relay-instant-codex writes its deltas.
pub(crate) fn delta_text(size: usize) -> String {
    let mut text = format!("{:020}", now_nanos());
    text.truncate(size);
    while text.len() < size {
        text.push('.');
    }
    text
}

pub(crate) fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Milliseconds since a delta's text was written (its first 20 characters).
pub(crate) fn age_ms(text: &str) -> Option<f64> {
    sent_and_age(text).map(|(_, age)| age)
}

/// When a delta's text was written (ns since the epoch) and its age now, in ms.
pub(crate) fn sent_and_age(text: &str) -> Option<(u128, f64)> {
    let sent: u128 = text.get(..20)?.parse().ok()?;
    Some((sent, (now_nanos() as f64 - sent as f64) / 1e6))
}

/// Sends an invocation as JSON on `<prefix>.<agent>` and returns its flight id; a busy
/// broker (`overloaded`) is asked again.
pub(crate) async fn invoke(
    nats: &async_nats::Client,
    prefix: &str,
    agent: &str,
    task: &str,
) -> anyhow::Result<String> {
    let mut backoff = Duration::from_millis(5);
    loop {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Content-Type", "application/json");
        let request = async_nats::Request::new()
            .payload(
                json!({ "task": task, "requester": "bench" })
                    .to_string()
                    .into(),
            )
            .headers(headers)
            .timeout(Some(Duration::from_secs(30)));
        let reply = nats
            .send_request(format!("{prefix}.{agent}"), request)
            .await
            .with_context(|| format!("invoking {agent}"))?;
        let body: Value = serde_json::from_slice(&reply.payload)?;
        if let Some(id) = body["flight"]["id"].as_str() {
            return Ok(id.to_string());
        }
        if body["error"]["code"] != "overloaded" {
            bail!("invocation of {agent} refused: {body}");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// What a subscriber saw of one streamed flight.
#[derive(Debug)]
pub(crate) struct Seen {
    pub(crate) deltas: u64,
    pub(crate) first: Option<Instant>,
    pub(crate) last: Option<Instant>,
    /// Age of each delta when it arrived, in ms (if asked for).
    pub(crate) ages_ms: Vec<f64>,
    /// When each of those deltas was written (ns since the epoch), in the same order: a
    /// scenario keeps the deltas of a window (the noisy neighbour's burst).
    pub(crate) sent_ns: Vec<u128>,
    pub(crate) state: Option<pb::FlightState>,
}

impl Seen {
    pub(crate) fn rate(&self) -> Option<f64> {
        let span = self.last?.duration_since(self.first?).as_secs_f64();
        (self.deltas > 1 && span > 0.0).then(|| (self.deltas - 1) as f64 / span)
    }
}

/// Reads `sub` (the flight updates of an agent, protobuf) until flight `id` ends.
///
/// Deltas that waited for the same commit arrive merged into one update (their texts
/// joined), so deltas are counted by text: each is `size` bytes and starts with its
/// emit time.
pub(crate) async fn follow_flight(
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
        sent_ns: Vec::new(),
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
                        if let Some((sent, a)) = d.text.get(start..).and_then(sent_and_age) {
                            seen.sent_ns.push(sent);
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

/// The size of a `stream:N:SIZE[:RATE]` task's deltas; anything else counts per update.
pub(crate) fn delta_size_of(task: &str) -> usize {
    task.split(':')
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX)
}

/// Invokes `agent` with `task` and follows its flight to the end over NATS.
pub(crate) async fn stream_flight(
    nats: &async_nats::Client,
    agent: &str,
    task: &str,
    ages: bool,
) -> anyhow::Result<(String, Seen)> {
    let mut sub = nats.subscribe(format!("relay.v1.flight.{agent}.*")).await?;
    nats.flush().await?;
    let id = invoke(nats, "relay.v1.invoke", agent, task).await?;
    let seen = follow_flight(&mut sub, &id, ages, delta_size_of(task)).await?;
    if seen.state != Some(pb::FlightState::Completed) {
        bail!("flight {id} ended {:?}", seen.state);
    }
    Ok((id, seen))
}

/// Raw NATS: `n` payloads like the deltas, published as fast as the client takes them,
/// received by a subscriber on another connection. Deltas/s between the first and the
/// last received, and how many arrived.
pub(crate) async fn raw_throughput(
    url: &str,
    n: u64,
    size: usize,
) -> anyhow::Result<(Option<f64>, u64)> {
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
pub(crate) async fn raw_latency(
    url: &str,
    n: u64,
    rate: f64,
    size: usize,
) -> anyhow::Result<Vec<f64>> {
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

/// The size of a stopped broker's store, and what was measured: the data dir's `store/`
/// (the v2 layout: the event log's segments and sled) or else its `db/` (v1: sled alone),
/// so that one bench measures a v1 and a v2 build alike (`--relay`).
pub(crate) fn store_bytes(data: &Path) -> anyhow::Result<(u64, String)> {
    let measure = |path: &Path| {
        bench::dir_bytes(path).with_context(|| format!("measuring {}", path.display()))
    };
    let mb = |b: u64| bench::number(b as f64 / 1e6);
    let v2 = data.join("store");
    if v2.is_dir() {
        let (log, db) = (measure(&v2.join("log"))?, measure(&v2.join("db"))?);
        let bytes = measure(&v2)?;
        return Ok((
            bytes,
            format!("store/ (log {} MB + sled {} MB)", mb(log), mb(db)),
        ));
    }
    let v1 = data.join("db");
    if v1.is_dir() {
        return Ok((measure(&v1)?, "db/ (sled)".to_string()));
    }
    bail!("{} has neither store/ nor db/", data.display())
}

/// The v2 store of a stopped broker (`<data>/store`: its log and sled), for the raw
/// baselines, which read it with this bench's own store code. A v1 data dir (a `--relay`
/// build from before the event log v2) is not read: opening it with v2 code would
/// migrate it.
pub(crate) fn sled_dir(data: &Path) -> anyhow::Result<PathBuf> {
    let v2 = data.join(relay_broker::store::STORE_DIR);
    anyhow::ensure!(v2.is_dir(), "{} is not a v2 store", v2.display());
    Ok(v2)
}

pub(crate) fn rss_mb(pid: u32) -> anyhow::Result<f64> {
    Ok(relay_tests::procs::rss_bytes(pid)? as f64 / 1024.0 / 1024.0)
}

/// The broker's RSS once it has settled: quiet for a second, then until a second takes
/// less than 1 MB off it (at most 10 s). jemalloc gives freed pages back over about a
/// second (`dirty_decay_ms`), so one second after a burst can catch it halfway.
pub(crate) async fn settled_rss_mb(relay: &RelayProcess) -> anyhow::Result<f64> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut rss = rss_mb(relay.pid())?;
    for _ in 0..9 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = rss_mb(relay.pid())?;
        let settled = rss - now < 1.0;
        rss = now;
        if settled {
            break;
        }
    }
    Ok(rss)
}

/// A failed part leaves a row without figure for each of its scenarios.
pub(crate) fn failed_rows(e: &anyhow::Error, names: &[(u8, &str)]) -> Vec<Row> {
    say(&format!("FAILED: {e:#}"));
    names.iter().map(|(s, n)| Row::failed(*s, n, e)).collect()
}

/// A streaming part's set-up: a nats-server, `relay up`, one agent whose session a first
/// short turn has started (so that what follows measures the stream), a NATS client, and
/// the broker's RSS before any of it.
pub(crate) async fn streaming_part(
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
