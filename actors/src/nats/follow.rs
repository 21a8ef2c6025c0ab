//! The node's side of a cluster's shared state: tasks that follow the log and the buckets and
//! hand what they find to this node ([`Node`]). One follows the log from the watermark this
//! node recorded (how far its store has committed the fold) and hands each event, in order, to
//! its channel ([`Node::apply`]), which folds it exactly as every other node does. Events a
//! channel has already folded (its stored last id) are skipped by the channel, so a watermark
//! behind some channels is safe. Another mirrors the cluster's registered identities into this
//! node's and publishes when this node last heard from the identities bound on it; others
//! share read cursors, per-channel presence and active waits.

use super::cursors::SharedCursors;
use super::cuts::Cuts;
use super::log::Log;
use super::presence::SharedPresence;
use super::registrations::Registrations;
use super::several::Writes;
use super::waits::{ClusterWaits, SharedWaits, WaitNews, NODE_ALIVE_EVERY};
use crate::cluster::{LogEvent, Node};
use crate::presence::Outgoing;
use crate::store::Space;
use crosstalk_schema::{ChannelName, CutState};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Backoff between attempts to follow the log after it failed.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Attempts to hand an event to its channel (an actor stopping as it arrives is reopened).
const DELIVERY_ATTEMPTS: usize = 20;

pub(super) async fn project(node: Arc<dyn Node>, log: Log, cuts: Cuts, caught_up: Arc<CaughtUp>) {
    let shutdown = node.shutdown();
    let mut mark = match Watermark::read(&*node) {
        Ok(mark) => mark,
        Err(e) => {
            // Without it, the whole log is read again; what is stored is skipped.
            tracing::warn!(error = %e, "cannot read how far this node has folded the log; from its start");
            Watermark::default()
        }
    };
    let mut next = mark.recorded + 1;
    metrics::gauge!("crosstalk_cluster_folded_through").set(mark.recorded as f64);
    tracing::info!(from = next, "following the shared log");
    let mut backoff = RETRY_FIRST;
    let mut known = KnownCuts::default();
    let mut every = tokio::time::interval(WATERMARK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !shutdown.is_cancelled() {
        match log.follow(next).await {
            Ok((mut events, through)) => {
                backoff = RETRY_FIRST;
                let mut heard = Instant::now();
                // The log's newest message at the last look, when the consumer was behind it.
                let mut behind = None;
                loop {
                    let event = tokio::select! {
                        e = events.next() => e,
                        _ = every.tick() => {
                            mark.advance(&*node).await;
                            caught_up.check(mark.recorded);
                            if heard.elapsed() >= STALL_AFTER {
                                heard = Instant::now();
                                let delivered = through.load(std::sync::atomic::Ordering::Relaxed);
                                if behind.is_some_and(|last| last > delivered) {
                                    tracing::warn!(
                                        delivered,
                                        behind,
                                        "the consumer has not delivered what the log held {STALL_AFTER:?} ago; following again"
                                    );
                                    break;
                                }
                                behind = newest(&log).await.filter(|&last| last > delivered);
                            }
                            continue;
                        }
                        _ = shutdown.cancelled() => return,
                    };
                    heard = Instant::now();
                    behind = None;
                    match event {
                        Some(Ok(message)) => {
                            // Events between are missing from the log: a retention cut
                            // removed them before this node folded them.
                            if message.seq > next && !known.refresh(&cuts, &shutdown).await {
                                return;
                            }
                            next = message.seq + 1;
                            if message.several {
                                mark.held(message.seq, &message.events);
                            }
                            for event in message.events {
                                known.install_if_behind(&*node, &event.channel).await;
                                let (seq, channel) = (event.seq, event.channel.clone());
                                match deliver(&*node, event).await {
                                    Ok(stored) => mark.delivered(seq, channel, stored),
                                    Err(()) => mark.lost(seq),
                                }
                            }
                            heard = Instant::now();
                        }
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, next, "following the shared log failed; following again");
                            break;
                        }
                        None => break,
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, next, "cannot follow the shared log yet; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// Whether a node's store holds what the shared log held when the node connected to it
/// ([`crate::cluster::Cluster::readiness`]). Judged by the fold's recorded watermark, which
/// covers an event only once every channel it touched has committed it, so a ready node's
/// reads show the log as of its start.
pub(super) struct CaughtUp {
    done: AtomicBool,
    /// The log's newest message when the node connected.
    target: u64,
    /// The watermark at the last look.
    recorded: AtomicU64,
}

impl CaughtUp {
    pub(super) fn new(target: u64) -> CaughtUp {
        CaughtUp {
            done: AtomicBool::new(target == 0),
            target,
            recorded: AtomicU64::new(0),
        }
    }

    /// Before the node serves anything: how far its store held the fold when it stopped last.
    pub(super) fn check_stored(&self, node: &dyn Node) {
        if let Ok(mark) = Watermark::read(node) {
            self.check(mark.recorded);
        }
    }

    /// `recorded`: how far the store holds the fold now.
    fn check(&self, recorded: u64) {
        if self.done.load(Ordering::Acquire) {
            return;
        }
        self.recorded.store(recorded, Ordering::Relaxed);
        if recorded >= self.target && !self.done.swap(true, Ordering::AcqRel) {
            tracing::info!(
                through = recorded,
                "this node holds what the shared log held when it connected"
            );
        }
    }

    pub(super) fn readiness(&self) -> Result<(), String> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(format!(
            "catching up on the shared log: folded through message {} of {}",
            self.recorded.load(Ordering::Relaxed),
            self.target
        ))
    }
}

/// A consumer that has delivered nothing for this long is checked on. The client notices a
/// consumer whose server died by its missed heartbeats; this catches one that is alive and
/// says nothing all the same (seen once after a server of three was killed mid-write: a
/// node's consumer, still heartbeating, had not delivered the log's last message 15 s later,
/// when the test gave up). When the log held messages
/// past what the consumer delivered at one check and it has still not delivered them at the
/// next, the node follows again on a new consumer. While the cluster is quiet this costs a
/// stream-info request every `STALL_AFTER` per node.
const STALL_AFTER: Duration = Duration::from_secs(3);

/// The sequence of the log's newest message; `None` when the question goes unanswered.
async fn newest(log: &Log) -> Option<u64> {
    tokio::time::timeout(STALL_AFTER, log.last_sequence()).await.ok()?.ok()
}

/// How often a node records how far it has folded the log.
const WATERMARK_EVERY: Duration = Duration::from_secs(1);
/// Where a node records it, in its own store.
const WATERMARK_KEY: &[u8] = b"folded-through";

/// How far this node has folded the log, durably: every event up to `recorded` is in its store
/// (or was refused by the fold, or is a duplicate). Recorded in the store, so a restart follows
/// the log from there rather than from its start. An event's fold becomes durable when its
/// channel's batch does, so a candidate is recorded only once every channel it touched has
/// committed what it stored.
#[derive(Default)]
struct Watermark {
    recorded: u64,
    /// The last event delivered.
    last: u64,
    /// Channels given events since the candidate was taken, and the last id each stored.
    touched: HashMap<ChannelName, u64>,
    /// Messages of several channels folded since the candidate was taken: their writes
    /// ([`super::several::held`]), recorded with the next candidate.
    held: Vec<(u64, Writes)>,
    /// A position to record once its channels have committed what they stored up to it, and
    /// the messages of several channels to record with it.
    candidate: Option<(u64, HashMap<ChannelName, u64>, Writes)>,
    /// The first event this node could not fold: nothing from it on is recorded, so a restart
    /// folds it again.
    lost: Option<u64>,
}

impl Watermark {
    fn read(node: &dyn Node) -> Result<Watermark, crate::RelayError> {
        let recorded = node
            .store()
            .get_aux(Space::Jobs, WATERMARK_KEY)?
            .map(|v| crosstalk_schema::Position::decode(&v))
            .transpose()
            .map_err(|e| crate::StoreError::Corrupt(format!("the fold's watermark: {e}")))?
            .map_or(0, |p| p.0);
        Ok(Watermark {
            recorded,
            last: recorded,
            ..Default::default()
        })
    }

    fn delivered(&mut self, seq: u64, channel: ChannelName, stored: Option<u64>) {
        self.last = seq;
        if let Some(id) = stored {
            let at = self.touched.entry(channel).or_default();
            *at = (*at).max(id);
        }
    }

    /// A message of several channels, `events` one for each, was folded (or is being).
    fn held(&mut self, seq: u64, events: &[LogEvent]) {
        self.held.push((seq, super::several::held(seq, events)));
    }

    fn lost(&mut self, seq: u64) {
        self.last = seq;
        self.lost = Some(self.lost.map_or(seq, |l| l.min(seq)));
    }

    /// Records the candidate if its channels have committed; takes a new one if there is none.
    async fn advance(&mut self, node: &dyn Node) {
        let limit = self.lost.map_or(self.last, |l| self.last.min(l - 1));
        if self.candidate.is_none() && limit > self.recorded {
            // Those past the limit are folded again after a restart, and recorded then.
            let held = std::mem::take(&mut self.held)
                .into_iter()
                .filter(|(seq, _)| *seq <= limit)
                .flat_map(|(_, writes)| writes)
                .collect();
            self.candidate = Some((limit, std::mem::take(&mut self.touched), held));
        }
        let Some((at, waiting, held)) = &mut self.candidate else {
            return;
        };
        waiting.retain(|channel, id| node.channel_last_id(channel).map_or(true, |last| last < *id));
        if !waiting.is_empty() {
            return;
        }
        let at = *at;
        let mut writes = held.clone();
        writes.push((WATERMARK_KEY.to_vec(), Some(crosstalk_schema::Position(at).encode())));
        match node.write_aux(Space::Jobs, writes).await {
            Ok(()) => {
                self.recorded = at;
                self.candidate = None;
                metrics::gauge!("crosstalk_cluster_folded_through").set(at as f64);
            }
            // Tried again next time; until then a restart reads a little more of the log.
            Err(e) => tracing::debug!(error = %e, "recording the fold's watermark failed"),
        }
    }
}

/// What the follower of the log knows of the recorded retention cuts, read only once the log
/// has shown a gap: until then this node has folded every event of every channel.
#[derive(Default)]
struct KnownCuts {
    /// The bucket's revision when `cuts` were read; `None` before a gap was seen.
    revision: Option<u64>,
    cuts: HashMap<ChannelName, CutState>,
}

impl KnownCuts {
    /// After a gap in the log: reads the cuts again if any was recorded since they were read
    /// (a cut is recorded before the events it removes leave the log, so what the gap lacked
    /// is covered by a cut read now). Tries until it has; `false` on shutdown.
    async fn refresh(&mut self, cuts: &Cuts, shutdown: &CancellationToken) -> bool {
        let known = self.revision;
        let read = until_ok(shutdown.clone(), "retention cuts", || async move {
            if Some(cuts.revision().await?) == known {
                return Ok(None);
            }
            cuts.all().await.map(Some)
        });
        match read.await {
            None => false,
            Some(None) => true,
            Some(Some((revision, all))) => {
                self.revision = Some(revision);
                self.cuts = all;
                true
            }
        }
    }

    /// Before `channel`'s next event is folded: if its recorded cut removed events this node
    /// has not folded, starts the channel from the cut ([`Node::install`]).
    /// A cut is looked at once: the channel is then past it, here or by the install.
    async fn install_if_behind(&mut self, node: &dyn Node, channel: &ChannelName) {
        let Some(cut) = self.cuts.remove(channel) else {
            return;
        };
        let through = cut.trim.through;
        if node.channel_last_id(channel).unwrap_or(0) >= through {
            return;
        }
        let installed = attempts("start the channel from its cut", channel, || {
            node.install(channel.clone(), cut.clone())
        })
        .await;
        if installed.is_none() {
            tracing::error!(%channel, through, "could not start the channel from the log's retention cut; its copy on this node lacks what the cut kept");
        }
    }
}

/// Hands something to `channel`'s actor, trying again ([`DELIVERY_ATTEMPTS`] in all, pausing
/// longer each time) while it cannot take it (it stopped as it arrived and is reopened).
async fn attempts<T, F>(what: &str, channel: &ChannelName, mut hand: impl FnMut() -> F) -> Option<T>
where
    F: Future<Output = Result<T, crate::RelayError>>,
{
    for attempt in 1..=DELIVERY_ATTEMPTS {
        match hand().await {
            Ok(value) => return Some(value),
            Err(e) => tracing::debug!(%channel, error = %e, attempt, "cannot {what} yet; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
    }
    None
}

/// Hands one event to its channel, and waits until the channel has folded it, so the next
/// event of the channel comes after it. Answers the id the fold stored it under, if any;
/// `Err` if it could not be folded here.
async fn deliver(node: &dyn Node, event: LogEvent) -> Result<Option<u64>, ()> {
    let (channel, seq) = (event.channel.clone(), event.seq);
    match attempts("fold into the channel", &channel, || node.apply(event.clone())).await {
        Some(stored) => Ok(stored),
        None => {
            // This node stays behind for the channel until a restart replays the log.
            tracing::error!(%channel, seq, "an event of the shared log could not be folded on this node");
            Err(())
        }
    }
}

/// Mirrors the cluster's registrations into this node's identities, and tells the cluster
/// when this node last heard from each identity (every quarter of the presence TTL, at most
/// every 5 s), so liveness and sign-off are the cluster's, not one node's.
pub(super) async fn share_identities(node: Arc<dyn Node>, registrations: Registrations) {
    let shutdown = node.shutdown();
    let mirror = {
        let (node, registrations) = (node.clone(), registrations.clone());
        async move {
            let shutdown = node.shutdown();
            follow(
                &shutdown,
                "registrations",
                || registrations.watch(),
                |r| node.merge_registration(r),
            )
            .await
        }
    };
    actix::spawn(mirror);
    let every = (node.presence_ttl() / 4).clamp(Duration::from_millis(250), Duration::from_secs(5));
    let mut published: HashMap<String, i64> = HashMap::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.cancelled() => return,
        }
        for (id, session, seen) in node.heard_since(&mut published) {
            if let Err(e) = registrations.heard(&id, &session, seen).await {
                tracing::debug!(%id, error = %e, "publishing a heartbeat failed; next round");
                published.remove(&id);
            }
        }
    }
}

/// Shares per-channel presence across the cluster: publishes the participants this node's
/// supervisor hands over (arrivals, refreshes, departures) and mirrors the other nodes'.
pub(super) async fn share_presence(node: Arc<dyn Node>, presence: impl Future<Output = Option<SharedPresence>>) {
    let shutdown = node.shutdown();
    let Some(shared) = presence.await else {
        return;
    };
    let (tx, mut out) = tokio::sync::mpsc::unbounded_channel();
    node.share_presence(tx, shared.node.clone());
    let mirror = {
        let (node, shared) = (node.clone(), shared.clone());
        async move {
            let shutdown = node.shutdown();
            follow(
                &shutdown,
                "presence",
                || shared.watch(),
                |change| node.merge_presence(change),
            )
            .await
        }
    };
    actix::spawn(mirror);
    loop {
        let next = tokio::select! {
            next = out.recv() => next,
            _ = shutdown.cancelled() => return,
        };
        let Some(next) = next else { return };
        let published = match &next {
            Outgoing::Here(record) => shared.here(record).await,
            Outgoing::Gone(channel, id) => shared.gone(channel, id).await,
        };
        if let Err(e) = published {
            // Presence is advisory: the next refresh publishes it again, and the bucket
            // expires what is not refreshed.
            tracing::debug!(error = %e, "publishing presence failed");
        }
    }
}

/// Shares active waits across the cluster, for the mutual-wait release: publishes this node's
/// (in the order its channels changed them) and mirrors the others', telling an open channel
/// to look again when another node's waits on it change.
pub(super) async fn share_waits(
    node: Arc<dyn Node>,
    waits_bucket: impl Future<Output = Option<SharedWaits>>,
    waits: Arc<ClusterWaits>,
    mut news: tokio::sync::mpsc::UnboundedReceiver<WaitNews>,
) {
    let shutdown = node.shutdown();
    let Some(shared) = waits_bucket.await else {
        return;
    };
    let mirror = {
        let (node, shared) = (node.clone(), shared.clone());
        async move {
            let shutdown = node.shutdown();
            let own = shared.node.clone();
            follow(
                &shutdown,
                "waits",
                || shared.watch(),
                |event| {
                    for channel in waits.merge(event, &own) {
                        node.check_release(&channel);
                    }
                },
            )
            .await
        }
    };
    actix::spawn(mirror);
    let mut alive = tokio::time::interval(NODE_ALIVE_EVERY);
    loop {
        // Biased: the first heartbeat goes out before this node's first wait.
        let next = tokio::select! {
            biased;
            _ = alive.tick() => {
                if let Err(e) = shared.alive().await {
                    tracing::debug!(error = %e, "saying this node is alive failed");
                }
                continue;
            }
            next = news.recv() => next,
            _ = shutdown.cancelled() => return,
        };
        let Some((channel, instance, waiting)) = next else {
            return;
        };
        if let Err(e) = shared.set(&channel, &instance, waiting).await {
            // The other nodes go on without it: a wait they do not see is not counted as
            // waiting, so nobody is released early.
            tracing::debug!(error = %e, "publishing a wait failed");
        }
    }
}

/// Mirrors the cluster's read cursors into this node's registry (moves on other nodes, and
/// removals), so the inbox and "read by…" are the cluster's.
pub(super) async fn share_cursors(node: Arc<dyn Node>, cursors: SharedCursors) {
    let shutdown = node.shutdown();
    follow(
        &shutdown,
        "cursors",
        || cursors.watch(),
        |change| node.merge_cursor(change),
    )
    .await
}

/// Calls `call` until it succeeds (backing off between attempts): opening one of the
/// cluster's buckets, reading the retention cuts. `None` on shutdown.
pub(super) async fn until_ok<T, F>(shutdown: CancellationToken, what: &str, mut call: impl FnMut() -> F) -> Option<T>
where
    F: Future<Output = Result<T, crate::RelayError>>,
{
    let mut backoff = RETRY_FIRST;
    loop {
        match call().await {
            Ok(value) => return Some(value),
            Err(e) => tracing::warn!(error = %e, "cannot reach the cluster's {what} yet; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.cancelled() => return None,
        }
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// Follows one of the cluster's buckets from its history on, handing each change to `apply`,
/// and watches it again (backing off) whenever the watch fails or ends, until shutdown. Ends
/// on shutdown while the runtime still runs: a watch's subscription unsubscribes on a task of
/// its own when dropped.
async fn follow<S, F, T>(
    shutdown: &CancellationToken,
    what: &str,
    mut watch: impl FnMut() -> F,
    mut apply: impl FnMut(T),
) where
    F: Future<Output = Result<S, crate::RelayError>>,
    S: futures_util::Stream<Item = T> + Unpin,
{
    let mut backoff = RETRY_FIRST;
    while !shutdown.is_cancelled() {
        match watch().await {
            Ok(mut changes) => {
                backoff = RETRY_FIRST;
                while let Some(change) = tokio::select! {
                    c = changes.next() => c,
                    _ = shutdown.cancelled() => return,
                } {
                    apply(change);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot watch the cluster's {what} yet; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}
