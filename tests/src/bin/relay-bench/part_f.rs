//! Part F: 9 the noisy neighbour. Agent B streams deltas at a fixed rate (1,000/s), first
//! alone, then while agent A, on the same broker, streams a burst as fast as it can; B's
//! latency beside the burst against B's alone, in the same run. One flight's burst may
//! not hold every other flight's tail hostage.

use super::*;

use std::sync::atomic::AtomicBool;

const NAMES: [&str; 6] = [
    "neighbour latency p50, alone",
    "neighbour latency p99, alone",
    "neighbour latency max, alone",
    "neighbour latency p50, beside the burst",
    "neighbour latency p99, beside the burst",
    "neighbour latency max, beside the burst",
];

/// B's deltas per flight while the burst runs: B keeps invoking such flights until the
/// burst ends, so a short one wastes little time after it.
const CHUNK: u64 = 500;

pub(crate) async fn part_f(b: &Bench) -> Vec<Row> {
    match part_f_inner(b).await {
        Ok(rows) => rows,
        Err(e) => {
            let names: Vec<(u8, &str)> = NAMES.iter().map(|n| (9, *n)).collect();
            failed_rows(&e, &names)
        }
    }
}

async fn part_f_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let (quiet, noisy) = ("quiet-b", "burst-a");
    let nats = blocking(NatsServer::start)?;
    let mut relay = b.start_relay("f", &nats)?;
    b.add_agents(
        &relay,
        &[quiet.to_string(), noisy.to_string()],
        "on_demand",
        2,
    )
    .await?;
    // A's stream on its own connection, so that B's updates do not queue behind it in
    // the bench's reader.
    let (client, noisy_client) = (connect(&nats.url()).await?, connect(&nats.url()).await?);
    // Both sessions start before anything is timed.
    let (warm_b, warm_a) = tokio::join!(
        stream_flight(&client, quiet, "stream:10:32", false),
        stream_flight(&noisy_client, noisy, "stream:10:32", false),
    );
    warm_b?;
    warm_a?;
    let paced = |n: u64| format!("stream:{n}:{}:{}", s.delta_size, s.latency_rate);

    say(&format!(
        "9: {} deltas of agent B at {}/s, alone",
        bench::number(s.neighbour_alone as f64),
        s.latency_rate
    ));
    let (_, seen) = stream_flight(&client, quiet, &paced(s.neighbour_alone), true).await?;
    let mut alone = seen.ages_ms;
    alone.sort_by(|a, b| a.total_cmp(b));

    say(&format!(
        "9: agent B at {}/s beside agent A's burst of {} deltas",
        s.latency_rate,
        bench::number(s.neighbour_burst as f64)
    ));
    let burst_over = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = oneshot::channel();
    let quiet_flights = tokio::spawn({
        let (client, over, task) = (client.clone(), burst_over.clone(), paced(CHUNK));
        async move {
            let mut sub = client
                .subscribe(format!("relay.v1.flight.{quiet}.*"))
                .await?;
            client.flush().await?;
            let mut started = Some(started_tx);
            let (mut sent, mut ages) = (Vec::new(), Vec::new());
            while !over.load(Ordering::Relaxed) {
                let id = invoke(&client, "relay.v1.invoke", quiet, &task).await?;
                if let Some(tx) = started.take() {
                    let _ = tx.send(());
                }
                let seen = follow_flight(&mut sub, &id, true, delta_size_of(&task)).await?;
                anyhow::ensure!(
                    seen.state == Some(pb::FlightState::Completed),
                    "agent B's flight {id} ended {:?}",
                    seen.state
                );
                sent.extend(seen.sent_ns);
                ages.extend(seen.ages_ms);
            }
            anyhow::Ok((sent, ages))
        }
    });
    // B's first flight is accepted before the burst starts.
    started_rx
        .await
        .context("agent B's flights stopped before the burst")?;
    let from = now_nanos();
    let t = Instant::now();
    let burst = stream_flight(
        &noisy_client,
        noisy,
        &format!("stream:{}:{}", s.neighbour_burst, s.delta_size),
        false,
    )
    .await;
    let until = now_nanos();
    let burst_took = t.elapsed();
    burst_over.store(true, Ordering::Relaxed);
    let (sent, ages) = quiet_flights.await??;
    let (_, burst) = burst?;
    // B's deltas written while the burst ran (from A's invocation to its end seen).
    let mut beside: Vec<f64> = sent
        .iter()
        .zip(&ages)
        .filter(|(at, _)| (from..=until).contains(*at))
        .map(|(_, age)| *age)
        .collect();
    beside.sort_by(|a, b| a.total_cmp(b));
    anyhow::ensure!(
        !beside.is_empty(),
        "none of agent B's deltas was written during the burst"
    );
    blocking(|| relay.terminate())?;
    drop(nats);

    let mut rows = Vec::new();
    for (i, (values, base)) in [(&alone, None), (&beside, Some(&alone))]
        .into_iter()
        .enumerate()
    {
        for (j, q) in [0.5, 0.99, 1.0].into_iter().enumerate() {
            let mut r = Row::new(9, NAMES[i * 3 + j], "ms");
            if let Some(v) = bench::quantile(values, q) {
                r = r.value(v);
            }
            if let Some(base) = base {
                r = r.baseline("agent B alone, same broker", bench::quantile(base, q));
            }
            if q == 0.99 {
                r = r.goal(Goal::AtMost(if base.is_some() { 5.0 } else { 2.0 }));
            }
            if q == 0.5 && base.is_none() {
                r = r.detail(format!(
                    "harness emit -> subscriber receive of agent B's deltas ({} B at {}/s): \
                     {} timed alone",
                    s.delta_size,
                    s.latency_rate,
                    bench::number(alone.len() as f64)
                ));
            }
            if q == 0.5 && base.is_some() {
                r = r.detail(format!(
                    "{} of agent B's deltas written during agent A's burst ({} of {} deltas \
                     received, {:.1} s from invocation to completion, {} deltas/s)",
                    bench::number(beside.len() as f64),
                    bench::number(burst.deltas as f64),
                    bench::number(s.neighbour_burst as f64),
                    burst_took.as_secs_f64(),
                    bench::number(burst.rate().unwrap_or(f64::NAN)),
                ));
            }
            rows.push(r);
        }
    }
    Ok(rows)
}
