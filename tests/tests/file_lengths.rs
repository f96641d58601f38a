//! No Rust file of the workspace (sources and tests; not `target/` nor generated files) is
//! over 600 lines unless its leading `//!` block says why in one line:
//!
//! `//! Over 600 lines: <the reason, on this one line>`
//!
//! A file that shrinks back under the limit drops its marker, so every marker stays true.

use std::path::{Path, PathBuf};

const LIMIT: usize = 600;
const MARKER: &str = "//! Over 600 lines: ";
/// A reason is a sentence, not a word or two.
const MIN_REASON: usize = 20;
/// The repository's line width: a reason that needs more is not one line.
const MAX_LINE: usize = 100;

/// Files another part of issue 24 splits under the limit (the `seam` branch): they are
/// neither checked nor marked here. Once that split is merged, this list must be
/// emptied (the check below fails while a listed file is short).
const BEING_SPLIT: &[&str] = &[
    "harnesses/src/codex/translate.rs",
    "harnesses/src/tmux/session.rs",
];

/// What is wrong with one file (`rel`: its path from the workspace root), if anything.
fn verdict(rel: &str, text: &str) -> Option<String> {
    let lines = text.lines().count();
    let header: Vec<&str> = text
        .lines()
        .take_while(|l| l.starts_with("//!") || l.starts_with("#!") || l.trim().is_empty())
        .filter(|l| l.starts_with("//!"))
        .collect();
    let marker = header.iter().find(|l| l.starts_with(MARKER));
    if BEING_SPLIT.contains(&rel) {
        return (lines <= LIMIT).then(|| {
            format!("{rel}: {lines} lines now; remove it from BEING_SPLIT in tests/tests/file_lengths.rs")
        });
    }
    match marker {
        None if lines > LIMIT => Some(format!(
            "{rel}: {lines} lines; split it by concern, or put `{MARKER}<why it stays whole>` in its leading `//!` block"
        )),
        Some(_) if lines <= LIMIT => Some(format!(
            "{rel}: {lines} lines, yet marked `{}`; remove the marker",
            MARKER.trim_end()
        )),
        Some(line) if line[MARKER.len()..].trim().len() < MIN_REASON => Some(format!(
            "{rel}: the marker gives no reason: `{line}`"
        )),
        Some(line) if line.chars().count() > MAX_LINE => Some(format!(
            "{rel}: the reason is longer than one line of {MAX_LINE} characters: `{line}`"
        )),
        _ => None,
    }
}

/// Whether a file says it is generated (a tool rewrites it; its length is the tool's).
fn generated(text: &str) -> bool {
    text.lines().take(5).any(|l| l.contains("@generated"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "target" && name != "node_modules" && !name.starts_with('.') {
                rust_files(&path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[test]
fn no_file_is_over_600_lines_without_a_one_line_reason() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()?;
    let mut files = Vec::new();
    rust_files(&root, &mut files)?;
    assert!(files.len() > 100, "only {} files found", files.len());
    let mut problems = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let rel = file.strip_prefix(&root)?.to_string_lossy().into_owned();
        if !generated(&text) {
            problems.extend(verdict(&rel, &text));
        }
    }
    assert!(
        problems.is_empty(),
        "{} file(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    Ok(())
}

#[test]
fn the_check_fails_a_long_file_without_its_reason_and_a_stale_marker() {
    let body = |n: usize| "fn f() {}\n".repeat(n);
    let header = "//! A module.\n//!\n";
    let marked = format!(
        "{header}{MARKER}one test per behaviour, read as one file.\n#![allow(dead_code)]\n"
    );

    assert_eq!(verdict("a.rs", &format!("{header}{}", body(598))), None);
    assert_eq!(
        verdict("a.rs", &format!("{header}{}", body(599))),
        Some(format!("a.rs: 601 lines; split it by concern, or put `{MARKER}<why it stays whole>` in its leading `//!` block"))
    );
    assert_eq!(verdict("a.rs", &format!("{marked}{}", body(600))), None);
    assert_eq!(
        verdict("a.rs", &format!("{marked}{}", body(10))),
        Some("a.rs: 14 lines, yet marked `//! Over 600 lines:`; remove the marker".into())
    );
    // The marker counts only in the leading block, with a reason, on one line.
    let late = format!(
        "{header}{}{MARKER}one test per behaviour, read as one file.\n",
        body(600)
    );
    assert!(verdict("a.rs", &late).is_some_and(|v| v.contains("split it")));
    let bare = format!("{header}{MARKER}long.\n{}", body(600));
    assert!(verdict("a.rs", &bare).is_some_and(|v| v.contains("no reason")));
    let wide = format!("{header}{MARKER}{}\n{}", "why ".repeat(25), body(600));
    assert!(verdict("a.rs", &wide).is_some_and(|v| v.contains("one line")));
    // A file being split elsewhere is let through until it is short.
    assert_eq!(verdict(BEING_SPLIT[0], &body(700)), None);
    assert!(verdict(BEING_SPLIT[0], &body(500)).is_some_and(|v| v.contains("BEING_SPLIT")));
    assert!(generated("// @generated by a tool\n"));
}
