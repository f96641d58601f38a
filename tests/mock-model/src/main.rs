//! `relay-mock-model`: runs the mock model server for manual runs. Prints its `/v1` URL
//! (Codex's `base_url`) on stdout and its bare URL (Claude Code's `ANTHROPIC_BASE_URL`)
//! on stderr; with `--codex-home DIR` it writes a Codex `config.toml` pointing at it, and
//! with `--pi-dir DIR` Pi's `models.json` (run `pi --provider mock --model mock-model`
//! with `PI_CODING_AGENT_DIR=DIR`). Stops on Ctrl-C, then lists the requests it got on
//! stderr.
//!
//! Replies follow the last user text, so a manual session can exercise every [`Reply`]:
//! `slow: a b c` streams `a`, `b`, `c` one second apart, `exec: CMD` asks to run `CMD`
//! escalated (an approval request in Codex), `hang` never completes, `fail` answers
//! `response.failed`; anything else is echoed as `ok: <text>`.

use std::path::PathBuf;
use std::time::Duration;

use relay_mock_model::Reply;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut codex_home: Option<PathBuf> = None;
    let mut pi_dir: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--codex-home" => codex_home = args.next().map(PathBuf::from),
            "--pi-dir" => pi_dir = args.next().map(PathBuf::from),
            other => {
                eprintln!("usage: relay-mock-model [--codex-home DIR] [--pi-dir DIR]\nunknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    let mock = relay_mock_model::MockModel::start().await?;
    mock.set_handler(|req| {
        let text = req.last_user_text().unwrap_or_default();
        eprintln!("model request: {text:?}");
        if let Some(words) = text.strip_prefix("slow:") {
            Reply::slow_chunks(
                words.split_inclusive(' ').map(str::to_string),
                Duration::from_secs(1),
            )
        } else if let Some(cmd) = text.strip_prefix("exec:") {
            if req.function_call_outputs().is_empty() {
                Reply::exec_command_escalated("call_1", cmd.trim(), "manual test")
            } else {
                Reply::text(format!("outputs: {:?}", req.function_call_outputs()))
            }
        } else if text == "hang" {
            Reply::hang()
        } else if text == "fail" {
            Reply::failed("mock failure")
        } else {
            Reply::text(format!("ok: {text}"))
        }
    });
    if let Some(dir) = codex_home {
        relay_mock_model::write_codex_home(&dir, &mock.url())?;
        eprintln!("wrote {}", dir.join("config.toml").display());
    }
    if let Some(dir) = pi_dir {
        relay_mock_model::write_pi_dir(&dir, &mock.base_url())?;
        eprintln!("wrote {}", dir.join("models.json").display());
    }
    eprintln!("ANTHROPIC_BASE_URL={}", mock.base_url());
    println!("{}", mock.url());
    tokio::signal::ctrl_c().await?;
    for req in mock.all_requests() {
        eprintln!("{} {}", req.method, req.path);
    }
    Ok(())
}
