//! Part A: 1 delta throughput, 4 bytes on disk per delta, 7 RSS after the deltas.

use super::*;

pub(crate) async fn part_a(b: &Bench) -> Vec<Row> {
    match part_a_inner(b).await {
        Ok(rows) => rows,
        Err(e) => failed_rows(
            &e,
            &[
                (1, "delta throughput"),
                (4, "storage per delta"),
                (7, "broker RSS after scenario 1"),
            ],
        ),
    }
}

async fn part_a_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let agent = "stream-1".to_string();
    let (nats, mut relay, client, idle) = streaming_part(b, "a", &agent).await?;
    say(&format!(
        "1: streaming {} deltas through relay",
        bench::number(s.deltas as f64)
    ));
    let t = Instant::now();
    let (_, seen) = stream_flight(
        &client,
        &agent,
        &format!("stream:{}:{}", s.deltas, s.delta_size),
        false,
    )
    .await?;
    let whole = t.elapsed();
    let after = settled_rss_mb(&relay).await?;
    let status: Value = api(&relay).get(&["v1", "status"]).await?;
    say("1: the same through raw NATS");
    let (raw, raw_got) = raw_throughput(&nats.url(), s.deltas, s.delta_size).await?;
    blocking(|| relay.terminate())?;
    let (bytes, layout) = blocking(|| store_bytes(&relay.data_dir))?;
    // Per tree, read with this bench's own store code: a build of another layout
    // (`--relay`) may leave a dir it cannot read; the figure stands without it.
    let trees = blocking(|| sled_dir(&relay.data_dir).and_then(|db| logical_bytes(&db)));
    let mut rows = Vec::new();
    let mut r1 = Row::new(1, "delta throughput", "deltas/s")
        .baseline("raw NATS pub->sub", raw)
        .goal(Goal::RatioAtLeast(0.5))
        .detail(format!(
            "{} of {} deltas received, {:.1} s from invocation to completion; raw NATS: {} \
             of {} received",
            bench::number(seen.deltas as f64),
            bench::number(s.deltas as f64),
            whole.as_secs_f64(),
            bench::number(raw_got as f64),
            bench::number(s.deltas as f64),
        ));
    if let Some(rate) = seen.rate().filter(|_| seen.deltas == s.deltas) {
        r1 = r1.value(rate);
    } else {
        r1.detail = format!("ERROR: {}", r1.detail);
    }
    rows.push(r1);
    let n = seen.deltas.max(1) as f64;
    rows.push(
        Row::new(4, "storage per delta", "B")
            .value(bytes as f64 / n)
            .baseline("the delta's text", Some(s.delta_size as f64))
            .goal(Goal::AtMost(120.0))
            .detail(format!(
                "{layout} {} MB for {} events after scenario 1 (the broker stopped); stored \
                 key+value bytes per delta in sled: {}; the final answer ({} MB, {} B per \
                 delta) is part of it",
                bench::number(bytes as f64 / 1e6),
                bench::number(status["last_seq"].as_f64().unwrap_or(0.0)),
                match &trees {
                    Ok(trees) => trees
                        .iter()
                        .filter(|(_, v)| *v as f64 / n >= 1.0)
                        .map(|(t, v)| format!("{t} {}", bench::number(*v as f64 / n)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    Err(e) => format!("not read ({e:#})"),
                },
                bench::number((s.deltas as usize * s.delta_size) as f64 / 1e6),
                s.delta_size,
            )),
    );
    rows.push(
        Row::new(7, "broker RSS after scenario 1", "MB")
            .value(after)
            .baseline("idle relay up", Some(idle))
            .goal(Goal::AtMost(100.0)),
    );
    Ok(rows)
}

/// Key + value bytes stored in each tree of a stopped broker's database.
fn logical_bytes(db: &Path) -> anyhow::Result<Vec<(String, u64)>> {
    let store = Store::open(db)?;
    let names = [
        "event_pos",
        "flight_updates",
        "flights",
        "invocations",
        "messages",
    ];
    let trees = [
        T::EventPos,
        T::FlightUpdates,
        T::Flights,
        T::Invocations,
        T::Messages,
    ];
    let mut out = vec![("log".to_string(), store.log().bytes())];
    for (name, t) in names.iter().zip(trees) {
        let mut total = 0u64;
        for kv in store.tree(t).iter() {
            let (k, v) = kv?;
            total += (k.len() + v.len()) as u64;
        }
        out.push((name.to_string(), total));
    }
    Ok(out)
}
