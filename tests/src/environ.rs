//! An agent harness that records the environment it was started with, for the tests of
//! what reaches an agent's process (secrets, the broker's own variables).

// Test support: a failed step is the failure of the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::load::instant_codex_bin;

/// Writes `<dir>/<name>.sh`, a harness that writes its environment to the returned dump
/// file (`<dir>/<name>.environ`, whole or not at all) and then execs the stand-in codex
/// (keeping its pid, so the agent's endpoint pid is the wrapper's). Returns (wrapper,
/// dump).
pub fn recording_harness(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let dump = dir.join(format!("{name}.environ"));
    let wrapper = dir.join(format!("{name}.sh"));
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncat /proc/$$/environ > '{dump}.part' && mv '{dump}.part' '{dump}'\nexec '{bin}' \"$@\"\n",
            dump = dump.display(),
            bin = instant_codex_bin().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    (wrapper, dump)
}

/// The variables a [`recording_harness`] recorded.
pub fn recorded(dump: &Path) -> BTreeMap<String, String> {
    std::fs::read(dump)
        .unwrap()
        .split(|&b| b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| {
            let v = String::from_utf8_lossy(v);
            let (k, v) = v.split_once('=').unwrap_or((&v, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}
