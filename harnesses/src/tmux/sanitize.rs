//! Task text made inert before it reaches a pane.
//!
//! A pane is a terminal: an escape sequence in a task could move the cursor, retitle the
//! window, answer a query, or (`ESC [201~`) end the bracketed paste early so that the
//! rest of the text is typed as keys, where a newline runs it. So every line is cut
//! apart on `\n` and passed through the escape stripper the stderr tails use
//! ([`crate::process::strip_ansi`]: the sequences with their payloads, C1 controls,
//! every other control character; tabs become spaces). Newlines are kept: the paste is
//! bracketed, so the program takes them as text.

/// `text` without escape sequences or control characters other than `\n`; `\r\n` and a
/// lone `\r` end a line too.
pub fn sanitize(text: &str) -> String {
    text.replace("\r\n", "\n")
        .split(['\n', '\r'])
        .map(crate::process::strip_ansi)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_controls_go_newlines_stay() {
        let hostile = "a\x1b[201~; touch /tmp/x\r\nb\x1b]0;title\x07c\u{9b}201~d\x03\x04\te";
        let clean = sanitize(hostile);
        assert_eq!(clean, "a; touch /tmp/x\nbcd e");
        assert!(!clean.chars().any(|c| c.is_control() && c != '\n'));
        assert_eq!(sanitize("one\ntwo\n"), "one\ntwo\n");
        assert_eq!(sanitize("héllo ✓"), "héllo ✓");
    }
}
