//! A storage fault never costs an acknowledged write, and never acknowledges one. In-process:
//! `Relay::start` on a temporary sled store wrapped in a store that fails on demand (a write
//! error, a flush error, a flush that hangs). For each write path: what failed is reported as
//! failed, nothing acknowledged is lost, nothing refused turns up later (not even after the
//! store flushes again), the relay recovers by itself once the fault is gone, and shutdown
//! stays prompt while the store hangs.

use crate::support::*;
use crosstalk_actors::sled_store::SledStore;
use crosstalk_actors::store::{Append, AuxEntries, Space, StoredEvent, Undo};
use crosstalk_actors::{EventStore, Relay, RelayConfig, RelayError, RepairReport, StoreError};
use crosstalk_schema::{ChannelMeta, ChannelName, ChannelState, InstanceKind, Overlay};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a hung flush stays hung, so a failing test still ends by itself.
const HANG_LIMIT: Duration = Duration::from_secs(30);

/// A sled store with switches: writes fail, flushes fail, flushes hang.
pub(crate) struct Faulty {
    inner: SledStore,
    fail_writes: AtomicBool,
    fail_flush: AtomicBool,
    /// The round's gathered appends are written, then reported failed: the worst a failed
    /// `end_round` can leave, everything of the round in the store's memory.
    fail_end_round: AtomicBool,
    /// The channels appended to in the current round, and the most a failed round held.
    round_channels: Mutex<HashSet<ChannelName>>,
    widest_failed_round: AtomicUsize,
    pub(crate) hang_flush: AtomicBool,
}

impl Faulty {
    pub(crate) fn new(dir: &std::path::Path) -> Arc<Faulty> {
        Arc::new(Faulty {
            inner: SledStore::open(dir).unwrap(),
            fail_writes: AtomicBool::new(false),
            fail_flush: AtomicBool::new(false),
            fail_end_round: AtomicBool::new(false),
            round_channels: Mutex::new(HashSet::new()),
            widest_failed_round: AtomicUsize::new(0),
            hang_flush: AtomicBool::new(false),
        })
    }

    fn write_fault(&self) -> Result<(), StoreError> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(StoreError::Io("File too large (injected)".into()));
        }
        Ok(())
    }

    fn flush_fault(&self) -> Result<(), StoreError> {
        let start = Instant::now();
        while self.hang_flush.load(Ordering::SeqCst) && start.elapsed() < HANG_LIMIT {
            std::thread::sleep(Duration::from_millis(5));
        }
        if self.fail_flush.load(Ordering::SeqCst) {
            return Err(StoreError::Io("Input/output error (injected)".into()));
        }
        Ok(())
    }
}

impl EventStore for Faulty {
    fn append(&self, batch: Append<'_>) -> Result<Undo, StoreError> {
        self.write_fault()?;
        self.round_channels.lock().insert(batch.channel.clone());
        self.inner.append(batch)
    }
    fn write_aux(&self, space: Space, writes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<Undo, StoreError> {
        self.write_fault()?;
        self.inner.write_aux(space, writes)
    }
    fn undo(&self, undo: Undo) -> Result<(), StoreError> {
        self.inner.undo(undo)
    }
    fn read(&self, c: &ChannelName, after: u64, upto: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.read(c, after, upto, limit)
    }
    fn read_back(&self, c: &ChannelName, upto: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.read_back(c, upto, limit)
    }
    fn read_one(&self, c: &ChannelName, id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.read_one(c, id)
    }
    fn state(&self, c: &ChannelName) -> Result<ChannelState, StoreError> {
        self.inner.state(c)
    }
    fn overlays(&self, c: &ChannelName) -> Result<Vec<(u64, Overlay)>, StoreError> {
        self.inner.overlays(c)
    }
    fn replies(&self, c: &ChannelName, parent: u64, limit: usize) -> Result<Vec<u64>, StoreError> {
        self.inner.replies(c, parent, limit)
    }
    fn idempotent(&self, c: &ChannelName, key: &str) -> Result<Option<u64>, StoreError> {
        self.inner.idempotent(c, key)
    }
    fn compact(&self, c: &ChannelName, upto: u64, max: usize, meta: &ChannelMeta) -> Result<usize, StoreError> {
        self.inner.compact(c, upto, max, meta)
    }
    fn put_aux(&self, space: Space, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        self.write_fault()?;
        self.inner.put_aux(space, key, value)
    }
    fn put_aux_batch(&self, space: Space, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        self.write_fault()?;
        self.inner.put_aux_batch(space, entries)
    }
    fn get_aux(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get_aux(space, key)
    }
    fn scan_aux_before(
        &self,
        space: Space,
        prefix: &[u8],
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<AuxEntries, StoreError> {
        self.inner.scan_aux_before(space, prefix, before, limit)
    }
    fn scan_aux_after(
        &self,
        space: Space,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<AuxEntries, StoreError> {
        self.inner.scan_aux_after(space, prefix, after, limit)
    }
    fn meta(&self, c: &ChannelName) -> Result<Option<ChannelMeta>, StoreError> {
        self.inner.meta(c)
    }
    fn channels(&self) -> Result<Vec<(ChannelName, ChannelMeta)>, StoreError> {
        self.inner.channels()
    }
    fn id_floor(&self) -> Result<u64, StoreError> {
        self.inner.id_floor()
    }
    // The store thread's rounds reach the sled store, so every fault below also meets a
    // round's gathered appends.
    fn begin_round(&self) {
        self.round_channels.lock().clear();
        self.inner.begin_round()
    }
    fn end_round(&self) -> Result<(), StoreError> {
        self.inner.end_round()?;
        if self.fail_end_round.load(Ordering::SeqCst) {
            let width = self.round_channels.lock().len();
            self.widest_failed_round.fetch_max(width, Ordering::SeqCst);
            return Err(StoreError::Io(
                "No space left on device (injected, writing the round)".into(),
            ));
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.flush_fault()?;
        self.inner.flush()
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.flush_fault()?;
        self.inner.sync()
    }
    fn repair(&self) -> Result<RepairReport, StoreError> {
        self.inner.repair()
    }
    fn reopen(&self) -> Result<(), StoreError> {
        self.inner.reopen()
    }
}

fn start(store: &Arc<Faulty>) -> Relay {
    Relay::start(store.clone(), RelayConfig::default()).unwrap().0
}

/// Retries `post` until the relay accepts writes again (the store thread probes every second).
async fn post_when_healthy(relay: &Relay, channel: &str, body: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match relay.post(&ch(channel), msg("a", body)).await {
            Ok(p) => return p.id(),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the relay did not recover: {e}"),
        }
    }
}

#[actix_rt::test]
async fn a_write_error_is_never_acknowledged_and_the_relay_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let store = Faulty::new(dir.path());
    let relay = start(&store);
    relay.post(&ch("dev"), msg("a", "before")).await.unwrap();

    store.fail_writes.store(true, Ordering::SeqCst);
    for i in 0..20 {
        let r = relay.post(&ch("dev"), msg("a", &format!("refused {i}"))).await;
        assert!(matches!(r, Err(RelayError::Store(_))), "post {i}: {r:?}");
    }
    assert!(relay.store_health().is_err(), "health reports the failed write");
    // The other write paths refuse too, and say so.
    assert!(relay
        .register("alice", None, InstanceKind::Agent, None, None)
        .await
        .is_err());
    assert!(relay.share_data("alice", "spec", "x".into(), None).await.is_err());
    assert!(relay.start_session(&ch("dev"), None).await.is_err());
    assert!(relay.create_channel(&ch("dev"), "what for").await.is_err());

    store.fail_writes.store(false, Ordering::SeqCst);
    post_when_healthy(&relay, "dev", "after").await;
    assert!(relay.store_health().is_ok());
    assert_eq!(bodies(&relay, "dev").await, ["before", "after"]);
    assert_eq!(stored_bodies(store.as_ref(), "dev"), ["before", "after"]);
    // Registration, shared data and sessions work again, and the refused ones left nothing.
    assert!(relay.list_instances().is_empty(), "a refused registration is not bound");
    relay
        .register("alice", None, InstanceKind::Agent, None, None)
        .await
        .unwrap();
    let v = relay.share_data("alice", "spec", "x".into(), None).await.unwrap();
    assert_eq!(v.version, 1, "a refused version does not count");
    assert!(relay.start_session(&ch("dev"), None).await.is_ok());
    relay.shutdown().unwrap();
}

#[actix_rt::test]
async fn a_flush_error_is_never_acknowledged_and_never_turns_up_later() {
    let dir = tempfile::tempdir().unwrap();
    let store = Faulty::new(dir.path());
    let relay = start(&store);
    relay.post(&ch("dev"), msg("a", "before")).await.unwrap();

    store.fail_flush.store(true, Ordering::SeqCst);
    let mut refused = Vec::new();
    for i in 0..10 {
        let r = relay.post(&ch("dev"), msg("a", &format!("refused {i}"))).await;
        assert!(r.is_err(), "post {i} was acknowledged: {r:?}");
        refused.push(format!("refused {i}"));
    }
    let r = relay.register("bob", None, InstanceKind::Agent, None, None).await;
    assert!(r.is_err(), "{r:?}");
    assert!(relay.store_health().is_err());

    store.fail_flush.store(false, Ordering::SeqCst);
    post_when_healthy(&relay, "dev", "after").await;
    // The refused writes were taken back out of the store's memory before any later flush:
    // neither a reader nor a restart ever sees them.
    assert_eq!(bodies(&relay, "dev").await, ["before", "after"]);
    assert_eq!(stored_bodies(store.as_ref(), "dev"), ["before", "after"]);
    let meta = store.meta(&ch("dev")).unwrap().unwrap();
    assert_eq!(meta.count, 2, "the summary was taken back too");
    assert!(store.get_aux(Space::Instances, b"bob").unwrap().is_none());
    relay.shutdown().unwrap();
}

/// The round's one write of its gathered appends fails: every channel's batch in that round is
/// refused, none turns up later, and the relay writes again by itself.
#[actix_rt::test]
async fn a_failed_round_write_refuses_every_channel_in_it_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Faulty::new(dir.path());
    let relay = start(&store);
    let channels = ["dev", "ops", "qa", "ui"];
    for c in channels {
        relay.post(&ch(c), msg("a", "before")).await.unwrap();
    }

    // The store thread held in a flush while every channel's batch queues behind it, so that
    // the failing round holds them all.
    store.hang_flush.store(true, Ordering::SeqCst);
    let slow = actix_rt::spawn({
        let relay = relay.clone();
        async move { relay.post(&ch("slow"), msg("a", "held")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.fail_end_round.store(true, Ordering::SeqCst);
    let posts: Vec<_> = channels
        .iter()
        .flat_map(|c| (0..10).map(move |i| (*c, format!("refused {i}"))))
        .map(|(c, body)| {
            let relay = relay.clone();
            actix_rt::spawn(async move { relay.post(&ch(c), msg("a", &body)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.hang_flush.store(false, Ordering::SeqCst);
    assert!(slow.await.unwrap().is_ok(), "the held round's write had gone well");
    for r in futures_util::future::join_all(posts).await {
        let r = r.unwrap();
        assert!(r.is_err(), "acknowledged although its round's write failed: {r:?}");
    }
    assert!(
        store.widest_failed_round.load(Ordering::SeqCst) >= 2,
        "no failed round held more than one channel's batch"
    );
    assert!(relay.store_health().is_err());

    store.fail_end_round.store(false, Ordering::SeqCst);
    for c in channels {
        post_when_healthy(&relay, c, "after").await;
    }
    for c in channels {
        assert_eq!(bodies(&relay, c).await, ["before", "after"], "{c}");
        assert_eq!(stored_bodies(store.as_ref(), c), ["before", "after"], "{c}");
        assert_eq!(
            store.meta(&ch(c)).unwrap().unwrap().count,
            2,
            "{c}: the summary was taken back too"
        );
    }
    relay.shutdown().unwrap();
    // And in what a restart reads.
    let copy = crate::full_disk::copy_of(dir.path());
    let reopened = SledStore::open(copy.path()).unwrap();
    for c in channels {
        assert_eq!(stored_bodies(&reopened, c), ["before", "after"], "{c}, reopened");
    }
}

#[actix_rt::test]
async fn a_hanging_flush_fails_writes_fast_recovers_and_lets_shutdown_go() {
    let dir = tempfile::tempdir().unwrap();
    let store = Faulty::new(dir.path());
    let relay = start(&store);
    relay.post(&ch("dev"), msg("a", "before")).await.unwrap();

    store.hang_flush.store(true, Ordering::SeqCst);
    // The post caught by the hang is refused once its commit times out (5 s), not acknowledged.
    let started = Instant::now();
    let dev = ch("dev");
    let stuck = relay.post(&dev, msg("a", "stuck"));
    // Every other write waiting on the store is abandoned too, not held until the hang ends
    // (on a relay node, the fold's watermark waits the same way, and could hold the fold up).
    let registering = async {
        let r = relay.register("carol", None, InstanceKind::Agent, None, None).await;
        (r, started.elapsed())
    };
    let probe = async {
        // Meanwhile, once the store has been stuck past the stall threshold (its clock runs
        // from when the store thread began the round), writes on any channel are refused at
        // once rather than after the 5 s a commit is given.
        while relay.store_health().is_ok() && started.elapsed() < Duration::from_secs(4) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let t = Instant::now();
        let r = relay.post(&ch("other"), msg("b", "while stuck")).await;
        (r, t.elapsed())
    };
    let (stuck, (registered, registered_took), (fast, fast_took)) = tokio::join!(stuck, registering, probe);
    assert!(stuck.is_err(), "{stuck:?}");
    assert!(registered.is_err(), "{registered:?}");
    assert!(registered_took < Duration::from_secs(8), "{registered_took:?}");
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    assert!(matches!(fast, Err(RelayError::StoreUnavailable(_))), "{fast:?}");
    assert!(fast_took < Duration::from_secs(2), "refused fast: {fast_took:?}");
    assert!(relay.store_health().is_err());

    // The hang ends: the abandoned write is undone, never acknowledged, and writes recover.
    store.hang_flush.store(false, Ordering::SeqCst);
    post_when_healthy(&relay, "dev", "after").await;
    assert_eq!(bodies(&relay, "dev").await, ["before", "after"]);
    assert_eq!(stored_bodies(store.as_ref(), "dev"), ["before", "after"]);
    assert!(stored_bodies(store.as_ref(), "other").is_empty());
    assert!(
        store.get_aux(Space::Instances, b"carol").unwrap().is_none(),
        "the abandoned registration was undone"
    );

    // Shutdown while the store hangs again: prompt, with the reason.
    store.hang_flush.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let r = relay.shutdown();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(r.is_err());
    store.hang_flush.store(false, Ordering::SeqCst);
}

#[actix_rt::test]
async fn the_inbox_hands_nothing_out_unless_its_cursors_are_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Faulty::new(dir.path());
    let relay = start(&store);
    let reg = relay
        .register("me", None, InstanceKind::Agent, None, None)
        .await
        .unwrap();
    let _ = reg;
    relay.post(&ch("dev"), msg("me", "joining")).await.unwrap();
    relay.post(&ch("dev"), msg("peer", "for you")).await.unwrap();
    // Joining by posting moves a cursor in the background: let it land.
    tokio::time::sleep(Duration::from_millis(100)).await;

    store.fail_writes.store(true, Ordering::SeqCst);
    assert!(relay.inbox("me", 100).await.is_err());
    store.fail_writes.store(false, Ordering::SeqCst);
    // Not handed out, so handed out now, once.
    let got: Vec<_> = relay
        .inbox("me", 100)
        .await
        .unwrap()
        .iter()
        .map(|p| p.message.body.clone())
        .collect();
    assert_eq!(got, ["for you"]);
    assert!(relay.inbox("me", 100).await.unwrap().is_empty());
    relay.shutdown().unwrap();
}

/// A write that waited out a slow flush (longer than the stall threshold) is acknowledged
/// to a store that says it is writable: the next write goes through instead of being told
/// the store "has not answered". Checked where the answer is made (the hook runs on the
/// store thread just before the ticket resolves), so it does not depend on which thread
/// wins a race.
#[test]
fn a_write_answered_after_a_slow_flush_finds_the_store_writable() {
    use crosstalk_actors::commit::{Committer, STALL};
    use crosstalk_actors::Durability;
    let dir = tempfile::tempdir().unwrap();
    let store = Faulty::new(dir.path());
    let committer = Committer::start(store.clone(), Durability::Flush).unwrap();
    store.hang_flush.store(true, Ordering::SeqCst);
    let health = committer.health().clone();
    let (seen_tx, seen_rx) = std::sync::mpsc::channel();
    let ticket = committer.write_then(
        Box::new(|_| Ok(Undo::default())),
        Box::new(move || {
            let _ = seen_tx.send(health.writable());
        }),
    );
    std::thread::sleep(STALL + Duration::from_millis(500));
    assert!(committer.health().writable().is_err(), "stuck for longer than STALL");
    store.hang_flush.store(false, Ordering::SeqCst);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(ticket.durable()).unwrap();
    let seen = seen_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(seen, Ok(()), "the store read as stuck when the write was acknowledged");
}
