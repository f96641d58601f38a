#![allow(clippy::unwrap_used)]

use super::*;

/// A server that answers one request with `answer`, and its URL.
async fn answering(answer: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0);
            head.extend_from_slice(&buf[..n]);
        }
        conn.write_all(answer.as_bytes()).await.unwrap();
    });
    url
}

/// A 429 whose body is the JSON `typed`, with `headers` (each ending in CRLF).
fn json_429(typed: &str, headers: &str) -> &'static str {
    Box::leak(
        format!(
            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{typed}",
            typed.len()
        )
        .into_boxed_str(),
    )
}

#[tokio::test]
async fn a_429_or_503_is_an_overload_with_its_retry_after_not_an_unreachable_broker() {
    use relay_protocol::methods::call as m;
    let typed = r#"{"error":{"code":"overloaded","message":"full"}}"#;
    let client = Client::new(&answering(json_429(typed, "retry-after: 3\r\n")).await, "t").unwrap();
    let e = client
        .call::<m::StatusShow>(&[], &relay_protocol::api::Empty {})
        .await
        .unwrap_err();
    assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(3)));
    assert_eq!(e.code(), Some(ErrorCode::Overloaded));
    assert!(e.is_transient());
    let said = e.to_string();
    assert!(said.contains("is overloaded; retry in 3 s: full"), "{said}");

    // A 503 without a typed body (a proxy's), and a Retry-After too large to keep.
    let client = Client::new(
        &answering("HTTP/1.1 503 Service Unavailable\r\nretry-after: 86400\r\ncontent-length: 4\r\nconnection: close\r\n\r\nbusy").await,
        "t",
    )
    .unwrap();
    let e = client
        .call::<m::StatusShow>(&[], &relay_protocol::api::Empty {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Unavailable));
    assert_eq!(e.retry_after(), Some(MAX_RETRY_AFTER));
    let said = e.to_string();
    assert!(said.contains("is overloaded; retry in 60 s"), "{said}");
    assert!(!said.contains("cannot reach"), "{said}");
}

/// A server that closes its first `closed` connections once their request head is
/// in, then answers `{}` to one: its URL, and how many connections it took.
async fn closing_first(closed: usize) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = taken.clone();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(k) => head.extend_from_slice(&buf[..k]),
                }
            }
            if n >= closed {
                let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
                conn.write_all(answer.as_bytes()).await.unwrap();
            }
        }
    });
    (url, taken)
}

#[tokio::test]
async fn a_read_closed_without_an_answer_is_asked_once_more_and_a_write_is_not() {
    use std::sync::atomic::Ordering;
    // A read: its first connection closed, the second answers.
    let (url, taken) = closing_first(1).await;
    let client = Client::new(&url, "t").unwrap();
    let got: serde_json::Value = client.get(&["v1", "status"]).await.unwrap();
    assert_eq!(got, serde_json::json!({}));
    assert_eq!(taken.load(Ordering::SeqCst), 2);
    // Closed twice: the second time is the answer.
    let (url, taken) = closing_first(2).await;
    let client = Client::new(&url, "t").unwrap();
    let e = client
        .get::<serde_json::Value>(&["v1", "status"])
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Closed { .. }), "{e:?}");
    assert_eq!(taken.load(Ordering::SeqCst), 2);
    // A write is not sent again.
    let (url, taken) = closing_first(1).await;
    let client = Client::new(&url, "t").unwrap();
    let e = client
        .post::<_, serde_json::Value>(&["v1", "messages"], &serde_json::json!({}))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Closed { .. }), "{e:?}");
    assert_eq!(taken.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_budget_refusal_is_a_refusal_not_an_overload() {
    use relay_protocol::methods::call as m;
    let typed = r#"{"error":{"code":"budget_exceeded","message":"agent a1 used 120 of its 100 tokens/day"}}"#;
    let client = Client::new(&answering(json_429(typed, "")).await, "t").unwrap();
    let e = client
        .call::<m::StatusShow>(&[], &relay_protocol::api::Empty {})
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Api(_)), "{e:?}");
    assert_eq!(e.code(), Some(ErrorCode::BudgetExceeded));
    assert!(!e.is_transient());
    assert_eq!(
        e.to_string(),
        "agent a1 used 120 of its 100 tokens/day (budget_exceeded)"
    );
}

#[test]
fn urls_are_built_by_the_url_type() {
    let c = Client::new("http://127.0.0.1:7450/", "t").unwrap();
    assert_eq!(c.url(), "http://127.0.0.1:7450");
    assert_eq!(
        c.endpoint(&["v1", "agents", "a b/c?d%e#f"], &[]).as_str(),
        "http://127.0.0.1:7450/v1/agents/a%20b%2Fc%3Fd%25e%23f"
    );
    assert_eq!(
        c.endpoint(
            &["v1", "flights"],
            &[("agent", "x&y=z".into()), ("limit", "5".into())]
        )
        .as_str(),
        "http://127.0.0.1:7450/v1/flights?agent=x%26y%3Dz&limit=5"
    );
    let under = Client::new("http://h:1/relay", "t").unwrap();
    assert_eq!(
        under.endpoint(&["v1", "status"], &[]).as_str(),
        "http://h:1/relay/v1/status"
    );
    assert!(matches!(
        Client::new("not a url", "t"),
        Err(ClientError::NotFound(_))
    ));
}
