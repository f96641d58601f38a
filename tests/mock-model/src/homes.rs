//! Where each agent CLI is told to find the mock: Codex's `config.toml`, Claude Code's
//! variables, Pi's `models.json`, and for the ACP CLIs (Gemini CLI, OpenCode, Qwen Code)
//! a settings file under a `HOME` of their own plus the variables that name the mock.
//!
//! The ACP CLIs' shape: `write_<cli>_home(home, …)` writes the settings into `home` (a
//! fresh folder per agent: each CLI keeps its sessions there too), and
//! `<cli>_env(home, …)` returns the variables to run it with, `HOME` included (see
//! [`codex_env`] for why `HOME` is never the real one). Both are needed.

use std::path::Path;

use serde_json::{json, Value};

fn pairs(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Writes `value` as pretty JSON to `home/rel`, creating the folders.
fn write_json(home: &Path, rel: &str, value: &Value) -> std::io::Result<()> {
    let path = home.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    std::fs::write(path, text)
}

/// The model name the Gemini settings fix. A fixed model keeps Gemini CLI from making
/// a routing (classifier) request before each turn; the name must be one it knows.
pub const GEMINI_MODEL: &str = "gemini-2.5-flash";

/// Writes `home/.gemini/settings.json`: usage statistics and telemetry off (without
/// them it looks up play.googleapis.com), the model fixed ([`GEMINI_MODEL`]), and
/// session retention off (its clean-up at start deletes sessions; see HARNESSES.md).
/// Tools ask before running (the default approval mode).
pub fn write_gemini_home(home: &Path) -> std::io::Result<()> {
    write_json(
        home,
        ".gemini/settings.json",
        &json!({
            "privacy": {"usageStatisticsEnabled": false},
            "telemetry": {"enabled": false},
            "model": {"name": GEMINI_MODEL},
            "general": {"sessionRetention": {"enabled": false}},
        }),
    )
}

/// The variables for `gemini --acp` against the mock at `base_url` (the bare
/// `http://127.0.0.1:PORT`; it adds `/v1beta`): `GOOGLE_GEMINI_BASE_URL` (with it
/// Gemini CLI uses API-key auth against that URL), a dummy `GEMINI_API_KEY`,
/// `GEMINI_CLI_NO_RELAUNCH` (else it re-spawns itself with more heap: two processes),
/// and `HOME`.
pub fn gemini_env(home: &Path, base_url: &str) -> Vec<(String, String)> {
    let home = home.display().to_string();
    pairs(&[
        ("HOME", &home),
        ("GOOGLE_GEMINI_BASE_URL", base_url),
        ("GEMINI_API_KEY", "dummy"),
        ("GEMINI_CLI_NO_RELAUNCH", "true"),
    ])
}

/// Writes `home/.config/opencode/opencode.json`: a `mock` provider (OpenAI-compatible
/// chat completions at `base_url`, the `/v1` URL) serving `mock-model`, used for both
/// the main and the small model; no auto-update, no sharing, and `bash` and `edit`
/// asking first (OpenCode runs bash without asking by default). Its `title` agent is
/// disabled: otherwise a session's first prompt also sends a title request (streamed,
/// no tools, system prompt "You are a title generator") in parallel with the turn's
/// own, which races a scripted reply queue.
pub fn write_opencode_home(home: &Path, base_url: &str) -> std::io::Result<()> {
    write_json(
        home,
        ".config/opencode/opencode.json",
        &json!({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"mock": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Mock",
                "options": {"baseURL": base_url, "apiKey": "dummy"},
                "models": {"mock-model": {"name": "Mock", "tool_call": true}},
            }},
            "model": "mock/mock-model",
            "small_model": "mock/mock-model",
            "autoupdate": false,
            "share": "disabled",
            "permission": {"bash": "ask", "edit": "ask"},
            "agent": {"title": {"disable": true}},
        }),
    )
}

/// The variables for `opencode acp`: `HOME` and the XDG folders under it (OpenCode
/// follows XDG; a caller's own `XDG_*` would otherwise win), no models.dev fetch
/// (`OPENCODE_DISABLE_MODELS_FETCH`), and `OPENCODE_PURE` (else it npm-installs a
/// plugin in the background).
pub fn opencode_env(home: &Path) -> Vec<(String, String)> {
    let sub = |rel: &str| home.join(rel).display().to_string();
    let home_s = home.display().to_string();
    pairs(&[
        ("HOME", &home_s),
        ("XDG_CONFIG_HOME", &sub(".config")),
        ("XDG_DATA_HOME", &sub(".local/share")),
        ("XDG_CACHE_HOME", &sub(".cache")),
        ("XDG_STATE_HOME", &sub(".local/state")),
        ("OPENCODE_DISABLE_MODELS_FETCH", "1"),
        ("OPENCODE_PURE", "1"),
    ])
}

/// Writes `home/.qwen/settings.json`: OpenAI-compatible auth, model `mock-model`, tools
/// asking first (`approvalMode: "default"`), and no usage statistics, update checks,
/// follow-up suggestions or managed memory (each is a model or network request). Qwen
/// Code rewrites the file at start (adding `"$version"`).
pub fn write_qwen_home(home: &Path) -> std::io::Result<()> {
    write_json(
        home,
        ".qwen/settings.json",
        &json!({
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"name": "mock-model"},
            "tools": {"approvalMode": "default"},
            "privacy": {"usageStatisticsEnabled": false},
            "general": {"enableAutoUpdate": false},
            "ui": {"enableFollowupSuggestions": false},
            "memory": {"enableManagedAutoMemory": false, "enableManagedAutoDream": false},
        }),
    )
}

/// The variables for `qwen --acp` against the mock at `base_url` (the `/v1` URL):
/// `OPENAI_API_KEY` (dummy), `OPENAI_BASE_URL`, `OPENAI_MODEL`, and `HOME`.
pub fn qwen_env(home: &Path, base_url: &str) -> Vec<(String, String)> {
    let home = home.display().to_string();
    pairs(&[
        ("HOME", &home),
        ("OPENAI_API_KEY", "dummy"),
        ("OPENAI_BASE_URL", base_url),
        ("OPENAI_MODEL", "mock-model"),
    ])
}

/// The environment a test codex runs with: its `CODEX_HOME`, and `HOME` set to the same
/// folder. Codex runs commands in a login shell (`bash -lc`), which reads `~/.profile`;
/// with the real `HOME` a test would depend on the machine's dotfiles (on ours, a pyenv
/// hook that takes a global lock and stalls shells started in parallel).
pub fn codex_env(codex_home: &Path) -> Vec<(String, String)> {
    let home = codex_home.display().to_string();
    vec![
        ("CODEX_HOME".to_string(), home.clone()),
        ("HOME".to_string(), home),
    ]
}

/// Writes `<dir>/config.toml` pointing Codex at the mock at `base_url` (the `/v1` URL).
///
/// Retries are off so a failed or dead mock fails a turn at once, and websockets are off
/// because otherwise Codex tries a websocket first and retries for a long time.
pub fn write_codex_home(dir: &Path, base_url: &str) -> std::io::Result<()> {
    write_codex_home_retrying(dir, base_url, 0)
}

/// [`write_codex_home`] with Codex's request and stream retries at `retries`: a model
/// that cannot be reached then gives "Reconnecting..." notes instead of a failed turn.
pub fn write_codex_home_retrying(dir: &Path, base_url: &str, retries: u32) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let config = format!(
        r#"model = "mock-model"
model_provider = "mock"
approval_policy = "on-request"
sandbox_mode = "read-only"

[model_providers.mock]
name = "mock"
base_url = "{base_url}"
wire_api = "responses"
request_max_retries = {retries}
stream_max_retries = {retries}
supports_websockets = false
"#
    );
    std::fs::write(dir.join("config.toml"), config)
}

/// The variables that point Claude Code at the mock at `base_url` (no `/v1`), keep its
/// config and sessions under `config_dir`, and keep it offline: no nonessential
/// traffic, no retries (a dead mock fails a turn at once). `HOME` is the same folder,
/// for the reason given at [`codex_env`].
pub fn claude_env(config_dir: &Path, base_url: &str) -> Vec<(String, String)> {
    let dir = config_dir.display().to_string();
    [
        ("ANTHROPIC_BASE_URL", base_url),
        ("ANTHROPIC_API_KEY", "dummy"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("CLAUDE_CODE_MAX_RETRIES", "0"),
        ("CLAUDE_CONFIG_DIR", &dir),
        ("HOME", &dir),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Writes `<dir>/models.json` with a `mock` provider (Anthropic Messages at `base_url`,
/// no `/v1`) serving `mock-model`, and returns the variables that make Pi use it
/// offline: `PI_CODING_AGENT_DIR`, `PI_OFFLINE`, and `HOME` (see [`codex_env`]). Run Pi
/// with `--provider mock --model mock-model`.
pub fn write_pi_dir(dir: &Path, base_url: &str) -> std::io::Result<Vec<(String, String)>> {
    std::fs::create_dir_all(dir)?;
    let models = serde_json::json!({
        "providers": {"mock": {
            "baseUrl": base_url,
            "api": "anthropic-messages",
            "apiKey": "dummy",
            "models": [{"id": "mock-model"}],
        }}
    });
    std::fs::write(dir.join("models.json"), models.to_string())?;
    let dir = dir.display().to_string();
    Ok([
        ("PI_CODING_AGENT_DIR", dir.as_str()),
        ("PI_OFFLINE", "1"),
        ("HOME", dir.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect())
}
