//! The event log over real files: appends, syncs, torn tails, segments.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use std::io::Write;

/// A payload as the store's are: a version byte (not [`LINKED`]), then anything.
fn payload(seq: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| if i == 0 { 1 } else { (seq as usize + i) as u8 })
        .collect()
}

fn append_n(log: &EventLog, from: u64, n: u64, size: usize) -> Vec<Pos> {
    let mut positions = Vec::new();
    for seq in from..from + n {
        let p = payload(seq, size);
        positions.push(log.append([(seq, p.as_slice())]).unwrap());
    }
    positions
}

#[test]
fn records_read_back_only_once_synced_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    let positions = append_n(&log, 1, 100, 40);
    assert_eq!(log.read(positions[0]).unwrap(), None, "not synced yet");
    assert_eq!(log.last_seq(), 0);
    log.sync().unwrap();
    assert_eq!(log.last_seq(), 100);
    for (i, pos) in positions.iter().enumerate() {
        let r = log.read(*pos).unwrap().unwrap();
        assert_eq!(
            (r.seq, r.payload.clone()),
            (i as u64 + 1, payload(i as u64 + 1, 40))
        );
    }
    drop(log);
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(log.last_seq(), 100);
    let mut seqs = Vec::new();
    log.scan(0, |r| {
        seqs.push(r.seq);
        Ok::<_, LogError>(true)
    })
    .unwrap();
    assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
    assert_eq!(
        log.append([(101, &b"x"[..])]).unwrap(),
        log.end() - record_len(1)
    );
}

#[test]
fn a_torn_tail_is_cut_and_appends_go_on_after_the_last_whole_record() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    append_n(&log, 1, 10, 100);
    log.sync().unwrap();
    let end = log.end();
    drop(log);
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // A crash in the middle of the next record: half a header, then half a payload
    // with a wrong checksum.
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&[50, 0, 0, 0, 1, 2]).unwrap();
    drop(f);
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!((log.end(), log.last_seq()), (end, 10));
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&[4, 0, 0, 0, 9, 9, 9, 9, 11, 0, 0, 0, 0, 0, 0, 0, 1, 2])
        .unwrap();
    drop(f);
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!((log.end(), log.last_seq()), (end, 10));
    append_n(&log, 11, 1, 5);
    log.sync().unwrap();
    assert_eq!(log.last_seq(), 11);
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), end + record_len(5));
}

#[test]
fn segments_roll_without_a_gap_and_positions_are_global() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    // Three records a bit over a third of a segment each: the third rolls.
    let size = (SEGMENT_BYTES / 3) as usize;
    let positions = append_n(&log, 1, 3, size);
    log.sync().unwrap();
    assert_eq!(positions[1], record_len(size));
    assert_eq!(positions[2], 2 * record_len(size));
    let names: Vec<String> = {
        let mut n: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    };
    assert_eq!(
        names,
        vec![segment_name(0, 1), segment_name(positions[2], 3)]
    );
    for (i, p) in positions.iter().enumerate() {
        assert_eq!(log.read(*p).unwrap().unwrap().seq, i as u64 + 1);
    }
    drop(log);
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(log.last_seq(), 3);
    let mut n = 0;
    log.scan(positions[1], |r| {
        n += 1;
        assert_eq!(r.payload.len(), size);
        Ok::<_, LogError>(true)
    })
    .unwrap();
    assert_eq!(n, 2);
    // A record is found from an earlier one by its headers, across the segments.
    assert_eq!(log.find(0, 3).unwrap(), Some(positions[2]));
    assert_eq!(log.find(positions[1], 2).unwrap(), Some(positions[1]));
    assert_eq!(log.find(0, 4).unwrap(), None, "not in the log");
    assert!(matches!(
        log.find(positions[2], 1),
        Err(LogError::Corrupt(_))
    ));
}

#[test]
fn a_record_is_found_from_any_before_it_and_only_once_synced() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    let mut positions = Vec::new();
    for seq in 1..=40u64 {
        // Sizes vary, so a walk that misread a length would land off a header.
        positions.extend(append_n(&log, seq, 1, (seq as usize * 37) % 300));
    }
    log.sync().unwrap();
    for (i, want) in positions.iter().enumerate() {
        for from in &positions[..=i] {
            assert_eq!(log.find(*from, i as u64 + 1).unwrap(), Some(*want));
        }
    }
    assert_eq!(log.start().unwrap(), 0);
    let appended = append_n(&log, 41, 1, 10);
    assert_eq!(log.find(positions[39], 41).unwrap(), None, "not synced yet");
    assert_eq!(
        log.find_appended(positions[39], 41).unwrap(),
        Some(appended[0]),
        "the writer finds what it appended"
    );
    assert_eq!(log.find_appended(positions[39], 42).unwrap(), None);
    log.sync().unwrap();
    assert!(log.find(positions[39], 41).unwrap().is_some());
}

#[test]
fn a_seq_out_of_order_or_damaged_record_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    assert!(matches!(
        log.append([(2, &b"x"[..])]),
        Err(LogError::Corrupt(_))
    ));
    let pos = append_n(&log, 1, 2, 30)[1];
    log.sync().unwrap();
    drop(log);
    // Flip a byte of the second record's payload: it is the tail, so it is cut.
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let f = OpenOptions::new().write(true).open(&seg).unwrap();
    f.write_all_at(&[0xff], pos + HEADER + 3).unwrap();
    drop(f);
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(log.last_seq(), 1);
    assert_eq!(log.read(pos).unwrap(), None);
    assert!(log.read(pos + 1).unwrap().is_none());
}

#[test]
fn a_batch_taken_back_is_gone_from_the_file_and_the_next_takes_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    append_n(&log, 1, 3, 10);
    log.sync().unwrap();
    let end = log.end();
    // A batch appended, then not committed: taken back, and another batch in its place.
    append_n(&log, 4, 5, 50);
    log.rewind(end, 3).unwrap();
    assert_eq!(log.end(), end);
    assert!(
        log.rewind(end - 1, 2).is_err(),
        "never back past what is synced"
    );
    let pos = append_n(&log, 4, 1, 7)[0];
    assert_eq!(pos, end);
    log.sync().unwrap();
    drop(log);
    // Reopened: the records taken back are not there, not even as a torn tail.
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!((log.last_seq(), log.end()), (4, end + record_len(7)));
    assert_eq!(log.read(pos).unwrap().unwrap().payload, payload(4, 7));
}

/// A payload past [`DIRECT_PAYLOAD`] goes to the file without the batch's buffer: in one
/// batch between small records, each reads back whole with its checksum checked, in
/// place, after a reopen too; and such a batch can be taken back like any other.
#[test]
fn a_long_payload_amid_short_ones_is_framed_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    let long = DIRECT_PAYLOAD * 2 + 3;
    let sizes = [10, long, 20, long, 30];
    let payloads: Vec<Vec<u8>> = (1..=5)
        .map(|seq| payload(seq, sizes[seq as usize - 1]))
        .collect();
    let first = log
        .append(
            payloads
                .iter()
                .enumerate()
                .map(|(i, p)| (i as u64 + 1, p.as_slice())),
        )
        .unwrap();
    let end = log.end();
    assert_eq!(
        end - first,
        sizes.iter().map(|s| record_len(*s)).sum::<u64>()
    );
    // Taken back and appended again: the same bytes at the same places.
    log.rewind(first, 0).unwrap();
    assert_eq!(log.end(), first);
    log.append(
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u64 + 1, p.as_slice())),
    )
    .unwrap();
    assert_eq!(log.end(), end);
    log.sync().unwrap();
    drop(log);
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(log.last_seq(), 5);
    let mut pos = first;
    for (i, want) in payloads.iter().enumerate() {
        let r = log.read(pos).unwrap().unwrap();
        assert_eq!((r.seq, r.payload.len()), (i as u64 + 1, want.len()));
        assert!(r.payload == *want, "record {} differs", i + 1);
        pos = r.next();
    }
    assert_eq!(pos, end);
    // A flipped byte in the long payload is found by its checksum, not read as data.
    drop(log);
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let in_long = (record_len(10) + HEADER) as usize + DIRECT_PAYLOAD;
    bytes[in_long] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    // Reopened, the log ends before the damaged record (a torn tail is cut there).
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(
        log.last_seq(),
        1,
        "a damaged long record is never read back"
    );
    assert_eq!(log.read(first + record_len(10)).unwrap(), None);
}

/// A linked record is read back as its own payload with its link apart, its neighbours
/// framed around it as ever; its link is read from its header alone before it is
/// synced, and a damaged link is an error, not a panic.
#[test]
fn a_linked_record_hands_its_link_apart_from_its_payload() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    let first = append_n(&log, 1, 1, 30)[0];
    let to = Link { seq: 1, pos: first };
    let linked_payload = linked(to, &payload(2, 50));
    let second = log.append([(2, linked_payload.as_slice())]).unwrap();
    let third = append_n(&log, 3, 1, 20)[0];
    assert_eq!(
        log.link_at(second).unwrap(),
        Some((2, Some(to))),
        "appended"
    );
    assert_eq!(log.link_at(first).unwrap(), Some((1, None)));
    assert_eq!(log.link_at(log.end()).unwrap(), None, "past the end");
    log.sync().unwrap();
    let r = log.read(second).unwrap().unwrap();
    assert_eq!((r.seq, r.link, &r.payload), (2, Some(to), &payload(2, 50)));
    assert_eq!(r.next(), third, "the next record starts past the link too");
    let mut read = Vec::new();
    log.scan(0, |r| {
        read.push((r.seq, r.link, r.payload.len()));
        Ok::<_, LogError>(true)
    })
    .unwrap();
    assert_eq!(read, vec![(1, None, 30), (2, Some(to), 50), (3, None, 20)]);

    // A link cut short: the record's checksum holds, its link does not.
    let short = [LINKED, 0, 0, 0];
    log.append([(4, &short[..])]).unwrap();
    log.sync().unwrap();
    assert!(matches!(
        log.read(log.end() - record_len(short.len())),
        Err(LogError::Corrupt(_))
    ));
}
