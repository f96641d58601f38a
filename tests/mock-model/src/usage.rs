//! The token counts a reply reports ([`Usage`]), and how each API spells them.
//!
//! A [`Usage`] is written in Relay's conventions (`input` includes the cached part and
//! the cache writes, `output` includes the reasoning), and each API gets it in its own:
//! - OpenAI Responses: `input_tokens` (cached included) with
//!   `input_tokens_details.cached_tokens`, `output_tokens` (reasoning included) with
//!   `output_tokens_details.reasoning_tokens`.
//! - Anthropic Messages: `input_tokens` is the uncached rest only (`input - cached -
//!   cache_write`), `cache_read_input_tokens` = `cached`, `cache_creation_input_tokens` =
//!   `cache_write`, `output_tokens` = `output` (thinking is part of it; the API has no
//!   separate count, so `reasoning` is not sent).
//! - OpenAI chat completions: `prompt_tokens` (cached included) with
//!   `prompt_tokens_details.cached_tokens`, `completion_tokens` (reasoning included) with
//!   `completion_tokens_details.reasoning_tokens`.
//! - Gemini `usageMetadata`: `promptTokenCount` (cached included) with
//!   `cachedContentTokenCount`, `candidatesTokenCount` WITHOUT the thoughts
//!   (`output - reasoning`) and `thoughtsTokenCount` = `reasoning`; the two optional
//!   counts are left out when zero, as the Gemini API does.

use serde_json::{json, Value};

use crate::Reply;

impl Reply {
    /// This reply, reporting exactly `usage` (instead of the mock's
    /// [`crate::MockModel::set_usage`] or the 4-bytes-a-token estimate). Only replies
    /// that end with a usage (text and tool calls) report it.
    pub fn with_usage(self, usage: Usage) -> Self {
        Self::WithUsage {
            reply: Box::new(self.without_usage().0),
            usage,
        }
    }

    /// The reply itself and the usage set on it, if any.
    pub(crate) fn without_usage(self) -> (Reply, Option<Usage>) {
        match self {
            Self::WithUsage { reply, usage } => (reply.without_usage().0, Some(usage)),
            other => (other, None),
        }
    }
}

/// Token counts one model reply reports: set with [`crate::Reply::with_usage`] for one
/// reply, or [`crate::MockModel::set_usage`] for every reply that has none. Without
/// either, a reply reports `input` and `output` estimated at 4 bytes a token (of the
/// request's conversation and of the reply) and nothing cached or reasoned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// All input tokens: the cached ones and the cache writes included.
    pub input: u64,
    /// The part of `input` read from the cache.
    pub cached: u64,
    /// The part of `input` written to the cache (Anthropic's
    /// `cache_creation_input_tokens`; the other APIs have no such count).
    pub cache_write: u64,
    /// All output tokens, reasoning included.
    pub output: u64,
    /// The part of `output` spent reasoning (not sent on the Messages API).
    pub reasoning: u64,
}

impl Usage {
    /// `input` tokens of which `cached` came from the cache; `output` tokens of which
    /// `reasoning` were reasoning. Nothing written to the cache.
    pub fn new(input: u64, cached: u64, output: u64, reasoning: u64) -> Usage {
        Usage {
            input,
            cached,
            cache_write: 0,
            output,
            reasoning,
        }
    }

    /// The same, with `cache_write` of the input written to the cache.
    pub fn with_cache_write(self, cache_write: u64) -> Usage {
        Usage {
            cache_write,
            ..self
        }
    }

    /// Input plus output.
    pub fn total(&self) -> u64 {
        self.input + self.output
    }

    /// The usage to report: the one set, else the estimate.
    pub(crate) fn or_estimate(set: Option<Usage>, input: u64, output: u64) -> Usage {
        set.unwrap_or(Usage {
            input,
            output,
            ..Usage::default()
        })
    }

    /// OpenAI Responses `response.usage`.
    pub(crate) fn responses(&self) -> Value {
        json!({
            "input_tokens": self.input,
            "input_tokens_details": {"cached_tokens": self.cached},
            "output_tokens": self.output,
            "output_tokens_details": {"reasoning_tokens": self.reasoning},
            "total_tokens": self.total(),
        })
    }

    /// Anthropic Messages `usage`, with `output_tokens` given (`message_start` reports
    /// a provisional 1, as the API does; `message_delta` the real count).
    pub(crate) fn messages(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.input.saturating_sub(self.cached + self.cache_write),
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": self.cache_write,
            "cache_read_input_tokens": self.cached,
        })
    }

    /// OpenAI chat completions `usage`.
    pub(crate) fn chat(&self) -> Value {
        json!({
            "prompt_tokens": self.input,
            "completion_tokens": self.output,
            "total_tokens": self.total(),
            "prompt_tokens_details": {"cached_tokens": self.cached},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning},
        })
    }

    /// Gemini `usageMetadata`.
    pub(crate) fn gemini(&self) -> Value {
        let mut meta = json!({
            "promptTokenCount": self.input,
            "candidatesTokenCount": self.output.saturating_sub(self.reasoning),
            "totalTokenCount": self.total(),
        });
        if self.cached > 0 {
            meta["cachedContentTokenCount"] = json!(self.cached);
        }
        if self.reasoning > 0 {
            meta["thoughtsTokenCount"] = json!(self.reasoning);
        }
        meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_api_spells_the_same_counts() {
        let u = Usage::new(1000, 400, 50, 20).with_cache_write(100);
        assert_eq!(u.responses()["input_tokens"], 1000);
        assert_eq!(u.responses()["input_tokens_details"]["cached_tokens"], 400);
        assert_eq!(
            u.responses()["output_tokens_details"]["reasoning_tokens"],
            20
        );
        assert_eq!(u.responses()["total_tokens"], 1050);
        let m = u.messages(50);
        assert_eq!(
            (
                m["input_tokens"].as_u64(),
                m["cache_read_input_tokens"].as_u64()
            ),
            (Some(500), Some(400))
        );
        assert_eq!(m["cache_creation_input_tokens"], 100);
        assert_eq!(u.chat()["prompt_tokens_details"]["cached_tokens"], 400);
        assert_eq!(u.chat()["completion_tokens"], 50);
        let g = u.gemini();
        assert_eq!(g["candidatesTokenCount"], 30);
        assert_eq!(g["thoughtsTokenCount"], 20);
        assert_eq!(g["cachedContentTokenCount"], 400);
        assert!(Usage::new(5, 0, 3, 0)
            .gemini()
            .get("thoughtsTokenCount")
            .is_none());
    }
}
