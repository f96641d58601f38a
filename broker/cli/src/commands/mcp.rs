//! `relay mcp`: Relay's tools as an MCP server on stdio, for the agent CLIs that host MCP
//! servers (Codex, Claude Code). Built on the official SDK, `rmcp`: its macros derive each
//! tool's JSON schema from the argument struct below (doc comments become the
//! descriptions) and route `tools/call` to the method.
//!
//! The server acts as one actor, the agent whose session started it (`RELAY_AGENT`, with
//! its scoped `RELAY_TOKEN` against `RELAY_URL`; the harness adapters wire that in), and
//! calls the broker's HTTP API through the same [`Client`] and the same functions as the
//! shell commands: [`ask::invoke`] and [`ask::follow`] (`relay ask`), [`conversation::post`]
//! (`relay send`), [`conversation::last_messages`] (`relay read`). The broker decides what
//! the token may do and links an ask to the flight the agent is running, so a child
//! flight hangs under its parent without the model naming it.
//!
//! Tools: `ask` (waits for the asked agent's flight to end and returns its reply),
//! `send`, `reply`, `read_conversation`, `list_agents`, `show_flight`. A refusal (an
//! unknown agent, a self-ask, a cycle, a chain too deep, `unauthorized`) or a flight that
//! failed comes back as an error result with the broker's words, for the model to read:
//! it is the tool's answer, not a failure of the server. Agent and model text (replies,
//! message bodies) is returned as it is, never interpreted. Nothing is written to stdout
//! but the protocol; errors of the server itself go to stderr.

use clap::Args;
use relay_client::Client;
use relay_protocol::api::Empty;
use relay_protocol::domain::{Flight, FlightState, InvokeRequest, Message, DEFAULT_CONVERSATION};
use relay_protocol::methods::call as m;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ask, conversation, Actor};

#[derive(Args)]
pub struct McpArgs {
    #[command(flatten)]
    actor: Actor,
}

/// What the server tells the model about itself (MCP `instructions`).
const INSTRUCTIONS: &str = "Relay connects you with other coding agents and people. \
Use `ask` to give another agent a task and wait for its reply, `send` and `reply` to post \
in a conversation, `read_conversation` to see what was said, `list_agents` to see who \
is there, and `show_flight` to look at a task's progress. You act as yourself only.";

/// How many messages `read_conversation` returns when not told.
const DEFAULT_READ: usize = 20;

/// `relay mcp`: serves the tools on stdin/stdout until the client closes them.
pub async fn run(client: &Client, args: McpArgs) -> anyhow::Result<()> {
    let server = RelayTools::new(client.clone(), args.actor.name());
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| anyhow::anyhow!("the MCP handshake failed: {e}"))?;
    running.waiting().await?;
    Ok(())
}

/// The tools, acting as `actor` through `client`.
#[derive(Clone)]
pub struct RelayTools {
    client: Client,
    actor: String,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
pub struct AskArgs {
    /// The agent to ask, by name (see `list_agents`).
    pub agent: String,
    /// The task or question, as the agent will read it.
    pub text: String,
    /// Fail the asked agent's flight after this many seconds (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
pub struct SendArgs {
    /// The message. `@name` in it mentions an agent.
    pub text: String,
    /// The conversation to post in (default: `channel.shared`, the shared channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
pub struct ReplyArgs {
    /// The id of the message to answer (as `read_conversation` shows it). Give this or
    /// `flight`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// The flight to answer: the one a task pasted into your pane names ("Relay flight
    /// flt-..."). It completes with `text` as its output, posted as your reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flight: Option<String>,
    /// The reply.
    pub text: String,
    /// The conversation of that message (default: `channel.shared`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
pub struct ReadArgs {
    /// The conversation (default: `channel.shared`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// How many of the last messages (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
pub struct ShowFlightArgs {
    /// The flight's id (as `ask` or a conversation names it).
    pub flight: String,
    /// Show the whole tree of asks the flight belongs to instead: who asked whom, each
    /// flight's state and reply.
    #[serde(default)]
    pub tree: bool,
}

/// An agent as `list_agents` shows it.
#[derive(Debug, Serialize)]
struct AgentLine<'a> {
    name: &'a str,
    harness: String,
    state: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<&'a str>,
}

#[tool_router]
impl RelayTools {
    pub fn new(client: Client, actor: String) -> Self {
        Self {
            client,
            actor,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "Ask another agent to do a task or answer a question, and wait for its reply. \
Returns the agent's reply text. Refused (as an error result) when the agent is unknown, is \
yourself, is already in the chain of asks that led to you (a cycle), or the chain is too \
deep; an error result also says when the agent's work failed or was cancelled."
    )]
    async fn ask(&self, Parameters(args): Parameters<AskArgs>) -> CallToolResult {
        let req = InvokeRequest {
            requester: self.actor.clone(),
            timeout_ms: args.timeout_secs.map(|s| s.saturating_mul(1000)),
            ..InvokeRequest::new(args.agent, args.text)
        };
        let accepted = match ask::invoke(&self.client, &req).await {
            Ok(a) => a,
            Err(e) => return refused(format!("relay refused the ask: {e}")),
        };
        let id = accepted.flight.id;
        match ask::follow(&self.client, &id, |_| {}).await {
            Ok(flight) => flight_reply(&flight),
            Err(e) => refused(format!("lost track of flight {id}: {e:#}")),
        }
    }

    #[tool(
        description = "Post a message to a conversation (default: the shared channel). Returns the \
message's id. `@name` in the text mentions an agent, which then gets the message as a task \
and answers in reply to it; the result names the agents consulted."
    )]
    async fn send(&self, Parameters(args): Parameters<SendArgs>) -> CallToolResult {
        self.post(args.conversation, args.text, None).await
    }

    #[tool(
        description = "Answer a flight you were given (`flight`: the task names it; the flight \
completes with your text as its output), or post a reply to a message, threaded under it \
(`reply_to`). Give one of the two."
    )]
    async fn reply(&self, Parameters(args): Parameters<ReplyArgs>) -> CallToolResult {
        match (args.flight, args.reply_to) {
            (Some(flight), None) => {
                let body = relay_protocol::api::ReplyRequest { text: args.text };
                match self.client.call::<m::FlightReply>(&[&flight], &body).await {
                    Ok(f) => CallToolResult::success(vec![ContentBlock::text(format!(
                        "answered flight {}: it completes with your answer",
                        f.id
                    ))]),
                    Err(e) => refused(e.to_string()),
                }
            }
            (None, Some(reply_to)) => {
                self.post(args.conversation, args.text, Some(reply_to))
                    .await
            }
            _ => refused(
                "give either `flight` (to answer a flight) or `reply_to` (to reply to a message)"
                    .into(),
            ),
        }
    }

    #[tool(
        description = "Read the last messages of a conversation (default: the shared channel), \
oldest first, as JSON: id, index, author, body, reply_to."
    )]
    async fn read_conversation(&self, Parameters(args): Parameters<ReadArgs>) -> CallToolResult {
        let conversation = args
            .conversation
            .unwrap_or_else(|| DEFAULT_CONVERSATION.to_string());
        let n = args.limit.unwrap_or(DEFAULT_READ);
        match conversation::last_messages(&self.client, &conversation, n).await {
            Ok(messages) => json_result::<Vec<Message>>(&messages),
            Err(e) => refused(e.to_string()),
        }
    }

    #[tool(description = "List the agents you can ask, as JSON: name, harness, state, model.")]
    async fn list_agents(&self) -> CallToolResult {
        match self.client.call::<m::AgentList>(&[], &Empty {}).await {
            Ok(agents) => {
                let lines: Vec<AgentLine<'_>> = agents
                    .iter()
                    .map(|a| AgentLine {
                        name: &a.spec.name,
                        harness: a.spec.harness.to_string(),
                        state: a.state.as_str(),
                        model: a.spec.model.as_deref(),
                    })
                    .collect();
                json_result(&lines)
            }
            Err(e) => refused(e.to_string()),
        }
    }

    #[tool(
        description = "Show a flight (one agent's work on one task) as JSON: its agent, state, \
reply or error; with `tree`, the whole tree of asks it belongs to."
    )]
    async fn show_flight(&self, Parameters(args): Parameters<ShowFlightArgs>) -> CallToolResult {
        let flight = [args.flight.as_str()];
        let shown = if args.tree {
            self.client
                .call::<m::FlightTreeShow>(&flight, &Empty {})
                .await
                .map(|t| json_result(&t))
        } else {
            self.client
                .call::<m::FlightShow>(&flight, &Empty {})
                .await
                .map(|f| json_result(&f))
        };
        shown.unwrap_or_else(|e| refused(e.to_string()))
    }
}

impl RelayTools {
    async fn post(
        &self,
        conversation: Option<String>,
        text: String,
        reply_to: Option<String>,
    ) -> CallToolResult {
        let conversation = conversation.unwrap_or_else(|| DEFAULT_CONVERSATION.to_string());
        match conversation::post(
            &self.client,
            conversation,
            self.actor.clone(),
            text,
            reply_to,
        )
        .await
        {
            Ok(posted) => {
                let m = &posted.message;
                let mut lines = vec![format!("posted {} in {}", m.id, m.conversation)];
                lines.extend(conversation::consult_lines(&posted));
                CallToolResult::success(vec![ContentBlock::text(lines.join("\n"))])
            }
            Err(e) => refused(e.to_string()),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for RelayTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("relay", env!("CARGO_PKG_VERSION")).with_title("Relay"),
            )
            .with_instructions(INSTRUCTIONS)
    }
}

/// The result of an `ask` whose flight ended: its reply when it completed, else an error
/// result saying how it ended.
fn flight_reply(flight: &Flight) -> CallToolResult {
    match flight.state {
        FlightState::Completed => CallToolResult::success(vec![ContentBlock::text(
            flight.output.clone().unwrap_or_default(),
        )]),
        state => refused(format!(
            "flight {} of agent {} {state}: {}",
            flight.id,
            flight.agent,
            flight.error.as_deref().unwrap_or("no reason given")
        )),
    }
}

/// An error result: the tool's answer, for the model to read.
fn refused(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn json_result<T: Serialize + ?Sized>(value: &T) -> CallToolResult {
    match serde_json::to_string_pretty(value) {
        Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
        Err(e) => refused(format!("cannot encode the answer: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The schemas the model sees: each tool's arguments, with the required ones named.
    #[test]
    fn every_tool_has_a_description_and_a_schema_with_its_required_arguments() {
        let tools = RelayTools::new(Client::new("http://127.0.0.1:1", "t").unwrap(), "a".into())
            .tool_router
            .list_all();
        let mut seen: Vec<(String, Vec<String>)> = tools
            .iter()
            .map(|t| {
                assert!(
                    t.description.as_deref().is_some_and(|d| d.len() > 20),
                    "{}",
                    t.name
                );
                let required = t
                    .input_schema
                    .get("required")
                    .and_then(|r| r.as_array())
                    .map(|r| {
                        r.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                (t.name.to_string(), required)
            })
            .collect();
        seen.sort();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            seen,
            vec![
                ("ask".to_string(), s(&["agent", "text"])),
                ("list_agents".to_string(), s(&[])),
                ("read_conversation".to_string(), s(&[])),
                ("reply".to_string(), s(&["text"])),
                ("send".to_string(), s(&["text"])),
                ("show_flight".to_string(), s(&["flight"])),
            ]
        );
    }
}
