//! Usage and budgets through the `relay` command line, against a real broker (with a
//! price table, `relay up --prices`) and the real pinned Codex (mock model): `relay
//! flight show` says a flight's usage and cost; `relay usage` adds flights up exactly by
//! agent and by day, in text (a total line) and `--json`, and `--since` filters;
//! `relay agent add --budget` refuses the flight past the budget with `budget_exceeded`
//! (exit 4, a refusal, never an "overloaded broker"); `relay agent set` raises or removes
//! it; `relay agent show` says the budget and today's use.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use relay_tests::agents::Env;
use serde_json::Value;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `relay up --prices`: the mock's model at $1000 a million input tokens and $2000 a
/// million output tokens, so a token costs exactly 1000 (input) or 2000 (output)
/// micro-dollars and the sums are easy to check.
fn prices(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("prices.json");
    let json = r#"{"models": {"mock-model": {"input": "1000", "output": 2000}}}"#;
    std::fs::write(&path, json).unwrap();
    path
}

fn n(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_adds_flights_up_exactly_by_agent_and_day() {
    let dir = tempfile::tempdir().unwrap();
    let prices = prices(dir.path());
    let env = Env::start_with(&["--prices", prices.to_str().unwrap()]).await;
    env.add_agent("codex-1", &["--model", "mock-model"]);
    let out = env.relay.cli(&["usage"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim(), "no flight reported usage");

    env.relay.cli_ok(&["ask", "codex-1", "first"]);
    env.relay.cli_ok(&["ask", "codex-1", "second question"]);
    let flights = env.relay.cli_json(&["flight", "list", "--json"]);
    let flights = flights.as_array().unwrap();
    assert_eq!(flights.len(), 2);
    let (mut input, mut output, mut cached, mut cost) = (0, 0, 0, 0);
    for f in flights {
        let u = &f["usage"];
        assert!(n(u, "input_tokens") > 0, "{f}");
        let expected_cost = n(u, "input_tokens") * 1000 + n(u, "output_tokens") * 2000;
        assert_eq!(n(u, "cost_micro_usd"), expected_cost, "{u}");
        assert_eq!(u["cost_source"], "prices", "{u}");
        input += n(u, "input_tokens");
        output += n(u, "output_tokens");
        cached += u["cached_input_tokens"].as_u64().unwrap_or(0);
        cost += expected_cost;
        // `relay flight show` says it on one line.
        let id = f["id"].as_str().unwrap();
        let shown = env.relay.cli_ok(&["flight", "show", id]);
        let line = shown
            .lines()
            .find(|l| l.starts_with("usage      "))
            .unwrap_or_else(|| panic!("no usage line in\n{shown}"));
        assert!(
            line.contains(&format!("{} input", n(u, "input_tokens"))),
            "{line}"
        );
        assert!(
            line.contains(&format!(
                "= {} tokens, {} (from the price table), model mock-model",
                n(u, "input_tokens") + n(u, "output_tokens"),
                relay_protocol::domain::format_usd(expected_cost)
            )),
            "{line}"
        );
    }

    // By agent: one row, exact, and the same numbers in the table.
    let report = env.relay.cli_json(&["usage", "--json"]);
    assert_eq!(report["by"], "agent");
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{report}");
    let row = &rows[0];
    assert_eq!(row["key"], "codex-1");
    assert_eq!(
        (
            n(row, "flights"),
            n(row, "input_tokens"),
            n(row, "cached_input_tokens"),
            n(row, "output_tokens"),
            n(row, "tokens"),
            n(row, "cost_micro_usd"),
        ),
        (2, input, cached, output, input + output, cost),
        "{report}"
    );
    assert_eq!(report["total"], {
        let mut t = row.clone();
        t.as_object_mut().unwrap().remove("key");
        t
    });
    let text = env.relay.cli_ok(&["usage"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "AGENT",
            "FLIGHTS",
            "INPUT",
            "CACHED",
            "OUTPUT",
            "REASONING",
            "TOKENS",
            "COST"
        ],
        "{text}"
    );
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    let money = relay_protocol::domain::format_usd(cost);
    let (inp, cac, out, tok) = (
        input.to_string(),
        cached.to_string(),
        output.to_string(),
        (input + output).to_string(),
    );
    assert_eq!(
        (cells[0], cells[1], cells[2], cells[3], cells[4], cells[6], cells[7]),
        ("codex-1", "2", &*inp, &*cac, &*out, &*tok, &*money),
        "{text}"
    );
    assert_eq!(
        lines.len(),
        2,
        "one row, no total line to repeat it: {text}"
    );

    // By day: today's UTC date; --since a date or a duration; a future date finds none.
    let today = env
        .relay
        .cli_json(&["usage", "--by", "day", "--since", "24h", "--json"]);
    let key = today["rows"][0]["key"].as_str().unwrap().to_string();
    assert_eq!(key.len(), 10, "a YYYY-MM-DD day: {today}");
    assert_eq!(n(&today["total"], "tokens"), input + output);
    let since_today = env
        .relay
        .cli_json(&["usage", "--by", "day", "--since", &key, "--json"]);
    assert_eq!(since_today["rows"], today["rows"]);
    let out = env.relay.cli(&["usage", "--since", "2099-01-01"]);
    assert!(out.status.success());
    assert_eq!(
        stderr(&out).trim(),
        "no flight reported usage since 2099-01-01 00:00 UTC"
    );
    let out = env.relay.cli(&["usage", "--since", "yesterday"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("neither a duration"),
        "{}",
        stderr(&out)
    );
    let out = env.relay.cli(&["usage", "--by", "week"]);
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flight_past_the_budget_is_refused_until_it_is_raised() {
    let env = Env::start().await;
    env.add_agent("capped", &["--budget", "1/day", "--on-budget", "finish"]);
    let shown = env.relay.cli_ok(&["agent", "show", "capped"]);
    assert!(
        shown.contains("budget    1 tokens/day; a turn past it finishes"),
        "{shown}"
    );
    assert!(shown.contains("today     0 tokens"), "{shown}");

    // The first flight starts under the budget and runs; the next one is refused.
    env.relay.cli_ok(&["ask", "capped", "first"]);
    let out = env.relay.cli(&["ask", "capped", "second"]);
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "refused: {said}");
    assert!(said.contains("(budget_exceeded)"), "{said}");
    assert!(said.contains("capped"), "names the agent: {said}");
    assert!(said.contains("resets at"), "says when it resets: {said}");
    assert!(!said.contains("overloaded"), "{said}");
    let shown = env.relay.cli_ok(&["agent", "show", "capped"]);
    let today = shown.lines().find(|l| l.starts_with("today")).unwrap();
    assert!(today.contains("in 1 flight "), "{shown}");

    // Raised: it runs again. --on-budget alone keeps the limits.
    let set = env
        .relay
        .cli_ok(&["agent", "set", "capped", "--budget", "10m/day"]);
    assert_eq!(
        set.trim(),
        "capped: budget 10000000 tokens/day; a turn past it finishes"
    );
    let set = env
        .relay
        .cli_ok(&["agent", "set", "capped", "--on-budget", "interrupt"]);
    assert_eq!(
        set.trim(),
        "capped: budget 10000000 tokens/day; a turn past it is interrupted"
    );
    env.relay.cli_ok(&["ask", "capped", "third"]);
    let agent = env.relay.cli_json(&["agent", "show", "capped", "--json"]);
    assert_eq!(agent["budget"]["tokens_per_day"], 10_000_000, "{agent}");

    // Removed.
    let set = env.relay.cli_ok(&["agent", "set", "capped", "--no-budget"]);
    assert_eq!(set.trim(), "capped: no budget");
    let shown = env.relay.cli_ok(&["agent", "show", "capped"]);
    assert!(shown.contains("budget    none"), "{shown}");
    // Nothing to set, and a bad limit, are usage errors.
    let out = env.relay.cli(&["agent", "set", "capped"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = env
        .relay
        .cli(&["agent", "set", "capped", "--budget", "5/week"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
