#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::store::{Sink, Store};

#[test]
fn a_batch_reads_its_own_writes_and_reaches_sled_only_when_it_succeeds() {
    let store = Store::temporary().unwrap();
    let key: &[u8] = b"f1";
    store
        .tree(T::Agents)
        .insert(b"gone", b"x".to_vec())
        .unwrap();
    let batch = |ok: bool| {
        store.direct(|tx| {
            Sink::put(tx, T::FlightUpdates, key, b"v1".to_vec())?;
            Sink::del(tx, T::Agents, b"gone")?;
            // The batch reads what it wrote; sled has none of it yet.
            assert_eq!(
                Sink::get(tx, T::FlightUpdates, key)?.as_deref(),
                Some(&b"v1"[..])
            );
            assert_eq!(Sink::get(tx, T::Agents, b"gone")?, None);
            assert_eq!(store.tree(T::FlightUpdates).get(key).unwrap(), None);
            if ok {
                Ok(7)
            } else {
                Err(BrokerError::Internal("refused".into()))
            }
        })
    };
    assert!(batch(false).is_err());
    assert_eq!(store.tree(T::FlightUpdates).get(key).unwrap(), None);
    assert!(store.tree(T::Agents).get(b"gone").unwrap().is_some());
    assert_eq!(batch(true).unwrap(), 7);
    assert_eq!(
        store.tree(T::FlightUpdates).get(key).unwrap().as_deref(),
        Some(&b"v1"[..])
    );
    assert_eq!(store.tree(T::Agents).get(b"gone").unwrap(), None);
}

/// Once a batch's keys start going in, its last seq counts as committed (readers
/// wait for its sync), whether or not its marker ever follows.
#[test]
fn a_batch_being_applied_counts_as_committed_before_its_marker() {
    let store = Store::temporary().unwrap();
    assert_eq!(store.committed_seq().unwrap(), 0);
    store
        .direct(|tx| {
            Sink::put(tx, T::FlightUpdates, b"f1", b"v1".to_vec())?;
            let payloads = [b"one".as_slice(), b"two", b"three"];
            store.log().append((1..=3).zip(payloads))?;
            Ok(())
        })
        .unwrap();
    // Its marker was never written (as after a failure midway): seq 3 is committed
    // for readers, and marked in sled as being applied.
    assert_eq!(store.committed_seq().unwrap(), 3);
    assert_eq!(
        store.tree(T::Meta).get(APPLYING_KEY).unwrap().as_deref(),
        Some(&3u64.to_be_bytes()[..])
    );
}

/// Batches that each write the same number to a key of `agents` and one of
/// `bindings`, with 200 keys of `deliveries` going in between the two, while readers
/// on the blocking pool read all of them (a scan long enough to race batches often, so
/// that readers also hold the writer back): no reader ever sees them differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_each_batch_whole_or_not_at_all() {
    const BATCHES: u64 = 300;
    let store = Store::temporary().unwrap();
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            for i in 1..=BATCHES {
                store
                    .direct(|tx| {
                        let n = i.to_be_bytes().to_vec();
                        Sink::put(tx, T::Agents, b"x", n.clone())?;
                        for k in 0..200u32 {
                            Sink::put(tx, T::Deliveries, &k.to_be_bytes(), n.clone())?;
                        }
                        Sink::put(tx, T::Bindings, b"x", n)
                    })
                    .unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut seen = std::collections::BTreeSet::new();
                loop {
                    let (a, between, b) = store
                        .read(|s| {
                            let a = s.tree(T::Agents).get(b"x")?;
                            let between: Vec<_> = s
                                .tree(T::Deliveries)
                                .iter()
                                .values()
                                .collect::<Result<_, _>>()?;
                            let b = s.tree(T::Bindings).get(b"x")?;
                            Ok((a, between, b))
                        })
                        .await
                        .unwrap();
                    assert_eq!(a, b, "a reader saw part of a batch");
                    assert!(
                        between.iter().all(|v| Some(v) == a.as_ref()),
                        "part of a batch"
                    );
                    let n = a.map_or(0, |v| u64::from_be_bytes(v.as_ref().try_into().unwrap()));
                    seen.insert(n);
                    if n == BATCHES {
                        return seen.len();
                    }
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        // The readers ran while the batches went in, not only after.
        assert!(r.await.unwrap() > 1);
    }
}

#[test]
fn a_marker_reads_back_what_its_batch_moves() {
    let store = Store::temporary().unwrap();
    store
        .tree(T::Rules)
        .insert(b"r1", b"before".to_vec())
        .unwrap();
    for f in [b"f1", b"f2"] {
        store.tree(T::Flights).insert(f, b"old".to_vec()).unwrap();
    }
    store
        .direct(|tx| {
            Sink::put(tx, T::Rules, b"r1", b"after".to_vec())?;
            // Usage moved by f1's record; f2's record changed too, moving nothing.
            Sink::moves_from(tx, T::Flights, b"f1");
            Sink::put(tx, T::UsageTrees, b"f1", b"t".to_vec())?;
            Sink::put(tx, T::Flights, b"f1", b"new".to_vec())?;
            Sink::put(tx, T::Flights, b"f2", b"new".to_vec())?;
            Sink::put(tx, T::Agents, b"a", b"not moved".to_vec())
        })
        .unwrap();
    let marker = store.tree(T::Meta).get(APPLYING_KEY).unwrap().unwrap();
    let (seq, undo) = parse_marker(&marker).unwrap();
    assert_eq!(seq, 0);
    let expected: Vec<Undo> = vec![
        (T::UsageTrees as usize, b"f1".to_vec(), None),
        (T::Rules as usize, b"r1".to_vec(), Some(b"before".to_vec())),
        (T::Flights as usize, b"f1".to_vec(), Some(b"old".to_vec())),
    ];
    assert_eq!(undo, expected);
    // Put back, the moved keys are as the batch found them; the rest stays.
    restore(&store.trees, &undo).unwrap();
    assert_eq!(store.tree(T::UsageTrees).get(b"f1").unwrap(), None);
    assert_eq!(
        store.tree(T::Rules).get(b"r1").unwrap().unwrap().as_ref(),
        b"before"
    );
    assert_eq!(
        store.tree(T::Flights).get(b"f1").unwrap().unwrap().as_ref(),
        b"old"
    );
    assert!(store.tree(T::Agents).get(b"a").unwrap().is_some());
    let f2 = store.tree(T::Flights).get(b"f2").unwrap();
    assert_eq!(f2.as_deref(), Some(&b"new"[..]));
    // A batch that moves nothing marks its seq alone; a damaged marker is none.
    store
        .direct(|tx| Sink::put(tx, T::Agents, b"b", b"x".to_vec()))
        .unwrap();
    let marker = store.tree(T::Meta).get(APPLYING_KEY).unwrap().unwrap();
    assert_eq!(marker.len(), 8);
    assert_eq!(parse_marker(&[0; 7]), None);
    let mut cut = marker.to_vec();
    cut.extend_from_slice(&[T::Rules as u8, 1, 0, 0, 0, 9, b'r']);
    assert_eq!(parse_marker(&cut), None);
    // A tree nothing is put back in is damage too.
    let mut other = marker.to_vec();
    other.extend_from_slice(&[T::Agents as u8, 1, 0, 0, 0, 1, b'a', 0]);
    assert_eq!(parse_marker(&other), None);
}
