//! Part G: 10 a realistic fleet. Many agents at once, each running one flight after
//! another, each flight short deltas at a modest rate whose whole text (the final answer)
//! is a few KB, for a while: the broker's RSS at the end, the deltas' latency, and the
//! bytes on disk per delta (everything a flight stores, over its deltas).

use super::*;

const NAMES: [&str; 4] = [
    "fleet: broker RSS at the end",
    "fleet: delta latency p50",
    "fleet: delta latency p99",
    "fleet: storage per delta",
];

pub(crate) async fn part_g(b: &Bench) -> Vec<Row> {
    match part_g_inner(b).await {
        Ok(rows) => rows,
        Err(e) => {
            let names: Vec<(u8, &str)> = NAMES.iter().map(|n| (10, *n)).collect();
            failed_rows(&e, &names)
        }
    }
}

/// What one agent of the fleet streamed.
#[derive(Default)]
struct Streamed {
    flights: u64,
    deltas: u64,
    ages_ms: Vec<f64>,
}

async fn part_g_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let nats = blocking(NatsServer::start)?;
    let mut relay = b.start_relay("g", &nats)?;
    // Idle: just started (`api.json` is written once it is up); no settling needed.
    let idle = rss_mb(relay.pid())?;
    let agents: Vec<String> = (0..s.fleet_agents).map(|i| format!("fleet-{i}")).collect();
    b.add_agents(&relay, &agents, "on_demand", 16).await?;
    let client = connect(&nats.url()).await?;
    // Every session starts before the clock does.
    let mut warm = tokio::task::JoinSet::new();
    for agent in agents.clone() {
        let client = client.clone();
        warm.spawn(async move { stream_flight(&client, &agent, "stream:2:32", false).await });
    }
    while let Some(r) = warm.join_next().await {
        r??;
    }
    // A flight: FLEET_DELTAS deltas at the fleet's rate; its answer is their whole text.
    let task = format!(
        "stream:{}:{}:{}",
        s.fleet_flight_deltas, s.delta_size, s.fleet_rate
    );
    say(&format!(
        "10: {} agents, each flights of {} deltas of {} B at {}/s (answers of {} B), for {} s",
        s.fleet_agents,
        s.fleet_flight_deltas,
        s.delta_size,
        s.fleet_rate,
        bench::number((s.fleet_flight_deltas as usize * s.delta_size) as f64),
        s.fleet_seconds
    ));
    let started = Instant::now();
    let until = started + Duration::from_secs(s.fleet_seconds);
    // An agent starts another flight only if it should end in time (at its rate), so the
    // fleet streams for about the time asked, not up to a flight longer.
    let flight = Duration::from_secs_f64(s.fleet_flight_deltas as f64 / s.fleet_rate);
    let mut fleet = tokio::task::JoinSet::new();
    for agent in agents {
        let (client, task) = (client.clone(), task.clone());
        fleet.spawn(async move {
            let mut out = Streamed::default();
            let mut sub = client
                .subscribe(format!("relay.v1.flight.{agent}.*"))
                .await?;
            client.flush().await?;
            while Instant::now() + flight <= until || out.flights == 0 {
                let id = invoke(&client, "relay.v1.invoke", &agent, &task).await?;
                let seen = follow_flight(&mut sub, &id, true, delta_size_of(&task)).await?;
                anyhow::ensure!(
                    seen.state == Some(pb::FlightState::Completed),
                    "{agent}'s flight {id} ended {:?}",
                    seen.state
                );
                out.flights += 1;
                out.deltas += seen.deltas;
                out.ages_ms.extend(seen.ages_ms);
            }
            anyhow::Ok(out)
        });
    }
    let mut all = Streamed::default();
    while let Some(r) = fleet.join_next().await {
        let one = r??;
        all.flights += one.flights;
        all.deltas += one.deltas;
        all.ages_ms.extend(one.ages_ms);
    }
    let took = started.elapsed();
    let rss = settled_rss_mb(&relay).await?;
    let status: Value = api(&relay).get(&["v1", "status"]).await?;
    blocking(|| relay.terminate())?;
    drop(nats);
    let (bytes, layout) = blocking(|| store_bytes(&relay.data_dir))?;
    let mut ages = all.ages_ms;
    ages.sort_by(|a, b| a.total_cmp(b));
    let n = all.deltas.max(1) as f64;
    let mut rows = vec![Row::new(10, NAMES[0], "MB")
        .value(rss)
        .baseline("idle relay up", Some(idle))
        .goal(Goal::AtMost(80.0))
        .detail(format!(
            "{} agents, {} flights, {} deltas in {:.1} s ({} deltas/s in all); {} events",
            s.fleet_agents,
            bench::number(all.flights as f64),
            bench::number(all.deltas as f64),
            took.as_secs_f64(),
            bench::number(all.deltas as f64 / took.as_secs_f64()),
            bench::number(status["last_seq"].as_f64().unwrap_or(0.0)),
        ))];
    for (name, q) in [(NAMES[1], 0.5), (NAMES[2], 0.99)] {
        let mut r = Row::new(10, name, "ms");
        if let Some(v) = bench::quantile(&ages, q) {
            r = r.value(v);
        }
        if q == 0.5 {
            r = r.detail(format!(
                "harness emit -> subscriber receive, {} deltas timed; max {} ms",
                bench::number(ages.len() as f64),
                bench::number(ages.last().copied().unwrap_or(f64::NAN)),
            ));
        }
        rows.push(r);
    }
    rows.push(
        Row::new(10, NAMES[3], "B")
            .value(bytes as f64 / n)
            .baseline("the delta's text", Some(s.delta_size as f64))
            .detail(format!(
                "{layout} {} MB after the fleet (the broker stopped; the warm-up flights \
                 included), over its deltas",
                bench::number(bytes as f64 / 1e6),
            )),
    );
    Ok(rows)
}
