//! Path reservations: an identity reserves paths or globs of a repository (`src/**`,
//! `docs/*.md`) for a while, exclusive or shared, with a reason, optionally within a project.
//! An exclusive reservation that overlaps another holder's is refused, naming each conflict;
//! shared ones coexist. A reservation lapses at its time, can be renewed and released, and is
//! released when its holder goes offline if it asked for that. `crosstalk guard` checks a
//! commit's staged paths against them.
//!
//! The pattern rules are the schema's ([`crosstalk_schema::reservation`]). Every reservation of
//! a project is one record in the small-records seam, and a grant is a compare-and-set of that
//! record: two nodes granting overlapping exclusive reservations at once cannot both win, as
//! the loser reads the winner's and finds the conflict. Changes are announced as a
//! `RESERVATION` message on a channel (`reservations` unless the request names one), so agents
//! waiting there learn of them without polling.
//!
//! Comparing a request's patterns with the project's is counted work (at most
//! [`MAX_WORK`] steps a request, retries included) and runs off the HTTP workers, on a
//! blocking thread, one comparison at a time in the process: a request at the limit takes
//! about a tenth of a second of one core, and however many arrive, the workers keep a core.

use super::{Caller, Ctx, ErrorKind, OpError, Operation, Principal};
use crosstalk_actors::records::{Kind, RecordStore};
use crosstalk_actors::{RelayError, StoreError};
use crosstalk_schema::reservation::{
    self, pattern, Reservation, ReservationSet, TooMuchWork, Work, MAX_PATTERNS, MAX_PROJECT_BYTES, MAX_REASON_BYTES,
    MAX_WORK,
};
use crosstalk_schema::{codec, ChannelName, InvalidInput, MessageType, NewMessage, Timestamp};
use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::Arc;

/// A reservation's time when the request names none, and the longest it may ask for.
pub const DEFAULT_TTL_S: u64 = 3_600;
pub const MAX_TTL_S: u64 = 7 * 86_400;
/// Live reservations one project keeps, and one holder holds in one project (a token of one
/// client holds at most `--max-reservations-per-participant` in all: [`count_against`]).
pub const MAX_PER_PROJECT: usize = 1_000;
pub const MAX_PER_HOLDER: usize = 100;
/// Where changes are announced when the request names no channel.
pub const DEFAULT_CHANNEL: &str = "reservations";
/// The type of the announcing messages.
pub const RESERVATION: &str = "RESERVATION";

fn now_ms() -> i64 {
    Timestamp::now().millis()
}

fn rfc3339(ms: i64) -> String {
    Timestamp::from_millis(ms).to_rfc3339()
}

/// The record a project's reservations live in: a digest of its name, valid as a key on
/// both stores whatever the name holds.
fn project_key(project: &str) -> String {
    if project.is_empty() {
        return "none".into();
    }
    super::digest_hex(project, 12)
}

/// A reservation's id names its project's record: `<record key>.<uuid>`.
fn record_of(id: &str) -> Result<&str, OpError> {
    id.split_once('.')
        .map(|(k, _)| k)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| OpError::not_found(format!("no reservation {id:?}")))
}

/// A reservation as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ReservationView {
    pub id: String,
    pub holder: String,
    pub paths: Vec<String>,
    pub exclusive: bool,
    pub reason: String,
    pub project: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub release_when_offline: bool,
}

impl From<&Reservation> for ReservationView {
    fn from(r: &Reservation) -> Self {
        ReservationView {
            id: r.id.clone(),
            holder: r.holder.clone(),
            paths: r.paths.clone(),
            exclusive: r.exclusive,
            reason: r.reason.clone(),
            project: (!r.project.is_empty()).then(|| r.project.clone()),
            created_at: rfc3339(r.created_ms),
            expires_at: rfc3339(r.expires_ms),
            release_when_offline: r.release_when_offline,
        }
    }
}

/// Reservations in the store, with the rules that need the store.
struct Store {
    records: Arc<dyn RecordStore>,
}

fn damaged(e: impl std::fmt::Display) -> RelayError {
    RelayError::Store(StoreError::Corrupt(format!("stored reservations are damaged: {e}")))
}

impl Store {
    fn new(cx: &Ctx) -> Self {
        Store {
            records: cx.relay.records(),
        }
    }

    async fn read(&self, key: &str) -> Result<(ReservationSet, Option<Vec<u8>>), RelayError> {
        match self.records.get(Kind::Reservations, key.to_owned()).await? {
            Some(bytes) => Ok((codec::decode(&bytes).map_err(damaged)?, Some(bytes))),
            None => Ok((ReservationSet::default(), None)),
        }
    }

    /// Changes one project's record with `change`, which sees its live reservations; retried
    /// while another writer comes first. `change` answers what to report, and whether to write.
    async fn update<T>(
        &self,
        cx: &Ctx,
        key: &str,
        mut change: impl FnMut(&mut Vec<Reservation>, i64) -> Result<(T, bool), OpError>,
    ) -> Result<T, OpError> {
        self.update_with(cx, key, |mut items, now| {
            let changed = change(&mut items, now);
            async move {
                let (answer, write) = changed?;
                Ok((answer, write.then_some(items)))
            }
        })
        .await
    }

    /// [`Store::update`] with a `change` that may wait (for work done elsewhere): it takes the
    /// live reservations and answers what to report, and the reservations to write, if any.
    async fn update_with<T, F>(
        &self,
        cx: &Ctx,
        key: &str,
        mut change: impl FnMut(Vec<Reservation>, i64) -> F,
    ) -> Result<T, OpError>
    where
        F: Future<Output = Result<(T, Option<Vec<Reservation>>), OpError>>,
    {
        for _ in 0..16 {
            let (set, bytes) = self.read(key).await?;
            let now = now_ms();
            let items: Vec<Reservation> = set.items.into_iter().filter(|r| live(cx, r, now)).collect();
            let (answer, write) = change(items, now).await?;
            let Some(items) = write else {
                return Ok(answer);
            };
            let new = (!items.is_empty()).then(|| codec::encode(&ReservationSet { items }));
            if self
                .records
                .swap(Kind::Reservations, key.to_owned(), bytes, new)
                .await?
            {
                return Ok(answer);
            }
        }
        Err(OpError::new(
            ErrorKind::Unavailable,
            "reservations kept changing under this request; try again",
        ))
    }

    /// Every live reservation, of one project or all.
    async fn list(&self, cx: &Ctx, project: Option<&str>) -> Result<Vec<Reservation>, OpError> {
        let now = now_ms();
        let sets: Vec<ReservationSet> = match project {
            Some(p) => vec![self.read(&project_key(p)).await?.0],
            None => super::readable(self.records.list(Kind::Reservations).await?),
        };
        let mut all: Vec<Reservation> = sets
            .into_iter()
            .flat_map(|s| s.items)
            .filter(|r| live(cx, r, now))
            .collect();
        all.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then_with(|| a.id.cmp(&b.id)));
        Ok(all)
    }
}

/// Counts reservation `id` against the caller's token, if it is one client's
/// (`--max-reservations-per-participant`, across every project): `true` if it was counted
/// now, and must be forgotten if the reservation is not made. At the limit by this node's
/// count, the projects of the token's reservations are read again first, so that those
/// released, lapsed or gone with their holder give their place back.
async fn count_against(cx: &Ctx, principal: &Principal, id: &str) -> Result<bool, OpError> {
    let still = |names: Vec<String>| async move {
        let records: std::collections::BTreeSet<&str> = names.iter().filter_map(|n| record_of(n).ok()).collect();
        let (store, now) = (Store::new(cx), now_ms());
        let mut still = std::collections::HashSet::new();
        for record in records {
            let (set, _) = store.read(record).await?;
            still.extend(set.items.into_iter().filter(|r| live(cx, r, now)).map(|r| r.id));
        }
        Ok(still)
    };
    cx.reservations_kept
        .admit(principal, id, still, |max| {
            format!(
                "this token holds {max} reservations, the most one token may (--max-reservations-per-participant); \
                 release some"
            )
        })
        .await
}

/// Held now: not past its time, and its holder online if it asked to be released otherwise.
fn live(cx: &Ctx, r: &Reservation, now: i64) -> bool {
    r.expires_ms > now && (!r.release_when_offline || cx.relay.online(&r.holder) == Some(true))
}

/// Announces a change on the reservation's channel, as its holder. An announcement that
/// cannot be posted does not undo the change (it is logged).
async fn announce(cx: &Ctx, channel: &ChannelName, holder: &str, text: String) {
    let message = NewMessage {
        sender: holder.to_owned(),
        kind: Some(MessageType::stored(RESERVATION.to_owned())),
        body: text,
        ..Default::default()
    };
    if let Err(e) = cx.relay.post(channel, message).await {
        tracing::warn!(channel = %channel, error = %e, "a reservation's announcement was not posted");
    }
}

fn describe(r: &Reservation) -> String {
    let project = if r.project.is_empty() {
        String::new()
    } else {
        format!(" in {}", r.project)
    };
    format!(
        "{} ({}{}, until {}): {} [{}]",
        r.paths.join(", "),
        if r.exclusive { "exclusive" } else { "shared" },
        project,
        rfc3339(r.expires_ms),
        if r.reason.is_empty() {
            "no reason given"
        } else {
            &r.reason
        },
        r.id
    )
}

fn ttl(requested: Option<u64>) -> Result<i64, OpError> {
    match requested.unwrap_or(DEFAULT_TTL_S) {
        0 => Err(OpError::invalid("ttl_s must be at least 1")),
        t if t > MAX_TTL_S => Err(OpError::invalid(format!("ttl_s must be at most {MAX_TTL_S} (7 days)"))),
        t => Ok(t as i64 * 1_000),
    }
}

fn announce_on(channel: Option<ChannelName>) -> Result<ChannelName, OpError> {
    match channel {
        Some(c) => Ok(c),
        None => Ok(ChannelName::parse(DEFAULT_CHANNEL)?),
    }
}

// ---- reserve

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReserveRequest {
    /// Who holds it (default: your own identity).
    pub holder: Option<String>,
    /// Paths or globs relative to the repository root: src/**, docs/*.md, a/b.rs.
    pub paths: Vec<String>,
    /// Exclusive (default) or shared.
    #[serde(default = "yes")]
    pub exclusive: bool,
    /// Seconds it lasts (default 3600, at most 7 days).
    pub ttl_s: Option<u64>,
    /// Why, for the others.
    #[serde(default)]
    pub reason: String,
    /// A repository's name or remote.
    pub project: Option<String>,
    /// Release it when you go offline.
    #[serde(default)]
    pub release_when_offline: bool,
    /// Where changes are announced (default reservations).
    pub channel: Option<ChannelName>,
}

fn yes() -> bool {
    true
}

/// Another holder's reservation that stands in the way.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Conflict {
    pub id: String,
    pub holder: String,
    /// Its patterns that overlap the request's.
    pub paths: Vec<String>,
    pub exclusive: bool,
    pub expires_at: String,
    pub reason: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Reserved {
    pub granted: bool,
    /// The reservation's id, when granted.
    pub id: Option<String>,
    pub reservation: Option<ReservationView>,
    /// What stands in the way, when refused.
    pub conflicts: Vec<Conflict>,
}

pub struct Reserve;

impl Operation for Reserve {
    const NAME: &'static str = "reserve_paths";
    const DESCRIPTION: &'static str =
        "Reserve paths or globs (src/**) for ttl_s, exclusive or shared; granted: false names \
        each conflict (holder, paths, expiry).";
    const READ_ONLY: bool = false;
    type Request = ReserveRequest;
    type Response = Reserved;

    async fn run(cx: &Ctx, caller: Caller, r: ReserveRequest) -> Result<Reserved, OpError> {
        let holder = caller.identity(cx, r.holder.as_deref())?;
        if r.paths.is_empty() {
            return Err(InvalidInput::Missing { field: "paths" }.into());
        }
        if r.paths.len() > MAX_PATTERNS {
            return Err(OpError::invalid(format!(
                "at most {MAX_PATTERNS} paths in one reservation"
            )));
        }
        let mut paths = Vec::with_capacity(r.paths.len());
        for p in &r.paths {
            let p = pattern(p)?;
            // Patterns are compared without regard to case: `src/a.rs` and `SRC/A.RS` are one.
            if !paths.iter().any(|q: &String| reservation::same_pattern(q, &p)) {
                paths.push(p);
            }
        }
        if r.reason.len() > MAX_REASON_BYTES {
            return Err(InvalidInput::TooLong {
                field: "reason",
                len: r.reason.len(),
                max: MAX_REASON_BYTES,
            }
            .into());
        }
        let project = r.project.as_deref().map(str::trim).unwrap_or_default().to_owned();
        if project.len() > MAX_PROJECT_BYTES {
            return Err(InvalidInput::TooLong {
                field: "project",
                len: project.len(),
                max: MAX_PROJECT_BYTES,
            }
            .into());
        }
        if r.release_when_offline && cx.relay.online(&holder) != Some(true) {
            return Err(OpError::invalid(format!(
                "release_when_offline needs {holder:?} online: register first (and stay connected)"
            )));
        }
        let ttl = ttl(r.ttl_s)?;
        let channel = announce_on(r.channel)?;
        let key = project_key(&project);
        let id = format!("{key}.{}", uuid::Uuid::new_v4().simple());
        let counted = count_against(cx, &caller.principal, &id).await?;
        // Shared by every try, so retries spend from one budget.
        let work = Arc::new(Mutex::new(Work::new(MAX_WORK)));
        let answer = Store::new(cx)
            .update_with(cx, &key, |items, now| {
                let wanted = Reservation {
                    id: id.clone(),
                    holder: holder.clone(),
                    paths: paths.clone(),
                    exclusive: r.exclusive,
                    reason: r.reason.clone(),
                    project: project.clone(),
                    created_ms: now,
                    expires_ms: now + ttl,
                    release_when_offline: r.release_when_offline,
                };
                let (work, holder, id) = (work.clone(), holder.clone(), id.clone());
                async move {
                    let (conflicts, mut items, wanted) = check(wanted, items, work).await?;
                    if !conflicts.is_empty() {
                        let refused = Reserved {
                            granted: false,
                            id: None,
                            reservation: None,
                            conflicts,
                        };
                        return Ok(((refused, None), None));
                    }
                    if items.len() >= MAX_PER_PROJECT {
                        return Err(OpError::new(
                            ErrorKind::LimitReached,
                            format!("this project already has {MAX_PER_PROJECT} reservations; release some"),
                        ));
                    }
                    if items.iter().filter(|o| o.holder == holder).count() >= MAX_PER_HOLDER {
                        return Err(OpError::new(
                            ErrorKind::LimitReached,
                            format!("{holder:?} already holds {MAX_PER_HOLDER} reservations here; release some"),
                        ));
                    }
                    let view = ReservationView::from(&wanted);
                    let text = format!("reserved {}", describe(&wanted));
                    items.push(wanted);
                    let granted = Reserved {
                        granted: true,
                        id: Some(id),
                        reservation: Some(view),
                        conflicts: Vec::new(),
                    };
                    Ok(((granted, Some(text)), Some(items)))
                }
            })
            .await;
        let granted = matches!(&answer, Ok((_, Some(_))));
        if counted && !granted {
            cx.reservations_kept.forget(caller.principal.key(), &id);
        }
        let (answer, granted) = answer?;
        if let Some(text) = granted {
            announce(cx, &channel, &holder, text).await;
        }
        Ok(answer)
    }
}

/// Comparisons of patterns running in this process: one at a time, so that however many
/// requests compare at once they take at most one core from the HTTP workers.
static COMPARING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// What in `items` stands in the way of `wanted`, compared on a blocking thread within
/// `work`; `items` and `wanted` are handed back for the write. A comparison beyond the budget
/// refuses the request (429): nothing is stored.
async fn check(
    wanted: Reservation,
    items: Vec<Reservation>,
    work: Arc<Mutex<Work>>,
) -> Result<(Vec<Conflict>, Vec<Reservation>, Reservation), OpError> {
    let turn = COMPARING
        .acquire()
        .await
        .map_err(|_| OpError::new(ErrorKind::ShuttingDown, "the relay is shutting down"))?;
    let compared = tokio::task::spawn_blocking(move || {
        // Held by the comparison, not the request: a client that goes away does not free
        // the turn of a comparison still running.
        let _turn = turn;
        let found = reservation::conflicts(&wanted, &items, &mut work.lock()).map(|found| {
            found
                .into_iter()
                .map(|(o, paths)| Conflict {
                    id: o.id.clone(),
                    holder: o.holder.clone(),
                    paths: paths.into_iter().map(str::to_owned).collect(),
                    exclusive: o.exclusive,
                    expires_at: rfc3339(o.expires_ms),
                    reason: o.reason.clone(),
                })
                .collect()
        });
        (found, items, wanted)
    })
    .await
    .map_err(|e| OpError::new(ErrorKind::Unavailable, format!("comparing reservations failed: {e}")))?;
    match compared {
        (Ok(conflicts), items, wanted) => Ok((conflicts, items, wanted)),
        (Err(TooMuchWork), items, wanted) => Err(OpError::new(
            ErrorKind::LimitReached,
            format!(
                "comparing these {} patterns with the {} held in this project takes more than {MAX_WORK} steps, \
                 the most one request may: reserve fewer or more specific patterns (fewer wildcards, a literal \
                 directory first)",
                wanted.paths.len(),
                items.iter().map(|r| r.paths.len()).sum::<usize>(),
            ),
        )),
    }
}

// ---- list

#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ListReservationsRequest {
    /// Only this project's.
    pub project: Option<String>,
    /// Only this holder's.
    pub holder: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReservationList {
    pub reservations: Vec<ReservationView>,
}

pub struct ListReservations;

impl Operation for ListReservations {
    const NAME: &'static str = "list_reservations";
    const DESCRIPTION: &'static str = "Who holds which paths now (of a project, or a holder).";
    const READ_ONLY: bool = true;
    type Request = ListReservationsRequest;
    type Response = ReservationList;

    async fn run(cx: &Ctx, _: Caller, r: ListReservationsRequest) -> Result<ReservationList, OpError> {
        let project = r.project.as_deref().map(str::trim);
        let all = Store::new(cx).list(cx, project).await?;
        let holder = r.holder.as_deref().map(str::trim).filter(|h| !h.is_empty());
        Ok(ReservationList {
            reservations: all
                .iter()
                .filter(|x| holder.is_none_or(|h| x.holder == h))
                .map(ReservationView::from)
                .collect(),
        })
    }
}

// ---- renew, release

/// Where reservation `id` is among `items`, if `holder` holds it: only the holder may renew or
/// release one.
fn held(items: &[Reservation], id: &str, holder: &str) -> Result<usize, OpError> {
    let at = items
        .iter()
        .position(|x| x.id == id)
        .ok_or_else(|| OpError::not_found(format!("no reservation {id:?} (it may have lapsed)")))?;
    if items[at].holder != holder {
        return Err(OpError::forbidden(format!(
            "reservation {id:?} is {:?}'s",
            items[at].holder
        )));
    }
    Ok(at)
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RenewRequest {
    pub id: String,
    /// Seconds from now (default 3600, at most 7 days).
    pub ttl_s: Option<u64>,
    /// The holder (default: your own identity).
    pub holder: Option<String>,
    /// Where the change is announced (default reservations).
    pub channel: Option<ChannelName>,
}

pub struct RenewReservation;

impl Operation for RenewReservation {
    const NAME: &'static str = "renew_reservation";
    const DESCRIPTION: &'static str = "Extend your reservation to ttl_s from now.";
    const READ_ONLY: bool = false;
    type Request = RenewRequest;
    type Response = ReservationView;

    async fn run(cx: &Ctx, caller: Caller, r: RenewRequest) -> Result<ReservationView, OpError> {
        let holder = caller.identity(cx, r.holder.as_deref())?;
        let ttl = ttl(r.ttl_s)?;
        let channel = announce_on(r.channel)?;
        let key = record_of(&r.id)?.to_owned();
        let renewed = Store::new(cx)
            .update(cx, &key, |items, now| {
                let at = held(items, &r.id, &holder)?;
                let found = &mut items[at];
                found.expires_ms = now + ttl;
                Ok((found.clone(), true))
            })
            .await?;
        announce(cx, &channel, &holder, format!("renewed {}", describe(&renewed))).await;
        Ok(ReservationView::from(&renewed))
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReleaseRequest {
    pub id: String,
    /// The holder (default: your own identity).
    pub holder: Option<String>,
    /// Where the change is announced (default reservations).
    pub channel: Option<ChannelName>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Released {
    pub released: bool,
    pub id: String,
}

pub struct ReleaseReservation;

impl Operation for ReleaseReservation {
    const NAME: &'static str = "release_reservation";
    const DESCRIPTION: &'static str = "Release your reservation.";
    const READ_ONLY: bool = false;
    const DESTRUCTIVE: bool = true;
    const IDEMPOTENT: bool = true;
    type Request = ReleaseRequest;
    type Response = Released;

    async fn run(cx: &Ctx, caller: Caller, r: ReleaseRequest) -> Result<Released, OpError> {
        let holder = caller.identity(cx, r.holder.as_deref())?;
        let channel = announce_on(r.channel)?;
        let key = record_of(&r.id)?.to_owned();
        let gone = Store::new(cx)
            .update(cx, &key, |items, _| {
                let at = held(items, &r.id, &holder)?;
                Ok((items.remove(at), true))
            })
            .await?;
        cx.reservations_kept.forget(caller.principal.key(), &r.id);
        announce(cx, &channel, &holder, format!("released {}", describe(&gone))).await;
        Ok(Released {
            released: true,
            id: r.id,
        })
    }
}

// ---- one MCP tool for all four

#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    #[default]
    Reserve,
    Renew,
    Release,
    List,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReservationsRequest {
    #[serde(default)]
    pub action: Action,
    /// Globs: src/**, docs/*.md.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Default true.
    pub exclusive: Option<bool>,
    /// Default 3600.
    pub ttl_s: Option<u64>,
    pub reason: Option<String>,
    pub project: Option<String>,
    pub release_when_offline: Option<bool>,
    /// For renew, release.
    pub id: Option<String>,
    pub holder: Option<String>,
    /// Announced on (default reservations).
    pub channel: Option<ChannelName>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ReservationsAnswer {
    Reserved(Reserved),
    Renewed(ReservationView),
    Released(Released),
    Listed(ReservationList),
}

/// The MCP face's one reservations tool: `tools/list` is in every agent's context, and four
/// tools would cost four descriptions.
pub struct Reservations;

impl Operation for Reservations {
    const NAME: &'static str = "reserve";
    const DESCRIPTION: &'static str = "Reserve paths so agents do not edit the same files. action: reserve (default; \
        granted: false names each conflict), renew, release, list.";
    const READ_ONLY: bool = false;
    type Request = ReservationsRequest;
    type Response = ReservationsAnswer;

    async fn run(cx: &Ctx, caller: Caller, r: ReservationsRequest) -> Result<ReservationsAnswer, OpError> {
        let id = || {
            r.id.clone()
                .ok_or_else(|| OpError::from(InvalidInput::Missing { field: "id" }))
        };
        Ok(match r.action {
            Action::Reserve => ReservationsAnswer::Reserved(
                Reserve::run(
                    cx,
                    caller,
                    ReserveRequest {
                        holder: r.holder,
                        paths: r.paths,
                        exclusive: r.exclusive.unwrap_or(true),
                        ttl_s: r.ttl_s,
                        reason: r.reason.unwrap_or_default(),
                        project: r.project,
                        release_when_offline: r.release_when_offline.unwrap_or(false),
                        channel: r.channel,
                    },
                )
                .await?,
            ),
            Action::Renew => ReservationsAnswer::Renewed(
                RenewReservation::run(
                    cx,
                    caller,
                    RenewRequest {
                        id: id()?,
                        ttl_s: r.ttl_s,
                        holder: r.holder,
                        channel: r.channel,
                    },
                )
                .await?,
            ),
            Action::Release => ReservationsAnswer::Released(
                ReleaseReservation::run(
                    cx,
                    caller,
                    ReleaseRequest {
                        id: id()?,
                        holder: r.holder,
                        channel: r.channel,
                    },
                )
                .await?,
            ),
            Action::List => ReservationsAnswer::Listed(
                ListReservations::run(
                    cx,
                    caller,
                    ListReservationsRequest {
                        project: r.project,
                        holder: r.holder,
                    },
                )
                .await?,
            ),
        })
    }
}
