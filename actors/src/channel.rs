//! A channel's actor: the only writer of the channel's log. It validates and folds each
//! event into the channel's state as it accepts it and commits batches through the group
//! committer, whose thread publishes each durable batch to the [`ChannelView`] and answers
//! its posters (see [`batch`]). It also coordinates
//! waits: one per identity, roles, and releasing one party when everyone is waiting.
//!
//! Invariants:
//! - ids are assigned here, in mailbox order, so they strictly increase within the channel;
//! - a batch becomes visible (view, watermark) only after the committer says it is durable,
//!   and one batch is in flight at a time, so readers see a gap-free, id-ordered prefix and
//!   never what a crash could take back;
//! - the working state (`state`, `overlays`, `meta`) is the committed state plus the pending
//!   events; the view holds the committed state only;
//! - the watermark is a wake-up, not a queue: subscribers re-read from the view by cursor.

use crate::cluster::{ChannelLog, Cluster, Sequenced};
use crate::commit::Committer;
use crate::error::RelayError;
use crate::ids::IdAllocator;
use crate::store::EventStore;
use crate::view::{ChannelView, Posted};
use actix::prelude::*;
use crosstalk_schema::{
    codec, ChannelMeta, ChannelName, ChannelState, Limits, Message, NewMessage, Overlay, Record, Timestamp,
};
use parking_lot::RwLock;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

mod batch;
mod idle;
mod logged;
mod retention;
mod sessions;
mod waits;

use crate::proposals::Folded;
use batch::{InFlight, Pending};
pub use idle::{CloseIfIdle, Closed};
pub(crate) use idle::{Exit, QuietParties};
pub use logged::Apply;
pub use retention::{Install, LoggedTrims, Retention};
pub use sessions::{Describe, EndSession, StartSession};
use waits::Waiter;
pub use waits::{BeginWait, CheckRelease, EndWait, Role, WaitControl};

/// The open channels, by name: the registry writes it, [`crate::Relay`] reads it without a
/// round trip, and an actor that goes idle leaves it.
pub(crate) type Directory = Arc<RwLock<HashMap<ChannelName, ChannelHandle>>>;

/// The channel mailbox's capacity. actix counts it per sender: a sender that finds the mailbox
/// this full still queues its message, and only then waits (`send`) or is refused
/// (`try_send`) for the next one. Every post goes through its own clone of the address (a new
/// sender, `Relay::post`), so posts are never held back or refused by it: what bounds the
/// posts queued is the open requests they will answer, each with a body within the limits.
pub const MAILBOX_CAPACITY: usize = 4096;
/// Longest channel description, in bytes.
pub const MAX_DESCRIPTION: usize = 1024;

/// Settings every channel actor shares.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    pub limits: Limits,
    /// A party not heard from for this long no longer counts in mutual-wait detection.
    pub presence_ttl: Duration,
    /// How long every active party must have been waiting before one is released.
    pub release_grace: Duration,
    pub retention: Retention,
    /// Channels with a retention of their own (`--channel-retention`), instead of `retention`.
    pub per_channel_retention: HashMap<ChannelName, Retention>,
    /// How often retention runs.
    pub retention_every: Duration,
    /// An actor nobody has used for this long, with nothing in flight, stops (`None`: never).
    pub idle_after: Option<Duration>,
    /// Who orders the channel's events, and the other nodes' waits (see [`logged`]).
    pub cluster: Arc<dyn Cluster>,
}

/// Post a message. The actor does not answer the message itself: it tells `reply` once the
/// post is durable and visible, straight from the store thread, or at once when it refuses it.
/// Send it with `do_send`, so that nothing crosses back to the sender's thread before the
/// verdict (`send` would answer at once with a unit, one more thread wake per post).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Post {
    pub message: NewMessage,
    pub reply: PostReply,
}

/// Where a post's verdict goes.
pub type PostReply = oneshot::Sender<Result<Landed, RelayError>>;

/// What a post's reply says once the channel has the post: [`posted`](Self::posted) gives the
/// message.
pub struct Landed(Land);

enum Land {
    /// Durable and visible.
    New(Option<Arc<Posted>>),
    /// An idempotent retry of message `id`, durable: the original, read back from the view.
    Retry(u64, Arc<ChannelView>),
    /// Proposed to the shared log: what the fold decides.
    Logged(
        oneshot::Receiver<Result<crate::proposals::Outcome, RelayError>>,
        Arc<ChannelView>,
    ),
}

impl Landed {
    /// The message; the store's error if it was refused.
    pub async fn posted(self) -> Result<Arc<Posted>, RelayError> {
        match self.0 {
            Land::New(posted) => posted.ok_or(RelayError::Unavailable("not a message")),
            Land::Retry(id, view) => view
                .get(id)?
                .ok_or(RelayError::Unavailable("the original message is no longer stored")),
            Land::Logged(verdict, view) => logged::posted(verdict, view).await,
        }
    }
}

/// Told when an event is durable, or why it never will be.
enum Done {
    /// Whether it is durable.
    Durable(oneshot::Sender<Result<(), RelayError>>),
    /// A poster: what landed, once it is durable.
    Post(PostReply, Landed),
}

impl Done {
    fn send(self, result: Result<(), RelayError>) {
        match self {
            Done::Durable(tx) => {
                let _ = tx.send(result);
            }
            Done::Post(reply, landed) => {
                let _ = reply.send(result.map(|()| landed));
            }
        }
    }
}

pub struct ChannelActor {
    view: Arc<ChannelView>,
    /// The registry's directory, which the actor leaves when it goes idle, and where it
    /// leaves its parties.
    exit: Exit,
    store: Arc<dyn EventStore>,
    committer: Committer,
    ids: Arc<IdAllocator>,
    /// Shared by every channel actor: one copy, not one per open channel.
    config: Arc<ChannelConfig>,
    /// This channel's retention: the relay's, or its own `--channel-retention`.
    retention: Retention,
    /// Summary including pending events.
    meta: ChannelMeta,
    /// Channel state including pending events.
    state: ChannelState,
    /// Overlays including pending events.
    overlays: HashMap<u64, Overlay>,
    /// What the next batch writes besides its events.
    next_overlays: BTreeSet<u64>,
    next_replies: Vec<(u64, u64)>,
    next_state_dirty: bool,
    /// Events accepted but not yet in a batch.
    pending: Vec<Pending>,
    /// The batch between append and durable. At most one, so batches commit in order.
    in_flight: Option<InFlight>,
    /// Idempotency keys of events not yet committed.
    idem_uncommitted: HashMap<String, u64>,
    waiters: HashMap<String, Waiter>,
    /// Active parties: who posted or waited actively, and when. Left in the exit's
    /// [`QuietParties`] when the actor closes, and taken back from it when the channel reopens.
    parties: HashMap<String, Instant>,
    next_generation: u64,
    /// Commits so far; a release timer only fires if nobody spoke since it was set.
    spoken: u64,
    release_timer: Option<SpawnHandle>,
    /// A retention pass is with the store thread.
    compacting: bool,
    /// The channel's log as the store keeps it: who orders its events, and how retention
    /// takes effect.
    log: Box<dyn ChannelLog>,
}

impl ChannelActor {
    pub(crate) fn new(
        view: Arc<ChannelView>,
        exit: Exit,
        store: Arc<dyn EventStore>,
        committer: Committer,
        ids: Arc<IdAllocator>,
        config: Arc<ChannelConfig>,
        overlays: HashMap<u64, Overlay>,
    ) -> Self {
        let retention = config
            .per_channel_retention
            .get(view.name())
            .copied()
            .unwrap_or(config.retention);
        let log = config.cluster.channel_log(view.name());
        let parties = exit.parties.take(view.name());
        ChannelActor {
            meta: view.meta(),
            state: view.channel_state(),
            view,
            exit,
            store,
            committer,
            ids,
            config,
            retention,
            overlays,
            next_overlays: BTreeSet::new(),
            next_replies: Vec::new(),
            next_state_dirty: false,
            pending: Vec::new(),
            in_flight: None,
            idem_uncommitted: HashMap::new(),
            waiters: HashMap::new(),
            parties,
            next_generation: 0,
            spoken: 0,
            release_timer: None,
            compacting: false,
            log,
        }
    }

    /// Folds `record`, checked, into the working state under `id` and queues it. Returns the
    /// id and, for a message, what readers will see.
    fn accept_at(&mut self, id: u64, record: Record, idem: Option<String>) -> (u64, Option<Arc<Posted>>) {
        let session_was_active = self.state.active_session().is_some();
        // With the session end the fold derives (every node of a cluster alike: it takes no
        // id of its own).
        let effects = self.state.replay(id, &record);
        let mut posted = None;
        match &record {
            Record::Message(m) => {
                self.meta.count += 1;
                if let Some(parent) = m.reply_to {
                    self.overlays.entry(parent).or_default().reply_count += 1;
                    self.next_overlays.insert(parent);
                    self.next_replies.push((parent, id));
                }
                if let Some(q) = effects.answered {
                    self.overlays.entry(q).or_default().answered_by = Some(id);
                    self.next_overlays.insert(q);
                }
                if effects.answered.is_some() || session_was_active || m.kind.asks() {
                    self.next_state_dirty = true;
                }
                posted = Some(Arc::new(Posted::new(Message::new(id, self.view.name(), m.clone()))));
            }
            _ => self.next_state_dirty = true,
        }
        // The event's own time, not this node's clock: every node of a cluster folds the same.
        let now = record.at();
        self.meta.last_id = id;
        if let Record::Message(m) = &record {
            // The summary's last message and its time are the message's own.
            self.meta.last_message_id = id;
            self.meta.last_at = Some(m.created_at);
        }
        self.meta.created_at.get_or_insert(now);
        if let Some(k) = &idem {
            self.idem_uncommitted.insert(k.clone(), id);
        }
        self.pending.push(Pending {
            id,
            logged: true,
            encoded: codec::encode(&record),
            posted: posted.clone(),
            idem,
            done: Vec::new(),
        });
        if effects.session_ended.is_some() {
            self.next_state_dirty = true;
        }
        (id, posted)
    }

    /// Folds a lone relay's change to the channel's state alone (a description, a session
    /// start or end): it takes no id and is no event of the log; the state written with the
    /// next batch keeps it ([`ChannelActor::when_noted`]).
    fn note(&mut self, record: Record) {
        self.state.replay(self.meta.last_id, &record);
        self.meta.created_at.get_or_insert(record.at());
        self.next_state_dirty = true;
        self.pending.push(Pending {
            id: 0,
            logged: false,
            encoded: Vec::new(),
            posted: None,
            idem: None,
            done: Vec::new(),
        });
    }

    /// Refuses a write at once while the store is not answering, rather than queueing it.
    fn writable(&self) -> Result<(), RelayError> {
        self.config.cluster.health().map_err(RelayError::StoreUnavailable)?;
        self.committer.health().writable().map_err(RelayError::StoreUnavailable)
    }

    fn reply_to_exists(&self, parent: u64) -> Result<bool, RelayError> {
        // Not yet committed: it exists if it is a message (not a session or description event).
        if let Some(p) = self.uncommitted().find(|p| p.logged && p.id == parent) {
            return Ok(p.posted.is_some());
        }
        Ok(self.view.get(parent)?.is_some())
    }

    /// The id an idempotency key already has on this channel, committed or not. An original
    /// behind the shared log's retention cut is forgotten alike on every node, whether or not
    /// this copy still holds it: a retry that late is a new post.
    fn idempotent(&self, key: &str) -> Result<Option<u64>, RelayError> {
        let original = match self.idem_uncommitted.get(key) {
            Some(id) => Some(*id),
            None => self.store.idempotent(self.view.name(), key)?,
        };
        Ok(original.filter(|&id| id > self.trimmed_through()))
    }
}

impl Actor for ChannelActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
        let r = self.retention;
        // On a shared log, a cut another node logged is applied here whatever this node's
        // own policy: the log says whether passes run without one.
        if r.max_age.is_some() || r.max_count.is_some() || self.log.trims_without_policy() {
            self.compact(ctx);
            ctx.run_interval(self.config.retention_every, |act, ctx| {
                // Compaction writes only committed history, never what is in flight.
                act.compact(ctx)
            });
        }
    }
}

impl Handler<Post> for ChannelActor {
    type Result = ();

    fn handle(&mut self, Post { message, reply }: Post, ctx: &mut Context<Self>) {
        match self.accept_post(message, ctx) {
            Ok(Accepted::Once(id, landed)) => {
                // Registered before the commit starts, so a write that fails at once is
                // reported as failed, never as durable.
                self.on_durable(id, Done::Post(reply, landed));
                self.start_commit(ctx);
            }
            Ok(Accepted::Now(landed)) => {
                let _ = reply.send(Ok(landed));
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }
}

/// When a poster gets what [`ChannelActor::accept_post`] took in.
enum Accepted {
    /// Once event `id` is durable.
    Once(u64, Landed),
    /// At once (the shared log's fold will decide).
    Now(Landed),
}

impl ChannelActor {
    /// Takes a post into the channel: what the poster gets, and when.
    fn accept_post(&mut self, post: NewMessage, ctx: &mut Context<Self>) -> Result<Accepted, RelayError> {
        self.writable()?;
        let limits = self.config.limits;
        let idem = post.idempotency_key(&limits)?;
        if let Some(k) = &idem {
            if let Some(existing) = self.idempotent(k)? {
                // An idempotent retry: answer with the original once it is durable.
                return Ok(Accepted::Once(
                    existing,
                    Landed(Land::Retry(existing, self.view.clone())),
                ));
            }
        }
        let record = Record::Message(post.into_record(&limits, Timestamp::now())?);
        Ok(match self.submit(record, idem, ctx) {
            Submitted::Folded(Folded::Stored(id, posted)) => Accepted::Once(id, Landed(Land::New(posted))),
            Submitted::Folded(Folded::Duplicate(id)) => Accepted::Once(id, Landed(Land::Retry(id, self.view.clone()))),
            Submitted::Folded(Folded::Rejected(e)) => return Err(e),
            Submitted::Folded(Folded::Unchanged | Folded::Noted) => {
                return Err(RelayError::Unavailable("not a message"))
            }
            Submitted::Proposed(verdict) => Accepted::Now(Landed(Land::Logged(verdict, self.view.clone()))),
        })
    }

    /// Puts a new event in order ([`ChannelLog::sequence`]) and folds it: at once under this
    /// node's next id, or, on a shared log, when the log brings it back ([`Apply`]).
    fn submit(&mut self, record: Record, idem: Option<String>, ctx: &mut Context<Self>) -> Submitted {
        match self.log.sequence(&record, idem.as_deref()) {
            Sequenced::Here => Submitted::Folded(self.fold(None, record, idem)),
            Sequenced::Log(append) => Submitted::Proposed(self.propose(append, ctx)),
        }
    }
}

/// Where a new event is once [`ChannelActor::submit`] returns.
enum Submitted {
    /// Folded here: what the fold made of it (durable once its batch is).
    Folded(Folded),
    /// Proposed to the shared log: the fold's verdict comes later.
    Proposed(oneshot::Receiver<Result<crate::proposals::Outcome, RelayError>>),
}

/// What a face holds to use a channel: its actor for writes, its view for reads.
#[derive(Clone)]
pub struct ChannelHandle {
    pub addr: Addr<ChannelActor>,
    pub view: Arc<ChannelView>,
}
