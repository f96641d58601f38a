//! Where each agent CLI is told to find the mock: Codex's `config.toml`, Claude Code's
//! variables, Pi's `models.json`.

use std::path::Path;

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
