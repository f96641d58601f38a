//! How an ACP agent is started: the generic `acp` harness runs the agent's own
//! `--command` and `--arg`s; the presets (Gemini CLI, OpenCode, Qwen Code) add the
//! pinned program, the argument that puts it in ACP mode, and the variables and
//! settings that keep it offline-quiet and asking before its tools (facts in
//! `HARNESSES.md`), without touching the user's own settings under `HOME`:
//!
//! | | mode | settings Relay gives | how |
//! | --- | --- | --- | --- |
//! | Gemini CLI | `--acp` | no usage statistics or telemetry, no session clean-up (it deletes live sessions), no auto-update, approval mode `default`; model `gemini-2.5-flash` unless set | a system settings file of Relay's (`GEMINI_CLI_SYSTEM_SETTINGS_PATH`, which outranks the user's settings; the model in `GEMINI_CLI_SYSTEM_DEFAULTS_PATH`, which the user's outrank) and `GEMINI_CLI_NO_RELAUNCH` (one process, not two) |
//! | OpenCode | `acp` | `bash`, `edit` and `webfetch` ask; no auto-update, sharing, models.dev fetch or plugin installs | `OPENCODE_PERMISSION` (merged over every config), `OPENCODE_CONFIG_CONTENT`, `OPENCODE_DISABLE_AUTOUPDATE`, `OPENCODE_DISABLE_MODELS_FETCH`, `OPENCODE_PURE` |
//! | Qwen Code | `--acp` | approval mode `default`, no usage statistics, auto-update, follow-up suggestions or managed memory (each an extra model call) | a system settings file (`QWEN_CODE_SYSTEM_SETTINGS_PATH`) and `QWEN_CODE_NO_RELAUNCH` (its `cli.js` never re-spawns or restarts itself) |
//!
//! A variable the agent sets itself wins over the preset's. The settings files are
//! written under Relay's cache (`~/.cache/relay/acp/`), the same for every agent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use relay_protocol::domain::{AgentSpec, Harness};
use serde_json::{json, Value};

use crate::access::RelayAccess;
use crate::config::CliConfig;
use crate::error::HarnessError;
use crate::pinned::{agents_dir, PinnedCli, GEMINI_CLI, OPENCODE_CLI, QWEN_CLI};
use crate::preflight::{config_dir, has_var};

/// Which ACP agent a harness runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Any agent: its `--command` and `--arg`s, nothing added.
    Generic,
    Gemini,
    Opencode,
    Qwen,
}

/// A settings file a preset points its CLI at.
struct SettingsFile {
    /// The variable that names it.
    var: &'static str,
    /// Its file name under the settings directory.
    file: &'static str,
    content: fn() -> Value,
}

impl Preset {
    pub fn of(harness: Harness) -> Preset {
        match harness {
            Harness::GeminiAcp => Preset::Gemini,
            Harness::OpencodeAcp => Preset::Opencode,
            Harness::QwenAcp => Preset::Qwen,
            _ => Preset::Generic,
        }
    }

    /// The pinned CLI, for a preset.
    pub fn cli(self) -> Option<&'static PinnedCli> {
        match self {
            Preset::Generic => None,
            Preset::Gemini => Some(&GEMINI_CLI),
            Preset::Opencode => Some(&OPENCODE_CLI),
            Preset::Qwen => Some(&QWEN_CLI),
        }
    }

    /// How messages name the program.
    pub fn program_name(self) -> &'static str {
        match self {
            Preset::Generic => "acp agent",
            Preset::Gemini => "gemini --acp",
            Preset::Opencode => "opencode acp",
            Preset::Qwen => "qwen --acp",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Preset::Generic => "acp",
            Preset::Gemini => "gemini",
            Preset::Opencode => "opencode",
            Preset::Qwen => "qwen",
        }
    }

    /// The arguments before the agent's own.
    fn mode_args(self) -> &'static [&'static str] {
        match self {
            Preset::Generic => &[],
            Preset::Gemini | Preset::Qwen => &["--acp"],
            Preset::Opencode => &["acp"],
        }
    }

    fn settings(self) -> &'static [SettingsFile] {
        match self {
            Preset::Gemini => &[
                SettingsFile {
                    var: "GEMINI_CLI_SYSTEM_SETTINGS_PATH",
                    file: "gemini-system-settings.json",
                    content: || {
                        json!({
                            "privacy": {"usageStatisticsEnabled": false},
                            "telemetry": {"enabled": false},
                            "general": {
                                "sessionRetention": {"enabled": false},
                                "defaultApprovalMode": "default",
                                "enableAutoUpdate": false,
                                "enableAutoUpdateNotification": false
                            }
                        })
                    },
                },
                SettingsFile {
                    var: "GEMINI_CLI_SYSTEM_DEFAULTS_PATH",
                    file: "gemini-system-defaults.json",
                    // A fixed model: without, each prompt first asks a classifier model.
                    content: || json!({"model": {"name": "gemini-2.5-flash"}}),
                },
            ],
            Preset::Qwen => &[SettingsFile {
                var: "QWEN_CODE_SYSTEM_SETTINGS_PATH",
                file: "qwen-system-settings.json",
                content: || {
                    json!({
                        "tools": {"approvalMode": "default"},
                        "privacy": {"usageStatisticsEnabled": false},
                        "general": {"enableAutoUpdate": false},
                        "ui": {"enableFollowupSuggestions": false},
                        "memory": {"enableManagedAutoMemory": false, "enableManagedAutoDream": false}
                    })
                },
            }],
            Preset::Generic | Preset::Opencode => &[],
        }
    }

    /// The variables the preset sets (unless the agent sets them): `settings` is the
    /// directory its settings files are in.
    fn env(self, model: Option<&str>, settings: &Path) -> Vec<(&'static str, String)> {
        let mut env: Vec<(&'static str, String)> = self
            .settings()
            .iter()
            .map(|f| (f.var, settings.join(f.file).display().to_string()))
            .collect();
        match self {
            Preset::Gemini => env.push(("GEMINI_CLI_NO_RELAUNCH", "true".into())),
            Preset::Opencode => {
                let mut content = json!({"autoupdate": false, "share": "disabled"});
                if let Some(model) = model {
                    content["model"] = json!(model);
                }
                env.extend([
                    (
                        "OPENCODE_PERMISSION",
                        json!({"bash": "ask", "edit": "ask", "webfetch": "ask"}).to_string(),
                    ),
                    ("OPENCODE_CONFIG_CONTENT", content.to_string()),
                    ("OPENCODE_DISABLE_AUTOUPDATE", "1".into()),
                    ("OPENCODE_DISABLE_MODELS_FETCH", "1".into()),
                    ("OPENCODE_PURE", "1".into()),
                ]);
            }
            // `cli.js` never re-spawns or restarts itself behind Relay's back (see the tests).
            Preset::Qwen => env.push(("QWEN_CODE_NO_RELAUNCH", "true".into())),
            Preset::Generic => {}
        }
        env
    }
}

/// Where the presets' settings files are: `~/.cache/relay/acp` (beside the pinned
/// CLIs' installs).
pub fn settings_dir() -> Option<PathBuf> {
    agents_dir().map(|d| d.parent().map_or_else(|| d.join("acp"), |p| p.join("acp")))
}

/// Writes `preset`'s settings files into `dir` (blocking: call it off the async
/// threads), each replaced whole so that a CLI starting meanwhile never reads half.
pub fn write_settings(preset: Preset, dir: &Path) -> Result<(), HarnessError> {
    if preset.settings().is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    for f in preset.settings() {
        let path = dir.join(f.file);
        let content = serde_json::to_vec_pretty(&(f.content)())?;
        if std::fs::read(&path).is_ok_and(|now| now == content) {
            continue;
        }
        // Its own name per write: agents of one process may start at once.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{}.{}.{n}", f.file, std::process::id()));
        std::fs::write(&tmp, &content)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(())
}

/// How an ACP agent is started.
#[derive(Debug, Clone)]
pub struct AcpConfig {
    pub preset: Preset,
    pub cli: CliConfig,
    /// Where the preset's settings files go ([`write_settings`] before each start).
    pub settings: Option<PathBuf>,
}

impl AcpConfig {
    /// How to start `agent` of harness `harness`: for a preset, its pinned program
    /// (unless `--command`), mode argument, variables and settings; for the generic
    /// `acp`, the agent's program as given. [`HarnessError::Config`] when a generic
    /// agent names none.
    pub fn for_agent(
        agent: &AgentSpec,
        relay: Option<&RelayAccess>,
    ) -> Result<AcpConfig, HarnessError> {
        let preset = Preset::of(agent.harness);
        let mut cli = match preset.cli() {
            Some(pinned) => CliConfig::for_agent(agent, pinned, relay),
            None => {
                let Some(command) = agent.command.as_deref().filter(|c| !c.trim().is_empty())
                else {
                    return Err(HarnessError::Config {
                        detail: format!(
                            "acp agent {:?} names no program: pass --command PROGRAM and its --arg (e.g. --command gemini --arg --acp), or use a preset (--harness gemini, opencode or qwen)",
                            agent.name
                        ),
                    });
                };
                let pinned = PinnedCli {
                    name: "acp",
                    version: "",
                    override_env: "",
                };
                let mut cli = CliConfig::for_agent(agent, &pinned, relay);
                cli.program = PathBuf::from(command);
                cli
            }
        };
        let settings = settings_dir();
        let mut args: Vec<String> = preset.mode_args().iter().map(|a| a.to_string()).collect();
        if let (Some(model), Preset::Gemini | Preset::Qwen) = (&cli.model, preset) {
            args.extend(["--model".to_string(), model.clone()]);
        }
        args.append(&mut cli.args);
        cli.args = args;
        if let Some(dir) = &settings {
            for (var, value) in preset.env(cli.model.as_deref(), dir) {
                cli.env.entry(var.to_string()).or_insert(value);
            }
        }
        Ok(AcpConfig {
            preset,
            cli,
            settings,
        })
    }
}

/// Why the preset's CLI will find no credentials, if none of its ways is there.
pub(crate) fn credentials(env: &BTreeMap<String, String>, agent: &AgentSpec) -> Option<String> {
    let any = |vars: &[&str]| vars.iter().any(|v| has_var(env, v));
    // Under `$VAR` if set, else under `$HOME/<under>`.
    let file = |var: &str, under: &str, names: &[&str]| {
        config_dir(env, var, under).is_some_and(|d| names.iter().any(|n| d.join(n).is_file()))
    };
    let home_file = |names: &[&str]| {
        env.get("HOME")
            .is_some_and(|h| names.iter().any(|n| Path::new(h).join(n).is_file()))
    };
    match Preset::of(agent.harness) {
        Preset::Generic => None,
        Preset::Gemini => {
            let found = any(&[
                "GEMINI_API_KEY",
                "GOOGLE_API_KEY",
                "GOOGLE_APPLICATION_CREDENTIALS",
                "GOOGLE_GENAI_USE_VERTEXAI",
                "GOOGLE_GEMINI_BASE_URL",
            ]) || home_file(&[".gemini/oauth_creds.json", ".gemini/settings.json"]);
            (!found).then(|| {
                "no Gemini CLI credentials found: no GEMINI_API_KEY or GOOGLE_API_KEY among the agent's variables (add one with --secret) and no ~/.gemini/oauth_creds.json or settings.json (run `gemini` once as the user relay runs as and sign in); its turns will fail until it has one".to_string()
            })
        }
        Preset::Opencode => {
            let found = any(&[
                "OPENAI_API_KEY",
                "ANTHROPIC_API_KEY",
                "GEMINI_API_KEY",
                "OPENROUTER_API_KEY",
                "OPENCODE_API_KEY",
                "OPENCODE_CONFIG",
            ]) || file("XDG_DATA_HOME", ".local/share", &["opencode/auth.json"])
                || file(
                    "XDG_CONFIG_HOME",
                    ".config",
                    &[
                        "opencode/opencode.json",
                        "opencode/opencode.jsonc",
                        "opencode/config.json",
                    ],
                );
            (!found).then(|| {
                "no OpenCode credentials found: no provider key (OPENAI_API_KEY, ANTHROPIC_API_KEY...) among the agent's variables (add one with --secret), no ~/.local/share/opencode/auth.json (`opencode auth login`) and no ~/.config/opencode/opencode.json with a provider; its turns will fail until it has one".to_string()
            })
        }
        Preset::Qwen => {
            let found = any(&["OPENAI_API_KEY", "DASHSCOPE_API_KEY", "QWEN_API_KEY"])
                || home_file(&[".qwen/oauth_creds.json", ".qwen/settings.json"]);
            (!found).then(|| {
                "no Qwen Code credentials found: no OPENAI_API_KEY (with OPENAI_BASE_URL and OPENAI_MODEL) or DASHSCOPE_API_KEY among the agent's variables (add one with --secret) and no ~/.qwen/oauth_creds.json or settings.json (run `qwen` once and sign in); its turns will fail until it has one".to_string()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_preset_adds_its_mode_model_and_settings_and_the_agents_own_variables_win() {
        let mut agent = AgentSpec::new("g", Harness::GeminiAcp, "/w");
        agent.command = Some("/opt/gemini".into());
        agent.args = vec!["--debug".into()];
        agent.model = Some("gemini-2.5-pro".into());
        agent
            .env
            .insert("GEMINI_CLI_NO_RELAUNCH".into(), "false".into());
        let c = AcpConfig::for_agent(&agent, None).unwrap();
        assert_eq!(c.cli.program, PathBuf::from("/opt/gemini"));
        assert_eq!(
            c.cli.args,
            ["--acp", "--model", "gemini-2.5-pro", "--debug"]
        );
        assert_eq!(c.cli.env["GEMINI_CLI_NO_RELAUNCH"], "false");
        let settings = c.settings.clone().unwrap();
        assert_eq!(
            PathBuf::from(&c.cli.env["GEMINI_CLI_SYSTEM_SETTINGS_PATH"]),
            settings.join("gemini-system-settings.json")
        );

        let mut agent = AgentSpec::new("o", Harness::OpencodeAcp, "/w");
        agent.model = Some("mock/m".into());
        let c = AcpConfig::for_agent(&agent, None).unwrap();
        assert_eq!(c.cli.args, ["acp"]);
        let content: Value = serde_json::from_str(&c.cli.env["OPENCODE_CONFIG_CONTENT"]).unwrap();
        assert_eq!(content["model"], "mock/m");
        assert!(c.cli.env["OPENCODE_PERMISSION"].contains(r#""bash":"ask""#));
    }

    #[test]
    fn qwen_code_never_re_spawns_or_restarts_itself() {
        // Without `QWEN_CODE_NO_RELAUNCH` its `cli.js` re-spawns itself (more heap) and
        // starts a new child when that one exits with its relaunch code: a fresh
        // process, never `initialize`d, behind the same pipes. The real-CLI tests run
        // with it (`relay_mock_model::qwen_env`); so must the preset.
        let agent = AgentSpec::new("q", Harness::QwenAcp, "/w");
        let c = AcpConfig::for_agent(&agent, None).unwrap();
        assert_eq!(
            c.cli.env.get("QWEN_CODE_NO_RELAUNCH").map(String::as_str),
            Some("true")
        );
    }

    #[test]
    fn a_generic_agent_runs_its_command_and_must_name_one() {
        let mut agent = AgentSpec::new("k", Harness::Acp, "/w");
        match AcpConfig::for_agent(&agent, None) {
            Err(e @ HarnessError::Config { .. }) => {
                assert!(e.to_string().contains("--command"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        agent.command = Some("kimi".into());
        agent.args = vec!["acp".into()];
        let c = AcpConfig::for_agent(&agent, None).unwrap();
        assert_eq!(
            (c.cli.program, c.cli.args),
            (PathBuf::from("kimi"), vec!["acp".to_string()])
        );
        assert!(c.cli.env.is_empty());
    }

    #[test]
    fn settings_files_are_written_whole_and_are_json() {
        let dir = tempfile::tempdir().unwrap();
        // Many agents starting at once.
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| write_settings(Preset::Gemini, dir.path()).unwrap());
            }
        });
        for preset in [Preset::Gemini, Preset::Qwen, Preset::Opencode] {
            write_settings(preset, dir.path()).unwrap();
            write_settings(preset, dir.path()).unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "gemini-system-defaults.json",
                "gemini-system-settings.json",
                "qwen-system-settings.json"
            ]
        );
        let gemini: Value = serde_json::from_slice(
            &std::fs::read(dir.path().join("gemini-system-settings.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(gemini["general"]["sessionRetention"]["enabled"], false);
    }

    #[test]
    fn credentials_are_looked_for_where_each_cli_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().display().to_string();
        let env = BTreeMap::from([("HOME".to_string(), home)]);
        for h in [Harness::GeminiAcp, Harness::OpencodeAcp, Harness::QwenAcp] {
            let agent = AgentSpec::new("a", h, "/w");
            let warning = credentials(&env, &agent).unwrap();
            assert!(warning.contains("credentials found"), "{warning}");
            let mut with_key = env.clone();
            with_key.insert("OPENAI_API_KEY".into(), "k".into());
            with_key.insert("GEMINI_API_KEY".into(), "k".into());
            assert_eq!(credentials(&with_key, &agent), None, "{h}");
        }
        std::fs::create_dir_all(dir.path().join(".qwen")).unwrap();
        std::fs::write(dir.path().join(".qwen/settings.json"), "{}").unwrap();
        assert_eq!(
            credentials(&env, &AgentSpec::new("a", Harness::QwenAcp, "/w")),
            None
        );
        assert_eq!(
            credentials(&env, &AgentSpec::new("a", Harness::Acp, "/w")),
            None
        );
    }
}
