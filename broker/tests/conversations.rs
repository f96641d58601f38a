//! A conversation's message count is read from its messages, not written to its record
//! for each one (the store's `counts`): posts from many clients at once into a few
//! conversations, across a restart, get each index once and in order, and every reader
//! (the record as shown, the list, the posted event's index, the replay, a read)
//! counts them alike; a store from before gets the new layout at its first open.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::reopen;

use relay_broker::replay;
use relay_broker::store::{child_key, Store, POSTED_VERSION, T};
use relay_broker::Broker;
use relay_protocol::domain::{
    AgentSpec, Conversation, ConversationKind, ConversationSpec, Harness, InvokeRequest,
    PostMessage,
};
use relay_protocol::event::EventBody;
use relay_protocol::replay::ConversationEntry;

const ROOMS: [&str; 3] = ["room.a", "room.b", "room.c"];

fn post(conversation: &str, author: &str, body: String) -> PostMessage {
    PostMessage {
        conversation: conversation.into(),
        author: author.into(),
        body: body.into(),
        class: Default::default(),
        reply_to: None,
        meta: Default::default(),
    }
}

type Running = (
    Broker,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
);

/// A broker on a new store at `path`, with agent a1 and the rooms.
async fn start_with_rooms(path: &std::path::Path) -> Running {
    let (b, stop, writer) = support::start(Store::open(path).unwrap()).await;
    b.register_agent(AgentSpec::new("a1", Harness::CodexAppServer, "/w"))
        .await
        .unwrap();
    for id in ROOMS {
        b.create_conversation(ConversationSpec {
            id: id.into(),
            kind: ConversationKind::Channel,
            title: None,
            participants: vec![],
            parent: None,
        })
        .await
        .unwrap();
    }
    (b, stop, writer)
}

/// Stops the broker and waits until it let go of its store.
async fn stop_on((b, stop, writer): Running) {
    stop.cancel();
    drop(b);
    writer.await.unwrap();
}

/// `clients` clients at once, each posting `each` messages round the rooms and asking
/// agent a1 once in room.a: the posted answers.
async fn post_at_once(b: &Broker, round: usize, clients: usize, each: usize) -> Vec<(String, u64)> {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let mut posted = Vec::new();
            for n in 0..each {
                let room = ROOMS[(c + n) % ROOMS.len()];
                let m = b
                    .post_message(post(room, &format!("c{c}"), format!("r{round} c{c} n{n}")))
                    .await
                    .unwrap()
                    .message;
                posted.push((m.conversation, m.index));
            }
            let asked = InvokeRequest {
                conversation: Some("room.a".into()),
                ..InvokeRequest::new("a1", format!("r{round} c{c} asks"))
            };
            b.invoke(asked).await.unwrap();
            posted
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// What every reader says of each room: the count shown, listed and in the last posted
/// event; the messages' indexes in the replay, and in a read of the last 1000.
async fn check_rooms(b: &Broker, expected: &[u64; 3]) {
    let listed: Vec<Conversation> = b.store().read(|s| s.conversations()).await.unwrap();
    let events = b
        .store()
        .read(|s| s.events_after(0, usize::MAX))
        .await
        .unwrap();
    for (room, &n) in ROOMS.iter().zip(expected) {
        let room = room.to_string();
        let shown = b
            .store()
            .read({
                let room = room.clone();
                move |s| s.conversation(&room)
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(shown.message_count, n, "{room} shown");
        let in_list = listed.iter().find(|c| c.spec.id == room).unwrap();
        assert_eq!(in_list.message_count, n, "{room} listed");
        let last_posted = events
            .iter()
            .filter_map(|e| match &e.body {
                EventBody::MessagePosted {
                    message,
                    conversation,
                } if message.conversation == room => Some((message.index, conversation.clone())),
                _ => None,
            })
            .next_back();
        // The event is the message alone: its index says the count.
        assert_eq!(
            last_posted,
            Some((n - 1, None)),
            "{room}: the last post's event"
        );
        let replayed = |from: u64| {
            let room = room.clone();
            async move {
                let all = replay::conversation(b, room, from).await.unwrap().entries;
                all.into_iter()
                    .filter_map(|e| match e {
                        ConversationEntry::Message { seq, message } => Some((seq, message.index)),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            }
        };
        let all = replayed(0).await;
        let indexes: Vec<u64> = all.iter().map(|(_, i)| *i).collect();
        assert_eq!(indexes, (0..n).collect::<Vec<_>>(), "{room} replayed");
        // From any message's seq on (walked back to): the ones after it.
        for k in [0, n / 3, n / 2, n - 1] {
            let from = all[k as usize].0;
            let after: Vec<u64> = replayed(from).await.iter().map(|(_, i)| *i).collect();
            assert_eq!(
                after,
                (k + 1..n).collect::<Vec<_>>(),
                "{room} replayed after #{k}"
            );
        }
        let read = b
            .store()
            .read({
                let room = room.clone();
                move |s| s.messages(&room, 1000)
            })
            .await
            .unwrap();
        let read: Vec<u64> = read.iter().map(|m| m.index).collect();
        assert_eq!(read, (0..n).collect::<Vec<_>>(), "{room} read");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn posts_from_many_clients_at_once_count_exactly_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store");
    let (b, stop, writer) = start_with_rooms(&path).await;
    let mut posted = post_at_once(&b, 0, 12, 10).await;
    // room.a also has the 12 asks' task messages.
    check_rooms(&b, &[52, 40, 40]).await;
    stop_on((b, stop, writer)).await;

    // After a restart the writer has no counts in memory: it reads them from the tree.
    let (b, stop, writer) = support::start(reopen(&path).await).await;
    posted.extend(post_at_once(&b, 1, 12, 10).await);
    check_rooms(&b, &[104, 80, 80]).await;
    // Each index given once.
    posted.sort();
    let n = posted.len();
    posted.dedup();
    assert_eq!(posted.len(), n, "an index given twice");

    // No post wrote its conversation's record, nor a replay index key.
    let store = b.store().clone();
    for room in ROOMS {
        let raw = store
            .tree(T::Conversations)
            .get(room.as_bytes())
            .unwrap()
            .unwrap();
        let stored: Conversation = relay_broker::store::decode(&raw).unwrap();
        assert_eq!(stored.message_count, 0, "{room}'s record");
    }
    let conversation_keys = store.tree(T::ReplayIndex).scan_prefix(b"croom.").count();
    assert_eq!(
        conversation_keys, 24,
        "one key per flight asked in a room, none per message"
    );
    assert!(store.verify().unwrap().is_consistent());
    stop_on((b, stop, writer)).await;
}

#[tokio::test]
async fn a_store_that_counted_in_the_record_is_converted_at_its_first_open() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store");
    let (b, stop, writer) = start_with_rooms(&path).await;
    post_at_once(&b, 0, 3, 4).await;
    let replays = |b: Broker| async move {
        let mut all = Vec::new();
        for room in ROOMS {
            all.push(replay::conversation(&b, room.into(), 0).await.unwrap());
        }
        all
    };
    let before = replays(b.clone()).await;
    let counts = [7, 4, 4];
    check_rooms(&b, &counts).await;
    stop_on((b, stop, writer)).await;
    {
        // As a store from before left it: each record with its count, and each message
        // in the replay index.
        let store = reopen(&path).await;
        for (room, n) in ROOMS.iter().zip(counts) {
            let mut c = store.conversation(room).unwrap().unwrap();
            c.message_count = n;
            store
                .tree(T::Conversations)
                .insert(room.as_bytes(), relay_broker::store::encode(&c).unwrap())
                .unwrap();
            for seq in store.message_seqs(room, 0, u64::MAX).unwrap() {
                store
                    .tree(T::ReplayIndex)
                    .insert(child_key(&format!("c{room}"), seq), Vec::<u8>::new())
                    .unwrap();
            }
        }
        store.tree(T::Meta).remove(b"messages_uncounted").unwrap();
        let report = store.verify().unwrap();
        assert_eq!(
            report.mismatched_trees,
            vec!["conversations".to_string(), "replay_index".to_string()]
        );
        store.durable().db().flush().unwrap();
    }
    let store = reopen(&path).await;
    assert!(store.verify().unwrap().is_consistent());
    let (b, stop, writer) = support::start(store).await;
    assert_eq!(replays(b.clone()).await, before);
    check_rooms(&b, &counts).await;
    // And it goes on counting.
    b.post_message(post("room.b", "ann", "one more".into()))
        .await
        .unwrap();
    check_rooms(&b, &[7, 5, 4]).await;
    stop_on((b, stop, writer)).await;
}

/// A message is found by its id from the seq the id carries, and its conversation's
/// messages by their records' links, with no key of their own:
/// every message posted by many clients at once, in and out of a batch, before and
/// after a restart, in any of the rooms. An id with another message's seq and a
/// different time is no message, and a reply to it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_are_found_by_their_ids_without_a_key_each() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store");
    let running = start_with_rooms(&path).await;
    post_at_once(&running.0, 0, 8, 6).await;
    stop_on(running).await;
    let (b, stop, writer) = support::start(reopen(&path).await).await;
    post_at_once(&b, 1, 8, 6).await;
    let store = b.store().clone();
    let mut all = Vec::new();
    for room in ROOMS {
        all.extend(store.messages(room, 1000).unwrap());
    }
    assert_eq!(
        all.len(),
        2 * (8 * 6 + 8),
        "every post and every ask's task"
    );
    for m in &all {
        assert_eq!(store.message(&m.id).unwrap().as_ref(), Some(m), "{}", m.id);
    }
    assert_eq!(store.tree(T::MessageIds).len(), 0, "no key per message");
    // Nor in `messages`: each room's first message (its record links to none) and its
    // last, the others linked behind it.
    assert_eq!(store.tree(T::Messages).len(), 2 * ROOMS.len());

    // Replies, from many clients at once, each to a message of another room.
    let mut tasks = Vec::new();
    for (n, m) in all.iter().enumerate().take(24) {
        let (b, to) = (b.clone(), m.id.clone());
        tasks.push(tokio::spawn(async move {
            let mut reply = post(ROOMS[n % 3], "ann", format!("re {n}"));
            reply.reply_to = Some(to.clone());
            let m = b.post_message(reply).await.unwrap().message;
            (to, m.id)
        }));
    }
    for t in tasks {
        let (to, id) = t.await.unwrap();
        let reply = store.message(&id).unwrap().unwrap();
        assert_eq!(reply.reply_to, Some(to));
    }
    // Each is stored in protobuf (not JSON) and read back as the very event, its JSON
    // the same bytes as the event's own.
    let mut in_protobuf = 0;
    store
        .log()
        .scan(0, |r| {
            in_protobuf += usize::from(r.payload.first() == Some(&POSTED_VERSION));
            Ok::<_, relay_broker::store::LogError>(true)
        })
        .unwrap();
    assert_eq!(in_protobuf, all.len() + 24);
    let read_back = store.published_after(0, usize::MAX).unwrap();
    for p in &read_back {
        if let EventBody::MessagePosted { message, .. } = &p.event.body {
            assert_eq!(p.json()[..], serde_json::to_vec(&p.event).unwrap()[..]);
            assert_eq!(store.message(&message.id).unwrap().as_ref(), Some(message));
        }
    }
    // The same seq, another time: not the message that seq posted.
    let real = &all[5].id;
    let first = if real.as_bytes()[4] == b'0' { '1' } else { '0' };
    let forged = format!("msg_{first}{}", &real[5..]);
    assert_eq!(store.message(&forged).unwrap(), None);
    let mut reply = post("room.a", "ann", "re forged".into());
    reply.reply_to = Some(forged.clone());
    let err = b.post_message(reply).await.unwrap_err();
    assert!(
        matches!(&err, relay_broker::BrokerError::UnknownMessage(id) if *id == forged),
        "{err:?}"
    );
    assert!(store.verify().unwrap().is_consistent());
    stop_on((b, stop, writer)).await;
}

/// A store from before a conversation's messages were a chain through the log (no
/// record linked, a key per message in `messages`, none for a conversation's last) gets
/// each conversation's last at its first open: the check finds it consistent, every
/// reader reads it alike, and the posts after it are linked to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_a_key_per_message_gets_its_last_messages_at_its_first_open() {
    use relay_broker::store::LogError;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store");
    let (b, stop, writer) = start_with_rooms(&path).await;
    post_at_once(&b, 0, 3, 4).await;
    stop_on((b, stop, writer)).await;
    // Its log again without the links, as a build before wrote it, in a store of its
    // own: opened, its projections are made from that log.
    let old = tmp.path().join("old");
    {
        let store = reopen(&path).await;
        let mut records = Vec::new();
        store
            .log()
            .scan(0, |r| {
                records.push((r.seq, r.payload));
                Ok::<_, LogError>(true)
            })
            .unwrap();
        let fresh = Store::open(&old).unwrap();
        fresh
            .log()
            .append(records.iter().map(|(s, p)| (*s, p.as_slice())))
            .unwrap();
        fresh.log().sync().unwrap();
    }
    {
        let store = reopen(&old).await;
        let per_message = store.tree(T::Messages).len();
        for room in ROOMS {
            let last = store
                .tree(T::Messages)
                .remove(relay_broker::store::last_message_key(room))
                .unwrap();
            assert!(last.is_some(), "{room}");
        }
        assert_eq!(per_message - ROOMS.len(), 7 + 4 + 4, "a key per message");
        store.tree(T::Meta).remove(b"last_messages").unwrap();
        let report = store.verify().unwrap();
        assert_eq!(report.mismatched_trees, vec!["messages".to_string()]);
        store.durable().db().flush().unwrap();
    }
    let store = reopen(&old).await;
    assert!(store.verify().unwrap().is_consistent());
    let (b, stop, writer) = support::start(store).await;
    check_rooms(&b, &[7, 4, 4]).await;
    for n in 0..3 {
        b.post_message(post("room.b", "ann", format!("after {n}")))
            .await
            .unwrap();
    }
    check_rooms(&b, &[7, 7, 4]).await;
    let store = b.store().clone();
    assert_eq!(
        store.tree(T::Messages).len(),
        7 + 4 + 4 + ROOMS.len(),
        "the posts after it linked: no key of their own"
    );
    assert!(store.verify().unwrap().is_consistent());
    stop_on((b, stop, writer)).await;
}
