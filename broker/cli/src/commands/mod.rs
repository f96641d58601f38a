//! The commands ([`Cmd`]), one module per family: each holds its clap arguments and
//! what it does. [`serve`] (`up`, `node`, `node-key`), [`doctor`], `completions` and
//! `man` run without a broker; the client commands find one
//! ([`Client::discover`](relay_client::Client::discover)) and call its API. Each
//! returns how it ended as an [`Exit`].

use clap::{Args, Subcommand};
use relay_client::data_dir::DataDir;
use relay_client::Client;

use crate::exit::Exit;
use crate::help;

pub mod acp;
pub mod agent;
pub mod approval;
pub mod ask;
pub mod budget;
pub mod conversation;
pub mod doctor;
pub mod events;
pub mod flight;
pub mod mcp;
pub mod open;
pub mod replay;
pub mod rule;
pub mod serve;
pub mod status;
pub mod usage;
pub mod watch;
pub mod workspace;

#[derive(Args)]
pub struct JsonFlag {
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Who a client command acts as: a message's author, an ask's requester, an approval's
/// decider.
#[derive(Args)]
pub struct Actor {
    /// Who is speaking, asking or deciding. Default: the agent whose session this runs
    /// in (RELAY_AGENT, with its scoped token), else `operator`.
    #[arg(long = "as", value_name = "ACTOR", env = "RELAY_ACTOR")]
    name: Option<String>,
}

impl Actor {
    /// `--as`, else the session's agent, else `operator`.
    pub fn name(self) -> String {
        self.name
            .or_else(|| std::env::var("RELAY_AGENT").ok().filter(|a| !a.is_empty()))
            .unwrap_or_else(|| "operator".into())
    }
}

/// Every command. The help groups them ([`crate::help`]); the hidden ones are the
/// older spellings, kept so scripts go on working (`relay flights` is `relay flight
/// list`, `relay approve` is `relay approval decide`...).
#[derive(Subcommand)]
pub enum Cmd {
    // --- daily -----------------------------------------------------------------------
    /// Ask an agent; its reply streams here.
    ///
    /// The exit code says how the flight ended: 0 completed, 1 failed, 6 cancelled.
    #[command(after_help = help::ASK)]
    Ask(ask::AskArgs),
    /// Post a message; each agent it @mentions answers.
    ///
    /// Each agent the message @mentions is asked (a flight), and its answer is posted in
    /// reply to the message.
    #[command(after_help = help::SEND)]
    Send(conversation::SendArgs),
    /// Print the last messages of a conversation.
    #[command(after_help = help::READ)]
    Read(conversation::ReadArgs),
    /// Follow a flight, an agent, a conversation or the fleet live.
    ///
    /// Shows it as it is now, then follows it live: nothing missed, nothing twice, across
    /// a broker restart.
    #[command(after_help = help::WATCH)]
    Watch(watch::WatchArgs),
    /// Show what a flight changed, or an agent's branch against its base.
    ///
    /// For an agent with a worktree (`relay agent add --worktree`): a flight's commit
    /// (flt_...), or the agent's whole branch (its name). The patch, or --stat.
    Diff(workspace::DiffArgs),
    /// Undo a flight's changes with a revert commit on its agent's branch.
    Revert(workspace::RevertArgs),
    /// Flights: list, show, steer, interrupt, reply.
    ///
    /// A flight is one tracked run of an agent (each ask and each mention makes one).
    /// `relay flight ID` shows one.
    Flight(flight::FlightCmdArgs),
    /// Approvals an agent waits for: list, decide.
    ///
    /// An agent asks to run a command or change files; a person (or a rule) decides.
    #[command(subcommand)]
    Approval(approval::ApprovalCmd),
    /// Remembered decisions: list, show, remove.
    ///
    /// `relay approval decide ID accept --remember agent` makes one: it decides the next
    /// identical request itself (recorded as decided by `rule:<id>`).
    #[command(subcommand)]
    Rule(rule::RuleCmd),
    /// Replay a flight, an agent's session or a conversation.
    ///
    /// Read from the log: a readable transcript, or one JSON document with --json.
    #[command(subcommand)]
    Replay(replay::ReplayCmd),
    /// Open the dashboard in your browser.
    ///
    /// The dashboard shows agents, flights, approvals, rules, usage and conversations
    /// live, and works from there: ask an agent, steer or follow up a flight, decide and
    /// remember approvals, add, wake, fork or remove agents. This prints a one-time login
    /// link and, on a desktop, opens it in your browser.
    Open(open::OpenArgs),

    // --- agents and conversations ----------------------------------------------------
    /// Agents: add, attach, list, show, set, wake, remove, peek, fork.
    ///
    /// `attach` adopts a tmux pane of yours; `peek` shows what a tmux agent's pane shows.
    #[command(subcommand)]
    Agent(agent::AgentCmd),
    /// Conversations: add, list.
    #[command(subcommand)]
    Conversation(conversation::ConversationCmd),
    /// Answer a flight you are running (a tmux agent's answer).
    ///
    /// How a tmux agent answers the task pasted into its pane (the task names the
    /// flight): the flight completes with TEXT as its output.
    Reply(flight::ReplyArgs),
    /// Serve Relay's tools to an agent as an MCP server on stdio.
    ///
    /// The tools: ask, send, reply, read_conversation, list_agents, show_flight; acting
    /// as --as (default: the agent of RELAY_AGENT with its RELAY_TOKEN). Relay wires it
    /// into its Codex and Claude Code agents itself; an MCP client starts it as `relay
    /// mcp`.
    #[command(
        after_help = "The broker comes from RELAY_URL + RELAY_TOKEN (an agent's session has both), \
or the data dir's api.json.\n\nExample (an MCP client's configuration):\n  \
{\"command\": \"relay\", \"args\": [\"mcp\"]}"
    )]
    Mcp(mcp::McpArgs),
    /// Serve a Relay agent to an editor as an ACP agent on stdio (Zed, JetBrains...).
    ///
    /// An editor that speaks the Agent Client Protocol runs `relay acp AGENT` and talks
    /// to AGENT (any harness, local or on a node) through the broker: each ACP session
    /// is a Relay conversation, each prompt a flight streamed back, each approval a
    /// permission request the editor answers; acting as --as (default: the agent of
    /// RELAY_AGENT with its RELAY_TOKEN, else the operator).
    #[command(after_help = help::ACP)]
    Acp(acp::AcpArgs),

    // --- operations ------------------------------------------------------------------
    #[command(flatten)]
    Serve(serve::ServeCmd),
    /// Show the broker's state.
    #[command(after_help = "Examples:\n  relay status\n  relay status --json")]
    Status(JsonFlag),
    /// Tokens and cost of flights, by agent, conversation, tree, day or node.
    ///
    /// Each row adds up its flights' last reported usage; COST is `?` where no cost is
    /// known (no cost from the harness and no price for its model: `relay up --prices`).
    Usage(usage::UsageArgs),
    /// Print the event log, or follow it.
    ///
    /// The last N events, or N events after --since SEQ; --follow goes on live (across a
    /// broker restart).
    #[command(after_help = help::EVENTS)]
    Events(events::EventsArgs),
    /// Check a stopped broker's data directory.
    ///
    /// Rebuilds every projection from the event log and compares it with the stored one,
    /// and checks the log has no gap in its sequence. Exits 0 when consistent, 1 when
    /// not. It writes no record (opening the database lets sled recover it, as `relay up`
    /// would).
    #[command(
        after_help = "Run it with the broker stopped (`relay up` holds the database lock). It also lists the \
worktrees Relay made (`relay agent add --worktree`) that no agent owns; --fix removes them.\n\nExamples:\n  relay doctor\n  relay doctor --fix\n  relay doctor --data-dir /srv/relay --json"
    )]
    Doctor(doctor::DoctorArgs),
    /// Print a shell's completion script (bash, zsh, fish...).
    #[command(after_help = help::COMPLETIONS)]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print relay's man page, or write one per command.
    #[command(
        after_help = "Examples:\n  relay man | man -l -\n  relay man --out ~/.local/share/man/man1"
    )]
    Man {
        /// Write relay.1 and a page per command (relay-ask.1, relay-agent-add.1...) here.
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
    },

    // --- the older spellings, hidden -------------------------------------------------
    /// `relay flight list`.
    #[command(hide = true)]
    Flights(flight::FlightsArgs),
    /// `relay flight steer`.
    #[command(hide = true)]
    Steer(flight::SteerArgs),
    /// `relay flight interrupt`.
    #[command(hide = true)]
    Interrupt(flight::InterruptArgs),
    /// `relay agent peek`.
    #[command(hide = true)]
    Peek(flight::PeekArgs),
    /// `relay approval list`.
    #[command(hide = true)]
    Approvals(approval::ApprovalsArgs),
    /// `relay approval decide`.
    #[command(hide = true)]
    Approve(approval::ApproveArgs),
}

/// Runs `cmd`: the processes and `doctor` on the data dir, the rest as a client of the
/// broker found there (or at `url` with `token`).
pub async fn run(
    data_dir: DataDir,
    url: Option<String>,
    token: Option<String>,
    cmd: Cmd,
) -> anyhow::Result<Exit> {
    let discover_acp: acp::Discover = {
        let (data_dir, url, token) = (data_dir.clone(), url.clone(), token.clone());
        std::sync::Arc::new(move || Client::discover(data_dir.clone(), url.clone(), token.clone()))
    };
    let client = |data_dir| Client::discover(data_dir, url, token);
    let done = Ok(Exit::Ok);
    match cmd {
        Cmd::Serve(cmd) => serve::run(data_dir, cmd).await,
        Cmd::Doctor(args) => doctor::run(data_dir, args).await,
        Cmd::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut crate::command(), "relay", &mut out);
            crate::terminal::write_stdout(&String::from_utf8_lossy(&out));
            done
        }
        Cmd::Man { out } => help::man(out),
        Cmd::Ask(args) => ask::run(&client(data_dir)?, args).await,
        Cmd::Watch(args) => watch::run(&client(data_dir)?, args).await,
        Cmd::Diff(args) => workspace::diff(&client(data_dir)?, args).await.and(done),
        Cmd::Revert(args) => workspace::revert(&client(data_dir)?, args).await.and(done),
        Cmd::Flight(args) => flight::run(&client(data_dir)?, args).await,
        Cmd::Status(f) => status::run(&client(data_dir)?, f.json).await.and(done),
        Cmd::Send(args) => conversation::send(&client(data_dir)?, args).await.and(done),
        Cmd::Read(args) => conversation::read(&client(data_dir)?, args).await.and(done),
        Cmd::Events(args) => events::run(&client(data_dir)?, args).await.and(done),
        Cmd::Agent(cmd) => agent::run(&client(data_dir)?, cmd).await.and(done),
        Cmd::Conversation(cmd) => conversation::run(&client(data_dir)?, cmd).await.and(done),
        Cmd::Approval(cmd) => approval::run(&client(data_dir)?, cmd).await.and(done),
        Cmd::Rule(cmd) => rule::run(&client(data_dir)?, cmd).await.and(done),
        Cmd::Usage(args) => usage::run(&client(data_dir)?, args).await.and(done),
        Cmd::Reply(args) => flight::reply(&client(data_dir)?, args).await.and(done),
        Cmd::Mcp(args) => mcp::run(&client(data_dir)?, args).await.and(done),
        // Served even without a broker: the editor is answered why, not left with a
        // process that died.
        Cmd::Acp(args) => acp::run(discover_acp, args).await.and(done),
        Cmd::Replay(cmd) => replay::run(&client(data_dir)?, cmd).await.and(done),
        Cmd::Open(args) => open::run(&client(data_dir)?, args).await.and(done),
        Cmd::Flights(args) => flight::list(&client(data_dir)?, args).await.and(done),
        Cmd::Steer(args) => flight::steer(&client(data_dir)?, args).await.and(done),
        Cmd::Interrupt(args) => flight::interrupt(&client(data_dir)?, args).await.and(done),
        Cmd::Peek(args) => flight::peek(&client(data_dir)?, args).await.and(done),
        Cmd::Approvals(args) => approval::list(&client(data_dir)?, args).await.and(done),
        Cmd::Approve(args) => approval::approve(&client(data_dir)?, args).await.and(done),
    }
}

/// The words of a text argument joined by spaces; `-`, or no words with stdin not a
/// terminal, reads the text from stdin (long or multi-line text, beyond argv's limits).
fn text_arg(words: Vec<String>) -> anyhow::Result<String> {
    use anyhow::Context;
    use std::io::{IsTerminal, Read};
    let from_stdin = match words.as_slice() {
        [dash] if dash == "-" => true,
        [] => {
            if std::io::stdin().is_terminal() {
                anyhow::bail!("no text given: pass it as arguments, or `-` to read it from stdin");
            }
            true
        }
        _ => false,
    };
    if !from_stdin {
        return Ok(words.join(" "));
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read the text from stdin")?;
    let text = text.trim_end_matches(['\n', '\r']).to_string();
    if text.is_empty() {
        anyhow::bail!("the text read from stdin is empty");
    }
    Ok(text)
}
