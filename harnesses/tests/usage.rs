//! What each adapter reports as a turn's usage, against the real pinned CLIs and a mock
//! model that reports known, exact token counts (`Reply::with_usage`): a turn of one
//! model call, and a turn with one tool call (two model calls: the call, then the
//! answer after its output). Each `TokenUsage` must be exactly the mock's counts in
//! Relay's conventions (input includes cached, output includes reasoning), added up as
//! each CLI adds them up, with the model and the cost where the CLI says.
//!
//! What the CLIs do with the numbers (checked here; see also /work/notes/USAGE28.md):
//! - Codex sums its model calls into the thread's total (`thread/tokenUsage/updated`),
//!   with cached input and reasoning kept apart: the adapter reports the total minus the
//!   turn's start.
//! - Claude Code's `result.usage` sums the turn's calls; its `total_cost_usd` is its own
//!   price of those tokens (it prices the mock's model too).
//! - Pi reports each call (assistant message) apart; the adapter sums them. Its cost is
//!   zero without a price in `models.json`, so none is reported.
//! - Qwen Code reports each call on a chunk's `_meta.usage`; the adapter sums them.
//! - Gemini CLI sums its calls in `_meta.quota` but reports no cached count and leaves
//!   the thoughts out of the output.
//! - OpenCode's prompt answer carries its last model call's usage only, each kind
//!   apart (input without the cached part, output without the reasoning).
//!
//! Each test has its own mock and home directories and checks that the CLI is gone at
//! the end. Every wait has a timeout; nothing sleeps.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use relay_harnesses::acp::AcpLauncher;
use relay_harnesses::claude::ClaudeLauncher;
use relay_harnesses::codex::CodexLauncher;
use relay_harnesses::pi::PiLauncher;
use relay_harnesses::{HarnessSession, Launcher, Spawned};
use relay_mock_model::{
    claude_env, codex_env, gemini_env, opencode_env, qwen_env, write_codex_home, write_gemini_home,
    write_opencode_home, write_pi_dir, write_qwen_home, MockModel, RecordedRequest, Reply, Usage,
};
use relay_protocol::domain::{AgentSpec, ApprovalDecision, CostSource, Harness, TokenUsage};
use relay_protocol::harness::{HarnessEvent, TurnOutcome};
use relay_tests::harness_events::{next, shut_down, within};
use serde_json::json;
use tempfile::TempDir;
use tokio::sync::mpsc::Receiver;

const WAIT: Duration = Duration::from_secs(60);

/// The one call of a one-call turn.
const ONE: Usage = Usage {
    input: 1200,
    cached: 300,
    cache_write: 100,
    output: 70,
    reasoning: 30,
};
/// The first call of a tool turn (the model asks for the tool).
const CALL: Usage = Usage {
    input: 2100,
    cached: 600,
    cache_write: 0,
    output: 40,
    reasoning: 10,
};
/// The second call of a tool turn (the model answers after the tool's output).
const ANSWER: Usage = Usage {
    input: 3300,
    cached: 1500,
    cache_write: 200,
    output: 90,
    reasoning: 25,
};

/// The mock's script: `one-call` answers with [`ONE`]; `tool-call` calls the CLI's
/// shell tool (`call`) with [`CALL`], then answers with [`ANSWER`] once the tool's output
/// is back. Anything else (a CLI's side request, which offers no tools: OpenCode's
/// title, Gemini CLI's checks) gets the default estimate.
fn script(call: fn(&RecordedRequest) -> Reply) -> impl Fn(&RecordedRequest) -> Reply {
    move |req| {
        let text = req.last_user_text().unwrap_or_default();
        let tools = req.body.get("tools").and_then(|t| t.as_array());
        if tools.is_none_or(|t| t.is_empty()) {
            Reply::text("side")
        } else if text.contains("one-call") {
            Reply::text("one answer").with_usage(ONE)
        } else if text.contains("tool-call") {
            match req.tool_output_since_prompt() {
                Some(_) => Reply::text("tool answer").with_usage(ANSWER),
                None => call(req).with_usage(CALL),
            }
        } else {
            Reply::text("side")
        }
    }
}

/// Relay's reading of `u` when the CLI reports its counts as they are.
fn relay(u: Usage, reasoning: Option<u64>) -> TokenUsage {
    TokenUsage {
        input_tokens: u.input,
        cached_input_tokens: u.cached,
        output_tokens: u.output,
        reasoning_tokens: reasoning,
        ..TokenUsage::default()
    }
}

/// Two calls added up.
fn sum(a: &TokenUsage, b: &TokenUsage) -> TokenUsage {
    TokenUsage {
        input_tokens: a.input_tokens + b.input_tokens,
        cached_input_tokens: a.cached_input_tokens + b.cached_input_tokens,
        output_tokens: a.output_tokens + b.output_tokens,
        reasoning_tokens: match (a.reasoning_tokens, b.reasoning_tokens) {
            (None, None) => None,
            (x, y) => Some(x.unwrap_or(0) + y.unwrap_or(0)),
        },
        ..TokenUsage::default()
    }
}

struct Agent {
    session: Arc<dyn HarnessSession>,
    events: Receiver<HarnessEvent>,
    conversation: String,
}

async fn start(launcher: &dyn Launcher, spec: &AgentSpec) -> Agent {
    let Spawned { session, events } = within(WAIT, "spawn", launcher.spawn(spec, None))
        .await
        .unwrap();
    let conversation = within(WAIT, "open", session.open(None)).await.unwrap().id;
    Agent {
        session,
        events,
        conversation,
    }
}

impl Agent {
    /// Runs a turn with `text`, accepting every approval, and returns its usage events
    /// in order (the last is the turn's).
    async fn turn(&mut self, text: &str, relay_turn: &str) -> Vec<TokenUsage> {
        let turn = within(
            WAIT,
            "start_turn",
            self.session
                .start_turn(&self.conversation, text, relay_turn),
        )
        .await
        .unwrap();
        let mut usages = Vec::new();
        loop {
            match next(&mut self.events, WAIT).await {
                HarnessEvent::ApprovalRequested { request_id, .. } => self
                    .session
                    .respond_approval(&request_id, ApprovalDecision::Accept)
                    .await
                    .unwrap(),
                HarnessEvent::TokenUsage { turn_id, usage } if turn_id == turn => {
                    usages.push(usage)
                }
                HarnessEvent::TurnCompleted { turn_id, outcome } if turn_id == turn => {
                    assert!(
                        matches!(outcome, TurnOutcome::Completed { .. }),
                        "{outcome:?}"
                    );
                    return usages;
                }
                _ => {}
            }
        }
    }

    async fn stop(mut self) {
        let pid = self.session.endpoint().pid().unwrap();
        shut_down(&*self.session, &mut self.events, WAIT).await;
        assert!(relay_tests::procs::group_members(pid).is_empty());
    }
}

/// The last usage of a turn, printed for the record.
fn last(what: &str, usages: &[TokenUsage]) -> TokenUsage {
    eprintln!("{what}: {usages:?}");
    usages
        .last()
        .cloned()
        .unwrap_or_else(|| panic!("{what}: no usage"))
}

#[tokio::test]
async fn codex_reports_the_threads_counts_for_the_turn() {
    let mock = MockModel::start().await.unwrap();
    mock.set_handler(script(|_| {
        Reply::exec_command_escalated("call_1", "echo hi", "the test asks")
    }));
    let home = TempDir::new().unwrap();
    write_codex_home(home.path(), &mock.url()).unwrap();
    let mut spec = AgentSpec::new(
        "a1",
        Harness::CodexAppServer,
        home.path().display().to_string(),
    );
    spec.env.extend(codex_env(home.path()));
    let mut agent = start(&CodexLauncher, &spec).await;

    // Codex names the model of the thread ("mock-model", its config's).
    let with_model = |u: TokenUsage| TokenUsage {
        model: Some("mock-model".into()),
        ..u
    };
    let one = last("codex one call", &agent.turn("one-call", "t1").await);
    assert_eq!(one, with_model(relay(ONE, Some(ONE.reasoning))));
    // The second turn counts from the thread's total at its start.
    let tool = last("codex tool call", &agent.turn("tool-call", "t2").await);
    assert_eq!(
        tool,
        with_model(sum(
            &relay(CALL, Some(CALL.reasoning)),
            &relay(ANSWER, Some(ANSWER.reasoning))
        ))
    );
    agent.stop().await;
}

#[tokio::test]
async fn claude_code_sums_its_calls_and_prices_them() {
    let mock = MockModel::start().await.unwrap();
    mock.set_handler(script(|_| {
        Reply::function_call(
            "toolu_1",
            "Bash",
            &json!({"command": "echo hi", "description": "the test asks"}),
        )
    }));
    let config = TempDir::new().unwrap();
    let work = TempDir::new().unwrap();
    let mut spec = AgentSpec::new(
        "a1",
        Harness::ClaudeStreamJson,
        work.path().display().to_string(),
    );
    spec.env.extend(claude_env(config.path(), &mock.base_url()));
    spec.model = Some("mock-model".into());
    let mut agent = start(&ClaudeLauncher, &spec).await;

    let one = last("claude one call", &agent.turn("one-call", "t1").await);
    assert_eq!(one.model.as_deref(), Some("mock-model"));
    assert_eq!(one.cost_source, Some(CostSource::Harness));
    eprintln!("claude one-call cost: {:?}", one.cost_micro_usd);
    assert_eq!(
        TokenUsage {
            model: None,
            cost_micro_usd: None,
            cost_source: None,
            ..one
        },
        relay(ONE, None)
    );
    // Claude Code prices a model it does not know (the mock's) at $5 per million input
    // tokens, $6.25 written to the cache, $0.50 read from it, and $25 per million
    // output tokens: 800 x 5 + 100 x 6.25 + 300 x 0.5 + 70 x 25 = 6525 micro-dollars.
    let price = |u: Usage| {
        let uncached = u.input - u.cached - u.cache_write;
        (uncached * 5_000_000
            + u.cache_write * 6_250_000
            + u.cached * 500_000
            + u.output * 25_000_000)
            .div_ceil(1_000_000)
    };
    assert_eq!(one.cost_micro_usd, Some(price(ONE)));
    assert_eq!(price(ONE), 6525);
    let tool = last("claude tool call", &agent.turn("tool-call", "t2").await);
    eprintln!("claude tool-call cost: {:?}", tool.cost_micro_usd);
    assert_eq!(
        TokenUsage {
            model: None,
            cost_micro_usd: None,
            cost_source: None,
            ..tool
        },
        sum(&relay(CALL, None), &relay(ANSWER, None))
    );
    // Its `total_cost_usd` adds up over the process (the first turn's included): the
    // turn's is the difference.
    assert_eq!(tool.cost_micro_usd, Some(price(CALL) + price(ANSWER)));
    let conversation = agent.conversation.clone();
    agent.stop().await;

    // A new process resuming the conversation counts its cost from zero again.
    let Spawned { session, events } = ClaudeLauncher.spawn(&spec, None).await.unwrap();
    let opened = within(WAIT, "open", session.open(Some(&conversation)))
        .await
        .unwrap();
    assert_eq!(opened.lost, None);
    let mut agent = Agent {
        session,
        events,
        conversation: opened.id,
    };
    let again = last("claude resumed", &agent.turn("one-call", "t3").await);
    assert_eq!(again.cost_micro_usd, Some(price(ONE)));
    assert_eq!(again.input_tokens, ONE.input);
    agent.stop().await;
}

#[tokio::test]
async fn pi_sums_its_messages() {
    let mock = MockModel::start().await.unwrap();
    mock.set_handler(script(|_| {
        Reply::function_call("toolu_1", "bash", &json!({"command": "echo hi"}))
    }));
    let dir = TempDir::new().unwrap();
    let env = write_pi_dir(dir.path(), &mock.base_url()).unwrap();
    let mut spec = AgentSpec::new("a1", Harness::PiRpc, dir.path().display().to_string());
    spec.args = vec!["--provider".into(), "mock".into()];
    spec.model = Some("mock-model".into());
    spec.env.extend(env);
    let mut agent = start(&PiLauncher, &spec).await;

    let with_model = |u: TokenUsage| TokenUsage {
        model: Some("mock-model".into()),
        ..u
    };
    let one = last("pi one call", &agent.turn("one-call", "t1").await);
    assert_eq!(one, with_model(relay(ONE, None)));
    let usages = agent.turn("tool-call", "t2").await;
    // One report per model call, the running total.
    assert_eq!(usages.len(), 2, "{usages:?}");
    assert_eq!(usages[0], with_model(relay(CALL, None)));
    let tool = last("pi tool call", &usages);
    assert_eq!(
        tool,
        with_model(sum(&relay(CALL, None), &relay(ANSWER, None)))
    );
    agent.stop().await;
}

#[tokio::test]
async fn qwen_code_sums_its_calls() {
    let mock = MockModel::start().await.unwrap();
    mock.set_handler(script(|_| {
        Reply::shell_command("call_1", "echo hi", "the test asks")
    }));
    let home = TempDir::new().unwrap();
    let work = TempDir::new().unwrap();
    write_qwen_home(home.path()).unwrap();
    let mut spec = AgentSpec::new("a1", Harness::QwenAcp, work.path().display().to_string());
    spec.env.extend(qwen_env(home.path(), &mock.url()));
    let mut agent = start(&AcpLauncher::new(Harness::QwenAcp), &spec).await;

    let one = last("qwen one call", &agent.turn("one-call", "t1").await);
    assert_eq!(one, relay(ONE, Some(ONE.reasoning)));
    let tool = last("qwen tool call", &agent.turn("tool-call", "t2").await);
    assert_eq!(
        tool,
        sum(
            &relay(CALL, Some(CALL.reasoning)),
            &relay(ANSWER, Some(ANSWER.reasoning))
        )
    );
    agent.stop().await;
}

#[tokio::test]
async fn gemini_cli_reports_the_turns_counts() {
    let mock = MockModel::start().await.unwrap();
    mock.set_handler(script(|_| {
        Reply::shell_command("call_1", "echo hi", "the test asks")
    }));
    let home = TempDir::new().unwrap();
    let work = TempDir::new().unwrap();
    write_gemini_home(home.path()).unwrap();
    let mut spec = AgentSpec::new("a1", Harness::GeminiAcp, work.path().display().to_string());
    spec.env.extend(gemini_env(home.path(), &mock.base_url()));
    let mut agent = start(&AcpLauncher::new(Harness::GeminiAcp), &spec).await;

    // Gemini CLI reports the turn's `promptTokenCount` and `candidatesTokenCount`
    // summed over its calls, and its model: no cached count, and the output without
    // the thoughts (`candidatesTokenCount` leaves them out), which it does not report.
    let gemini = |u: Usage| TokenUsage {
        input_tokens: u.input,
        output_tokens: u.output - u.reasoning,
        model: Some("gemini-2.5-flash".into()),
        ..TokenUsage::default()
    };
    let one = last("gemini one call", &agent.turn("one-call", "t1").await);
    assert_eq!(one, gemini(ONE));
    let tool = last("gemini tool call", &agent.turn("tool-call", "t2").await);
    let both = sum(&gemini(CALL), &gemini(ANSWER));
    assert_eq!(
        tool,
        TokenUsage {
            model: Some("gemini-2.5-flash".into()),
            ..both
        }
    );
    agent.stop().await;
}

#[tokio::test]
async fn opencode_reports_the_turns_counts() {
    let mock = MockModel::start().await.unwrap();
    mock.set_handler(script(|_| {
        Reply::function_call(
            "call_1",
            "bash",
            &json!({"command": "echo hi", "description": "the test asks"}),
        )
    }));
    let home = TempDir::new().unwrap();
    let work = TempDir::new().unwrap();
    write_opencode_home(home.path(), &mock.url()).unwrap();
    let mut spec = AgentSpec::new(
        "a1",
        Harness::OpencodeAcp,
        work.path().display().to_string(),
    );
    spec.env.extend(opencode_env(home.path()));
    let mut agent = start(&AcpLauncher::new(Harness::OpencodeAcp), &spec).await;

    // OpenCode counts each kind apart (input without the cached part, output without
    // the reasoning); the adapter puts them together. Its prompt answer carries the
    // LAST model call's usage only: a tool turn reports its answer's, not the call's.
    let one = last("opencode one call", &agent.turn("one-call", "t1").await);
    assert_eq!(one, relay(ONE, Some(ONE.reasoning)));
    let tool = last("opencode tool call", &agent.turn("tool-call", "t2").await);
    assert_eq!(tool, relay(ANSWER, Some(ANSWER.reasoning)));
    agent.stop().await;
}
