//! Agents: `relay agent add|attach|list|show|set|wake|remove|peek|fork` (the worktree
//! parts in [`super::workspace`], the budget in [`super::budget`]).

use relay_protocol::api::Empty;
use relay_protocol::methods::call as m;
use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Subcommand;
use relay_client::Client;
use relay_protocol::api::AgentAdded;
use relay_protocol::domain::{
    Agent, AgentSpec, Harness, PaneSpec, WakePolicy, DEFAULT_TMUX_SOCKET,
};

use super::JsonFlag;
use crate::exit::usage;
use crate::help;
use crate::terminal::{errln, outln};
use crate::views::print_json;
use crate::views::table::{Cell, Table};

// Parsed once per run: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum AgentCmd {
    /// Register an agent.
    #[command(after_help = help::AGENT_ADD)]
    Add {
        /// The agent's name: letters, digits, `-` and `_` (it appears in NATS subjects).
        name: String,
        /// The agent CLI: codex, claude, pi or tmux (also by their long names
        /// codex_app_server, claude_stream_json, pi_rpc); acp for any Agent Client
        /// Protocol agent (with --command and its --arg), or one of the ACP presets
        /// gemini, opencode, qwen (gemini_acp, opencode_acp, qwen_acp).
        #[arg(long, value_parser = parse_harness)]
        harness: Harness,
        /// Working directory of the agent.
        #[arg(long)]
        cwd: PathBuf,
        /// Program to run instead of the harness's default binary. For a tmux agent, the
        /// command line to start in its pane (`--command "codex --search"`; shell-quoted
        /// words, no shell in between): required, unless --shell.
        #[arg(long)]
        command: Option<String>,
        /// tmux: run a shell in the pane instead of a --command. Relay then types each
        /// task into that shell, where it runs as shell commands: ask for it only if
        /// that is what you want.
        #[arg(long, conflicts_with = "command")]
        shell: bool,
        /// tmux: a regular expression the pane's screen matches when its program is
        /// ready for a task (`--ready-pattern '^agent>\z'`; each line's trailing spaces
        /// removed, `^`/`$` at line ends, `\z` after the last non-blank line). Relay
        /// pastes only once it matches, and fails the flight with what the pane shows
        /// when it does not within 30 s. Default: codex's and claude's own ready
        /// screens, else a pane is ready once its output is quiet.
        #[arg(long, value_name = "RE")]
        ready_pattern: Option<String>,
        /// tmux: the servers to start agents' panes on, a socket name (`tmux -L`) or
        /// path (`tmux -S`); each agent gets a server of its own, SOCKET@NAME (`relay
        /// agent show` prints how to attach) [default: relay].
        #[arg(long, value_name = "SOCKET")]
        socket: Option<String>,
        /// A turn that has not ended after this many seconds fails (an ask's --timeout
        /// wins). Default: no limit, except 1800 for a tmux agent, whose turns end only
        /// when it answers.
        #[arg(long, value_name = "SECS")]
        turn_timeout: Option<u64>,
        /// Extra argument for the program (repeatable).
        #[arg(long = "arg", value_name = "A", allow_hyphen_values = true)]
        args: Vec<String>,
        /// Environment variable for the program, K=V (repeatable). One whose name looks
        /// like a secret (…KEY, …TOKEN, …SECRET, …PASSWORD…) is kept as a secret, like
        /// --secret.
        #[arg(long = "env", value_name = "K=V", value_parser = parse_kv)]
        env: Vec<(String, String)>,
        /// A secret variable for the program, its value taken from this command's own
        /// environment (`OPENAI_API_KEY=... relay agent add a --secret OPENAI_API_KEY`),
        /// so it never shows in `ps`. Secrets are stored apart from the event log, never
        /// published or listed (shown as ***), and deleted with the agent (repeatable).
        #[arg(long = "secret", value_name = "NAME")]
        secret: Vec<String>,
        /// Model the agent's harness uses (else the harness's own default).
        #[arg(long)]
        model: Option<String>,
        /// Runtime node that serves the agent (default: the broker's embedded runtime).
        #[arg(long)]
        node: Option<String>,
        /// on_demand, keep_warm or manual.
        #[arg(long, default_value_t = WakePolicy::OnDemand)]
        wake: WakePolicy,
        #[command(flatten)]
        approvals: super::approval::PolicyArgs,
        #[command(flatten)]
        budget: super::budget::BudgetArgs,
        /// Who may invoke the agent (ask it, or consult it with a mention), repeatable:
        /// `operator` (you: any requester that is not an agent), an agent's name, or `*`
        /// for anyone [default: *]. A tmux agent without --command runs a shell, which
        /// runs each task as commands with no approval step: it must name this.
        #[arg(long = "allow-from", value_name = "PRINCIPAL")]
        allow_from: Vec<String>,
        #[command(flatten)]
        worktree: super::workspace::WorktreeArgs,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Adopt an agent already running in a tmux pane of yours (started outside Relay) as
    /// a tmux agent: Relay pastes its tasks into that pane, follows what it prints, and
    /// never ends it. The agent answers with `relay reply FLIGHT TEXT` (the pasted task
    /// says how); it needs RELAY_URL and a token in its environment to do so.
    #[command(
        after_help = "Example, from a shell inside the pane:\n  relay agent attach helper --allow-from operator\n\
From anywhere:\n  relay agent attach helper --pane %3 --socket default --allow-from operator"
    )]
    Attach {
        /// The agent's name.
        name: String,
        /// The pane: its id (`%3`) or `session:window.pane` [default: this pane,
        /// $TMUX_PANE].
        #[arg(long)]
        pane: Option<String>,
        /// The tmux server holding it: a socket name (`-L`) or path (`-S`) [default:
        /// the server of this shell ($TMUX), else `default`, your usual one].
        #[arg(long)]
        socket: Option<String>,
        /// The agent's working directory, for the record [default: this directory].
        #[arg(long)]
        cwd: Option<PathBuf>,
        /// A turn with no answer after this many seconds fails [default: 1800].
        #[arg(long, value_name = "SECS")]
        turn_timeout: Option<u64>,
        /// Who may invoke the agent (repeatable; required): `operator` (you), an agent's
        /// name, or `*` for anyone. Relay does not know what the pane runs (a shell runs
        /// each task as commands), so it is never a default.
        #[arg(long = "allow-from", value_name = "PRINCIPAL")]
        allow_from: Vec<String>,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List agents: name, harness, state, node and directory.
    #[command(
        alias = "ls",
        after_help = "Examples:\n  relay agent list\n  relay agent list --json"
    )]
    List(JsonFlag),
    /// Show one agent: its harness's session id (`session_id`; Codex's `thread_id` too)
    /// and what its harness can do (steer, approvals, resume, interrupt).
    #[command(
        after_help = "Examples:\n  relay agent show codex-1\n  relay agent show codex-1 --json"
    )]
    Show {
        /// The agent's name.
        name: String,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Change an agent's budget (`--budget` replaces its limits), or remove it.
    Set(super::budget::SetArgs),
    /// Start an agent's session now instead of at its first turn (an agent with wake
    /// policy `manual` runs no turn until this).
    #[command(after_help = "Example:\n  relay agent wake codex-1")]
    Wake {
        /// The agent's name.
        name: String,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove an agent (its running turn ends; its history stays in the log). Its
    /// worktree is removed and its branch kept; a worktree with uncommitted work is
    /// refused unless --force.
    #[command(
        alias = "rm",
        after_help = "Examples:\n  relay agent remove codex-1\n  relay agent remove codex-1 --force"
    )]
    Remove {
        /// The agent's name.
        name: String,
        /// Remove its worktree even with uncommitted work (committed on its branch
        /// first: nothing is lost).
        #[arg(long)]
        force: bool,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show what a tmux agent's pane shows now (its last lines as plain text) and how to
    /// look at it live.
    #[command(after_help = "Example:\n  relay agent peek tm-1 -n 20")]
    Peek(super::flight::PeekArgs),
    /// Fork an agent: a new agent whose session continues SRC's conversation from a
    /// flight (its turns up to it) and whose worktree branches from that flight's
    /// commit. For trying another approach from there (codex, claude and pi can fork).
    #[command(after_help = help::AGENT_FORK)]
    Fork(super::workspace::ForkArgs),
}

/// `--harness`: a harness's short name (`codex`, `claude`, `pi`, `tmux`) or its long one.
fn parse_harness(s: &str) -> Result<Harness, String> {
    Harness::from_name(s).ok_or_else(|| {
        format!("unknown harness {s:?}: codex, claude, pi, tmux, acp, gemini, opencode or qwen")
    })
}

/// `relay agent add|attach|list|show|wake|remove|peek`.
pub async fn run(client: &Client, cmd: AgentCmd) -> anyhow::Result<()> {
    match cmd {
        AgentCmd::Add {
            name,
            harness,
            cwd,
            command,
            shell,
            ready_pattern,
            socket,
            turn_timeout,
            mut args,
            env,
            secret,
            model,
            node,
            wake,
            approvals,
            budget,
            allow_from,
            worktree,
            json,
        } => {
            let budget = budget.budget()?;
            let cwd = std::path::absolute(&cwd).unwrap_or(cwd);
            let mut command = command;
            let mut pane = None;
            if harness == Harness::Tmux {
                // A pane's command is a command line: its words, then any --arg.
                if let Some(line) = command.take() {
                    let Some(mut words) = shlex::split(&line).filter(|w| !w.is_empty()) else {
                        usage!("--command {line:?}: unbalanced quotes, or no command");
                    };
                    words.append(&mut args);
                    command = Some(words.remove(0));
                    args = words;
                }
                // Neither --command nor --shell: the broker refuses it, saying so.
                pane = Some(PaneSpec {
                    socket: socket.unwrap_or_else(|| DEFAULT_TMUX_SOCKET.to_string()),
                    target: None,
                    ready_pattern,
                    shell,
                });
            } else {
                for (given, flag) in [
                    (socket.is_some(), "--socket"),
                    (shell, "--shell"),
                    (ready_pattern.is_some(), "--ready-pattern"),
                ] {
                    if given {
                        usage!("{flag} is for a tmux agent (--harness tmux) only");
                    }
                }
            }
            for (name, value) in &env {
                if relay_protocol::domain::looks_secret(name)
                    || relay_protocol::domain::looks_secret_value(value)
                {
                    errln!(
                        "relay: note: {name} is kept as a secret, but its value was on this command line (ps and shell history show it); next time: {name}=... relay agent add ... --secret {name}"
                    );
                }
            }
            let mut secrets = BTreeMap::new();
            for name in secret {
                let Ok(value) = std::env::var(&name) else {
                    usage!(
                        "--secret {name}: {name} is not set in this command's environment (run `{name}=... relay agent add ... --secret {name}`)"
                    );
                };
                secrets.insert(name, value);
            }
            let added: AgentAdded = client
                .call::<m::AgentAdd>(
                    &[],
                    &AgentSpec {
                        fork: None,
                        budget,
                        worktree: worktree.spec(),
                        name,
                        harness,
                        cwd: cwd.display().to_string(),
                        model,
                        node,
                        wake,
                        command,
                        args,
                        env: env.into_iter().collect::<BTreeMap<_, _>>(),
                        secrets: relay_protocol::domain::Secrets(secrets),
                        approval_policy: approvals.policy(),
                        pane,
                        turn_timeout_secs: turn_timeout,
                        allow_from,
                    },
                )
                .await?;
            // What the broker's checks found but did not refuse (credentials not found...).
            for warning in &added.warnings {
                errln!("relay: warning: {warning}");
            }
            if json {
                print_json(&added)?;
            } else {
                let agent = &added.agent;
                outln!(
                    "added {} ({} in {}); ask it: relay ask {} \"...\"",
                    agent.spec.name,
                    agent.spec.harness,
                    agent.spec.cwd,
                    agent.spec.name
                );
                for line in super::workspace::show_lines(agent) {
                    outln!("{line}");
                }
            }
        }
        AgentCmd::Attach {
            name,
            pane,
            socket,
            cwd,
            turn_timeout,
            allow_from,
            json,
        } => {
            let Some(target) =
                pane.or_else(|| std::env::var("TMUX_PANE").ok().filter(|p| !p.is_empty()))
            else {
                usage!("which pane? give --pane %N (or session:window.pane), or run this inside the pane");
            };
            // $TMUX is "socket path,server pid,session".
            let socket = socket
                .or_else(|| {
                    std::env::var("TMUX")
                        .ok()
                        .and_then(|t| t.split(',').next().map(str::to_string))
                        .filter(|s| !s.is_empty())
                })
                .unwrap_or_else(|| "default".to_string());
            let cwd = cwd.unwrap_or_else(|| PathBuf::from("."));
            let cwd = std::path::absolute(&cwd).unwrap_or(cwd);
            let spec = AgentSpec {
                pane: Some(PaneSpec {
                    socket,
                    target: Some(target),
                    ..PaneSpec::default()
                }),
                turn_timeout_secs: turn_timeout,
                allow_from,
                // Its program runs already: nothing to start before a task comes.
                ..AgentSpec::new(name, Harness::Tmux, cwd.display().to_string())
            };
            let agent: Agent = client.call::<m::AgentAdd>(&[], &spec).await?.agent;
            if json {
                print_json(&agent)?;
            } else {
                let pane = agent.spec.pane.clone().unwrap_or_default();
                let target = pane.target.clone().unwrap_or_default();
                outln!(
                    "{} (tmux) attached to pane {target}; look at it: {}",
                    agent.spec.name,
                    pane.attach_hint(&agent.spec.name, &target)
                );
            }
        }
        AgentCmd::List(f) => {
            let agents: Vec<Agent> = client.call::<m::AgentList>(&[], &Empty {}).await?;
            if f.json {
                print_json(&agents)?;
            } else {
                let mut table = Table::new(&["NAME", "HARNESS", "STATE", "NODE", "CWD", "BRANCH"])
                    .optional(&["NODE", "HARNESS", "BRANCH"]);
                for a in &agents {
                    table.row(vec![
                        Cell::new(&a.spec.name),
                        Cell::new(a.spec.harness.to_string()),
                        Cell::state(a.state.as_str()),
                        Cell::dim(a.spec.node.as_deref().unwrap_or("local")),
                        Cell::new(&a.spec.cwd),
                        Cell::dim(super::workspace::list_marker(a)),
                    ]);
                }
                table.print(
                    crate::terminal::width(),
                    "no agents yet: relay agent add NAME --harness codex|claude|pi|gemini|opencode|qwen|acp|tmux --cwd DIR",
                );
            }
        }
        AgentCmd::Show { name, json } => {
            let a: Agent = client.call::<m::AgentShow>(&[&name], &Empty {}).await?;
            if json {
                print_json(&a)?;
            } else {
                outln!("name      {}", a.spec.name);
                outln!("harness   {}", a.spec.harness);
                outln!("cwd       {}", a.spec.cwd);
                for line in super::workspace::show_lines(&a) {
                    outln!("{line}");
                }
                outln!("state     {}", a.state.as_str());
                if let Some(reason) = &a.state_reason {
                    outln!("why       {}", reason.replace('\n', "\n          "));
                }
                if let Some(note) = &a.note {
                    outln!("note      {}", super::flight::note_text(note));
                }
                outln!("node      {}", a.spec.node.as_deref().unwrap_or("(local)"));
                outln!("session   {}", a.session_id.as_deref().unwrap_or("-"));
                if let Some(thread) = &a.thread_id {
                    outln!("thread_id {thread}");
                }
                if let Some(pid) = a.endpoint.as_ref().and_then(|e| e.pid) {
                    outln!("pid       {pid}");
                }
                if let Some(program) = &a.program {
                    outln!("program   {}", program_line(program));
                }
                if let Some(spec) = &a.spec.pane {
                    let live = a.endpoint.as_ref().and_then(|e| e.pane.clone());
                    match live.or_else(|| spec.target.clone()) {
                        Some(pane) => {
                            let server = spec.server(&a.spec.name);
                            outln!("pane      {pane} on tmux server {server}");
                            outln!("look      {}", spec.attach_hint(&a.spec.name, &pane));
                        }
                        None => outln!(
                            "pane      none yet (started on tmux server {} with its first task)",
                            spec.server(&a.spec.name)
                        ),
                    }
                }
                outln!(
                    "allow     {} (who may invoke it)",
                    a.spec.allowed_from().join(", ")
                );
                let approvals = a.spec.harness.capabilities().approvals;
                for line in super::approval::policy_lines(&a.spec.approval_policy, approvals) {
                    outln!("{line}");
                }
                for line in super::budget::agent_lines(client, &a.spec.name).await {
                    outln!("{line}");
                }
                for line in capability_lines(a.spec.harness) {
                    outln!("{line}");
                }
            }
        }
        AgentCmd::Remove { name, force, json } => {
            let a: Agent = client
                .call::<m::AgentRemove>(&[&name], &relay_protocol::api::RemoveQuery { force })
                .await?;
            if json {
                print_json(&a)?;
            } else {
                super::workspace::removed(&a, force);
            }
        }
        AgentCmd::Set(args) => super::budget::set(client, args).await?,
        AgentCmd::Fork(args) => super::workspace::fork(client, args).await?,
        AgentCmd::Peek(args) => super::flight::peek(client, args).await?,
        AgentCmd::Wake { name, json } => {
            let a: Agent = client.call::<m::AgentWake>(&[&name], &Empty {}).await?;
            if json {
                print_json(&a)?;
            } else {
                outln!(
                    "waking {} (see `relay agent show {}`)",
                    a.spec.name,
                    a.spec.name
                );
            }
        }
    }
    Ok(())
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected K=V, got {s:?}"))
}

/// What the agent's program said of itself at its last start, on one line:
/// `gemini-cli 0.61.0 (ACP 1: load_session, image)`.
fn program_line(p: &relay_protocol::domain::ProgramInfo) -> String {
    let mut line = p.name.clone();
    if !p.version.is_empty() {
        line.push(' ');
        line.push_str(&p.version);
    }
    let caps = p.capabilities.join(", ");
    match (p.protocol_version, caps.is_empty()) {
        (Some(v), true) => line.push_str(&format!(" (ACP {v})")),
        (Some(v), false) => line.push_str(&format!(" (ACP {v}: {caps})")),
        (None, false) => line.push_str(&format!(" ({caps})")),
        (None, true) => {}
    }
    line
}

/// What `relay agent show` says of a harness's controls, one line each.
fn capability_lines(harness: Harness) -> Vec<String> {
    let can = harness.capabilities();
    let yes_no = |b: bool, yes: &str, no: &str| if b { yes.to_string() } else { no.to_string() };
    vec![
        format!(
            "approvals {}",
            yes_no(
                can.approvals,
                "asks before it runs commands or edits (`relay approval list`)",
                &format!("none: {harness} has no approval step, its tools run without asking"),
            )
        ),
        format!(
            "steer     {}",
            yes_no(
                can.steer,
                "yes",
                "no: interrupt it and ask again, or send a follow-up",
            )
        ),
        format!("interrupt {}", yes_no(can.interrupt, "yes", "no")),
        format!(
            "resume    {}",
            yes_no(
                can.resume,
                "the session continues after restarts",
                "no: a restart starts a new session",
            )
        ),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn harnesses_have_short_names() {
        assert_eq!(parse_harness("codex"), Ok(Harness::CodexAppServer));
        assert_eq!(parse_harness("claude"), Ok(Harness::ClaudeStreamJson));
        assert_eq!(parse_harness("pi"), Ok(Harness::PiRpc));
        assert_eq!(parse_harness("tmux"), Ok(Harness::Tmux));
        assert_eq!(parse_harness("pi_rpc"), Ok(Harness::PiRpc));
        assert!(parse_harness("gpt")
            .unwrap_err()
            .contains("codex, claude, pi, tmux, acp, gemini, opencode or qwen"));
        assert_eq!(parse_harness("gemini"), Ok(Harness::GeminiAcp));
        assert_eq!(parse_harness("opencode_acp"), Ok(Harness::OpencodeAcp));
        assert_eq!(parse_harness("acp"), Ok(Harness::Acp));
    }

    #[test]
    fn show_says_which_harness_has_no_approval_step() {
        let pi = capability_lines(Harness::PiRpc).join("\n");
        assert!(
            pi.contains("approvals none: pi_rpc has no approval step"),
            "{pi}"
        );
        assert!(pi.contains("steer     yes"), "{pi}");
        let claude = capability_lines(Harness::ClaudeStreamJson).join("\n");
        assert!(claude.contains("approvals asks before"), "{claude}");
        assert!(claude.contains("steer     no"), "{claude}");
    }
}
