//! The help a person reads: the top-level command list grouped by use (daily, agents,
//! running Relay), made from the commands themselves so it cannot drift; each common
//! command's examples; and the man pages (`relay man`, from the same command).

use std::path::PathBuf;

use clap::Command;

use crate::exit::Exit;

/// The top-level commands by group, in the order `relay --help` shows them. A test
/// checks every visible command is in exactly one.
const GROUPS: &[(&str, &[&str])] = &[
    (
        "Daily",
        &[
            "ask", "send", "read", "watch", "flight", "diff", "revert", "approval", "rule",
            "replay", "open",
        ],
    ),
    (
        "Agents and conversations",
        &["agent", "conversation", "reply", "mcp", "acp"],
    ),
    (
        "Running Relay",
        &[
            "up",
            "node",
            "node-key",
            "status",
            "usage",
            "events",
            "doctor",
            "completions",
            "man",
            "help",
        ],
    ),
];

/// `cmd` with its help listing the subcommands by [`GROUPS`] instead of in one list.
pub fn grouped(cmd: Command) -> Command {
    let cmd = cmd.disable_help_subcommand(false);
    let mut built = cmd.clone();
    built.build();
    let width = built
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(|c| c.get_name().len())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (title, names) in GROUPS {
        text.push_str(&format!("{title}:\n"));
        for name in *names {
            let about = built
                .find_subcommand(name)
                .and_then(|c| c.get_about())
                .map(|a| a.to_string())
                .unwrap_or_default();
            let first = about.trim_end_matches('.');
            text.push_str(&format!("  {name:<width$}  {first}\n"));
        }
        text.push('\n');
    }
    cmd.help_template(format!(
        "{{before-help}}{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{text}Options:\n{{options}}{{after-help}}"
    ))
}

/// The first steps both top-level helps end with.
macro_rules! first_steps {
    () => {
        "\
First steps:
  relay up                                   # the broker, in a terminal of its own
  relay agent add codex-1 --harness codex --cwd ~/src/project
  relay ask codex-1 \"what does this repo do?\"
  relay open                                 # the dashboard in your browser
"
    };
}

pub const TOP_AFTER_HELP: &str = concat!(
    first_steps!(),
    "
Exit codes: 0 done, 1 failed, 2 usage, 3 not found, 4 refused, 5 broker unavailable,
6 cancelled, 70 internal error, 130 Ctrl-C (`relay --help` says more)."
);

pub const TOP_AFTER_LONG_HELP: &str = concat!(
    first_steps!(),
    "
Exit codes:
  0    done: the command did what it was asked (an ask's flight completed)
  1    failed: the flight failed (relay doctor: the data dir has a problem)
  2    usage: bad arguments, or a request the broker refused as invalid
  3    not found: no such agent, flight, conversation, message or approval
  4    refused: not allowed (an agent's token), or a conflict (exists already, a
       cycle, a chain too deep, a flight already ended; relay doctor: a running relay
       holds the data dir)
  5    unavailable: no broker runs, it cannot be reached, or it is overloaded (try again)
  6    cancelled: the flight was cancelled or interrupted
  70   internal: an unexpected answer (a bug: please report it)
  130  stopped by Ctrl-C

Every listing and show takes --json. Text from agents and models is shown with its
control characters escaped. Colour follows --color, NO_COLOR and the terminal."
);

pub const ASK: &str = "\
Examples:
  relay ask codex-1 \"what does this repo do?\"
  relay ask codex-1 - < task.md              # the task from a file
  relay ask reviewer --timeout 600 \"is this diff safe?\"
  relay ask codex-1 --no-wait \"refactor the parser\"   # prints the flight id
  relay ask codex-1 --json \"summarise\" | jq .output

While it waits, a status line on stderr says what the agent is doing (on a terminal) or
notes and approvals go to stderr as lines (in a pipe). Ctrl-C interrupts the flight and
says how to follow it; a second Ctrl-C leaves it running and exits. A broker restart is
followed through: the reply goes on from where it was.";

pub const ACP: &str = "\
The broker comes from RELAY_URL + RELAY_TOKEN (an agent's session has both), or the data \
dir's api.json (--data-dir, RELAY_DATA_DIR). stdout carries only the protocol (JSON-RPC, \
one message a line); relay acp's own words go to stderr.

Zed (settings.json):
  \"agent_servers\": {
    \"Relay codex-1\": {
      \"type\": \"custom\",
      \"command\": \"relay\",
      \"args\": [\"acp\", \"codex-1\"]
    }
  }

JetBrains (~/.jetbrains/acp.json), Neovim (CodeCompanion, avante.nvim), Emacs \
(agent-shell): an ACP agent whose command is `relay` with the arguments `acp AGENT` \
(add \"env\": {\"RELAY_DATA_DIR\": \"...\"} for a broker with another data dir).

What the editor sees: each session is a Relay conversation (its id is the session id, \
so a session is reopened with its history by any later relay acp); each prompt asks \
AGENT in it, streaming its text, thoughts, commands and plan; each approval the flight \
waits for is a permission request (allow once or reject; decided as --as); cancel \
interrupts the flight. A failed flight answers the prompt with an error. The editor's \
cwd and MCP servers are not used: AGENT works in its own cwd with its own tools, and no \
file or terminal access is asked of the editor. Flights still running when the editor \
quits go on in Relay.";

pub const SEND: &str = "\
Examples:
  relay send \"the build is green\"
  relay send \"@codex-1 @claude-1 which approach is faster?\"   # both are asked
  relay send --to team.backend --reply-to msg_01... \"fixed\"";

pub const READ: &str = "\
Examples:
  relay read                                 # the last 20 messages of channel.shared
  relay read team.backend -n 50 --json";

pub const WATCH: &str = "\
Examples:
  relay watch --flight flt_01...             # its text so far, then live; ends with it
  relay watch --agent codex-1                # every turn of the agent, as a transcript
  relay watch --conversation channel.shared
  relay watch --fleet --json | jq .";

pub const EVENTS: &str = "\
Examples:
  relay events                               # the last 50 events
  relay events --since 1200 -n 100
  relay events --follow --json | head -1";

pub const COMPLETIONS: &str = "\
Examples:
  relay completions bash > ~/.local/share/bash-completion/completions/relay
  relay completions zsh > ~/.zfunc/_relay    # with fpath+=~/.zfunc before compinit
  relay completions fish > ~/.config/fish/completions/relay.fish";

pub const FLIGHT_LIST: &str = "\
Examples:
  relay flight list
  relay flight list --agent codex-1 --live
  relay flight list --state failed -n 10 --json
  relay flight list --since 24h --search \"disk full\"   # any case";

pub const FLIGHT_SHOW: &str = "\
Examples:
  relay flight show flt_01...                # or: relay flight flt_01...
  relay flight show flt_01... --updates      # the whole run as a transcript
  relay flight show flt_01... --tree         # who asked whom";

pub const APPROVAL_LIST: &str = "\
Examples:
  relay approval list                        # the pending ones
  relay approval list --state all --json";

pub const APPROVAL_DECIDE: &str = "\
Examples:
  relay approval decide apr_01... accept
  relay approval decide apr_01... decline
  relay approval decide apr_01... accept --remember agent       # and the next `cargo test` too
  relay approval decide apr_01... accept --remember project --any-arg 2

--remember makes a rule (`relay rule list`) that decides the next request of the same kind \
exactly like this one, within its scope: session (this agent's current session), agent, \
project (every agent whose directory is this agent's) or everywhere. A command is \
remembered word for word as it will run, never as a prefix: a rule for `cargo test` does \
not cover `cargo test --release` or `cargo test; rm -rf ~`. --any-arg N lets the Nth \
argument be any plain argument (not an option). A file change is remembered by its \
path(s). A decline rule wins over an accept rule; the narrowest scope goes first.";

pub const RULE_LIST: &str = "\
Examples:
  relay rule list
  relay rule list --agent codex-1            # the rules that apply to codex-1 now
  relay rule list --json | jq '.[] | select(.matched == 0)'

Columns: the rule, its decision, the kind of request (command or file_change), its scope \
and what it is bound to, the approval that made it, how many requests it decided and when \
last, and its pattern (cut on a narrow terminal: `relay rule show` has it whole).";

pub const USAGE: &str = "\
Examples:
  relay usage                                # by agent, every flight
  relay usage --by day --since 7d
  relay usage --by tree --since 2026-11-27 --agent codex-1
  relay usage --by conversation --json | jq '.rows[0]'

INPUT includes CACHED (read from the model's cache); OUTPUT includes REASONING; TOKENS \
is INPUT plus OUTPUT, what budgets count. A flight counts in the UTC day it was created, \
with its turn's usage as last reported. COST is `?` where no cost is known, and ends in \
`+?` when some flights' is not (their tokens are counted, their cost is not).";

pub const AGENT_SET: &str = "\
Examples:
  relay agent set codex-1 --budget 200000/day --budget '$5/day'
  relay agent set codex-1 --budget 50k/tree --on-budget interrupt
  relay agent set codex-1 --on-budget finish  # keeps its limits
  relay agent set codex-1 --no-budget

--budget replaces every limit the agent had. The limits apply from its next flight: one \
that would start past a limit is refused (budget_exceeded, exit 4), saying when it resets.";

pub const AGENT_FORK: &str = "Examples:
  relay agent fork codex-1 codex-2
  relay agent fork codex-1 codex-2 --at flt_01J...";

pub const AGENT_ADD: &str = "\
Examples:
  relay agent add codex-1 --harness codex --cwd ~/src/project
  OPENAI_API_KEY=... relay agent add codex-2 --harness codex --cwd . --secret OPENAI_API_KEY
  relay agent add claude-1 --harness claude --cwd . --model sonnet
  relay agent add careful --harness codex --cwd . --auto-accept \"cargo test\"
  relay agent add tm-1 --harness tmux --cwd . --command \"codex\"
  relay agent add gem --harness gemini --cwd .
  relay agent add kimi --harness acp --cwd . --command kimi --arg acp
  relay agent add cx-a --harness codex --cwd ~/src/project --worktree --copy .env
  relay agent add cx-b --harness codex --cwd ~/src/project --worktree --accept-file-changes
  relay agent add capped --harness claude --cwd . --budget 200000/day --budget '$2/day'

With --worktree the agent works in a git worktree of the repository --cwd names, on its
own branch relay/NAME (from --base, default the repository's current branch), made under
Relay's data dir (or --worktree-dir DIR): agents on one repository never touch each
other's files or your checkout. Each flight's changes become a commit naming it: `relay
diff FLIGHT`, `relay revert FLIGHT`; `relay agent remove` removes the worktree and keeps
the branch; `relay doctor --fix` removes worktrees no agent owns.

ACP agents (--harness acp, or the presets gemini, opencode, qwen) run in ACP mode; Relay
offers them no file system or terminal of its own (they use their own tools, which ask
first). Each keeps its settings and sessions under the HOME it runs with: give an agent
its own with --env HOME=DIR to keep them apart from yours.

Credentials: each agent CLI uses its own login under HOME (`codex login`, `claude` then
/login, Pi's auth file) or a key you pass with --secret (OPENAI_API_KEY,
ANTHROPIC_API_KEY...). See README.md, Credentials.";

/// `relay man`: the top page on stdout, or every command's page into `out`.
pub fn man(out: Option<PathBuf>) -> anyhow::Result<Exit> {
    use anyhow::Context;
    let cmd = crate::command();
    let Some(dir) = out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut page)?;
        crate::terminal::write_stdout(&String::from_utf8_lossy(&page));
        return Ok(Exit::Ok);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
    let mut written = 0;
    let mut pending = vec![("relay".to_string(), cmd)];
    while let Some((name, mut cmd)) = pending.pop() {
        cmd.build();
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            let full = format!("{name}-{}", sub.get_name());
            pending.push((full.clone(), sub.clone().name(full)));
        }
        let path = dir.join(format!("{name}.1"));
        let mut page = Vec::new();
        clap_mangen::Man::new(cmd.name(name)).render(&mut page)?;
        std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
        written += 1;
    }
    crate::terminal::errln!("relay: wrote {written} man pages to {}", dir.display());
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_command_is_in_exactly_one_group() {
        let mut cmd = crate::command();
        cmd.build();
        let listed: Vec<&str> = GROUPS.iter().flat_map(|(_, n)| n.iter().copied()).collect();
        for sub in cmd.get_subcommands().filter(|c| !c.is_hide_set()) {
            let n = listed.iter().filter(|l| **l == sub.get_name()).count();
            assert_eq!(n, 1, "{} is in {n} groups", sub.get_name());
        }
        for name in &listed {
            assert!(cmd.find_subcommand(name).is_some(), "{name} is no command");
        }
    }

    /// `relay acp --help`'s text after the options, rendered `width` columns wide.
    fn acp_after_help(width: usize) -> String {
        let mut cmd = crate::command().term_width(width);
        cmd.build();
        let acp = cmd.find_subcommand_mut("acp").unwrap();
        let help = acp.render_long_help().to_string();
        let at = help.find("The broker comes from").unwrap();
        help[at..].to_string()
    }

    #[test]
    fn the_acp_help_reflows_to_the_terminal() {
        // Prose is left for clap to wrap: on a wide terminal a paragraph is one line
        // (not pre-wrapped at a width of its own)...
        let wide = acp_after_help(400);
        assert!(
            wide.lines().any(|l| l.starts_with("The broker comes from")
                && l.ends_with("relay acp's own words go to stderr.")),
            "{wide}"
        );
        // ...and on a narrow one no line is cut short before the next one goes on.
        let narrow = acp_after_help(60);
        let lines: Vec<&str> = narrow.lines().collect();
        for pair in lines.windows(2) {
            let (line, next) = (pair[0], pair[1]);
            assert!(line.chars().count() <= 60, "too wide: {line:?}\n{narrow}");
            let prose = |l: &str| !l.is_empty() && !l.starts_with(' ');
            if prose(line) && prose(next) && !line.ends_with(':') {
                assert!(
                    line.chars().count() >= 40,
                    "a line cut short: {line:?}\n{narrow}"
                );
            }
        }
    }

    #[test]
    fn the_top_help_is_grouped() {
        let help = crate::command().render_help().to_string();
        let daily = help.find("Daily:").unwrap_or(usize::MAX);
        let running = help.find("Running Relay:").unwrap_or(0);
        assert!(daily < running, "{help}");
        assert!(help.contains("  ask "), "{help}");
        assert!(
            !help.contains("  approve "),
            "hidden aliases stay hidden: {help}"
        );
    }
}
