//! `relay acp`'s own unit tests: reading the editor's lines, `initialize`.
#![allow(clippy::unwrap_used)]

use super::*;

#[tokio::test]
async fn lines_are_read_whole_and_a_line_over_the_limit_is_skipped() {
    let mut input = b"{\"a\":1}\r\nnot json\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
    input.extend(b"\nlast");
    let r = tokio::io::BufReader::with_capacity(1024, std::io::Cursor::new(input));
    let mut lines = read_lines(r);
    let mut seen = Vec::new();
    while let Some(line) = lines.recv().await {
        seen.push(match line.unwrap() {
            Line::Text(t) => t,
            Line::TooLong => "too long".to_string(),
        });
    }
    assert_eq!(seen, vec!["{\"a\":1}", "not json", "too long", "last"]);
}

#[test]
fn initialize_offers_load_and_text_only() {
    let v = to_value(initialize_response());
    assert_eq!(v["protocolVersion"], 1);
    assert_eq!(v["agentCapabilities"]["loadSession"], true);
    assert_eq!(v["agentCapabilities"]["promptCapabilities"]["image"], false);
    assert_eq!(v["agentInfo"]["name"], "relay");
}
