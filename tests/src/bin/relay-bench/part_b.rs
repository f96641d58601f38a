//! Part B: 2 delta latency (against a raw NATS hop plus the fsync floor), 6 replay of one
//! flight.

use super::*;

pub(crate) async fn part_b(b: &Bench) -> Vec<Row> {
    match part_b_inner(b).await {
        Ok(rows) => rows,
        Err(e) => failed_rows(
            &e,
            &[
                (2, FLOOR_P50),
                (2, FLOOR_P99),
                (2, PACED_P99),
                (2, PACED_MAX),
                (2, "delta latency p50"),
                (2, "delta latency p99"),
                (2, "delta latency max"),
                (6, "replay of one flight"),
            ],
        ),
    }
}

const FLOOR_P50: &str = "fdatasync of a 4 KiB append, p50";
const FLOOR_P99: &str = "fdatasync of a 4 KiB append, p99";
const PACED_P99: &str = "group commit at the deltas' pace, p99";
const PACED_MAX: &str = "group commit at the deltas' pace, max";

async fn part_b_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    // First, while nothing else of this part runs.
    say(&format!(
        "2: the fsync floor ({} appends + fdatasync)",
        s.fsync_samples
    ));
    let dir = b.tmp.path().to_path_buf();
    let floor_ms = blocking(|| floor::fdatasync_ms(&dir, s.fsync_samples))?;
    let floor_p50 = bench::quantile(&floor_ms, 0.5);
    say(&format!(
        "2: a group commit alone at the deltas' pace ({} arrivals at {}/s)",
        bench::number(s.latency_deltas as f64),
        s.latency_rate
    ));
    let (n, rate) = (s.latency_deltas as usize, s.latency_rate);
    let paced_dir = dir.clone();
    let paced_ms = blocking(move || floor::group_commit_ms(&paced_dir, n, rate))?;
    let agent = "latency-1".to_string();
    let (nats, mut relay, client, _) = streaming_part(b, "b", &agent).await?;
    say(&format!(
        "2: {} deltas at {}/s through relay",
        bench::number(s.latency_deltas as f64),
        s.latency_rate
    ));
    let (_, seen) = stream_flight(
        &client,
        &agent,
        &format!(
            "stream:{}:{}:{}",
            s.latency_deltas, s.delta_size, s.latency_rate
        ),
        true,
    )
    .await?;
    let mut relay_ms = seen.ages_ms;
    relay_ms.sort_by(|a, b| a.total_cmp(b));
    say("2: the same through raw NATS");
    let mut raw_ms =
        raw_latency(&nats.url(), s.latency_deltas, s.latency_rate, s.delta_size).await?;
    raw_ms.sort_by(|a, b| a.total_cmp(b));
    let mut rows = Vec::new();
    let floor_detail = format!(
        "{} appends of {} B to one file, each write + fdatasync timed, on {}; max {} ms",
        floor_ms.len(),
        floor::APPEND,
        floor::filesystem_of(&dir),
        bench::number(floor_ms.last().copied().unwrap_or(f64::NAN)),
    );
    let paced_detail = format!(
        "{} arrivals at {}/s (the timed deltas' count and pace), group-committed with \
         nothing else to do (one {} B append + fdatasync for all that arrived since the \
         last), each timed from its arrival to its sync's end; over 2 ms: {}",
        paced_ms.len(),
        rate,
        floor::APPEND,
        paced_ms.iter().filter(|ms| **ms > 2.0).count(),
    );
    // The floor's rows: each with its quantile, the first of each kind with its detail.
    for (name, samples, q, detail) in [
        (FLOOR_P50, &floor_ms, 0.5, Some(floor_detail)),
        (FLOOR_P99, &floor_ms, 0.99, None),
        (PACED_P99, &paced_ms, 0.99, Some(paced_detail)),
        (PACED_MAX, &paced_ms, 1.0, None),
    ] {
        let mut r = Row::new(2, name, "ms");
        if let Some(v) = bench::quantile(samples, q) {
            r = r.value(v);
        }
        if let Some(d) = detail {
            r = r.detail(d);
        }
        rows.push(r);
    }
    for (name, q, goal) in [
        ("delta latency p50", 0.5, Some(Goal::RatioAtMost(1.5))),
        ("delta latency p99", 0.99, Some(Goal::AtMost(2.0))),
        ("delta latency max", 1.0, None),
    ] {
        let raw = bench::quantile(&raw_ms, q);
        // The p50's floor is a hop plus one durable append; the tail's targets are absolute.
        let mut r = if q == 0.5 {
            Row::new(2, name, "ms").baseline(
                "raw NATS hop + fdatasync (p50s)",
                raw.zip(floor_p50).map(|(hop, sync)| hop + sync),
            )
        } else {
            // The tail's floor: a hop plus an ideal group commit at the same pace (the
            // disk's own stalls, and what waits behind them, are in both).
            Row::new(2, name, "ms").baseline(
                "raw NATS hop + group commit at the same pace",
                raw.zip(bench::quantile(&paced_ms, q))
                    .map(|(hop, sync)| hop + sync),
            )
        };
        if let Some(v) = bench::quantile(&relay_ms, q) {
            r = r.value(v);
        }
        if let Some(g) = goal {
            r = r.goal(g);
        }
        if q == 0.5 {
            r = r.detail(format!(
                "harness emit -> subscriber receive; {} relay deltas and {} raw timed; raw \
                 hop p50 {} ms + fdatasync p50 {} ms",
                bench::number(relay_ms.len() as f64),
                bench::number(raw_ms.len() as f64),
                bench::number(raw.unwrap_or(f64::NAN)),
                bench::number(floor_p50.unwrap_or(f64::NAN)),
            ));
        }
        rows.push(r);
    }
    say(&format!(
        "6: a flight of {} deltas, read back over HTTP",
        bench::number(s.replay_deltas as f64)
    ));
    let (id, _) = stream_flight(
        &client,
        &agent,
        &format!("stream:{}:{}", s.replay_deltas, s.delta_size),
        false,
    )
    .await?;
    let http = api(&relay);
    let mut times = Vec::new();
    let mut entries = 0;
    for _ in 0..6 {
        let t = Instant::now();
        let replay: Value = http.get(&["v1", "replay", "flights", &id]).await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        entries = replay["entries"].as_array().map_or(0, Vec::len);
    }
    let first = times.remove(0);
    let count = http
        .get::<Vec<Value>>(&["v1", "flights", &id, "updates"])
        .await?
        .len();
    blocking(|| relay.terminate())?;
    // The baseline reads sled with this bench's own store code: a build of another
    // layout (`--relay`) may leave a dir it cannot read, and then the figure stands alone.
    let (raw_ms, raw_read) =
        match blocking(|| sled_dir(&relay.data_dir).and_then(|db| raw_replay(&db, &id))) {
            Ok((ms, bytes, count)) => (
                Some(ms),
                format!(
                    "store: {} updates read raw (positions from sled, records from the log), {} MB",
                    bench::number(count as f64),
                    bench::number(bytes as f64 / 1e6)
                ),
            ),
            Err(e) => (None, format!("store not read: {e:#}")),
        };
    rows.push(
        Row::new(6, "replay of one flight", "ms")
            .value(bench::median(times).unwrap_or(f64::NAN))
            .baseline("raw read of the stored updates", raw_ms)
            .goal(Goal::AtMost(50.0))
            .detail(format!(
                "GET /v1/replay/flights/ID, median of 5 after a first one ({first:.1} ms): {} \
                 updates in {} entries; {raw_read}",
                bench::number(count as f64),
                bench::number(entries as f64),
            )),
    );
    Ok(rows)
}

/// Reads a flight's stored updates raw from a stopped broker's sled: median ms of 5,
/// bytes and values read.
fn raw_replay(db: &Path, flight: &str) -> anyhow::Result<(f64, u64, usize)> {
    let store = Store::open(db)?;
    let mut times = Vec::new();
    let (mut bytes, mut count) = (0, 0);
    for _ in 0..5 {
        let t = Instant::now();
        (bytes, count) = (0, 0);
        // Each update's position in the log, then its record there, undecoded.
        for v in store
            .tree(T::FlightUpdates)
            .range(child_key(flight, 1)..=child_key(flight, u64::MAX))
            .values()
        {
            let (_, pos) = relay_broker::store::parse_pair(&v?)?;
            let record = store
                .log()
                .read(pos)?
                .ok_or_else(|| anyhow::anyhow!("update at {pos} not in the log"))?;
            bytes += record.payload.len() as u64;
            count += 1;
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((bench::median(times).unwrap_or(f64::NAN), bytes, count))
}
