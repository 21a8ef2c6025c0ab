//! The operation table: every capability of the relay described once. An operation is a
//! typed request (`Deserialize` + `JsonSchema`: its defaults and validation), a typed
//! response (`Serialize` + `JsonSchema`: the wire shape), and one async function that
//! authorises the [`Caller`] and calls the [`Relay`]. The faces are built from it:
//!
//! - REST (`src/rest.rs`, `src/cc.rs`): a route is a method, a path and an operation;
//! - MCP (`src/mcp/tools.rs`): a tool is an operation plus a text rendering; its input and
//!   output schemas are the request's and response's;
//! - OpenAPI (`src/openapi.rs`): generated from the REST tables.
//!
//! The faces keep only transport: status codes, SSE framing, progress notifications, text.
//!
//! Codemap: [`messages`] (post, read, wait, one message, replies, ask), [`channels`]
//! (list, create, find, presence, search), [`sessions`] (sessions and directives),
//! [`identity`] (register, instances, inbox), [`shared`] (shared data), [`cross_claude`]
//! (cross-claude-mcp's operations, for the `/cc` routes and tools).

pub mod channels;
pub mod cross_claude;
pub mod fields;
pub mod identity;
#[cfg(test)]
pub(crate) mod memory;
pub mod messages;
pub mod oauth;
pub mod reservations;
pub mod sessions;
pub mod shared;
pub mod tasks;
pub mod wake;
pub mod webhooks;

use crosstalk_actors::{RelayError, StoreError};
use crosstalk_schema::{ChannelName, InvalidInput};
use futures_util::FutureExt;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use std::borrow::Cow;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use crosstalk_actors::Relay;

/// A listing's `limit` as a request names it: 1 to [`Limit::MAX`], checked when the request
/// is deserialized, and its JSON Schema gives the bounds. A request that names none gets its
/// face's default ([`Caller::limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(usize);

impl Limit {
    /// Largest `limit` a client may ask for on any listing.
    pub const MAX: usize = 10_000;

    pub fn new(n: usize) -> Result<Limit, OpError> {
        if (1..=Limit::MAX).contains(&n) {
            Ok(Limit(n))
        } else {
            Err(OpError::invalid(format!(
                "limit {n} is out of range: use 1 to {}",
                Limit::MAX
            )))
        }
    }

    pub fn get(self) -> usize {
        self.0
    }

    /// The `limit` asked for, or `default` when none was.
    pub fn or(requested: Option<Limit>, default: usize) -> usize {
        requested.map_or(default, Limit::get)
    }
}

impl Serialize for Limit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Limit::new(usize::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Limit {
    /// Inline, as the `usize` it replaces: a field keeps its own description, and an
    /// `Option` of it is `["integer", "null"]`.
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Limit".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "integer", "format": "uint", "minimum": 1, "maximum": Limit::MAX })
    }
}

/// One capability of the relay, described once for every face.
pub trait Operation: 'static {
    /// The MCP tool name and the OpenAPI `operationId`.
    const NAME: &'static str;
    /// What it does, for a model (the MCP tool description) and a person (OpenAPI).
    const DESCRIPTION: &'static str;
    /// It changes nothing (MCP `readOnlyHint`).
    const READ_ONLY: bool;
    /// It may remove or end what is there, not only add (MCP `destructiveHint`).
    const DESTRUCTIVE: bool = false;
    /// Calling it again with the same arguments changes nothing more (MCP `idempotentHint`).
    const IDEMPOTENT: bool = Self::READ_ONLY;
    /// It blocks until something happens (a wait, an ask): a request made with an OAuth token
    /// is cut short when the token ends, rather than outliving it.
    const WAITS: bool = false;
    /// Even as a read (a GET), it may answer 409: what it reads is held by someone else.
    const CONFLICTS: bool = false;
    type Request: DeserializeOwned + JsonSchema + Send + 'static;
    type Response: Serialize + JsonSchema + Send + 'static;

    /// Runs the operation. The context is borrowed: cloning its handles per request would
    /// cost every request contended atomic increments on two cores.
    fn run(
        cx: &Ctx,
        caller: Caller,
        request: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, OpError>> + Send + '_;
}

/// Runs an operation for a face, counting it by face, operation and outcome
/// (`crosstalk_operations_total`, see `crate::telemetry`). Every face calls operations
/// through this.
///
/// A combinator, not an `async fn`: an `async fn` would keep its own copies of the caller
/// and the request beside the operation's future for as long as that runs, and a parked
/// wait runs for minutes (see docs/benchmarks.md, "10,000 waiters: where the memory goes").
pub fn call<'a, O: Operation>(
    face: &'static str,
    cx: &'a Ctx,
    caller: Caller,
    request: O::Request,
) -> impl Future<Output = Result<O::Response, OpError>> + Send + 'a {
    let opener = caller.principal.opener();
    Relay::opening_as(opener, O::run(cx, caller, request)).map(move |result| {
        counted(face, O::NAME, result.as_ref().map_or_else(|e| e.kind.code(), |_| "ok"));
        result
    })
}

/// Counts one request for an operation by its outcome: `ok`, or the error code it was
/// answered with (a face calls it itself for requests refused before the operation ran,
/// such as arguments that do not parse).
pub fn counted(face: &'static str, operation: &'static str, outcome: &'static str) {
    /// Handles a thread has looked up, by where their three names live. Looking one up builds
    /// a key of three labels, hashes it and searches the registry (about 3,200 instructions,
    /// on every request, by callgrind); a handle found once is a pointer to the same atomic
    /// counter.
    type Known = Vec<([(usize, usize); 3], metrics::Counter)>;
    /// Enough for every operation and outcome a worker meets; past it, looked up each time.
    const KEPT: usize = 256;
    thread_local! {
        static KNOWN: std::cell::RefCell<Known> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Where and how long: the compiler may lay one constant inside another.
    let at = |s: &'static str| (s.as_ptr() as usize, s.len());
    let key = [at(face), at(operation), at(outcome)];
    let lookup = || metrics::counter!("crosstalk_operations_total", "face" => face, "operation" => operation, "outcome" => outcome);
    KNOWN.with_borrow_mut(|known| match known.iter().find(|(k, _)| *k == key) {
        Some((_, counter)) => counter.increment(1),
        None => {
            let counter = lookup();
            counter.increment(1);
            if known.len() < KEPT {
                known.push((key, counter));
            }
        }
    });
}

/// What every operation shares: the relay and the gauges `/healthz` shows.
#[derive(Clone)]
pub struct Ctx {
    pub relay: Relay,
    /// Open SSE streams.
    pub streams: Arc<AtomicUsize>,
    /// Pending waits (REST long-poll, MCP waits, asks).
    pub waits: Arc<AtomicUsize>,
    /// Open MCP sessions (both faces), and those of them still in their handshake.
    pub mcp_sessions: Arc<AtomicUsize>,
    pub mcp_initializing: Arc<AtomicUsize>,
    /// Waits and streams each principal holds open, against [`Ctx::max_held`].
    held: Arc<parking_lot::Mutex<std::collections::HashMap<String, usize>>>,
    /// Most waits and streams one principal may hold open at once.
    pub max_held: usize,
    /// Participant identities that are people (`--humans`): they may decide a PERMISSION.
    pub humans: Arc<std::collections::HashSet<String>>,
    /// Reservations (by id) and shared data keys each token of one client keeps.
    pub reservations_kept: Arc<Kept>,
    pub shared_kept: Arc<Kept>,
    /// Tokens found at their limit of wake states, so a token asking again and again is
    /// refused without a listing each time.
    pub wake_full: Arc<Recounts>,
    /// Held while a token of one client takes a wake lease: a new state's count and its making
    /// are one step on this node, so requests side by side cannot pass the limit together.
    pub wake_new: Arc<Stripes>,
    /// The relay is an OAuth authorization server (`--oauth`): its `/api/oauth/…` routes are
    /// mounted, which `whoami` tells the console.
    pub oauth: bool,
}

/// Default of `--max-waits-per-principal`: enough for a large fleet behind one token.
pub const DEFAULT_MAX_HELD: usize = 10_000;
/// Default of `--max-reservations-per-participant`: as many as one holder may keep in one
/// project, now across all projects.
pub const DEFAULT_MAX_RESERVATIONS: usize = 100;
/// Default of `--max-shared-keys-per-participant`: at most 100 MiB of current content at the
/// default `--max-shared-bytes`.
pub const DEFAULT_MAX_SHARED_KEYS: usize = 100;
/// How often a token at its limit of shared keys may have them listed: the listing is every
/// token's keys. Short, so that a key deleted by someone else gives its place back within it.
pub const SHARED_KEYS_ASKED_EVERY: Duration = Duration::from_secs(1);

/// What each token of one client ([`Principal::is_one_client`]) keeps in the relay, by name
/// (a reservation's id, a shared data key), against a limit, so that no one client can take
/// what all the others share. Counted on this node from its start: what the token made
/// before, or on another node, is not in it. An operation that finds a token at its limit
/// asks the store what is still kept ([`Kept::keep_only`]) before it refuses, so what
/// lapsed, was released or was deleted by others gives its place back. Where that asking
/// costs more than what the token holds (a listing of every token's shared keys), a token
/// it refused is refused without asking again for a while ([`Kept::asking_at_most_every`]).
pub struct Kept {
    names: parking_lot::Mutex<std::collections::HashMap<String, std::collections::HashSet<String>>>,
    /// Most names one token may keep.
    pub max: usize,
    /// When each token at its limit last had the store asked, if that is spaced out.
    asked: Option<Recounts>,
}

/// What [`Kept::take`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// The token keeps it already.
    Already,
    /// Counted now: forget it if what it stands for is not made after all.
    New,
    /// The token keeps its maximum.
    Full,
}

impl Kept {
    pub fn new(max: usize) -> Kept {
        Kept {
            names: Default::default(),
            max: max.max(1),
            asked: None,
        }
    }

    /// [`Kept::new`], where a token at its limit has the store asked at most once per `every`:
    /// for what it costs more to ask than the token holds, so that a token at its limit
    /// asking in a loop costs a listing a while, not a listing a request.
    pub fn asking_at_most_every(max: usize, every: Duration) -> Kept {
        Kept {
            asked: Some(Recounts::every(every)),
            ..Kept::new(max)
        }
    }

    /// Counts `name` as kept by `principal`'s token if it is one client's: `true` if it was
    /// counted now, and must be [`forgotten`](Kept::forget) if what it stands for is not made.
    /// At the limit by this node's count, `still` is asked which of the token's names the
    /// store still keeps (what lapsed, was released or was deleted gives its place back), and
    /// then the limit refuses (429) with `refused`'s words. Where asking is spaced out, a token
    /// asked for within the interval is refused by this node's count alone.
    pub async fn admit<F>(
        &self,
        principal: &Principal,
        name: &str,
        still: impl FnOnce(Vec<String>) -> F,
        refused: impl FnOnce(usize) -> String,
    ) -> Result<bool, OpError>
    where
        F: Future<Output = Result<std::collections::HashSet<String>, OpError>>,
    {
        if !principal.is_one_client() {
            return Ok(false);
        }
        let token = principal.key();
        match self.take(token, name) {
            Taken::Full => {}
            taken => return Ok(taken == Taken::New),
        }
        let ask = match &self.asked {
            None => true,
            Some(asked) if asked.recent(token) => false,
            Some(asked) => {
                asked.counted(token);
                true
            }
        };
        if ask {
            let kept = still(self.names(token)).await?;
            self.keep_only(token, |n| kept.contains(n));
            match self.take(token, name) {
                Taken::Full => {}
                taken => return Ok(taken == Taken::New),
            }
        }
        Err(OpError::new(ErrorKind::LimitReached, refused(self.max)))
    }

    /// The names `principal` keeps, by this node's count.
    fn names(&self, principal: &str) -> Vec<String> {
        self.names
            .lock()
            .get(principal)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Counts `name` as kept by `principal`, unless it keeps its maximum already.
    fn take(&self, principal: &str, name: &str) -> Taken {
        let mut all = self.names.lock();
        let mine = all.entry(principal.to_owned()).or_default();
        if mine.contains(name) {
            Taken::Already
        } else if mine.len() >= self.max {
            Taken::Full
        } else {
            mine.insert(name.to_owned());
            Taken::New
        }
    }

    pub fn forget(&self, principal: &str, name: &str) {
        let mut all = self.names.lock();
        if let Some(mine) = all.get_mut(principal) {
            mine.remove(name);
            if mine.is_empty() {
                all.remove(principal);
            }
        }
    }

    /// Forgets `name` for every token that keeps it: a name that is one thing relay-wide (a
    /// shared data key), gone.
    pub fn forget_by_all(&self, name: &str) {
        self.names.lock().retain(|_, mine| {
            mine.remove(name);
            !mine.is_empty()
        });
    }

    /// Of `principal`'s names, keeps only those `still` holds (what the store says is kept).
    fn keep_only(&self, principal: &str, still: impl Fn(&str) -> bool) {
        let mut all = self.names.lock();
        if let Some(mine) = all.get_mut(principal) {
            mine.retain(|n| still(n));
            if mine.is_empty() {
                all.remove(principal);
            }
        }
    }
}

impl Ctx {
    pub fn new(relay: Relay) -> Self {
        Ctx {
            relay,
            streams: Default::default(),
            waits: Default::default(),
            mcp_sessions: Default::default(),
            mcp_initializing: Default::default(),
            held: Default::default(),
            max_held: DEFAULT_MAX_HELD,
            humans: Default::default(),
            reservations_kept: Arc::new(Kept::new(DEFAULT_MAX_RESERVATIONS)),
            shared_kept: Arc::new(Kept::asking_at_most_every(
                DEFAULT_MAX_SHARED_KEYS,
                SHARED_KEYS_ASKED_EVERY,
            )),
            wake_full: Default::default(),
            wake_new: Default::default(),
            oauth: false,
        }
    }

    /// Holds one of the caller's waits or streams open, or refuses (429) when the principal
    /// already holds its maximum: one client cannot tie up the relay's connections.
    pub fn hold(&self, principal: &Principal) -> Result<Held, OpError> {
        let key = principal.key().to_owned();
        let mut held = self.held.lock();
        let n = held.entry(key.clone()).or_insert(0);
        if *n >= self.max_held {
            return Err(OpError::new(
                ErrorKind::LimitReached,
                format!(
                    "this token already holds {} waits and streams open (--max-waits-per-principal); end one first",
                    self.max_held
                ),
            ));
        }
        *n += 1;
        Ok(Held {
            held: self.held.clone(),
            key,
        })
    }
}

/// One wait or stream a principal holds open; released when dropped.
pub struct Held {
    held: Arc<parking_lot::Mutex<std::collections::HashMap<String, usize>>>,
    key: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        if let Some(n) = held.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// Counts one open stream or wait for as long as it lives.
pub struct Gauge(Arc<AtomicUsize>);

impl Gauge {
    pub fn enter(counter: &Arc<AtomicUsize>) -> Gauge {
        counter.fetch_add(1, Ordering::Relaxed);
        Gauge(counter.clone())
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How an OAuth connection's [`Principal::key`] begins: a NUL (no identity has one), then its
/// grant.
const CONNECTOR_PREFIX: &str = "\0grant:";

/// Who a request authenticated as (the auth middleware decides; operations obey).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// No token is configured.
    Anyone,
    /// The shared token: may act as anyone.
    Shared,
    /// A participant token: may act only as this identity.
    Participant(String),
    /// An OAuth connection consented with an invite that bound no identity: may act as
    /// anyone, like the shared token, but is not the admin. Holds its key
    /// (`\0grant:<id>`), so its limits are its own.
    Connector(String),
}

impl Principal {
    /// What its waits, streams and requests are counted under: the participant's identity,
    /// or for the others a name that starts with NUL, which no identity has.
    pub fn key(&self) -> &str {
        match self {
            Principal::Anyone => "\0anyone",
            Principal::Shared => "\0shared",
            Principal::Participant(id) => id,
            Principal::Connector(key) => key,
        }
    }

    /// The principal of an OAuth connection made through grant `id`.
    pub fn connector(grant_id: &str) -> Principal {
        Principal::Connector(format!("{CONNECTOR_PREFIX}{grant_id}"))
    }

    /// The OAuth grant an OAuth connection's principal was made through.
    pub fn grant_id(&self) -> Option<&str> {
        match self {
            Principal::Connector(key) => key.strip_prefix(CONNECTOR_PREFIX),
            _ => None,
        }
    }

    /// A token of one client — a participant's, or an OAuth connection's — as opposed to the
    /// admin's shared token and, without tokens, everyone: what it may make the relay hold is
    /// bounded by its own, tighter, limits (MCP sessions, channels, reservations, shared
    /// data), so that no one client can take what all the others share.
    pub fn is_one_client(&self) -> bool {
        matches!(self, Principal::Participant(_) | Principal::Connector(_))
    }

    /// May add, list and remove webhooks (`/api/webhooks`): the relay's own token, or anyone
    /// on a relay without tokens, but no token of one client.
    pub fn manages_webhooks(&self) -> bool {
        matches!(self, Principal::Shared | Principal::Anyone)
    }

    /// May mint OAuth invites and see and revoke connections (`/api/oauth/…`, with `--oauth`):
    /// the relay's own token only.
    pub fn manages_connections(&self) -> bool {
        matches!(self, Principal::Shared)
    }

    /// Whom the channels it brings into being are counted against
    /// (`--max-channels-per-participant`, [`Relay::opening_as`]): a token of one client's
    /// own key; for the others none, and only the relay's `--max-channels` applies.
    pub fn opener(&self) -> Option<Arc<str>> {
        self.is_one_client().then(|| Arc::from(self.key()))
    }

    /// The principal whose [`Principal::key`] is `key`: how a stored task names its owner.
    pub fn from_key(key: &str) -> Principal {
        match key {
            "\0anyone" => Principal::Anyone,
            "\0shared" => Principal::Shared,
            k if k.starts_with('\0') => Principal::Connector(k.to_owned()),
            k => Principal::Participant(k.to_owned()),
        }
    }

    /// The session `name` as this principal's. Identities bind to sessions, so a session (an
    /// `X-Crosstalk-Session` value, an MCP session id, cross-claude REST's per-token session)
    /// acts only for the token that made it, however its name is guessed or learnt.
    pub fn session(&self, name: &str) -> String {
        format!("{}\u{1f}{name}", self.key())
    }

    /// A session's name as its client knows it: [`Principal::session`] undone.
    pub fn session_name(session: &str) -> &str {
        session.split_once('\u{1f}').map_or(session, |(_, name)| name)
    }

    /// Who it is, in words: the participant's identity, `shared` or `anyone`.
    pub fn name(&self) -> &str {
        match self {
            Principal::Participant(id) => id,
            other => &other.key()[1..],
        }
    }
}

/// What a face may choose about paging and blocking: a model pays for every message it
/// reads and its host gives up on a tool call after a minute, a script does neither.
#[derive(Debug, Clone, Copy)]
pub struct FacePolicy {
    /// Messages a listing returns when the caller names no `limit`.
    pub default_limit: usize,
    /// Longest a blocking call (wait, ask) may block.
    pub wait_cap: Duration,
    /// Its callers are agents (MCP): they may not decide a PERMISSION.
    pub agents: bool,
}

/// Who is calling, as the face established it. Every operation authorises from this.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Principal,
    /// The session an identity is bound to: the `X-Crosstalk-Session` header, or the MCP
    /// session.
    pub session: Option<String>,
    /// The identity this MCP session registered as: it keeps it.
    pub bound: Option<String>,
    /// The session may act only as `bound` once registered (crosstalk's faces). cross-claude
    /// lets one session register several names and speak as any of them: there `bound` is
    /// only the default identity. Other sessions' live identities stay refused either way.
    pub bound_only: bool,
    pub policy: FacePolicy,
}

impl Caller {
    /// The identity the caller names, checked: a participant token acts only as itself, a
    /// session registered as one identity acts only as it, and an identity live in another
    /// session is refused by the relay. Counts as a heartbeat of that identity.
    pub fn act_as(&self, cx: &Ctx, who: &str) -> Result<String, OpError> {
        let who = self.claim(who)?;
        cx.relay.authorize(&who, self.session.as_deref())?;
        Ok(who)
    }

    /// The identity the caller names, checked against what the caller's token and session
    /// allow (not against other sessions' bindings: [`Caller::act_as`] adds that, and a
    /// registration leaves it to the registry, which answers a live name with 409).
    pub fn claim(&self, who: &str) -> Result<String, OpError> {
        let who = who.trim();
        if who.is_empty() {
            return Err(OpError::invalid(
                "an identity is required (sender, instance_id or owner)",
            ));
        }
        if let Principal::Participant(p) = &self.principal {
            if p != who {
                return Err(OpError::forbidden(format!(
                    "this token belongs to {p:?}; it cannot act as {who:?}"
                )));
            }
        }
        if let Some(b) = self.bound.as_ref().filter(|b| self.bound_only && *b != who) {
            return Err(OpError::forbidden(format!(
                "this session is registered as {b:?}; it cannot act as {who:?}"
            )));
        }
        Ok(who.to_owned())
    }

    /// The caller's own identity when it names none: the one this session registered as,
    /// else its participant token's.
    pub fn own_identity(&self) -> Option<&str> {
        self.bound.as_deref().or(match &self.principal {
            Principal::Participant(p) => Some(p.as_str()),
            _ => None,
        })
    }

    /// `given` if the caller named one, else its own identity; checked as [`Caller::act_as`].
    pub fn identity(&self, cx: &Ctx, given: Option<&str>) -> Result<String, OpError> {
        match given.map(str::trim).filter(|g| !g.is_empty()) {
            Some(g) => self.act_as(cx, g),
            None => match self.own_identity() {
                Some(me) => self.act_as(cx, me),
                None => match self.registered(cx)? {
                    Some(me) => self.act_as(cx, &me),
                    None => Err(OpError::invalid(
                        "name who you are (sender, instance_id or owner), or register first",
                    )),
                },
            },
        }
    }

    /// The identity registered from the caller's session when the caller holds none in
    /// hand: a client whose requests carry no session of their own (a 2026-07-28 MCP client,
    /// whose requests share its token's `mcp-stateless` session, or a REST client sending
    /// `X-Crosstalk-Session`) acts as the name it registered, while that is the only live one
    /// there. With several, the caller must name one.
    fn registered(&self, cx: &Ctx) -> Result<Option<String>, OpError> {
        let Some(session) = self.session.as_deref() else {
            return Ok(None);
        };
        // Three at most: one is the answer, two or more say which to choose from.
        let mut names = cx.relay.bound_to(session, 3);
        match names.len() {
            0 => Ok(None),
            1 => Ok(names.pop()),
            n => Err(OpError::invalid(format!(
                "{} without a session of their own have registered several names ({}{}): name yours \
                 on each call (sender=…, instance_id=…)",
                match self.principal {
                    // Nothing tells such clients apart on a relay without tokens.
                    Principal::Anyone => "this relay has no tokens, so all requests",
                    _ => "this token's requests",
                },
                names.join(", "),
                if n > 2 { ", …" } else { "" }
            ))),
        }
    }

    /// Like [`Caller::identity`], but naming nobody is fine (an anonymous read).
    pub fn reader(&self, cx: &Ctx, given: Option<&str>) -> Result<Option<String>, OpError> {
        match given.map(str::trim).filter(|g| !g.is_empty()) {
            Some(g) => self.act_as(cx, g).map(Some),
            None => match self.bound.clone() {
                Some(me) => self.act_as(cx, &me).map(Some),
                None => match self.registered(cx) {
                    Ok(Some(me)) => self.act_as(cx, &me).map(Some),
                    // An anonymous read stays one when the session holds several names.
                    _ => Ok(None),
                },
            },
        }
    }

    /// A listing's `limit`, or the face's default.
    pub fn limit(&self, requested: Option<Limit>) -> usize {
        Limit::or(requested, self.policy.default_limit)
    }

    /// A blocking call's `timeout_s`, checked and capped to what the face allows.
    pub fn timeout(&self, requested: Option<f64>, default: Duration) -> Result<Duration, OpError> {
        let cap = self.policy.wait_cap;
        match requested {
            None => Ok(default.min(cap)),
            Some(t) if t.is_finite() && t >= 0.0 => Ok(Duration::from_secs_f64(t.min(cap.as_secs_f64()))),
            Some(t) => Err(OpError::invalid(format!(
                "timeout_s {t} must be a number of seconds >= 0"
            ))),
        }
    }
}

/// A channel name from a request that is not deserialized (a path, a URI).
pub fn channel(raw: &str) -> Result<ChannelName, OpError> {
    Ok(ChannelName::parse(raw)?)
}

/// Why an operation failed: a kind (mapped to an HTTP status and an MCP error in one place
/// each) and a message the client can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input was refused; nothing changed.
    Invalid,
    /// The caller may not do this.
    Forbidden,
    /// What the request names does not exist.
    NotFound,
    /// The channel has no active session (crosstalk-mcp's `no_active_session`).
    NoActiveSession,
    /// Conflicts with the current state.
    Conflict,
    /// Stored data is damaged.
    Storage,
    /// The store refused or did not take a write: nothing was acknowledged; retrying can help
    /// once the cause (a full disk, a hung device) is gone.
    StoreUnavailable,
    /// Overloaded or stopping: try again shortly.
    Unavailable,
    /// A configured limit (waits and streams per principal) is reached.
    LimitReached,
    ShuttingDown,
}

impl ErrorKind {
    /// The `code` of a JSON error body.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::Invalid => "invalid_input",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::NotFound => "not_found",
            ErrorKind::NoActiveSession => "no_active_session",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Storage => "storage",
            ErrorKind::StoreUnavailable => "store_unavailable",
            ErrorKind::LimitReached => "limit_reached",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::ShuttingDown => "shutting_down",
        }
    }
}

impl OpError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        OpError {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
}

/// How long a count of a principal's records taken from the store stands: a count is a
/// listing, and a caller at its limit asking again and again must not make the relay list
/// each time.
pub const RECOUNT_EVERY: Duration = Duration::from_secs(5);

/// Locks by name, a fixed number of them: what one name does is one step at a time, and names
/// that fall on different stripes go side by side. Nothing to forget, whatever the names.
pub struct Stripes([tokio::sync::Mutex<()>; 16]);

impl Default for Stripes {
    fn default() -> Self {
        Stripes(std::array::from_fn(|_| tokio::sync::Mutex::new(())))
    }
}

impl Stripes {
    /// The lock `name` falls on, once it is free.
    pub async fn lock(&self, name: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.0[self.stripe(name)].lock().await
    }

    fn stripe(&self, name: &str) -> usize {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        BuildHasherDefault::<DefaultHasher>::default().hash_one(name) as usize % self.0.len()
    }
}

/// When each principal was last counted from the store at a limit. Holds only those counted
/// within the last interval.
pub struct Recounts {
    every: Duration,
    at: parking_lot::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

impl Default for Recounts {
    fn default() -> Self {
        Recounts::every(RECOUNT_EVERY)
    }
}

impl Recounts {
    pub fn every(every: Duration) -> Self {
        Recounts {
            every,
            at: Default::default(),
        }
    }

    /// Whether `key` was counted within the interval.
    pub fn recent(&self, key: &str) -> bool {
        let now = std::time::Instant::now();
        let mut at = self.at.lock();
        at.retain(|_, t| now.duration_since(*t) < self.every);
        at.contains_key(key)
    }

    /// Notes that `key` was counted now.
    pub fn counted(&self, key: &str) {
        self.at.lock().insert(key.to_owned(), std::time::Instant::now());
    }
}

/// Bytes in lowercase hex: record keys made of digests and random ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first `len` bytes of `text`'s SHA-256, in hex: a short key part that names `text`
/// (a project's reservations, a task owner's group) whatever characters it holds.
pub fn digest_hex(text: &str, len: usize) -> String {
    hex(&ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref()[..len])
}

/// The records of a listing that read as `T`. One that does not (damaged on disk, or in a
/// layout of a later release) is logged with its key and left out: one bad record must not
/// take a whole listing down, nor what reads it (the webhook supervisor, the console's
/// lists). A read of that record by its key still says it is damaged.
pub fn readable<T: crosstalk_schema::Stored>(listed: Vec<(String, Vec<u8>)>) -> Vec<T> {
    listed
        .into_iter()
        .filter_map(|(key, bytes)| match crosstalk_schema::codec::decode::<T>(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(kind = T::KIND, %key, error = %e, "a stored record is damaged; left out of the listing");
                None
            }
        })
        .collect()
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<InvalidInput> for OpError {
    fn from(e: InvalidInput) -> Self {
        OpError::invalid(e.to_string())
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        RelayError::Store(e).into()
    }
}

impl From<RelayError> for OpError {
    fn from(e: RelayError) -> Self {
        match e {
            RelayError::Invalid(e) => e.into(),
            RelayError::Store(StoreError::Corrupt(e)) => {
                tracing::error!(error = %e, "stored data is damaged");
                OpError::new(ErrorKind::Storage, format!("stored data is damaged: {e}"))
            }
            RelayError::Store(StoreError::Io(e)) => OpError::new(
                ErrorKind::StoreUnavailable,
                format!("the relay's store failed ({e}); nothing was acknowledged. Retry shortly."),
            ),
            RelayError::StoreUnavailable(why) => OpError::new(
                ErrorKind::StoreUnavailable,
                format!("{why}; nothing was acknowledged. Retry shortly."),
            ),
            RelayError::Unavailable(why) => OpError::new(
                ErrorKind::Unavailable,
                format!("the relay is busy or stopping ({why}); try again shortly"),
            ),
            RelayError::ShuttingDown => OpError::new(ErrorKind::ShuttingDown, "the relay is shutting down"),
            RelayError::Forbidden(m) => OpError::new(ErrorKind::Forbidden, m),
            RelayError::LimitReached(m) => OpError::new(ErrorKind::LimitReached, m),
            RelayError::Conflict(m) => OpError::new(ErrorKind::Conflict, m),
            RelayError::NotFound(m) => OpError::new(ErrorKind::NotFound, m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crosstalk_actors::sled_store::SledStore;
    use crosstalk_actors::{Relay, RelayConfig, WaitOptions};

    /// A parked wait is held for minutes, thousands at a time, so the operation's future must
    /// be the relay's wait and little else: no second copy of the caller, the request or the
    /// options at each layer, as an `async fn` wrapper keeps (docs/benchmarks.md, "10,000 waiters").
    #[actix_rt::test]
    async fn a_parked_wait_is_the_relays_wait_and_little_else() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SledStore::open(dir.path()).unwrap());
        let (relay, _) = Relay::start(store, RelayConfig::default()).unwrap();
        // The relay's actors start on their first poll; let them, before the runtime ends.
        tokio::task::yield_now().await;
        let cx = Ctx::new(relay.clone());
        let caller = Caller {
            principal: Principal::Anyone,
            session: None,
            bound: None,
            bound_only: true,
            policy: FacePolicy {
                agents: false,
                default_limit: 100,
                wait_cap: Duration::from_secs(60),
            },
        };
        let request = messages::WaitRequest {
            channel: channel("parked").unwrap(),
            since_id: 0,
            limit: None,
            timeout_s: Some(1.0),
            instance_id: None,
            role: Default::default(),
            exclude_self: None,
        };
        let relays = std::mem::size_of_val(&relay.wait(channel("parked").unwrap(), WaitOptions::default()));
        let ours = std::mem::size_of_val(&call::<messages::Wait>("rest", &cx, caller, request));
        eprintln!("the relay's wait: {relays} B; the operation's: {ours} B");
        assert!(
            ours <= relays + 128,
            "a wait's future is {ours} bytes around the relay's {relays}: more than its answer needs"
        );
    }

    /// A token at its limit of shared keys has every token's keys listed at most once per
    /// interval: one asking in a loop was a listing a request. Between two askings it is
    /// refused by this node's count, and once the interval is over a place given back is
    /// found again.
    #[tokio::test]
    async fn a_token_at_its_limit_has_the_store_asked_at_most_once_an_interval() {
        let kept = Kept::asking_at_most_every(1, Duration::from_millis(300));
        let alice = Principal::Participant("alice".into());
        let asked = AtomicUsize::new(0);
        let gone = std::sync::atomic::AtomicBool::new(false);
        let still = |names: Vec<String>| {
            asked.fetch_add(1, Ordering::SeqCst);
            let gone = gone.load(Ordering::SeqCst);
            async move { Ok(names.into_iter().filter(|_| !gone).collect()) }
        };
        let refused = |max| format!("at most {max}");
        assert!(kept.admit(&alice, "k1", still, refused).await.unwrap());
        for k in ["k2", "k3", "k4"] {
            let e = kept.admit(&alice, k, still, refused).await.unwrap_err();
            assert_eq!(e.kind, ErrorKind::LimitReached);
        }
        assert_eq!(asked.load(Ordering::SeqCst), 1, "asked once for three refusals");
        // k1 deleted by someone else: found at the next asking, not before.
        gone.store(true, Ordering::SeqCst);
        assert!(kept.admit(&alice, "k5", still, refused).await.is_err());
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(kept.admit(&alice, "k5", still, refused).await.unwrap());
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        // Without spacing (reservations: asking reads only what the token holds), every
        // refusal asks.
        let plain = Kept::new(1);
        assert!(plain.admit(&alice, "r1", still, refused).await.unwrap());
        gone.store(false, Ordering::SeqCst);
        for r in ["r2", "r3"] {
            assert!(plain.admit(&alice, r, still, refused).await.is_err());
        }
        assert_eq!(asked.load(Ordering::SeqCst), 4);
    }

    /// One name's steps go one at a time; a name on another stripe goes beside them.
    #[tokio::test]
    async fn a_names_lock_is_one_at_a_time_and_another_name_goes_beside_it() {
        let stripes = Stripes::default();
        let held = stripes.lock("alice").await;
        let wait = Duration::from_millis(50);
        assert!(
            tokio::time::timeout(wait, stripes.lock("alice")).await.is_err(),
            "alice waits"
        );
        let bob = (0..)
            .map(|i| format!("bob-{i}"))
            .find(|b| stripes.stripe(b) != stripes.stripe("alice"))
            .unwrap();
        assert!(
            tokio::time::timeout(wait, stripes.lock(&bob)).await.is_ok(),
            "{bob} does not"
        );
        drop(held);
        assert!(
            tokio::time::timeout(wait, stripes.lock("alice")).await.is_ok(),
            "alice's turn"
        );
    }

    #[test]
    fn limits_are_checked_when_deserialized() {
        let limit = |json: &str| serde_json::from_str::<Option<Limit>>(json).map(|l| Limit::or(l, 100));
        assert_eq!(limit("null").unwrap(), 100);
        assert_eq!(limit("1").unwrap(), 1);
        assert_eq!(limit(&Limit::MAX.to_string()).unwrap(), Limit::MAX);
        for bad in [0, Limit::MAX + 1] {
            let e = limit(&bad.to_string()).unwrap_err().to_string();
            assert!(e.contains(&format!("out of range: use 1 to {}", Limit::MAX)), "{e}");
        }
        assert!(limit("-1").is_err());
    }
}
