//! [`Relay`]: the cheap, cloneable handle every face uses. It starts the actors, sends them
//! messages, reads committed state through channel views, and owns the shutdown signal. What
//! spans actors lives in one file per noun: [`wait`] (waits and asking), [`channels`]
//! (reading, listing, sessions, replies, search), [`directives`], [`identity`] (registration,
//! cursors, inbox) and [`data`] (shared data). It holds no rules the operations own
//! (who may act as whom is checked before a call reaches it).

mod channels;
mod data;
mod directives;
mod identity;
mod node;
mod wait;

pub use channels::ChannelInfo;
pub use directives::Directives;
pub use wait::{WaitOptions, WaitOutcome, WaitResult};

use crate::channel::{ChannelConfig, ChannelHandle, Directory, Post, Retention};
use crate::cluster::{Cluster, Embedded};
use crate::commit::{Committer, Durability};
use crate::error::RelayError;
use crate::identities::Identities;
use crate::ids::IdAllocator;
use crate::presence::{Heartbeat, Leave, ListPresence, Participant, PresenceEvent, PresenceSupervisor, WatchPresence};
use crate::records::RecordStore;
use crate::registry::{ChannelsConfig, OpenChannel, Opener, Registry};
use crate::search::{Backlog, CaughtUp, Indexer, SearchIndex};
use crate::shared::{self, SharedDataStore, SharedStore};
use crate::store::{EventStore, RepairReport};
use crate::view::{ChannelView, Posted};
use actix::prelude::*;
use crosstalk_schema::{ChannelName, Limits, NewMessage};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

/// Longest a face waits for an actor to answer before reporting the relay unavailable.
/// A post's answer includes its flush, so this is generous.
pub const ACTOR_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the final flush at shutdown may take before the process exits anyway.
pub const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_millis(800);
/// Longest a search waits for the index to catch up with what was posted.
pub const SEARCH_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// A poster's presence is refreshed at most this often per channel: presence is measured
/// in the TTL's tens of seconds, and a heartbeat per post would cost the hot path.
const POST_HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// Entries in the heartbeat throttle before it is cleared (it only saves work).
const HEARTBEAT_THROTTLE_CAP: usize = 10_000;

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub limits: Limits,
    pub durability: Durability,
    /// A participant not heard from for this long is offline.
    pub presence_ttl: Duration,
    /// How long every active party must wait before one is told to speak first.
    pub release_grace: Duration,
    /// Retention for every channel, unless overridden in `channel_retention`.
    pub retention: Retention,
    pub channel_retention: HashMap<ChannelName, Retention>,
    pub retention_every: Duration,
    /// Largest shared data content, in bytes.
    pub max_shared_bytes: usize,
    /// Most channels the relay holds; a new one beyond it is refused.
    pub max_channels: usize,
    /// Most channels one opener ([`Relay::opening_as`]) may bring into being.
    pub max_channels_per_opener: usize,
    /// Most bytes of messages' JSON one read answers with (at least one message, however
    /// large): a longer page is cut there, and says more follow.
    pub max_answer_bytes: usize,
    /// A channel actor nobody has used for this long, with no wait, stream or write in
    /// flight, stops and is reopened on demand (`None`: channels stay open).
    pub idle_after: Option<Duration>,
    /// With more channel actors than this open, the longest-unused of those unused for a
    /// second stop before `idle_after` is over (only when `idle_after` is set).
    pub max_open_channels: usize,
    /// What this relay shares with other nodes: [`Embedded`] for a relay on its own, or a
    /// cluster (`--store nats://…`) whose log channels' writes go through, folded into this
    /// node's own store.
    pub cluster: Arc<dyn Cluster>,
    /// Where the search index lives (`None`: in memory, built from the log at each start).
    pub search_dir: Option<std::path::PathBuf>,
}

/// Default of `--idle-after-secs`.
pub const DEFAULT_IDLE_AFTER: Duration = Duration::from_secs(30);

/// Default of `--max-open-channels`: about 60 MiB of idle channel actors.
pub const DEFAULT_MAX_OPEN_CHANNELS: usize = 10_000;

/// Default of `--presence-ttl-secs`.
pub const DEFAULT_PRESENCE_TTL: Duration = Duration::from_secs(120);

/// Default of `--release-grace-ms`.
pub const DEFAULT_RELEASE_GRACE: Duration = Duration::from_secs(5);

/// Default of `--retention-interval-secs`.
pub const DEFAULT_RETENTION_EVERY: Duration = Duration::from_secs(60);

/// Default of `--max-shared-bytes`.
pub const DEFAULT_MAX_SHARED_BYTES: usize = 1024 * 1024;

/// Default of `--max-answer-bytes`: sixteen messages of the largest size a body may have.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Default of `--max-channels`.
pub const DEFAULT_MAX_CHANNELS: usize = 100_000;

/// Default of `--max-channels-per-participant`: a hundredth of the relay's, so no one token
/// can take what every other needs.
pub const DEFAULT_MAX_CHANNELS_PER_OPENER: usize = 1_000;

tokio::task_local! {
    /// Who the channels this task opens are counted against ([`Relay::opening_as`]).
    static OPENER: Option<Opener>;
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            limits: Limits::default(),
            durability: Durability::Flush,
            presence_ttl: DEFAULT_PRESENCE_TTL,
            release_grace: DEFAULT_RELEASE_GRACE,
            retention: Retention::default(),
            channel_retention: HashMap::new(),
            retention_every: DEFAULT_RETENTION_EVERY,
            max_shared_bytes: DEFAULT_MAX_SHARED_BYTES,
            max_channels: DEFAULT_MAX_CHANNELS,
            max_channels_per_opener: DEFAULT_MAX_CHANNELS_PER_OPENER,
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
            idle_after: Some(DEFAULT_IDLE_AFTER),
            max_open_channels: DEFAULT_MAX_OPEN_CHANNELS,
            cluster: Arc::new(Embedded),
            search_dir: None,
        }
    }
}

#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Addr<Registry>,
    presence: Addr<PresenceSupervisor>,
    indexer: Addr<Indexer>,
    /// The search index, which the indexer writes and searches read.
    search_index: SearchIndex,
    /// Where shared data is kept (this relay's store, or the cluster's).
    shared: Arc<dyn SharedDataStore>,
    /// Where small records (OAuth, webhooks) are kept (this relay's store, or the cluster's).
    records: Arc<dyn RecordStore>,
    directory: Directory,
    identities: Arc<Identities>,
    store: Arc<dyn EventStore>,
    committer: Committer,
    shutdown: CancellationToken,
    cluster: Arc<dyn Cluster>,
    /// [`RelayConfig::max_answer_bytes`].
    max_answer_bytes: usize,
    /// [`RelayConfig::max_shared_bytes`].
    max_shared_bytes: usize,
    /// A cluster node's tasks following the shared log and buckets; they end on shutdown.
    cluster_tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// When the search index last had every committed message.
    index_caught_up: CaughtUp,
    /// When each (channel, poster) last sent a presence heartbeat.
    heartbeats: parking_lot::Mutex<Heartbeats>,
}

/// When each poster last sent a presence heartbeat, by channel. Looked up by reference on
/// every post: only a heartbeat that is due copies the two names.
#[derive(Default)]
struct Heartbeats {
    by_channel: HashMap<ChannelName, HashMap<String, std::time::Instant>>,
    entries: usize,
}

impl Heartbeats {
    /// Whether `sender`'s heartbeat on `channel` is due; if so, it counts as sent now.
    fn due(&mut self, channel: &ChannelName, sender: &str) -> bool {
        if let Some(at) = self.by_channel.get(channel).and_then(|seen| seen.get(sender)) {
            if at.elapsed() < POST_HEARTBEAT_EVERY {
                return false;
            }
        }
        if self.entries > HEARTBEAT_THROTTLE_CAP {
            *self = Heartbeats::default();
        }
        let seen = self.by_channel.entry(channel.clone()).or_default();
        if seen.insert(sender.to_owned(), std::time::Instant::now()).is_none() {
            self.entries += 1;
        }
        true
    }
}

impl Relay {
    /// Repairs a damaged tail if there is one, then starts the actors on the current actix
    /// system. Costs one read per channel, whatever the size of the log.
    pub fn start(store: Arc<dyn EventStore>, config: RelayConfig) -> Result<(Relay, RepairReport), RelayError> {
        let repairs = store.repair()?;
        for r in &repairs.damaged {
            tracing::warn!(channel = %r.channel, dropped = ?r.dropped, last_good = r.last_good,
                "damaged tail removed from the store; serving everything before it");
        }
        if let Some(t) = repairs.truncated {
            tracing::warn!(
                store_last_id = t.store_last_id,
                acknowledged_last_id = t.acknowledged_last_id,
                "the store lost its tail: acknowledged messages above store_last_id are gone"
            );
        }
        // Ids of dropped records may have been seen by someone: never hand them out again.
        let stored_max = store.channels()?.iter().map(|(_, m)| m.last_id).max().unwrap_or(0);
        let last_id = stored_max.max(store.id_floor()?);
        let ids = Arc::new(IdAllocator::new(last_id));
        let committer = Committer::start(store.clone(), config.durability)
            .map_err(|e| RelayError::Store(crate::StoreError::Io(e.to_string())))?;
        let directory = Directory::default();
        let channel_config = ChannelConfig {
            limits: config.limits,
            presence_ttl: config.presence_ttl,
            release_grace: config.release_grace,
            retention: config.retention,
            per_channel_retention: config.channel_retention.clone(),
            retention_every: config.retention_every,
            idle_after: config.idle_after,
            cluster: config.cluster.clone(),
        };
        let identities = Arc::new(Identities::new(config.presence_ttl));
        let unindexed = Backlog::default();
        let caught_up = CaughtUp::default();
        let index_caught_up = caught_up.clone();
        let registry = Registry::new(
            directory.clone(),
            store.clone(),
            committer.clone(),
            ids,
            ChannelsConfig {
                channel: channel_config,
                max_channels: config.max_channels,
                max_channels_per_opener: config.max_channels_per_opener,
                max_open_channels: config.max_open_channels,
                unindexed: unindexed.clone(),
            },
            identities.clone(),
        )?
        .start();
        let presence = PresenceSupervisor::new(config.presence_ttl).start();
        let local = || -> Arc<dyn SharedDataStore> {
            Arc::new(shared::Local {
                actor: SharedStore::new(store.clone(), committer.clone(), config.max_shared_bytes).start(),
                timeout: ACTOR_CALL_TIMEOUT,
            })
        };
        let shared = config.cluster.shared_data(&local, config.max_shared_bytes);
        let records = config.cluster.records(&|| -> Arc<dyn RecordStore> {
            Arc::new(crate::records::Local::new(store.clone(), committer.clone()))
        });
        // The indexer gets a thread of its own: its store writes must never stall the
        // channel actors (which share the system arbiter).
        let views_dir = directory.clone();
        let index_store = store.clone();
        let search_index = SearchIndex::open(config.search_dir.as_deref())?;
        let writer_side = search_index.clone();
        let indexer = Indexer::start_in_arbiter(&Arbiter::new().handle(), move |_| {
            Indexer::new(
                index_store,
                Arc::new(move || views_dir.read().values().map(|h| h.view.clone()).collect()),
                writer_side,
                unindexed,
                index_caught_up,
            )
        });
        tracing::info!(last_id, "relay started");
        let relay = Relay {
            inner: Arc::new(Inner {
                registry,
                presence,
                indexer,
                search_index,
                shared,
                records,
                directory,
                identities,
                store,
                committer,
                shutdown: CancellationToken::new(),
                cluster: config.cluster.clone(),
                max_answer_bytes: config.max_answer_bytes,
                max_shared_bytes: config.max_shared_bytes,
                cluster_tasks: Default::default(),
                heartbeats: Default::default(),
                index_caught_up: caught_up,
            }),
        };
        let tasks = config.cluster.start(Arc::new(relay.clone()));
        relay.inner.cluster_tasks.lock().extend(tasks);
        Ok((relay, repairs))
    }

    /// The channel's handle, starting its actor on first use.
    pub async fn channel(&self, name: &ChannelName) -> Result<ChannelHandle, RelayError> {
        self.open_channel(name, false).await
    }

    /// Runs `work` with every channel it brings into being (a first post, a creation, a
    /// subscription, a wait on a channel never written) counted against `opener`, within
    /// [`RelayConfig::max_channels_per_opener`]; `None` counts only against the relay's
    /// limit. One task's calls, however deep, are one opener's, so no path that opens a
    /// channel can forget to say whose it is.
    pub fn opening_as<F: std::future::Future>(
        opener: Option<Opener>,
        work: F,
    ) -> impl std::future::Future<Output = F::Output> {
        OPENER.scope(opener, work)
    }

    /// As [`channel`](Self::channel); `to_fold`: for the follower of a shared log, beyond `--max-channels`.
    async fn open_channel(&self, name: &ChannelName, to_fold: bool) -> Result<ChannelHandle, RelayError> {
        if let Some(h) = self.inner.directory.read().get(name) {
            h.view.touch();
            return Ok(h.clone());
        }
        if self.inner.shutdown.is_cancelled() {
            return Err(RelayError::ShuttingDown);
        }
        let handle = self
            .inner
            .registry
            .send(OpenChannel {
                name: name.clone(),
                to_fold,
                opener: OPENER.try_with(Clone::clone).ok().flatten(),
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await??;
        handle.view.touch();
        Ok(handle)
    }

    /// Channel actors in memory now (idle ones stop: see [`RelayConfig::idle_after`]).
    /// The largest shared data content it keeps, in bytes.
    pub fn max_shared_bytes(&self) -> usize {
        self.inner.max_shared_bytes
    }

    /// A receiver that wakes after each round of this relay's writes: a reader looking for
    /// something new on any channel waits on it (and looks again now and then besides, for
    /// what reaches a cluster node some other way).
    pub fn commits(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.committer.rounds()
    }

    pub fn open_channels(&self) -> usize {
        self.inner.directory.read().len()
    }

    /// Whether `channel`'s actor is in memory now.
    pub fn channel_is_open(&self, channel: &ChannelName) -> bool {
        self.inner.directory.read().contains_key(channel)
    }

    /// Bytes the store takes on disk, if it can tell.
    pub fn store_bytes(&self) -> Option<u64> {
        self.inner.store.size_on_disk()
    }

    /// How long since the search indexer last had every committed message indexed (committed
    /// to the index or not: a search commits first). It works when the relay is quiet, and a
    /// little at a time once this passes 2 s; a search catches it up first.
    pub fn search_index_lag(&self) -> Duration {
        let at = self.inner.index_caught_up.load(std::sync::atomic::Ordering::Relaxed);
        Duration::from_millis(crate::view::now_ms().saturating_sub(at))
    }

    fn open_view(&self, name: &ChannelName) -> Option<Arc<ChannelView>> {
        self.inner.directory.read().get(name).map(|h| h.view.clone())
    }

    /// The view of a channel that exists (open, or in the store), opening it if needed; `None`
    /// for a channel never written: reading a channel creates nothing.
    async fn existing_view(&self, name: &ChannelName) -> Result<Option<Arc<ChannelView>>, RelayError> {
        if let Some(v) = self.open_view(name) {
            return Ok(Some(v));
        }
        if self.inner.store.meta(name)?.is_none() {
            return Ok(None);
        }
        Ok(Some(self.channel(name).await?.view))
    }

    /// Checks that `session` may act as `instance_id` (and records a heartbeat). The
    /// operations call it for every identity a caller names; the relay trusts them.
    pub fn authorize(&self, instance_id: &str, session: Option<&str>) -> Result<(), RelayError> {
        self.inner.identities.authorize(instance_id, session)
    }

    /// Posts a message; returns it once it is durable and visible to every reader. The
    /// caller has authorised the sender.
    pub async fn post(&self, channel: &ChannelName, post: NewMessage) -> Result<Arc<Posted>, RelayError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(RelayError::ShuttingDown);
        }
        let handle = self.channel(channel).await?;
        let (reply, landed) = oneshot::channel();
        let post = Post { message: post, reply };
        // Not `send`: its answer would wake this thread once more per post, before the verdict.
        // `do_send` queues even past the mailbox's capacity, as `try_send` on this fresh clone
        // of the address would (actix refuses a sender only after it went past): what bounds
        // the posts queued is the requests they answer (see `channel::MAILBOX_CAPACITY`). A
        // stopped actor drops the post, and with it `reply`: answered "channel stopped" below.
        handle.addr.do_send(post);
        let posted = tokio::time::timeout(ACTOR_CALL_TIMEOUT, async {
            landed
                .await
                .unwrap_or(Err(RelayError::Unavailable("channel stopped")))?
                .posted()
                .await
        })
        .await
        .map_err(|_| RelayError::Unavailable("the store did not answer in time"))??;
        let due = self.inner.heartbeats.lock().due(channel, &posted.message.sender);
        if due {
            self.heartbeat(Heartbeat {
                channel: channel.clone(),
                participant_id: posted.message.sender.clone(),
                display_name: None,
                kind: None,
                side: posted.message.side.clone(),
                activity: "posted",
            });
        }
        // Joining by posting: a registered sender gets a read cursor here (its inbox covers
        // the channel).
        if self.inner.identities.get(&posted.message.sender).is_some() {
            self.advance_cursor(&posted.message.sender, channel, 0);
        }
        Ok(posted)
    }

    /// Records that a participant is on a channel. Best effort: presence is advisory, and a
    /// full supervisor mailbox must not slow a post down.
    pub fn heartbeat(&self, hb: Heartbeat) {
        if let Err(e) = self.inner.presence.try_send(hb) {
            tracing::debug!(error = %e, "presence heartbeat dropped");
        }
    }

    pub fn leave(&self, channel: ChannelName, participant_id: String) {
        let _ = self.inner.presence.try_send(Leave {
            channel,
            participant_id,
        });
    }

    pub async fn presence(&self, channel: &ChannelName) -> Result<Vec<Participant>, RelayError> {
        Ok(self
            .inner
            .presence
            .send(ListPresence(channel.clone()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?)
    }

    pub async fn watch_presence(
        &self,
        channel: &ChannelName,
    ) -> Result<broadcast::Receiver<PresenceEvent>, RelayError> {
        Ok(self
            .inner
            .presence
            .send(WatchPresence(channel.clone()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?)
    }

    /// Where small records (OAuth, webhooks) are kept (`crate::records`).
    pub fn records(&self) -> Arc<dyn RecordStore> {
        self.inner.records.clone()
    }

    /// Cancelled when the relay begins to shut down: streams and waits end on it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Whether the store is answering and its last write succeeded (`Err(why)` if not).
    pub fn store_health(&self) -> Result<(), String> {
        self.inner.cluster.health()?;
        self.inner.committer.health().check()
    }

    /// Whether this relay should be sent requests yet (`Err(why)` if not): a cluster node that
    /// is still folding what the shared log held when it started says so.
    pub fn readiness(&self) -> Result<(), String> {
        self.inner.cluster.readiness()
    }

    /// After [`shutdown`](Self::shutdown), on a cluster node: lets the tasks following the
    /// shared log end while the runtime still runs (their NATS subscriptions unsubscribe on
    /// tasks of their own as they are dropped), for at most a second.
    pub async fn wind_down(&self) {
        let tasks = std::mem::take(&mut *self.inner.cluster_tasks.lock());
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
        }
    }

    /// Stops taking work, ends streams and waits, and flushes the store — for at most
    /// [`SHUTDOWN_FLUSH_TIMEOUT`]: every acknowledged write is durable already, and a store
    /// that hangs must not keep the process from exiting.
    pub fn shutdown(&self) -> Result<(), RelayError> {
        self.inner.shutdown.cancel();
        let store = self.inner.store.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = std::thread::Builder::new()
            .name("crosstalk-final-flush".into())
            .spawn(move || {
                let _ = tx.send(store.flush());
            });
        match rx.recv_timeout(SHUTDOWN_FLUSH_TIMEOUT) {
            Ok(flushed) => Ok(flushed?),
            Err(_) => Err(RelayError::StoreUnavailable(format!(
                "the final flush did not return within {} ms",
                SHUTDOWN_FLUSH_TIMEOUT.as_millis()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posters_heartbeat_is_due_once_a_second_per_channel() {
        let mut beats = Heartbeats::default();
        let (general, ops) = (
            ChannelName::parse("general").unwrap(),
            ChannelName::parse("ops").unwrap(),
        );
        assert!(beats.due(&general, "alice"));
        assert!(
            !beats.due(&general, "alice"),
            "a second post within the second sends none"
        );
        assert!(beats.due(&general, "bob"), "each poster has its own");
        assert!(beats.due(&ops, "alice"), "and each channel");
        assert_eq!(beats.entries, 3);
        // Past the second, due again; the entry is replaced, not added.
        *beats.by_channel.get_mut(&general).unwrap().get_mut("alice").unwrap() -=
            POST_HEARTBEAT_EVERY + Duration::from_millis(1);
        assert!(beats.due(&general, "alice"));
        assert_eq!(beats.entries, 3);
    }

    #[test]
    fn the_heartbeat_throttle_forgets_everything_past_its_cap() {
        let mut beats = Heartbeats::default();
        let general = ChannelName::parse("general").unwrap();
        for i in 0..=HEARTBEAT_THROTTLE_CAP {
            assert!(beats.due(&general, &format!("p{i}")));
        }
        assert_eq!(beats.entries, HEARTBEAT_THROTTLE_CAP + 1);
        assert!(beats.due(&general, "one more"), "past the cap it starts over");
        assert_eq!(beats.entries, 1);
        assert!(beats.due(&general, "p0"), "what it forgot is due again");
    }
}
