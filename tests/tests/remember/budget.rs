//! A daily token budget below what one flight uses, with the real Claude Code: the first
//! flight runs (a budget refuses a flight that would start past it, never the one that
//! crosses it), the next is refused with `budget_exceeded`, and a higher budget set with
//! `relay agent set` lets it run.

use relay_tests::agents::Env;

use crate::clis::{flights_of, mock_usage, with_usage, Cli, Step};

/// Tokens a day: below one flight's (the mock reports 2290 for it).
const LOW: u64 = 10;

#[tokio::test(flavor = "multi_thread")]
async fn a_budget_refuses_the_next_flight_until_it_is_raised() {
    let env: Env = Cli::env().await;
    let low = format!("{LOW}/day");
    Cli::Claude.add(&env, "b1", &["--budget", &low]);

    let first = env.ask_no_wait("b1", "first");
    let f = with_usage(&env, &first).await;
    let used = mock_usage(Cli::Claude, Step::Text).total();
    assert_eq!(
        f["usage"]["input_tokens"].as_u64().unwrap()
            + f["usage"]["output_tokens"].as_u64().unwrap(),
        used,
        "{f}"
    );
    assert!(used > LOW);

    // Today's use, and when it resets: the next UTC midnight.
    let (code, status) = env.relay.http().get("/v1/agents/b1/budget").await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["budget"]["tokens_per_day"], LOW, "{status}");
    assert_eq!(status["today"]["tokens"], used, "{status}");
    assert_eq!(status["today"]["flights"], 1, "{status}");
    let resets = status["resets_at"].as_u64().unwrap();
    let created = f["created_at"].as_u64().unwrap();
    assert_eq!(resets, (created / 86_400_000 + 1) * 86_400_000, "{status}");
    let shown = env.relay.cli_ok(&["agent", "show", "b1"]);
    for part in [format!("{LOW} tokens/day"), format!("{used} tokens")] {
        assert!(shown.contains(&part), "{part:?} in {shown}");
    }

    // The next flight is refused before it starts: exit code 4 (refused), and the
    // message names the budget, what was used, when it resets and how to raise it.
    let out = env.relay.cli(&["ask", "b1", "second"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    for part in [
        "budget_exceeded",
        "b1",
        &LOW.to_string(),
        &used.to_string(),
        &format!("resets at {} 00:00 UTC", crate::usage::utc_date(resets)),
        "relay agent set b1 --budget",
    ] {
        assert!(err.contains(part), "{part:?} in {err}");
    }
    assert_eq!(
        flights_of(&env, "b1").len(),
        1,
        "no flight for the refused ask"
    );
    // HTTP says the same: 429 with the code.
    let (code, body) = env
        .relay
        .http()
        .post(
            "/v1/invocations",
            &serde_json::json!({"target": "b1", "task": "third"}),
        )
        .await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (429, Some("budget_exceeded")),
        "{body}"
    );

    // Raised, the next flight runs.
    env.relay
        .cli_ok(&["agent", "set", "b1", "--budget", "1m/day"]);
    let out = env.relay.cli_ok(&["ask", "b1", "after the raise"]);
    assert_eq!(out.trim(), "ok", "{out}");
    assert_eq!(flights_of(&env, "b1").len(), 2);
}
