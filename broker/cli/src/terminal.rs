//! What the CLI prints, and how: text from agents and models made inert before a
//! terminal shows it (the printing macros every command uses, over
//! [`relay_protocol::text`], the escaping rule shared with the broker and the dashboard),
//! written so that a closed stdout (`relay events --follow | head -1`) ends the command
//! quietly with status 0 instead of a panic; colour on a terminal when wanted
//! ([`Paint`]); and the terminal's width.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU8, Ordering};

pub use relay_protocol::text::{inert, json_inert, one_line};

/// Writes `text` to stdout. A reader that went away (`EPIPE`: `| head`, a closed pager)
/// ends the process at once with status 0, the way `git log | head` and `cat | head`
/// end: the reader has what it wanted, and nothing is wrong. Any other write error
/// (a full disk behind a redirection) ends it with status 1 and says so on stderr.
pub fn write_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        stdout_failed(e);
    }
}

fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    let _ = writeln!(std::io::stderr(), "relay: cannot write to stdout: {e}");
    std::process::exit(1);
}

/// Writes `text` to stderr; an error there has nowhere to be told, so it is dropped.
pub fn write_stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// `println!` for text that may hold agent or model output: made inert first.
macro_rules! outln {
    () => { $crate::terminal::write_stdout("\n") };
    ($($t:tt)*) => {
        $crate::terminal::write_stdout(&format!("{}\n", $crate::terminal::inert(&format!($($t)*))))
    };
}
/// `print!`, inert (see [`outln`]).
macro_rules! out {
    ($($t:tt)*) => { $crate::terminal::write_stdout(&$crate::terminal::inert(&format!($($t)*))) };
}
/// `eprintln!`, inert (see [`outln`]).
macro_rules! errln {
    ($($t:tt)*) => {
        $crate::terminal::write_stderr(&format!("{}\n", $crate::terminal::inert(&format!($($t)*))))
    };
}
/// `println!` of JSON text: made inert the JSON way ([`json_inert`]), so it stays JSON.
macro_rules! jsonln {
    ($json:expr) => {
        $crate::terminal::write_stdout(&format!("{}\n", $crate::terminal::json_inert($json)))
    };
}
/// `println!` of text the CLI made itself with [`Paint`] styles: only its pieces of agent
/// or model text must already be inert (a table's cells are).
macro_rules! styledln {
    ($($t:tt)*) => { $crate::terminal::write_stdout(&format!("{}\n", format!($($t)*))) };
}
pub(crate) use {errln, jsonln, out, outln, styledln};

/// When to colour: `--color`, else `NO_COLOR` (any value: never), else when stdout is a
/// terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

/// 0 = not decided yet, 1 = plain, 2 = colour.
static COLOR: AtomicU8 = AtomicU8::new(0);

/// Decides once, from the command line's `--color` ([`ColorChoice::Auto`] when not
/// given).
pub fn set_color(choice: ColorChoice) {
    let on = match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
                && std::io::stdout().is_terminal()
        }
    };
    COLOR.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

fn color_on() -> bool {
    COLOR.load(Ordering::Relaxed) == 2
}

/// A style for a piece of the CLI's own output (a state, a header). Plain unless
/// colour is on ([`set_color`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paint {
    Plain,
    Bold,
    Dim,
    Green,
    Red,
    Yellow,
    Cyan,
}

impl Paint {
    /// The colour of a flight's, an agent's or an approval's state, by its name.
    pub fn for_state(state: &str) -> Paint {
        match state {
            "completed" | "accepted" | "idle" | "accept" | "accept_for_session" => Paint::Green,
            "failed" | "offline" | "declined" | "decline" | "expired" => Paint::Red,
            "waiting" | "pending" | "queued" | "waking" | "cancelled" | "cancel" => Paint::Yellow,
            "running" | "busy" | "starting" => Paint::Cyan,
            _ => Paint::Plain,
        }
    }

    fn code(self) -> &'static str {
        match self {
            Paint::Plain => "",
            Paint::Bold => "1",
            Paint::Dim => "2",
            Paint::Green => "32",
            Paint::Red => "31",
            Paint::Yellow => "33",
            Paint::Cyan => "36",
        }
    }

    /// `text` in this style (the text is the caller's, already inert).
    pub fn paint(self, text: &str) -> String {
        if self == Paint::Plain || !color_on() || text.is_empty() {
            return text.to_string();
        }
        format!("\x1b[{}m{text}\x1b[0m", self.code())
    }
}

/// The width of the terminal stdout is, or `None` (a pipe or a file: nothing to fit,
/// a script gets every cell whole).
pub fn width() -> Option<usize> {
    use terminal_size::{terminal_size_of, Width};
    terminal_size_of(std::io::stdout())
        .map(|(Width(w), _)| usize::from(w))
        .filter(|w| *w > 0)
}

/// The width of stderr's terminal (for the status line), else `COLUMNS`, else 80.
pub fn stderr_width() -> usize {
    use terminal_size::{terminal_size_of, Width};
    terminal_size_of(std::io::stderr())
        .map(|(Width(w), _)| usize::from(w))
        .or_else(|| std::env::var("COLUMNS").ok()?.parse().ok())
        .filter(|w| *w > 0)
        .unwrap_or(80)
}

/// How many columns `text` takes on a terminal.
pub fn columns(text: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(text)
}

/// `text` cut to at most `max` columns: at a word boundary where one is near, with an
/// ellipsis; whole when it fits.
pub fn cut(text: &str, max: usize) -> String {
    if columns(text) <= max {
        return text.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut kept = String::new();
    let mut used = 0;
    let mut at_word_end = false;
    for c in text.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > max - 1 {
            at_word_end = c == ' ';
            break;
        }
        kept.push(c);
        used += w;
    }
    // Back to the last space (unless a word just ended) when that keeps at least half of
    // what fits.
    if !at_word_end {
        if let Some(space) = kept.rfind(' ').filter(|&i| i >= kept.len() / 2) {
            kept.truncate(space);
        }
    }
    format!("{}…", kept.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_ends_at_a_word_with_an_ellipsis() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("fix the parser tests please", 16), "fix the parser…");
        assert_eq!(cut("abcdefghijklmnop", 8), "abcdefg…");
        assert_eq!(cut("日本語のテキスト", 7), "日本語…");
        assert!(columns(&cut("日本語のテキスト", 7)) <= 7);
        assert_eq!(cut("x", 0), "");
    }

    #[test]
    fn states_have_their_colour() {
        assert_eq!(Paint::for_state("failed"), Paint::Red);
        assert_eq!(Paint::for_state("completed"), Paint::Green);
        assert_eq!(Paint::for_state("something"), Paint::Plain);
    }
}
