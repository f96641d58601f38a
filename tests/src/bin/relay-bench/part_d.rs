//! Part D: 7 RSS with many live sessions.

use super::*;

pub(crate) async fn part_d(b: &Bench) -> Vec<Row> {
    match part_d_inner(b).await {
        Ok(rows) => rows,
        Err(e) => failed_rows(&e, &[(7, "broker RSS with live agents")]),
    }
}

async fn part_d_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let nats = blocking(NatsServer::start)?;
    let mut relay = b.start_relay("d", &nats)?;
    let idle = settled_rss_mb(&relay).await?;
    say(&format!("7: {} agents kept warm", s.memory_agents));
    let agents: Vec<String> = (0..s.memory_agents).map(|i| format!("mem-{i}")).collect();
    let t = Instant::now();
    b.add_agents(&relay, &agents, "keep_warm", 16).await?;
    // Until every session is up (its agent idle).
    let api = api(&relay);
    loop {
        let list: Vec<Value> = api.get(&["v1", "agents"]).await?;
        let idle_agents = list.iter().filter(|a| a["state"] == "idle").count();
        if idle_agents >= s.memory_agents {
            break;
        }
        if t.elapsed() > Duration::from_secs(300) {
            bail!(
                "{idle_agents} of {} agents idle after 300 s",
                s.memory_agents
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let woke = t.elapsed();
    let rss = settled_rss_mb(&relay).await?;
    let kids = relay_tests::procs::children(relay.pid());
    let kids_mb: f64 = kids.iter().filter_map(|p| rss_mb(*p).ok()).sum();
    // A clean stop, so that the broker ends its sessions itself.
    blocking(|| relay.terminate())?;
    Ok(vec![Row::new(
        7,
        &format!("broker RSS, {} agents live", s.memory_agents),
        "MB",
    )
    .value(rss)
    .baseline("idle relay up", Some(idle))
    .goal(Goal::AtMost(100.0))
    .detail(format!(
        "all sessions up {:.1} s after the first registration; their {} harness processes \
         hold {} MB more (not counted)",
        woke.as_secs_f64(),
        kids.len(),
        bench::number(kids_mb)
    ))])
}
