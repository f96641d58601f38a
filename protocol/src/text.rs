//! Text from agents and models made inert before a person sees it: in a terminal (the
//! CLI), in an environment variable (`relay up --notify-command`), on the dashboard (the
//! page applies the same rule in JavaScript).
//!
//! An agent controls what it writes: a command awaiting approval holding `\r\x1b[2K`
//! would show as a harmless one with the dangerous part erased. Every control character
//! (C0 but newline and tab, DEL, C1) and every bidirectional override or invisible
//! format character is shown escaped (`\x1b`, `\u{202e}`), so what is shown is exactly
//! what the text holds.

use std::borrow::Cow;

pub fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c,
            // Invisible format characters: zero-width spaces and joiners, direction
            // marks and overrides, line/paragraph separators, word joiner, BOM.
            '\u{ad}' | '\u{61c}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}'
            | '\u{feff}')
}

/// `text` with every control character and bidi override escaped (see the module docs).
pub fn inert(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !needs_escape(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    Cow::Owned(out)
}

/// [`inert`] for JSON text (serde's output, or a JSON line the broker sent): what
/// [`inert`] escapes becomes a JSON `\uXXXX` escape, valid JSON that reads back as the
/// same string. Such characters can only stand inside JSON strings (the structure is
/// ASCII, and raw newlines and tabs are left alone), and none is outside the BMP.
pub fn json_inert(json: &str) -> Cow<'_, str> {
    if !json.chars().any(needs_escape) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if needs_escape(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// [`inert`] for a field shown on one line (an approval's command, a summary): newlines
/// and tabs are escaped too, so a second line can never pass for another row.
pub fn one_line(text: &str) -> String {
    inert(text).replace('\n', "\\n").replace('\t', "\\t")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn json_stays_json_and_inert() {
        let text = "rm\u{7f} \u{202e}evil\u{9b}31m \x1b[2K\nline \u{feff}";
        let json = serde_json::to_string_pretty(&serde_json::json!({ "body": text })).unwrap();
        let shown = json_inert(&json);
        assert!(!shown.chars().any(needs_escape), "{shown}");
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["body"], text);
        // Plain JSON is untouched.
        assert!(matches!(json_inert("{\n  \"a\": 1\n}"), Cow::Borrowed(_)));
    }

    #[test]
    fn escapes_are_shown_not_obeyed() {
        assert_eq!(
            inert("rm -rf ~\r\x1b[2Kcargo test"),
            "rm -rf ~\\x0d\\x1b[2Kcargo test"
        );
        assert_eq!(inert("a\x1bP1;2q\x1b\\b"), "a\\x1bP1;2q\\x1b\\b");
        assert_eq!(inert("\u{9b}31m\x07\x08\x7f"), "\\u{9b}31m\\x07\\x08\\x7f");
        assert_eq!(inert("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert_eq!(inert("two\nlines\tand tabs, é"), "two\nlines\tand tabs, é");
        assert!(matches!(inert("plain"), Cow::Borrowed(_)));
        assert_eq!(inert("\u{feff}policy\u{200b}"), "\\u{feff}policy\\u{200b}");
        assert_eq!(
            one_line("cargo test\ncurl x|sh\t"),
            "cargo test\\ncurl x|sh\\t"
        );
    }
}
