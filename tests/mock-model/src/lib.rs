//! Mock model servers, so tests drive the real agent CLIs offline.
//!
//! Parts:
//! - [`MockModel`]: one server on `127.0.0.1:<random port>` that speaks every API the
//!   pinned CLIs use: OpenAI Responses (`POST …/responses`, Codex; `responses.rs`),
//!   Anthropic Messages (`POST …/messages`, Claude Code and Pi; `messages.rs`), the
//!   Gemini API (`POST …/models/<m>:streamGenerateContent` and `:generateContent`,
//!   Gemini CLI; `gemini.rs`) and OpenAI chat completions (`POST …/chat/completions`,
//!   OpenCode and Qwen Code; `chat.rs`). All render the same [`Reply`], streamed or as
//!   one JSON body as the request asks. `GET …/models` answers a one-model list; `HEAD /`,
//!   `…/messages/count_tokens` and `…:countTokens` answer too; anything else is a 404
//!   (and is recorded, so a test can see what a CLI asked for).
//! - [`Reply`]: what to answer one model request with: streamed text (optionally slow), a
//!   function call (a Responses `function_call` item, a Messages `tool_use` block, a
//!   Gemini `functionCall` part or a chat `tool_calls` delta; e.g. an escalated
//!   `exec_command` that makes Codex ask for approval, or [`Reply::shell_command`]), a
//!   file written with the CLI's own shell tool ([`Reply::write_file`], one approval rule
//!   accepts it in every CLI: [`WRITE_FILE_RULE`]) or with its own edit tool
//!   ([`Reply::edit_file`]: Codex's freeform `apply_patch`, a Responses
//!   `custom_tool_call`; Claude Code's `Write`), a failure, or a hang that never
//!   completes.
//! - [`Usage`]: the token counts a reply reports. By default a reply reports input and
//!   output estimated at 4 bytes a token and nothing cached or reasoned; a test sets exact
//!   counts for one reply with [`Reply::with_usage`] (e.g.
//!   `mock.push(Reply::text("hi").with_usage(Usage::new(1000, 400, 50, 20)))`: 1000 input
//!   tokens of which 400 cached, 50 output of which 20 reasoning), or for every reply
//!   without its own with [`MockModel::set_usage`] (the default echo and handler replies
//!   included). Each API gets the counts in its own spelling (`usage.rs`): Responses
//!   `input_tokens_details.cached_tokens` and `output_tokens_details.reasoning_tokens`,
//!   Messages `cache_read_input_tokens` (its `input_tokens` is the uncached rest), chat
//!   completions `prompt_tokens_details.cached_tokens`, Gemini `cachedContentTokenCount`
//!   and `thoughtsTokenCount` (its `candidatesTokenCount` leaves the thoughts out).
//! - [`RecordedRequest`]: every request as received, JSON body parsed, with helpers that
//!   read the conversation the CLI sent in any of the APIs ([`all_input_text`],
//!   [`RecordedRequest::carries`]); [`MockModel::requests_with`] and
//!   [`MockModel::requests_prompted`] find the requests that carry a text, or were
//!   prompted by it.
//! - `requests.rs`: [`RecordedRequest`] and [`all_input_text`].
//! - `tools.rs`: the file-writing calls ([`Reply::write_file`], [`Reply::edit_file`]) and
//!   how each becomes the calling CLI's tool call.
//! - `homes.rs`: what points each CLI at the mock ([`write_codex_home`],
//!   [`claude_env`], [`write_pi_dir`], [`write_gemini_home`], [`write_opencode_home`],
//!   [`write_qwen_home`] and their `*_env`).
//!
//! Depends on: none.
//!
//! Layering (a module uses only the modules after its arrow; `tests/tests/module_graph/`
//! checks it):
//! - `homes`, `http`, `requests`, `tools`, `usage` -> none
//! - `chat`, `gemini`, `messages`, `responses` -> `http`, `usage`
//!
//! Data flow: an accept loop spawns one task per connection; each reads one request,
//! records it, picks a reply (the scripted queue first, then the handler set with
//! [`MockModel::set_handler`], then the default echo `ok: <last user text>`), streams it,
//! and closes the connection. Dropping the [`MockModel`] stops the accept loop and every
//! connection task, hanging ones included.

mod chat;
mod gemini;
mod homes;
mod http;
mod messages;
mod requests;
mod responses;
mod tools;
mod usage;

pub use requests::{all_input_text, RecordedRequest};
pub use tools::{
    apply_patch_add_file_text, write_file_command, CODEX_APPLY_PATCH_MODEL, WRITE_FILE_RULE,
    WRITE_FILE_SCRIPT,
};
pub use usage::Usage;

pub use homes::{
    claude_env, codex_env, gemini_env, opencode_env, qwen_env, write_codex_home,
    write_codex_home_retrying, write_gemini_home, write_opencode_home, write_pi_dir,
    write_qwen_home, GEMINI_MODEL,
};

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::http::Conn;

/// What the mock answers to one model request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An assistant message streamed as one `response.output_text.delta` per chunk, with
    /// `delay` after every chunk but the last (a "slow stream").
    Text {
        chunks: Vec<String>,
        delay: Duration,
    },
    /// A function call output item; `arguments` is the JSON text the model would send.
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
        /// The tool's namespace: an MCP server's tools are `mcp__<server>`. Responses
        /// carry it as the item's `namespace`; Messages as the tool name's prefix
        /// (`mcp__<server>__<tool>`), as each CLI names MCP tools.
        namespace: Option<String>,
    },
    /// A failure inside the stream: `response.created` then `response.failed` with this
    /// error (Responses), an `error` event (Messages), an `error` chunk (Gemini, chat
    /// completions; a 400 when not streamed). Only Responses and Messages send `code`.
    Failed { code: String, message: String },
    /// `response.created`, then nothing until the client goes away or the mock is dropped.
    Hang,
    /// A plain HTTP error status with a body, no stream.
    HttpError { status: u16, body: String },
    /// Write `content` to `path` (relative to the agent's working directory) with the
    /// CLI's own shell tool: [`Reply::write_file`]. Turned into a [`Reply::FunctionCall`]
    /// once the request shows which API and tools the CLI has.
    WriteFile {
        call_id: String,
        path: String,
        content: String,
    },
    /// A new file `path` holding `content`, written with the CLI's own edit tool:
    /// [`Reply::edit_file`]. Turned into that tool's call like [`Reply::WriteFile`].
    EditFile {
        call_id: String,
        path: String,
        content: String,
    },
    /// A call of a freeform tool (a Responses `custom_tool_call`, e.g. Codex's
    /// `apply_patch`): `input` is the raw text the tool takes. Responses only.
    CustomToolCall {
        call_id: String,
        name: String,
        input: String,
    },
    /// `reply`, reporting exactly `usage`: [`Reply::with_usage`] (`usage.rs`).
    WithUsage { reply: Box<Reply>, usage: Usage },
}

impl Reply {
    /// The whole text in one delta.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text {
            chunks: vec![text.into()],
            delay: Duration::ZERO,
        }
    }

    /// One delta per chunk, as fast as possible.
    pub fn chunks<S: Into<String>>(chunks: impl IntoIterator<Item = S>) -> Self {
        Self::slow_chunks(chunks, Duration::ZERO)
    }

    /// One delta per chunk, `delay` between chunks.
    pub fn slow_chunks<S: Into<String>>(
        chunks: impl IntoIterator<Item = S>,
        delay: Duration,
    ) -> Self {
        Self::Text {
            chunks: chunks.into_iter().map(Into::into).collect(),
            delay,
        }
    }

    /// A function call named `name` with `arguments` serialised to JSON text.
    pub fn function_call(call_id: impl Into<String>, name: &str, arguments: &Value) -> Self {
        Self::FunctionCall {
            call_id: call_id.into(),
            name: name.to_string(),
            arguments: arguments.to_string(),
            namespace: None,
        }
    }

    /// A call of tool `tool` of the MCP server named `server` in the CLI's
    /// configuration: Codex's `function_call` in namespace `mcp__<server>`, Claude Code's
    /// `tool_use` of `mcp__<server>__<tool>`.
    pub fn mcp_call(
        call_id: impl Into<String>,
        server: &str,
        tool: &str,
        arguments: &Value,
    ) -> Self {
        Self::FunctionCall {
            call_id: call_id.into(),
            name: tool.to_string(),
            arguments: arguments.to_string(),
            namespace: Some(format!("mcp__{server}")),
        }
    }

    /// Codex's `exec_command` asking to run `cmd` outside the sandbox. Under
    /// `approval_policy = "on-request"` this makes Codex ask the client for approval.
    pub fn exec_command_escalated(
        call_id: impl Into<String>,
        cmd: &str,
        justification: &str,
    ) -> Self {
        Self::function_call(
            call_id,
            "exec_command",
            &json!({
                "cmd": cmd,
                "sandbox_permissions": "require_escalated",
                "justification": justification,
            }),
        )
    }

    /// The shell tool call of Gemini CLI (`run_shell_command`) and Qwen Code
    /// (`run_shell_command`), `{"command": cmd, "description": description}`; OpenCode's
    /// is [`Reply::function_call`] of `bash` with `{"command", "description"}`.
    pub fn shell_command(call_id: impl Into<String>, cmd: &str, description: &str) -> Self {
        Self::function_call(
            call_id,
            "run_shell_command",
            &json!({"command": cmd, "description": description}),
        )
    }

    /// A `response.failed` event with a generic server error.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed {
            code: "server_error".to_string(),
            message: message.into(),
        }
    }

    pub fn hang() -> Self {
        Self::Hang
    }

    /// The full text of a text reply (empty for the others).
    pub fn full_text(&self) -> String {
        match self {
            Self::Text { chunks, .. } => chunks.concat(),
            Self::WithUsage { reply, .. } => reply.full_text(),
            _ => String::new(),
        }
    }
}

type Handler = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>;

#[derive(Default)]
struct State {
    queue: VecDeque<Reply>,
    handler: Option<Handler>,
    /// What a reply reports when it has no usage of its own ([`MockModel::set_usage`]).
    usage: Option<Usage>,
    /// Model requests (any [`Wire`]).
    model_requests: Vec<RecordedRequest>,
    /// Everything, model requests included, in arrival order.
    all_requests: Vec<RecordedRequest>,
}

struct Shared {
    state: Mutex<State>,
    /// Number of model requests so far, for [`MockModel::wait_for_requests`].
    model_count: watch::Sender<usize>,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking handler must not make every later request panic too.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A mock model server (OpenAI Responses, Anthropic Messages, Gemini, OpenAI chat
/// completions) on loopback. Dropping it stops it.
pub struct MockModel {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
}

impl MockModel {
    /// Binds `127.0.0.1:0` and starts serving.
    pub async fn start() -> std::io::Result<MockModel> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            model_count: watch::channel(0).0,
            next_id: AtomicU64::new(0),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        tokio::spawn(accept_loop(listener, shared.clone(), shutdown_rx));
        Ok(MockModel {
            addr,
            shared,
            shutdown,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for clients that add the API's prefix themselves
    /// (Anthropic's `/v1`, Gemini's `/v1beta`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`, the OpenAI-style base URL (Codex's `base_url`,
    /// OpenCode's `baseURL`, Qwen Code's `OPENAI_BASE_URL`).
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues a reply for the next model request (first in, first out).
    pub fn push(&self, reply: Reply) {
        self.shared.lock().queue.push_back(reply);
    }

    /// Answers model requests the queue does not, instead of the default echo.
    pub fn set_handler(&self, handler: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static) {
        self.shared.lock().handler = Some(Arc::new(handler));
    }

    /// Every reply without a usage of its own ([`Reply::with_usage`]) reports `usage`
    /// from now on, the default echo and the handler's replies included; `None` goes
    /// back to the 4-bytes-a-token estimate.
    pub fn set_usage(&self, usage: Option<Usage>) {
        self.shared.lock().usage = usage;
    }

    /// Model requests (any [`Wire`]) so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().model_requests.clone()
    }

    /// Model requests whose conversation ([`all_input_text`]) contains `text`, in
    /// arrival order: e.g. the requests of the turn whose prompt carried a marker.
    pub fn requests_with(&self, text: &str) -> Vec<RecordedRequest> {
        let requests = self.requests();
        requests.into_iter().filter(|r| r.carries(text)).collect()
    }

    /// Model requests whose last user text contains `marker` (the requests of that
    /// prompt's turn, not of later turns that only carry it as history).
    pub fn requests_prompted(&self, marker: &str) -> Vec<RecordedRequest> {
        let requests = self.requests();
        requests
            .into_iter()
            .filter(|r| r.last_user_text().is_some_and(|t| t.contains(marker)))
            .collect()
    }

    /// Every request so far (model requests, `GET /v1/models`, unknown paths).
    pub fn all_requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().all_requests.clone()
    }

    /// Waits until at least `n` model requests have arrived, then returns them all.
    pub async fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedRequest>, tokio::time::error::Elapsed> {
        let mut rx = self.shared.model_count.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|count| *count >= n))
            .await?
            // The sender lives in `self.shared`, so it cannot be dropped while we wait.
            .ok();
        Ok(self.requests())
    }
}

impl Drop for MockModel {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// The API a model request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// OpenAI Responses (`POST …/responses`): Codex.
    Responses,
    /// Anthropic Messages (`POST …/messages`): Claude Code, Pi.
    Messages,
    /// Gemini `POST …:streamGenerateContent`: Gemini CLI.
    GeminiStream,
    /// Gemini `POST …:generateContent` (one JSON answer): Gemini CLI's side requests.
    GeminiWhole,
    /// OpenAI chat completions (`POST …/chat/completions`): OpenCode, Qwen Code.
    Chat,
}

/// Where the reply to a model request comes from.
enum Pick {
    Queued(Reply),
    Handler(Handler),
    Default,
}

/// The reply to a model request when nothing is queued and no handler is set.
fn default_reply(req: &RecordedRequest) -> Reply {
    Reply::text(format!("ok: {}", req.last_user_text().unwrap_or_default()))
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let shared = shared.clone();
                    let mut shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        let mut conn = Conn::new(stream);
                        tokio::select! {
                            _ = shutdown.changed() => {}
                            result = serve(&mut conn, &shared) => {
                                if let Err(err) = result {
                                    tracing::debug!(%err, "mock model connection ended");
                                }
                            }
                        }
                    });
                }
                Err(err) => {
                    tracing::warn!(%err, "mock model accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

async fn serve(conn: &mut Conn, shared: &Shared) -> std::io::Result<()> {
    let Some(req) = http::read_request(conn).await? else {
        return Ok(());
    };
    let body = if req.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&req.body).unwrap_or_else(|err| {
            tracing::warn!(%err, encoding = ?req.header("content-encoding"), "mock model: body is not JSON");
            Value::Null
        })
    };
    let recorded = RecordedRequest {
        method: req.method.clone(),
        path: req.path().to_string(),
        query: req
            .target
            .split_once('?')
            .map(|(_, q)| q.to_string())
            .unwrap_or_default(),
        headers: req.headers.clone(),
        body,
    };
    tracing::debug!(method = %recorded.method, path = %recorded.path, "mock model request");
    let wire = match recorded.method.as_str() {
        "POST" if recorded.path.ends_with("/responses") => Some(Wire::Responses),
        "POST" if recorded.path.ends_with("/messages") => Some(Wire::Messages),
        "POST" if recorded.path.ends_with(":streamGenerateContent") => Some(Wire::GeminiStream),
        "POST" if recorded.path.ends_with(":generateContent") => Some(Wire::GeminiWhole),
        "POST" if recorded.path.ends_with("/chat/completions") => Some(Wire::Chat),
        _ => None,
    };
    let is_model = wire.is_some();
    let is_models = recorded.method == "GET" && recorded.path.ends_with("/models");

    let (pick, mock_usage) = {
        let mut state = shared.lock();
        state.all_requests.push(recorded.clone());
        if is_model {
            state.model_requests.push(recorded.clone());
            let count = state.model_requests.len();
            shared.model_count.send_replace(count);
            Some(match (state.queue.pop_front(), &state.handler) {
                (Some(reply), _) => Pick::Queued(reply),
                (None, Some(handler)) => Pick::Handler(handler.clone()),
                (None, None) => Pick::Default,
            })
        } else {
            None
        }
        .map(|pick| (pick, state.usage))
        .unzip()
    };

    let Some(pick) = pick else {
        if is_models {
            let body = json!({
                "object": "list",
                "data": [{"id": "mock-model", "object": "model", "created": 0, "owned_by": "relay"}],
                "models": [],
            });
            return http::write_response(
                conn,
                200,
                "application/json",
                body.to_string().as_bytes(),
            )
            .await;
        }
        if recorded.method == "HEAD" {
            // Claude Code checks that its base URL answers.
            return http::write_response(conn, 200, "text/plain", b"").await;
        }
        if recorded.path.ends_with("/messages/count_tokens") {
            let tokens = approx_tokens(&all_input_text(&recorded));
            let body = json!({ "input_tokens": tokens }).to_string();
            return http::write_response(conn, 200, "application/json", body.as_bytes()).await;
        }
        if recorded.method == "POST" && recorded.path.ends_with(":countTokens") {
            return gemini::count_tokens(conn, &recorded).await;
        }
        tracing::info!(method = %recorded.method, path = %recorded.path, "mock model: unknown path");
        return http::write_response(
            conn,
            404,
            "application/json",
            br#"{"error":{"message":"not found"}}"#,
        )
        .await;
    };
    let reply = match pick {
        Pick::Queued(reply) => reply,
        // Called outside the lock: a handler may be slow, or use the mock itself.
        Pick::Handler(handler) => handler(&recorded),
        Pick::Default => default_reply(&recorded),
    };
    let (reply, usage) = reply.without_usage();
    let usage = usage.or(mock_usage.flatten());
    let reply = match wire {
        Some(wire) => reply.for_request(wire, &recorded),
        None => reply,
    };
    if let Reply::HttpError { status, body } = &reply {
        return http::write_response(conn, *status, "application/json", body.as_bytes()).await;
    }
    match wire {
        Some(Wire::Messages) => messages::stream(conn, shared, &recorded, reply, usage).await,
        Some(Wire::GeminiStream) => gemini::stream(conn, shared, &recorded, reply, usage).await,
        Some(Wire::GeminiWhole) => gemini::generate(conn, shared, &recorded, reply, usage).await,
        Some(Wire::Chat) => chat::complete(conn, shared, &recorded, reply, usage).await,
        _ => responses::stream(conn, shared, &recorded, reply, usage).await,
    }
}

/// Sleeps for `delay`, or less if the client closes the connection first; `Ok(false)`
/// then. The request is already read, so any read that returns means the client is gone.
async fn sleep_unless_hangup(conn: &mut Conn, delay: Duration) -> std::io::Result<bool> {
    let mut buf = [0u8; 256];
    tokio::select! {
        _ = tokio::time::sleep(delay) => Ok(true),
        read = conn.read(&mut buf) => {
            read?;
            Ok(false)
        }
    }
}

/// Holds a stream open until the client hangs up (an interrupted turn drops its request)
/// or the mock is dropped (the caller's select ends the task): [`Reply::Hang`].
async fn hold_until_hangup(conn: &mut Conn) -> std::io::Result<()> {
    let mut buf = [0u8; 1024];
    while conn.read(&mut buf).await? > 0 {}
    Ok(())
}

/// A stable, cheap token estimate (4 bytes a token), so usage numbers are deterministic.
fn approx_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}
