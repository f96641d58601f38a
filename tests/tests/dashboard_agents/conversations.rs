//! A conversation: ask an agent by name, the working line, replies linked to their
//! question, the count; ten clients asking at once.

use std::collections::HashSet;

use relay_tests::agents::state;
use relay_tests::browser::Browser;
use relay_tests::Http;
use serde_json::{json, Value};

use crate::{env, fill, goto, page};

/// The messages the conversation page shows: id, body, reply_to.
const MESSAGES: &str =
    "[...document.querySelectorAll('#messages li.message')].map(li => ({id: li.dataset.message, \
    body: li.querySelector('.body').textContent, \
    replyTo: li.querySelector('.reply-link')?.dataset.replyTo ?? null, \
    replyText: li.querySelector('.reply-link')?.textContent ?? null}))";

/// Waits until the conversation shows `messages` messages and no agent working.
async fn settled(b: &Browser, messages: u64) {
    b.wait_js(
        "document.querySelectorAll('#messages li.message').length",
        |v| v == messages,
    )
    .await;
    b.wait_js("document.querySelectorAll('#working li').length", |v| {
        v == 0
    })
    .await;
}

/// The broker's record of `channel.work`, as `GET /v1/conversations` lists it.
async fn work_conversation(http: &Http) -> Value {
    let (_, list) = http.get("/v1/conversations").await;
    list.as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "channel.work")
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_asks_an_agent_shows_it_working_and_links_the_reply() {
    let env = env().await;
    env.add_agent("cx", &[]);
    env.add_agent("cy", &[]);
    let http = env.relay.http();
    let (code, c) = http
        .post(
            "/v1/conversations",
            &json!({"id": "channel.work", "kind": "channel"}),
        )
        .await;
    assert_eq!(code, 200, "{c}");
    let b = page(&env, "conversation/channel.work").await;
    b.wait_text("#conversation-count", |t| t == "0").await;
    b.wait_js(
        "document.querySelectorAll('select.composer-agent option').length",
        |v| v == 2,
    )
    .await;

    // Ask cx, picked by name: the question is a message here, a working line shows
    // while it runs, then the reply, linked to the question.
    fill(&b, "select.composer-agent", "cx").await;
    let task = "stream: working on it now";
    fill(&b, "textarea.composer-task", task).await;
    b.click("button[data-action=\"ask\"]").await;
    let line = b
        .wait_text("#working li.working", |t| t.contains("cx is working"))
        .await;
    assert!(
        !line.contains("null") && !line.contains("undefined"),
        "{line}"
    );
    // Its progress: the streamed text, not a warning the harness gave before it.
    b.wait_text("#working li.working .latest", |t| t.contains("on it"))
        .await;
    b.screenshot("conversation").await;
    settled(&b, 2).await;
    let shown = b.js(MESSAGES).await;
    let shown = shown.as_array().unwrap();
    assert_eq!(shown[0]["body"], task, "{shown:?}");
    assert_eq!(shown[1]["body"], "working on it now", "{shown:?}");
    assert_eq!(shown[1]["replyTo"], shown[0]["id"], "{shown:?}");
    let reply_text = shown[1]["replyText"].as_str().unwrap();
    assert!(
        reply_text.contains("tester@dashboard") && reply_text.contains(task),
        "{reply_text}"
    );
    b.wait_text("#conversation-count", |t| t == "2").await;
    let stored = work_conversation(&http).await;
    assert_eq!(stored["message_count"], 2, "{stored}");
    // The reply link goes to the question.
    b.click(&format!(
        "#messages li[data-message=\"{}\"] .reply-link",
        shown[1]["id"].as_str().unwrap()
    ))
    .await;
    let focused = b.js("document.activeElement.dataset.message").await;
    assert_eq!(focused, shown[0]["id"]);

    // Ten clients ask through the same route at once, the page open: every question
    // and reply shown once, each reply under its question, the count right.
    let mut asks = Vec::new();
    for n in 0..10 {
        let http = http.clone();
        let target = if n % 2 == 0 { "cx" } else { "cy" };
        asks.push(tokio::spawn(async move {
            let (code, body) = http
                .post(
                    "/v1/invocations",
                    &json!({"target": target, "task": format!("many {n}"), "conversation": "channel.work"}),
                )
                .await;
            assert_eq!(code, 200, "{body}");
            body["flight"]["id"].as_str().unwrap().to_string()
        }));
    }
    let mut flights = Vec::new();
    for a in asks {
        flights.push(a.await.unwrap());
    }
    for f in &flights {
        env.wait_flight(f, 120, |f| state(f) == "completed").await;
    }
    settled(&b, 22).await;
    b.wait_text("#conversation-count", |t| t == "22").await;
    let shown = b.js(MESSAGES).await;
    let shown = shown.as_array().unwrap();
    let ids: HashSet<&str> = shown.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 22, "each message once");
    for n in 0..10 {
        let question = shown
            .iter()
            .filter(|m| m["body"] == format!("many {n}"))
            .collect::<Vec<_>>();
        assert_eq!(question.len(), 1, "many {n}: {shown:?}");
        let answers = shown
            .iter()
            .filter(|m| m["replyTo"] == question[0]["id"])
            .collect::<Vec<_>>();
        assert_eq!(answers.len(), 1, "one reply to many {n}: {shown:?}");
        assert_eq!(answers[0]["body"], format!("ok: many {n}"), "{shown:?}");
    }
    let stored = work_conversation(&http).await;
    assert_eq!(stored["message_count"], 22, "{stored}");
    // The conversations list says the same count.
    goto(&b, &env, "conversations").await;
    b.wait_text(
        "#conversations tr[data-conversation=\"channel.work\"] td.num",
        |t| t == "22",
    )
    .await;

    // A message is rendered as safe Markdown: emphasis and code render, an http link
    // opens apart, a script, a javascript: link and a terminal escape stay inert text.
    let hostile = "**bold** `code` <script>window.__pwned = 1</script> [site](https://example.com) [bad](javascript:window.__pwned=2) \u{1b}[31mred";
    let (code, posted) = http
        .post(
            "/v1/messages",
            &json!({"conversation": "channel.work", "author": "operator", "body": hostile}),
        )
        .await;
    assert_eq!(code, 200, "{posted}");
    goto(&b, &env, "conversation/channel.work").await;
    let li = format!(
        "#messages li[data-message=\"{}\"] .body",
        posted["message"]["id"].as_str().unwrap()
    );
    b.wait_for(&li).await;
    let seen = b
        .js(&format!(
            "(() => {{ const el = document.querySelector('{li}'); return {{ \
             strong: el.querySelector('strong')?.textContent, code: el.querySelector('code')?.textContent, \
             scripts: el.querySelectorAll('script').length, \
             hrefs: [...el.querySelectorAll('a[href]')].map(a => a.getAttribute('href') + ' ' + a.rel), \
             text: el.textContent, pwned: window.__pwned ?? 0 }}; }})()"
        ))
        .await;
    assert_eq!(seen["strong"], "bold", "{seen}");
    assert_eq!(seen["code"], "code", "{seen}");
    assert_eq!(seen["scripts"], 0, "{seen}");
    assert_eq!(seen["pwned"], 0, "{seen}");
    assert_eq!(
        seen["hrefs"],
        json!(["https://example.com/ noopener noreferrer"]),
        "{seen}"
    );
    let text = seen["text"].as_str().unwrap();
    assert!(
        text.contains("<script>") && text.contains("javascript:") && text.contains("\\x1b[31m"),
        "{text}"
    );
}
