//! What `crosstalk wake` asks of the relay for an identity it runs turns for: a lease, so one
//! wake process at a time holds it (`wake_lease`, `wake_release`); the messages that wake it,
//! waited for and not yet handled (`wake_pending`); and the end of each turn, which moves
//! where the identity has handled up to (`wake_turn`). `wake_list` shows every woken
//! identity's state. The state is a record of the relay's ([`WakeState`]), so it holds across
//! restarts of the process and of the relay, and on a cluster across nodes.

use super::{Caller, Ctx, ErrorKind, Limit, OpError, Operation, Recounts};
use crosstalk_actors::records::{is_key, Kind, RecordStore};
use crosstalk_actors::{Posted, RelayError, StoreError};
use crosstalk_schema::wake::{Activity, Turn, WakeLease, WakeState, TURNS_KEPT};
use crosstalk_schema::{codec, ChannelName, InstanceKind, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Longest lease a wake process may ask for; it renews well before.
pub const MAX_LEASE_S: u64 = 300;
/// Identities one client's token may make wake states for. A state is kept for good (it is
/// where the identity has handled up to), and an OAuth connection may act as anyone: without
/// this it could fill the store with states, one request each.
pub const MAX_WOKEN_PER_TOKEN: usize = 256;
/// Messages one `wake_pending` answers at most.
const PENDING_MOST: usize = 200;

fn now_ms() -> i64 {
    Timestamp::now().millis()
}

fn damaged(e: impl std::fmt::Display) -> RelayError {
    RelayError::Store(StoreError::Corrupt(format!("a stored wake state is damaged: {e}")))
}

/// The identity a wake request names, as an instance id is (1–128 bytes, no control
/// characters, trimmed), if the caller may act as it.
fn identity_of(caller: &Caller, raw: &str) -> Result<String, OpError> {
    caller.claim(&crosstalk_schema::identity::instance_id(raw)?)
}

/// The record key of `who`'s wake state. An identity that every store can hold as a key
/// ([`is_key`]) is its own key, as it always was; any other (a space, a letter beyond ASCII,
/// `>`) is `=` and its UTF-8 in hex. A cluster could not hold those as themselves: a wake of
/// "code reviewer" was refused there. No identity kept as itself begins with `=`.
fn key_for(who: &str) -> String {
    if is_key(who) && !who.starts_with('=') {
        return who.to_owned();
    }
    format!("={}", super::hex(who.as_bytes()))
}

/// An identity's wake state in the records store, changed by compare-and-set.
struct Store {
    records: Arc<dyn RecordStore>,
}

impl Store {
    fn new(cx: &Ctx) -> Self {
        Store {
            records: cx.relay.records(),
        }
    }

    /// `who`'s state, its stored bytes, and the key it is kept under.
    async fn read(&self, who: &str) -> Result<(Option<WakeState>, Option<Vec<u8>>, String), RelayError> {
        let key = key_for(who);
        let mut found = self.records.get(Kind::Wake, key.clone()).await?;
        let mut at = key;
        if found.is_none() && at != who {
            // Releases before 2026-12-07 kept every identity as itself, which a lone relay
            // could hold ("code reviewer"): such a state stays where it is.
            if let Some(bytes) = self.records.get(Kind::Wake, who.to_owned()).await? {
                (found, at) = (Some(bytes), who.to_owned());
            }
        }
        match found {
            Some(bytes) => Ok((Some(codec::decode(&bytes).map_err(damaged)?), Some(bytes), at)),
            None => Ok((None, None, at)),
        }
    }

    /// Changes `who`'s state with `change` (which sees it, or `None`), retried while another
    /// writer comes first. `change` answers what to report and the state to write, if any.
    async fn update<T>(
        &self,
        who: &str,
        mut change: impl FnMut(Option<WakeState>, i64) -> Result<(T, Option<WakeState>), OpError>,
    ) -> Result<T, OpError> {
        for _ in 0..16 {
            let (state, bytes, key) = self.read(who).await?;
            let (answer, write) = change(state, now_ms())?;
            let Some(new) = write else {
                return Ok(answer);
            };
            let encoded = codec::encode(&new);
            if self.records.swap(Kind::Wake, key, bytes, Some(encoded)).await? {
                return Ok(answer);
            }
        }
        Err(OpError::new(
            ErrorKind::Unavailable,
            "the wake state kept changing under this request; try again",
        ))
    }
}

/// `state`'s lease, if it is held now.
fn held(state: &WakeState, now: i64) -> Option<&WakeLease> {
    state.lease.as_ref().filter(|l| l.until_ms > now)
}

/// Refuses a request from a holder that does not hold the lease (it lapsed and another took
/// it, or it never had it).
fn check_holder(state: &WakeState, holder: &str, now: i64) -> Result<(), OpError> {
    match held(state, now) {
        Some(l) if l.holder == holder => Ok(()),
        Some(l) => Err(taken(&state.identity, l)),
        None => Err(OpError::new(
            ErrorKind::Conflict,
            format!(
                "this wake process does not hold {}'s lease (it lapsed); take it again",
                state.identity
            ),
        )),
    }
}

fn taken(who: &str, l: &WakeLease) -> OpError {
    OpError::new(
        ErrorKind::Conflict,
        format!(
            "{who} is already woken by another crosstalk wake (pid {} on {}, holding it until {}): \
             only one runs turns for an identity; stop that one, or wait for it",
            l.pid,
            l.host,
            Timestamp::from_millis(l.until_ms).to_rfc3339()
        ),
    )
}

/// A woken identity as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct WakeView {
    pub identity: String,
    /// `listening (wakes on messages)`, `working`, `paused by the loop guard`, … while a wake
    /// process holds the identity; `not woken` when none does.
    pub state: String,
    /// Whether a wake process holds the identity now.
    pub woken: bool,
    /// The process holding it: `pid@host`.
    pub held_by: Option<String>,
    /// Per channel, the newest message id handled (or passed over).
    pub handled: BTreeMap<String, u64>,
    /// Why it is paused, and the question that asks a person, while it is.
    pub paused: Option<Paused>,
    /// The last turns, newest last.
    pub turns: Vec<TurnView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Paused {
    /// The channel it stopped waking for (none: every channel).
    pub channel: Option<String>,
    pub why: String,
    /// The QUESTION that asks a person to resume it.
    pub question: Option<u64>,
    /// Its first line, where the list of woken identities shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TurnView {
    pub started_at: String,
    pub seconds: f64,
    pub channels: Vec<String>,
    pub messages: u32,
    pub outcome: String,
    pub attempt: u32,
}

impl WakeView {
    fn of(state: &WakeState, now: i64) -> WakeView {
        let lease = held(state, now);
        let (text, paused) = match (&state.activity, lease) {
            (_, None) => ("not woken".to_owned(), None),
            (Activity::Listening, _) => ("listening (wakes on messages)".to_owned(), None),
            (Activity::Working { .. }, _) => ("working".to_owned(), None),
            (Activity::Paused { channel, why, question }, _) => (
                format!("paused by {why}"),
                Some(Paused {
                    channel: channel.clone(),
                    why: why.clone(),
                    question: *question,
                    asked: None,
                }),
            ),
        };
        WakeView {
            identity: state.identity.clone(),
            state: text,
            woken: lease.is_some(),
            held_by: lease.map(|l| format!("{}@{}", l.pid, l.host)),
            handled: state.handled.clone(),
            paused,
            turns: state
                .turns
                .iter()
                .map(|t| TurnView {
                    started_at: Timestamp::from_millis(t.started_ms).to_rfc3339(),
                    seconds: (t.ended_ms - t.started_ms).max(0) as f64 / 1000.0,
                    channels: t.channels.clone(),
                    messages: t.messages,
                    outcome: t.outcome.clone(),
                    attempt: t.attempt,
                })
                .collect(),
        }
    }
}

// ---- wake_lease

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct LeaseRequest {
    /// The identity woken.
    pub identity: String,
    /// The wake process's own random id.
    pub holder: String,
    pub host: String,
    pub pid: u32,
    /// Seconds it holds the identity unless renewed (at most 300).
    pub ttl_s: u64,
}

pub struct WakeLeaseOp;

impl Operation for WakeLeaseOp {
    const NAME: &'static str = "wake_lease";
    const DESCRIPTION: &'static str = "Take or renew the lease that lets one crosstalk wake process run an \
        identity's turns; refused while another holds it.";
    const READ_ONLY: bool = false;
    type Request = LeaseRequest;
    type Response = WakeView;

    async fn run(cx: &Ctx, caller: Caller, r: LeaseRequest) -> Result<WakeView, OpError> {
        let who = identity_of(&caller, &r.identity)?;
        if r.ttl_s == 0 || r.ttl_s > MAX_LEASE_S {
            return Err(OpError::invalid(format!("ttl_s must be 1 to {MAX_LEASE_S}")));
        }
        if r.holder.trim().is_empty() {
            return Err(OpError::invalid("holder is required"));
        }
        let store = Store::new(cx);
        let principal = &caller.principal;
        let made_by = principal.is_one_client().then(|| principal.key().to_owned());
        // A token of one client takes its leases under its lock, so that a new state is counted
        // and made in one step: leases side by side are counted one after another, and one for
        // an identity a lease beside it has just made is not one more. (Across a cluster's
        // nodes, each may make one past the limit at the same moment.)
        let _one = match &made_by {
            Some(token) => {
                let one = cx.wake_new.lock(token).await;
                if store.read(&who).await?.0.is_none() {
                    room_for_one_more(&store, &cx.wake_full, token).await?;
                }
                Some(one)
            }
            None => None,
        };
        store
            .update(&who, |state, now| {
                let mut state = match state {
                    Some(state) => state,
                    // Where a new identity starts: every channel's newest message now, so a
                    // first start hands out nothing that was posted before it. Listed only for
                    // a new identity: a renewal (every few seconds per wake process) reads no
                    // channel.
                    None => WakeState {
                        identity: who.clone(),
                        handled: cx
                            .relay
                            .list_channels()?
                            .into_iter()
                            .map(|(name, meta)| (name.to_string(), meta.last_id))
                            .collect(),
                        made_by: made_by.clone(),
                        ..WakeState::default()
                    },
                };
                if let Some(l) = held(&state, now).filter(|l| l.holder != r.holder) {
                    return Err(taken(&who, l));
                }
                let fresh = held(&state, now).is_none();
                state.lease = Some(WakeLease {
                    holder: r.holder.clone(),
                    host: r.host.clone(),
                    pid: r.pid,
                    until_ms: now + (r.ttl_s as i64) * 1000,
                });
                if fresh {
                    // A new holder starts listening; a pause stands until a person lifts it.
                    if matches!(state.activity, Activity::Working { .. }) {
                        state.activity = Activity::Listening;
                    }
                }
                Ok((WakeView::of(&state, now), Some(state)))
            })
            .await
    }
}

/// Refuses a new wake state for `token` once it made [`MAX_WOKEN_PER_TOKEN`], counted from
/// the states stored (on a cluster, every node's), so the count holds across restarts. A
/// token found at the limit is refused without a listing for a while (`full`): each count
/// lists every state.
async fn room_for_one_more(store: &Store, full: &Recounts, token: &str) -> Result<(), OpError> {
    let refused = || {
        OpError::new(
            ErrorKind::LimitReached,
            format!(
                "this token has woken {MAX_WOKEN_PER_TOKEN} identities, the most one token may; \
                 wake one of those, or ask the relay's admin for another token"
            ),
        )
    };
    if full.recent(token) {
        return Err(refused());
    }
    // A damaged state counts for nobody: it must not stop every token from waking.
    let made = super::readable::<WakeState>(store.records.list(Kind::Wake).await?)
        .iter()
        .filter(|s| s.made_by.as_deref() == Some(token))
        .count();
    if made >= MAX_WOKEN_PER_TOKEN {
        full.counted(token);
        return Err(refused());
    }
    Ok(())
}

// ---- wake_release

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct HolderRequest {
    pub identity: String,
    pub holder: String,
}

pub struct WakeRelease;

impl Operation for WakeRelease {
    const NAME: &'static str = "wake_release";
    const DESCRIPTION: &'static str = "Give up the wake lease of an identity (crosstalk wake does as it stops).";
    const READ_ONLY: bool = false;
    type Request = HolderRequest;
    type Response = WakeView;

    async fn run(cx: &Ctx, caller: Caller, r: HolderRequest) -> Result<WakeView, OpError> {
        let who = identity_of(&caller, &r.identity)?;
        Store::new(cx)
            .update(&who, |state, now| {
                let Some(mut state) = state else {
                    return Err(OpError::not_found(format!("{who} was never woken")));
                };
                match &state.lease {
                    Some(l) if l.holder == r.holder => {}
                    _ => return Ok((WakeView::of(&state, now), None)),
                }
                state.lease = None;
                if matches!(state.activity, Activity::Working { .. }) {
                    state.activity = Activity::Listening;
                }
                Ok((WakeView::of(&state, now), Some(state)))
            })
            .await
    }
}

// ---- wake_pending

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct PendingRequest {
    pub identity: String,
    pub holder: String,
    /// Channels any message of which (from someone else) wakes the identity,
    /// comma-separated.
    pub listen: Option<String>,
    /// Channels whose waking a person must resume (the loop guard stopped them),
    /// comma-separated; `*`: every channel (the hourly budget). Their messages stay unhandled
    /// here, on the relay, until a person writes there: then they come with the person's.
    pub paused: Option<String>,
    /// Seconds to wait for one (default 30).
    #[schemars(range(min = 0))]
    pub timeout_s: Option<f64>,
    pub limit: Option<Limit>,
}

/// A message that wakes the identity, and whether a person wrote it.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Waking")]
pub struct Waking<M = Arc<Posted>> {
    pub message: M,
    /// Its sender is registered as a human.
    pub human: bool,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Pending")]
pub struct Pending<M = Arc<Posted>> {
    /// The messages that wake the identity, by channel, then id.
    pub messages: Vec<Waking<M>>,
    /// Per channel, how far this answer looked: the turn that handles `messages` marks the
    /// channels handled up to here.
    pub scanned: BTreeMap<String, u64>,
}

/// The channels a person must resume.
enum PausedSet {
    Some(BTreeSet<ChannelName>),
    Every,
}

impl PausedSet {
    fn parse(text: Option<&str>) -> Result<PausedSet, OpError> {
        match text.map(str::trim) {
            Some("*") => Ok(PausedSet::Every),
            other => Ok(PausedSet::Some(channel_list(other)?)),
        }
    }

    fn has(&self, channel: &ChannelName) -> bool {
        match self {
            PausedSet::Some(set) => set.contains(channel),
            PausedSet::Every => true,
        }
    }
}

/// A comma-separated list of channel names.
fn channel_list(text: Option<&str>) -> Result<BTreeSet<ChannelName>, OpError> {
    Ok(text
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(ChannelName::parse)
        .collect::<Result<_, _>>()?)
}

/// How often a waiting `wake_pending` looks at the channels even without a commit of this
/// relay's (what reaches a cluster node by another path), and checks its lease.
const LOOK_ANYWAY: Duration = Duration::from_secs(1);
/// Least time between two looks, however fast commits come: many commits are one look.
const LOOK_SPACING: Duration = Duration::from_millis(5);

pub struct WakePending;

impl Operation for WakePending {
    const NAME: &'static str = "wake_pending";
    const DESCRIPTION: &'static str = "Wait for the messages that wake an identity (addressed to it on any \
        channel, or on a listened channel), after what its turns handled; moves nothing.";
    const READ_ONLY: bool = true;
    const WAITS: bool = true;
    const CONFLICTS: bool = true;
    type Request = PendingRequest;
    type Response = Pending;

    async fn run(cx: &Ctx, caller: Caller, r: PendingRequest) -> Result<Pending, OpError> {
        let who = identity_of(&caller, &r.identity)?;
        let listen = channel_list(r.listen.as_deref())?;
        let paused = PausedSet::parse(r.paused.as_deref())?;
        let most = Limit::or(r.limit, PENDING_MOST).min(PENDING_MOST);
        let wait = caller.timeout(r.timeout_s, Duration::from_secs(30))?;
        // Counted against the caller's --max-waits-per-principal like every other wait.
        let _held = cx.hold(&caller.principal)?;
        let deadline = tokio::time::Instant::now() + wait;
        let store = Store::new(cx);
        // Subscribed before the first look, so a commit between a look and the wait wakes it.
        let mut commits = cx.relay.commits();
        let mut look = Look::default();
        let mut checked: Option<(tokio::time::Instant, BTreeMap<String, u64>)> = None;
        loop {
            let now = tokio::time::Instant::now();
            // The lease, and how far the turns handled, once a LOOK_ANYWAY.
            let handled = match &checked {
                Some((at, handled)) if now.duration_since(*at) < LOOK_ANYWAY => handled.clone(),
                _ => {
                    let (state, _, _) = store.read(&who).await?;
                    let Some(state) = state else {
                        return Err(OpError::not_found(format!("{who} is not woken: take its lease first")));
                    };
                    check_holder(&state, &r.holder, now_ms())?;
                    checked = Some((now, state.handled.clone()));
                    state.handled
                }
            };
            let found = scan(cx, &who, &handled, &mut look, &listen, &paused, most).await?;
            if !found.messages.is_empty() {
                return Ok(found);
            }
            let waited = tokio::select! {
                changed = commits.changed() => changed.is_ok(),
                () = tokio::time::sleep(LOOK_ANYWAY) => true,
                () = tokio::time::sleep_until(deadline) => false,
            };
            if !waited {
                // Nothing woke it in what was looked at: that is handled, so the next wait
                // starts after it (a paused channel's messages stay before it).
                let scanned = found.scanned;
                if scanned.iter().any(|(c, id)| handled.get(c) < Some(id)) {
                    store
                        .update(&who, |state, now| {
                            let Some(mut state) = state else { return Ok(((), None)) };
                            if check_holder(&state, &r.holder, now).is_err() {
                                return Ok(((), None));
                            }
                            for (c, id) in &scanned {
                                let at = state.handled.entry(c.clone()).or_default();
                                *at = (*at).max(*id);
                            }
                            Ok(((), Some(state)))
                        })
                        .await?;
                }
                return Ok(Pending {
                    messages: Vec::new(),
                    scanned: BTreeMap::new(),
                });
            }
            tokio::time::sleep(LOOK_SPACING).await;
        }
    }
}

/// What one `wake_pending` has looked at so far, per channel: where the next look starts, and
/// for a paused channel, where its held messages begin.
#[derive(Default)]
struct Look {
    seen: BTreeMap<String, u64>,
    held_after: BTreeMap<String, u64>,
    /// How far each channel may be marked handled: what was looked at, but a paused channel
    /// only up to its first held message. A turn, or a wait that ends empty, marks it.
    scanned: BTreeMap<String, u64>,
}

/// The messages after `handled` that wake `who`: from someone else, and addressed to it (its
/// recipient, or a reply to one of its messages) or on a listened channel. A paused channel
/// wakes it only once a person writes there: then with every message it held.
async fn scan(
    cx: &Ctx,
    who: &str,
    handled: &BTreeMap<String, u64>,
    look: &mut Look,
    listen: &BTreeSet<ChannelName>,
    paused: &PausedSet,
    most: usize,
) -> Result<Pending, OpError> {
    let mut out = Pending {
        messages: Vec::new(),
        scanned: BTreeMap::new(),
    };
    let mut channels = cx.relay.list_channels()?;
    channels.sort_by(|a, b| a.0.cmp(&b.0));
    // Asked for once a look, only when a message wakes it.
    let mut humans: Option<BTreeSet<String>> = None;
    for (name, meta) in channels {
        let key = name.to_string();
        let done = handled.get(&key).copied().unwrap_or(0);
        let from = look.seen.get(&key).copied().unwrap_or(done).max(done);
        if meta.last_id <= from || out.messages.len() >= most {
            continue;
        }
        let room = most - out.messages.len();
        let page = cx.relay.read(&name, from, room, None).await?;
        let Some(last) = page.last().map(|p| p.message.id) else {
            continue;
        };
        look.seen.insert(key.clone(), last);
        let held = paused.has(&name);
        // On a channel the loop guard paused, any person's message resumes it (under the
        // budget, a message of a person's that wakes it).
        let resumes = held && matches!(paused, PausedSet::Some(_));
        let found = wakings(cx, who, &name, page, listen, resumes, &mut humans).await?;
        if !held {
            look.scanned.insert(key, last);
            out.messages.extend(found);
        } else if found.iter().any(|w| w.human) {
            // A person wrote: everything held since `done` comes with it.
            let page = cx.relay.read(&name, done, room, None).await?;
            let last = page.last().map_or(last, |p| p.message.id);
            look.held_after.remove(&key);
            look.scanned.insert(key, last);
            out.messages
                .extend(wakings(cx, who, &name, page, listen, resumes, &mut humans).await?);
        } else {
            // Held: handled only up to the first message it holds.
            if let Some(first) = found.first() {
                look.held_after
                    .entry(key.clone())
                    .or_insert(first.message.message.id - 1);
            }
            let upto = look.held_after.get(&key).copied().unwrap_or(last);
            look.scanned.insert(key, upto);
        }
    }
    out.scanned = look.scanned.clone();
    Ok(out)
}

/// Of `page`, the messages that wake `who` (from someone else, and addressed to it or on a
/// listened channel) and, where `resumes`, any person's message; each marked whether a person
/// wrote it. The registered humans are listed once a look, and only when a message could wake.
async fn wakings(
    cx: &Ctx,
    who: &str,
    channel: &ChannelName,
    page: Vec<Arc<Posted>>,
    listen: &BTreeSet<ChannelName>,
    resumes: bool,
    humans: &mut Option<BTreeSet<String>>,
) -> Result<Vec<Waking>, OpError> {
    let mut found = Vec::new();
    for p in page {
        let m = &p.message;
        if m.sender == who {
            continue;
        }
        // A listened channel needs no look at the parent of a reply.
        let wakes = listen.contains(channel) || addressed(cx, who, channel, m).await?;
        if !wakes && !resumes {
            continue;
        }
        let human = humans.get_or_insert_with(|| registered_humans(cx)).contains(&m.sender);
        if wakes || human {
            found.push(Waking { message: p, human });
        }
    }
    Ok(found)
}

/// Whether `m` on `channel` is addressed to `who`: its recipient, or a reply to one of its
/// messages. Not the verdict on a PERMISSION it asked: that goes to the turn that asked (its
/// permission-prompt tool), which waits for it.
async fn addressed(cx: &Ctx, who: &str, channel: &ChannelName, m: &crosstalk_schema::Message) -> Result<bool, OpError> {
    if m.recipient.as_deref() == Some(who) {
        return Ok(true);
    }
    let Some(parent) = m.reply_to else { return Ok(false) };
    Ok(cx
        .relay
        .message(channel, parent)
        .await?
        .is_some_and(|q| q.message.sender == who && !q.message.kind.is(crosstalk_schema::Meaning::Permission)))
}

/// The identities registered as humans.
fn registered_humans(cx: &Ctx) -> BTreeSet<String> {
    cx.relay
        .list_instances()
        .into_iter()
        .filter(|i| i.kind == InstanceKind::Human)
        .map(|i| i.instance_id)
        .collect()
}

// ---- wake_turn

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct TurnRequest {
    pub identity: String,
    pub holder: String,
    pub activity: ActivityArg,
    /// The channels a turn works for (`working`), or the one it paused for (`paused`: the loop
    /// guard's channel, or where the hourly budget asked).
    #[serde(default)]
    pub channels: Vec<String>,
    /// Why it paused (`paused`).
    pub why: Option<String>,
    /// The question that asks a person to resume it (`paused`).
    pub question: Option<u64>,
    /// Per channel, how far is handled now (never moves back).
    #[serde(default)]
    pub handled: BTreeMap<String, u64>,
    /// The turn that ended, if one did.
    pub turn: Option<Turn>,
}

/// What a woken identity does now, as a wake process tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ActivityArg {
    Listening,
    Working,
    Paused,
}

pub struct WakeTurn;

impl Operation for WakeTurn {
    const NAME: &'static str = "wake_turn";
    const DESCRIPTION: &'static str = "Record what a woken identity does now (listening, working, paused) and \
        what its turn handled.";
    const READ_ONLY: bool = false;
    type Request = TurnRequest;
    type Response = WakeView;

    async fn run(cx: &Ctx, caller: Caller, r: TurnRequest) -> Result<WakeView, OpError> {
        let who = identity_of(&caller, &r.identity)?;
        let activity = match r.activity {
            ActivityArg::Listening => Activity::Listening,
            ActivityArg::Working => Activity::Working {
                since_ms: now_ms(),
                channels: r.channels.clone(),
            },
            ActivityArg::Paused => Activity::Paused {
                channel: r.channels.first().cloned(),
                why: r.why.clone().unwrap_or_else(|| "the loop guard".into()),
                question: r.question,
            },
        };
        Store::new(cx)
            .update(&who, |state, now| {
                let Some(mut state) = state else {
                    return Err(OpError::not_found(format!("{who} is not woken: take its lease first")));
                };
                check_holder(&state, &r.holder, now)?;
                for (c, id) in &r.handled {
                    let at = state.handled.entry(c.clone()).or_default();
                    *at = (*at).max(*id);
                }
                state.activity = activity.clone();
                if let Some(t) = &r.turn {
                    state.turns.push(t.clone());
                    let over = state.turns.len().saturating_sub(TURNS_KEPT);
                    state.turns.drain(..over);
                }
                Ok((WakeView::of(&state, now), Some(state)))
            })
            .await
    }
}

// ---- wake_list

#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct WakeListRequest {}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WakeList {
    /// Every identity a wake process holds now, by name.
    pub woken: Vec<WakeView>,
}

pub struct WakeListOp;

impl Operation for WakeListOp {
    const NAME: &'static str = "wake_list";
    const DESCRIPTION: &'static str = "The identities crosstalk wake runs turns for, with what each is doing \
        and its last turns.";
    const READ_ONLY: bool = true;
    type Request = WakeListRequest;
    type Response = WakeList;

    async fn run(cx: &Ctx, _: Caller, _: WakeListRequest) -> Result<WakeList, OpError> {
        Ok(WakeList {
            woken: woken(cx).await?,
        })
    }
}

/// Every identity a wake process holds now.
pub async fn woken(cx: &Ctx) -> Result<Vec<WakeView>, OpError> {
    let now = now_ms();
    let mut out = Vec::new();
    for state in super::readable::<WakeState>(Store::new(cx).records.list(Kind::Wake).await?) {
        if held(&state, now).is_none() {
            continue;
        }
        let mut view = WakeView::of(&state, now);
        // What a paused identity asked, so a person sees it where the identity is listed.
        if let Some(p) = view.paused.as_mut() {
            if let (Some(channel), Some(id)) = (p.channel.as_deref(), p.question) {
                if let Ok(name) = ChannelName::parse(channel) {
                    if let Some(q) = cx.relay.message(&name, id).await? {
                        p.asked = q.message.body.lines().next().map(|l| l.chars().take(200).collect());
                    }
                }
            }
        }
        out.push(view);
    }
    out.sort_by(|a, b| a.identity.cmp(&b.identity));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::memory::Memory;

    fn state(identity: &str, handled: u64) -> WakeState {
        WakeState {
            identity: identity.into(),
            lease: None,
            handled: BTreeMap::from([("dev".to_owned(), handled)]),
            activity: Activity::Listening,
            turns: Vec::new(),
            made_by: None,
        }
    }

    #[test]
    fn an_identity_no_store_could_hold_as_a_key_is_kept_in_hex() {
        for plain in ["reviewer", "team.rev", "rev-1_a/b", "A=b"] {
            assert_eq!(key_for(plain), plain);
        }
        let mut keys = BTreeSet::new();
        for odd in [
            "code reviewer",
            "rév",
            ">",
            "*",
            "a..b",
            ".rev",
            "rev.",
            "=2a",
            "=3d3261",
        ] {
            let key = key_for(odd);
            assert!(key.starts_with('=') && is_key(&key), "{odd:?} -> {key:?}");
            assert!(keys.insert(key), "{odd:?}: two identities, one key");
        }
        assert_eq!(key_for("*"), "=2a");
        assert_eq!(key_for("=2a"), "=3d3261", "not the key of `*`");
        assert!(is_key(&key_for(&"é".repeat(64))), "the longest identity, 128 bytes");
    }

    /// The per-token count reads every state; a damaged one counts for nobody and stops no one.
    #[tokio::test]
    async fn the_count_of_a_tokens_states_passes_over_a_damaged_one() {
        let records = Arc::new(Memory::default());
        let store = Store {
            records: records.clone(),
        };
        let full = Recounts::default();
        records.put(Kind::Wake, "broken".into(), vec![1, 2, 3]).await.unwrap();
        for i in 0..MAX_WOKEN_PER_TOKEN - 1 {
            let mut s = state(&format!("w{i}"), 0);
            s.made_by = Some("tok".into());
            records
                .put(Kind::Wake, format!("w{i}"), codec::encode(&s))
                .await
                .unwrap();
        }
        room_for_one_more(&store, &full, "tok").await.unwrap();
        let mut last = state("last", 0);
        last.made_by = Some("tok".into());
        records
            .put(Kind::Wake, "last".into(), codec::encode(&last))
            .await
            .unwrap();
        let e = room_for_one_more(&store, &full, "tok").await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::LimitReached);
        room_for_one_more(&store, &full, "another").await.unwrap();
        // Found full, the token is refused again without a listing each time.
        records.take_listed();
        for _ in 0..20 {
            let e = room_for_one_more(&store, &full, "tok").await.unwrap_err();
            assert_eq!(e.kind, ErrorKind::LimitReached);
        }
        assert_eq!(records.take_listed(), 0, "no state was listed");
    }

    #[tokio::test]
    async fn a_state_an_earlier_release_kept_under_the_identity_itself_stays_there() {
        let records = Arc::new(Memory::default());
        let store = Store {
            records: records.clone(),
        };
        // A lone relay of an earlier release kept "code reviewer" as itself.
        let old = codec::encode(&state("code reviewer", 41));
        records.put(Kind::Wake, "code reviewer".into(), old).await.unwrap();
        let (found, _, key) = store.read("code reviewer").await.unwrap();
        assert_eq!((found.unwrap().handled["dev"], key.as_str()), (41, "code reviewer"));
        store
            .update("code reviewer", |s, _| {
                let mut s = s.unwrap();
                s.handled.insert("dev".into(), 42);
                Ok(((), Some(s)))
            })
            .await
            .unwrap();
        let (found, _, key) = store.read("code reviewer").await.unwrap();
        assert_eq!((found.unwrap().handled["dev"], key.as_str()), (42, "code reviewer"));
        assert_eq!(records.list(Kind::Wake).await.unwrap().len(), 1, "no second copy");
        // A new one goes under its hex key.
        store
            .update("rév", |_, _| Ok(((), Some(state("rév", 7)))))
            .await
            .unwrap();
        assert!(records.get(Kind::Wake, key_for("rév")).await.unwrap().is_some());
        assert_eq!(store.read("rév").await.unwrap().0.unwrap().handled["dev"], 7);
    }
}
