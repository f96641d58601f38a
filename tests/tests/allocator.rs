//! `relay` allocates with jemalloc, with the settings its `main.rs` gives it (freed pages
//! back to the system within about a second, by jemalloc's own thread): a renamed symbol
//! or a dropped line would leave jemalloc on its defaults without a word, which keep
//! freed memory longer (ops/BENCHMARKS.md part 25).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn relay_runs_on_jemalloc_with_its_settings() {
    // jemalloc prints its options at exit when asked to from the environment.
    let out = Command::new(relay_tests::relay_bin())
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stats = String::from_utf8_lossy(&out.stderr);
    // Each followed by the value in effect, in parentheses: "1000 (" is not the default's
    // "10000 (".
    for option in [
        "opt.background_thread: true (",
        "opt.dirty_decay_ms: 1000 (",
    ] {
        assert!(stats.contains(option), "no {option:?} in:\n{stats}");
    }
}
