//! The node's projection of a cluster's shared state ([`crate::nats`]). One task follows the log
//! from the watermark this node recorded (how far its store has committed the fold) and hands
//! each event, in order, to its channel's actor ([`Apply`]), which folds it exactly as every
//! other node does. Events a channel has already folded (its stored last id) are skipped by
//! the actor, so a watermark behind some channels is safe. Another mirrors the cluster's
//! registered identities into this node's and publishes when this node last heard from the
//! identities bound on it; others share read cursors and per-channel presence.

use super::Relay;
use crate::channel::{Apply, CheckRelease, ClusterWaits, WaitNews, NODE_ALIVE_EVERY};
use crate::nats::{LogEvent, NatsLog};
use crate::presence::{MergePresence, Outgoing, Share};
use crate::store::{EventStore, Space};
use crosstalk_schema::ChannelName;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Backoff between attempts to follow the log after it failed.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Attempts to hand an event to its channel (an actor stopping as it arrives is reopened).
const DELIVERY_ATTEMPTS: usize = 20;

pub(super) async fn project(relay: Relay, log: NatsLog) {
    let mut mark = match Watermark::read(&relay) {
        Ok(mark) => mark,
        Err(e) => {
            // Without it, the whole log is read again; what is stored is skipped.
            tracing::warn!(error = %e, "cannot read how far this node has folded the log; from its start");
            Watermark::default()
        }
    };
    let mut next = mark.recorded + 1;
    tracing::info!(from = next, "following the shared log");
    let mut backoff = RETRY_FIRST;
    let mut every = tokio::time::interval(WATERMARK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !relay.inner.shutdown.is_cancelled() {
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
                            mark.advance(&relay).await;
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
                        _ = relay.inner.shutdown.cancelled() => return,
                    };
                    heard = Instant::now();
                    behind = None;
                    match event {
                        Some(Ok(event)) => {
                            next = event.seq + 1;
                            let (seq, channel) = (event.seq, event.channel.clone());
                            match deliver(&relay, event).await {
                                Ok(stored) => mark.delivered(seq, channel, stored),
                                Err(()) => mark.lost(seq),
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
async fn newest(log: &NatsLog) -> Option<u64> {
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
    /// A position to record once its channels have committed what they stored up to it.
    candidate: Option<(u64, HashMap<ChannelName, u64>)>,
    /// The first event this node could not fold: nothing from it on is recorded, so a restart
    /// folds it again.
    lost: Option<u64>,
}

impl Watermark {
    fn read(relay: &Relay) -> Result<Watermark, crate::RelayError> {
        let recorded = relay
            .inner
            .store
            .get_aux(Space::Jobs, WATERMARK_KEY)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_be_bytes);
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

    fn lost(&mut self, seq: u64) {
        self.last = seq;
        self.lost = Some(self.lost.map_or(seq, |l| l.min(seq)));
    }

    /// Records the candidate if its channels have committed; takes a new one if there is none.
    async fn advance(&mut self, relay: &Relay) {
        let limit = self.lost.map_or(self.last, |l| self.last.min(l - 1));
        if self.candidate.is_none() && limit > self.recorded {
            self.candidate = Some((limit, std::mem::take(&mut self.touched)));
        }
        let Some((at, waiting)) = &mut self.candidate else {
            return;
        };
        waiting.retain(|channel, id| relay.channel_last_id(channel).map_or(true, |last| last < *id));
        if !waiting.is_empty() {
            return;
        }
        let at = *at;
        let value = at.to_be_bytes().to_vec();
        let ticket = relay.inner.committer.write(Box::new(move |store: &dyn EventStore| {
            store.write_aux(Space::Jobs, &[(WATERMARK_KEY.to_vec(), Some(value.clone()))])
        }));
        match ticket.durable().await {
            Ok(()) => {
                self.recorded = at;
                self.candidate = None;
            }
            // Tried again next time; until then a restart reads a little more of the log.
            Err(e) => tracing::debug!(error = %e, "recording the fold's watermark failed"),
        }
    }
}

/// Hands one event to its channel's actor, and waits until the actor has folded it, so the
/// next event of the channel comes after it. Answers the id the fold stored it under, if any;
/// `Err` if it could not be folded here.
async fn deliver(relay: &Relay, event: LogEvent) -> Result<Option<u64>, ()> {
    for attempt in 1..=DELIVERY_ATTEMPTS {
        match relay.open_channel(&event.channel, true).await {
            // An actor that stopped between the lookup and the send is reopened next attempt.
            Ok(handle) => match handle.addr.send(Apply(event.clone())).await {
                Ok(stored) => return Ok(stored),
                Err(e) => {
                    tracing::debug!(channel = %event.channel, seq = event.seq, error = %e, attempt, "channel actor gone; retrying")
                }
            },
            Err(e) => {
                tracing::warn!(channel = %event.channel, seq = event.seq, error = %e, attempt, "cannot open a channel to fold into")
            }
        }
        tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
    }
    // This node stays behind for the channel until a restart replays the log.
    tracing::error!(channel = %event.channel, seq = event.seq, "an event of the shared log could not be folded on this node");
    Err(())
}

/// Mirrors the cluster's registrations into this node's identities, and tells the cluster
/// when this node last heard from each identity (every quarter of the presence TTL, at most
/// every 5 s), so liveness and sign-off are the cluster's, not one node's.
pub(super) async fn share_identities(relay: Relay, log: NatsLog) {
    let identities = relay.inner.identities.clone();
    let mirror = {
        let (relay, log, identities) = (relay.clone(), log.clone(), identities.clone());
        async move {
            follow(
                &relay,
                "registrations",
                || log.registrations().watch(),
                |r| identities.merge(r.instance, r.session, r.seen),
            )
            .await
        }
    };
    actix::spawn(mirror);
    let every = (identities.ttl() / 4).clamp(Duration::from_millis(250), Duration::from_secs(5));
    let mut published: HashMap<String, i64> = HashMap::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = relay.inner.shutdown.cancelled() => return,
        }
        for (id, session, seen) in identities.heard_since(&mut published) {
            if let Err(e) = log.registrations().heard(&id, &session, seen).await {
                tracing::debug!(%id, error = %e, "publishing a heartbeat failed; next round");
                published.remove(&id);
            }
        }
    }
}

/// Shares per-channel presence across the cluster: publishes the participants this node's
/// supervisor hands over (arrivals, refreshes, departures) and mirrors the other nodes'.
pub(super) async fn share_presence(relay: Relay, log: NatsLog) {
    let ttl = relay.inner.identities.ttl();
    let Some(shared) = open(&relay, "presence", || log.presence(ttl)).await else {
        return;
    };
    let (tx, mut out) = tokio::sync::mpsc::unbounded_channel();
    let node = shared.node().to_owned();
    relay.inner.presence.do_send(Share { tx, node });
    let mirror = {
        let (relay, shared) = (relay.clone(), shared.clone());
        async move {
            let presence = relay.inner.presence.clone();
            follow(
                &relay,
                "presence",
                || shared.watch(),
                |change| presence.do_send(MergePresence(change)),
            )
            .await
        }
    };
    actix::spawn(mirror);
    loop {
        let next = tokio::select! {
            next = out.recv() => next,
            _ = relay.inner.shutdown.cancelled() => return,
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
/// (in the order its channel actors changed them) and mirrors the others', telling an open
/// channel to look again when another node's waits on it change.
pub(super) async fn share_waits(
    relay: Relay,
    log: NatsLog,
    waits: Arc<ClusterWaits>,
    mut news: tokio::sync::mpsc::UnboundedReceiver<WaitNews>,
) {
    let Some(shared) = open(&relay, "waits", || log.waits()).await else {
        return;
    };
    let mirror = {
        let (relay, shared) = (relay.clone(), shared.clone());
        async move {
            let own = shared.node().to_owned();
            follow(
                &relay,
                "waits",
                || shared.watch(),
                |event| {
                    for channel in waits.merge(event, &own) {
                        if let Some(handle) = relay.inner.directory.read().get(&channel) {
                            handle.addr.do_send(CheckRelease);
                        }
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
            _ = relay.inner.shutdown.cancelled() => return,
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
pub(super) async fn share_cursors(relay: Relay, log: NatsLog) {
    follow(
        &relay,
        "cursors",
        || log.cursors().watch(),
        |change| relay.inner.registry.do_send(crate::registry::MergeCursor(change)),
    )
    .await
}

/// Opens one of the cluster's buckets, trying again (backing off) until it opens; `None` on
/// shutdown.
async fn open<T, F>(relay: &Relay, what: &str, mut open: impl FnMut() -> F) -> Option<T>
where
    F: Future<Output = Result<T, crate::RelayError>>,
{
    let mut backoff = RETRY_FIRST;
    loop {
        match open().await {
            Ok(bucket) => return Some(bucket),
            Err(e) => tracing::warn!(error = %e, "cannot open the cluster's {what} bucket yet; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = relay.inner.shutdown.cancelled() => return None,
        }
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// Follows one of the cluster's buckets from its history on, handing each change to `apply`,
/// and watches it again (backing off) whenever the watch fails or ends, until shutdown. Ends
/// on shutdown while the runtime still runs: a watch's subscription unsubscribes on a task of
/// its own when dropped.
async fn follow<S, F, T>(relay: &Relay, what: &str, mut watch: impl FnMut() -> F, mut apply: impl FnMut(T))
where
    F: Future<Output = Result<S, crate::RelayError>>,
    S: futures_util::Stream<Item = T> + Unpin,
{
    let mut backoff = RETRY_FIRST;
    while !relay.inner.shutdown.is_cancelled() {
        match watch().await {
            Ok(mut changes) => {
                backoff = RETRY_FIRST;
                while let Some(change) = tokio::select! {
                    c = changes.next() => c,
                    _ = relay.inner.shutdown.cancelled() => return,
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
