//! `relay`: the broker (`relay up`) and its command-line client.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use relay_cli::client::{default_data_dir, Client};
use relay_protocol::api::{MessagePosted, Status};
use relay_protocol::domain::{
    Agent, AgentSpec, Approval, ApprovalDecision, ApprovalPolicy, Conversation, ConversationKind,
    ConversationSpec, Flight, FlightChange, FlightState, FlightUpdate, Harness, InvokeRequest,
    Message, MessageClass, PostMessage, WakePolicy, DEFAULT_CONVERSATION,
};
use relay_protocol::event::Event;
use serde::Serialize;

/// `println!` for text that may hold agent or model output: made inert first.
macro_rules! outln {
    () => { println!() };
    ($($t:tt)*) => { println!("{}", relay_cli::terminal::inert(&format!($($t)*))) };
}
/// `print!`, inert (see [`outln`]).
macro_rules! out {
    ($($t:tt)*) => { print!("{}", relay_cli::terminal::inert(&format!($($t)*))) };
}
/// `eprintln!`, inert (see [`outln`]).
macro_rules! errln {
    ($($t:tt)*) => { eprintln!("{}", relay_cli::terminal::inert(&format!($($t)*))) };
}

#[derive(Parser)]
#[command(
    name = "relay",
    version,
    about = "Relay: a message broker for coding agents",
    long_about = "Relay is the source of truth for conversations, messages, invocations and \
flights between people and coding agents (Codex, Claude Code, Pi, tmux panes).\n\n\
Start a broker with `relay up`. Client commands find it through RELAY_DATA_DIR (reading \
<data-dir>/api.json), or RELAY_URL + RELAY_TOKEN.",
    after_help = "Examples:\n  relay up --data-dir ./.relay\n  relay send \"hello @codex-1\"\n  relay read -n 20\n  relay agent add codex-1 --harness codex_app_server --cwd .\n  relay flights --json"
)]
struct Cli {
    /// Data directory of the broker (else RELAY_DATA_DIR, else ~/.local/share/relay).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the broker with its embedded runtime until SIGINT/SIGTERM.
    Up(UpArgs),
    /// Run only the harness-session plane for the agents registered on one node
    /// (`relay agent add ... --node NAME`), connected to the broker through NATS.
    Node(NodeArgs),
    /// Write a node's key, derived from this broker's bus key (made if missing): copy it
    /// to the node's host and pass it to `relay node --key-file`. Run it where the
    /// broker's data dir is.
    NodeKey {
        /// The node's name.
        name: String,
        /// Write the key to this file (mode 0600) instead of standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Show the broker's state.
    Status(JsonFlag),
    /// Post a message to a conversation.
    Send {
        /// Conversation id.
        #[arg(long, default_value = DEFAULT_CONVERSATION)]
        to: String,
        /// Who is speaking (else RELAY_ACTOR, else "operator").
        #[arg(long = "as", value_name = "ACTOR")]
        actor: Option<String>,
        /// Message text; `@name` mentions an agent. `-` (or nothing, with a pipe on
        /// stdin) reads it from stdin.
        text: Vec<String>,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the last messages of a conversation.
    Read {
        /// Conversation id.
        #[arg(default_value = DEFAULT_CONVERSATION)]
        conversation: String,
        /// How many messages.
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the event log: the last N events, or N events after --since SEQ.
    Events {
        /// Only events after this global sequence number (0: from the start of the log).
        /// Without it, the last N events.
        #[arg(long, value_name = "SEQ")]
        since: Option<u64>,
        /// At most this many events (before following, with --follow).
        #[arg(short = 'n', default_value_t = 50)]
        n: usize,
        /// Keep following new events.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Register, list, show or remove agents.
    #[command(subcommand)]
    Agent(AgentCmd),
    /// Create or list conversations.
    #[command(subcommand)]
    Conversation(ConversationCmd),
    /// List flights, newest last.
    Flights {
        /// Only this agent's flights.
        #[arg(long, value_name = "AGENT")]
        agent: Option<String>,
        /// Only flights in this state: queued, waking, running, waiting, completed,
        /// failed or cancelled.
        #[arg(long)]
        state: Option<FlightState>,
        /// Only flights that have not ended.
        #[arg(long)]
        live: bool,
        /// At most this many (the newest).
        #[arg(short = 'n', default_value_t = 50)]
        n: usize,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Ask an agent: prints the reply live as it streams; exits 0 when the flight
    /// completed, 1 when it failed or was cancelled.
    Ask {
        /// The agent's name.
        agent: String,
        /// The task. `-` (or nothing, with a pipe on stdin) reads it from stdin.
        text: Vec<String>,
        /// Who is asking (else RELAY_ACTOR, else "operator").
        #[arg(long = "as", value_name = "ACTOR")]
        actor: Option<String>,
        /// Conversation to post in (default: a direct one with the agent).
        #[arg(long)]
        conversation: Option<String>,
        /// The flight this ask is made from (agent-to-agent; else RELAY_FLIGHT).
        #[arg(long)]
        parent_flight: Option<String>,
        /// Fail the flight after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
        /// Print the flight id and return at once.
        #[arg(long)]
        no_wait: bool,
        /// Print only the final flight record as JSON.
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Add instructions to the turn a flight is running.
    Steer {
        /// The flight's id.
        flight: String,
        /// What to add to the turn.
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
    },
    /// Interrupt the turn a flight is running (the flight ends cancelled).
    Interrupt {
        /// The flight's id.
        flight: String,
    },
    /// List approval requests (pending ones by default).
    Approvals {
        /// pending, decided, expired or all.
        #[arg(long, default_value = "pending")]
        state: String,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Decide an approval request: accept, accept_for_session, decline or cancel.
    Approve {
        /// The approval's id (from `relay approvals`).
        id: String,
        /// accept, accept_for_session, decline or cancel.
        decision: ApprovalDecision,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show one flight and its updates.
    Flight {
        /// The flight's id.
        id: String,
        /// Also print every update.
        #[arg(long)]
        updates: bool,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check a STOPPED broker's data directory: rebuild every projection from the event
    /// log and compare it with the stored one, and check the log has no gap in its
    /// sequence. Exits 0 when consistent, 1 when not. It writes no record (opening the
    /// database lets sled recover it, as `relay up` would).
    #[command(
        after_help = "Run it with the broker stopped (`relay up` holds the database lock).\n\nExamples:\n  relay doctor --data-dir ./.relay\n  relay doctor --json"
    )]
    Doctor(JsonFlag),
}

#[derive(Args)]
struct JsonFlag {
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct UpArgs {
    /// Address of the local HTTP API; loopback only. Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:7450", env = "RELAY_LISTEN")]
    listen: SocketAddr,
    /// Largest message body or task accepted, in bytes (413 above it).
    #[arg(long, default_value_t = 256 * 1024, env = "RELAY_MAX_MESSAGE_BYTES")]
    max_message_bytes: usize,
    /// Deepest agent-to-agent invocation chain.
    #[arg(long, default_value_t = 4)]
    max_depth: u32,
    /// Commands that may wait to be committed; past that, clients are answered
    /// `overloaded` at once (HTTP 429, a NATS error reply) instead of waiting.
    #[arg(long, default_value_t = relay_broker::broker::COMMAND_QUEUE_CAPACITY, env = "RELAY_COMMAND_QUEUE", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    command_queue: usize,
    /// Milliseconds a connection has to send its request head (request line and
    /// headers) before it is closed. Hidden: tests shorten it.
    #[arg(long, hide = true, env = "RELAY_HEADER_TIMEOUT_MS", default_value_t = relay_broker::http::DEFAULT_HEADER_READ_TIMEOUT.as_millis() as u64, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=86_400_000))]
    header_timeout_ms: u64,
    /// Connections the API serves at once; more are answered `overloaded` and closed.
    /// Hidden: tests lower it.
    #[arg(long, hide = true, env = "RELAY_MAX_CONNECTIONS", default_value_t = relay_broker::http::DEFAULT_MAX_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    max_connections: usize,
    #[command(flatten)]
    nats: NatsArgs,
    #[command(flatten)]
    bus: BusArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

/// The harness-session plane's settings, shared by `relay up` and `relay node`.
#[derive(Args)]
struct RuntimeArgs {
    /// A running turn whose harness sends nothing for this many seconds is interrupted
    /// and failed (a model that stopped answering); 0: never. Waiting for an approval
    /// does not count.
    #[arg(
        long,
        env = "RELAY_TURN_IDLE_TIMEOUT",
        default_value_t = relay_runtime::DEFAULT_TURN_IDLE_TIMEOUT.as_secs(),
        value_name = "SECONDS"
    )]
    turn_idle_timeout: u64,
    /// Memory each sled database may use as cache, in MiB: bounds the process's
    /// memory whatever the history's size (reads past it go to disk).
    #[arg(
        long,
        env = "RELAY_CACHE_MB",
        default_value_t = relay_runtime::storage::DEFAULT_CACHE_CAPACITY >> 20,
        value_name = "MIB",
        value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=1 << 20)
    )]
    cache_mb: u64,
}

impl RuntimeArgs {
    /// Applies the settings that are process-wide (the sled cache), before any
    /// database opens.
    fn apply(&self) {
        relay_runtime::storage::set_cache_capacity(self.cache_mb << 20);
    }

    fn turn_idle_timeout(&self) -> Option<std::time::Duration> {
        (self.turn_idle_timeout > 0).then(|| std::time::Duration::from_secs(self.turn_idle_timeout))
    }
}

/// Connection to NATS (JetStream enabled), shared by `relay up` and `relay node`.
#[derive(Args)]
struct NatsArgs {
    /// NATS server URL; enables the bus (invocations and flight updates on subjects).
    #[arg(long, env = "RELAY_NATS_URL", value_name = "URL")]
    nats: Option<String>,
    /// NATS credentials file (.creds).
    #[arg(long, env = "RELAY_NATS_CREDS", value_name = "FILE", conflicts_with_all = ["nats_user", "nats_token_file"])]
    nats_creds: Option<PathBuf>,
    /// NATS user; its password comes from RELAY_NATS_PASSWORD or --nats-password-file.
    #[arg(long, env = "RELAY_NATS_USER", conflicts_with = "nats_token_file")]
    nats_user: Option<String>,
    /// File holding the NATS password (or set RELAY_NATS_PASSWORD). Secrets are never
    /// taken on the command line: `ps` shows it to every user.
    #[arg(long, env = "RELAY_NATS_PASSWORD_FILE", value_name = "FILE")]
    nats_password_file: Option<PathBuf>,
    /// File holding the NATS authentication token (or set RELAY_NATS_TOKEN).
    #[arg(long, env = "RELAY_NATS_TOKEN_FILE", value_name = "FILE")]
    nats_token_file: Option<PathBuf>,
    /// Refused: see --nats-password-file.
    #[arg(long, hide = true, value_name = "SECRET")]
    nats_password: Option<String>,
    /// Refused: see --nats-token-file.
    #[arg(long, hide = true, value_name = "SECRET")]
    nats_token: Option<String>,
}

/// A secret from the environment variable `var` or from a file (trailing newline
/// dropped); secrets given on the command line are refused, since `ps` shows them.
fn secret(
    var: &str,
    file: Option<&PathBuf>,
    on_command_line: Option<&String>,
    flag: &str,
) -> anyhow::Result<Option<String>> {
    if on_command_line.is_some() {
        anyhow::bail!(
            "--{flag} is not taken on the command line (every user can read it with ps): set {var}, or put it in a file and pass --{flag}-file"
        );
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read --{flag}-file {}: {e}", path.display()))?;
        return Ok(Some(text.trim_end_matches(['\n', '\r']).to_string()));
    }
    Ok(std::env::var(var).ok().filter(|v| !v.is_empty()))
}

/// The broker's side of the bus: what `relay up` serves on NATS.
#[derive(Args)]
struct BusArgs {
    /// How long the flight-update stream (RELAY_FLIGHTS) keeps updates, in seconds; 0
    /// keeps them until --nats-stream-max-bytes pushes them out.
    #[arg(
        long,
        env = "RELAY_NATS_STREAM_MAX_AGE",
        default_value_t = 7 * 24 * 3600,
        value_name = "SECONDS"
    )]
    nats_stream_max_age: u64,
    /// Most bytes the flight-update stream keeps (oldest updates go first); -1: no limit.
    #[arg(
        long,
        env = "RELAY_NATS_STREAM_MAX_BYTES",
        default_value_t = 1 << 30,
        value_name = "BYTES",
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i64).range(-1..)
    )]
    nats_stream_max_bytes: i64,
    /// A file holding a shared secret that every request on relay.v1.invoke.* and
    /// relay.v1.cmd.* must carry in its `Relay-Token` header (else it is answered
    /// `unauthorized`); or set RELAY_NATS_REQUEST_TOKEN. Without it, NATS's own
    /// permissions decide who may publish there.
    #[arg(long, env = "RELAY_NATS_REQUEST_TOKEN_FILE", value_name = "FILE")]
    nats_request_token_file: Option<PathBuf>,
    /// Refused: see --nats-request-token-file.
    #[arg(long, hide = true, value_name = "SECRET")]
    nats_request_token: Option<String>,
}

impl NatsArgs {
    fn config(
        &self,
        bus: Option<&BusArgs>,
    ) -> anyhow::Result<Option<relay_broker::nats::NatsConfig>> {
        use relay_broker::nats::NatsAuth;
        let password = secret(
            "RELAY_NATS_PASSWORD",
            self.nats_password_file.as_ref(),
            self.nats_password.as_ref(),
            "nats-password",
        )?;
        let token = secret(
            "RELAY_NATS_TOKEN",
            self.nats_token_file.as_ref(),
            self.nats_token.as_ref(),
            "nats-token",
        )?;
        let request_token = match bus {
            Some(bus) => secret(
                "RELAY_NATS_REQUEST_TOKEN",
                bus.nats_request_token_file.as_ref(),
                bus.nats_request_token.as_ref(),
                "nats-request-token",
            )?,
            None => None,
        };
        let Some(url) = self.nats.clone() else {
            return Ok(None);
        };
        let auth = if let Some(c) = &self.nats_creds {
            NatsAuth::Creds(c.clone())
        } else if let Some(u) = &self.nats_user {
            let Some(p) = password else {
                anyhow::bail!(
                    "--nats-user needs a password: set RELAY_NATS_PASSWORD or pass --nats-password-file"
                );
            };
            NatsAuth::UserPassword(u.clone(), p)
        } else if let Some(t) = token {
            NatsAuth::Token(t)
        } else {
            NatsAuth::None
        };
        let mut config = relay_broker::nats::NatsConfig::new(url, auth);
        if let Some(bus) = bus {
            config.stream_max_age = std::time::Duration::from_secs(bus.nats_stream_max_age);
            config.stream_max_bytes = bus.nats_stream_max_bytes;
            config.request_token = request_token;
        }
        Ok(Some(config))
    }
}

#[derive(Args)]
struct NodeArgs {
    /// This node's name, as agents name it with `--node`.
    #[arg(long)]
    name: String,
    /// This node's key, written by `relay node-key NAME --out FILE` on the broker's host
    /// (default: <data-dir>/node.key). The node opens only messages sealed with it.
    #[arg(long, env = "RELAY_NODE_KEY_FILE", value_name = "FILE")]
    key_file: Option<PathBuf>,
    #[command(flatten)]
    nats: NatsArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

// Parsed once per run: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum AgentCmd {
    /// Register an agent.
    Add {
        /// The agent's name: letters, digits, `-` and `_` (it appears in NATS subjects).
        name: String,
        /// codex_app_server, claude_stream_json, pi_rpc or tmux.
        #[arg(long)]
        harness: Harness,
        /// Working directory of the agent.
        #[arg(long)]
        cwd: PathBuf,
        /// Program to run instead of the harness's default binary.
        #[arg(long)]
        command: Option<String>,
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
        #[arg(long, default_value = "on_demand")]
        wake: WakePolicy,
        /// Accept approval requests for exactly this command (repeatable). A rule is
        /// shell-quoted words: the program, then literal arguments; `*` stands for one
        /// plain argument (no leading `-`, `+` or `@`, no `=`), `**` (last) for any number
        /// of them. `cargo
        /// test` accepts `cargo test` and nothing longer; `cargo test *` also accepts
        /// `cargo test parser`, never `cargo test --config ...`. A command is matched as
        /// it will run: a shell's `-c` script only when it is a plain list of words.
        #[arg(long = "auto-accept", value_name = "RULE")]
        auto_accept: Vec<String>,
        /// Decline approval requests for commands that start with this rule's words
        /// (repeatable; same syntax as --auto-accept).
        #[arg(long = "auto-decline", value_name = "RULE")]
        auto_decline: Vec<String>,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List agents.
    List(JsonFlag),
    /// Show one agent (with its harness `thread_id`).
    Show {
        /// The agent's name.
        name: String,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Start an agent's session now instead of at its first turn (an agent with wake
    /// policy `manual` runs no turn until this).
    Wake {
        /// The agent's name.
        name: String,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove an agent.
    Remove {
        /// The agent's name.
        name: String,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConversationCmd {
    /// Create a conversation.
    Add {
        /// The conversation's id: dot-separated words (like `team.backend`).
        id: String,
        /// channel, direct, group, thread or system.
        #[arg(long, default_value = "channel")]
        kind: ConversationKind,
        /// A human title.
        #[arg(long)]
        title: Option<String>,
        /// A participant (repeatable).
        #[arg(long = "participant")]
        participants: Vec<String>,
        /// The conversation this one branches from (threads).
        #[arg(long)]
        parent: Option<String>,
        /// Print JSON (machine-readable) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List conversations.
    List(JsonFlag),
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected K=V, got {s:?}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("relay: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Cmd::Up(args) => up(cli.data_dir, args).await,
            Cmd::Node(args) => node(cli.data_dir, args).await,
            Cmd::NodeKey { name, out } => node_key(cli.data_dir, name, out).await,
            Cmd::Doctor(f) => doctor(cli.data_dir, f.json).await,
            other => client_command(cli.data_dir, other).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            errln!("relay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn node(data_dir: Option<PathBuf>, args: NodeArgs) -> anyhow::Result<ExitCode> {
    init_logs();
    args.runtime.apply();
    let Some(nats) = args.nats.config(None)? else {
        anyhow::bail!("relay node needs --nats URL: it reaches the broker only through NATS");
    };
    // Its own directory by default, so it never shares the broker's sled files.
    let data_dir = match data_dir.or_else(|| std::env::var_os("RELAY_DATA_DIR").map(PathBuf::from))
    {
        Some(d) => d,
        None => default_data_dir(None).join("nodes").join(&args.name),
    };
    let key_file = args.key_file.unwrap_or_else(|| data_dir.join("node.key"));
    let key = relay_broker::node::read_key(&key_file, &args.name).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    relay_broker::shutdown::on_signals(shutdown.clone());
    relay_broker::node::run(
        relay_broker::node::NodeConfig {
            name: args.name,
            data_dir,
            nats,
            key,
            turn_idle_timeout: args.runtime.turn_idle_timeout(),
        },
        shutdown,
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// `relay node-key NAME`: the node's key, from the broker's bus key.
async fn node_key(
    data_dir: Option<PathBuf>,
    name: String,
    out: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let dir = default_data_dir(data_dir);
    let wrote = relay_runtime::storage::read(move || -> anyhow::Result<Option<PathBuf>> {
        let key = relay_broker::server::node_key(&dir, &name)?;
        let text = relay_broker::files::key_text(key.bytes());
        match out {
            Some(path) => {
                relay_broker::files::write_private(&path, text.as_bytes())?;
                Ok(Some(path))
            }
            None => {
                out!("{text}");
                Ok(None)
            }
        }
    })
    .await??;
    if let Some(path) = wrote {
        errln!("relay: wrote the node key to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `relay doctor`: the rebuild-and-compare check of a stopped data dir.
async fn doctor(data_dir: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    let dir = default_data_dir(data_dir);
    let db = dir.join("db");
    if !db.exists() {
        anyhow::bail!(
            "{} holds no relay database (no {})",
            dir.display(),
            db.display()
        );
    }
    let report = relay_runtime::storage::read(move || {
        let store = relay_broker::Store::open(&db)?;
        store.doctor()
    })
    .await??;
    if json {
        print_json(&report)?;
    } else {
        outln!("data dir: {}", dir.display());
        outln!(
            "events: {} (last seq {}); flights: {} ({} not ended: `relay up` resumes or fails them)",
            report.events, report.last_seq, report.flights, report.live_flights
        );
        if report.gaps.is_empty() {
            outln!("event log: no gaps");
        } else {
            for (expected, found) in &report.gaps {
                outln!("event log: GAP, expected seq {expected}, found {found}");
            }
        }
        if report.mismatched_trees.is_empty() {
            outln!("projections: all equal a rebuild from the log");
        } else {
            outln!(
                "projections: DIFFER from a rebuild from the log: {}",
                report.mismatched_trees.join(", ")
            );
        }
        outln!(
            "{}",
            if report.consistent {
                "consistent"
            } else {
                "NOT consistent"
            }
        );
    }
    Ok(if report.consistent {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn up(data_dir: Option<PathBuf>, args: UpArgs) -> anyhow::Result<ExitCode> {
    init_logs();
    args.runtime.apply();
    let shutdown = tokio_util::sync::CancellationToken::new();
    relay_broker::shutdown::on_signals(shutdown.clone());
    let config = relay_broker::server::ServerConfig {
        data_dir: default_data_dir(data_dir),
        listen: args.listen,
        broker: relay_broker::BrokerConfig {
            max_message_bytes: args.max_message_bytes,
            max_depth: args.max_depth,
            command_queue: args.command_queue,
        },
        nats: args.nats.config(Some(&args.bus))?,
        turn_idle_timeout: args.runtime.turn_idle_timeout(),
        http: relay_broker::http::HttpLimits {
            header_read_timeout: std::time::Duration::from_millis(args.header_timeout_ms),
            max_connections: args.max_connections,
        },
    };
    relay_broker::server::run(config, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn enc(s: &str) -> String {
    // Path segments: ids and names are restricted, but be safe with anything else.
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn actor(explicit: Option<String>) -> String {
    explicit
        .or_else(|| std::env::var("RELAY_ACTOR").ok())
        .unwrap_or_else(|| "operator".into())
}

/// The serde (wire) name of an enum value: `accept`, `idle`...
fn wire_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

fn describe_nats(nats: &relay_protocol::api::NatsStatus) -> String {
    use relay_protocol::api::NatsStatus;
    match nats {
        NatsStatus::Disabled => "disabled (start with --nats URL)".into(),
        NatsStatus::Connected { url } => format!("connected to {url}"),
        NatsStatus::Disconnected {
            url,
            since_ms,
            error,
        } => {
            let secs = relay_broker::broker::now_ms().saturating_sub(*since_ms) / 1000;
            let mut line = format!("disconnected from {url} for {secs} s");
            if let Some(e) = error {
                line.push_str(&format!(" (last error: {e})"));
            }
            line
        }
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

async fn client_command(data_dir: Option<PathBuf>, cmd: Cmd) -> anyhow::Result<ExitCode> {
    let client = Client::discover(data_dir)?;
    match cmd {
        Cmd::Up(_) | Cmd::Node(_) | Cmd::NodeKey { .. } | Cmd::Doctor(_) => unreachable_up(),
        Cmd::Status(f) => {
            let s: Status = client.get("/v1/status").await?;
            if f.json {
                print_json(&s)?;
            } else {
                outln!("relay {} at {}", s.version, client.url());
                outln!("data dir   {}", s.data_dir);
                outln!("events     {}", s.last_seq);
                outln!("agents     {}", s.agents);
                outln!("flights    {} ({} live)", s.flights, s.live_flights);
                outln!("nats       {}", describe_nats(&s.nats));
                outln!("uptime     {} s", s.uptime_ms / 1000);
            }
        }
        Cmd::Send {
            to,
            actor: who,
            text,
            json,
        } => {
            let posted: MessagePosted = client
                .post(
                    "/v1/messages",
                    &PostMessage {
                        conversation: to,
                        author: actor(who),
                        body: text_arg(text)?,
                        class: MessageClass::Agent,
                        reply_to: None,
                        meta: Default::default(),
                    },
                )
                .await?;
            if json {
                print_json(&posted.message)?;
            } else {
                outln!("{}", posted.message.id);
            }
        }
        Cmd::Read {
            conversation,
            n,
            json,
        } => {
            let msgs: Vec<Message> = client
                .get(&format!(
                    "/v1/conversations/{}/messages?limit={n}",
                    enc(&conversation)
                ))
                .await?;
            if json {
                print_json(&msgs)?;
            } else {
                for m in msgs {
                    let reply = m
                        .reply_to
                        .as_deref()
                        .map(|r| format!(" (reply to {r})"))
                        .unwrap_or_default();
                    outln!("[{}] {}{}: {}", m.index, m.author, reply, m.body);
                }
            }
        }
        Cmd::Events {
            since,
            n,
            follow,
            json,
        } => {
            let print = |e: &Event| -> anyhow::Result<()> {
                if json {
                    outln!("{}", serde_json::to_string(e)?);
                } else {
                    outln!("{:>8} {} {}", e.seq, e.body.type_name(), describe_event(e));
                }
                Ok(())
            };
            let since = match since {
                Some(seq) => seq,
                None => {
                    let s: Status = client.get("/v1/status").await?;
                    s.last_seq.saturating_sub(n as u64)
                }
            };
            if follow {
                let mut failed = None;
                client
                    .sse(&format!("/v1/events/stream?after={since}"), |_, data| {
                        match serde_json::from_str::<Event>(data) {
                            Ok(e) => print(&e).is_ok(),
                            Err(e) => {
                                failed = Some(e);
                                false
                            }
                        }
                    })
                    .await?;
                if let Some(e) = failed {
                    anyhow::bail!("bad event from the broker: {e}");
                }
            } else {
                let events: Vec<Event> = client
                    .get(&format!("/v1/events?after={since}&limit={n}"))
                    .await?;
                if json {
                    print_json(&events)?;
                } else {
                    for e in &events {
                        print(e)?;
                    }
                }
                if let Some(last) = events.last().filter(|_| events.len() == n) {
                    let s: Status = client.get("/v1/status").await?;
                    if s.last_seq > last.seq {
                        errln!(
                            "relay: {} more events; next page: relay events --since {} -n {n}",
                            s.last_seq - last.seq,
                            last.seq
                        );
                    }
                }
            }
        }
        Cmd::Agent(cmd) => agent_command(&client, cmd).await?,
        Cmd::Conversation(cmd) => match cmd {
            ConversationCmd::Add {
                id,
                kind,
                title,
                participants,
                parent,
                json,
            } => {
                let c: Conversation = client
                    .post(
                        "/v1/conversations",
                        &ConversationSpec {
                            id,
                            kind,
                            title,
                            participants,
                            parent,
                        },
                    )
                    .await?;
                if json {
                    print_json(&c)?;
                } else {
                    outln!("{}", c.spec.id);
                }
            }
            ConversationCmd::List(f) => {
                let list: Vec<Conversation> = client.get("/v1/conversations").await?;
                if f.json {
                    print_json(&list)?;
                } else {
                    for c in list {
                        outln!(
                            "{:<32} {:<8} {:>6} messages",
                            c.spec.id,
                            serde_json::to_value(c.spec.kind)?.as_str().unwrap_or("?"),
                            c.message_count
                        );
                    }
                }
            }
        },
        Cmd::Flights {
            agent,
            state,
            live,
            n,
            json,
        } => {
            let mut q = format!("/v1/flights?limit={n}&live={live}");
            if let Some(a) = agent {
                q.push_str(&format!("&agent={}", enc(&a)));
            }
            if let Some(s) = state {
                q.push_str(&format!("&state={s}"));
            }
            let flights: Vec<Flight> = client.get(&q).await?;
            if json {
                print_json(&flights)?;
            } else {
                for f in flights {
                    outln!(
                        "{}  {:<10} {:<16} {}",
                        f.id,
                        f.state,
                        f.agent,
                        relay_cli::terminal::one_line(f.summary.as_deref().unwrap_or(""))
                    );
                }
            }
        }
        Cmd::Ask {
            agent,
            text,
            actor: who,
            conversation,
            parent_flight,
            timeout,
            no_wait,
            json,
        } => {
            return ask(
                &client,
                InvokeRequest {
                    target: agent,
                    task: text_arg(text)?,
                    requester: actor(who),
                    action: Default::default(),
                    conversation,
                    parent_flight: parent_flight.or_else(|| std::env::var("RELAY_FLIGHT").ok()),
                    timeout_ms: timeout.map(|s| s * 1000),
                },
                no_wait,
                json,
            )
            .await;
        }
        Cmd::Steer { flight, text } => {
            let f: Flight = client
                .post(
                    &format!("/v1/flights/{}/steer", enc(&flight)),
                    &serde_json::json!({ "text": text.join(" ") }),
                )
                .await?;
            outln!("steered {}", f.id);
        }
        Cmd::Interrupt { flight } => {
            let f: Flight = client
                .post(
                    &format!("/v1/flights/{}/interrupt", enc(&flight)),
                    &serde_json::json!({}),
                )
                .await?;
            outln!("interrupting {}", f.id);
        }
        Cmd::Approvals { state, json } => {
            let list: Vec<Approval> = client
                .get(&format!("/v1/approvals?state={}", enc(&state)))
                .await?;
            if json {
                print_json(&list)?;
            } else if list.is_empty() {
                errln!("no {state} approvals");
            } else {
                for a in list {
                    outln!(
                        "{}  {:<12} {:<10} {}  {}",
                        a.id,
                        a.agent,
                        serde_json::to_value(a.request.kind)?
                            .as_str()
                            .unwrap_or("?"),
                        relay_cli::terminal::one_line(&a.request.detail),
                        a.decided_by
                            .map(|d| format!("(decided by {})", relay_cli::terminal::one_line(&d)))
                            .unwrap_or_default()
                    );
                }
            }
        }
        Cmd::Approve { id, decision, json } => {
            let a: Approval = client
                .post(
                    &format!("/v1/approvals/{}", enc(&id)),
                    &serde_json::json!({ "decision": decision, "decided_by": actor(None) }),
                )
                .await?;
            if json {
                print_json(&a)?;
            } else {
                outln!(
                    "{} {} by {}",
                    a.id,
                    wire_name(&decision),
                    a.decided_by.as_deref().unwrap_or("?")
                );
            }
        }
        Cmd::Flight { id, updates, json } => {
            let flight: Flight = client.get(&format!("/v1/flights/{}", enc(&id))).await?;
            let ups: Vec<FlightUpdate> = if updates {
                client
                    .get(&format!("/v1/flights/{}/updates", enc(&id)))
                    .await?
            } else {
                Vec::new()
            };
            if json {
                if updates {
                    print_json(&serde_json::json!({ "flight": flight, "updates": ups }))?;
                } else {
                    print_json(&flight)?;
                }
            } else {
                outln!("flight     {}", flight.id);
                outln!("agent      {}", flight.agent);
                outln!("state      {}", flight.state);
                outln!("invocation {}", flight.invocation);
                if let Some(t) = &flight.thread_id {
                    outln!("thread     {t}");
                }
                if let Some(s) = &flight.summary {
                    outln!("summary    {s}");
                }
                if let Some(e) = &flight.error {
                    outln!("error      {e}");
                }
                if let Some(o) = &flight.output {
                    outln!("output\n{o}");
                }
                for u in ups {
                    outln!("{:>6} {}", u.seq, serde_json::to_string(&u.change)?);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn unreachable_up() -> ! {
    // `up` is dispatched before client commands; keep the match total without panicking.
    errln!("relay: internal error: `up` reached the client path");
    std::process::exit(2)
}

async fn agent_command(client: &Client, cmd: AgentCmd) -> Result<(), anyhow::Error> {
    match cmd {
        AgentCmd::Add {
            name,
            harness,
            cwd,
            command,
            args,
            env,
            secret,
            model,
            node,
            wake,
            auto_accept,
            auto_decline,
            json,
        } => {
            let cwd = std::path::absolute(&cwd).unwrap_or(cwd);
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
                let value = std::env::var(&name).map_err(|_| {
                    anyhow::anyhow!(
                        "--secret {name}: {name} is not set in this command's environment (run `{name}=... relay agent add ... --secret {name}`)"
                    )
                })?;
                secrets.insert(name, value);
            }
            let agent: Agent = client
                .post(
                    "/v1/agents",
                    &AgentSpec {
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
                        approval_policy: ApprovalPolicy {
                            accept_commands: auto_accept,
                            decline_commands: auto_decline,
                            accept_file_changes: false,
                        },
                    },
                )
                .await?;
            if json {
                print_json(&agent)?;
            } else {
                outln!("{} ({})", agent.spec.name, agent.spec.harness);
            }
        }
        AgentCmd::List(f) => {
            let agents: Vec<Agent> = client.get("/v1/agents").await?;
            if f.json {
                print_json(&agents)?;
            } else {
                for a in agents {
                    outln!(
                        "{:<20} {:<20} {:<9} {}",
                        a.spec.name,
                        a.spec.harness,
                        wire_name(&a.state),
                        a.spec.cwd
                    );
                }
            }
        }
        AgentCmd::Show { name, json } => {
            let a: Agent = client.get(&format!("/v1/agents/{}", enc(&name))).await?;
            if json {
                print_json(&a)?;
            } else {
                outln!("name      {}", a.spec.name);
                outln!("harness   {}", a.spec.harness);
                outln!("cwd       {}", a.spec.cwd);
                outln!("state     {}", wire_name(&a.state));
                outln!("node      {}", a.spec.node.as_deref().unwrap_or("(local)"));
                outln!("thread_id {}", a.thread_id.as_deref().unwrap_or("-"));
            }
        }
        AgentCmd::Remove { name, json } => {
            let a: Agent = client.delete(&format!("/v1/agents/{}", enc(&name))).await?;
            if json {
                print_json(&a)?;
            } else {
                outln!("removed {}", a.spec.name);
            }
        }
        AgentCmd::Wake { name, json } => {
            let a: Agent = client
                .post(
                    &format!("/v1/agents/{}/wake", enc(&name)),
                    &serde_json::json!({}),
                )
                .await?;
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

fn describe_event(e: &Event) -> String {
    use relay_protocol::event::EventBody as B;
    match &e.body {
        B::AgentRegistered { agent } | B::AgentUpdated { agent } => agent.spec.name.clone(),
        B::AgentRemoved { name, .. } => name.clone(),
        B::ThreadLost { agent, reason, .. } => format!("{agent}: {reason}"),
        B::ConversationCreated { conversation } => conversation.spec.id.clone(),
        B::MessagePosted { message, .. } => format!(
            "{} {}: {}",
            message.conversation,
            message.author,
            message.body.lines().next().unwrap_or("")
        ),
        B::DeliveryPlanned { delivery } | B::DeliveryAttempted { delivery } => {
            format!("{} -> {}", delivery.message, delivery.target)
        }
        B::InvocationCreated { flight, .. } => format!("{} {}", flight.id, flight.agent),
        B::FlightUpdated { update, flight } => {
            format!("{} #{} {}", flight.id, update.seq, flight.state)
        }
        B::BindingCreated { binding } => format!("{} {}", binding.conversation, binding.target),
        B::ApprovalRequested { approval } | B::ApprovalDecided { approval } => {
            format!("{} {}", approval.id, approval.request.detail)
        }
    }
}

/// `relay ask`: invoke, then follow the flight's updates, printing deltas as they come.
async fn ask(
    client: &Client,
    req: InvokeRequest,
    no_wait: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    let accepted: relay_protocol::api::InvokeAccepted =
        client.post("/v1/invocations", &req).await?;
    let id = accepted.flight.id.clone();
    if no_wait {
        if json {
            print_json(&accepted.flight)?;
        } else {
            outln!("{id}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let status_line = !json && std::io::stderr().is_terminal();
    let shared = std::sync::Arc::new(std::sync::Mutex::new(AskView::new(accepted.flight.state)));
    let spinner = status_line.then(|| {
        let shared = shared.clone();
        let agent = req.target.clone();
        tokio::spawn(async move {
            let frames = ['|', '/', '-', '\\'];
            for i in 0.. {
                tokio::time::sleep(std::time::Duration::from_millis(120)).await;
                let Ok(mut v) = shared.lock() else { return };
                v.draw_status(&agent, frames[i % 4]);
            }
        })
    });
    let mut failure = None;
    client
        .sse(&format!("/v1/flights/{}/stream", enc(&id)), |kind, data| {
            if kind != "update" {
                failure = Some(data.to_string());
                return false;
            }
            let Ok(u) = serde_json::from_str::<FlightUpdate>(data) else {
                failure = Some(format!("bad update: {data}"));
                return false;
            };
            let Ok(mut v) = shared.lock() else {
                return false;
            };
            v.apply(&u.change, !json);
            true
        })
        .await?;
    if let Some(s) = spinner {
        s.abort();
    }
    let view = shared.lock().map(|mut v| {
        v.clear_status();
        v.finish()
    });
    if let Some(f) = failure {
        anyhow::bail!("the flight stream failed: {f}");
    }
    let flight: Flight = client.get(&format!("/v1/flights/{}", enc(&id))).await?;
    if json {
        print_json(&flight)?;
    } else if let Some(output) = flight.output.as_deref().filter(|o| !o.trim().is_empty()) {
        match view {
            // Nothing streamed: the reply is all there is to show.
            Ok(None) => outln!("{output}"),
            // What streamed last is not the final reply (a steered turn, several
            // messages): say what the reply is.
            Ok(Some(last)) if last.trim() != output.trim() => {
                outln!("\n[final reply]\n{output}")
            }
            _ => {}
        }
    }
    if flight.state == FlightState::Completed {
        Ok(ExitCode::SUCCESS)
    } else {
        if !json {
            errln!(
                "relay: flight {} {}: {}",
                flight.id,
                flight.state,
                flight.error.as_deref().unwrap_or("no reason given")
            );
        }
        Ok(ExitCode::FAILURE)
    }
}

/// What `relay ask` shows: the reply as it streams on stdout, and on a terminal a
/// status line on stderr whenever nothing has printed for a moment (what the agent is
/// doing, and how to answer an approval it waits for).
struct AskView {
    state: FlightState,
    /// What the flight is doing, for the status line.
    activity: String,
    /// Anything printed on stdout yet, and whether its last line is unfinished.
    printed: bool,
    mid_line: bool,
    /// The agent message being streamed.
    message: String,
    status_shown: bool,
    last_print: std::time::Instant,
}

impl AskView {
    fn new(state: FlightState) -> AskView {
        AskView {
            state,
            activity: "waiting for the agent".into(),
            printed: false,
            mid_line: false,
            message: String::new(),
            status_shown: false,
            last_print: std::time::Instant::now(),
        }
    }

    fn apply(&mut self, change: &FlightChange, print: bool) {
        use relay_protocol::domain::ItemPhase;
        match change {
            FlightChange::Delta { text } => {
                self.message.push_str(text);
                if print {
                    self.print(text);
                }
            }
            FlightChange::Item {
                item_kind, phase, ..
            } => match (item_kind.as_str(), phase) {
                ("agent_message", ItemPhase::Started) => {
                    // A new message of the same turn starts on a paragraph of its own.
                    if print && self.printed {
                        self.print(if self.mid_line { "\n\n" } else { "\n" });
                    }
                    self.message.clear();
                    self.activity = "writing".into();
                }
                ("command_execution", ItemPhase::Started) => {
                    self.activity = "running a command".into()
                }
                ("file_change", ItemPhase::Started) => self.activity = "changing files".into(),
                ("reasoning", ItemPhase::Started) => self.activity = "thinking".into(),
                (_, ItemPhase::Completed) => self.activity = "working".into(),
                (other, ItemPhase::Started) => self.activity = other.replace('_', " "),
            },
            FlightChange::State { to, reason, .. } => {
                self.state = *to;
                self.activity = match (to, reason) {
                    (FlightState::Waiting, Some(reason)) => approval_hint(reason),
                    (FlightState::Waking, _) => "starting the agent's session".into(),
                    _ => "working".into(),
                };
            }
            _ => {}
        }
    }

    fn print(&mut self, text: &str) {
        use std::io::Write;
        self.clear_status();
        out!("{text}");
        let _ = std::io::stdout().flush();
        self.printed = true;
        self.mid_line = !text.ends_with('\n');
        self.last_print = std::time::Instant::now();
    }

    fn draw_status(&mut self, agent: &str, frame: char) {
        if self.state.is_terminal()
            || self.last_print.elapsed() < std::time::Duration::from_millis(400)
        {
            return;
        }
        if self.mid_line && !self.status_shown {
            // Under the unfinished line, never over it.
            outln!();
            self.mid_line = false;
        }
        eprint!(
            "\r\x1b[K{}",
            relay_cli::terminal::inert(&format!(
                "{frame} {agent}: {} ({})",
                self.activity, self.state
            ))
        );
        self.status_shown = true;
    }

    fn clear_status(&mut self) {
        if self.status_shown {
            eprint!("\r\x1b[K");
            self.status_shown = false;
        }
    }

    /// Ends the streamed text; returns the last agent message if anything streamed.
    fn finish(&mut self) -> Option<String> {
        if !self.printed {
            return None;
        }
        if self.mid_line {
            outln!();
        }
        Some(std::mem::take(&mut self.message))
    }
}

/// The status line for a flight waiting on an approval, from its state reason
/// (`approval apr_...: <command>`).
fn approval_hint(reason: &str) -> String {
    match reason
        .strip_prefix("approval ")
        .and_then(|r| r.split_once(": "))
    {
        // The whole command on one line: a second line must not hide.
        Some((id, detail)) => format!(
            "waiting for approval of `{}`: relay approve {id} accept|decline",
            relay_cli::terminal::one_line(detail)
        ),
        None => reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_status_line_says_how_to_answer_an_approval() {
        assert_eq!(
            approval_hint("approval apr_123: cargo test -p x\nmore"),
            "waiting for approval of `cargo test -p x\\nmore`: relay approve apr_123 accept|decline"
        );
        assert_eq!(approval_hint("something else"), "something else");
    }

    #[test]
    fn the_ask_view_follows_the_flight() {
        let mut v = AskView::new(FlightState::Queued);
        v.apply(
            &FlightChange::State {
                to: FlightState::Waking,
                reason: None,
                output: None,
            },
            false,
        );
        assert_eq!(v.activity, "starting the agent's session");
        v.apply(
            &FlightChange::Delta {
                text: "draft".into(),
            },
            false,
        );
        v.apply(
            &FlightChange::Item {
                item_id: "m2".into(),
                item_kind: "agent_message".into(),
                phase: relay_protocol::domain::ItemPhase::Started,
                text: None,
            },
            false,
        );
        v.apply(
            &FlightChange::Delta {
                text: "final".into(),
            },
            false,
        );
        assert_eq!(v.message, "final", "a new message replaces the last one");
        v.apply(
            &FlightChange::State {
                to: FlightState::Waiting,
                reason: Some("approval apr_9: rm -rf x".into()),
                output: None,
            },
            false,
        );
        assert_eq!(v.state, FlightState::Waiting);
        assert!(v.activity.contains("relay approve apr_9"), "{}", v.activity);
        // Nothing printed (print = false): nothing to finish.
        assert_eq!(v.finish(), None);
    }
}
