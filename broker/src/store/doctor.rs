//! The consistency check of `relay doctor` and the tests: every projection rebuilt from
//! the log into a scratch store and compared with the live one, and the log's gaps.

use relay_protocol::event::Event;
use serde::Serialize;

use super::keys::{T, TREE_NAMES};
use super::projections::{apply, PlainSink};
use super::shared::decode_event;
use super::Store;
use crate::error::BrokerError;

impl Store {
    /// Rebuilds every projection from the event log into a scratch store and compares it
    /// with the live projections. Also checks that the log's sequence has no gaps.
    pub fn verify(&self) -> Result<VerifyReport, BrokerError> {
        let scratch = Store::temporary()?;
        let mut report = VerifyReport::default();
        let mut expected = 1u64;
        let sink = PlainSink(&scratch);
        self.log().scan(0, |record| {
            let event: Event = decode_event(self.log(), &record.payload)?;
            // The log checks its records' seqs; the event inside must agree.
            if event.seq != expected || record.seq != event.seq {
                report.gaps.push((expected, event.seq));
            }
            // Saturating: a damaged log may hold any seq, the largest too; what follows
            // it is then a gap, not an overflow.
            expected = event.seq.saturating_add(1);
            report.events += 1;
            apply(&sink, &event, record.pos, record.link.is_some())?;
            Ok::<_, BrokerError>(true)
        })?;
        for t in TREES_PROJECTED {
            let (live, rebuilt) = (self.tree(t), scratch.tree(t));
            let live_entries: Vec<_> = live.iter().collect::<Result<_, _>>()?;
            let rebuilt_entries: Vec<_> = rebuilt.iter().collect::<Result<_, _>>()?;
            if live_entries != rebuilt_entries {
                report
                    .mismatched_trees
                    .push(TREE_NAMES[t as usize].to_string());
            }
        }
        Ok(report)
    }

    /// [`Store::verify`] with what a person checking a data dir wants to see.
    pub fn doctor(&self) -> Result<DoctorReport, BrokerError> {
        let verify = self.verify()?;
        let (flights, live_flights) = self.flight_counts()?;
        Ok(DoctorReport {
            consistent: verify.is_consistent(),
            events: verify.events,
            last_seq: self.last_seq()?,
            flights,
            live_flights,
            gaps: verify.gaps,
            mismatched_trees: verify.mismatched_trees,
        })
    }

    /// (flights, flights not in a terminal state), by a scan.
    pub fn flight_counts(&self) -> Result<(u64, u64), BrokerError> {
        // Counted by keys: nothing is decoded.
        Ok((
            self.tree(T::Flights).len() as u64,
            self.tree(T::LiveFlights).len() as u64,
        ))
    }
}

/// What `relay doctor` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DoctorReport {
    /// No gap in the log, and every projection equals a rebuild from it.
    pub consistent: bool,
    pub events: u64,
    pub last_seq: u64,
    pub flights: u64,
    /// Flights not in a terminal state (a broker that starts resumes or fails them).
    pub live_flights: u64,
    /// (expected seq, found seq) wherever the log skips.
    pub gaps: Vec<(u64, u64)>,
    pub mismatched_trees: Vec<String>,
}

/// The trees made by [`apply`] alone: rebuilt from the log, compared by the doctor.
pub(super) const TREES_PROJECTED: [T; 18] = [
    T::EventPos,
    T::Agents,
    T::Conversations,
    T::Messages,
    T::MessageIds,
    T::Invocations,
    T::Flights,
    T::FlightUpdates,
    T::Deliveries,
    T::Approvals,
    T::Bindings,
    T::FlightApprovals,
    T::LiveFlights,
    T::FlightChildren,
    T::ReplayIndex,
    T::Rules,
    T::UsageDaily,
    T::UsageTrees,
];

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct VerifyReport {
    pub events: u64,
    /// (expected seq, found seq) wherever the log skips.
    pub gaps: Vec<(u64, u64)>,
    /// Projections that differ from a rebuild from the log.
    pub mismatched_trees: Vec<String>,
}

impl VerifyReport {
    pub fn is_consistent(&self) -> bool {
        self.gaps.is_empty() && self.mismatched_trees.is_empty()
    }
}
