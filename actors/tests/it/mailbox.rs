//! A burst of posts larger than a channel mailbox's capacity: none is refused or lost for it,
//! and every one lands once, with its own id (`Relay::post` queues each with `do_send` on its
//! own clone of the address; see `channel::MAILBOX_CAPACITY`). In-process, on a temporary
//! sled store.

use crosstalk_actors::channel::MAILBOX_CAPACITY;
use crosstalk_actors::sled_store::SledStore;
use crosstalk_actors::{Relay, RelayConfig};
use crosstalk_schema::{ChannelName, NewMessage};
use std::collections::BTreeSet;
use std::sync::Arc;

fn msg(body: String) -> NewMessage {
    NewMessage {
        sender: "a".into(),
        body,
        ..Default::default()
    }
}

#[actix_rt::test]
async fn a_burst_past_the_mailbox_capacity_is_neither_refused_nor_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SledStore::open(dir.path()).unwrap());
    let relay = Relay::start(store, RelayConfig::default()).unwrap().0;
    let ch = ChannelName::parse("burst").unwrap();
    // Opens the channel, so the burst below finds its actor without a hop to the registry.
    relay.post(&ch, msg("first".into())).await.unwrap();

    // Every task is queued on this thread before the channel actor (woken by the first post)
    // gets a turn, so the posts all reach its mailbox at once, past its capacity.
    let burst = MAILBOX_CAPACITY + 2_000;
    let tasks: Vec<_> = (0..burst)
        .map(|i| {
            let (relay, ch) = (relay.clone(), ch.clone());
            actix_rt::spawn(async move { relay.post(&ch, msg(format!("m{i}"))).await })
        })
        .collect();

    let mut ids = BTreeSet::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let p = task
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("post {i} of the burst failed: {e}"));
        assert_eq!(
            p.message.body,
            format!("m{i}"),
            "post {i} answered with another message"
        );
        assert!(ids.insert(p.id()), "id {} answered twice", p.id());
    }
    let stored = relay.read(&ch, 0, 10_000, None).await.unwrap();
    assert_eq!(stored.len(), burst + 1, "every post of the burst is stored once");
    let stored_ids: BTreeSet<u64> = stored.iter().skip(1).map(|p| p.id()).collect();
    assert_eq!(stored_ids, ids, "the stored ids are the answered ones");
}
