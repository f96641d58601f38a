//! Budgets: `relay agent add|set --budget LIMIT... [--on-budget finish|interrupt]`,
//! `relay agent set NAME --no-budget`, and the lines `relay agent show` prints of an
//! agent's budget and what it used of it today ([`show_lines`]).

use clap::Args;
use relay_client::Client;
use relay_protocol::api::{AgentSettings, BudgetStatus, Empty};
use relay_protocol::domain::{format_usd, Agent, Budget, OnBudget};
use relay_protocol::methods::call as m;

use crate::exit::usage;
use crate::help;
use crate::terminal::outln;
use crate::views::print_json;

/// `--budget` and `--on-budget`, as `relay agent add` and `relay agent set` take them.
#[derive(Args)]
pub struct BudgetArgs {
    /// A limit on what the agent may use (repeatable): TOKENS/day, $USD/day,
    /// TOKENS/tree or $USD/tree (`200000/day`, `50k/tree`, `$5/day`; `k` and `m`
    /// multiply tokens). A day is a UTC day; a tree is a flight and the flights it asks
    /// of other agents. A flight that would start past a limit is refused with
    /// `budget_exceeded`.
    #[arg(long = "budget", value_name = "LIMIT", value_parser = limit_arg)]
    budget: Vec<String>,
    /// What a running turn does when it crosses a limit: `finish` (it ends as it
    /// would; the next flight is refused) or `interrupt` (it is cancelled) [default:
    /// finish].
    #[arg(long, value_name = "WHAT")]
    on_budget: Option<OnBudget>,
}

impl BudgetArgs {
    /// The budget these flags give, `None` without `--budget`; `--on-budget` alone is
    /// refused (it says what to do at a limit there is none of).
    pub fn budget(&self) -> anyhow::Result<Option<Budget>> {
        if self.budget.is_empty() {
            if self.on_budget.is_some() {
                usage!("--on-budget goes with --budget (it says what a turn does at a limit)");
            }
            return Ok(None);
        }
        let mut budget = Budget {
            on_exceed: self.on_budget.unwrap_or_default(),
            ..Budget::default()
        };
        let mut given: Vec<(&String, Budget)> = Vec::new();
        for limit in &self.budget {
            let mut one = Budget::default();
            if let Err(why) = one.set_limit(limit) {
                usage!("{why}");
            }
            // Two limits on the same thing: the last would silently win.
            if let Some((earlier, _)) = given.iter().find(|(_, b)| same_kind(b, &one)) {
                usage!("--budget {earlier} and --budget {limit} limit the same thing: give one");
            }
            if let Err(why) = budget.set_limit(limit) {
                usage!("{why}");
            }
            given.push((limit, one));
        }
        Ok(Some(budget))
    }
}

/// Whether two one-limit budgets limit the same thing (tokens or cost, per day or tree).
fn same_kind(a: &Budget, b: &Budget) -> bool {
    (a.tokens_per_day.is_some() && b.tokens_per_day.is_some())
        || (a.cost_micro_usd_per_day.is_some() && b.cost_micro_usd_per_day.is_some())
        || (a.tokens_per_tree.is_some() && b.tokens_per_tree.is_some())
        || (a.cost_micro_usd_per_tree.is_some() && b.cost_micro_usd_per_tree.is_some())
}

/// `--budget`'s value, checked as clap parses it (so `--help`'s usage error names it).
fn limit_arg(text: &str) -> Result<String, String> {
    Budget::default().set_limit(text).map_err(|why| {
        // An unquoted `$5/day` reaches us as `/day` (`$5` is the shell's fifth
        // argument) and `$0.5/day` as `bash.5/day`: say why, not only that it is wrong.
        let amount = text.rsplit_once('/').map_or(text, |(a, _)| a).trim();
        if !text.contains('$') && (amount.is_empty() || amount.contains('.')) {
            format!("{why}; a dollar amount needs quotes in a shell (`--budget '$5/day'`), or `$5` is read as a shell variable")
        } else {
            why
        }
    })?;
    Ok(text.to_string())
}

/// `relay agent set`.
#[derive(Args)]
#[command(after_help = help::AGENT_SET)]
pub struct SetArgs {
    /// The agent's name.
    name: String,
    #[command(flatten)]
    budget: BudgetArgs,
    /// Remove the agent's budget: no limit.
    #[arg(long, conflicts_with_all = ["budget", "on_budget"])]
    no_budget: bool,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

/// `relay agent set NAME --budget ...|--on-budget ...|--no-budget`: `--budget` replaces
/// every limit; `--on-budget` alone keeps the limits and changes what a turn does.
pub async fn set(client: &Client, args: SetArgs) -> anyhow::Result<()> {
    let SetArgs {
        name,
        budget,
        no_budget,
        json,
    } = args;
    let new = if no_budget {
        Budget::default()
    } else if let Some(on) = budget.on_budget.filter(|_| budget.budget.is_empty()) {
        let agent: Agent = client.call::<m::AgentShow>(&[&name], &Empty {}).await?;
        match agent.spec.budget.filter(|b| !b.is_empty()) {
            Some(b) => Budget { on_exceed: on, ..b },
            None => usage!("{name} has no budget: give its limits with --budget"),
        }
    } else {
        match budget.budget()? {
            Some(b) => b,
            None => usage!(
                "nothing to set: give --budget LIMIT (repeatable), --on-budget or --no-budget"
            ),
        }
    };
    let settings = AgentSettings { budget: Some(new) };
    let agent: Agent = client.call::<m::AgentSet>(&[&name], &settings).await?;
    if json {
        return print_json(&agent);
    }
    match agent.spec.budget.as_ref().filter(|b| !b.is_empty()) {
        Some(b) => outln!("{}: budget {}", agent.spec.name, budget_text(b)),
        None => outln!("{}: no budget", agent.spec.name),
    }
    Ok(())
}

/// A budget on one line: `200000 tokens/day, $5.000000/day, 50000 tokens/tree; a turn
/// past it finishes`.
pub fn budget_text(b: &Budget) -> String {
    let mut limits = Vec::new();
    if let Some(t) = b.tokens_per_day {
        limits.push(format!("{t} tokens/day"));
    }
    if let Some(c) = b.cost_micro_usd_per_day {
        limits.push(format!("{}/day", format_usd(c)));
    }
    if let Some(t) = b.tokens_per_tree {
        limits.push(format!("{t} tokens/tree"));
    }
    if let Some(c) = b.cost_micro_usd_per_tree {
        limits.push(format!("{}/tree", format_usd(c)));
    }
    let past = match b.on_exceed {
        OnBudget::Finish => "a turn past it finishes",
        OnBudget::Interrupt => "a turn past it is interrupted",
    };
    format!("{}; {past}", limits.join(", "))
}

/// `relay agent show`'s budget lines: the limits, and today's use against them.
pub fn show_lines(status: &BudgetStatus) -> Vec<String> {
    let t = &status.today;
    let cost = match t.flights_without_cost {
        0 => format_usd(t.cost_micro_usd),
        n if n >= t.flights => "cost unknown".into(),
        _ => format!("{} (some costs unknown)", format_usd(t.cost_micro_usd)),
    };
    let flights = match t.flights {
        1 => "1 flight".to_string(),
        n => format!("{n} flights"),
    };
    let mut lines = Vec::new();
    match status.budget.as_ref().filter(|b| !b.is_empty()) {
        Some(b) => lines.push(format!("budget    {}", budget_text(b))),
        None => lines.push("budget    none (relay agent set NAME --budget LIMIT)".into()),
    }
    lines.push(format!(
        "today     {} tokens, {cost} in {flights} (the day resets at {})",
        t.tokens,
        relay_protocol::clock::utc_minute(status.resets_at)
    ));
    lines
}

/// `relay agent show`'s budget lines, asked of the broker; a broker that cannot say
/// gets a line saying so (the rest of the agent still shows).
pub async fn agent_lines(client: &Client, name: &str) -> Vec<String> {
    match client.call::<m::AgentBudget>(&[name], &Empty {}).await {
        Ok(status) => show_lines(&status),
        Err(e) => vec![format!("budget    unknown: {e}")],
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;
    use relay_protocol::domain::UsageTotals;

    use super::*;

    #[derive(Parser)]
    struct Set {
        #[command(flatten)]
        args: SetArgs,
    }

    fn parse(args: &[&str]) -> Result<SetArgs, String> {
        let argv = ["set", "a1"].into_iter().chain(args.iter().copied());
        Set::try_parse_from(argv)
            .map(|s| s.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn budgets_are_limits_in_their_command_line_form() {
        let a = parse(&[
            "--budget",
            "200000/day",
            "--budget",
            "$5/day",
            "--budget",
            "50k/tree",
            "--on-budget",
            "interrupt",
        ])
        .unwrap();
        let b = a.budget.budget().unwrap().unwrap();
        assert_eq!(b.tokens_per_day, Some(200_000));
        assert_eq!(b.cost_micro_usd_per_day, Some(5_000_000));
        assert_eq!(b.tokens_per_tree, Some(50_000));
        assert_eq!(b.on_exceed, OnBudget::Interrupt);
        assert_eq!(
            budget_text(&b),
            "200000 tokens/day, $5.000000/day, 50000 tokens/tree; a turn past it is interrupted"
        );
        // A bad limit is refused as clap parses it, naming the forms.
        let bad = parse(&["--budget", "5/week"]).err().unwrap();
        assert!(bad.contains("the period must be `day` or `tree`"), "{bad}");
        assert!(!bad.contains("quotes"), "{bad}");
        // What a shell leaves of an unquoted `$5/day` and `$0.5/day`.
        for unquoted in ["/day", "bash.5/day"] {
            let bad = parse(&["--budget", unquoted]).err().unwrap();
            assert!(bad.contains("needs quotes in a shell"), "{bad}");
        }
        let bad = parse(&["--on-budget", "explode"]).err().unwrap();
        assert!(bad.contains("explode"), "{bad}");
        let both = parse(&["--no-budget", "--budget", "1/day"]).err().unwrap();
        assert!(both.contains("cannot be used with"), "{both}");
        // --on-budget alone is no budget (at add; set keeps the limits it has).
        let alone = parse(&["--on-budget", "finish"]).unwrap();
        let e = alone.budget.budget().unwrap_err().to_string();
        assert!(e.contains("--on-budget goes with --budget"), "{e}");
        // The same limit twice is refused, not the last taken.
        let twice = parse(&["--budget", "5/day", "--budget", "10k/d"]).unwrap();
        let e = twice.budget.budget().unwrap_err().to_string();
        assert_eq!(
            e,
            "--budget 5/day and --budget 10k/d limit the same thing: give one"
        );
        let apart = parse(&[
            "--budget", "5/day", "--budget", "$5/day", "--budget", "5/tree",
        ]);
        assert!(apart.unwrap().budget.budget().unwrap().is_some());
        assert!(parse(&[]).unwrap().budget.budget().unwrap().is_none());
    }

    #[test]
    fn show_says_the_budget_and_todays_use() {
        let mut budget = Budget::default();
        budget.set_limit("1000/day").unwrap();
        let status = BudgetStatus {
            agent: "a1".into(),
            budget: Some(budget),
            today: UsageTotals {
                flights: 2,
                tokens: 1200,
                cost_micro_usd: 12_300,
                ..UsageTotals::default()
            },
            resets_at: 1_795_824_000_000,
        };
        assert_eq!(
            show_lines(&status),
            vec![
                "budget    1000 tokens/day; a turn past it finishes",
                "today     1200 tokens, $0.012300 in 2 flights (the day resets at 2026-11-28 00:00 UTC)",
            ]
        );
        let none = BudgetStatus {
            budget: None,
            today: UsageTotals::default(),
            ..status
        };
        assert_eq!(
            show_lines(&none)[0],
            "budget    none (relay agent set NAME --budget LIMIT)"
        );
        assert!(show_lines(&none)[1].starts_with("today     0 tokens, $0.000000 in 0 flights"));
    }
}
