//! The pieces of `relay-bench` that are not scenarios: the rows of its table (a figure,
//! the baseline measured in the same run, their ratio, the target and whether it is
//! met), the machine's description, and the marked section of `ops/BENCHMARKS.md` that a
//! run replaces (everything outside it, the hand-written notes, stays as it is).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The line that opens the section a run replaces.
pub const LATEST_START: &str = "<!-- relay-bench: latest run (replaced by ops/bench) -->";
/// The line that closes it.
pub const LATEST_END: &str = "<!-- relay-bench: end of latest run -->";

/// What a figure should be.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    /// The figure at most this (in its unit).
    AtMost(f64),
    /// The figure at least this.
    AtLeast(f64),
    /// The figure divided by the baseline at most this.
    RatioAtMost(f64),
    /// The figure divided by the baseline at least this.
    RatioAtLeast(f64),
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The scenario's number in issue 9 (1 to 7).
    pub scenario: u8,
    pub name: String,
    /// `None`: the scenario failed (see `detail`) or has no figure.
    pub value: Option<f64>,
    pub unit: String,
    /// What the baseline is, and its figure (same unit), if there is one.
    pub baseline_what: String,
    pub baseline: Option<f64>,
    pub goal: Option<Goal>,
    /// Anything worth reading next to the figure (sizes, counts, an error).
    pub detail: String,
}

impl Row {
    pub fn new(scenario: u8, name: &str, unit: &str) -> Row {
        Row {
            scenario,
            name: name.to_string(),
            value: None,
            unit: unit.to_string(),
            baseline_what: String::new(),
            baseline: None,
            goal: None,
            detail: String::new(),
        }
    }

    pub fn value(mut self, v: f64) -> Row {
        self.value = Some(v);
        self
    }

    pub fn baseline(mut self, what: &str, v: Option<f64>) -> Row {
        self.baseline_what = what.to_string();
        self.baseline = v;
        self
    }

    pub fn goal(mut self, g: Goal) -> Row {
        self.goal = Some(g);
        self
    }

    pub fn detail(mut self, d: impl Into<String>) -> Row {
        self.detail = d.into();
        self
    }

    /// A row for a scenario that could not produce its figure.
    pub fn failed(scenario: u8, name: &str, error: &anyhow::Error) -> Row {
        Row::new(scenario, name, "").detail(format!("ERROR: {error:#}"))
    }

    pub fn ratio(&self) -> Option<f64> {
        match (self.value, self.baseline) {
            (Some(v), Some(b)) if b != 0.0 && v.is_finite() && b.is_finite() => Some(v / b),
            _ => None,
        }
    }

    /// `Some(true)`: the goal is met; `Some(false)`: missed; `None`: no goal, or no
    /// figure to judge.
    pub fn met(&self) -> Option<bool> {
        let v = self.value?;
        Some(match self.goal? {
            Goal::AtMost(t) => v <= t,
            Goal::AtLeast(t) => v >= t,
            Goal::RatioAtMost(t) => self.ratio()? <= t,
            Goal::RatioAtLeast(t) => self.ratio()? >= t,
        })
    }

    fn cells(&self) -> [String; 7] {
        let figure = match self.value {
            Some(v) => format!("{} {}", number(v), self.unit),
            None => "ERROR".to_string(),
        };
        let baseline = match self.baseline {
            Some(b) => format!("{}: {} {}", self.baseline_what, number(b), self.unit),
            None if self.baseline_what.is_empty() => "-".to_string(),
            None => self.baseline_what.clone(),
        };
        let ratio = self
            .ratio()
            .map(|r| format!("{r:.2}x"))
            .unwrap_or_else(|| "-".into());
        let goal = match self.goal {
            Some(Goal::AtMost(t)) => format!("<= {} {}", number(t), self.unit),
            Some(Goal::AtLeast(t)) => format!(">= {} {}", number(t), self.unit),
            Some(Goal::RatioAtMost(t)) => format!("<= {t}x"),
            Some(Goal::RatioAtLeast(t)) => format!(">= {t}x"),
            None => "-".into(),
        };
        let verdict = match (self.value, self.met()) {
            (None, _) => "ERROR",
            (_, Some(true)) => "ok",
            (_, Some(false)) => "MISS",
            (_, None) => "",
        };
        [
            self.scenario.to_string(),
            self.name.clone(),
            figure,
            baseline,
            ratio,
            goal,
            verdict.to_string(),
        ]
    }
}

/// A figure with 3 significant digits at most, thousands separated: `1,234,567`,
/// `45.2`, `0.0123`.
pub fn number(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    if a >= 100.0 {
        let mut digits = format!("{:.0}", a);
        let mut out = String::new();
        while digits.len() > 3 {
            let tail = digits.split_off(digits.len() - 3);
            out = format!(",{tail}{out}");
        }
        format!("{}{digits}{out}", if v < 0.0 { "-" } else { "" })
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3}")
    }
}

const HEADERS: [&str; 7] = [
    "#",
    "scenario",
    "figure",
    "baseline (same run)",
    "ratio",
    "target",
    "",
];

/// The rows as aligned text, one line per row (what the bench prints).
pub fn text_table(rows: &[Row]) -> String {
    let cells: Vec<[String; 7]> = rows.iter().map(Row::cells).collect();
    let mut widths = HEADERS.map(str::len);
    for c in &cells {
        for (w, cell) in widths.iter_mut().zip(c) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |c: &[String]| {
        let mut s = String::new();
        for (i, (cell, w)) in c.iter().zip(widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let _ = write!(s, "{cell:<w$}");
        }
        s.trim_end().to_string()
    };
    let mut out = line(&HEADERS.map(String::from));
    out.push('\n');
    for c in &cells {
        out.push_str(&line(c));
        out.push('\n');
    }
    out
}

/// The rows as a markdown table, then each row's detail as a list.
pub fn markdown_table(rows: &[Row]) -> String {
    let mut out = format!("| {} |\n", HEADERS.join(" | "));
    out.push_str(&format!("|{}\n", "---|".repeat(HEADERS.len())));
    for r in rows {
        let c = r.cells().map(|c| c.replace('|', "\\|"));
        out.push_str(&format!("| {} |\n", c.join(" | ")));
    }
    let details: Vec<&Row> = rows.iter().filter(|r| !r.detail.is_empty()).collect();
    if !details.is_empty() {
        out.push('\n');
        for r in details {
            out.push_str(&format!("- {} {}: {}\n", r.scenario, r.name, r.detail));
        }
    }
    out
}

/// The machine and the build a run measured, one `- key: value` line each.
pub fn machine_description(repo: &Path) -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_else(|_| "?".into());
    let ram = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let mut commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    if git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty()) {
        commit.push_str(" (with uncommitted changes)");
    }
    vec![
        ("nproc".into(), nproc),
        ("CPU".into(), cpu),
        ("RAM".into(), ram),
        ("kernel".into(), kernel),
        ("commit".into(), commit),
    ]
}

/// `text` with the section between [`LATEST_START`] and [`LATEST_END`] replaced by
/// `section` (the markers stay); without markers, the section is added at the end.
pub fn replace_latest(text: &str, section: &str) -> String {
    let body = format!("{LATEST_START}\n{}\n{LATEST_END}", section.trim_end());
    match (text.find(LATEST_START), text.find(LATEST_END)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{body}{}", &text[..a], &text[b + LATEST_END.len()..])
        }
        _ => {
            let mut out = text.trim_end().to_string();
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(&body);
            out.push('\n');
            out
        }
    }
}

/// The `q`-quantile (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    quantile(&v, 0.5)
}

/// The size of every file under `dir` (their lengths, not the blocks they use).
pub fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            total += dir_bytes(&entry.path())?;
        } else {
            total += meta.len();
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_run_replaces_only_its_section_and_keeps_the_notes() {
        let file = format!(
            "# Benchmarks\n\nintro\n\n{LATEST_START}\nold table\n{LATEST_END}\n\n## Notes\n\nbefore: 3x\n"
        );
        let out = replace_latest(&file, "new table\n");
        assert_eq!(
            out,
            format!(
                "# Benchmarks\n\nintro\n\n{LATEST_START}\nnew table\n{LATEST_END}\n\n## Notes\n\nbefore: 3x\n"
            )
        );
        // Without markers (a new file), the section is added.
        assert_eq!(
            replace_latest("# B\n", "t"),
            format!("# B\n\n{LATEST_START}\nt\n{LATEST_END}\n")
        );
    }

    #[test]
    fn goals_judge_the_figure_or_its_ratio() {
        let r = Row::new(1, "x", "deltas/s")
            .value(30.0)
            .baseline("raw", Some(100.0));
        assert_eq!(r.clone().goal(Goal::RatioAtLeast(0.3)).met(), Some(true));
        assert_eq!(r.clone().goal(Goal::RatioAtLeast(0.31)).met(), Some(false));
        assert_eq!(r.clone().goal(Goal::AtMost(20.0)).met(), Some(false));
        assert_eq!(r.clone().met(), None);
        let cells = r.goal(Goal::AtLeast(50.0)).cells();
        assert_eq!(cells[2], "30.0 deltas/s");
        assert_eq!(cells[4], "0.30x");
        assert_eq!(cells[6], "MISS");
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(number(1_234_567.4), "1,234,567");
        assert_eq!(number(123.4), "123");
        assert_eq!(number(45.23), "45.2");
        assert_eq!(number(1.234), "1.23");
        assert_eq!(number(0.01234), "0.012");
        assert_eq!(number(0.0), "0");
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(50.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&v, 1.0), Some(100.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
