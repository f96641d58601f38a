//! The three harnesses these tests run (Codex, Claude Code, Qwen Code), how each is
//! registered against the mock, and the mock's script: `exec: CMD` anywhere in the last
//! user text (Qwen Code puts its own context in the user message too) makes the CLI's
//! shell tool run CMD (Codex's escalated `exec_command`, Claude Code's `Bash`, Qwen
//! Code's `run_shell_command`; each asks for approval first), then the model answers
//! `outputs: <the tool's output>`; anything else is answered `ok`.

use relay_mock_model::{qwen_env, write_qwen_home, RecordedRequest, Reply, Usage};
use relay_protocol::domain::{CostSource, TokenUsage};
use relay_tests::agents::{state, Env};
use serde_json::{json, Value};

/// How long one turn of a real CLI may take on a loaded machine.
pub const TURN: u64 = 90;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cli {
    Codex,
    Claude,
    Qwen,
}

impl Cli {
    /// The mock's script is set, nothing registered yet.
    pub async fn env() -> Env {
        let env = Env::start().await;
        env.mock.set_handler(script);
        env
    }

    /// Registers agent `name` of this harness, pointed at the mock, with `extra`
    /// arguments of `relay agent add`. Each Qwen Code agent gets a HOME of its own (it
    /// rewrites its settings file at start).
    pub fn add(self, env: &Env, name: &str, extra: &[&str]) {
        match self {
            Cli::Codex => env.add_agent(name, extra),
            Cli::Claude => env.add_claude(name, extra),
            Cli::Qwen => {
                let home = env.tmp.path().join(format!("qwen-{name}"));
                write_qwen_home(&home).unwrap();
                let vars: Vec<String> = qwen_env(&home, &env.mock.url())
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let work = env.work.display().to_string();
                let mut args = vec!["agent", "add", name, "--harness", "qwen", "--cwd", &work];
                for kv in &vars {
                    args.extend(["--env", kv]);
                }
                args.extend_from_slice(extra);
                env.relay.cli_ok(&args);
            }
        }
    }

    /// The approval's `detail` for `cmd`: the command as it will run (Codex and Claude
    /// Code run it with a shell's `-c`; Relay unwraps that to match it).
    pub fn detail(self, cmd: &str) -> String {
        match self {
            Cli::Codex => format!("/bin/bash -lc '{cmd}'"),
            Cli::Claude => format!("bash -c '{cmd}'"),
            Cli::Qwen => cmd.to_string(),
        }
    }
}

/// What a model call of one CLI reports, by step of the turn: each harness and step its
/// own counts, so a sum shows which calls it counted. Claude Code's input has cache
/// writes (the Messages API alone has them; no reasoning count there); the others
/// reasoning. Cache writes a multiple of 4 and reads even: Claude Code's own cost of
/// them is whole micro-dollars.
pub fn mock_usage(cli: Cli, step: Step) -> Usage {
    match (cli, step) {
        (Cli::Codex, Step::Text) => Usage::new(1200, 300, 70, 30),
        (Cli::Codex, Step::Call) => Usage::new(2100, 600, 40, 10),
        (Cli::Codex, Step::Answer) => Usage::new(3300, 1500, 90, 25),
        (Cli::Claude, Step::Text) => Usage::new(2200, 500, 90, 0).with_cache_write(100),
        (Cli::Claude, Step::Call) => Usage::new(2400, 800, 40, 0).with_cache_write(200),
        (Cli::Claude, Step::Answer) => Usage::new(3600, 1600, 60, 0),
        (Cli::Qwen, Step::Text) => Usage::new(3200, 700, 110, 20),
        (Cli::Qwen, Step::Call) => Usage::new(4100, 900, 50, 5),
        (Cli::Qwen, Step::Answer) => Usage::new(5300, 2500, 130, 15),
    }
}

/// One model call of a turn: a text answer, a tool call, the answer after the tool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    Text,
    Call,
    Answer,
}

/// What Relay must record for a turn of `cli` made of `steps`, before any price table:
/// every adapter adds its turn's calls up (cache writes are input, never cached);
/// Claude Code's cost is its own, of a model it does not know (the mock's): $5 per
/// million input tokens, $6.25 written to the cache, $0.50 read from it, $25 output.
pub fn relay_usage(cli: Cli, steps: &[Step]) -> TokenUsage {
    let calls: Vec<Usage> = steps.iter().map(|s| mock_usage(cli, *s)).collect();
    let sum = |f: fn(&Usage) -> u64| calls.iter().map(f).sum::<u64>();
    let claude_cost = calls
        .iter()
        .map(|u| {
            (u.input - u.cached - u.cache_write) * 5
                + u.cache_write * 25 / 4
                + u.cached / 2
                + u.output * 25
        })
        .sum();
    TokenUsage {
        input_tokens: sum(|u| u.input),
        cached_input_tokens: sum(|u| u.cached),
        output_tokens: sum(|u| u.output),
        reasoning_tokens: (cli != Cli::Claude).then(|| sum(|u| u.reasoning)),
        model: (cli != Cli::Qwen).then(|| "mock-model".to_string()),
        cost_micro_usd: (cli == Cli::Claude).then_some(claude_cost),
        cost_source: (cli == Cli::Claude).then_some(CostSource::Harness),
    }
}

/// The mock's answer (see the module docs), with [`mock_usage`]. Which CLI asks is told
/// by its shell tool.
pub fn script(req: &RecordedRequest) -> Reply {
    let cli = if req.offers_tool("Bash") {
        Cli::Claude
    } else if req.offers_tool("run_shell_command") {
        Cli::Qwen
    } else {
        Cli::Codex
    };
    let text = req.last_user_text().unwrap_or_default();
    let Some((_, rest)) = text.split_once("exec:") else {
        return Reply::text("ok").with_usage(mock_usage(cli, Step::Text));
    };
    let cmd = rest.lines().next().unwrap_or_default().trim();
    if let Some(output) = req.tool_output_since_prompt() {
        return Reply::text(format!("outputs: {output}")).with_usage(mock_usage(cli, Step::Answer));
    }
    // Unique per request (Claude Code drops a call whose id it saw before).
    let call_id = format!("toolu_{}", req.messages().len() + req.input().len());
    let call = match cli {
        Cli::Claude => Reply::function_call(
            call_id,
            "Bash",
            &json!({"command": cmd, "description": "the test asks"}),
        ),
        Cli::Qwen => Reply::shell_command(call_id, cmd, "the test asks"),
        Cli::Codex => Reply::exec_command_escalated(call_id, cmd, "the test asks"),
    };
    call.with_usage(mock_usage(cli, Step::Call))
}

pub fn ended(f: &Value) -> bool {
    matches!(state(f), "completed" | "failed" | "cancelled")
}

/// Asks `agent` to run `cmd`; waits until the flight waits for a person, and returns the
/// flight and its pending approval (checked to show `cmd` as it will run).
pub async fn ask_waiting(env: &Env, cli: Cli, agent: &str, cmd: &str) -> (String, Value) {
    let id = env.ask_no_wait(agent, &format!("exec: {cmd}"));
    let a = env.wait_approval(&id).await;
    assert_eq!(
        (a["state"].as_str(), a["kind"].as_str()),
        (Some("pending"), Some("command")),
        "{cli:?}: {a}"
    );
    assert_eq!(a["detail"], cli.detail(cmd), "{cli:?}: {a}");
    env.wait_flight(&id, TURN, |f| state(f) == "waiting").await;
    (id, a)
}

/// Waits for the flight's end; it must have completed.
pub async fn completed(env: &Env, id: &str) -> Value {
    let f = env.wait_flight(id, TURN, ended).await;
    assert_eq!(state(&f), "completed", "{f}\n{}", env.relay.log_text());
    f
}

/// The flights of `agent`, oldest first.
pub fn flights_of(env: &Env, agent: &str) -> Vec<Value> {
    let all = env.relay.cli_json(&["flights", "--agent", agent, "--json"]);
    let mut all = all.as_array().unwrap().clone();
    all.sort_by_key(|f| f["created_at"].as_u64());
    all
}

/// Waits until the flight has ended and carries its usage (recorded from the turn's
/// last usage report, which may come with its end); returns the flight.
pub async fn with_usage(env: &Env, id: &str) -> Value {
    let f = env
        .wait_flight(id, TURN, |f| ended(f) && !f["usage"].is_null())
        .await;
    assert_eq!(state(&f), "completed", "{f}");
    f
}

/// `relay usage ARGS --json`.
pub fn usage_report(env: &Env, args: &[&str]) -> Value {
    let mut all = vec!["usage"];
    all.extend_from_slice(args);
    all.push("--json");
    env.relay.cli_json(&all)
}
