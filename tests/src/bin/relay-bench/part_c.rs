//! Part C: 3 invocation throughput, 5 restart on a large data dir.

use super::*;

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
    let status: relay_protocol::api::Status = api(relay).get(&["v1", "status"]).await?;
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

pub(crate) async fn part_c(b: &Bench) -> Vec<Row> {
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
    let (ends, follower) = Ends::follow(&client, "relay.v1.flight.>").await?;
    let (raw_ends, raw_follower) = Ends::follow(&client, "bench.raw.flight.>").await?;
    let responder = raw_responder(connect(&nats.url()).await?).await?;
    let via_relay = {
        let c = client.clone();
        move |agent: String, i: usize| {
            let c = c.clone();
            async move { invoke(&c, "relay.v1.invoke", &agent, &format!("bench task {i}")).await }
        }
    };
    let via_raw = {
        let c = client.clone();
        move |agent: String, i: usize| {
            let c = c.clone();
            async move { invoke(&c, "bench.raw.invoke", &agent, &format!("bench task {i}")).await }
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
            r = r.goal(Goal::AtLeast(3000.0));
        }
        rows.push(r);
    }
    responder.abort();
    raw_follower.abort();
    // Scenario 5: grow the data dir, then restart it.
    let status: Value = api(&relay).get(&["v1", "status"]).await?;
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
    let status: Value = api(&relay).get(&["v1", "status"]).await?;
    let (flights, events) = (
        status["flights"].as_u64().unwrap_or(0),
        status["last_seq"].as_u64().unwrap_or(0),
    );
    blocking(|| relay.terminate())?;
    let (db_bytes, layout) = blocking(|| store_bytes(&relay.data_dir))?;
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
            if http.get::<Value>(&["v1", "status"]).await.is_ok() {
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
            let list: Vec<Value> = http
                .get_query(&["v1", "flights"], &[("live", "true".into())])
                .await?;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            live_count = list.len();
            if i == 0 {
                firsts.push(ms);
            } else {
                live.push(ms);
            }
            let t = Instant::now();
            http.get::<Value>(&["v1", "status"]).await?;
            stat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        blocking(|| relay.terminate())?;
    }
    // Read with this bench's own store code: a build of another layout (`--relay`) may
    // leave a dir it cannot read; the figures stand without these baselines then.
    let (open_s, scan_ms, unread) =
        match blocking(|| sled_dir(&relay.data_dir).and_then(|db| open_and_scan(&db))) {
            Ok((open, scan)) => (Some(open), Some(scan), String::new()),
            Err(e) => (None, None, format!("; sled not read: {e:#}")),
        };
    let sizes = format!(
        "{} flights, {} events, {layout} {} MB{generation}{unread}",
        bench::number(flights as f64),
        bench::number(events as f64),
        bench::number(db_bytes as f64 / 1e6)
    );
    rows.push(
        Row::new(5, "restart until the API answers", "s")
            .value(bench::median(up.clone()).unwrap_or(f64::NAN))
            .baseline("sled open alone", open_s)
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
            .baseline("sled scan of the flights tree", scan_ms)
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
