//! Fairness between flights: the runtime's reports waiting at once are taken together,
//! and each flight's run of streamed text becomes one report (up to
//! [`DELTA_MERGE_MAX`] bytes), so a flight streaming a burst is a few commands, not
//! thousands queued ahead of everyone else's next delta.

use std::collections::HashMap;

use relay_protocol::domain::FlightChange;
use relay_protocol::runtime::Report;

use crate::broker::DELTA_MERGE_MAX;

/// Most reports taken at once from the runtime's channel.
pub(super) const DRAIN_MAX: usize = 1024;

/// `reports` in order, with each flight's consecutive deltas (no other report between
/// them but other flights' deltas) joined into one, up to [`DELTA_MERGE_MAX`] bytes. Any other
/// report ends every run: what came before it stays before it.
pub(super) fn merge_deltas(reports: impl IntoIterator<Item = Report>) -> Vec<Report> {
    let mut out: Vec<Report> = Vec::new();
    // flight -> index in `out` of its open run of deltas.
    let mut open: HashMap<String, usize> = HashMap::new();
    for report in reports {
        if let Report::Flight {
            flight,
            change: FlightChange::Delta { text },
        } = &report
        {
            if let Some(&i) = open.get(flight) {
                if let Report::Flight {
                    change: FlightChange::Delta { text: run },
                    ..
                } = &mut out[i]
                {
                    if run.len() + text.len() <= DELTA_MERGE_MAX {
                        run.push_str(text);
                        continue;
                    }
                }
            }
            open.insert(flight.clone(), out.len());
        } else {
            open.clear();
        }
        out.push(report);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn delta(flight: &str, text: &str) -> Report {
        Report::Flight {
            flight: flight.into(),
            change: FlightChange::Delta { text: text.into() },
        }
    }

    fn note(flight: &str) -> Report {
        Report::Flight {
            flight: flight.into(),
            change: FlightChange::Note {
                text: "n".into(),
                by: None,
            },
        }
    }

    fn texts(reports: &[Report]) -> Vec<(String, String)> {
        reports
            .iter()
            .map(|r| match r {
                Report::Flight {
                    flight,
                    change: FlightChange::Delta { text },
                } => (flight.clone(), text.clone()),
                Report::Flight { flight, .. } => (flight.clone(), "<other>".into()),
                _ => ("-".into(), "<other>".into()),
            })
            .collect()
    }

    #[test]
    fn a_burst_becomes_one_report_and_the_neighbour_keeps_its_own_in_order() {
        let mut reports: Vec<Report> = (0..1000).map(|i| delta("a", &format!("{i},"))).collect();
        reports.insert(500, delta("b", "x"));
        reports.push(delta("b", "y"));
        let merged = merge_deltas(reports);
        let want_a: String = (0..1000).map(|i| format!("{i},")).collect();
        assert_eq!(
            texts(&merged),
            vec![("a".into(), want_a), ("b".into(), "xy".into())]
        );
    }

    #[test]
    fn any_other_report_ends_every_run_and_stays_in_its_place() {
        let merged = merge_deltas([
            delta("a", "1"),
            delta("b", "1"),
            note("a"),
            delta("a", "2"),
            delta("b", "2"),
            delta("a", "3"),
        ]);
        assert_eq!(
            texts(&merged),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "1".into()),
                ("a".into(), "<other>".into()),
                ("a".into(), "23".into()),
                ("b".into(), "2".into()),
            ]
        );
    }

    #[test]
    fn a_run_is_cut_at_the_cap_without_losing_or_reordering_text() {
        let chunk = "z".repeat(DELTA_MERGE_MAX / 4 + 1);
        let merged = merge_deltas((0..10).map(|_| delta("a", &chunk)));
        let t = texts(&merged);
        assert!(t.len() > 1, "cut into slices");
        assert!(t.iter().all(|(_, s)| s.len() <= DELTA_MERGE_MAX));
        let whole: String = t.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(whole, chunk.repeat(10));
    }
}
