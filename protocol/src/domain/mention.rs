//! Mentions in a message body: which `@name`s are mentions ([`scan`]), which of them
//! count ([`parse_mentions`]), and the rule for a reply an agent posts from a flight
//! ([`judge`]). Pure text functions, linear in the body's length; the broker decides
//! which names are agents and who may be asked.
//!
//! The rule, as README.md and broker/README.md state it:
//!
//! - `@name` is a mention where it starts a word: at the start of the text or after a
//!   character that is not a letter or digit (of any script) nor one of `. - _ @ / \`;
//!   and it ends the word: the name is followed by the end, or a character that is not a
//!   letter, digit, `@` or `/`. So `a@b.c`, `josé@x.org`, `\@name`, `@scope/pkg` and
//!   `https://host/@user` are not mentions. A name is 1 to 64 ASCII letters, digits, `-`,
//!   `_` and `.`, starting with a letter or digit; trailing dots are punctuation.
//! - Mentions inside code (a code span between backticks on one line, or a fenced block
//!   of ```` ``` ```` or `~~~`) and on quoted lines (starting with `>`) never count.
//! - In a reply an agent posts from one of its flights, a name the answered message
//!   already mentioned counts only when the agent addresses it: the `@name` begins a
//!   line (after a list marker and other such mentions, like `@a @b, look`), and the
//!   line is not copied from the answered message (the same words, perhaps with more
//!   after them). Names the answered message did not mention count anywhere in text.

use std::collections::{HashMap, HashSet};

use crate::names::wire_enum;

/// The longest name a mention can carry (an agent name's limit).
const MAX_NAME: usize = 64;

/// Where an `@name` stands in a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Text,
    /// In a code span or a fenced code block.
    Code,
    /// On a quoted line (`> ...`).
    Quote,
}

/// One `@name` of a body, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub name: String,
    pub place: Place,
    /// At the start of its line (after a list marker and other mentions): the author
    /// speaks to this name. Only text mentions are addressed.
    pub addressed: bool,
    /// Its line, from 0.
    pub line: usize,
}

wire_enum! {
    /// Why a mentioned name was not asked though the mention rules saw it.
    pub enum MentionSkip("mention skip") {
        /// The message's author: nobody consults themself.
        Author = "author",
        /// Inside a code span or a fenced code block.
        Code = "code",
        /// On a quoted line (`> `).
        Quote = "quote",
        /// An agent's reply repeating a mention of the message it answers without
        /// addressing the name (see the module header).
        Repeated = "repeated",
    }
}

impl MentionSkip {
    /// Why, as the end of a sentence that starts "@name not asked: ".
    pub fn describe(self) -> &'static str {
        match self {
            MentionSkip::Author => "it wrote the message",
            MentionSkip::Code => "the mention is inside code",
            MentionSkip::Quote => "the mention is on a quoted line",
            MentionSkip::Repeated => {
                "the message this answers mentioned it already; a reply asks it again only from the start of a line of its own"
            }
        }
    }
}

/// Every `@name` of `body`, in order, duplicates kept.
pub fn scan(body: &str) -> Vec<Token> {
    let mut out = Vec::new();
    // Most bodies (a long answer among them) have no `@` at all: one memchr pass then.
    if !body.contains('@') {
        return out;
    }
    // The open fence: its character and length.
    let mut fence: Option<(char, usize)> = None;
    for (n, raw) in body.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start();
        let run = fence_run(trimmed);
        if let Some((c, len)) = fence {
            if let Some((rc, rlen)) = run {
                if rc == c && rlen >= len && trimmed[rlen..].trim().is_empty() {
                    fence = None;
                }
            }
            scan_line(line, n, Place::Code, &[], &mut out);
        } else if let Some(open) = run {
            fence = Some(open);
            scan_line(line, n, Place::Code, &[], &mut out);
        } else if trimmed.starts_with('>') {
            scan_line(line, n, Place::Quote, &[], &mut out);
        } else {
            scan_line(line, n, Place::Text, &code_spans(line), &mut out);
        }
    }
    mark_addressed(body, &mut out);
    out
}

/// The names `body` mentions in text (not in code nor quoted), in order of first
/// appearance, without duplicates: a message's `mentions`.
pub fn parse_mentions(body: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    scan(body)
        .into_iter()
        .filter(|t| t.place == Place::Text && seen.insert(t.name.clone()))
        .map(|t| t.name)
        .collect()
}

/// Whether `body` may mention anyone: `false` means that [`judge`] and
/// [`parse_mentions`] find nothing in it (every mention starts with `@`), so a caller can
/// skip what it would read only to judge them.
pub fn may_mention(body: &str) -> bool {
    body.contains('@')
}

/// Each name `body` mentions anywhere (text, code, quotes), once, in order of first
/// appearance, with `None` when it counts or why it does not. `answered` is the body of
/// the message answered when the reply rule applies (a reply an agent posts from one of
/// its flights), else `None`.
pub fn judge(body: &str, answered: Option<&str>) -> Vec<(String, Option<MentionSkip>)> {
    let tokens = scan(body);
    if tokens.is_empty() {
        return Vec::new();
    }
    let repeated: HashSet<String> = answered
        .map(parse_mentions)
        .unwrap_or_default()
        .into_iter()
        .collect();
    let copyable = Copyable::new(answered.unwrap_or_default());
    let lines: Vec<&str> = body.split('\n').collect();
    let mut copied: Vec<Option<bool>> = vec![None; lines.len()];
    let mut out: Vec<(String, Option<MentionSkip>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for t in &tokens {
        let verdict = match t.place {
            Place::Code => Some(MentionSkip::Code),
            Place::Quote => Some(MentionSkip::Quote),
            Place::Text if !repeated.contains(&t.name) => None,
            Place::Text if !t.addressed => Some(MentionSkip::Repeated),
            Place::Text => {
                let line = lines.get(t.line).copied().unwrap_or_default();
                let is_copied = match copied.get_mut(t.line) {
                    Some(slot) => *slot.get_or_insert_with(|| copyable.copied(line)),
                    None => copyable.copied(line),
                };
                is_copied.then_some(MentionSkip::Repeated)
            }
        };
        match index.get(&t.name) {
            None => {
                index.insert(t.name.clone(), out.len());
                out.push((t.name.clone(), verdict));
            }
            Some(&k) => {
                if rank(verdict) < rank(out[k].1) {
                    out[k].1 = verdict;
                }
            }
        }
    }
    out
}

/// A name's verdict is its best occurrence's: counting, then repeated, quoted, in code.
fn rank(v: Option<MentionSkip>) -> u8 {
    match v {
        None => 0,
        Some(MentionSkip::Repeated) | Some(MentionSkip::Author) => 1,
        Some(MentionSkip::Quote) => 2,
        Some(MentionSkip::Code) => 3,
    }
}

/// The lines of an answered message a reply could copy: normalized, with words besides
/// mentions (a line of mentions alone carries nothing to copy), grouped by length.
struct Copyable(HashMap<usize, HashSet<String>>);

impl Copyable {
    fn new(answered: &str) -> Copyable {
        let mut by_len: HashMap<usize, HashSet<String>> = HashMap::new();
        for line in answered.split('\n').map(normalize) {
            let has_words = line.split(' ').any(|w| {
                let w = w.trim_matches(|c: char| matches!(c, ',' | ':' | ';'));
                !w.is_empty() && !w.starts_with('@')
            });
            if has_words {
                by_len.entry(line.len()).or_default().insert(line);
            }
        }
        Copyable(by_len)
    }

    /// Whether `line` is a copyable line, or one followed by more words. Costs at most
    /// the answered message's length: one look-up per distinct line length.
    fn copied(&self, line: &str) -> bool {
        let l = normalize(line);
        self.0.iter().any(|(len, set)| {
            l.get(..*len).is_some_and(|head| {
                (l.len() == *len || l.as_bytes()[*len] == b' ') && set.contains(head)
            })
        })
    }
}

/// A line with its whitespace runs made one space, trimmed.
fn normalize(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A fence opener or closer at the start of `trimmed`: three or more backticks or
/// tildes, as (character, count).
fn fence_run(trimmed: &str) -> Option<(char, usize)> {
    let c = trimmed.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = trimmed.bytes().take_while(|b| *b == c as u8).count();
    (len >= 3).then_some((c, len))
}

/// The byte ranges of `line`'s code spans: a run of n backticks up to the next run of
/// exactly n (an unmatched run is literal). Linear: each length's runs are visited once.
fn code_spans(line: &str) -> Vec<(usize, usize)> {
    let bytes = line.as_bytes();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'`' {
            let start = i;
            while i < bytes.len() && bytes[i] == b'`' {
                i += 1;
            }
            runs.push((start, i - start));
        } else {
            i += 1;
        }
    }
    // For each length, the indexes of its runs, and how far they were consumed.
    let mut by_len: HashMap<usize, (Vec<usize>, usize)> = HashMap::new();
    for (k, (_, len)) in runs.iter().enumerate() {
        by_len.entry(*len).or_default().0.push(k);
    }
    let mut spans = Vec::new();
    let mut k = 0;
    while k < runs.len() {
        let (start, len) = runs[k];
        let close = by_len.get_mut(&len).and_then(|(list, cursor)| {
            while *cursor < list.len() && list[*cursor] <= k {
                *cursor += 1;
            }
            list.get(*cursor).copied()
        });
        match close {
            Some(j) => {
                spans.push((start, runs[j].0 + runs[j].1));
                k = j + 1;
            }
            None => k += 1,
        }
    }
    spans
}

/// Pushes the mentions of one line: `place` for all, or `Code` inside `spans`.
fn scan_line(line: &str, n: usize, place: Place, spans: &[(usize, usize)], out: &mut Vec<Token>) {
    let mut prev: Option<char> = None;
    let mut iter = line.char_indices().peekable();
    let mut span = 0;
    while let Some((i, c)) = iter.next() {
        if c == '@' && prev.is_none_or(starts_word_after) {
            let rest = &line[i + 1..];
            let end = rest
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                .count();
            let name = rest[..end].trim_end_matches('.');
            // What follows the name and its trailing dots must end the word.
            let ends_word = rest[end..]
                .chars()
                .next()
                .is_none_or(|a| !(a.is_alphanumeric() || a == '@' || a == '/'));
            let valid = !name.is_empty()
                && name.len() <= MAX_NAME
                && name.as_bytes()[0].is_ascii_alphanumeric()
                && ends_word;
            if valid {
                while span < spans.len() && spans[span].1 <= i {
                    span += 1;
                }
                let in_code = spans.get(span).is_some_and(|(s, e)| *s <= i && i < *e);
                out.push(Token {
                    name: name.to_string(),
                    place: if in_code { Place::Code } else { place },
                    addressed: false,
                    line: n,
                });
            }
            // Skip the name (ASCII) so a `@` inside it is not read again.
            let skip_to = i + 1 + end;
            while iter.peek().is_some_and(|(j, _)| *j < skip_to) {
                iter.next();
            }
            prev = line[..skip_to].chars().next_back();
            continue;
        }
        prev = Some(c);
    }
}

/// Whether `@` after `c` starts a word (see the module header).
fn starts_word_after(c: char) -> bool {
    !(c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | '@' | '/' | '\\'))
}

/// Emphasis around a mention (`**@a**`) does not keep it from opening its line.
const EMPHASIS: &[char] = &['*', '_'];

/// Marks the text mentions that open their line: after whitespace, a list marker
/// (`-`, `*`, `+`, `1.`, `1)`) and other such mentions with separators (`,` `:` `;`)
/// and emphasis.
fn mark_addressed(body: &str, tokens: &mut [Token]) {
    let lines: Vec<&str> = body.split('\n').collect();
    let mut k = 0;
    while k < tokens.len() {
        let n = tokens[k].line;
        let line = lines.get(n).copied().unwrap_or_default();
        let mut rest = skip_list_marker(line.trim_start());
        while k < tokens.len() && tokens[k].line == n {
            let t = &mut tokens[k];
            k += 1;
            if t.place != Place::Text {
                break;
            }
            let Some(after) = rest
                .trim_start_matches(EMPHASIS)
                .strip_prefix('@')
                .and_then(|r| r.strip_prefix(t.name.as_str()))
            else {
                break;
            };
            t.addressed = true;
            rest = after.trim_start_matches('.').trim_start_matches(|c: char| {
                c.is_whitespace() || EMPHASIS.contains(&c) || matches!(c, ',' | ':' | ';')
            });
        }
        while k < tokens.len() && tokens[k].line == n {
            k += 1;
        }
    }
}

/// `s` after a leading list marker and its space, if it has one.
fn skip_list_marker(s: &str) -> &str {
    let marker = if s.starts_with(['-', '*', '+']) {
        1
    } else {
        let digits = s.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && s[digits..].starts_with(['.', ')']) {
            digits + 1
        } else {
            0
        }
    };
    match s[marker..].chars().next() {
        Some(c) if marker > 0 && c.is_whitespace() => s[marker..].trim_start(),
        _ => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(body: &str) -> Vec<String> {
        parse_mentions(body)
    }

    fn verdicts(body: &str, answered: Option<&str>) -> Vec<(String, Option<MentionSkip>)> {
        judge(body, answered)
    }

    fn v(name: &str, skip: Option<MentionSkip>) -> (String, Option<MentionSkip>) {
        (name.to_string(), skip)
    }

    #[test]
    fn a_body_that_may_not_mention_is_judged_to_mention_no_one() {
        for body in ["", "plain text", "code `x` and > quote", "line\n\nline"] {
            assert!(!may_mention(body));
            assert!(judge(body, Some("@a answered")).is_empty());
            assert!(names(body).is_empty());
        }
        assert!(may_mention("@a"));
        assert!(may_mention("mail a@b.c")); // may, not does: judge decides
    }

    #[test]
    fn mentions_are_parsed_in_order_without_duplicates() {
        assert_eq!(
            names("@codex-1 and @pi_2, ask @codex-1 again. mail a@b.c @x."),
            vec!["codex-1", "pi_2", "x"]
        );
        assert_eq!(names("no mentions @ here"), Vec::<String>::new());
        assert_eq!(names(""), Vec::<String>::new());
        assert_eq!(names("@"), Vec::<String>::new());
    }

    #[test]
    fn punctuation_around_a_name_is_not_part_of_it() {
        assert_eq!(
            names("(@a) [@b], {@c}; \"@d\" '@e' @f: @g! @h? @i... *@j* @k's <@l>"),
            vec!["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"]
        );
        assert_eq!(names("@a.b.c. and @x-y_z."), vec!["a.b.c", "x-y_z"]);
        assert_eq!(names("line\n@a\r\n@b\r\n"), vec!["a", "b"]);
    }

    #[test]
    fn emails_paths_packages_and_escapes_are_not_mentions() {
        for body in [
            "mail a@b.c or first.last@example.org",
            "https://mastodon.social/@user and C:\\@x",
            "npm i @types/node @babel/core",
            "\\@codex-1 is escaped",
            "@@double and a@@b",
            "@-dash @_under @.dot",
            "josé@x.org 名前@host",
            "@codexé and @codex名",
        ] {
            assert_eq!(names(body), Vec::<String>::new(), "{body:?}");
        }
    }

    #[test]
    fn unicode_around_mentions_is_handled_by_character() {
        assert_eq!(names("¿@codex-1? «@pi» — @x。"), vec!["codex-1", "pi", "x"]);
        assert_eq!(names("日本語 @a 🎉@b @c🎉"), vec!["a", "b", "c"]);
        assert_eq!(names("é@a"), Vec::<String>::new());
    }

    #[test]
    fn mentions_in_code_and_quotes_do_not_count_but_are_seen() {
        let body = "see `@a` and ``x `@b` y`` and @c\n\
                    ```python\n@d\ndef f(): pass\n```\n\
                    > @e said so\n  >> @f too\n\
                    ~~~~\n@g\n~~~\nstill @h\n~~~~\n\
                    an unmatched ` then @i";
        let tokens = scan(body);
        let by_place = |p: Place| {
            tokens
                .iter()
                .filter(|t| t.place == p)
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(by_place(Place::Code), vec!["a", "b", "d", "g", "h"]);
        assert_eq!(by_place(Place::Quote), vec!["e", "f"]);
        assert_eq!(by_place(Place::Text), vec!["c", "i"]);
        assert_eq!(names(body), vec!["c", "i"]);
        assert_eq!(
            verdicts("`@a` @a > x\n> @b\n```\n@c", None),
            vec![
                v("a", None),
                v("b", Some(MentionSkip::Quote)),
                v("c", Some(MentionSkip::Code))
            ]
        );
    }

    #[test]
    fn an_unclosed_fence_runs_to_the_end_and_a_longer_run_does_not_close_a_span() {
        assert_eq!(names("```\n@a\n@b"), Vec::<String>::new());
        assert_eq!(names("``@a` @b``"), Vec::<String>::new());
        // Runs of different lengths: only an exact match closes a span.
        assert_eq!(names("` `` @a ``` ` @b"), vec!["b"]);
    }

    #[test]
    fn addressed_mentions_open_their_line() {
        let tokens = scan(
            "@a @b, which is faster?\n  - @c: look\n1. @d; @e and @f\nhi @g\n> @h\n`@i` @j\n**@k**, @l",
        );
        let addressed: Vec<&str> = tokens
            .iter()
            .filter(|t| t.addressed)
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(addressed, vec!["a", "b", "c", "d", "e", "k", "l"]);
    }

    #[test]
    fn a_reply_repeating_the_question_asks_nobody_again() {
        let question = "@codex-1 @codex-2 which is faster?";
        for reply in [
            "@codex-1 @codex-2 which is faster?\n\nRust, by a little.",
            "  @codex-1   @codex-2 which is faster?  Rust.",
            "You asked @codex-1 @codex-2 which is faster: Rust.",
            "> @codex-1 @codex-2 which is faster?\n\nRust.",
            "Rust. I agree with @codex-2.",
            "```\n@codex-2\n```",
        ] {
            let judged = verdicts(reply, Some(question));
            assert!(
                judged.iter().all(|(_, skip)| skip.is_some()),
                "{reply:?}: {judged:?}"
            );
        }
        assert_eq!(
            verdicts("Rust, says @codex-2.", Some(question)),
            vec![v("codex-2", Some(MentionSkip::Repeated))]
        );
    }

    #[test]
    fn a_reply_keeps_the_mentions_it_means() {
        let question = "@codex-1 @codex-2 which is faster?";
        // Addressed on a line of its own.
        assert_eq!(
            verdicts(
                "Rust, I think.\n@codex-2 can you measure it?",
                Some(question)
            ),
            vec![v("codex-2", None)]
        );
        // A name the question did not mention counts anywhere in text.
        assert_eq!(
            verdicts("Rust; ask @claude-1 about Go.", Some(question)),
            vec![v("claude-1", None)]
        );
        // A question line of mentions alone is not copied by a line that starts with them.
        assert_eq!(
            verdicts("@b please check", Some("@a @b\nwhich is faster?")),
            vec![v("b", None)]
        );
        // Without the reply rule, every text mention counts.
        assert_eq!(
            verdicts("You asked @codex-1 @codex-2 which is faster?", None),
            vec![v("codex-1", None), v("codex-2", None)]
        );
        // A name counts when one of its occurrences does.
        assert_eq!(
            verdicts("as @codex-2 said\n@codex-2 redo it", Some(question)),
            vec![v("codex-2", None)]
        );
    }

    #[test]
    fn very_long_and_hostile_texts_are_scanned_in_linear_time() {
        let many = "@a ".repeat(200_000);
        assert_eq!(names(&many), vec!["a"]);
        let backticks: String = (1..2_000)
            .map(|n| "`".repeat(n % 97 + 1) + " @x ")
            .collect();
        assert_eq!(scan(&backticks).len(), 1_999);
        let long_name = format!("@{}", "n".repeat(100_000));
        assert_eq!(names(&long_name), Vec::<String>::new());
        let max = format!("@{} @{}", "m".repeat(64), "o".repeat(65));
        assert_eq!(names(&max), vec!["m".repeat(64)]);
        let fences = "```\n@a\n```\n".repeat(50_000);
        assert_eq!(names(&fences), Vec::<String>::new());
        let between = "```\n@a\n```\n@b\n".repeat(50_000);
        assert_eq!(names(&between), vec!["b"]);
        let ats = "@".repeat(300_000);
        assert_eq!(names(&ats), Vec::<String>::new());
        let addressed_run = format!("{}\nend", "@q ".repeat(50_000));
        assert_eq!(
            verdicts(&addressed_run, Some(&"@q hello\n".repeat(10_000))),
            vec![v("q", None)]
        );
    }
}
