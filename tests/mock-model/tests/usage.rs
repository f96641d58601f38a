//! The usage each API reports: exact counts set with `Reply::with_usage` or
//! `MockModel::set_usage`, in each API's own spelling.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::post;
use relay_mock_model::{MockModel, Reply, Usage};
use serde_json::{json, Value};

/// Every `data:` payload of an SSE body that is JSON.
fn data(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// The last payload that carries `key`.
fn last_with(body: &str, key: &str) -> Value {
    data(body)
        .into_iter()
        .rev()
        .find_map(|d| {
            d.get(key)
                .or_else(|| d.get("response").and_then(|r| r.get(key)))
                .cloned()
        })
        .unwrap_or_else(|| panic!("no {key} in {body}"))
}

const USAGE: Usage = Usage {
    input: 1000,
    cached: 400,
    cache_write: 100,
    output: 50,
    reasoning: 20,
};

#[tokio::test]
async fn each_api_reports_the_usage_set_on_a_reply() {
    let mock = MockModel::start().await.unwrap();
    let responses = json!({"model": "m", "input": "hi", "stream": true});
    mock.push(Reply::text("hello").with_usage(USAGE));
    let (_, _, body) = post(mock.addr(), "/v1/responses", &responses).await;
    assert_eq!(
        last_with(&body, "usage"),
        json!({"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 400},
               "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 20},
               "total_tokens": 1050})
    );

    let messages =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let args = json!({"command": "ls"});
    mock.push(Reply::function_call("toolu_1", "Bash", &args).with_usage(USAGE));
    let (_, _, body) = post(mock.addr(), "/v1/messages", &messages).await;
    let usages: Vec<Value> = data(&body)
        .into_iter()
        .filter_map(|d| {
            d.get("usage")
                .or_else(|| d.get("message").and_then(|m| m.get("usage")))
                .cloned()
        })
        .collect();
    // Anthropic's input_tokens is the uncached rest; message_start says 1 output token.
    let expect = |output: u64| {
        json!({"input_tokens": 500, "cache_read_input_tokens": 400,
               "cache_creation_input_tokens": 100, "output_tokens": output})
    };
    assert_eq!(usages, [expect(1), expect(50)]);

    let chat = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "hi"}]});
    mock.push(Reply::text("hello").with_usage(USAGE));
    let (_, _, body) = post(mock.addr(), "/v1/chat/completions", &chat).await;
    assert_eq!(
        last_with(&body, "usage"),
        json!({"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 400},
               "completion_tokens": 50, "completion_tokens_details": {"reasoning_tokens": 20},
               "total_tokens": 1050})
    );

    let gemini = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    mock.push(Reply::chunks(["a", "b"]).with_usage(USAGE));
    let path = "/v1beta/models/g:streamGenerateContent?alt=sse";
    let (_, _, body) = post(mock.addr(), path, &gemini).await;
    assert_eq!(
        last_with(&body, "usageMetadata"),
        json!({"promptTokenCount": 1000, "cachedContentTokenCount": 400,
               "candidatesTokenCount": 30, "thoughtsTokenCount": 20, "totalTokenCount": 1050})
    );
    // Only the last chunk carries it.
    assert_eq!(
        data(&body)
            .iter()
            .filter(|d| d.get("usageMetadata").is_some())
            .count(),
        1
    );
}

#[tokio::test]
async fn set_usage_covers_replies_without_their_own_until_unset() {
    let mock = MockModel::start().await.unwrap();
    let chat =
        json!({"model": "m", "stream": false, "messages": [{"role": "user", "content": "hi"}]});
    let whole = |body: &str| -> Value { serde_json::from_str(body).unwrap() };
    mock.set_usage(Some(Usage::new(70, 0, 7, 0)));
    // The default echo, then a queued reply with its own, then the handler's.
    let (_, _, body) = post(mock.addr(), "/v1/chat/completions", &chat).await;
    assert_eq!(whole(&body)["usage"]["prompt_tokens"], 70);
    assert_eq!(whole(&body)["usage"]["completion_tokens"], 7);
    mock.push(Reply::text("x").with_usage(Usage::new(9, 1, 2, 0)));
    let (_, _, body) = post(mock.addr(), "/v1/chat/completions", &chat).await;
    assert_eq!(whole(&body)["usage"]["prompt_tokens"], 9);
    assert_eq!(
        whole(&body)["usage"]["prompt_tokens_details"]["cached_tokens"],
        1
    );
    mock.set_handler(|_| Reply::text("handled"));
    let (_, _, body) = post(mock.addr(), "/v1/chat/completions", &chat).await;
    assert_eq!(whole(&body)["usage"]["completion_tokens"], 7);
    assert_eq!(whole(&body)["choices"][0]["message"]["content"], "handled");

    // Back to the estimate: "handled" is 7 bytes, 2 tokens.
    mock.set_usage(None);
    let (_, _, body) = post(mock.addr(), "/v1/chat/completions", &chat).await;
    assert_eq!(whole(&body)["usage"]["completion_tokens"], 2);

    // Set twice, the last wins; a reply's text is kept.
    let reply = Reply::text("t")
        .with_usage(Usage::new(1, 0, 1, 0))
        .with_usage(Usage::new(3, 0, 3, 0));
    assert_eq!(reply.full_text(), "t");
    mock.push(reply);
    let (_, _, body) = post(mock.addr(), "/v1/chat/completions", &chat).await;
    assert_eq!(whole(&body)["usage"]["prompt_tokens"], 3);
}
