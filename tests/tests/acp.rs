//! The ACP presets with the real pinned CLIs (Gemini CLI, OpenCode, Qwen Code) against
//! the mock model, through a real `relay up` and its CLI: each answers `relay ask` with
//! streamed text; a shell tool call becomes a Relay approval, accepted (the command
//! runs), declined by a person or by the agent's `--auto-decline` rule, which reads the
//! command as it will run (it does not run); `relay interrupt` cancels a slow turn;
//! after `kill -9` of the broker the same session is reopened (resume or load) and the
//! next model request carries the first turn, while the load's replay is not shown;
//! a session the CLI no longer has is replaced and recorded as `thread_lost`; `relay
//! replay` shows a turn whole.
//!
//! One test per CLI, each one broker and one agent through all of it, in the order the
//! checks build on; nextest runs the three at once. Gemini CLI must not load a session
//! in the minute it was created (see `relay_harnesses::acp`): its reload waits for the
//! next minute, so its test takes up to a minute longer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use relay_mock_model::{
    all_input_text, gemini_env, opencode_env, qwen_env, write_gemini_home, write_opencode_home,
    write_qwen_home, RecordedRequest, Reply,
};
use relay_tests::agents::{state, Env};
use relay_tests::procs;
use serde_json::{json, Value};

/// The mock's answers, by a marker anywhere in the last user text (the CLIs put their
/// own context in the user message too): `chunks: WORDS` streams the words, `slow:
/// WORDS` one every 300 ms, `exec: CMD` calls the CLI's shell tool with CMD and then
/// reports its output (`outputs: ...`); anything else is `ok`.
fn script(req: &RecordedRequest) -> Reply {
    let text = req.last_user_text().unwrap_or_default();
    let after = |marker: &str| {
        text.split_once(marker)
            .map(|(_, rest)| rest.lines().next().unwrap_or_default().trim().to_string())
    };
    let words = |w: String| {
        w.split_inclusive(' ')
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    if let Some(w) = after("slow:") {
        return Reply::slow_chunks(words(w), Duration::from_millis(300));
    }
    if let Some(w) = after("chunks:") {
        return Reply::chunks(words(w));
    }
    if let Some(cmd) = after("exec:") {
        if let Some(output) = req.tool_output_since_prompt() {
            return Reply::text(format!("outputs: {output}"));
        }
        return if req.offers_tool("run_shell_command") {
            Reply::shell_command("call_1", &cmd, "the test asks")
        } else {
            Reply::function_call(
                "call_1",
                "bash",
                &json!({"command": cmd, "description": "the test asks"}),
            )
        };
    }
    Reply::text("ok")
}

#[derive(Clone, Copy, PartialEq)]
enum Cli {
    Gemini,
    Opencode,
    Qwen,
}

impl Cli {
    fn harness(self) -> &'static str {
        match self {
            Cli::Gemini => "gemini",
            Cli::Opencode => "opencode",
            Cli::Qwen => "qwen",
        }
    }

    /// Writes the CLI's home and returns its variables.
    fn home(self, home: &Path, env: &Env) -> Vec<(String, String)> {
        match self {
            Cli::Gemini => {
                write_gemini_home(home).unwrap();
                gemini_env(home, &env.mock.base_url())
            }
            Cli::Opencode => {
                write_opencode_home(home, &env.mock.url()).unwrap();
                opencode_env(home)
            }
            Cli::Qwen => {
                write_qwen_home(home).unwrap();
                qwen_env(home, &env.mock.url())
            }
        }
    }

    /// Where the CLI keeps its sessions under `home` (removed: it forgets them all).
    fn sessions(self, home: &Path) -> std::path::PathBuf {
        match self {
            Cli::Gemini => home.join(".gemini/tmp"),
            Cli::Opencode => home.join(".local/share/opencode"),
            Cli::Qwen => home.join(".qwen/projects"),
        }
    }
}

/// The files under `dir` that hold `needle`.
fn files_mentioning(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

/// Waits for the flight's approval, checks it names the command as it will run, and
/// decides it.
async fn decide(env: &Env, flight: &str, command: &str, decision: &str) -> Value {
    let a = env.wait_approval(flight).await;
    assert_eq!(
        (a["kind"].as_str(), a["detail"].as_str()),
        (Some("command"), Some(command)),
        "{a}"
    );
    env.relay
        .cli_ok(&["approve", a["id"].as_str().unwrap(), decision]);
    a
}

async fn scenario(cli: Cli) {
    let mut env = Env::start().await;
    env.mock.set_handler(script);
    let home = env.tmp.path().join("home");
    let vars: Vec<String> = cli
        .home(&home, &env)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let work = env.work.display().to_string();
    let mut add = vec![
        "agent",
        "add",
        "a1",
        "--harness",
        cli.harness(),
        "--cwd",
        &work,
    ];
    for kv in &vars {
        add.extend(["--env", kv]);
    }
    add.extend(["--auto-decline", "rm"]);
    env.relay.cli_ok(&add);

    // Streamed text, which is also the first turn the resumed session must carry.
    // Slow enough that the broker does not merge the pieces into one.
    let id = env.ask_no_wait(
        "a1",
        "Remember pelican. slow: alpha beta gamma delta epsilon",
    );
    let f = env.wait_flight(&id, 120, |f| state(f) == "completed").await;
    let output = "alpha beta gamma delta epsilon";
    assert_eq!(f["output"], output, "{f}");
    let updates = env.updates(&id).await;
    let deltas: Vec<&str> = updates
        .iter()
        .filter(|u| u["kind"] == "delta")
        .filter_map(|u| u["text"].as_str())
        .collect();
    assert!(
        deltas.len() >= 2 && deltas.concat() == output,
        "streamed in pieces: {updates:?}"
    );
    let agent = env.agent("a1").await;
    let session = agent["session_id"].as_str().unwrap().to_string();
    let program = &agent["program"].clone();
    assert_eq!(program["protocol_version"], 1, "{agent}");
    assert!(
        program["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("load_session")),
        "{agent}"
    );
    let shown = env.relay.cli_ok(&["agent", "show", "a1"]);
    assert!(shown.contains("program   "), "{shown}");
    // Relay's MCP server reaches the session with the agent's token in the request's
    // environment: no CLI writes it down.
    assert_eq!(files_mentioning(&home, "RELAY_TOKEN"), Vec::<String>::new());

    // A shell command accepted by a person runs; declined, it does not.
    let cmd = "echo relay-accepted > accepted.txt";
    let id = env.ask_no_wait("a1", &format!("Run it. exec: {cmd}"));
    decide(&env, &id, cmd, "accept").await;
    let f = env.wait_flight(&id, 120, |f| state(f) == "completed").await;
    assert!(f["output"].as_str().unwrap().starts_with("outputs:"), "{f}");
    assert_eq!(
        std::fs::read_to_string(env.work.join("accepted.txt")).unwrap(),
        "relay-accepted\n"
    );
    let cmd = "echo relay-declined > declined.txt";
    let id = env.ask_no_wait("a1", &format!("Run it. exec: {cmd}"));
    decide(&env, &id, cmd, "decline").await;
    env.wait_flight(&id, 120, |f| state(f) == "completed").await;
    assert!(!env.work.join("declined.txt").exists());
    // By the agent's rule, on the command as it will run.
    let cmd = "rm -rf keep-me";
    std::fs::create_dir_all(env.work.join("keep-me")).unwrap();
    let id = env.ask_no_wait("a1", &format!("Run it. exec: {cmd}"));
    env.wait_flight(&id, 120, |f| state(f) == "completed").await;
    let a = env.approval_of(&id);
    assert_eq!(
        (a["detail"].as_str(), a["decided_by"].as_str()),
        (Some(cmd), Some("policy:auto-decline:rm")),
        "{a}"
    );
    assert!(env.work.join("keep-me").is_dir());

    // Interrupt cancels a slow turn: 6 s of words, so that the interrupt lands in it
    // however slowly a loaded machine starts `relay interrupt` after the first.
    let id = env.ask_no_wait(
        "a1",
        &format!(
            "Go slowly. slow: {}",
            ["one two three four five"; 4].join(" ")
        ),
    );
    env.wait_delta(&id).await;
    env.relay.cli_ok(&["interrupt", &id]);
    let f = env.wait_flight(&id, 60, |f| state(f) != "running").await;
    assert_eq!(
        (state(&f), f["error"].as_str()),
        ("cancelled", Some("interrupted")),
        "{f}"
    );

    // `kill -9` of the broker: the agent goes with it, and the same session comes back.
    let pid = env.agent("a1").await["endpoint"]["pid"].as_u64().unwrap() as u32;
    env.relay.kill9();
    assert!(
        procs::wait_gone(pid, Duration::from_secs(20)).await,
        "the agent {pid} outlived relay"
    );
    // Nor anything it started (Qwen Code's `cli.js` under its `cli-entry.js`).
    procs::wait_group_gone(pid, Duration::from_secs(20)).await;
    env.relay.restart().unwrap();
    // What the program said of itself stays while it is offline.
    let agent = env.agent("a1").await;
    assert_eq!(
        (agent["state"].as_str(), &agent["program"]),
        (Some("offline"), program),
        "{agent}"
    );
    let id = env.ask_no_wait("a1", "Which word? chunks: delta epsilon");
    let f = env.wait_flight(&id, 150, |f| state(f) == "completed").await;
    // Only this turn's text: the load's replay of history is not new output.
    assert_eq!(f["output"], "delta epsilon", "{f}");
    assert_eq!(env.agent("a1").await["session_id"], session.as_str());
    let last = env.mock.requests().last().cloned().unwrap();
    let input = all_input_text(&last);
    assert!(input.contains("Remember pelican"), "{input}");
    assert!(input.contains(output), "{input}");

    // The whole turn, replayed.
    let shown = env.relay.cli_ok(&["replay", "flight", &id]);
    for part in ["asked a1:", "Which word?", "delta epsilon", "-- completed"] {
        assert!(shown.contains(part), "{part:?} in\n{shown}");
    }

    // A session the CLI no longer has is replaced, and the loss recorded.
    env.relay.terminate().unwrap();
    std::fs::remove_dir_all(cli.sessions(&home)).unwrap();
    env.relay.restart().unwrap();
    let id = env.ask_no_wait("a1", "After the loss. chunks: zeta");
    let f = env.wait_flight(&id, 120, |f| state(f) == "completed").await;
    assert_eq!(f["output"], "zeta", "{f}");
    let new = env.agent("a1").await["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(new, session);
    let lost = env.events_of("thread_lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(
        (
            lost[0]["old_thread_id"].as_str(),
            lost[0]["new_thread_id"].as_str()
        ),
        (Some(session.as_str()), Some(new.as_str()))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gemini_cli() {
    scenario(Cli::Gemini).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn opencode() {
    scenario(Cli::Opencode).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn qwen_code() {
    scenario(Cli::Qwen).await;
}
