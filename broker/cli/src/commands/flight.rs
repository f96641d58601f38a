//! Flights: `relay flight list|show|steer|interrupt|reply` (`relay flight ID` shows one;
//! the older `relay flights`, `steer`, `interrupt` and `peek` are kept), and `relay
//! ask`, which starts one, in [`super::ask`].

use clap::{Args, Subcommand};
use relay_client::Client;
use relay_protocol::api::FlightTree;
use relay_protocol::api::{AfterQuery, Empty, FlightsQuery, PeekQuery, SteerRequest};
use relay_protocol::domain::{Flight, FlightState, FlightUpdate};
use relay_protocol::methods::call as m;

use crate::exit::Exit;
use crate::help;
use crate::terminal::{errln, one_line, outln};
use crate::views::print_json;
use crate::views::table::{age, Cell, Table};
use crate::views::watch::WatchView;

/// `relay flight`: a verb, or a flight's id to show it (`relay flight flt_...`).
#[derive(Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    arg_required_else_help = true
)]
pub struct FlightCmdArgs {
    #[command(subcommand)]
    cmd: Option<FlightCmd>,
    #[command(flatten)]
    show: FlightArgs,
}

#[derive(Subcommand)]
pub enum FlightCmd {
    /// List flights, newest last.
    #[command(alias = "ls", after_help = help::FLIGHT_LIST)]
    List(FlightsArgs),
    /// Show one flight; --updates adds its whole run as a transcript, --tree who asked
    /// whom.
    #[command(after_help = help::FLIGHT_SHOW)]
    Show(FlightArgs),
    /// Add instructions to the turn a flight is running (a queued flight: to its task).
    #[command(after_help = "Example:\n  relay flight steer flt_01... \"also update the tests\"")]
    Steer(SteerArgs),
    /// Interrupt the turn a flight is running: it ends cancelled (a queued one never
    /// runs; a tmux pane gets C-c).
    #[command(after_help = "Example:\n  relay flight interrupt flt_01...")]
    Interrupt(InterruptArgs),
    /// Answer a flight you are running (a tmux agent's way to end its turn): it
    /// completes with TEXT as its output, posted as your reply.
    Reply(ReplyArgs),
}

/// `relay flight ...`.
pub async fn run(client: &Client, args: FlightCmdArgs) -> anyhow::Result<Exit> {
    match args.cmd {
        None => show(client, args.show).await?,
        Some(FlightCmd::List(a)) => list(client, a).await?,
        Some(FlightCmd::Show(a)) => show(client, a).await?,
        Some(FlightCmd::Steer(a)) => steer(client, a).await?,
        Some(FlightCmd::Interrupt(a)) => interrupt(client, a).await?,
        Some(FlightCmd::Reply(a)) => reply(client, a).await?,
    }
    Ok(Exit::Ok)
}

#[derive(Args)]
pub struct FlightsArgs {
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
    /// Only flights created since then: a duration back from now (`30m`, `24h`, `7d`,
    /// `2w`) or a UTC date (`2026-11-27`, from its midnight), as `relay usage --since`.
    #[arg(long, value_name = "WHEN", value_parser = super::usage::since_arg)]
    since: Option<u64>,
    /// Only flights whose id, agent, requester, task or output holds TEXT (any case).
    #[arg(long, value_name = "TEXT")]
    search: Option<String>,
    /// At most this many (the newest).
    #[arg(short = 'n', default_value_t = 50)]
    n: usize,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SteerArgs {
    /// The flight's id.
    flight: String,
    /// What to add to the turn.
    #[arg(required = true, num_args = 1..)]
    text: Vec<String>,
}

#[derive(Args)]
pub struct ReplyArgs {
    /// The flight's id (the task a tmux agent gets names it).
    flight: String,
    /// The answer: the flight's output, posted as the agent's reply. `-` (or no words
    /// with stdin not a terminal) reads it from stdin.
    text: Vec<String>,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct PeekArgs {
    /// The tmux agent's name.
    agent: String,
    /// How many of the pane's last lines to show (its screen and the history above).
    #[arg(short = 'n', long = "lines", default_value_t = 40)]
    lines: usize,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct InterruptArgs {
    /// The flight's id.
    flight: String,
}

#[derive(Args)]
pub struct FlightArgs {
    /// The flight's id.
    #[arg(required = true)]
    id: Option<String>,
    /// Also print its whole run as a transcript: the streamed text joined, each item,
    /// state change and note on a line of its own (--json: the raw updates).
    #[arg(long, conflicts_with = "tree")]
    updates: bool,
    /// Print the agent-to-agent tree the flight belongs to, from its root: who asked
    /// whom, each flight's state and summary (the flight asked about marked `*`).
    #[arg(long)]
    tree: bool,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

/// `relay flight list` (and `relay flights`).
pub async fn list(client: &Client, args: FlightsArgs) -> anyhow::Result<()> {
    let FlightsArgs {
        agent,
        state,
        live,
        since,
        search,
        n,
        json,
    } = args;
    let query = FlightsQuery {
        agent,
        state,
        live,
        limit: Some(n),
        since: since.map(|ms| ms.to_string()),
        q: search,
    };
    let listed = client.call::<m::FlightList>(&[], &query).await?;
    if json {
        print_json(&listed)?;
        return Ok(());
    }
    let flights: Vec<Flight> = listed.into_iter().map(|l| l.flight).collect();
    let mut table = Table::new(&["FLIGHT", "AGENT", "STATE", "UPDATED", "SUMMARY"])
        .optional(&["UPDATED", "AGENT"]);
    for f in &flights {
        table.row(vec![
            Cell::new(&f.id),
            Cell::new(&f.agent),
            Cell::state(f.state.to_string()),
            Cell::dim(age(f.updated_at)),
            Cell::new(flight_summary(f)),
        ]);
    }
    table.print(
        crate::terminal::width(),
        "no flights (`relay ask AGENT TEXT` starts one)",
    );
    Ok(())
}

/// What a flight amounts to, on one line: its error when it failed, the start of its
/// reply when it completed, else what it is doing. Cut as a live summary is (a reply of
/// one long line would be a cell of megabytes where no terminal cuts the table).
pub(crate) fn flight_summary(f: &Flight) -> String {
    let first = |s: &str| {
        relay_protocol::domain::summarize(s.lines().find(|l| !l.trim().is_empty()).unwrap_or(""))
    };
    match f.state {
        FlightState::Failed | FlightState::Cancelled => {
            f.error.as_deref().map(first).unwrap_or_default()
        }
        FlightState::Completed => f.output.as_deref().map(first).unwrap_or_default(),
        _ => f.summary.clone().unwrap_or_default(),
    }
}

/// `relay flight`.
pub async fn show(client: &Client, args: FlightArgs) -> anyhow::Result<()> {
    let FlightArgs {
        id,
        updates,
        tree,
        json,
    } = args;
    let Some(id) = id else {
        crate::exit::usage!("which flight? give its id (`relay flight list` lists them)");
    };
    if tree {
        let tree: FlightTree = client.call::<m::FlightTreeShow>(&[&id], &Empty {}).await?;
        if json {
            print_json(&tree)?;
        } else {
            print_tree(&tree, &id, "", "");
        }
        return Ok(());
    }
    let flight: Flight = client.call::<m::FlightShow>(&[&id], &Empty {}).await?;
    let ups: Vec<FlightUpdate> = if updates {
        client
            .call::<m::FlightUpdates>(&[&id], &AfterQuery::default())
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
        outln!(
            "state      {} (updated {})",
            flight.state,
            age(flight.updated_at)
        );
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
        if let Some(note) = &flight.note {
            outln!("note       {}", note_text(note));
        }
        if let Some(u) = &flight.usage {
            outln!("usage      {}", super::usage::flight_usage_line(u));
        }
        for line in super::workspace::flight_lines(&flight) {
            outln!("{line}");
        }
        if let Some(o) = &flight.output {
            outln!("output\n{o}");
        }
        if updates {
            outln!("--- updates ---");
            let mut view = WatchView::default();
            for u in &ups {
                view.update(u);
            }
            view.end_line();
        }
    }
    Ok(())
}

/// One flight of a tree and, indented under it, the flights it asked: `lead` goes before
/// this line, `indent` before its children's.
fn print_tree(tree: &FlightTree, marked: &str, lead: &str, indent: &str) {
    let f = &tree.flight;
    let text = f
        .error
        .as_deref()
        .or(f.output.as_deref())
        .or(f.summary.as_deref())
        .unwrap_or("");
    outln!(
        "{lead}{}{} {:<10} {:<16} {}",
        f.id,
        if f.id == marked { "*" } else { "" },
        f.state,
        f.agent,
        one_line(&text.chars().take(100).collect::<String>())
    );
    let last = tree.children.len().saturating_sub(1);
    for (i, child) in tree.children.iter().enumerate() {
        let (branch, next) = if i == last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        print_tree(
            child,
            marked,
            &format!("{indent}{branch}"),
            &format!("{indent}{next}"),
        );
    }
}

/// `relay flight steer` (and `relay steer`).
pub async fn steer(client: &Client, args: SteerArgs) -> anyhow::Result<()> {
    let SteerArgs { flight, text } = args;
    let f: Flight = client
        .call::<m::FlightSteer>(
            &[&flight],
            &SteerRequest {
                text: text.join(" "),
            },
        )
        .await?;
    outln!("steered {}", f.id);
    Ok(())
}

/// `relay reply`.
pub async fn reply(client: &Client, args: ReplyArgs) -> anyhow::Result<()> {
    let ReplyArgs { flight, text, json } = args;
    let text = super::text_arg(text)?;
    let f: Flight = client
        .call::<m::FlightReply>(&[&flight], &relay_protocol::api::ReplyRequest { text })
        .await?;
    if json {
        print_json(&f)?;
    } else {
        outln!(
            "answered {} (agent {}): it completes with this answer, posted as the reply",
            f.id,
            f.agent
        );
    }
    Ok(())
}

/// `relay agent peek` (and `relay peek`).
pub async fn peek(client: &Client, args: PeekArgs) -> anyhow::Result<()> {
    let PeekArgs { agent, lines, json } = args;
    let peek: relay_protocol::api::Peek = client
        .call::<m::AgentPeek>(&[&agent], &PeekQuery { lines: Some(lines) })
        .await?;
    if json {
        print_json(&peek)?;
    } else {
        for line in &peek.lines {
            outln!("{line}");
        }
        errln!(
            "(pane {} of {}; look at it live: {})",
            peek.pane,
            peek.agent,
            peek.attach
        );
    }
    Ok(())
}

/// `relay flight interrupt` (and `relay interrupt`).
pub async fn interrupt(client: &Client, args: InterruptArgs) -> anyhow::Result<()> {
    let InterruptArgs { flight } = args;
    let f: Flight = client
        .call::<m::FlightInterrupt>(&[&flight], &Empty {})
        .await?;
    outln!("interrupting {}", f.id);
    Ok(())
}

/// A note as `relay agent show` and `relay flight show` print it: its text, how long
/// ago it came and, on an agent, from which flight.
pub(crate) fn note_text(note: &relay_protocol::domain::Note) -> String {
    let secs = relay_protocol::clock::now_ms().saturating_sub(note.at) / 1000;
    let ago = match secs {
        0..=119 => format!("{secs} s ago"),
        120..=7199 => format!("{} min ago", secs / 60),
        _ => format!("{} h ago", secs / 3600),
    };
    match &note.flight {
        Some(flight) => format!("{} ({ago}, flight {flight})", note.text),
        None => format!("{} ({ago})", note.text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_protocol::domain::SUMMARY_CHARS;

    #[test]
    fn a_completed_flights_summary_is_its_replys_first_line_cut() {
        let mut f: Flight = serde_json::from_value(serde_json::json!({
            "id": "flt_1", "invocation": "inv_1", "agent": "a", "state": "completed",
            "update_seq": 3, "conversation": "c", "created_at": 1, "updated_at": 2,
        }))
        .expect("a flight");
        f.output = Some(format!("\n{}\nsecond line", "word ".repeat(100_000)).into());
        let summary = flight_summary(&f);
        assert!(
            summary.chars().count() <= SUMMARY_CHARS + 1,
            "{}",
            summary.len()
        );
        assert!(
            summary.starts_with("word word") && summary.ends_with('…'),
            "{summary}"
        );
        f.output = Some("short\nmore".into());
        assert_eq!(flight_summary(&f), "short");
    }
}
