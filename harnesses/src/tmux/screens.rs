//! What a pane's screen says about its program: ready for a task, held by a screen that
//! needs a person (a sign-in, a trust question, a first-run setup), or neither yet.
//!
//! The known CLIs' screens were read from the pinned binaries run in a tmux pane
//! (`capture-pane -p -J`, 160x45; the captures are the fixtures under `screens/`, with
//! trailing spaces removed):
//! - **codex 0.169.0 TUI.** Ready: its composer, the last line `› Ask Codex to do
//!   anything` (the placeholder, or what was typed), with its status line under it
//!   (`mock-model default · /dir`), also while it works on a turn (it queues what it
//!   gets). Without that status line it is still starting: with no credentials it
//!   first draws the composer for a moment, then replaces it with the sign-in picker
//!   (seen with a fresh `CODEX_HOME`). Held: the sign-in picker shown without credentials
//!   (`Welcome to Codex, OpenAI's command-line coding agent`, then `Sign in with
//!   ChatGPT`, `Sign in another way`, an API key box...), and `Trust this folder?` for a
//!   directory inside a git repository that is not trusted. Both mark their choice with
//!   `›`/`>` before a numbered option, which is not a composer.
//! - **claude 2.1.197 TUI.** Ready: its prompt `❯ ` right under a rule of `─`. Held: the
//!   first run's theme picker (`Choose the text style that looks best with your
//!   terminal`) and security notes, the folder trust question (`Yes, I trust this
//!   folder`), the question whether to use an `ANTHROPIC_API_KEY` found in its
//!   environment, the login method picker (`Select login method:`), its prompt with `Not
//!   logged in · Run /login` (a task would only get an error), and `Unable to connect to
//!   Anthropic services` (its first run checks it can reach Anthropic, and exits).
//!
//! Another program is ready when the agent's ready pattern (a regular expression,
//! [`ReadyPattern`]) matches its screen; without one, nothing here judges it (the
//! session's quiet rule does).

use regex::{Regex, RegexBuilder};

/// The longest ready pattern an agent may give, in bytes.
pub const MAX_READY_PATTERN: usize = 1024;

/// The most memory a compiled ready pattern may take (the `regex` crate's size limit): a
/// pattern is the user's, and a small one can still compile to something huge.
const READY_PATTERN_SIZE: usize = 1 << 20;

/// An agent's ready pattern, compiled: searched in the pane's screen (each line's
/// trailing spaces removed, blank lines at the end dropped), with `^` and `$` matching at
/// each line's start and end, and `\z` at the end of the screen's last non-blank line.
#[derive(Debug, Clone)]
pub struct ReadyPattern(Regex);

impl ReadyPattern {
    /// Compiles `pattern`, or says why it cannot be one: empty, longer than
    /// [`MAX_READY_PATTERN`], not a regular expression, or too large compiled.
    pub fn new(pattern: &str) -> Result<ReadyPattern, String> {
        if pattern.is_empty() {
            return Err("the ready pattern is empty".into());
        }
        if pattern.len() > MAX_READY_PATTERN {
            return Err(format!(
                "the ready pattern is {} bytes, over the limit of {MAX_READY_PATTERN}",
                pattern.len()
            ));
        }
        RegexBuilder::new(pattern)
            .multi_line(true)
            .size_limit(READY_PATTERN_SIZE)
            .dfa_size_limit(READY_PATTERN_SIZE)
            .build()
            .map(ReadyPattern)
            .map_err(|e| format!("the ready pattern is not a valid regular expression: {e}"))
    }

    /// Whether the pattern is found in `screen` (as [`tidy`] leaves it).
    pub fn matches(&self, screen: &str) -> bool {
        self.0.is_match(screen)
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

/// A screen as the recognisers read it: each line's trailing spaces removed, blank lines
/// at the end dropped (a TUI pads every line to the pane's width).
pub fn tidy(screen: &str) -> String {
    let lines: Vec<&str> = screen.lines().map(str::trim_end).collect();
    let end = lines
        .iter()
        .rposition(|l| !l.is_empty())
        .map_or(0, |i| i + 1);
    lines[..end].join("\n")
}

/// A CLI whose screens Relay knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KnownCli {
    Codex,
    Claude,
}

impl KnownCli {
    /// The CLI a program name stands for (`codex`, `claude`).
    pub fn by_name(name: &str) -> Option<KnownCli> {
        match name {
            "codex" => Some(KnownCli::Codex),
            "claude" => Some(KnownCli::Claude),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KnownCli::Codex => "codex",
            KnownCli::Claude => "claude",
        }
    }
}

/// What holds a pane: a screen that takes a person's answer before the program takes a
/// task. A paste there would answer it (or land in an API key box).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocker {
    /// A sign-in or login method picker, an API key box: no credentials.
    SignIn,
    /// The program runs, but says it is not logged in: a task only gets an error.
    NotLoggedIn,
    /// Whether to trust the folder it runs in.
    Trust,
    /// The first run's setup (theme, security notes).
    FirstRun,
    /// Whether to use an API key found in its environment.
    ApiKey,
    /// It cannot reach its provider's servers (Claude Code's first-run check).
    Offline,
}

impl Blocker {
    /// What the screen is, and how a person gets past it, for `cli` in `pane`, where
    /// `look` is how to look at the pane (`tmux -L relay@tm-1 attach -t %3`).
    pub fn explain(self, cli: KnownCli, pane: &str, look: &str) -> String {
        let cli = cli.name();
        match self {
            Blocker::SignIn => format!(
                "{cli} in pane {pane} shows its sign-in screen; sign in there ({look}) or give it credentials (the agent's --secret), then ask again"
            ),
            Blocker::NotLoggedIn => format!(
                "{cli} in pane {pane} says it is not logged in; run /login there ({look}) or give it credentials (the agent's --secret), then ask again"
            ),
            Blocker::Trust => format!(
                "{cli} in pane {pane} asks whether to trust its folder; answer there ({look}), then ask again"
            ),
            Blocker::FirstRun => format!(
                "{cli} in pane {pane} shows its first-run setup; finish it there ({look}), then ask again"
            ),
            Blocker::ApiKey => format!(
                "{cli} in pane {pane} asks whether to use the API key in its environment; answer there ({look}), then ask again"
            ),
            Blocker::Offline => format!(
                "{cli} in pane {pane} cannot reach its provider's servers; check its network (or its base URL), then ask again"
            ),
        }
    }
}

/// What a screen says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Ready for a task.
    Ready,
    /// Held by a screen of this CLI that a person must answer.
    Blocked(KnownCli, Blocker),
    /// Neither (still starting, busy, or a screen nothing here knows).
    NotYet,
}

/// How a pane's screen is judged: by a known CLI's screens, by a ready pattern, both
/// (the known CLI's blocking screens, then the pattern), or not at all.
#[derive(Debug, Clone, Default)]
pub struct Judge {
    pub cli: Option<KnownCli>,
    pub pattern: Option<ReadyPattern>,
}

impl Judge {
    /// Whether anything judges the screen; else the quiet rule alone decides.
    pub fn judges(&self) -> bool {
        self.cli.is_some() || self.pattern.is_some()
    }

    /// What `screen` (a raw capture) says.
    pub fn judge(&self, screen: &str) -> Readiness {
        let screen = tidy(screen);
        if let Some(cli) = self.cli {
            if let Some(blocker) = blocker(cli, &screen) {
                return Readiness::Blocked(cli, blocker);
            }
        }
        let ready = match (&self.pattern, self.cli) {
            (Some(pattern), _) => pattern.matches(&screen),
            (None, Some(cli)) => ready(cli, &screen),
            (None, None) => true,
        };
        match ready {
            true => Readiness::Ready,
            false => Readiness::NotYet,
        }
    }
}

/// The screen that holds `cli`, if `screen` (tidied) is one.
pub fn blocker(cli: KnownCli, screen: &str) -> Option<Blocker> {
    let has = |s: &str| screen.contains(s);
    match cli {
        KnownCli::Codex => {
            if has("Trust this folder?") || has("Trust and continue") {
                Some(Blocker::Trust)
            } else if has("Welcome to Codex, OpenAI's command-line coding agent")
                || has("Sign in with ChatGPT")
                || has("Sign in another way")
            {
                Some(Blocker::SignIn)
            } else {
                None
            }
        }
        KnownCli::Claude => {
            if has("Unable to connect to Anthropic services") {
                Some(Blocker::Offline)
            } else if has("Choose the text style that looks best with your terminal")
                || (has("Security notes:") && has("Press Enter to continue"))
            {
                Some(Blocker::FirstRun)
            } else if has("Yes, I trust this folder") {
                Some(Blocker::Trust)
            } else if has("Detected a custom API key in your environment") {
                Some(Blocker::ApiKey)
            } else if has("Select login method:") {
                Some(Blocker::SignIn)
            } else if has("Not logged in · Run /login") {
                Some(Blocker::NotLoggedIn)
            } else {
                None
            }
        }
    }
}

/// Whether `screen` (tidied, and not a blocking one) shows `cli` ready for a task.
pub fn ready(cli: KnownCli, screen: &str) -> bool {
    let lines: Vec<&str> = screen.lines().collect();
    match cli {
        // The composer: the last `› ` line (those above are the conversation's user
        // messages), then its placeholder or what was typed, and the status line
        // (`model effort · dir`) under it, drawn once the session is configured. A
        // dialog's choice (`› 1. Trust and continue`) is not one.
        KnownCli::Codex => {
            let composer = lines.iter().rposition(|l| {
                l.strip_prefix('›')
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(' ') && !option(rest))
            });
            composer.is_some_and(|at| {
                lines[at + 1..]
                    .iter()
                    .find(|l| !l.trim().is_empty())
                    .is_some_and(|status| status.contains(" · "))
            })
        }
        // The prompt `❯` right under a rule; a dialog's choice is not under one.
        KnownCli::Claude => lines.windows(2).any(|pair| {
            let rule = !pair[0].trim().is_empty() && pair[0].trim().chars().all(|c| c == '─');
            let prompt = pair[1]
                .strip_prefix('❯')
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(' ') && !option(rest));
            rule && prompt
        }),
    }
}

/// Whether `rest` (after a choice marker) is a numbered option: ` 1. ...`.
fn option(rest: &str) -> bool {
    let rest = rest.trim_start();
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with(". ")
}

/// The last `n` non-blank lines of `screen`, each with control characters escaped, for
/// an error that says what a pane shows.
pub fn last_lines(screen: &str, n: usize) -> String {
    let tidy = tidy(screen);
    let lines: Vec<&str> = tidy.lines().filter(|l| !l.trim().is_empty()).collect();
    let skip = lines.len().saturating_sub(n);
    lines[skip..]
        .iter()
        .map(|l| l.trim().escape_debug().to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every captured screen and what it is.
    const SCREENS: [(&str, KnownCli, Readiness); 16] = [
        (
            include_str!("screens/codex-sign-in.txt"),
            KnownCli::Codex,
            Readiness::Blocked(KnownCli::Codex, Blocker::SignIn),
        ),
        (
            include_str!("screens/codex-sign-in-other.txt"),
            KnownCli::Codex,
            Readiness::Blocked(KnownCli::Codex, Blocker::SignIn),
        ),
        (
            include_str!("screens/codex-api-key.txt"),
            KnownCli::Codex,
            Readiness::Blocked(KnownCli::Codex, Blocker::SignIn),
        ),
        (
            include_str!("screens/codex-trust.txt"),
            KnownCli::Codex,
            Readiness::Blocked(KnownCli::Codex, Blocker::Trust),
        ),
        (
            include_str!("screens/codex-ready.txt"),
            KnownCli::Codex,
            Readiness::Ready,
        ),
        (
            include_str!("screens/codex-working.txt"),
            KnownCli::Codex,
            Readiness::Ready,
        ),
        (
            include_str!("screens/codex-after-turn.txt"),
            KnownCli::Codex,
            Readiness::Ready,
        ),
        // The composer drawn for a moment before the sign-in picker replaces it.
        (
            include_str!("screens/codex-starting.txt"),
            KnownCli::Codex,
            Readiness::NotYet,
        ),
        (
            include_str!("screens/claude-theme.txt"),
            KnownCli::Claude,
            Readiness::Blocked(KnownCli::Claude, Blocker::FirstRun),
        ),
        (
            include_str!("screens/claude-security.txt"),
            KnownCli::Claude,
            Readiness::Blocked(KnownCli::Claude, Blocker::FirstRun),
        ),
        (
            include_str!("screens/claude-trust.txt"),
            KnownCli::Claude,
            Readiness::Blocked(KnownCli::Claude, Blocker::Trust),
        ),
        (
            include_str!("screens/claude-api-key.txt"),
            KnownCli::Claude,
            Readiness::Blocked(KnownCli::Claude, Blocker::ApiKey),
        ),
        (
            include_str!("screens/claude-login.txt"),
            KnownCli::Claude,
            Readiness::Blocked(KnownCli::Claude, Blocker::SignIn),
        ),
        (
            include_str!("screens/claude-not-logged-in.txt"),
            KnownCli::Claude,
            Readiness::Blocked(KnownCli::Claude, Blocker::NotLoggedIn),
        ),
        (
            include_str!("screens/claude-offline.txt"),
            KnownCli::Claude,
            Readiness::Blocked(KnownCli::Claude, Blocker::Offline),
        ),
        (
            include_str!("screens/claude-ready.txt"),
            KnownCli::Claude,
            Readiness::Ready,
        ),
    ];

    #[test]
    fn each_captured_screen_is_recognised_for_what_it_is() {
        for (screen, cli, want) in SCREENS {
            let judge = Judge {
                cli: Some(cli),
                pattern: None,
            };
            assert_eq!(judge.judge(screen), want, "{cli:?}:\n{screen}");
        }
    }

    #[test]
    fn no_blocking_screen_passes_for_ready_and_no_screen_of_one_cli_for_the_other() {
        for (screen, cli, want) in SCREENS {
            // A dialog's choice marker is not a prompt, blocking text or not (Claude's
            // prompt saying it is not logged in is a prompt, held by what it says).
            let prompt = matches!(
                want,
                Readiness::Ready | Readiness::Blocked(_, Blocker::NotLoggedIn)
            );
            assert!(
                !ready(cli, &tidy(screen)) || prompt,
                "{cli:?} taken for ready:\n{screen}"
            );
            let other = match cli {
                KnownCli::Codex => KnownCli::Claude,
                KnownCli::Claude => KnownCli::Codex,
            };
            assert!(
                !ready(other, &tidy(screen)),
                "{other:?} ready on:\n{screen}"
            );
        }
    }

    #[test]
    fn an_empty_or_starting_screen_is_not_yet_ready() {
        for cli in [KnownCli::Codex, KnownCli::Claude] {
            let judge = Judge {
                cli: Some(cli),
                pattern: None,
            };
            assert_eq!(judge.judge(""), Readiness::NotYet);
            assert_eq!(judge.judge("\n\n   \n"), Readiness::NotYet);
            assert_eq!(
                judge.judge("  >_ OpenAI Codex (v0.169.0)\n"),
                Readiness::NotYet
            );
        }
    }

    #[test]
    fn a_ready_pattern_decides_readiness_and_a_known_clis_blockers_still_hold() {
        let pattern = ReadyPattern::new(r"^agent>\z").unwrap();
        let judge = Judge {
            cli: None,
            pattern: Some(pattern.clone()),
        };
        assert_eq!(judge.judge("loading...\n"), Readiness::NotYet);
        assert_eq!(judge.judge("loading...\nagent> \n\n  \n"), Readiness::Ready);
        // Anchored at the end: an old prompt above the running task does not count.
        assert_eq!(judge.judge("agent> task\nworking\n"), Readiness::NotYet);
        // With a known CLI, its blocking screens win over the pattern.
        let codex = Judge {
            cli: Some(KnownCli::Codex),
            pattern: Some(ReadyPattern::new("Codex").unwrap()),
        };
        let sign_in = include_str!("screens/codex-sign-in.txt");
        assert_eq!(
            codex.judge(sign_in),
            Readiness::Blocked(KnownCli::Codex, Blocker::SignIn)
        );
        let ready = include_str!("screens/codex-ready.txt");
        assert_eq!(codex.judge(ready), Readiness::Ready);
        // No judge at all: everything passes (the quiet rule decides elsewhere).
        assert!(!Judge::default().judges());
    }

    #[test]
    fn a_bad_ready_pattern_is_refused_with_why() {
        assert!(ReadyPattern::new("").unwrap_err().contains("empty"));
        let e = ReadyPattern::new("agent> (").unwrap_err();
        assert!(e.contains("not a valid regular expression"), "{e}");
        let long = "a".repeat(MAX_READY_PATTERN + 1);
        assert!(ReadyPattern::new(&long)
            .unwrap_err()
            .contains("over the limit"));
        // Small to write, huge compiled.
        let e = ReadyPattern::new(r"\w{500}\w{500}").unwrap_err();
        assert!(e.contains("not a valid regular expression"), "{e}");
    }

    #[test]
    fn the_last_lines_are_escaped_and_blank_lines_skipped() {
        let screen = "one\n\n two  \nthree\x1b[31m\n\n\n";
        assert_eq!(last_lines(screen, 2), "two | three\\u{1b}[31m");
        let sign_in = include_str!("screens/codex-sign-in.txt");
        assert_eq!(
            last_lines(sign_in, 2),
            "Use an API key or another provider | Press enter to continue"
        );
    }

    #[test]
    fn the_reason_says_what_and_how() {
        let why = Blocker::SignIn.explain(KnownCli::Codex, "%3", "tmux -L relay attach -t %3");
        assert_eq!(
            why,
            "codex in pane %3 shows its sign-in screen; sign in there (tmux -L relay attach -t %3) or give it credentials (the agent's --secret), then ask again"
        );
    }
}
