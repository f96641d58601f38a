//! What can be checked of an agent before it is registered, on the host that would run
//! it: its working directory, that its program runs (`PROGRAM --version`, briefly, in a
//! clean environment), and whether its CLI's credentials are there. A missing directory
//! or a program that does not run refuses the agent ([`HarnessError`]); credentials not
//! found are a warning ([`Preflight::warnings`]): they may come in another way (a login
//! later, a provider this check does not know).
//!
//! Each launcher's [`crate::seam::Launcher::preflight`] puts these together for its CLI;
//! the credential checks themselves live with each adapter (they know where their CLI
//! looks). Blocking work (a `stat`, reading a config file) runs on the blocking pool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use relay_protocol::domain::AgentSpec;
use tokio::io::AsyncReadExt;

use crate::config::CliConfig;
use crate::error::HarnessError;

/// How long `PROGRAM --version` may take before it is killed: a Node CLI on a busy
/// machine takes a second or two. Past it the agent is accepted with a warning.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// The most of its output a version check keeps, and the lines of it an error shows.
const OUTPUT_BYTES: usize = 4096;
const OUTPUT_LINES: usize = 3;

/// What a check found that does not refuse the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preflight {
    pub warnings: Vec<String>,
}

pub use crate::process::check_cwd;

/// The variables the agent's program will see, as far as credentials go: the ones it
/// inherits from Relay ([`crate::process::INHERITED_ENV`]: `HOME`, `XDG_*`...), then
/// its own `env`, then its secrets' values.
pub fn agent_env(agent: &AgentSpec) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = crate::process::inherited_env()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    env.extend(agent.env.clone());
    env.extend(agent.secrets.0.clone());
    env
}

/// Whether variable `name` is set to something in `env`.
pub fn has_var(env: &BTreeMap<String, String>, name: &str) -> bool {
    env.get(name).is_some_and(|v| !v.trim().is_empty())
}

/// A directory a CLI keeps its settings in: `$VAR` if set, else `$HOME/<under_home>`.
pub fn config_dir(env: &BTreeMap<String, String>, var: &str, under_home: &str) -> Option<PathBuf> {
    env.get(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| env.get("HOME").map(|h| Path::new(h).join(under_home)))
}

/// Runs `config`'s program with `flag` (`--version`) in its directory, with the agent's
/// variables on the few inherited from Relay (nothing of Relay's own), stdin closed,
/// in a process group of its own that is killed when it is done or after `timeout`.
/// `Ok(None)`: it ran; `Ok(Some(warning))`: it did not answer in time (not a refusal:
/// a slow start is not a broken program); an error when it cannot be started or fails.
pub async fn check_runs(
    config: &CliConfig,
    flag: &str,
    timeout: Duration,
) -> Result<Option<String>, HarnessError> {
    let program = config.program.display().to_string();
    let mut cmd = tokio::process::Command::new(&config.program);
    cmd.arg(flag)
        .env_clear()
        .envs(crate::process::inherited_env())
        .envs(&config.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &config.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = cmd.spawn().map_err(|source| HarnessError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pid = child.id();
    let out = child.stdout.take().map(|o| tokio::spawn(read_some(o)));
    let err = child.stderr.take().map(|e| tokio::spawn(read_some(e)));
    let status = tokio::time::timeout(timeout, child.wait()).await;
    // Whatever it left running (a launcher's own child) goes with it.
    if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let status = match status {
        Ok(status) => status?,
        Err(_) => {
            let _ = child.kill().await;
            return Ok(Some(format!(
                "`{program} {flag}` did not answer within {timeout:?} (killed): it was not checked"
            )));
        }
    };
    if status.success() {
        return Ok(None);
    }
    let mut said = String::new();
    for task in [err, out].into_iter().flatten() {
        // A pipe a grandchild still holds must not hold up the answer.
        if let Ok(Ok(text)) = tokio::time::timeout(Duration::from_secs(1), task).await {
            if said.trim().is_empty() {
                said = text;
            }
        }
    }
    let how = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (_, Some(s)) => format!("was killed by signal {s}"),
        (Some(c), None) => format!("exited with code {c}"),
        (None, None) => "failed".to_string(),
    };
    // Its first lines say enough (a usage message or a version banner can be long).
    let mut lines = said
        .trim()
        .lines()
        .take(OUTPUT_LINES)
        .collect::<Vec<_>>()
        .join("\n");
    if said.trim().lines().count() > OUTPUT_LINES {
        lines.push_str("\n…");
    }
    let said = lines.as_str();
    Err(HarnessError::DoesNotRun {
        program,
        flag: flag.to_string(),
        problem: match said.is_empty() {
            true => format!("{how} (and said nothing)"),
            false => format!("{how}: {said}"),
        },
    })
}

/// The first [`OUTPUT_BYTES`] of a pipe, as text; the rest is read and dropped.
async fn read_some(mut pipe: impl tokio::io::AsyncRead + Unpin) -> String {
    let mut kept = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = OUTPUT_BYTES.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// The whole check of a CLI over pipes (Codex, Claude Code, Pi): its directory, that
/// its program runs, and `credentials` (blocking: it reads files), which says what is
/// missing when it finds nothing.
pub async fn check_cli(
    config: CliConfig,
    agent: &AgentSpec,
    credentials: fn(&BTreeMap<String, String>, &AgentSpec) -> Option<String>,
) -> Result<Preflight, HarnessError> {
    let spec = agent.clone();
    let cwd = config.cwd.clone();
    let credentials = tokio::task::spawn_blocking(move || {
        if let Some(cwd) = &cwd {
            check_cwd(cwd)?;
        }
        Ok::<_, HarnessError>(credentials(&agent_env(&spec), &spec))
    })
    .await
    .map_err(|e| HarnessError::Io(std::io::Error::other(e)))??;
    let mut warnings = Vec::new();
    if let Some(slow) = check_runs(&config, "--version", VERSION_TIMEOUT).await? {
        warnings.push(slow);
    }
    warnings.extend(credentials);
    Ok(Preflight { warnings })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_plain_file_cwd_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_cwd(dir.path()).is_ok());
        let missing = dir.path().join("nope");
        match check_cwd(&missing) {
            Err(e @ HarnessError::Cwd { .. }) => assert_eq!(
                e.to_string(),
                format!(
                    "the agent's working directory {} does not exist",
                    missing.display()
                )
            ),
            other => panic!("{other:?}"),
        }
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(
            check_cwd(&file),
            Err(HarnessError::Cwd { problem, .. }) if problem == "is not a directory"
        ));
    }

    fn script(dir: &Path, body: &str) -> CliConfig {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(format!("s{}", body.len()));
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut config = CliConfig::new(path);
        config.cwd = Some(dir.to_path_buf());
        config
    }

    #[tokio::test]
    async fn a_program_that_runs_passes_and_one_that_fails_or_is_missing_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ok = script(dir.path(), "echo v1");
        assert_eq!(
            check_runs(&ok, "--version", VERSION_TIMEOUT).await.unwrap(),
            None
        );
        let failing = script(dir.path(), "echo 'no such flag' >&2; exit 3");
        match check_runs(&failing, "--version", VERSION_TIMEOUT).await {
            Err(HarnessError::DoesNotRun { problem, .. }) => {
                assert_eq!(problem, "exited with code 3: no such flag")
            }
            other => panic!("{other:?}"),
        }
        let missing = CliConfig::new(dir.path().join("missing"));
        assert!(matches!(
            check_runs(&missing, "--version", VERSION_TIMEOUT).await,
            Err(HarnessError::Spawn { .. })
        ));
    }

    #[tokio::test]
    async fn a_program_that_does_not_answer_is_killed_and_only_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let hangs = script(
            dir.path(),
            &format!("echo $$ > {}; exec sleep 600", pid_file.display()),
        );
        let warning = check_runs(&hangs, "--version", Duration::from_millis(500))
            .await
            .unwrap()
            .unwrap();
        assert!(
            warning.contains("did not answer within 500ms (killed)"),
            "{warning}"
        );
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Killed and reaped: no such process any more.
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{pid} still runs"
        );
    }
}
