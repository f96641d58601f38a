//! Part H: 4 storage per posted message. Messages of about 160 bytes (a line of chat)
//! posted over HTTP to one conversation; what the store grew by, per message, against
//! the same store before any was posted (both with the broker stopped).

use super::*;

const NAME: &str = "storage per posted 160-byte message";

/// A message's body: about a line of chat.
const BODY: usize = 160;

pub(crate) async fn part_h(b: &Bench) -> Vec<Row> {
    match part_h_inner(b).await {
        Ok(rows) => rows,
        Err(e) => failed_rows(&e, &[(4, NAME)]),
    }
}

async fn part_h_inner(b: &Bench) -> anyhow::Result<Vec<Row>> {
    let s = &b.sizes;
    let nats = blocking(NatsServer::start)?;
    let mut relay = b.start_relay("h", &nats)?;
    // The empty store, as a stopped broker leaves it.
    blocking(|| relay.terminate())?;
    let (empty, _) = blocking(|| store_bytes(&relay.data_dir))?;
    blocking(|| relay.restart())?;
    say(&format!(
        "4: posting {} messages of {BODY} B",
        bench::number(s.posted_messages as f64)
    ));
    let http = api(&relay);
    let conversation = relay_protocol::domain::DEFAULT_CONVERSATION;
    // A few at once, as people and agents post: the broker may commit them together.
    let mut posts = futures::stream::iter((0..s.posted_messages).map(|i| {
        let http = http.clone();
        async move {
            let mut body = format!("message {i}: the build is green again after the fix;");
            while body.len() < BODY {
                body.push_str(" more words");
            }
            body.truncate(BODY);
            let post = json!({ "conversation": conversation, "author": "bench", "body": body });
            http.post::<_, Value>(&["v1", "messages"], &post)
                .await
                .with_context(|| format!("posting message {i}"))
        }
    }))
    .buffer_unordered(8);
    let t = Instant::now();
    while let Some(r) = posts.next().await {
        r?;
    }
    let took = t.elapsed();
    let status: Value = http.get(&["v1", "status"]).await?;
    blocking(|| relay.terminate())?;
    drop(nats);
    let (full, layout) = blocking(|| store_bytes(&relay.data_dir))?;
    let n = s.posted_messages.max(1) as f64;
    Ok(vec![Row::new(4, NAME, "B")
        .value(full.saturating_sub(empty) as f64 / n)
        .baseline("the message's body", Some(BODY as f64))
        .goal(Goal::AtMost(400.0))
        .detail(format!(
            "{layout} {} MB after {} messages (posted 8 at a time, {} /s; {} events), {} MB \
             before any; the figure is the growth over the messages",
            bench::number(full as f64 / 1e6),
            bench::number(n),
            bench::number(n / took.as_secs_f64()),
            bench::number(status["last_seq"].as_f64().unwrap_or(0.0)),
            bench::number(empty as f64 / 1e6),
        ))])
}
