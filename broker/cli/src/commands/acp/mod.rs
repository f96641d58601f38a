//! `relay acp AGENT`: one Relay agent (of any harness, local or on a node) as an ACP
//! agent on stdio (Agent Client Protocol: JSON-RPC 2.0, one message per line), so an
//! editor that speaks ACP (Zed, JetBrains, Neovim, Emacs) drives it through the broker.
//!
//! The other direction of the `acp` harness: here Relay is the agent and the editor the
//! client. Everything goes through the broker's HTTP API with [`Client`], as `relay ask`
//! and `relay mcp` do, acting as one actor (`--as`, else `RELAY_AGENT` with its token,
//! else `operator`) and never more than its token may. The broker is found again when
//! it cannot be reached (restarted, maybe on another port) or was not there at the
//! start, since this process lives as long as the editor:
//!
//! - `initialize`: Relay's `agentInfo`; `loadSession`; prompts of text (and resource
//!   links, which every ACP agent must take, given as their URI); no `fs/*` or
//!   `terminal/*` is asked of the editor.
//! - `session/new` creates a conversation `acp.<actor>.<agent>.<unique>` between the
//!   actor and the agent: the ACP session id IS the conversation id, so `session/load`
//!   in another `relay acp` process reopens it. A token that may not create
//!   conversations (an agent's) gets the direct conversation of the two, the one `relay
//!   ask` uses. The editor's `cwd` and `mcpServers` are not used: the agent works in its
//!   own cwd with the MCP servers Relay gives it.
//! - `session/load` replays the conversation's last [`REPLAY_MESSAGES`] messages (the
//!   actor's and others' as `user_message_chunk`, the agent's as `agent_message_chunk`)
//!   before it answers.
//! - `session/prompt` is an invocation of the agent in that conversation (`turn.rs`):
//!   its flight streams back as `session/update`s, its approvals are asked of the
//!   editor as `session/request_permission`, and its end answers the prompt.
//! - `session/cancel` interrupts the flight of the session's prompt.
//!
//! Parts: this module (the line loop, requests to and from the editor, sessions),
//! `turn.rs` (a prompt: its flight followed, its approvals, its end), `updates.rs` (a
//! flight's updates as session updates).
//!
//! Stdin is read in a task of its own, so a line is read whole however it comes in
//! while requests end around it. Requests are served concurrently (each in a task of its own), so one editor may run
//! prompts in several sessions at once; a second prompt in a session whose prompt runs
//! is refused. A prompt's turn begins as its line is read (its flight is invoked in its
//! task), so a `session/cancel` right behind it cancels it. Bad input (a line that is not JSON, an unknown method, bad parameters, an
//! unknown session, a broker that cannot be reached, an unknown agent) is answered with
//! a JSON-RPC error and the server goes on. Nothing but the protocol is written to
//! stdout; what the server has to say goes to stderr. EOF on stdin ends it: the tasks
//! are stopped (flights still running go on in Relay; their replies land in the
//! conversation, which `session/load` shows).

mod turn;
mod updates;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use clap::Args;
use relay_client::{Client, ClientError};
use relay_harnesses::lines::{LineReader, Overflow};
use relay_protocol::acp::{
    self, method, AgentCapabilities, ContentBlock, Implementation, InitializeResponse,
    LoadSessionRequest, Message, NewSessionRequest, NewSessionResponse, PromptCapabilities,
    RequestId, RpcError, SessionNotification, SessionUpdate,
};
use relay_protocol::api::{Empty, ErrorCode, MessagesQuery};
use relay_protocol::domain::{id_token, ConversationKind, ConversationSpec, MessageClass};
use relay_protocol::methods::{call as m, Call};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::Actor;
use crate::terminal::errln;

#[derive(Args)]
pub struct AcpArgs {
    /// The Relay agent the editor talks to (any harness, local or on a node).
    agent: String,
    #[command(flatten)]
    actor: Actor,
}

/// How many of a conversation's last messages `session/load` replays.
pub const REPLAY_MESSAGES: usize = 500;

/// The longest line read from the editor; a longer one is answered with an error and
/// skipped, so an endless line cannot eat the memory.
const MAX_LINE: usize = 8 << 20;

/// Finds the broker (`Client::discover` with the command's data dir, URL and token).
pub type Discover = Arc<dyn Fn() -> Result<Client, ClientError> + Send + Sync>;

/// `relay acp AGENT`: serves until stdin ends. `discover` finds the broker: at the
/// start, again when none was found (one started after the editor started this), and
/// again when the one found cannot be reached (restarted, maybe on another port).
/// Without one every session method is answered with why, so the editor shows it
/// instead of a process that died.
pub async fn run(discover: Discover, args: AcpArgs) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(write_lines(rx));
    let found = found(&discover).await;
    let server = Arc::new(Server {
        discover,
        broker: Mutex::new(found),
        agent: args.agent,
        actor: args.actor.name(),
        out: tx,
        sessions: Mutex::new(HashMap::new()),
        pending: Mutex::new(HashMap::new()),
        next_id: AtomicI64::new(0),
        may_decide: AtomicBool::new(true),
    });
    let mut lines = read_lines(tokio::io::BufReader::new(tokio::io::stdin()));
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            line = lines.recv() => match line {
                Some(Ok(line)) => server.clone().handle(line, &mut tasks),
                None => break,
                Some(Err(e)) => {
                    errln!("relay acp: cannot read stdin: {e}");
                    break;
                }
            },
            Some(done) = tasks.join_next() => {
                if let Err(e) = done {
                    errln!("relay acp: a request's task ended abnormally: {e}");
                }
            }
        }
    }
    // The editor is gone: stop what still runs for it, then let the writer finish.
    tasks.shutdown().await;
    drop(server);
    writer.await?;
    Ok(())
}

/// A line as read: its text, or word that one over [`MAX_LINE`] was skipped.
enum Line {
    Text(String),
    TooLong,
}

/// The lines of `r` as they are read, in a task of their own, through the bounded
/// reader every child's output goes through ([`LineReader`]), so that no request's
/// line is cut by the serving loop's `select!`. Bytes that are not UTF-8 become U+FFFD
/// (then the line is not JSON and is answered so). Ends after EOF or the first read
/// error (sent).
fn read_lines(
    r: impl AsyncBufRead + Unpin + Send + 'static,
) -> mpsc::Receiver<std::io::Result<Line>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let skipped = Arc::new(AtomicU64::new(0));
        let mut reader = LineReader::new(r, MAX_LINE, Overflow::Skip(skipped.clone()));
        let mut seen = 0;
        loop {
            let read = reader.read_line().await;
            let now = skipped.load(Ordering::Relaxed);
            if now > seen {
                seen = now;
                if tx.send(Ok(Line::TooLong)).await.is_err() {
                    return;
                }
            }
            let line = match read {
                Ok(true) => Ok(Line::Text(
                    String::from_utf8_lossy(reader.line())
                        .trim_end_matches('\r')
                        .to_string(),
                )),
                Ok(false) => return,
                Err(e) => Err(e),
            };
            let failed = line.is_err();
            if tx.send(line).await.is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// Writes each line to stdout as it comes, until every sender is gone or stdout is.
async fn write_lines(mut rx: mpsc::UnboundedReceiver<String>) {
    let mut stdout = tokio::io::stdout();
    while let Some(mut line) = rx.recv().await {
        line.push('\n');
        if let Err(e) = async {
            stdout.write_all(line.as_bytes()).await?;
            stdout.flush().await
        }
        .await
        {
            errln!("relay acp: cannot write to stdout: {e}");
            return;
        }
    }
}

/// One ACP session: a conversation with the agent, and its prompt when one runs.
struct Session {
    /// The conversation to invoke in; `None`: the direct one of the actor and the
    /// agent, which the broker picks (and creates on the first ask).
    conversation: Option<String>,
    turn: Option<Turn>,
}

/// The prompt running in a session.
#[derive(Default)]
struct Turn {
    /// Its flight, once the broker accepted the invocation.
    flight: Option<String>,
    /// `session/cancel` came: interrupt the flight (at once, or when it is known).
    cancelled: bool,
}

type Answer = Result<Value, RpcError>;

pub(crate) struct Server {
    discover: Discover,
    /// The broker as last found, or why none was.
    broker: Mutex<Result<Client, String>>,
    agent: String,
    actor: String,
    out: mpsc::UnboundedSender<String>,
    sessions: Mutex<HashMap<String, Session>>,
    /// The requests sent to the editor that wait for its answer.
    pending: Mutex<HashMap<RequestId, oneshot::Sender<Answer>>>,
    next_id: AtomicI64,
    /// The token may decide approvals (false once the broker said it may not: an
    /// agent's), so the editor is asked about them.
    may_decide: AtomicBool,
}

impl Server {
    /// Handles one line: a request is served in a task of its own (answered when done),
    /// a notification at once, a response wakes whoever waits for it.
    fn handle(self: Arc<Self>, line: Line, tasks: &mut JoinSet<()>) {
        let text = match line {
            Line::Text(t) if t.trim().is_empty() => return,
            Line::Text(t) => t,
            Line::TooLong => {
                errln!("relay acp: skipped a line over {MAX_LINE} bytes");
                let error = RpcError::new(
                    RpcError::INVALID_REQUEST,
                    format!("a line is over the limit of {MAX_LINE} bytes"),
                );
                self.send_value(
                    serde_json::json!({"jsonrpc": "2.0", "id": null, "error": to_value(error)}),
                );
                return;
            }
        };
        match Message::parse(&text) {
            Ok(Message::Request { id, method, params }) => {
                // A prompt's turn begins here, in the order of the lines: a
                // session/cancel on the next line finds it even when the prompt's task
                // has not run yet.
                let (begun, params) = match method.as_str() {
                    method::SESSION_PROMPT => (Some(turn::begin(&self, params)), Value::Null),
                    _ => (None, params),
                };
                tasks.spawn(async move {
                    let answer = match begun {
                        Some(Ok(begun)) => turn::prompt(&self, begun).await,
                        Some(Err(e)) => Err(e),
                        None => self.serve(&method, params).await,
                    };
                    self.send(&Message::Response { id, result: answer });
                });
            }
            Ok(Message::Notification { method, params }) => self.notified(&method, params, tasks),
            Ok(Message::Response { id, result }) => {
                let waiter = self.pending.lock().ok().and_then(|mut p| p.remove(&id));
                match waiter {
                    Some(w) => {
                        let _ = w.send(result);
                    }
                    None => errln!("relay acp: an answer to no request of ours (id {id})"),
                }
            }
            Err(e) => {
                errln!("relay acp: bad line from the editor: {e}");
                // JSON-RPC answers a message it cannot read with a null id, or the
                // request's own id when it had one.
                let id = match &e {
                    acp::LineError::NotRpc { id: Some(id), .. } => json_id(id),
                    _ => Value::Null,
                };
                let error = serde_json::to_value(e.rpc_error()).unwrap_or(Value::Null);
                self.send_value(serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error}));
            }
        }
    }

    async fn serve(self: &Arc<Self>, method: &str, params: Value) -> Answer {
        match method {
            method::INITIALIZE => Ok(to_value(initialize_response())),
            method::AUTHENTICATE => Ok(Value::Object(Default::default())),
            method::SESSION_NEW => {
                let _req: NewSessionRequest = params_of(params)?;
                let session_id = self.new_session().await?;
                Ok(to_value(NewSessionResponse {
                    session_id,
                    modes: None,
                    models: None,
                }))
            }
            method::SESSION_LOAD => {
                let req: LoadSessionRequest = params_of(params)?;
                self.load_session(req.session_id).await?;
                // An object (LoadSessionResponse, no modes or models): a typed client
                // reads `null` as no response.
                Ok(Value::Object(Default::default()))
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }

    fn notified(self: &Arc<Self>, method: &str, params: Value, tasks: &mut JoinSet<()>) {
        match method {
            method::SESSION_CANCEL => match params_of::<acp::CancelNotification>(params) {
                Ok(c) => self.cancel(&c.session_id, tasks),
                Err(e) => errln!("relay acp: a session/cancel without a session: {e}"),
            },
            other => errln!("relay acp: ignored the notification {other}"),
        }
    }

    /// The broker: as last found, else looked for again.
    pub(crate) async fn client(&self) -> Result<Client, ClientError> {
        let last = self
            .broker
            .lock()
            .ok()
            .and_then(|b| b.as_ref().ok().cloned());
        match last {
            Some(client) => Ok(client),
            None => self.find_again().await,
        }
    }

    async fn find_again(&self) -> Result<Client, ClientError> {
        let found = found(&self.discover).await;
        if let Ok(mut b) = self.broker.lock() {
            *b = found.clone();
        }
        found.map_err(ClientError::NotFound)
    }

    /// Calls the broker; one that cannot be reached (nothing was sent) is looked for
    /// again and, when another is found, the call is made to it.
    pub(crate) async fn call<M: Call>(
        &self,
        params: &[&str],
        request: &M::Request,
    ) -> Result<M::Response, ClientError> {
        let client = self.client().await?;
        match client.call::<M>(params, request).await {
            Err(e @ ClientError::Unreachable { .. }) => {
                let again = self.find_again().await.map_err(|_| e)?;
                again.call::<M>(params, request).await
            }
            answered => answered,
        }
    }

    /// A new conversation with the agent, once the agent is known to the broker.
    async fn new_session(&self) -> Result<String, RpcError> {
        self.call::<m::AgentShow>(&[&self.agent], &Empty {})
            .await
            .map_err(broker_error)?;
        let (a, b) = if self.actor <= self.agent {
            (&self.actor, &self.agent)
        } else {
            (&self.agent, &self.actor)
        };
        let spec = ConversationSpec {
            id: format!(
                "acp.{}.{}.{}",
                id_token(&self.actor),
                id_token(&self.agent),
                unique()
            ),
            kind: ConversationKind::Direct,
            title: Some(format!("ACP session with {}", self.agent)),
            participants: vec![a.clone(), b.clone()],
            parent: None,
        };
        let conversation = match self.call::<m::ConversationAdd>(&[], &spec).await {
            Ok(c) => Some(c.spec.id),
            // An agent's token may not create conversations: the direct one it is in.
            Err(e) if e.code() == Some(ErrorCode::Unauthorized) => None,
            Err(e) => return Err(broker_error(e)),
        };
        let id = conversation.clone().unwrap_or_else(|| self.direct_id());
        self.open(&id, conversation);
        Ok(id)
    }

    /// The id of the direct conversation of the actor and the agent, as the broker
    /// names it.
    fn direct_id(&self) -> String {
        let (a, b) = if self.actor <= self.agent {
            (&self.actor, &self.agent)
        } else {
            (&self.agent, &self.actor)
        };
        format!("direct.{}.{}", id_token(a), id_token(b))
    }

    fn open(&self, id: &str, conversation: Option<String>) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.entry(id.to_string()).or_insert(Session {
                conversation,
                turn: None,
            });
        }
    }

    /// Reopens conversation `id` and replays its messages as session updates.
    async fn load_session(&self, id: String) -> Result<(), RpcError> {
        self.call::<m::AgentShow>(&[&self.agent], &Empty {})
            .await
            .map_err(broker_error)?;
        let messages = self
            .call::<m::ConversationRead>(
                &[&id],
                &MessagesQuery {
                    limit: Some(REPLAY_MESSAGES),
                },
            )
            .await
            .map_err(broker_error)?;
        for message in messages.iter().filter(|m| m.class == MessageClass::Agent) {
            let chunk = acp::ContentChunk {
                content: ContentBlock::text(message.body.as_str()),
                message_id: Some(message.id.clone()),
                meta: None,
            };
            let update = if message.author == self.agent {
                SessionUpdate::AgentMessageChunk(chunk)
            } else {
                SessionUpdate::UserMessageChunk(chunk)
            };
            self.update(&id, update);
        }
        let conversation = (id != self.direct_id()).then(|| id.clone());
        self.open(&id, conversation);
        Ok(())
    }

    /// `session/cancel`: interrupts the session's flight, or marks the prompt whose
    /// invocation is on its way so it is interrupted as soon as its flight is known.
    fn cancel(self: &Arc<Self>, session_id: &str, tasks: &mut JoinSet<()>) {
        let flight = {
            let Ok(mut sessions) = self.sessions.lock() else {
                return;
            };
            let Some(turn) = sessions.get_mut(session_id).and_then(|s| s.turn.as_mut()) else {
                return;
            };
            turn.cancelled = true;
            turn.flight.clone()
        };
        if let Some(flight) = flight {
            let server = self.clone();
            tasks.spawn(async move { turn::interrupt(&server, &flight).await });
        }
    }

    /// Sends a `session/update`.
    fn update(&self, session_id: &str, update: SessionUpdate) {
        self.send(&Message::notification(
            method::SESSION_UPDATE,
            SessionNotification {
                session_id: session_id.to_string(),
                update,
                meta: None,
            },
        ));
    }

    /// Sends a request to the editor and waits for its answer. The wait ends with the
    /// caller (a flight that ended drops it); its entry goes with it.
    async fn request(&self, method: &str, params: impl serde::Serialize) -> Answer {
        let id = RequestId::Number(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        if let Ok(mut p) = self.pending.lock() {
            p.insert(id.clone(), tx);
        }
        // A request given up before its answer (its flight ended, the prompt's task
        // stopped) is withdrawn, so the editor closes what asks for it.
        struct Forget<'a>(&'a Server, RequestId);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                let unanswered = self
                    .0
                    .pending
                    .lock()
                    .ok()
                    .and_then(|mut p| p.remove(&self.1));
                if unanswered.is_some() {
                    self.0.send(&Message::notification(
                        method::CANCEL_REQUEST,
                        serde_json::json!({ "requestId": self.1 }),
                    ));
                }
            }
        }
        let _forget = Forget(self, id.clone());
        self.send(&Message::request(id, method, params));
        rx.await.unwrap_or_else(|_| {
            Err(RpcError::new(
                RpcError::INTERNAL_ERROR,
                "the editor went away before it answered",
            ))
        })
    }

    fn send(&self, message: &Message) {
        // A send fails only once the writer is gone (stdout closed): nothing to tell.
        let _ = self.out.send(message.to_line());
    }

    fn send_value(&self, value: Value) {
        let _ = self.out.send(value.to_string());
    }
}

/// The broker `discover` finds (reading the data dir's api.json off the async
/// threads), or why none was.
async fn found(discover: &Discover) -> Result<Client, String> {
    let discover = discover.clone();
    match tokio::task::spawn_blocking(move || discover()).await {
        Ok(found) => found.map_err(|e| e.to_string()),
        Err(e) => Err(format!("cannot look for the broker: {e}")),
    }
}

/// What `initialize` answers: who Relay is and what it takes.
fn initialize_response() -> InitializeResponse {
    InitializeResponse {
        protocol_version: acp::PROTOCOL_VERSION,
        agent_capabilities: AgentCapabilities {
            load_session: true,
            prompt_capabilities: PromptCapabilities::default(),
            ..Default::default()
        },
        auth_methods: Vec::new(),
        agent_info: Some(Implementation {
            name: "relay".into(),
            title: Some("Relay".into()),
            version: env!("CARGO_PKG_VERSION").into(),
        }),
    }
}

/// A request's parameters as `T`, or `-32602` saying what is wrong with them.
fn params_of<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params)
        .map_err(|e| RpcError::new(RpcError::INVALID_PARAMS, format!("invalid params: {e}")))
}

fn to_value(v: impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn json_id(id: &RequestId) -> Value {
    to_value(id)
}

/// A broker's refusal or absence as a JSON-RPC error: its words, and its code in `data`.
fn broker_error(e: ClientError) -> RpcError {
    let mut error = RpcError::new(RpcError::INTERNAL_ERROR, e.to_string());
    if let Some(code) = e.code() {
        error.data = Some(serde_json::json!({ "relay_code": code.as_str() }));
    }
    error
}

/// A token unique to this process and moment, for a new conversation's id.
fn unique() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!(
        "{ms:x}{:x}{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests;
