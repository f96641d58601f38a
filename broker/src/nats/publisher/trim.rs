//! What of a flight update is cut so that it fits a NATS message: its long texts (an
//! answer, a command's output, a patch), counted before anything is encoded.

/// Longest text kept in a flight update that is too large for NATS.
const TRIMMED_TEXT: usize = 16 * 1024;

use relay_protocol::domain::{Flight, FlightChange, FlightCommit, FlightUpdate, SharedStr};

/// Calls `$text` on each long text of `$update` and `$flight` (error, summary, a change's
/// text), `$shared` on each shared one (the flight's output, a change's final output, an
/// item's text) and `$patch` on each commit (its patch), by `&` or by `&mut` (`$($m)?`):
/// what [`trim_texts`] cuts is what [`text_bytes`] counts.
macro_rules! each_text {
    ($update:expr, $flight:expr, $text:expr, $shared:expr, $patch:expr $(, $m:ident)?) => {{
        #[allow(unused_mut)] // FnMut closures need it, fn items do not
        let (mut text, mut shared, mut patch) = ($text, $shared, $patch);
        for t in [& $($m)? $flight.error, & $($m)? $flight.summary].into_iter().flatten() {
            text(t);
        }
        if let Some(t) = & $($m)? $flight.output {
            shared(t);
        }
        match & $($m)? $update.change {
            FlightChange::State { reason, output, .. } => {
                if let Some(t) = reason {
                    text(t);
                }
                if let Some(t) = output {
                    shared(t);
                }
            }
            FlightChange::Delta { text: t }
            | FlightChange::Plan { text: t }
            | FlightChange::Diff { text: t }
            | FlightChange::CommandOutput { text: t, .. } => text(t),
            FlightChange::Item { text: Some(t), .. } => shared(t),
            FlightChange::Commit { commit } => patch(commit),
            _ => {}
        }
        // The record leaves the patch out; counted and cut there too should one be kept.
        if let Some(commit) = & $($m)? $flight.commit {
            patch(commit);
        }
    }};
}

/// Cuts the long texts of an update and its flight (output, deltas, a commit's patch) so
/// it fits a NATS message; the full text stays in the log (`relay flight ID`, `relay diff
/// FLIGHT`). A patch may be 256 KiB, and 6 times that as JSON with its control bytes
/// escaped: over NATS's default 1 MiB, the update would not go at all.
pub(super) fn trim_texts(update: &mut FlightUpdate, flight: &mut Flight) {
    const CUT: &str = "\n[... cut for NATS; the whole text is in the log]";
    fn cut(text: &mut String) {
        if relay_protocol::domain::truncate_bytes(text, TRIMMED_TEXT) {
            text.push_str(CUT);
        }
    }
    // A shared text is not changed in place (others hold it): its cut start, copied
    // alone, replaces it.
    fn cut_shared(text: &mut SharedStr) {
        let kept = relay_protocol::domain::prefix_bytes(text, TRIMMED_TEXT);
        if kept.len() < text.len() {
            *text = format!("{kept}{CUT}").into();
        }
    }
    each_text!(update, flight, cut, cut_shared, cut_patch, mut);
}

/// Bytes of the texts [`trim_texts`] cuts: an update whose texts alone are over the
/// server's limit cannot go whole, whatever its encoding.
pub(super) fn text_bytes(update: &FlightUpdate, flight: &Flight) -> usize {
    let (mut bytes, mut shared, mut patches) = (0, 0, 0);
    each_text!(
        update,
        flight,
        |t: &String| bytes += t.len(),
        |t: &SharedStr| shared += t.len(),
        |c: &FlightCommit| patches += c.patch.as_ref().map_or(0, String::len)
    );
    bytes + shared + patches
}

/// Cuts a commit's patch to [`TRIMMED_TEXT`], marked the way a runtime marks a patch over
/// [`relay_protocol::domain::MAX_RECORDED_PATCH`] (no text is added: it is a patch).
fn cut_patch(commit: &mut FlightCommit) {
    if let Some(patch) = &mut commit.patch {
        if relay_protocol::domain::truncate_bytes(patch, TRIMMED_TEXT) {
            commit.patch_truncated = true;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use prost::Message as _;
    use relay_protocol::domain::{
        Flight, FlightChange, FlightCommit, FlightUpdate, MAX_RECORDED_PATCH,
    };

    fn flight() -> Flight {
        serde_json::from_value(serde_json::json!({
            "id": "flt_1", "invocation": "inv_1", "agent": "a", "state": "completed",
            "update_seq": 3, "conversation": "direct.operator.a",
            "created_at": 1, "updated_at": 2,
        }))
        .unwrap()
    }

    fn commit_update(patch: &str) -> FlightUpdate {
        FlightUpdate {
            flight: "flt_1".into(),
            agent: "a".into(),
            seq: 3,
            at: 2,
            change: FlightChange::Commit {
                commit: Box::new(FlightCommit {
                    branch: "relay/a".into(),
                    start: "1".repeat(40),
                    head: "2".repeat(40),
                    patch: Some(patch.into()),
                    ..FlightCommit::default()
                }),
            },
        }
    }

    fn patch_of(update: &FlightUpdate) -> &FlightCommit {
        match &update.change {
            FlightChange::Commit { commit } => commit,
            other => panic!("not a commit: {other:?}"),
        }
    }

    /// The largest patch a runtime records, all control bytes (`\u0001` in JSON: 6
    /// bytes each), is over NATS's 1 MiB as JSON; trimmed, it fits with room to spare,
    /// cut to [`TRIMMED_TEXT`] and marked as cut, the rest of the commit kept.
    #[test]
    fn a_commits_long_patch_is_cut_to_fit_a_nats_message() {
        let patch = "\u{1}".repeat(MAX_RECORDED_PATCH);
        let mut update = commit_update(&patch);
        let mut f = flight();
        let json = |u: &FlightUpdate, f: &Flight| {
            serde_json::to_vec(&serde_json::json!({ "update": u, "flight": f }))
                .unwrap()
                .len()
        };
        assert!(json(&update, &f) > 1024 * 1024, "{}", json(&update, &f));
        trim_texts(&mut update, &mut f);
        let c = patch_of(&update);
        assert_eq!(c.patch.as_deref().map(str::len), Some(TRIMMED_TEXT));
        assert!(c.patch_truncated);
        assert_eq!(c.branch, "relay/a");
        assert_eq!(c.head, "2".repeat(40));
        assert!(
            json(&update, &f) < 7 * TRIMMED_TEXT,
            "{}",
            json(&update, &f)
        );
        let pb = relay_protocol::convert::update_to_pb(&update, &f).encode_to_vec();
        assert!(pb.len() < 7 * TRIMMED_TEXT, "{}", pb.len());
    }

    /// What [`text_bytes`] counts is what [`trim_texts`] cuts: a completion with a long
    /// answer (its output, and its flight's) counts both, a short one almost nothing;
    /// trimmed, the long one counts no more than the cut texts.
    #[test]
    fn the_texts_counted_before_encoding_are_the_texts_trimmed() {
        let answer = SharedStr::from("x".repeat(3 << 20));
        let mut f = flight();
        f.output = Some(answer.clone());
        let mut done = FlightUpdate {
            change: FlightChange::State {
                to: relay_protocol::domain::FlightState::Completed,
                reason: None,
                output: Some(answer.clone()),
            },
            ..commit_update("")
        };
        assert_eq!(text_bytes(&done, &f), 2 * answer.len());
        trim_texts(&mut done, &mut f);
        let marker = 64;
        assert!(
            text_bytes(&done, &f) <= 2 * (TRIMMED_TEXT + marker),
            "{}",
            text_bytes(&done, &f)
        );
        let patch = "+".repeat(1000);
        assert_eq!(text_bytes(&commit_update(&patch), &flight()), 1000);
        let delta = FlightUpdate {
            change: FlightChange::Delta { text: "hi".into() },
            ..commit_update("")
        };
        assert_eq!(text_bytes(&delta, &flight()), 2);
    }

    /// A patch that fits is left whole and not marked; a multi-byte character at the cut
    /// is not split.
    #[test]
    fn a_short_patch_is_kept_and_a_cut_keeps_whole_characters() {
        let mut update = commit_update("+one line\n");
        trim_texts(&mut update, &mut flight());
        let c = patch_of(&update);
        assert_eq!(c.patch.as_deref(), Some("+one line\n"));
        assert!(!c.patch_truncated);

        let mut update = commit_update(&format!(
            "{}é{}",
            "a".repeat(TRIMMED_TEXT - 1),
            "b".repeat(10)
        ));
        trim_texts(&mut update, &mut flight());
        let c = patch_of(&update);
        assert_eq!(
            c.patch.as_deref(),
            Some("a".repeat(TRIMMED_TEXT - 1).as_str())
        );
        assert!(c.patch_truncated);
    }
}
