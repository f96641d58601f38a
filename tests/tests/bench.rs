//! The benchmarks cannot rot: `relay-bench --quick` runs every scenario once (small sizes,
//! real processes) and each must produce a figure. No time is asserted: a miss of a
//! target is a figure to read, not a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::process::Command;

use relay_tests::bench::Row;

#[test]
fn every_scenario_of_the_quick_bench_produces_a_figure() {
    let tmp = tempfile::tempdir().unwrap();
    let rows_file = tmp.path().join("rows.json");
    let markdown = tmp.path().join("BENCHMARKS.md");
    std::fs::write(&markdown, "# Benchmarks\n\n## Notes\n\nkept\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_relay-bench"))
        .arg("--quick")
        .arg("--relay")
        .arg(relay_tests::relay_bin())
        .arg("--json")
        .arg(&rows_file)
        .arg("--markdown")
        .arg(&markdown)
        .env(
            "RELAY_INSTANT_CODEX_BIN",
            env!("CARGO_BIN_EXE_relay-instant-codex"),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "relay-bench --quick failed:\n{stderr}"
    );
    let rows: Vec<Row> = serde_json::from_slice(&std::fs::read(&rows_file).unwrap()).unwrap();
    for r in &rows {
        assert!(
            r.value.is_some_and(f64::is_finite),
            "no figure for {r:?}\n{stderr}"
        );
    }
    let scenarios: BTreeSet<u8> = rows.iter().map(|r| r.scenario).collect();
    assert_eq!(scenarios, (1..=10).collect::<BTreeSet<u8>>());
    // One line per row on stdout, and the same table in the file, notes kept.
    for r in &rows {
        assert!(stdout.contains(&r.name), "{} not printed", r.name);
    }
    let md = std::fs::read_to_string(&markdown).unwrap();
    assert!(md.contains("## Notes\n\nkept\n"), "{md}");
    assert!(md.contains("| 1 | delta throughput |"), "{md}");
    assert!(md.contains("- commit: "), "{md}");
    // Which relay ran: a run of another build (`--relay`) says so.
    assert!(
        md.contains(&format!("- relay: {}", relay_tests::relay_bin().display())),
        "{md}"
    );
}
