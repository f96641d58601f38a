//! `relay-mock-model`: runs the mock model server for manual runs. Prints its `/v1` URL
//! (Codex's `base_url`, OpenCode's and Qwen Code's) on stdout and its bare URL (Claude
//! Code's `ANTHROPIC_BASE_URL`, Gemini CLI's `GOOGLE_GEMINI_BASE_URL`) on stderr; with
//! `--codex-home DIR` it writes a Codex `config.toml` pointing at it, with `--pi-dir DIR`
//! Pi's `models.json` (run `pi --provider mock --model mock-model` with
//! `PI_CODING_AGENT_DIR=DIR`), and with `--gemini-home`, `--opencode-home` or
//! `--qwen-home DIR` that CLI's settings under a `HOME` of `DIR` (the variables to run it
//! with are printed on stderr). `--log FILE` appends every model request to FILE as one
//! JSON line (`{"path", "query", "body"}`). Stops on Ctrl-C or SIGTERM, then lists the
//! requests it got on stderr.
//!
//! Replies follow a marker in the last user text (agents add their own context around
//! what was typed, so the marker may be anywhere in it), so a manual session can
//! exercise every [`Reply`]: `slow: a b c` streams `a`, `b`, `c` one second apart,
//! `chunks: a b c` streams them at once,
//! `exec: CMD` asks to run `CMD` with the CLI's shell tool (Codex's escalated
//! `exec_command`, Gemini CLI's and Qwen Code's `run_shell_command`, OpenCode's and Pi's
//! `bash`) and answers with the outputs once they come back, `hang:` never completes,
//! `fail:` answers a failure; anything else is echoed as `ok: <text>`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use relay_mock_model::{RecordedRequest, Reply};
use serde_json::json;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut codex_home: Option<PathBuf> = None;
    let mut pi_dir: Option<PathBuf> = None;
    let mut gemini_home: Option<PathBuf> = None;
    let mut opencode_home: Option<PathBuf> = None;
    let mut qwen_home: Option<PathBuf> = None;
    let mut log: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--codex-home" => &mut codex_home,
            "--pi-dir" => &mut pi_dir,
            "--gemini-home" => &mut gemini_home,
            "--opencode-home" => &mut opencode_home,
            "--qwen-home" => &mut qwen_home,
            "--log" => &mut log,
            other => {
                eprintln!("usage: relay-mock-model [--codex-home DIR] [--pi-dir DIR] [--gemini-home DIR] [--opencode-home DIR] [--qwen-home DIR] [--log FILE]\nunknown argument {other:?}");
                std::process::exit(2);
            }
        };
        *slot = args.next().map(PathBuf::from);
    }
    let log = match log {
        Some(path) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        )),
        None => None,
    };
    let mock = relay_mock_model::MockModel::start().await?;
    mock.set_handler(move |req| {
        if let Some(log) = &log {
            let line = json!({"path": req.path, "query": req.query, "body": req.body});
            let mut file = log.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(err) = writeln!(file, "{line}") {
                eprintln!("log: {err}");
            }
        }
        let text = req.last_user_text().unwrap_or_default();
        eprintln!("model request {}: {text:?}", req.path);
        reply_to(req, &text)
    });
    if let Some(dir) = codex_home {
        relay_mock_model::write_codex_home(&dir, &mock.url())?;
        eprintln!("wrote {}", dir.join("config.toml").display());
    }
    if let Some(dir) = pi_dir {
        relay_mock_model::write_pi_dir(&dir, &mock.base_url())?;
        eprintln!("wrote {}", dir.join("models.json").display());
    }
    if let Some(dir) = gemini_home {
        relay_mock_model::write_gemini_home(&dir)?;
        print_env(
            "gemini",
            &relay_mock_model::gemini_env(&dir, &mock.base_url()),
        );
    }
    if let Some(dir) = opencode_home {
        relay_mock_model::write_opencode_home(&dir, &mock.url())?;
        print_env("opencode", &relay_mock_model::opencode_env(&dir));
    }
    if let Some(dir) = qwen_home {
        relay_mock_model::write_qwen_home(&dir)?;
        print_env("qwen", &relay_mock_model::qwen_env(&dir, &mock.url()));
    }
    eprintln!("ANTHROPIC_BASE_URL={}", mock.base_url());
    println!("{}", mock.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = term.recv() => {}
    }
    for req in mock.all_requests() {
        eprintln!("{} {}", req.method, req.path);
    }
    Ok(())
}

fn print_env(cli: &str, vars: &[(String, String)]) {
    let vars: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
    eprintln!("{cli}: {}", vars.join(" "));
}

/// The reply a marker in `text` asks for (see the module header).
fn reply_to(req: &RecordedRequest, text: &str) -> Reply {
    if let Some((_, words)) = text.split_once("slow:") {
        return Reply::slow_chunks(
            words.trim().split_inclusive(' ').map(str::to_string),
            Duration::from_secs(1),
        );
    }
    if let Some((_, words)) = text.split_once("chunks:") {
        return Reply::chunks(words.trim().split_inclusive(' ').map(str::to_string));
    }
    if let Some((_, cmd)) = text.split_once("exec:") {
        let cmd = cmd.lines().next().unwrap_or_default().trim();
        if let Some(output) = req.tool_output_since_prompt() {
            return Reply::text(format!("outputs: {output:?}"));
        }
        return if req.offers_tool("run_shell_command") {
            Reply::shell_command("call_1", cmd, "manual test")
        } else if req.offers_tool("bash") {
            Reply::function_call(
                "call_1",
                "bash",
                &json!({"command": cmd, "description": "manual test"}),
            )
        } else {
            Reply::exec_command_escalated("call_1", cmd, "manual test")
        };
    }
    if text.contains("hang:") {
        Reply::hang()
    } else if text.contains("fail:") {
        Reply::failed("mock failure")
    } else {
        Reply::text(format!("ok: {text}"))
    }
}
