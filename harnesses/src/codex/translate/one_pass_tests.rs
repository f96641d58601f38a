//! The one-pass reading of a delta's line against the general way.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::tests::{events, translator};
use super::*;

/// A delta's line read in one pass ([`DeltaLine`]) comes out as the general way reads it,
/// and any line that only looks like one is read the general way.
#[test]
fn a_delta_read_in_one_pass_is_what_the_general_way_reads() {
    assert_eq!(
        DELTA_METHOD,
        format!("\"method\":\"{}\"", notification::AGENT_MESSAGE_DELTA)
    );
    let lines = [
        // Escapes, other fields, another order.
        r#"{"method":"item/agentMessage/delta","params":{"threadId":"th","turnId":"t1","itemId":"m","delta":"h\u00e9\"llo\n\\"}}"#,
        r#"{"jsonrpc":"2.0","params":{"delta":"x","itemId":"m","turnId":"t1","threadId":"th","extra":[1]},"method":"item/agentMessage/delta","emittedAtMs":5}"#,
        // A request under that name: refused, as any request Relay does not handle.
        r#"{"id":7,"method":"item/agentMessage/delta","params":{"threadId":"th","turnId":"t1","itemId":"m","delta":"x"}}"#,
        // Params of the wrong shape: malformed either way.
        r#"{"method":"item/agentMessage/delta","params":{"turnId":"t1","delta":"x"}}"#,
        r#"{"method":"item/agentMessage/delta"}"#,
        r#"{"method":"item/agentMessage/delta","params":{"threadId":"th","turnId":"t1","itemId":"m","delta":"x"},"method":"turn/started"}"#,
        // A null id is no id; an `error` of the wrong shape is malformed either way.
        r#"{"id":null,"method":"item/agentMessage/delta","params":{"threadId":"th","turnId":"t1","itemId":"m","delta":"x"}}"#,
        r#"{"method":"item/agentMessage/delta","params":{"threadId":"th","turnId":"t1","itemId":"m","delta":"x"},"error":"x"}"#,
        // A thread id escaped (read, not kept), or not a string (malformed either way).
        r#"{"method":"item/agentMessage/delta","params":{"threadId":"t\u0068","turnId":"t1","itemId":"m","delta":"x"}}"#,
        r#"{"method":"item/agentMessage/delta","params":{"threadId":5,"turnId":"t1","itemId":"m","delta":"x"}}"#,
        // A key twice: malformed either way.
        r#"{"method":"item/agentMessage/delta","params":{"threadId":"th","turnId":"t1","itemId":"m","delta":"x"},"result":1,"result":2}"#,
        // The method's name escaped: not found, read the general way (the same delta).
        r#"{"method":"item\/agentMessage\/delta","params":{"threadId":"th","turnId":"t1","itemId":"m","delta":"x"}}"#,
        // The name elsewhere in a line of another method.
        r#"{"method":"warning","params":{"message":"m","x":{"method":"item/agentMessage/delta"}}}"#,
        r#"{"method":"item/commandExecution/outputDelta","params":{"threadId":"th","turnId":"t1","itemId":"c","delta":"\"method\":\"item/agentMessage/delta\""}}"#,
    ];
    let mut fast_paths = 0;
    for line in lines {
        let (mut fast, fast_bad) = translator();
        let (mut general, general_bad) = translator();
        let read = general.handle_envelope(line);
        let general_bad = general_bad.load(Ordering::Relaxed);
        // The same actions, the same count of malformed lines.
        assert_eq!(
            (fast.handle_line(line), fast_bad.load(Ordering::Relaxed)),
            (read.clone(), general_bad),
            "{line}"
        );
        // And as the owner task reads it, through the wire.
        let wire_bad = Arc::new(AtomicU64::new(0));
        let mut wire = CodexWire::new(wire_bad.clone(), true);
        let mut out = Vec::new();
        stdio::Wire::line(&mut wire, line, &mut out);
        let wire_events: Vec<HarnessEvent> = out
            .iter()
            .filter_map(|a| match a {
                stdio::Action::Event(e) => Some(e.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            (out.len(), wire_events, wire_bad.load(Ordering::Relaxed)),
            (read.len(), events(read), general_bad),
            "{line} through the wire"
        );
        if translator().0.delta(line).is_some() {
            fast_paths += 1;
        }
    }
    // The first two, the null id and the escaped thread id took the one pass (the rest
    // did not parse as a delta's line, or were a request, or of another method, or were
    // not found).
    assert_eq!(fast_paths, 4);
}
