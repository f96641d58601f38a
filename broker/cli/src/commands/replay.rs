//! `relay replay flight|agent|conversation`: a session read back from the broker's log,
//! as a transcript (`views::replay`) or one JSON document (`--json`).

use clap::{Args, Subcommand};
use relay_client::Client;
use relay_protocol::api::ReplayQuery;
use relay_protocol::methods::{call as m, Call};

use crate::views::{print_json, replay};

#[derive(Subcommand)]
pub enum ReplayCmd {
    /// One flight: who asked what, its commands and their output, approvals and who
    /// decided them, the text, token usage and how it ended.
    #[command(
        after_help = "Examples:\n  relay replay flight flt_01...\n  relay replay flight flt_01... --json > turn.json"
    )]
    Flight(ReplayArgs),
    /// An agent's session across turns: every flight it ran (as `replay flight` shows
    /// one), its registrations and the sessions it lost.
    #[command(
        after_help = "Examples:\n  relay replay agent codex-1\n  relay replay agent codex-1 --from-seq 1200 --json"
    )]
    Agent(ReplayArgs),
    /// A conversation: who said what (replies under the message they answer) and the
    /// flights its messages started.
    #[command(after_help = "Example:\n  relay replay conversation channel.shared")]
    Conversation(ReplayArgs),
}

#[derive(Args)]
pub struct ReplayArgs {
    /// The flight id, agent name or conversation id.
    id: String,
    /// Only what happened after this global sequence number (the seq `relay events`
    /// shows); a turn begun before it shows who asked, then only its later entries.
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    from_seq: u64,
    /// Print one JSON document (machine-readable; the same log gives the same bytes)
    /// instead of the transcript.
    #[arg(long)]
    json: bool,
}

/// `relay replay`.
pub async fn run(client: &Client, cmd: ReplayCmd) -> anyhow::Result<()> {
    match cmd {
        ReplayCmd::Flight(args) => {
            let (doc, json) = fetch::<m::ReplayFlight>(client, args).await?;
            show(&doc, json, replay::print_turn)
        }
        ReplayCmd::Agent(args) => {
            let (doc, json) = fetch::<m::ReplayAgent>(client, args).await?;
            show(&doc, json, replay::print_agent)
        }
        ReplayCmd::Conversation(args) => {
            let (doc, json) = fetch::<m::ReplayConversation>(client, args).await?;
            show(&doc, json, replay::print_conversation)
        }
    }
}

async fn fetch<M: Call<Request = ReplayQuery>>(
    client: &Client,
    args: ReplayArgs,
) -> anyhow::Result<(M::Response, bool)> {
    let ReplayArgs { id, from_seq, json } = args;
    let doc = client
        .call::<M>(
            &[&id],
            &ReplayQuery {
                from_seq: Some(from_seq),
            },
        )
        .await?;
    Ok((doc, json))
}

fn show<T: serde::Serialize>(doc: &T, json: bool, print: fn(&T)) -> anyhow::Result<()> {
    if json {
        print_json(doc)?;
    } else {
        print(doc);
    }
    Ok(())
}
