//! What flights cost: tokens, the model, money; totals; budgets.
//!
//! Counting conventions, the same for every harness (each adapter converts):
//! `input_tokens` includes the cached input (`cached_input_tokens` is the part of it
//! read from a cache), `output_tokens` includes the reasoning (`reasoning_tokens`, where
//! reported). A flight's usage is its turn's running total, as last reported. Money is
//! kept in millionths of a US dollar (`cost_micro_usd`), so totals add up exactly; it
//! comes from the harness where it reports one, else from the price table the user
//! gives (`relay up --prices FILE`), else it is unknown (`null`).
//!
//! A day is a UTC calendar day; a flight counts in the day it was created.

use serde::{Deserialize, Serialize};

use crate::names::wire_enum;

wire_enum! {
    /// Where a cost comes from.
    pub enum CostSource("cost source") {
        /// The harness reported it (Claude Code's `total_cost_usd`, Pi's cost...).
        Harness = "harness",
        /// Computed from the user's price table (`relay up --prices`).
        Prices = "prices",
    }
}

/// Tokens a turn used and what they cost (a flight's [`crate::domain::Flight::usage`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// All input tokens, cached ones included.
    pub input_tokens: u64,
    /// The part of `input_tokens` read from the model's cache.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// All output tokens, reasoning included.
    pub output_tokens: u64,
    /// The part of `output_tokens` spent reasoning, where the harness says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// The model that answered, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Millionths of a US dollar, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_source: Option<CostSource>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TokenUsage {
    /// Plain counts, nothing else known.
    pub fn new(input_tokens: u64, output_tokens: u64) -> TokenUsage {
        TokenUsage {
            input_tokens,
            output_tokens,
            ..TokenUsage::default()
        }
    }

    /// What budgets count as tokens: input (cached included) plus output.
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// Usage added up over flights (a row of `relay usage`, a day's budget consumption).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Flights counted (those that reported usage).
    pub flights: u64,
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    /// Input plus output.
    pub tokens: u64,
    /// The sum of the known costs.
    pub cost_micro_usd: u64,
    /// Flights whose cost is unknown (no harness cost and no price for their model):
    /// `cost_micro_usd` leaves them out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub flights_without_cost: u64,
}

impl UsageTotals {
    /// Adds one flight's usage.
    /// Saturating: the counts come from the harnesses, and a wild one (an agent's bug)
    /// must pin a total at its maximum, past every budget, not wrap it back under one
    /// (or panic the writer that folds it).
    pub fn add(&mut self, u: &TokenUsage) {
        self.flights = self.flights.saturating_add(1);
        self.input_tokens = self.input_tokens.saturating_add(u.input_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(u.cached_input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(u.output_tokens);
        self.reasoning_tokens = self
            .reasoning_tokens
            .saturating_add(u.reasoning_tokens.unwrap_or(0));
        self.tokens = self.tokens.saturating_add(u.tokens());
        match u.cost_micro_usd {
            Some(c) => self.cost_micro_usd = self.cost_micro_usd.saturating_add(c),
            None => self.flights_without_cost = self.flights_without_cost.saturating_add(1),
        }
    }
}

wire_enum! {
    /// What a running turn does when it crosses its agent's budget.
    #[derive(Default)]
    pub enum OnBudget("on-budget") {
        /// The turn finishes; the next flight is refused.
        #[default]
        Finish = "finish",
        /// The turn is interrupted (its flight cancelled with `budget_exceeded`).
        Interrupt = "interrupt",
    }
}

/// An agent's limits (`relay agent add/set --budget 200000/day --budget $5/day
/// --budget 50000/tree`). A flight that would start past one is refused with
/// `budget_exceeded`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Tokens per UTC day, over the agent's flights created that day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    /// Millionths of a US dollar per UTC day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd_per_day: Option<u64>,
    /// Tokens per flight tree (a root flight and its agent-to-agent children, all
    /// agents), counted for the flights of this agent's trees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_tree: Option<u64>,
    /// Millionths of a US dollar per flight tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd_per_tree: Option<u64>,
    #[serde(default)]
    pub on_exceed: OnBudget,
}

impl Budget {
    /// Sets one limit from its command-line form: `TOKENS/day`, `$USD/day`,
    /// `TOKENS/tree`, `$USD/tree` (`200000/day`, `$2.50/day`, `50k/tree`; `k` and `m`
    /// multiply tokens by a thousand and a million). The error says what is wrong.
    pub fn set_limit(&mut self, text: &str) -> Result<(), String> {
        let bad = |why: &str| {
            format!("budget {text:?}: {why} (write TOKENS/day, $USD/day, TOKENS/tree or $USD/tree, like 200000/day or $5/day)")
        };
        let (amount, per) = text
            .trim()
            .rsplit_once('/')
            .ok_or_else(|| bad("no period"))?;
        let per_day = match per.trim() {
            "day" | "d" => true,
            "tree" => false,
            _ => return Err(bad("the period must be `day` or `tree`")),
        };
        let amount = amount.trim();
        if let Some(usd) = amount.strip_prefix('$') {
            let micros = parse_usd_micros(usd).ok_or_else(|| bad("not an amount of dollars"))?;
            if per_day {
                self.cost_micro_usd_per_day = Some(micros);
            } else {
                self.cost_micro_usd_per_tree = Some(micros);
            }
        } else {
            let (digits, mult) = match amount.to_ascii_lowercase() {
                a if a.ends_with('k') => (a.trim_end_matches('k').to_string(), 1_000),
                a if a.ends_with('m') => (a.trim_end_matches('m').to_string(), 1_000_000),
                a => (a, 1),
            };
            let tokens = digits
                .replace('_', "")
                .parse::<u64>()
                .ok()
                .and_then(|n| n.checked_mul(mult))
                .ok_or_else(|| bad("not a whole number of tokens"))?;
            if per_day {
                self.tokens_per_day = Some(tokens);
            } else {
                self.tokens_per_tree = Some(tokens);
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.tokens_per_day.is_none()
            && self.cost_micro_usd_per_day.is_none()
            && self.tokens_per_tree.is_none()
            && self.cost_micro_usd_per_tree.is_none()
    }
}

wire_enum! {
    /// How `relay usage` groups flights.
    #[derive(Default)]
    pub enum UsageBy("usage grouping") {
        #[default]
        Agent = "agent",
        Conversation = "conversation",
        /// By root flight: a root and its agent-to-agent children.
        Tree = "tree",
        /// By UTC day (`YYYY-MM-DD`).
        Day = "day",
        /// By the node that served the agent (`local` for the broker's own runtime).
        Node = "node",
    }
}

/// A harness's cost in US dollars as a float (Claude Code's `total_cost_usd`, Pi's
/// `cost.total`) -> millionths of a dollar, rounded to the nearest; `None` for a value
/// that is not a finite, non-negative amount.
pub fn usd_to_micros(usd: f64) -> Option<u64> {
    let micros = (usd * 1_000_000.0).round();
    // `as` would saturate: the bound keeps a huge value from passing as u64::MAX.
    (micros.is_finite() && micros >= 0.0 && micros < u64::MAX as f64).then_some(micros as u64)
}

/// `2.5` -> 2_500_000 millionths of a dollar; `None` for anything but a non-negative
/// decimal with at most six decimal places.
pub fn parse_usd_micros(text: &str) -> Option<u64> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole.chars().all(|c| c.is_ascii_digit())
        || !frac.chars().all(|c| c.is_ascii_digit())
        || frac.len() > 6
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac: u64 = format!("{frac:0<6}").parse().ok()?;
    whole.checked_mul(1_000_000)?.checked_add(frac)
}

/// Millionths of a dollar as `$0.012300`.
pub fn format_usd(micros: u64) -> String {
    format!("${}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn harness_dollars_round_to_the_nearest_micro_dollar() {
        assert_eq!(usd_to_micros(0.0001), Some(100));
        // Claude Code's sums carry float noise: 0.00030000000000000003.
        assert_eq!(usd_to_micros(0.000_300_000_000_000_000_03), Some(300));
        assert_eq!(usd_to_micros(0.000_000_4), Some(0));
        assert_eq!(usd_to_micros(0.000_000_6), Some(1));
        assert_eq!(usd_to_micros(0.027575 - 0.006525), Some(21050));
        for bad in [-0.01, f64::NAN, f64::INFINITY, 1e300] {
            assert_eq!(usd_to_micros(bad), None, "{bad}");
        }
    }

    #[test]
    fn budget_limits_parse_from_their_command_line_form() {
        let mut b = Budget::default();
        b.set_limit("200000/day").unwrap();
        b.set_limit("$2.50/day").unwrap();
        b.set_limit("50k/tree").unwrap();
        b.set_limit("$0.000001/tree").unwrap();
        assert_eq!(b.tokens_per_day, Some(200_000));
        assert_eq!(b.cost_micro_usd_per_day, Some(2_500_000));
        assert_eq!(b.tokens_per_tree, Some(50_000));
        assert_eq!(b.cost_micro_usd_per_tree, Some(1));
        for bad in [
            "",
            "5",
            "5/week",
            "$/day",
            "$1.0000001/day",
            "-5/day",
            "x/day",
            "$-1/day",
        ] {
            assert!(Budget::default().set_limit(bad).is_err(), "{bad}");
        }
        assert_eq!(format_usd(2_500_000), "$2.500000");
        assert_eq!(parse_usd_micros(".5"), Some(500_000));
    }

    #[test]
    fn totals_add_up_exactly_and_count_unknown_costs() {
        let mut t = UsageTotals::default();
        let u = TokenUsage {
            input_tokens: 100,
            cached_input_tokens: 40,
            output_tokens: 7,
            reasoning_tokens: Some(3),
            model: None,
            cost_micro_usd: Some(10),
            cost_source: Some(CostSource::Harness),
        };
        t.add(&u);
        t.add(&TokenUsage {
            cost_micro_usd: None,
            ..u.clone()
        });
        assert_eq!(
            (
                t.flights,
                t.tokens,
                t.cost_micro_usd,
                t.flights_without_cost
            ),
            (2, 214, 10, 1)
        );
        assert_eq!((t.cached_input_tokens, t.reasoning_tokens), (80, 6));
    }

    #[test]
    fn wild_counts_pin_the_totals_at_their_maximum() {
        let wild = TokenUsage {
            input_tokens: u64::MAX,
            cached_input_tokens: u64::MAX,
            output_tokens: u64::MAX,
            reasoning_tokens: Some(u64::MAX),
            model: None,
            cost_micro_usd: Some(u64::MAX),
            cost_source: Some(CostSource::Harness),
        };
        let mut t = UsageTotals::default();
        t.add(&TokenUsage::new(5, 5));
        t.add(&wild);
        t.add(&wild);
        assert_eq!(
            (t.flights, t.input_tokens, t.output_tokens, t.tokens),
            (3, u64::MAX, u64::MAX, u64::MAX)
        );
        assert_eq!(
            (t.cached_input_tokens, t.reasoning_tokens, t.cost_micro_usd),
            (u64::MAX, u64::MAX, u64::MAX)
        );
    }
}
