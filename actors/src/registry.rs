//! The registry: the directory of channels and of instances (agents and humans).
//!
//! It starts a channel's actor on first use and is the only writer of the channel directory;
//! faces look channels up through [`crate::Relay`], which reads the directory without a round
//! trip once a channel is open. It also owns identities: registration, the binding of an
//! identity to the session that registered it, heartbeats, and per-identity read cursors.

use crate::channel::{ChannelActor, ChannelConfig, ChannelHandle, CloseIfIdle, Closed, Directory, Exit, QuietParties};
use crate::cluster::{CursorChange, Registration};
use crate::commit::Committer;
use crate::error::RelayError;
use crate::identities::{Identities, Identity, InstanceView};
use crate::ids::IdAllocator;
use crate::search::Backlog;
use crate::store::{EventStore, Space};
use crate::view::ChannelView;
use crate::ShrinkAfterBurst;
use actix::prelude::*;
use crosstalk_schema::{codec, ChannelName, Instance, InstanceKind, Timestamp};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod readers;
pub use readers::ChannelCursors;

/// Longest instance description, in bytes.
pub const MAX_INSTANCE_DESCRIPTION: usize = 1024;

/// How the registry opens channels.
pub(crate) struct ChannelsConfig {
    /// What every channel actor starts with.
    pub channel: ChannelConfig,
    /// Most channels the relay holds.
    pub max_channels: usize,
    /// Most channels one [`Opener`] may bring into being.
    pub max_channels_per_opener: usize,
    /// Above this many open channel actors, the longest-unused close before their quiet period
    /// is over (see [`Registry::sweep`]).
    pub max_open_channels: usize,
    /// Where a channel closed with messages the search index may not have yet goes.
    pub unindexed: Backlog,
}

/// Open a channel, starting its actor if it is not running yet.
#[derive(Message)]
#[rtype(result = "Result<ChannelHandle, RelayError>")]
pub struct OpenChannel {
    pub name: ChannelName,
    /// To fold a cluster's log into: created even beyond `--max-channels`, which the node
    /// that took the write enforced (every node holds every channel of the log).
    pub to_fold: bool,
    /// Who is opening it, if their channels are counted ([`crate::relay::Relay::opening_as`]).
    pub opener: Option<Opener>,
}

/// Whose channels are counted against `--max-channels-per-participant`: an opaque key (a
/// token of one client's, in the operations' terms), which this crate only compares.
pub type Opener = Arc<str>;

/// Register (or re-register) an instance. `session` is the caller's session (the MCP
/// session id, or a REST session token); `None` asks for a new token.
#[derive(Message)]
#[rtype(result = "Result<Registered, RelayError>")]
pub struct RegisterInstance {
    pub instance_id: String,
    pub description: Option<String>,
    pub kind: InstanceKind,
    pub session: Option<String>,
    /// A prefix of session names (one principal's, which has proved it is the same client:
    /// the same participant token, the same OAuth grant): a live binding to a session that
    /// starts with it is taken over at once, as a restarted host's new session takes its
    /// name back from the one it left behind.
    pub take_over: Option<String>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Registered {
    #[serde(flatten)]
    pub instance: InstanceView,
    /// The session the identity is bound to: present it (`X-Crosstalk-Session`) to act as it.
    pub session: String,
}

/// Moves an identity's read cursor on a channel forward (never back).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AdvanceCursor {
    pub instance_id: String,
    pub channel: ChannelName,
    pub id: u64,
}

/// An identity's read cursors: channel → last id read.
#[derive(Message)]
#[rtype(result = "Vec<(ChannelName, u64)>")]
pub struct Cursors(pub String);

pub struct Registry {
    pub(crate) directory: Directory,
    pub(crate) store: Arc<dyn EventStore>,
    pub(crate) committer: Committer,
    pub(crate) ids: Arc<IdAllocator>,
    /// One copy for every channel actor.
    pub(crate) channel_config: Arc<ChannelConfig>,
    identities: Arc<Identities>,
    cursors: HashMap<String, HashMap<ChannelName, u64>>,
    /// Channels the relay holds (stored, or opened since the start), against `max_channels`.
    channels: usize,
    /// Most channels the relay may hold.
    max_channels: usize,
    /// Channels each opener brought into being (stored, or opened since the start), against
    /// `max_channels_per_opener`: counted like `channels`, from this start on.
    by_opener: HashMap<Opener, usize>,
    /// Who brought each channel still open and never written into being: when it closes
    /// unwritten, it no longer counts against them.
    unwritten: HashMap<ChannelName, Opener>,
    max_channels_per_opener: usize,
    unindexed: Backlog,
    /// Channels the sweep found quiet, waiting to be asked to close, each with how long it
    /// must have been unused to close.
    closing: std::collections::VecDeque<(ChannelName, Addr<ChannelActor>, Duration)>,
    /// Open channel actors above which the longest-unused close early.
    max_open: usize,
    /// When the last sweep looked.
    swept: Instant,
    /// The parties of closed channels that still count in mutual-wait detection.
    quiet_parties: Arc<QuietParties>,
}

impl Registry {
    pub(crate) fn new(
        directory: Directory,
        store: Arc<dyn EventStore>,
        committer: Committer,
        ids: Arc<IdAllocator>,
        channels_config: ChannelsConfig,
        identities: Arc<Identities>,
    ) -> Result<Self, RelayError> {
        let ChannelsConfig {
            channel: channel_config,
            max_channels,
            max_channels_per_opener,
            max_open_channels,
            unindexed,
        } = channels_config;
        let channels = store.channels()?.len();
        for (_, bytes) in store.scan_aux(Space::Instances, b"", usize::MAX)? {
            match codec::decode::<Instance>(&bytes) {
                Ok(instance) => {
                    identities.insert(Identity::new(instance, None, None));
                }
                Err(e) => tracing::error!(error = %e, "skipping a damaged instance record"),
            }
        }
        let mut cursors: HashMap<String, HashMap<ChannelName, u64>> = HashMap::new();
        for (key, value) in store.scan_aux(Space::Cursors, b"", usize::MAX)? {
            let mut parts = key.splitn(2, |b| *b == 0);
            let (Some(who), Some(ch)) = (parts.next(), parts.next()) else {
                continue;
            };
            let (Ok(who), Some(ch), Ok(id)) = (
                String::from_utf8(who.to_vec()),
                std::str::from_utf8(ch).ok().and_then(|c| ChannelName::parse(c).ok()),
                crosstalk_schema::Position::decode(&value).map(|p| p.0),
            ) else {
                continue;
            };
            cursors.entry(who).or_default().insert(ch, id);
        }
        Ok(Registry {
            directory,
            store,
            committer,
            ids,
            channel_config: Arc::new(channel_config),
            identities,
            cursors,
            channels,
            max_channels,
            by_opener: Default::default(),
            unwritten: Default::default(),
            max_channels_per_opener,
            unindexed,
            closing: Default::default(),
            max_open: max_open_channels.max(1),
            swept: Instant::now(),
            quiet_parties: Default::default(),
        })
    }

    /// Queues every channel nobody has touched for the quiet period (unless a sweep is still
    /// working through the last queue), and starts closing them. With more than `max_open`
    /// channels open it also queues the longest-unused of those unused for [`EARLY_QUIET`],
    /// enough to bring the open ones to seven eighths of `max_open`: so a burst of new
    /// channels holds about `max_open` actors, not the burst's rate times the quiet period.
    /// Channels with a wait, a stream or a write in flight stay open whatever their number.
    fn sweep(&mut self, ctx: &mut Context<Self>) {
        let Some(quiet) = self.channel_config.idle_after else {
            return;
        };
        self.quiet_parties.expire(self.channel_config.presence_ttl);
        if !self.closing.is_empty() {
            return;
        }
        self.swept = Instant::now();
        let early = EARLY_QUIET.min(quiet);
        let directory = self.directory.read();
        let open = directory.len();
        let excess = if open > self.max_open {
            open - (self.max_open - self.max_open / 8)
        } else {
            0
        };
        let mut sooner = Vec::new();
        for h in directory.values() {
            let idle = h.view.idle_for();
            if idle >= quiet {
                self.closing.push_back((h.view.name().clone(), h.addr.clone(), quiet));
            } else if excess > 0 && idle >= early {
                sooner.push((idle, h));
            }
        }
        let room = excess.saturating_sub(self.closing.len());
        if sooner.len() > room {
            sooner.select_nth_unstable_by(room, |a, b| b.0.cmp(&a.0));
            sooner.truncate(room);
        }
        self.closing.extend(
            sooner
                .into_iter()
                .map(|(_, h)| (h.view.name().clone(), h.addr.clone(), early)),
        );
        drop(directory);
        if !self.closing.is_empty() {
            ctx.run_later(CLOSE_EVERY, Self::close_some);
        }
    }

    /// Asks the next few queued channels to close if they are idle: paced, so closing tens of
    /// thousands of channels never holds up the live ones sharing their thread.
    fn close_some(&mut self, ctx: &mut Context<Self>) {
        let n = self.closing.len().min(CLOSE_BATCH);
        let batch: Vec<_> = self.closing.drain(..n).collect();
        for (name, addr, quiet) in batch {
            let close = addr.send(CloseIfIdle { quiet });
            ctx.spawn(close.into_actor(self).map(move |closed, act, _| {
                match closed {
                    // Opened but never written: it no longer counts against the limits.
                    Ok(Closed::Stopped { written: false }) => {
                        act.channels = act.channels.saturating_sub(1);
                        if let Some(opener) = act.unwritten.remove(&name) {
                            act.uncount(&opener);
                        }
                    }
                    Ok(Closed::Stopped { written: true }) => {
                        act.unwritten.remove(&name);
                        act.unindexed.lock().insert(name);
                    }
                    Ok(Closed::Busy) | Err(_) => {}
                }
            }));
        }
        if self.closing.is_empty() {
            self.directory.write().shrink_after_burst();
            self.closing.shrink_to_fit();
            self.unwritten.shrink_after_burst();
            self.by_opener.shrink_after_burst();
        } else {
            ctx.run_later(CLOSE_EVERY, Self::close_some);
        }
    }
}

impl Registry {
    /// One channel fewer brought into being by `opener`.
    fn uncount(&mut self, opener: &Opener) {
        if let Some(n) = self.by_opener.get_mut(opener) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_opener.remove(opener);
            }
        }
    }
}

/// Floor of the idle sweep's period, so a tiny quiet period does not spin; also the least time
/// between sweeps that opening a channel beyond `max_open` starts.
const MIN_SWEEP_EVERY: Duration = Duration::from_millis(100);
/// How long a channel must have gone unused to close early, when more than `max_open` are
/// open (or the quiet period, if shorter): a channel in use now is never the one closed, and
/// one reopened later costs a read of its summary from the store.
const EARLY_QUIET: Duration = Duration::from_secs(1);
/// Channels asked to close per [`CLOSE_EVERY`], only while some are queued: each burst is a
/// fraction of a millisecond of the actors' thread (larger bursts made a live channel's post
/// wait behind them), at nearly the rate of larger ones, so closing still keeps up with a
/// flood of new channels and the peak does not grow (docs/benchmarks.md, "Measurements behind
/// design choices").
const CLOSE_BATCH: usize = 48;
const CLOSE_EVERY: Duration = Duration::from_millis(2);

impl Actor for Registry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(4096);
        if let Some(quiet) = self.channel_config.idle_after {
            // A channel closes between one and one and a quarter quiet periods after its last
            // use (later when thousands close at once: they are paced).
            ctx.run_interval((quiet / 4).max(MIN_SWEEP_EVERY), Self::sweep);
        }
    }
}

impl Handler<OpenChannel> for Registry {
    type Result = Result<ChannelHandle, RelayError>;

    fn handle(&mut self, msg: OpenChannel, ctx: &mut Context<Self>) -> Self::Result {
        let OpenChannel { name, to_fold, opener } = msg;
        if let Some(handle) = self.directory.read().get(&name) {
            return Ok(handle.clone());
        }
        let stored = self.store.meta(&name)?;
        let new = stored.is_none();
        // A channel that does not exist yet: within the relay's limit and its opener's, or
        // refused. Counted once it is open (a store that fails to open it counts nothing).
        if new && !to_fold && self.channels >= self.max_channels {
            return Err(RelayError::LimitReached(format!(
                "this relay holds its maximum of {} channels (--max-channels); use an existing one",
                self.max_channels
            )));
        }
        let opener = match opener.filter(|_| new && !to_fold) {
            Some(o)
                if self
                    .by_opener
                    .get(&o)
                    .is_some_and(|n| *n >= self.max_channels_per_opener) =>
            {
                return Err(RelayError::LimitReached(format!(
                    "this token has made {} channels, the most one token may \
                     (--max-channels-per-participant); use an existing one",
                    self.max_channels_per_opener
                )));
            }
            o => o,
        };
        let meta = stored.unwrap_or_default();
        let state = self.store.state(&name)?;
        let overlays: HashMap<_, _> = self.store.overlays(&name)?.into_iter().collect();
        let view = Arc::new(ChannelView::new(
            name.clone(),
            meta,
            state,
            overlays.clone(),
            self.store.clone(),
        ));
        // What depends on the newest message (a pending `done`) must survive a reopen.
        view.seed_newest()?;
        let addr = ChannelActor::new(
            view.clone(),
            Exit {
                directory: self.directory.clone(),
                parties: self.quiet_parties.clone(),
            },
            self.store.clone(),
            self.committer.clone(),
            self.ids.clone(),
            self.channel_config.clone(),
            overlays,
        )
        .start();
        let handle = ChannelHandle { addr, view };
        if new {
            self.channels += 1;
        }
        if let Some(o) = opener {
            *self.by_opener.entry(o.clone()).or_insert(0) += 1;
            self.unwritten.insert(name.clone(), o);
        }
        let open = {
            let mut directory = self.directory.write();
            directory.insert(name.clone(), handle.clone());
            directory.len()
        };
        // Beyond the bound on open actors: the longest-unused close early, without waiting for
        // the sweep's next turn (a burst of new channels opens thousands a second).
        if open > self.max_open && self.closing.is_empty() && self.swept.elapsed() >= MIN_SWEEP_EVERY {
            self.sweep(ctx);
        }
        tracing::debug!(channel = %name, last_id = meta.last_id, "channel opened");
        Ok(handle)
    }
}

impl Handler<RegisterInstance> for Registry {
    type Result = ResponseFuture<Result<Registered, RelayError>>;

    fn handle(&mut self, msg: RegisterInstance, _: &mut Context<Self>) -> Self::Result {
        let result = (|| {
            let id = crosstalk_schema::identity::instance_id(&msg.instance_id)?;
            if let Some(d) = &msg.description {
                if d.len() > MAX_INSTANCE_DESCRIPTION {
                    return Err(RelayError::Invalid(crosstalk_schema::InvalidInput::TooLong {
                        field: "description",
                        len: d.len(),
                        max: MAX_INSTANCE_DESCRIPTION,
                    }));
                }
            }
            if self
                .identities
                .live_elsewhere(&id, msg.session.as_deref(), msg.take_over.as_deref())
            {
                return Err(RelayError::Conflict(format!(
                    "instance id {id:?} is in use by another live session; pick another id, or wait until it has \
                     been silent for {} s",
                    self.identities.ttl().as_secs()
                )));
            }
            let session = msg
                .session
                .clone()
                .unwrap_or_else(|| format!("ct-{}", uuid::Uuid::new_v4().simple()));
            let now = Timestamp::now();
            let registered_at = self.identities.get(&id).map_or(now, |l| l.instance.registered_at);
            let instance = Instance {
                instance_id: id.clone(),
                description: msg.description.clone().filter(|d| !d.trim().is_empty()),
                kind: msg.kind,
                registered_at,
            };
            let record = codec::encode(&instance);
            // On a cluster, the binding must also win the cluster's compare-and-set.
            let registration = Registration {
                instance: instance.clone(),
                session: Some(session.clone()),
                seen: now.0,
            };
            let claim = self.channel_config.cluster.claim_registration(
                registration,
                self.identities.ttl(),
                msg.take_over.clone(),
            );
            let identity = Identity::new(instance, Some(session.clone()), Some(now));
            let view = self.identities.view(&identity);
            // Bound at once, so a second registration racing this one sees it; taken back if
            // the write does not become durable.
            let before = self.identities.insert(identity);
            let key = id.as_bytes().to_vec();
            let ticket = self.committer.write(Box::new(move |store: &dyn EventStore| {
                store.write_aux(Space::Instances, &[(key, Some(record))])
            }));
            Ok((
                Registered {
                    instance: view,
                    session,
                },
                id,
                before,
                ticket,
                claim,
            ))
        })();
        let identities = self.identities.clone();
        Box::pin(async move {
            let (mut registered, id, before, ticket, claim) = result?;
            match claim.await {
                Ok(stored) => {
                    registered.instance.registered_at = stored.instance.registered_at.to_rfc3339();
                }
                Err(e) => {
                    identities.restore(&id, before);
                    return Err(e);
                }
            }
            match ticket.durable().await {
                Ok(()) => Ok(registered),
                Err(e) => {
                    identities.restore(&id, before);
                    Err(e.into())
                }
            }
        })
    }
}

impl Handler<AdvanceCursor> for Registry {
    type Result = ();

    fn handle(&mut self, msg: AdvanceCursor, _: &mut Context<Self>) {
        let mine = self.cursors.entry(msg.instance_id.clone()).or_default();
        // A cursor that is there already and as far: nothing to write. (A post by a
        // registered sender asks for its cursor at 0 every time: only its first joins.)
        if mine.get(&msg.channel).is_some_and(|at| msg.id <= *at) {
            return;
        }
        let cursor = mine.entry(msg.channel.clone()).or_insert(0);
        *cursor = msg.id.max(*cursor);
        let writes = vec![(
            cursor_key(&msg.instance_id, &msg.channel),
            Some(crosstalk_schema::Position(*cursor).encode()),
        )];
        // Best effort: a read that moved a cursor has already answered. A failed write
        // only means the cursor is back where it was after a restart (re-delivery, not loss).
        let ticket = self.committer.write(Box::new(move |store: &dyn EventStore| {
            store.write_aux(Space::Cursors, &writes)
        }));
        let shared = self
            .channel_config
            .cluster
            .advance_cursor(&msg.instance_id, &msg.channel, *cursor);
        actix::spawn(async move {
            if let Err(e) = shared.await {
                crate::throttled!(warn, error = %e, "sharing a cursor failed");
            }
            if let Err(e) = ticket.durable().await {
                crate::throttled!(warn, error = %e, "cursor write failed");
            }
        });
    }
}

/// A cursor as another node of the cluster moved it (`id: None`: removed).
#[derive(Message)]
#[rtype(result = "()")]
pub struct MergeCursor(pub CursorChange);

impl Handler<MergeCursor> for Registry {
    type Result = ();

    fn handle(&mut self, MergeCursor(change): MergeCursor, _: &mut Context<Self>) {
        match change.id {
            Some(id) => {
                let at = self
                    .cursors
                    .entry(change.who)
                    .or_default()
                    .entry(change.channel)
                    .or_insert(0);
                *at = (*at).max(id);
            }
            None => {
                if let Some(mine) = self.cursors.get_mut(&change.who) {
                    mine.remove(&change.channel);
                }
            }
        }
    }
}

fn cursor_key(who: &str, channel: &ChannelName) -> Vec<u8> {
    let mut key = who.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(channel.as_str().as_bytes());
    key
}

/// Moves an identity's cursors (the inbox): answers once the moves are durable; if they are
/// not, the cursors go back, so what the inbox did not hand out is handed out next time.
#[derive(Message)]
#[rtype(result = "Result<(), RelayError>")]
pub struct MoveCursors {
    pub instance_id: String,
    pub moves: Vec<(ChannelName, u64)>,
}

impl Handler<MoveCursors> for Registry {
    type Result = ResponseActFuture<Self, Result<(), RelayError>>;

    fn handle(&mut self, msg: MoveCursors, _: &mut Context<Self>) -> Self::Result {
        let mine = self.cursors.entry(msg.instance_id.clone()).or_default();
        let mut before = Vec::new();
        let mut writes = Vec::new();
        for (channel, id) in msg.moves {
            let at = mine.entry(channel.clone()).or_insert(0);
            if id > *at || *at == 0 {
                before.push((channel.clone(), *at));
                *at = id.max(*at);
                writes.push((
                    cursor_key(&msg.instance_id, &channel),
                    Some(crosstalk_schema::Position(*at).encode()),
                ));
            }
        }
        let ticket = self.committer.write(Box::new(move |store: &dyn EventStore| {
            store.write_aux(Space::Cursors, &writes)
        }));
        let who = msg.instance_id;
        // On a cluster, moved only once every node can see it.
        let shared: Vec<_> = before
            .iter()
            .filter_map(|(c, _)| self.cursors.get(&who).and_then(|m| m.get(c)).map(|id| (c, *id)))
            .map(|(channel, id)| self.channel_config.cluster.advance_cursor(&who, channel, id))
            .collect();
        let durable = async move {
            ticket.durable().await?;
            for advance in shared {
                advance.await?;
            }
            Ok::<(), RelayError>(())
        };
        Box::pin(durable.into_actor(self).map(move |result, act, _| {
            if let Err(e) = result {
                if let Some(mine) = act.cursors.get_mut(&who) {
                    for (channel, at) in before {
                        mine.insert(channel, at);
                    }
                }
                return Err(e);
            }
            Ok(())
        }))
    }
}

/// Removes an identity's cursor on a channel (it leaves the channel); answers once durable.
#[derive(Message)]
#[rtype(result = "Result<(), RelayError>")]
pub struct ForgetCursor {
    pub instance_id: String,
    pub channel: ChannelName,
}

impl Handler<ForgetCursor> for Registry {
    type Result = ResponseActFuture<Self, Result<(), RelayError>>;

    fn handle(&mut self, msg: ForgetCursor, _: &mut Context<Self>) -> Self::Result {
        let before = self
            .cursors
            .get_mut(&msg.instance_id)
            .and_then(|mine| mine.remove(&msg.channel));
        let writes = vec![(cursor_key(&msg.instance_id, &msg.channel), None)];
        let ticket = self.committer.write(Box::new(move |store: &dyn EventStore| {
            store.write_aux(Space::Cursors, &writes)
        }));
        let shared = self
            .channel_config
            .cluster
            .forget_cursor(&msg.instance_id, &msg.channel);
        let durable = async move {
            ticket.durable().await?;
            shared.await?;
            Ok::<(), RelayError>(())
        };
        Box::pin(durable.into_actor(self).map(move |result, act, _| {
            if let Err(e) = result {
                if let Some(at) = before {
                    act.cursors.entry(msg.instance_id).or_default().insert(msg.channel, at);
                }
                return Err(e);
            }
            Ok(())
        }))
    }
}

impl Handler<Cursors> for Registry {
    type Result = MessageResult<Cursors>;

    fn handle(&mut self, Cursors(who): Cursors, _: &mut Context<Self>) -> Self::Result {
        let mut list: Vec<(ChannelName, u64)> = self
            .cursors
            .get(&who)
            .map(|m| m.iter().map(|(c, id)| (c.clone(), *id)).collect())
            .unwrap_or_default();
        list.sort();
        MessageResult(list)
    }
}
