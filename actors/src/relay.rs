//! [`Relay`]: the cheap, cloneable handle every face uses. It sends messages to the actors,
//! reads committed state through channel views, and owns the shutdown signal. Operations that
//! span actors (waits, asking a question, the inbox, search) are composed here.

use crate::channel::{
    BeginWait, ChannelConfig, ChannelHandle, Describe, EndSession, EndWait, Post, Retention, Role, StartSession,
    WaitControl,
};
use crate::commit::{Committer, Durability};
use crate::error::RelayError;
use crate::identities::{Identities, InstanceView};
use crate::presence::{Heartbeat, Leave, ListPresence, Participant, PresenceEvent, PresenceSupervisor, WatchPresence};
use crate::registry::{AdvanceCursor, Cursors, Directory, OpenChannel, Register, Registered, Registry};
use crate::search::{self, Indexer, Query};
use crate::shared::{Fetch, ListShared, Share, SharedStore, SharedSummary, Unshare};
use crate::store::{EventStore, RepairReport};
use crate::view::{ChannelView, Posted};
use actix::prelude::*;
use crosstalk_schema::message::{ANY_HUMAN, DIRECTIVE, INTERRUPT, QUESTION};
use crosstalk_schema::{
    kind_is, ChannelName, ChannelState, ChannelSummary, InstanceKind, Limits, NewMessage, SharedData,
};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Longest a face waits for an actor to answer before reporting the relay unavailable.
/// A post's answer includes its flush, so this is generous.
pub const ACTOR_CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a search waits for the index to catch up with what was posted.
pub const SEARCH_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// A poster's presence is refreshed at most this often per channel: presence is measured
/// in the TTL's tens of seconds, and a heartbeat per post would cost the hot path.
const POST_HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// Entries in the heartbeat throttle before it is cleared (it only saves work).
const HEARTBEAT_THROTTLE_CAP: usize = 10_000;

/// Hands out event ids: unique across the relay, increasing. Starts above every id the store
/// has ever handed out, so ids continue after a restart without reuse.
pub struct IdAllocator(AtomicU64);

impl IdAllocator {
    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

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
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            limits: Limits::default(),
            durability: Durability::Flush,
            presence_ttl: Duration::from_secs(120),
            release_grace: Duration::from_secs(5),
            retention: Retention::default(),
            channel_retention: HashMap::new(),
            retention_every: Duration::from_secs(60),
            max_shared_bytes: 1024 * 1024,
        }
    }
}

/// How to wait.
#[derive(Debug, Clone, Default)]
pub struct WaitOptions {
    pub since_id: u64,
    pub limit: usize,
    pub timeout: Duration,
    /// The waiting identity: enables one-wait-per-identity, roles and release.
    pub instance: Option<String>,
    pub role: Role,
    /// Skip the caller's own messages (only with an identity).
    pub exclude_self: bool,
}

/// Why a wait returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitOutcome {
    Messages,
    Timeout,
    /// A newer wait by the same identity on the same channel took over.
    Superseded,
    /// Every active party was waiting: this one should speak first.
    SpeakFirst,
    /// The peer's last word was `done`.
    Done,
    ShuttingDown,
}

impl WaitOutcome {
    /// What the caller should do next, in one sentence.
    pub fn hint(self) -> &'static str {
        match self {
            WaitOutcome::Messages => "Handle these messages, then wait again with since_id = next_since_id.",
            WaitOutcome::Timeout => "Nothing yet: wait again with the same since_id (next_since_id).",
            WaitOutcome::Superseded => "A newer wait of yours on this channel replaced this one; use that one.",
            WaitOutcome::SpeakFirst => {
                "Everyone on this channel is waiting and nobody is speaking: you go first — post your message, then wait."
            }
            WaitOutcome::Done => "The other party said done. Reply with done to finish, or post to continue.",
            WaitOutcome::ShuttingDown => "The relay is restarting; wait again in a moment with the same since_id.",
        }
    }
}

#[derive(Debug, Clone)]
pub struct WaitResult {
    pub messages: Vec<Arc<Posted>>,
    pub outcome: WaitOutcome,
    /// The since_id to use for the next wait or read.
    pub next_since_id: u64,
}

/// What `get_directives` returns.
#[derive(Debug, Clone)]
pub struct Directives {
    /// INTERRUPT and DIRECTIVE messages after `since_id` for the recipient or for everyone.
    pub directives: Vec<Arc<Posted>>,
    /// QUESTIONs still open for the recipient or for everyone.
    pub open_questions: Vec<Arc<Posted>>,
    pub next_since_id: u64,
}

/// A channel found by name or description.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ChannelInfo {
    #[serde(flatten)]
    pub summary: ChannelSummary,
    pub description: Option<String>,
}

#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Addr<Registry>,
    presence: Addr<PresenceSupervisor>,
    indexer: Addr<Indexer>,
    shared: Addr<SharedStore>,
    directory: Directory,
    identities: Arc<Identities>,
    store: Arc<dyn EventStore>,
    committer: Committer,
    shutdown: CancellationToken,
    /// When each (channel, poster) last sent a presence heartbeat.
    heartbeats: parking_lot::Mutex<HashMap<(ChannelName, String), std::time::Instant>>,
}

/// Ends a registered wait however the waiting future ends.
struct WaitGuard {
    handle: ChannelHandle,
    instance: String,
    generation: u64,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let _ = self.handle.addr.try_send(EndWait {
            instance: std::mem::take(&mut self.instance),
            generation: self.generation,
        });
    }
}

/// Whether a message addressed to `recipient` is for `who`: a broadcast (no recipient, or
/// `any-human`) is for everyone; anything else only for its recipient. With no `who`, only
/// broadcasts (crosstalk-mcp's rule).
fn for_recipient(recipient: Option<&str>, who: Option<&str>) -> bool {
    match (recipient, who) {
        (None, _) => true,
        (Some(r), _) if r.eq_ignore_ascii_case(ANY_HUMAN) => true,
        (Some(r), Some(w)) => r.eq_ignore_ascii_case(w),
        (Some(_), None) => false,
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
        let ids = Arc::new(IdAllocator(AtomicU64::new(last_id)));
        let committer = Committer::start(store.clone(), config.durability)
            .map_err(|e| RelayError::Store(crate::StoreError::Io(e.to_string())))?;
        let directory = Directory::default();
        let channel_config = ChannelConfig {
            limits: config.limits,
            presence_ttl: config.presence_ttl,
            release_grace: config.release_grace,
            retention: config.retention,
            retention_every: config.retention_every,
        };
        let per_channel = config.channel_retention.clone();
        let identities = Arc::new(Identities::new(config.presence_ttl));
        let registry = Registry::new(
            directory.clone(),
            store.clone(),
            committer.clone(),
            ids,
            channel_config,
            per_channel,
            identities.clone(),
        )?
        .start();
        let presence = PresenceSupervisor::new(config.presence_ttl).start();
        let shared = SharedStore::new(store.clone(), committer.clone(), config.max_shared_bytes).start();
        // The indexer gets a thread of its own: its store writes must never stall the
        // channel actors (which share the system arbiter).
        let views_dir = directory.clone();
        let index_store = store.clone();
        let indexer = Indexer::start_in_arbiter(&Arbiter::new().handle(), move |_| {
            Indexer::new(
                index_store,
                Arc::new(move || views_dir.read().values().map(|h| h.view.clone()).collect()),
            )
        });
        tracing::info!(last_id, "relay started");
        let relay = Relay {
            inner: Arc::new(Inner {
                registry,
                presence,
                indexer,
                shared,
                directory,
                identities,
                store,
                committer,
                shutdown: CancellationToken::new(),
                heartbeats: Default::default(),
            }),
        };
        Ok((relay, repairs))
    }

    /// The channel's handle, starting its actor on first use.
    pub async fn channel(&self, name: &ChannelName) -> Result<ChannelHandle, RelayError> {
        if let Some(h) = self.inner.directory.read().get(name) {
            return Ok(h.clone());
        }
        if self.inner.shutdown.is_cancelled() {
            return Err(RelayError::ShuttingDown);
        }
        self.inner
            .registry
            .send(OpenChannel(name.clone()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
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
        let posted = handle.addr.send(Post(post)).timeout(ACTOR_CALL_TIMEOUT).await??;
        let due = {
            let mut seen = self.inner.heartbeats.lock();
            if seen.len() > HEARTBEAT_THROTTLE_CAP {
                seen.clear();
            }
            let key = (channel.clone(), posted.message.sender.clone());
            match seen.get(&key) {
                Some(at) if at.elapsed() < POST_HEARTBEAT_EVERY => false,
                _ => {
                    seen.insert(key, std::time::Instant::now());
                    true
                }
            }
        };
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

    /// Records that `who` has read `channel` up to `id` (its cursor never moves back).
    pub fn mark_read(&self, who: &str, channel: &ChannelName, id: u64) {
        self.advance_cursor(who, channel, id);
    }

    fn advance_cursor(&self, who: &str, channel: &ChannelName, id: u64) {
        let _ = self.inner.registry.try_send(AdvanceCursor {
            instance_id: who.to_owned(),
            channel: channel.clone(),
            id,
        });
    }

    /// Committed messages with id > `after`, oldest first. An unknown channel is empty and is
    /// not created by being read. With `reader`, its read cursor moves past what it got.
    pub async fn read(
        &self,
        channel: &ChannelName,
        after: u64,
        limit: usize,
        reader: Option<&str>,
    ) -> Result<Vec<Arc<Posted>>, RelayError> {
        if !self.inner.directory.read().contains_key(channel) && self.inner.store.meta(channel)?.is_none() {
            return Ok(Vec::new());
        }
        let (found, scanned) = self.channel(channel).await?.view.read_scanned(after, limit)?;
        if let Some(who) = reader {
            self.advance_cursor(who, channel, scanned);
        }
        Ok(found)
    }

    /// Waits for messages after `since_id`: see [`WaitOptions`] and [`WaitOutcome`].
    /// Ends early when the relay shuts down or the returned future is dropped.
    pub async fn wait(&self, channel: &ChannelName, opts: WaitOptions) -> Result<WaitResult, RelayError> {
        let handle = self.channel(channel).await?;
        let view = handle.view.clone();
        // Subscribe before reading, so a commit between the read and the wait still wakes us.
        let mut commits = view.subscribe();
        let mut control = None;
        let mut _guard = None;
        if let Some(me) = &opts.instance {
            let (generation, rx) = handle
                .addr
                .send(BeginWait {
                    instance: me.clone(),
                    role: opts.role,
                })
                .timeout(ACTOR_CALL_TIMEOUT)
                .await?;
            control = Some(rx);
            _guard = Some(WaitGuard {
                handle: handle.clone(),
                instance: me.clone(),
                generation,
            });
            self.heartbeat(Heartbeat {
                channel: channel.clone(),
                participant_id: me.clone(),
                display_name: None,
                kind: None,
                side: None,
                activity: "waiting",
            });
        }
        let me = opts.instance.as_deref().filter(|_| opts.exclude_self);
        if let Some(me) = me {
            if let Some(done) = view.pending_done(me).filter(|d| d.id() > opts.since_id) {
                let next = done.id();
                return Ok(self.waited(channel, me, vec![done], WaitOutcome::Done, next));
            }
        }
        let deadline = tokio::time::sleep(opts.timeout);
        tokio::pin!(deadline);
        let mut cursor = opts.since_id;
        loop {
            let (found, scanned) = view.read_scanned(cursor, opts.limit)?;
            cursor = scanned;
            let found: Vec<_> = found
                .into_iter()
                .filter(|p| me != Some(p.message.sender.as_str()))
                .collect();
            if !found.is_empty() {
                let outcome = if me.is_some() && found.iter().any(|p| kind_is(&p.message.kind, "done")) {
                    WaitOutcome::Done
                } else {
                    WaitOutcome::Messages
                };
                return Ok(self.waited(channel, opts.instance.as_deref().unwrap_or(""), found, outcome, cursor));
            }
            let control_fired = async {
                match control.as_mut() {
                    Some(rx) => rx.await.ok(),
                    None => std::future::pending().await,
                }
            };
            let outcome = tokio::select! {
                changed = commits.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => WaitOutcome::ShuttingDown,
                },
                c = control_fired => match c {
                    Some(WaitControl::Superseded) => WaitOutcome::Superseded,
                    Some(WaitControl::SpeakFirst) => WaitOutcome::SpeakFirst,
                    None => { control = None; continue }
                },
                _ = &mut deadline => WaitOutcome::Timeout,
                _ = self.inner.shutdown.cancelled() => WaitOutcome::ShuttingDown,
            };
            return Ok(WaitResult {
                messages: Vec::new(),
                outcome,
                next_since_id: cursor,
            });
        }
    }

    fn waited(
        &self,
        channel: &ChannelName,
        who: &str,
        messages: Vec<Arc<Posted>>,
        outcome: WaitOutcome,
        next_since_id: u64,
    ) -> WaitResult {
        if !who.is_empty() {
            self.advance_cursor(who, channel, next_since_id);
        }
        WaitResult {
            messages,
            outcome,
            next_since_id,
        }
    }

    /// Every channel with at least one event, most recently active first.
    pub fn list_channels(&self) -> Result<Vec<ChannelSummary>, RelayError> {
        let mut metas: HashMap<ChannelName, _> = self.inner.store.channels()?.into_iter().collect();
        // Open channels may have a batch in flight: show only what they have committed.
        for (name, handle) in self.inner.directory.read().iter() {
            metas.insert(name.clone(), handle.view.meta());
        }
        let mut list: Vec<ChannelSummary> = metas
            .iter()
            .filter(|(_, m)| m.last_id > 0)
            .map(|(name, meta)| ChannelSummary::new(name, meta))
            .collect();
        list.sort_by_key(|c| std::cmp::Reverse(c.last_id));
        Ok(list)
    }

    /// Creates a channel (or updates its description).
    pub async fn create_channel(&self, channel: &ChannelName, description: &str) -> Result<ChannelInfo, RelayError> {
        let handle = self.channel(channel).await?;
        let state = handle
            .addr
            .send(Describe(description.to_owned()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await??;
        Ok(ChannelInfo {
            summary: ChannelSummary::new(channel, &handle.view.meta()),
            description: state.description,
        })
    }

    /// Channels whose name or description contains `query` (case-insensitive).
    pub fn find_channels(&self, query: &str) -> Result<Vec<ChannelInfo>, RelayError> {
        let needle = query.trim().to_lowercase();
        let mut out = Vec::new();
        for summary in self.list_channels()? {
            let Ok(name) = ChannelName::parse(&summary.channel) else {
                continue;
            };
            let description = match self.open_view(&name) {
                Some(v) => v.channel_state().description,
                None => self.inner.store.state(&name)?.description,
            };
            let hit = summary.channel.contains(&needle)
                || description.as_ref().is_some_and(|d| d.to_lowercase().contains(&needle));
            if hit {
                out.push(ChannelInfo { summary, description });
            }
        }
        Ok(out)
    }

    /// The committed state of a channel (default for a channel never written); starts nothing.
    pub fn channel_state(&self, channel: &ChannelName) -> Result<ChannelState, RelayError> {
        match self.open_view(channel) {
            Some(v) => Ok(v.channel_state()),
            None => Ok(self.inner.store.state(channel)?),
        }
    }

    /// One committed message, `None` if there is none with that id; starts nothing for a
    /// channel never written.
    pub async fn message(&self, channel: &ChannelName, id: u64) -> Result<Option<Arc<Posted>>, RelayError> {
        match self.existing_view(channel).await? {
            Some(view) => view.get(id),
            None => Ok(None),
        }
    }

    pub async fn start_session(
        &self,
        channel: &ChannelName,
        max_turns: Option<u32>,
    ) -> Result<ChannelState, RelayError> {
        let handle = self.channel(channel).await?;
        handle
            .addr
            .send(StartSession { max_turns })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    /// Ends the active session; `None` when there was none (nothing is written).
    pub async fn end_session(&self, channel: &ChannelName) -> Result<Option<ChannelState>, RelayError> {
        if self.channel_state(channel)?.active_session().is_none() {
            return Ok(None);
        }
        let handle = self.channel(channel).await?;
        handle
            .addr
            .send(EndSession)
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
            .map(Some)
    }

    /// The replies to a message, oldest first.
    pub async fn replies(&self, channel: &ChannelName, id: u64, limit: usize) -> Result<Vec<Arc<Posted>>, RelayError> {
        let not_found = || RelayError::NotFound(format!("no message {id} in channel {channel}"));
        let view = self.existing_view(channel).await?.ok_or_else(not_found)?;
        if view.get(id)?.is_none() && view.overlay(id).is_none() {
            return Err(RelayError::NotFound(format!("no message {id} in channel {channel}")));
        }
        view.replies(id, limit)
    }

    /// INTERRUPTs, DIRECTIVEs and open QUESTIONs for `recipient` (or for everyone).
    pub async fn directives(
        &self,
        channel: &ChannelName,
        recipient: Option<&str>,
        since_id: u64,
    ) -> Result<Directives, RelayError> {
        let Some(view) = self.existing_view(channel).await? else {
            return Ok(Directives {
                directives: Vec::new(),
                open_questions: Vec::new(),
                next_since_id: since_id,
            });
        };
        let mut directives = Vec::new();
        let mut cursor = since_id;
        loop {
            let (batch, scanned) = view.read_scanned(cursor, 1000)?;
            let done = scanned == cursor;
            cursor = scanned;
            directives.extend(batch.into_iter().filter(|p| {
                (kind_is(&p.message.kind, INTERRUPT) || kind_is(&p.message.kind, DIRECTIVE))
                    && for_recipient(p.message.recipient.as_deref(), recipient)
            }));
            if done || cursor >= view.last_id() {
                break;
            }
        }
        let state = view.channel_state();
        let mut open_questions = Vec::new();
        for (id, to) in state.open_questions.range(since_id + 1..) {
            if for_recipient(to.as_deref(), recipient) {
                if let Some(q) = view.get(*id)? {
                    open_questions.push(q);
                }
            }
        }
        Ok(Directives {
            directives,
            open_questions,
            next_since_id: cursor,
        })
    }

    /// Posts a QUESTION and waits until an ANSWER replies to it, or `timeout` passes.
    /// Returns the question and, if it came, the answer.
    pub async fn ask(
        &self,
        channel: &ChannelName,
        mut question: NewMessage,
        timeout: Duration,
    ) -> Result<(Arc<Posted>, Option<Arc<Posted>>), RelayError> {
        question.kind = Some(QUESTION.to_uppercase());
        let q = self.post(channel, question).await?;
        let answer = self.await_answer(channel, q.id(), timeout).await?;
        // Read back: an answered question says so (its status comes from the answer).
        let q = match answer {
            Some(_) => self.message(channel, q.id()).await?.unwrap_or(q),
            None => q,
        };
        Ok((q, answer))
    }

    /// Waits until the QUESTION `id` has an ANSWER, or `timeout` passes.
    pub async fn await_answer(
        &self,
        channel: &ChannelName,
        id: u64,
        timeout: Duration,
    ) -> Result<Option<Arc<Posted>>, RelayError> {
        let view = self.channel(channel).await?.view;
        let mut commits = view.subscribe();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            if let Some(answer) = view.overlay(id).and_then(|o| o.answered_by) {
                return view.get(answer);
            }
            tokio::select! {
                changed = commits.changed() => if changed.is_err() { return Ok(None) },
                _ = &mut deadline => return Ok(None),
                _ = self.inner.shutdown.cancelled() => return Ok(None),
            }
        }
    }

    /// What is new for `who` on every channel it has joined (posted in or read), since its
    /// cursor: messages from others, addressed to it or to everyone. Moves the cursors, and
    /// answers only once they are durable, so nothing is ever handed out twice.
    pub async fn inbox(&self, who: &str, limit: usize) -> Result<Vec<Arc<Posted>>, RelayError> {
        // `any-human` messages belong in a human's inbox only.
        let kind = self
            .inner
            .identities
            .get(who)
            .map_or(InstanceKind::Agent, |i| i.instance.kind);
        let cursors = self
            .inner
            .registry
            .send(Cursors(who.to_owned()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?;
        let mut out = Vec::new();
        for (channel, cursor) in cursors {
            if out.len() >= limit {
                break;
            }
            let view = self.channel(&channel).await?.view;
            let (batch, scanned) = view.read_scanned(cursor, limit - out.len())?;
            out.extend(batch.into_iter().filter(|p| {
                let m = &p.message;
                m.sender != who
                    && match m.recipient.as_deref() {
                        None => true,
                        Some(r) if r.eq_ignore_ascii_case(ANY_HUMAN) => kind == InstanceKind::Human,
                        Some(r) => r == who,
                    }
            }));
            self.advance_cursor(who, &channel, scanned);
        }
        // The cursor writes are queued before this request: one flush covers them.
        let _ = self
            .inner
            .registry
            .send(Cursors(who.to_owned()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?;
        self.inner.committer.durable().await.unwrap_or(Ok(()))?;
        Ok(out)
    }

    pub async fn register(
        &self,
        instance_id: &str,
        description: Option<String>,
        kind: InstanceKind,
        session: Option<String>,
    ) -> Result<Registered, RelayError> {
        self.inner
            .registry
            .send(Register {
                instance_id: instance_id.to_owned(),
                description,
                kind,
                session,
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    pub fn list_instances(&self) -> Vec<InstanceView> {
        self.inner.identities.list()
    }

    /// Publishes a version of `key`; the caller has authorised `owner`.
    pub async fn share_data(
        &self,
        owner: &str,
        key: &str,
        content: String,
        description: Option<String>,
    ) -> Result<SharedSummary, RelayError> {
        self.inner
            .shared
            .send(Share {
                key: key.to_owned(),
                owner: owner.to_owned(),
                content,
                description,
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    pub async fn get_shared_data(&self, key: &str, version: Option<u64>) -> Result<SharedData, RelayError> {
        self.inner
            .shared
            .send(Fetch {
                key: key.to_owned(),
                version,
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    pub async fn list_shared_data(&self) -> Result<Vec<SharedSummary>, RelayError> {
        self.inner.shared.send(ListShared).timeout(ACTOR_CALL_TIMEOUT).await?
    }

    /// Deletes `key`; the caller has authorised `owner`.
    pub async fn delete_shared_data(&self, owner: &str, key: &str) -> Result<SharedSummary, RelayError> {
        self.inner
            .shared
            .send(Unshare {
                key: key.to_owned(),
                owner: owner.to_owned(),
            })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    /// Case-insensitive search across channels, newest first, served from the index.
    pub async fn search(&self, query: Query) -> Result<Vec<Arc<Posted>>, RelayError> {
        for (name, _) in self.inner.store.channels()? {
            if self.open_view(&name).is_none() {
                self.channel(&name).await?;
            }
        }
        // The index lags under load (it runs at the lowest priority): bring it up to date.
        self.inner
            .indexer
            .send(search::CatchUp)
            .timeout(SEARCH_CATCH_UP_TIMEOUT)
            .await?;
        search::search(self.inner.store.as_ref(), &|c| self.open_view(c), &query)
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

    /// Cancelled when the relay begins to shut down: streams and waits end on it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Stops taking work, ends streams and waits, and flushes the store.
    pub fn shutdown(&self) -> Result<(), RelayError> {
        self.inner.shutdown.cancel();
        self.inner.store.flush()?;
        Ok(())
    }
}
