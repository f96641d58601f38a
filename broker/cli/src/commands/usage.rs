//! `relay usage`: tokens and cost of flights added up by agent, conversation, tree, day
//! or node; and how a flight's own usage reads in `relay flight show`
//! ([`flight_usage_line`]). Money is shown to the micro-dollar (`$0.012300`), `?` where
//! no cost is known (no harness cost and no price for the model: `relay up --prices`).

use clap::Args;
use relay_client::Client;
use relay_protocol::api::{UsageQuery, UsageReport};
use relay_protocol::clock::utc_minute;
use relay_protocol::domain::{format_usd, TokenUsage, UsageBy, UsageTotals};
use relay_protocol::methods::call as m;

use crate::help;
use crate::views::print_json;
use crate::views::table::{Cell, Table};

#[derive(Args)]
#[command(after_help = help::USAGE)]
pub struct UsageArgs {
    /// Group flights by agent, conversation, tree (a root flight and the flights it
    /// asked of other agents), day (UTC) or node.
    #[arg(long, value_name = "GROUP", default_value_t = UsageBy::Agent)]
    by: UsageBy,
    /// Only flights created since then: a duration back from now (`30m`, `24h`, `7d`,
    /// `2w`) or a UTC date (`2026-11-27`, from its midnight) [default: all].
    #[arg(long, value_name = "WHEN", value_parser = since_arg)]
    since: Option<u64>,
    /// Only this agent's flights.
    #[arg(long, value_name = "AGENT")]
    agent: Option<String>,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

/// `relay usage`.
pub async fn run(client: &Client, args: UsageArgs) -> anyhow::Result<()> {
    let UsageArgs {
        by,
        since,
        agent,
        json,
    } = args;
    let report: UsageReport = client
        .call::<m::UsageShow>(
            &[],
            &UsageQuery {
                by,
                since,
                agent: agent.clone(),
            },
        )
        .await?;
    if json {
        return print_json(&report);
    }
    report_table(&report).print(
        crate::terminal::width(),
        &nothing_text(agent.as_deref(), report.since),
    );
    Ok(())
}

/// What an empty report says, with its filters: an agent with no usage (or a misspelt
/// name: a removed agent's flights still count, so it is no error) reads as such.
fn nothing_text(agent: Option<&str>, since: Option<u64>) -> String {
    let of = agent.map(|a| format!(" of agent {a}")).unwrap_or_default();
    let since = since
        .map(|s| format!(" since {}", utc_minute(s)))
        .unwrap_or_default();
    format!("no flight{of} reported usage{since}")
}

/// The report as a table: a row per group, then the total (when there is more than
/// one row). The numbers are right-aligned; on a narrow terminal the breakdown
/// columns go first, then the key is cut.
fn report_table(report: &UsageReport) -> Table {
    let key = match report.by {
        UsageBy::Agent => "AGENT",
        UsageBy::Conversation => "CONVERSATION",
        UsageBy::Tree => "TREE",
        UsageBy::Day => "DAY",
        UsageBy::Node => "NODE",
    };
    let numbers = [
        "FLIGHTS",
        "INPUT",
        "CACHED",
        "OUTPUT",
        "REASONING",
        "TOKENS",
        "COST",
    ];
    let headers: Vec<&'static str> = std::iter::once(key).chain(numbers).collect();
    let mut table = Table::new(&headers)
        .flex(key)
        .right(&numbers)
        .optional(&["REASONING", "CACHED", "FLIGHTS"])
        .drop_before_cutting();
    let row = |key: Cell, t: &UsageTotals| {
        let mut cells = vec![key];
        cells.extend(
            [
                t.flights,
                t.input_tokens,
                t.cached_input_tokens,
                t.output_tokens,
                t.reasoning_tokens,
                t.tokens,
            ]
            .map(|n| Cell::new(n.to_string())),
        );
        cells.push(Cell::new(cost_text(t)));
        cells
    };
    for r in &report.rows {
        table.row(row(Cell::new(&r.key), &r.totals));
    }
    if report.rows.len() > 1 {
        table.row(row(Cell::bold("total"), &report.total));
    }
    table
}

/// A total's cost: `$0.012300`; `?` when no flight of it has a known cost; `$0.012300+?`
/// when some have none (the sum leaves them out).
fn cost_text(t: &UsageTotals) -> String {
    match t.flights_without_cost {
        0 => format_usd(t.cost_micro_usd),
        n if n >= t.flights => "?".into(),
        _ => format!("{}+?", format_usd(t.cost_micro_usd)),
    }
}

/// A flight's usage on one line (`relay flight show`): `1200 input (400 cached) + 300
/// output (100 reasoning) = 1500 tokens, $0.012300 (from the harness), model gpt-5`.
pub fn flight_usage_line(u: &TokenUsage) -> String {
    let mut line = format!("{} input", u.input_tokens);
    if u.cached_input_tokens > 0 {
        line.push_str(&format!(" ({} cached)", u.cached_input_tokens));
    }
    line.push_str(&format!(" + {} output", u.output_tokens));
    if let Some(r) = u.reasoning_tokens.filter(|r| *r > 0) {
        line.push_str(&format!(" ({r} reasoning)"));
    }
    line.push_str(&format!(" = {} tokens, ", u.tokens()));
    match (u.cost_micro_usd, u.cost_source) {
        (Some(c), Some(relay_protocol::domain::CostSource::Harness)) => {
            line.push_str(&format!("{} (from the harness)", format_usd(c)))
        }
        (Some(c), Some(relay_protocol::domain::CostSource::Prices)) => {
            line.push_str(&format!("{} (from the price table)", format_usd(c)))
        }
        (Some(c), None) => line.push_str(&format_usd(c)),
        (None, _) => line.push_str("cost unknown"),
    }
    if let Some(model) = &u.model {
        line.push_str(&format!(", model {model}"));
    }
    line
}

/// `--since`: `30m`, `24h`, `7d`, `2w` back from now, or a UTC date `YYYY-MM-DD` (its
/// midnight), as ms since the epoch ([`relay_protocol::clock::parse_since`]; `relay flight
/// list --since` takes it too).
pub(crate) fn since_arg(text: &str) -> Result<u64, String> {
    relay_protocol::clock::parse_since(text, relay_protocol::clock::now_ms())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use relay_protocol::api::UsageRow;

    const NOV_27: u64 = 1_795_737_600_000; // 2026-11-27 00:00 UTC

    #[test]
    fn since_is_parsed_by_protocol_and_resets_read_in_utc_minutes() {
        // The forms of `--since` are tested with the one parser, in protocol's clock.
        assert!(since_arg("24h").is_ok() && since_arg("7").is_err());
        assert_eq!(utc_minute(NOV_27 + 86_400_000), "2026-11-28 00:00 UTC");
        assert_eq!(utc_minute(NOV_27 + 90_061_000), "2026-11-28 01:01 UTC");
        assert_eq!(utc_minute(0), "1970-01-01 00:00 UTC");
    }

    fn totals(flights: u64, tokens: u64, cost: u64, without: u64) -> UsageTotals {
        UsageTotals {
            flights,
            input_tokens: tokens - 10,
            cached_input_tokens: 5,
            output_tokens: 10,
            reasoning_tokens: 2,
            tokens,
            cost_micro_usd: cost,
            flights_without_cost: without,
        }
    }

    #[test]
    fn an_empty_report_says_its_filters() {
        assert_eq!(nothing_text(None, None), "no flight reported usage");
        assert_eq!(
            nothing_text(Some("a1"), Some(NOV_27)),
            "no flight of agent a1 reported usage since 2026-11-27 00:00 UTC"
        );
    }

    #[test]
    fn costs_are_exact_and_unknown_ones_are_said() {
        assert_eq!(cost_text(&totals(1, 100, 12_300, 0)), "$0.012300");
        assert_eq!(cost_text(&totals(2, 100, 0, 2)), "?");
        assert_eq!(cost_text(&totals(3, 100, 12_300, 1)), "$0.012300+?");
    }

    fn report() -> UsageReport {
        UsageReport {
            by: UsageBy::Agent,
            since: None,
            rows: vec![
                UsageRow {
                    key: "codex-1".into(),
                    totals: totals(2, 1500, 12_300, 0),
                },
                UsageRow {
                    key: "a-longer-agent-name".into(),
                    totals: totals(1, 40, 0, 1),
                },
            ],
            total: totals(3, 1540, 12_300, 1),
        }
    }

    #[test]
    fn the_report_is_a_table_with_a_total_line() {
        let lines = report_table(&report()).render(None);
        assert_eq!(
            lines,
            vec![
                "AGENT                FLIGHTS  INPUT  CACHED  OUTPUT  REASONING  TOKENS         COST",
                "codex-1                    2   1490       5      10          2    1500    $0.012300",
                "a-longer-agent-name        1     30       5      10          2      40            ?",
                "total                      3   1530       5      10          2    1540  $0.012300+?",
            ]
        );
        // One row: no total line to repeat it.
        let mut one = report();
        one.rows.truncate(1);
        assert_eq!(report_table(&one).render(None).len(), 2);
    }

    #[test]
    fn a_narrow_terminal_leaves_the_breakdown_out_before_cutting_the_key() {
        let lines = report_table(&report()).render(Some(60));
        assert!(
            lines.iter().all(|l| crate::terminal::columns(l) <= 60),
            "{lines:#?}"
        );
        assert!(!lines[0].contains("REASONING"), "{lines:#?}");
        assert!(lines[2].starts_with("a-longer-agent-name "), "{lines:#?}");
        assert!(lines[0].ends_with("COST"), "{lines:#?}");
    }

    #[test]
    fn a_flight_usage_reads_on_one_line() {
        let u = TokenUsage {
            input_tokens: 1200,
            cached_input_tokens: 400,
            output_tokens: 300,
            reasoning_tokens: Some(100),
            model: Some("gpt-5".into()),
            cost_micro_usd: Some(12_300),
            cost_source: Some(relay_protocol::domain::CostSource::Harness),
        };
        assert_eq!(
            flight_usage_line(&u),
            "1200 input (400 cached) + 300 output (100 reasoning) = 1500 tokens, $0.012300 (from the harness), model gpt-5"
        );
        assert_eq!(
            flight_usage_line(&TokenUsage::new(10, 2)),
            "10 input + 2 output = 12 tokens, cost unknown"
        );
    }
}
