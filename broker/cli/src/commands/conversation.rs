//! Messages and conversations: `relay send`, `relay read`, `relay conversation`.

use clap::{Args, Subcommand};
use relay_client::{Client, ClientError};
use relay_protocol::api::MessagePosted;
use relay_protocol::api::{Empty, MessagesQuery};
use relay_protocol::domain::{
    Conversation, ConversationKind, ConversationSpec, MentionSkip, Message, MessageClass,
    PostMessage, DEFAULT_CONVERSATION,
};
use relay_protocol::methods::call as m;

use super::{text_arg, Actor, JsonFlag};
use crate::terminal::{errln, outln};
use crate::views::table::{Cell, Table};
use crate::views::{print_json, print_message};

#[derive(Args)]
pub struct SendArgs {
    /// Conversation id.
    #[arg(long, default_value = DEFAULT_CONVERSATION)]
    to: String,
    #[command(flatten)]
    actor: Actor,
    /// Message text; `@name` mentions an agent, which is consulted: it gets the message
    /// as a task and its answer is posted in reply to it (not in code or `> ` quotes;
    /// stderr says who was asked and which names are not agents). `-` (or nothing, with
    /// a pipe on stdin) reads it from stdin.
    text: Vec<String>,
    /// The id of the message this one answers (it threads under it).
    #[arg(long, value_name = "MESSAGE")]
    reply_to: Option<String>,
    /// Print the answer as JSON (`message`, the `flights` its mentions started, the
    /// mentions `refused` by the loop rules, those `skipped` by the mention rules, the
    /// `unknown` names) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ReadArgs {
    /// Conversation id.
    #[arg(default_value = DEFAULT_CONVERSATION)]
    conversation: String,
    /// How many messages.
    #[arg(short = 'n', default_value_t = 20)]
    n: usize,
    /// Print JSON (machine-readable) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum ConversationCmd {
    /// Create a conversation.
    Add {
        /// The conversation's id: dot-separated words (like `team.backend`).
        id: String,
        /// channel, direct, group, thread or system.
        #[arg(long, default_value_t = ConversationKind::Channel)]
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

/// Posts `body` to `conversation` as `author` (an agent's token posts as that agent
/// only), answering `reply_to` if given; the answer names the consults its mentions
/// started or the loop rules refused. Shared by `relay send` and `relay mcp`.
pub(crate) async fn post(
    client: &Client,
    conversation: String,
    author: String,
    body: String,
    reply_to: Option<String>,
) -> Result<MessagePosted, ClientError> {
    client
        .call::<m::MessagePost>(
            &[],
            &PostMessage {
                conversation,
                author,
                body: body.into(),
                class: MessageClass::Agent,
                reply_to,
                meta: Default::default(),
            },
        )
        .await
}

/// What a post did besides posting, a line each: the agents its mentions asked (with
/// how to follow each flight), those the loop rules kept from it (with why), the
/// mentions the mention rules skipped (with why), and the names that are not agents.
pub(crate) fn consult_lines(posted: &MessagePosted) -> Vec<String> {
    let asked = posted.flights.iter().map(|f| {
        format!(
            "asked {} ({}): relay watch --flight {}",
            f.agent, f.id, f.id
        )
    });
    let refused = posted
        .refused
        .iter()
        .map(|r| format!("@{} not asked: {}", r.agent, r.error.message));
    let skipped = posted.skipped.iter().map(|s| {
        let again = if s.reason == MentionSkip::Repeated {
            " again"
        } else {
            ""
        };
        format!("@{} not asked{again}: {}", s.name, s.reason.describe())
    });
    let unknown = posted
        .unknown
        .iter()
        .map(|name| format!("@{name} is not an agent (relay agent list)"));
    asked.chain(refused).chain(skipped).chain(unknown).collect()
}

/// The last `n` messages of `conversation`, oldest first. Shared by `relay read` and
/// `relay mcp`.
pub(crate) async fn last_messages(
    client: &Client,
    conversation: &str,
    n: usize,
) -> Result<Vec<Message>, ClientError> {
    client
        .call::<m::ConversationRead>(&[conversation], &MessagesQuery { limit: Some(n) })
        .await
}

/// `relay send`: prints the message id (alone on stdout, for scripts), and on stderr
/// [`consult_lines`].
pub async fn send(client: &Client, args: SendArgs) -> anyhow::Result<()> {
    let SendArgs {
        to,
        actor,
        text,
        reply_to,
        json,
    } = args;
    let posted = post(client, to, actor.name(), text_arg(text)?, reply_to).await?;
    if json {
        print_json(&posted)?;
    } else {
        // The message id first and alone on its line, as scripts read it.
        outln!("{}", posted.message.id);
        for line in consult_lines(&posted) {
            errln!("{line}");
        }
    }
    Ok(())
}

/// `relay read`.
pub async fn read(client: &Client, args: ReadArgs) -> anyhow::Result<()> {
    let ReadArgs {
        conversation,
        n,
        json,
    } = args;
    let msgs = last_messages(client, &conversation, n).await?;
    if json {
        print_json(&msgs)?;
    } else {
        for m in &msgs {
            print_message(m);
        }
        if msgs.is_empty() {
            crate::terminal::errln!("no messages in {conversation} yet");
        }
    }
    Ok(())
}

/// `relay conversation add|list`.
pub async fn run(client: &Client, cmd: ConversationCmd) -> anyhow::Result<()> {
    match cmd {
        ConversationCmd::Add {
            id,
            kind,
            title,
            participants,
            parent,
            json,
        } => {
            let c: Conversation = client
                .call::<m::ConversationAdd>(
                    &[],
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
            let list: Vec<Conversation> =
                client.call::<m::ConversationList>(&[], &Empty {}).await?;
            if f.json {
                print_json(&list)?;
            } else {
                let mut table = Table::new(&["CONVERSATION", "KIND", "MESSAGES", "TITLE"]);
                for c in &list {
                    let kind = serde_json::to_value(c.spec.kind)?;
                    table.row(vec![
                        Cell::new(&c.spec.id),
                        Cell::new(kind.as_str().unwrap_or("?")),
                        Cell::new(c.message_count.to_string()),
                        Cell::new(c.spec.title.as_deref().unwrap_or("")),
                    ]);
                }
                table.print(
                    crate::terminal::width(),
                    "no conversations yet: `relay send TEXT` posts to channel.shared",
                );
            }
        }
    }
    Ok(())
}
