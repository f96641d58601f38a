//! What one ACP agent needs that the protocol does not say.
//!
//! Gemini CLI 0.61.0 loses a session for good when it is loaded (`session/load`) in
//! the same wall-clock minute (UTC) its file was created: the load fails ("Invalid
//! session identifier") and wipes the history (`HARNESSES.md`). Its file is
//! `$HOME/.gemini/tmp/<project>/chats/session-<YYYY-MM-DDTHH-MM>-<id[0:8]>.jsonl` (under
//! `$GEMINI_CLI_HOME` instead of `$HOME` when the agent sets it), the
//! stamp that minute. So before loading, Relay looks for a file of the session stamped
//! with the current minute and, if there is one, waits for the next minute. A session
//! Relay's own process holds is never loaded at all (the launcher returns it as open).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `YYYY-MM-DDTHH-MM` of `secs` since the epoch, in UTC (Gemini's file stamp).
pub(super) fn minute_stamp(secs: u64) -> String {
    let (hh, mm) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    let (y, m, d) = relay_protocol::clock::civil_from_days(secs / 86_400);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}-{mm:02}")
}

/// The stamps of session `id`'s files under `home`'s Gemini chats.
fn session_stamps(home: &Path, id: &str) -> Vec<String> {
    let short: String = id.chars().take(8).collect();
    let suffix = format!("-{short}.jsonl");
    let Ok(projects) = std::fs::read_dir(home.join(".gemini/tmp")) else {
        return Vec::new();
    };
    let mut stamps = Vec::new();
    for project in projects.flatten() {
        let Ok(files) = std::fs::read_dir(project.path().join("chats")) else {
            continue;
        };
        for file in files.flatten() {
            let name = file.file_name().to_string_lossy().to_string();
            if let Some(stamp) = name
                .strip_prefix("session-")
                .and_then(|rest| rest.strip_suffix(&suffix))
            {
                stamps.push(stamp.to_string());
            }
        }
    }
    stamps
}

/// The home Gemini CLI keeps its `.gemini` in, for an agent with variables `env`:
/// `GEMINI_CLI_HOME` when set (Gemini CLI's `homedir()` reads it first), else `HOME`.
fn gemini_home(env: &BTreeMap<String, String>) -> Option<PathBuf> {
    env.get("GEMINI_CLI_HOME")
        .filter(|h| !h.is_empty())
        .or_else(|| env.get("HOME"))
        .cloned()
        .or_else(|| std::env::var("HOME").ok())
        .map(PathBuf::from)
}

/// Waits, if a file of Gemini session `id` is stamped with this minute, until the next.
pub(super) async fn gemini_wait_for_next_minute(env: &BTreeMap<String, String>, id: &str) {
    let Some(home) = gemini_home(env) else { return };
    let id = id.to_string();
    let stamps = tokio::task::spawn_blocking(move || session_stamps(&home, &id))
        .await
        .unwrap_or_default();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    if stamps.contains(&minute_stamp(now.as_secs())) {
        let into_minute = Duration::from_secs(now.as_secs() % 60)
            + Duration::from_nanos(u64::from(now.subsec_nanos()));
        // A little past the turn of the minute, so the two clocks agree.
        let wait = Duration::from_secs(60).saturating_sub(into_minute) + Duration::from_millis(500);
        tracing::info!(
            ?wait,
            "gemini: waiting for the next minute before loading a session created in this one"
        );
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_stamp_is_gemini_s_utc_minute() {
        assert_eq!(minute_stamp(0), "1970-01-01T00-00");
        // 2026-11-26T09:41:59Z
        assert_eq!(minute_stamp(1_795_686_119), "2026-11-26T09-41");
        // A leap day.
        assert_eq!(minute_stamp(951_782_400), "2000-02-29T00-00");
    }

    #[test]
    fn gemini_s_home_is_gemini_cli_home_when_the_agent_sets_it() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // Gemini CLI's `homedir()` is `GEMINI_CLI_HOME` when set: its sessions are
        // there, and a same-minute load looked for under `HOME` would lose one.
        assert_eq!(
            gemini_home(&env(&[("HOME", "/h"), ("GEMINI_CLI_HOME", "/g")])),
            Some(PathBuf::from("/g"))
        );
        assert_eq!(
            gemini_home(&env(&[("HOME", "/h"), ("GEMINI_CLI_HOME", "")])),
            Some(PathBuf::from("/h"))
        );
        assert_eq!(
            gemini_home(&env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h"))
        );
    }

    #[test]
    fn a_session_s_files_are_found_by_its_short_id() {
        let home = tempfile::tempdir().unwrap();
        let chats = home.path().join(".gemini/tmp/work/chats");
        std::fs::create_dir_all(&chats).unwrap();
        std::fs::write(chats.join("session-2026-11-26T09-41-0a1b2c3d.jsonl"), "").unwrap();
        std::fs::write(chats.join("session-2026-11-26T09-40-ffffffff.jsonl"), "").unwrap();
        assert_eq!(
            session_stamps(home.path(), "0a1b2c3d-4e5f-6789"),
            ["2026-11-26T09-41"]
        );
        assert!(session_stamps(home.path(), "12345678").is_empty());
    }
}
