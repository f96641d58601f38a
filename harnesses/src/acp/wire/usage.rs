//! The token counts an ACP agent reports, in whichever spelling it uses, read into
//! Relay's [`TokenUsage`] (input includes cached, output includes reasoning).
//!
//! Where they come from: OpenCode's prompt answer `usage` (ACP's own `Usage`:
//! `inputTokens`, `outputTokens`, `thoughtTokens`, `cachedReadTokens`,
//! `cachedWriteTokens`, `totalTokens`), Qwen Code's `_meta.usage` on a chunk (the same
//! names, one model call's: the turn adds them up), Gemini CLI's prompt answer
//! `_meta.quota.token_count` (`input_tokens`, `output_tokens`) with the model in
//! `_meta.quota.model_usage[].model`, and `usage_update`'s `cost`.
//!
//! Two ways of counting, told apart by the total (verified with the pinned CLIs and
//! exact counts from the mock): ACP's `Usage` counts each kind apart, so `totalTokens`
//! is the sum of all five (OpenCode: `inputTokens` leaves the cached input out,
//! `outputTokens` the thoughts); Qwen Code's `_meta.usage` counts as Relay does
//! (`totalTokens` = input + output, the cached part inside the input, the thoughts
//! inside the output). A report whose total is the sum of all its counts is read the
//! first way; without a total, ACP's `Usage` the first way and a vendor's the second.
//! Gemini CLI 0.61.0 reports neither cached nor thought counts, and its output is the
//! API's `candidatesTokenCount`, the thoughts left out.

use relay_protocol::domain::{usd_to_micros, CostSource, TokenUsage};
use serde_json::Value;

/// One report's counts; `None` for a count it does not carry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    input: Option<u64>,
    output: Option<u64>,
    cached: Option<u64>,
    cache_write: Option<u64>,
    thought: Option<u64>,
    total: Option<u64>,
}

impl Counts {
    /// The counts of `v`, in any of the spellings seen (ACP's camelCase, the OpenAI and
    /// Anthropic snake_case, Gemini's `*TokenCount`).
    pub(super) fn of(v: &Value) -> Counts {
        let count = |keys: &[&str]| keys.iter().find_map(|k| v.get(*k).and_then(Value::as_u64));
        Counts {
            input: count(&[
                "inputTokens",
                "promptTokens",
                "input_tokens",
                "prompt_tokens",
                "promptTokenCount",
            ]),
            output: count(&[
                "outputTokens",
                "completionTokens",
                "output_tokens",
                "completion_tokens",
                "candidatesTokenCount",
            ]),
            cached: count(&[
                "cachedReadTokens",
                "cached_read_tokens",
                "cachedContentTokenCount",
                "cached_tokens",
            ]),
            cache_write: count(&["cachedWriteTokens", "cached_write_tokens"]),
            thought: count(&[
                "thoughtTokens",
                "thought_tokens",
                "thoughtsTokenCount",
                "reasoningTokens",
                "reasoning_tokens",
            ]),
            total: count(&["totalTokens", "total_tokens", "totalTokenCount"]),
        }
    }

    /// The counts in Relay's way (input with the cached part and cache writes in it,
    /// output with the thoughts in it), from counts of kinds apart when `apart`, or
    /// when the total says so (see the module's header).
    pub(super) fn in_relays_way(mut self, apart: bool) -> Counts {
        let n = |c: Option<u64>| c.unwrap_or(0);
        let extras = n(self.cached)
            .saturating_add(n(self.cache_write))
            .saturating_add(n(self.thought));
        let sum_apart = n(self.input)
            .saturating_add(n(self.output))
            .saturating_add(extras);
        // A zero total is none (ACP's `Usage` reads a missing one as 0).
        let apart = match self.total.filter(|&t| t > 0) {
            Some(total) => extras > 0 && total == sum_apart,
            None => apart,
        };
        if apart {
            self.input = self.input.map(|i| {
                i.saturating_add(n(self.cached))
                    .saturating_add(n(self.cache_write))
            });
            self.output = self.output.map(|o| o.saturating_add(n(self.thought)));
        }
        self
    }

    /// Carries an input or an output count (a report without either says nothing).
    pub(super) fn any(&self) -> bool {
        self.input.is_some() || self.output.is_some()
    }

    /// `usage` with these counts in place of its own (those missing here kept); the
    /// counts must be in Relay's way ([`Counts::in_relays_way`]).
    pub(super) fn replace(&self, usage: &mut TokenUsage) {
        if let Some(n) = self.input {
            usage.input_tokens = n;
        }
        if let Some(n) = self.output {
            usage.output_tokens = n;
        }
        if let Some(n) = self.cached {
            usage.cached_input_tokens = n;
        }
        if let Some(n) = self.thought {
            usage.reasoning_tokens = Some(n);
        }
    }

    /// `usage` plus these counts (one more model call).
    pub(super) fn add_to(&self, usage: &mut TokenUsage) {
        let add = |a: u64, b: Option<u64>| a.saturating_add(b.unwrap_or(0));
        usage.input_tokens = add(usage.input_tokens, self.input);
        usage.output_tokens = add(usage.output_tokens, self.output);
        usage.cached_input_tokens = add(usage.cached_input_tokens, self.cached);
        if self.thought.is_some() || usage.reasoning_tokens.is_some() {
            usage.reasoning_tokens = Some(add(usage.reasoning_tokens.unwrap_or(0), self.thought));
        }
    }
}

/// The model a report names: Gemini CLI's `model_usage[].model` (the last one).
pub(super) fn model_of(v: &Value) -> Option<String> {
    v.get("model_usage")?
        .as_array()?
        .iter()
        .rev()
        .find_map(|m| m.get("model").and_then(Value::as_str))
        .filter(|m| !m.is_empty())
        .map(str::to_string)
}

/// A `usage_update`'s cost, when it is in US dollars.
pub(super) fn set_cost(usage: &mut TokenUsage, amount: f64, currency: &str) {
    if !currency.eq_ignore_ascii_case("USD") {
        return;
    }
    usage.cost_micro_usd = usd_to_micros(amount);
    usage.cost_source = usage.cost_micro_usd.map(|_| CostSource::Harness);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_spelling_reads_the_same() {
        let acp = json!({"inputTokens": 10, "outputTokens": 4, "thoughtTokens": 1, "cachedReadTokens": 3});
        let snake = json!({"prompt_tokens": 10, "completion_tokens": 4, "reasoning_tokens": 1, "cached_tokens": 3});
        let gemini = json!({"promptTokenCount": 10, "candidatesTokenCount": 4, "thoughtsTokenCount": 1, "cachedContentTokenCount": 3});
        for v in [acp, snake, gemini] {
            let mut u = TokenUsage::default();
            Counts::of(&v).replace(&mut u);
            assert_eq!(
                u,
                TokenUsage {
                    input_tokens: 10,
                    cached_input_tokens: 3,
                    output_tokens: 4,
                    reasoning_tokens: Some(1),
                    ..TokenUsage::default()
                },
                "{v}"
            );
        }
        assert!(!Counts::of(&json!({"totalTokens": 3})).any());
    }

    #[test]
    fn counts_of_kinds_apart_are_put_together_by_their_total() {
        // OpenCode's prompt answer: 1200 input of which 300 cached, 70 output of
        // which 30 thoughts, each kind apart.
        let opencode = json!({"inputTokens": 900, "cachedReadTokens": 300, "outputTokens": 40,
                              "thoughtTokens": 30, "totalTokens": 1270});
        // Qwen Code's `_meta.usage`: the same turn counted as Relay does.
        let qwen = json!({"inputTokens": 1200, "cachedReadTokens": 300, "outputTokens": 70,
                          "thoughtTokens": 30, "totalTokens": 1270});
        let no_total = json!({"inputTokens": 900, "cachedReadTokens": 300, "outputTokens": 40,
                              "thoughtTokens": 30});
        let expect = TokenUsage {
            input_tokens: 1200,
            cached_input_tokens: 300,
            output_tokens: 70,
            reasoning_tokens: Some(30),
            ..TokenUsage::default()
        };
        for (v, apart) in [(opencode, false), (qwen, true), (no_total, true)] {
            let mut u = TokenUsage::default();
            Counts::of(&v).in_relays_way(apart).replace(&mut u);
            assert_eq!(u, expect, "{v}");
        }
        // Cache writes are input too.
        let mut u = TokenUsage::default();
        let v = json!({"inputTokens": 10, "cachedWriteTokens": 5, "outputTokens": 1, "totalTokens": 16});
        Counts::of(&v).in_relays_way(false).replace(&mut u);
        assert_eq!((u.input_tokens, u.cached_input_tokens), (15, 0));
    }

    #[test]
    fn calls_add_up_and_a_cost_needs_dollars() {
        let mut u = TokenUsage::default();
        Counts::of(&json!({"inputTokens": 10, "outputTokens": 4})).add_to(&mut u);
        assert_eq!(u.reasoning_tokens, None);
        Counts::of(&json!({"inputTokens": 5, "outputTokens": 1, "thoughtTokens": 2}))
            .add_to(&mut u);
        assert_eq!(
            (u.input_tokens, u.output_tokens, u.reasoning_tokens),
            (15, 5, Some(2))
        );
        set_cost(&mut u, 0.0123455, "EUR");
        assert_eq!(u.cost_micro_usd, None);
        set_cost(&mut u, 0.0123455, "USD");
        assert_eq!(u.cost_micro_usd, Some(12346));
        assert_eq!(u.cost_source, Some(CostSource::Harness));
        let quota = json!({"token_count": {}, "model_usage": [{"model": "gemini-2.5-flash"}]});
        assert_eq!(model_of(&quota).as_deref(), Some("gemini-2.5-flash"));
    }
}
