//! What flights used, added up: a flight on each real CLI and an agent-to-agent tree
//! (Claude Code's shell runs `relay ask` of the Codex agent), with a price table for the
//! mock's model; `relay usage --by agent|tree|day --json` against the flights' own
//! records.

use std::collections::BTreeMap;

use relay_protocol::domain::{CostSource, TokenUsage, UsageTotals};
use relay_tests::agents::Env;
use serde_json::Value;

use crate::clis::{relay_usage, usage_report, with_usage, Cli, Step};

/// Dollars per million tokens of the mock's model: whole micro-dollars per token, so
/// the cost Relay computes is exact.
const PRICES: &str =
    r#"{"models": {"mock-model": {"input": 2, "cached_input": "1", "output": "8"}}}"#;

/// The UTC date (`YYYY-MM-DD`) of `ms` since the epoch (Howard Hinnant's
/// `civil_from_days`): this test's own reckoning, not the broker's.
pub fn utc_date(ms: u64) -> String {
    let z = ms / 86_400_000 + 719_468;
    let (era, doe) = (z / 146_097, z % 146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A flight's usage, as its record holds it.
fn usage_of(f: &Value) -> TokenUsage {
    serde_json::from_value(f["usage"].clone()).unwrap_or_else(|e| panic!("{e}: {f}"))
}

/// The report's rows by key, and its total. The rows come largest cost first, then most
/// tokens, then by key.
fn rows(report: &Value) -> (BTreeMap<String, UsageTotals>, UsageTotals) {
    let rows = report["rows"].as_array().unwrap();
    let order: Vec<(std::cmp::Reverse<u64>, std::cmp::Reverse<u64>, &str)> = rows
        .iter()
        .map(|r| {
            (
                std::cmp::Reverse(r["cost_micro_usd"].as_u64().unwrap()),
                std::cmp::Reverse(r["tokens"].as_u64().unwrap()),
                r["key"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(order.is_sorted(), "rows out of order: {report}");
    let by_key = rows
        .iter()
        .map(|r| {
            let key = r["key"].as_str().unwrap().to_string();
            (key, serde_json::from_value(r.clone()).unwrap())
        })
        .collect();
    (
        by_key,
        serde_json::from_value(report["total"].clone()).unwrap(),
    )
}

/// What a report grouped by `key` must say of `flights`.
fn expected(
    flights: &[Value],
    key: impl Fn(&Value) -> String,
) -> (BTreeMap<String, UsageTotals>, UsageTotals) {
    let mut by_key: BTreeMap<String, UsageTotals> = BTreeMap::new();
    let mut total = UsageTotals::default();
    for f in flights {
        let u = usage_of(f);
        by_key.entry(key(f)).or_default().add(&u);
        total.add(&u);
    }
    (by_key, total)
}

/// What the writer charges for `u` at [`PRICES`] (model `mock-model`, no harness cost).
fn priced(u: &TokenUsage) -> u64 {
    u.cached_input_tokens + (u.input_tokens - u.cached_input_tokens) * 2 + u.output_tokens * 8
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_adds_up_by_agent_tree_and_day() {
    let prices = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(prices.path(), PRICES).unwrap();
    let env = Env::start_with(&["--prices", &prices.path().to_string_lossy()]).await;
    env.mock.set_handler(crate::clis::script);
    Cli::Codex.add(&env, "cx", &[]);
    // Its shell asks the Codex agent: accepted by the agent's rule.
    // Named, the mock's model is one Claude Code does not know (it prices it its own
    // way) and one the price table prices for Qwen Code, whose reports name no model.
    let model = ["--model", "mock-model"];
    let rule = ["--auto-accept", "relay ask cx hello"];
    Cli::Claude.add(&env, "cl", &[&model[..], &rule[..]].concat());
    Cli::Qwen.add(&env, "qw", &model);

    // A text flight on each harness, and a tree: cl's flight, cx's child under it.
    let mut ids: Vec<String> = ["cx", "cl", "qw"]
        .iter()
        .map(|a| env.ask_no_wait(a, &format!("hello {a}")))
        .collect();
    let root = env.ask_no_wait("cl", "exec: relay ask cx hello");
    ids.push(root.clone());
    let mut flights = Vec::new();
    for id in &ids {
        flights.push(with_usage(&env, id).await);
    }
    let root_flight = flights.last().unwrap().clone();
    // Its shell read the child's reply.
    // (`relay ask` also wrote the child's notes on stderr, which the Bash tool keeps:
    // Codex's "Model metadata for `mock-model` not found" warning.)
    let output = root_flight["output"].as_str().unwrap_or_default();
    assert!(
        output.starts_with("outputs: ") && output.trim_end().ends_with("ok"),
        "{root_flight}"
    );
    let children: Vec<Value> = crate::clis::flights_of(&env, "cx")
        .into_iter()
        .filter(|f| f["parent_flight"] == root.as_str())
        .collect();
    assert_eq!(children.len(), 1, "{children:?}");
    let child = with_usage(&env, children[0]["id"].as_str().unwrap()).await;
    assert_eq!(child["root_flight"], root.as_str(), "{child}");
    flights.push(child);

    // Each flight's usage is what the mock reported for its calls, added up; the
    // price table's cost where the harness reports none.
    let turns = [
        (Cli::Codex, &[Step::Text][..]),
        (Cli::Claude, &[Step::Text]),
        (Cli::Qwen, &[Step::Text]),
        (Cli::Claude, &[Step::Call, Step::Answer]),
        (Cli::Codex, &[Step::Text]),
    ];
    for (f, (cli, steps)) in flights.iter().zip(turns) {
        let mut want = relay_usage(cli, steps);
        if cli != Cli::Claude {
            want.cost_micro_usd = Some(priced(&want));
            want.cost_source = Some(CostSource::Prices);
        }
        let got = usage_of(f);
        if cli == Cli::Qwen {
            // Qwen Code names no model; Relay priced it by the agent's.
            want.model = got.model.clone();
        }
        assert_eq!(got, want, "{cli:?} {steps:?}: {f}");
    }

    // By agent, by tree (the root and its child in one row; every other flight its own
    // tree), by day: each row is the sum of its flights' records, exactly.
    let by_agent = expected(&flights, |f| f["agent"].as_str().unwrap().to_string());
    assert_eq!(rows(&usage_report(&env, &["--by", "agent"])), by_agent);
    let by_tree = expected(&flights, |f| {
        f["root_flight"]
            .as_str()
            .or(f["id"].as_str())
            .unwrap()
            .to_string()
    });
    assert_eq!(by_tree.0[&root].flights, 2, "{by_tree:?}");
    assert_eq!(rows(&usage_report(&env, &["--by", "tree"])), by_tree);
    let by_day = expected(&flights, |f| utc_date(f["created_at"].as_u64().unwrap()));
    assert_eq!(rows(&usage_report(&env, &["--by", "day"])), by_day);
    // The same report over HTTP.
    let (code, http) = env.relay.http().get("/v1/usage?by=agent").await;
    assert_eq!(code, 200, "{http}");
    assert_eq!(rows(&http), by_agent);
}
