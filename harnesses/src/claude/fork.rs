//! Where a fork of a Claude Code session starts: the source session's transcript and the
//! message to cut it at. Pure but for reading files (run it off the async threads).
//!
//! Claude Code 2.1.197 keeps each session as `<config dir>/projects/<project>/<id>.jsonl`,
//! `<project>` being the working directory with every character but ASCII letters and
//! digits made `-` (cut at 200 characters plus a hash beyond). A fork runs in the new
//! agent's directory, so the source is found from its own (`ForkSpec::cwd`), else by
//! looking in every project; `--resume <path>.jsonl` then loads it from wherever it is.
//!
//! The transcript's lines: `user` and `assistant` entries (each with a `uuid` and the
//! `parentUuid` before it), `attachment`, `queue-operation`, `last-prompt`... A turn's
//! user entries (its prompt and the tool results) share one `promptId`; `assistant`
//! entries have none; a subagent's entries have `isSidechain: true`. So turn N+1 begins at
//! the first user entry with the (N+1)-th `promptId`, and turn N ends at the last
//! assistant entry before it: the `--resume-session-at` cut (which keeps the messages up
//! to and including that one).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::HarnessError;

/// Longest project directory name Claude Code uses whole.
const MAX_PROJECT_NAME: usize = 200;

/// Claude Code's directory name for the project at `cwd` (its `$E`).
pub(super) fn project_dir_name(cwd: &str) -> String {
    // JavaScript's `replace(/[^a-zA-Z0-9]/g, "-")` sees UTF-16 code units.
    let units: Vec<u16> = cwd.encode_utf16().collect();
    let name: String = units
        .iter()
        .map(|&u| match char::from_u32(u32::from(u)) {
            Some(c) if c.is_ascii_alphanumeric() => c,
            _ => '-',
        })
        .collect();
    if name.len() <= MAX_PROJECT_NAME {
        return name;
    }
    // Java's string hash over the UTF-16 units, as a signed 32-bit value, then
    // `Math.abs(...).toString(36)`.
    let hash = units
        .iter()
        .fold(0i32, |h, &u| h.wrapping_mul(31).wrapping_add(i32::from(u)));
    format!(
        "{}-{}",
        &name[..MAX_PROJECT_NAME],
        base36(i64::from(hash).unsigned_abs())
    )
}

fn base36(mut n: u64) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// The transcript of `session` under `config_dir`: in the project of `cwd` (as given, or
/// its real path), else in any project. [`HarnessError::Fork`] when there is none.
pub(super) fn find_transcript(
    config_dir: &Path,
    cwd: &str,
    session: &str,
) -> Result<PathBuf, HarnessError> {
    let projects = config_dir.join("projects");
    let file = format!("{session}.jsonl");
    let mut dirs = vec![project_dir_name(cwd)];
    if let Ok(real) = std::fs::canonicalize(cwd) {
        dirs.push(project_dir_name(&real.display().to_string()));
    }
    if let Some(found) = dirs
        .iter()
        .map(|d| projects.join(d).join(&file))
        .find(|p| p.is_file())
    {
        return Ok(found);
    }
    let elsewhere = std::fs::read_dir(&projects)
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.path().join(&file))
        .find(|p| p.is_file());
    elsewhere.ok_or_else(|| HarnessError::Fork {
        detail: format!(
            "claude has no session {session} (no {file} under {})",
            projects.display()
        ),
    })
}

/// The uuid of the message that ends the transcript's turn `keep` (1-based), to resume at;
/// `None` when it has no turn after that one (nothing to cut).
pub(super) fn cut_after_turn(transcript: &str, keep: u32) -> Result<Option<String>, HarnessError> {
    let mut prompts: Vec<String> = Vec::new();
    let mut last_assistant: Option<String> = None;
    for line in transcript.lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if entry.get("isSidechain").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        let uuid = entry.get("uuid").and_then(Value::as_str);
        match entry.get("type").and_then(Value::as_str) {
            Some("assistant") => last_assistant = uuid.map(str::to_string),
            Some("user") => {
                let Some(prompt) = entry.get("promptId").and_then(Value::as_str) else {
                    continue;
                };
                if prompts.iter().any(|p| p == prompt) {
                    continue;
                }
                if prompts.len() == keep as usize {
                    return match last_assistant {
                        Some(uuid) => Ok(Some(uuid)),
                        None => Err(HarnessError::Fork {
                            detail: format!("turn {keep} of the session has no answer to cut at"),
                        }),
                    };
                }
                prompts.push(prompt.to_string());
            }
            _ => {}
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Lines as Claude Code 2.1.197 wrote them for two stream-json turns, the first with a
    /// tool call (trimmed to the fields read here).
    const TWO_TURNS: &str = r#"{"type":"queue-operation","operation":"enqueue","content":"first"}
{"parentUuid":null,"isSidechain":false,"promptId":"p1","type":"user","message":{"role":"user","content":[{"type":"text","text":"first"}]},"uuid":"u1"}
{"parentUuid":"u1","isSidechain":false,"type":"attachment","uuid":"at1"}
{"parentUuid":"at1","isSidechain":false,"type":"assistant","message":{"content":[{"type":"tool_use","id":"call_1"}]},"uuid":"a1"}
{"parentUuid":"a1","isSidechain":false,"promptId":"p1","type":"user","message":{"content":[{"type":"tool_result"}]},"uuid":"u2"}
{"parentUuid":"u2","isSidechain":true,"type":"assistant","uuid":"side"}
{"parentUuid":"u2","isSidechain":false,"type":"assistant","message":{"content":[{"type":"text","text":"done"}]},"uuid":"a2"}
{"type":"queue-operation","operation":"enqueue","content":"second"}
{"parentUuid":"a2","isSidechain":false,"promptId":"p2","type":"user","message":{"role":"user","content":[{"type":"text","text":"second"}]},"uuid":"u3"}
{"parentUuid":"u3","isSidechain":false,"type":"assistant","message":{"content":[{"type":"text","text":"ok"}]},"uuid":"a3"}
{"type":"last-prompt","lastPrompt":"second","leafUuid":"a3"}
"#;

    #[test]
    fn a_turn_ends_at_its_last_answer_before_the_next_prompt() {
        assert_eq!(cut_after_turn(TWO_TURNS, 1).unwrap().as_deref(), Some("a2"));
        assert_eq!(cut_after_turn(TWO_TURNS, 2).unwrap(), None);
        assert_eq!(cut_after_turn(TWO_TURNS, 7).unwrap(), None);
        assert_eq!(cut_after_turn("", 1).unwrap(), None);
        let unanswered = r#"{"type":"user","promptId":"p1","uuid":"u1"}
{"type":"user","promptId":"p2","uuid":"u2"}"#;
        assert!(matches!(
            cut_after_turn(unanswered, 1),
            Err(HarnessError::Fork { .. })
        ));
    }

    #[test]
    fn project_names_are_claude_codes() {
        assert_eq!(project_dir_name("/tmp/fork27/w1"), "-tmp-fork27-w1");
        assert_eq!(project_dir_name("/a/b.c_d é"), "-a-b-c-d--");
        let long = format!("/{}", "x".repeat(250));
        let name = project_dir_name(&long);
        assert_eq!(&name[..201], &format!("-{}-", "x".repeat(199))[..201]);
        assert!(name.len() > 201 && name[201..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_eq!(base36(0), "0");
        assert_eq!(base36(2_147_483_648), "zik0zk");
    }

    #[test]
    fn a_transcript_is_found_in_its_project_or_any_other() {
        let config = tempfile::tempdir().unwrap();
        let id = "9a1f0000-0000-4000-8000-000000000000";
        let missing = find_transcript(config.path(), "/w/a", id).unwrap_err();
        assert!(
            missing
                .to_string()
                .contains(&format!("claude has no session {id}")),
            "{missing}"
        );
        let other = config.path().join("projects/-elsewhere");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join(format!("{id}.jsonl")), "").unwrap();
        assert_eq!(
            find_transcript(config.path(), "/w/a", id).unwrap(),
            other.join(format!("{id}.jsonl"))
        );
        let own = config.path().join("projects/-w-a");
        std::fs::create_dir_all(&own).unwrap();
        std::fs::write(own.join(format!("{id}.jsonl")), "").unwrap();
        assert_eq!(
            find_transcript(config.path(), "/w/a", id).unwrap(),
            own.join(format!("{id}.jsonl"))
        );
    }
}
