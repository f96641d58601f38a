//! The commands, one module per family: each holds its clap arguments and what it
//! does. [`serve`] (`up`, `node`, `node-key`) and [`doctor`] run without a broker; the
//! client commands ([`ClientCmd`]) find one ([`Client::discover`](crate::client::Client::discover)) and call its API.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::client::Client;

pub mod agent;
pub mod approval;
pub mod ask;
pub mod conversation;
pub mod doctor;
pub mod events;
pub mod flight;
pub mod mcp;
pub mod open;
pub mod replay;
pub mod serve;
pub mod status;
pub mod watch;

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

/// The commands that talk to a running broker.
#[derive(Subcommand)]
pub enum ClientCmd {
    /// Show the broker's state.
    Status(JsonFlag),
    /// Post a message to a conversation; each agent it @mentions answers in reply.
    Send(conversation::SendArgs),
    /// Print the last messages of a conversation.
    Read(conversation::ReadArgs),
    /// Print the event log: the last N events, or N events after --since SEQ.
    Events(events::EventsArgs),
    /// Register, list, show or remove agents.
    #[command(subcommand)]
    Agent(agent::AgentCmd),
    /// Create or list conversations.
    #[command(subcommand)]
    Conversation(conversation::ConversationCmd),
    /// List flights, newest last.
    Flights(flight::FlightsArgs),
    /// Ask an agent: prints the reply live as it streams; exits 0 when the flight
    /// completed, 1 when it failed or was cancelled.
    Ask(ask::AskArgs),
    /// Add instructions to the turn a flight is running.
    Steer(flight::SteerArgs),
    /// Interrupt the turn a flight is running (the flight ends cancelled; a tmux pane
    /// gets C-c).
    Interrupt(flight::InterruptArgs),
    /// Answer a flight you are running: it completes with TEXT as its output, posted as
    /// your reply. How a tmux agent answers the task pasted into its pane (the task names
    /// the flight); run from its pane, it acts as that agent.
    Reply(flight::ReplyArgs),
    /// Show what a tmux agent's pane shows now (its last lines as plain text) and how to
    /// look at it live.
    Peek(flight::PeekArgs),
    /// List approval requests (pending ones by default).
    Approvals(approval::ApprovalsArgs),
    /// Decide an approval request: accept, accept_for_session, decline or cancel.
    Approve(approval::ApproveArgs),
    /// Show one flight and its updates.
    Flight(flight::FlightArgs),
    /// Show a flight, an agent or a conversation as it is now, then follow it live:
    /// nothing missed, nothing twice. A flight's watch ends with the flight (exit 0 when
    /// it completed, 1 when it failed or was cancelled).
    Watch(watch::WatchArgs),
    /// Serve Relay's tools (ask, send, reply, read_conversation, list_agents,
    /// show_flight) as an MCP server on stdin/stdout, acting as --as (default: the agent
    /// of RELAY_AGENT with its RELAY_TOKEN). Relay wires it into its Codex and Claude Code
    /// agents itself; an MCP client starts it as `relay mcp`.
    #[command(
        after_help = "The broker comes from RELAY_URL + RELAY_TOKEN (an agent's session has both), \
or the data dir's api.json.\n\nExample (an MCP client's configuration):\n  \
{\"command\": \"relay\", \"args\": [\"mcp\"]}"
    )]
    Mcp(mcp::McpArgs),
    /// Replay a flight, an agent's session or a conversation from the log: a readable
    /// transcript, or one JSON document with --json.
    #[command(subcommand)]
    Replay(replay::ReplayCmd),
    /// Open the dashboard (agents, live flights, approvals to decide, replays): prints
    /// a one-time login link and, on a desktop, opens it in your browser.
    Open(open::OpenArgs),
}

/// Runs `cmd` on the broker `client` talks to.
pub async fn run(client: &Client, cmd: ClientCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        ClientCmd::Status(f) => status::run(client, f.json).await?,
        ClientCmd::Send(args) => conversation::send(client, args).await?,
        ClientCmd::Read(args) => conversation::read(client, args).await?,
        ClientCmd::Events(args) => events::run(client, args).await?,
        ClientCmd::Agent(cmd) => agent::run(client, cmd).await?,
        ClientCmd::Conversation(cmd) => conversation::run(client, cmd).await?,
        ClientCmd::Flights(args) => flight::list(client, args).await?,
        ClientCmd::Ask(args) => return ask::run(client, args).await,
        ClientCmd::Steer(args) => flight::steer(client, args).await?,
        ClientCmd::Interrupt(args) => flight::interrupt(client, args).await?,
        ClientCmd::Reply(args) => flight::reply(client, args).await?,
        ClientCmd::Peek(args) => flight::peek(client, args).await?,
        ClientCmd::Approvals(args) => approval::list(client, args).await?,
        ClientCmd::Approve(args) => approval::approve(client, args).await?,
        ClientCmd::Flight(args) => flight::show(client, args).await?,
        ClientCmd::Watch(args) => return watch::run(client, args).await,
        ClientCmd::Mcp(args) => mcp::run(client, args).await?,
        ClientCmd::Replay(cmd) => replay::run(client, cmd).await?,
        ClientCmd::Open(args) => open::run(client, args).await?,
    }
    Ok(ExitCode::SUCCESS)
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
