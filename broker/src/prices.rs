//! The price table the user gives (`relay up --prices FILE`): what a model's tokens cost,
//! so the writer can put a cost on a flight whose harness reported none. Relay ships no
//! prices: they change, and only the user knows what they pay.
//!
//! The file is JSON: `{"models": {"MODEL": {"input": P, "cached_input": P, "output": P}}}`,
//! each `P` US dollars per million tokens, a number or a decimal string (`"0.15"`), at
//! most six decimal places; `cached_input` is optional (the input price without it).
//! A model is looked up by its exact name. A bad file is refused at start, naming the
//! line and what is wrong.

use std::collections::BTreeMap;
use std::fmt;

use relay_protocol::domain::{parse_usd_micros, CostSource, TokenUsage};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

/// Millionths of a dollar per million tokens: a price written with up to six decimal
/// places is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price(u64);

/// One model's prices.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input: Price,
    #[serde(default)]
    pub cached_input: Option<Price>,
    pub output: Price,
}

/// The table, by model name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTable {
    pub models: BTreeMap<String, ModelPrice>,
}

impl PriceTable {
    /// Parses a price file's text; the error names the line (and column) and the fault.
    pub fn parse(text: &str) -> Result<PriceTable, String> {
        let table: PriceTable = serde_json::from_str(text).map_err(|e| {
            format!(
                "{e} (the price file is JSON: {{\"models\": {{\"MODEL\": {{\"input\": USD_PER_MILLION_TOKENS, \"cached_input\": ..., \"output\": ...}}}}}})"
            )
        })?;
        if let Some(name) = table.models.keys().find(|m| m.trim().is_empty()) {
            return Err(format!("a model's name is empty ({name:?})"));
        }
        Ok(table)
    }

    /// Reads and parses a price file; the error names the file.
    pub fn load(path: &std::path::Path) -> Result<PriceTable, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the price file {}: {e}", path.display()))?;
        PriceTable::parse(&text).map_err(|e| format!("price file {}: {e}", path.display()))
    }

    /// `usage` with its cost: the harness's where it gave one (source `harness`), else
    /// from this table by `model` (the usage's own model first), else none.
    pub fn fill(
        table: Option<&PriceTable>,
        mut usage: TokenUsage,
        model: Option<&str>,
    ) -> TokenUsage {
        if usage.cost_micro_usd.is_some() {
            usage.cost_source = Some(CostSource::Harness);
            return usage;
        }
        usage.cost_source = None;
        let model = usage.model.as_deref().or(model);
        if let Some(price) = table.zip(model).and_then(|(t, m)| t.models.get(m)) {
            usage.cost_micro_usd = Some(price.cost(&usage));
            usage.cost_source = Some(CostSource::Prices);
        }
        usage
    }
}

impl ModelPrice {
    /// Cached input at the cached price, the rest of the input at the input price,
    /// output at the output price; rounded once, to the nearest millionth of a dollar.
    pub fn cost(&self, u: &TokenUsage) -> u64 {
        let cached = u.cached_input_tokens.min(u.input_tokens);
        let cached_price = self.cached_input.unwrap_or(self.input).0;
        // Each product fits a u128; their sum may not (a wild count at a wild price):
        // saturated, the cost reads as the most there is.
        let numerator = (u128::from(cached) * u128::from(cached_price))
            .saturating_add(u128::from(u.input_tokens - cached) * u128::from(self.input.0))
            .saturating_add(u128::from(u.output_tokens) * u128::from(self.output.0));
        // Tokens x millionths of a dollar per million tokens: divide by a million.
        let micros = numerator.saturating_add(500_000) / 1_000_000;
        u64::try_from(micros).unwrap_or(u64::MAX)
    }
}

impl<'de> Deserialize<'de> for Price {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Price, D::Error> {
        d.deserialize_any(PriceVisitor)
    }
}

struct PriceVisitor;

impl PriceVisitor {
    fn decimal<E: de::Error>(text: &str) -> Result<Price, E> {
        parse_usd_micros(text.trim()).map(Price).ok_or_else(|| {
            E::custom(format!(
                "price {text:?} is not a non-negative number of US dollars per million tokens with at most six decimal places"
            ))
        })
    }
}

impl Visitor<'_> for PriceVisitor {
    type Value = Price;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("US dollars per million tokens: a number or a decimal string")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Price, E> {
        v.checked_mul(1_000_000)
            .map(Price)
            .ok_or_else(|| E::custom(format!("price {v} is too large")))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Price, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::custom(format!("price {v} is negative"))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Price, E> {
        // Rust writes a float in its shortest exact form without an exponent (0.15,
        // 0.0000001), which the decimal rule then takes or refuses.
        Self::decimal(&format!("{v}"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Price, E> {
        Self::decimal(v)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn prices_parse_from_numbers_and_strings_and_cost_exactly() {
        let t = PriceTable::parse(
            r#"{"models": {
                "m1": {"input": 1.25, "cached_input": "0.125", "output": 10},
                "m2": {"input": "3", "output": 15.5}
            }}"#,
        )
        .unwrap();
        let m1 = &t.models["m1"];
        assert_eq!(
            (m1.input, m1.cached_input, m1.output),
            (Price(1_250_000), Some(Price(125_000)), Price(10_000_000))
        );
        let mut u = TokenUsage::new(1_000_000, 100_000);
        u.cached_input_tokens = 400_000;
        // 400k cached at $0.125/M + 600k at $1.25/M + 100k out at $10/M.
        assert_eq!(m1.cost(&u), 50_000 + 750_000 + 1_000_000);
        // Without a cached price, cached input costs the input price.
        assert_eq!(t.models["m2"].cost(&u), 3_000_000 + 1_550_000);
        // Rounded to the nearest millionth: 1 token at $0.4/M is 0.4 micro-dollars.
        let one = TokenUsage::new(1, 0);
        let cheap = PriceTable::parse(r#"{"models":{"c":{"input":0.4,"output":0.6}}}"#).unwrap();
        assert_eq!(cheap.models["c"].cost(&one), 0);
        assert_eq!(cheap.models["c"].cost(&TokenUsage::new(0, 1)), 1);
        // The largest counts at the largest prices: the most there is, no overflow.
        let dear = ModelPrice {
            input: Price(u64::MAX),
            cached_input: None,
            output: Price(u64::MAX),
        };
        assert_eq!(dear.cost(&TokenUsage::new(u64::MAX, u64::MAX)), u64::MAX);
    }

    #[test]
    fn a_harness_cost_wins_and_an_unknown_model_stays_unknown() {
        let t = PriceTable::parse(r#"{"models":{"m":{"input":1,"output":2}}}"#).unwrap();
        let filled = PriceTable::fill(Some(&t), TokenUsage::new(1_000_000, 0), Some("m"));
        assert_eq!(filled.cost_micro_usd, Some(1_000_000));
        assert_eq!(filled.cost_source, Some(CostSource::Prices));
        let mut harness = TokenUsage::new(1_000_000, 0);
        harness.cost_micro_usd = Some(7);
        let kept = PriceTable::fill(Some(&t), harness, Some("m"));
        assert_eq!(
            (kept.cost_micro_usd, kept.cost_source),
            (Some(7), Some(CostSource::Harness))
        );
        let unknown = PriceTable::fill(Some(&t), TokenUsage::new(5, 5), Some("other"));
        assert_eq!((unknown.cost_micro_usd, unknown.cost_source), (None, None));
        // The usage's own model wins over the agent's.
        let mut own = TokenUsage::new(1_000_000, 0);
        own.model = Some("m".into());
        let filled = PriceTable::fill(Some(&t), own, Some("other"));
        assert_eq!(filled.cost_micro_usd, Some(1_000_000));
        assert_eq!(
            PriceTable::fill(None, TokenUsage::new(1, 1), Some("m")).cost_micro_usd,
            None
        );
    }

    #[test]
    fn a_bad_price_file_is_refused_naming_the_line() {
        for (text, line, what) in [
            (
                "{\"models\": {\n\"m\": {\"input\": -1, \"output\": 1}}}",
                2,
                "negative",
            ),
            (
                "{\"models\": {\n\"m\": {\"input\": 1,\n \"output\": \"1.0000001\"}}}",
                3,
                "six decimal",
            ),
            (
                "{\"models\": {\n\"m\": {\"input\": 1}}}",
                2,
                "missing field `output`",
            ),
            (
                "{\"models\": {\n\"m\": {\"input\": 1, \"outptu\": 1}}}",
                2,
                "unknown field",
            ),
            (
                "{\"models\": {\n\n\"m\": {\"input\": \"x\", \"output\": 1}}}",
                3,
                "is not a",
            ),
            (
                "{\"models\": {\"m\": \n{\"input\": 1 \"output\": 1}}}",
                2,
                "expected",
            ),
            ("{\"modles\": {}}", 1, "unknown field"),
        ] {
            let e = PriceTable::parse(text).unwrap_err();
            assert!(e.contains(&format!("line {line}")), "{text}: {e}");
            assert!(e.contains(what), "{text}: {e}");
        }
        assert!(PriceTable::parse(r#"{"models":{" ":{"input":1,"output":1}}}"#).is_err());
    }
}
