//! The seam between the actors and the other nodes a relay may share its state with. The
//! actors call [`Cluster`] and nothing else for it; two implementations are chosen once, at
//! start-up: [`Embedded`], a relay on its own (its sled store is the whole truth), and
//! [`crate::nats::NatsCluster`], a node of a cluster sharing one NATS JetStream stream and its
//! key-value buckets. Every node keeps its own [`crate::store::EventStore`] either way: on a
//! cluster it is the node's copy of the shared log, folded in the log's order.
//!
//! The other way round, what a cluster hands back to this node (events to fold, identities,
//! cursors, presence and waits heard on other nodes) arrives through [`Node`], which the relay
//! implements: an implementation of the seam never names an actor.
//!
//! Invariants, whichever implementation runs:
//! - a channel's events are folded by one rule ([`crate::channel`]), in the order
//!   [`Cluster::sequence`] gives them: on a cluster the fold alone decides what an event means,
//!   so every node reaches the same state;
//! - what the seam answers as done is durable where the implementation keeps it (this node's
//!   store, or a majority of JetStream's replicas).

use crate::error::RelayError;
use crate::presence::{Outgoing, PresenceChange};
pub use crate::proposals::Proposals;
use crate::records::RecordStore;
use crate::shared::SharedDataStore;
use crate::store::{EventStore, Space, StoreError};
use crosstalk_schema::{ChannelName, ChannelState, CutState, Instance, Record};
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One message of a shared log: a channel's events that one node appended together, as the
/// fold receives them.
#[derive(Debug, Clone)]
pub struct LogEvent {
    /// The message's position in the log (not an event's id: a message holds several).
    pub seq: u64,
    pub channel: ChannelName,
    /// Its events, in the order their ids give.
    pub entries: Vec<LogEntry>,
}

/// One event of a channel in the shared log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// The event's id, from its place in the log; increasing within the log.
    pub id: u64,
    pub record: Record,
    /// The post's idempotency key, if it had one.
    pub idempotency_key: Option<String>,
}

/// Who puts a channel's next event in order.
pub enum Sequenced {
    /// This node: the channel folds it now, under the next id of the node's own allocator.
    Here,
    /// The shared log: the event's id once the log has it (appended with any other events of
    /// the channel this node was putting in order at the time). The event comes back to every
    /// node's fold, in the log's order ([`Node::apply`]).
    Log(BoxFuture<'static, Result<u64, RelayError>>),
}

/// A registered identity as the nodes share it: its binding to a session, and when it was
/// last heard from on any node (µs since the epoch; negative: signed off at that time).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Registration {
    pub instance: Instance,
    pub session: Option<String>,
    pub seen: i64,
}

// It embeds `Instance`: a new layout of that is a new layout of this.
crosstalk_schema::stored!(Registration => "cluster registration");

/// A read cursor as another node moved it; `id: None` when it was removed (the identity left).
#[derive(Debug, Clone)]
pub struct CursorChange {
    pub who: String,
    pub channel: ChannelName,
    pub id: Option<u64>,
}

/// What claiming an inbox range ([`CursorSharing::claim_cursor`]) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The range is this caller's, to hand out once the claims are settled
    /// ([`CursorSharing::settle_claims`]).
    Claimed,
    /// The shared cursor is at `at` instead (another node's inbox moved it first).
    Elsewhere(u64),
    /// The identity left the channel.
    Left,
}

/// One channel's log as the store implementation keeps it: who puts the channel's events in
/// order, how long a batch may wait for the store, what a refused batch means, and how
/// retention takes effect. [`Cluster::channel_log`] gives each channel actor its own, and the
/// actor asks it rather than which store it runs on. The defaults are a log of the channel's
/// own on this node ([`OwnLog`]); a copy of a shared log overrides them.
pub trait ChannelLog: Send + 'static {
    /// Puts `record`, a new event of the channel, in order.
    fn sequence(&self, record: &Record, idempotency_key: Option<&str>) -> Sequenced;

    /// How long a batch may wait for the store before it is given up (answered with an
    /// error). A log of the channel's own gives up soon ([`crate::commit::COMMIT_TIMEOUT`]).
    fn commit_deadline(&self) -> Duration {
        crate::commit::COMMIT_TIMEOUT
    }

    /// This node's store refused a batch of the channel's events. Returns only if the relay can
    /// go on without them (the batch's writers are told it failed), as it can with a log of
    /// its own.
    fn refused_batch(&self, _error: &StoreError) {}

    /// Whether retention passes run on a channel that has no policy of its own.
    fn trims_without_policy(&self) -> bool {
        false
    }

    /// What a retention pass does on the store thread, or `None` if nothing is due. `policy`:
    /// whether the channel's own policy may reach anything; `state`: the committed state. A log
    /// of its own removes what the policy reaches.
    fn trim_pass(&self, policy: bool, _state: &ChannelState) -> Option<TrimStep> {
        let remove: TrimStep = Box::new(|_, _, upto| {
            Ok(TrimPlan {
                remove: upto,
                ..TrimPlan::default()
            })
        });
        policy.then_some(remove)
    }

    /// A pass's outcome, back on the actor: `plan` as the step made it, `removed` how far the
    /// store removed and how many events, and how far the channel's logged cuts reach now.
    fn trimmed(&mut self, _plan: TrimPlan, _removed: Option<(u64, usize)>, _trimmed_through: u64) -> TrimNext {
        TrimNext::default()
    }

    /// Records `cut`, the state of the channel right after a logged retention cut as this
    /// node computed it, for nodes that will not fold what the cut removed.
    fn publish_cut(&self, _cut: CutState) -> BoxFuture<'static, Result<(), RelayError>> {
        ready(Ok(()))
    }

    /// The cut through `through` was recorded ([`ChannelLog::publish_cut`]).
    fn cut_published(&mut self, _through: u64) {}

    /// A cut of this node's is on its way to the log (`true`), or no longer (`false`).
    fn proposing(&mut self, _busy: bool) {}

    /// The channel started from a logged cut through `through` ([`crate::channel::Install`]).
    fn installed(&mut self, _through: u64) {}

    /// Writes proposed to a shared log and waiting for the fold; `None` where events are put
    /// in order here.
    fn proposals(&mut self) -> Option<&mut Proposals> {
        None
    }
}

/// What a retention pass does on the store thread, once the channel's own policy has found how
/// far it reaches (the `u64`, an event id; 0: nowhere).
pub type TrimStep = Box<dyn FnOnce(&dyn EventStore, &ChannelName, u64) -> Result<TrimPlan, StoreError> + Send>;

/// What a retention pass decided on the store thread.
#[derive(Debug, Default)]
pub struct TrimPlan {
    /// Remove the channel's events up to this id now (0: none).
    pub remove: u64,
    /// A cut to propose to the shared log (0: none).
    pub propose: u64,
    /// The state after the log's last cut, once this copy has carried it that far.
    pub cut: Option<CutState>,
}

/// What the channel does after a retention pass.
#[derive(Debug, Default)]
pub struct TrimNext {
    /// Record this state after a logged cut ([`ChannelLog::publish_cut`]).
    pub publish: Option<CutState>,
    /// Propose a cut through this id to the log, as a [`Record::Trimmed`] event.
    pub propose: Option<u64>,
}

/// A channel's log of its own on this node: this node puts its events in order, and retention
/// removes what the channel's policy reaches.
#[derive(Debug, Default, Clone, Copy)]
pub struct OwnLog;

impl ChannelLog for OwnLog {
    fn sequence(&self, _: &Record, _: Option<&str>) -> Sequenced {
        Sequenced::Here
    }
}

/// Where a relay keeps its state, and what it shares with the other nodes it runs with, if
/// any. See the module's doc. Its roles are traits of their own ([`CursorSharing`],
/// [`RegistrationSharing`], [`WaitSharing`]); their defaults are a relay on its own.
pub trait Cluster: CursorSharing + RegistrationSharing + WaitSharing + Send + Sync + 'static {
    /// Checks that `store` suits this way of running, and records it: a cluster node's store is
    /// its copy of one stream, which a relay on its own must not write (its ids would collide
    /// with the stream's), and a relay's own store cannot become a node's copy. Returns
    /// whether the store was already this cluster's copy.
    fn claim_store(&self, store: &dyn EventStore) -> Result<bool, RelayError>;

    /// Why writes are refused now, if they are.
    fn health(&self) -> Result<(), String>;

    /// Why this node should not be sent requests yet, if it should not: on a shared log, until
    /// its store holds what the log held when the node began to follow it (a node that joins,
    /// or comes back, folds the log first; a post sent to it meanwhile waits behind that).
    /// Writes are not refused for it; `/healthz` says it, for load balancers.
    fn readiness(&self) -> Result<(), String> {
        Ok(())
    }

    /// The log of `channel` as this store keeps it; each channel actor asks its own, never
    /// which store it runs on.
    fn channel_log(&self, channel: &ChannelName) -> Box<dyn ChannelLog>;

    /// Where shared data is kept: this node's own (`local` starts it), or the nodes' common
    /// store, taking contents of up to `max_size` bytes.
    fn shared_data(&self, local: &dyn Fn() -> Arc<dyn SharedDataStore>, max_size: usize) -> Arc<dyn SharedDataStore>;

    /// Where OAuth records are kept: this node's own (`local` starts it), or the nodes'
    /// common buckets.
    fn records(&self, local: &dyn Fn() -> Arc<dyn RecordStore>) -> Arc<dyn RecordStore>;

    /// Starts following what the other nodes share, handing it to `node`; the tasks end when
    /// `node`'s shutdown token is cancelled. A relay on its own follows nothing.
    fn start(&self, _node: Arc<dyn Node>) -> Vec<tokio::task::JoinHandle<()>> {
        Vec::new()
    }
}

/// Where read cursors are kept and how an inbox claims what it hands out. The defaults are a
/// relay on its own: the registry's cursors, in this node's store, are the whole truth.
pub trait CursorSharing {
    /// Moves `who`'s cursor on `channel` to `id` on every other node (never back).
    fn advance_cursor(
        &self,
        _who: &str,
        _channel: &ChannelName,
        _id: u64,
    ) -> BoxFuture<'static, Result<(), RelayError>> {
        ready(Ok(()))
    }

    /// Claims what `who`'s inbox hands out of `channel`: the cursor from exactly `from` (0:
    /// none yet) to `to`, so two inboxes never hand out one message twice. On a relay of its
    /// own the claim is the settling move itself.
    fn claim_cursor(
        &self,
        _who: &str,
        _channel: &ChannelName,
        _from: u64,
        _to: u64,
    ) -> BoxFuture<'static, Result<Claim, RelayError>> {
        ready(Ok(Claim::Claimed))
    }

    /// Makes the ranges an inbox claimed (each channel's new cursor) this node's to hand out;
    /// answers once they are, and with an error if they are not (then nothing was handed out,
    /// and the cursors stay). On a relay of its own: the registry's durable move of them all.
    fn settle_claims(
        &self,
        node: Arc<dyn Node>,
        who: &str,
        claimed: Vec<(ChannelName, u64)>,
    ) -> BoxFuture<'static, Result<(), RelayError>> {
        node.move_cursors(who, claimed)
    }

    /// Removes `who`'s cursor on `channel` on every other node.
    fn forget_cursor(&self, _who: &str, _channel: &ChannelName) -> BoxFuture<'static, Result<(), RelayError>> {
        ready(Ok(()))
    }
}

/// Who holds a registered identity. The default is a relay on its own, whose registry decides.
pub trait RegistrationSharing {
    /// Binds `registration`'s id to its session on every node, unless another live session
    /// holds it; answers the registration as the nodes keep it.
    /// (A live binding to a session whose name starts with `take_over` is replaced.)
    fn claim_registration(
        &self,
        registration: Registration,
        _ttl: Duration,
        _take_over: Option<String>,
    ) -> BoxFuture<'static, Result<Registration, RelayError>> {
        ready(Ok(registration))
    }
}

/// Active waits on other nodes, for the mutual-wait release. The default is a relay on its
/// own, where every wait is the channel actor's.
pub trait WaitSharing {
    /// The identities waiting actively on `channel` on other nodes.
    fn waiting_elsewhere(&self, _channel: &ChannelName) -> Vec<String> {
        Vec::new()
    }

    /// Tells the other nodes that `instance` waits actively on `channel` here, or no longer.
    fn publish_wait(&self, _channel: &ChannelName, _instance: &str, _waiting: bool) {}
}

/// What a cluster hands back to this node. The relay implements it; its roles are [`Fold`]
/// (the shared log), [`Members`] (identities, presence and waits heard on other nodes) and
/// [`CursorMoves`].
pub trait Node: Fold + Members + CursorMoves + Send + Sync + 'static {
    /// Cancelled when the relay shuts down.
    fn shutdown(&self) -> CancellationToken;
}

/// The shared log, folded into this node's copy.
pub trait Fold {
    /// This node's store (read only: writes go through [`Fold::write_aux`]).
    fn store(&self) -> Arc<dyn EventStore>;

    /// Writes auxiliary state through the group committer; answers once it is durable.
    fn write_aux(
        &self,
        space: Space,
        writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> BoxFuture<'static, Result<(), StoreError>>;

    /// The last id this node has committed on `channel`.
    fn channel_last_id(&self, channel: &ChannelName) -> Result<u64, RelayError>;

    /// Folds one message of the shared log into its channel, after every earlier one; answers
    /// the last id the fold stored of it, if it stored any. `Err` if the channel could not take
    /// it now (its actor stopped as it arrived: try again).
    fn apply(&self, event: LogEvent) -> BoxFuture<'static, Result<Option<u64>, RelayError>>;

    /// Starts `channel` from `cut`: the log no longer holds the events it removed, and this
    /// node has not folded them all. Answers whether it did (not when the channel was already
    /// past the cut). `Err`: try again.
    fn install(&self, channel: ChannelName, cut: CutState) -> BoxFuture<'static, Result<bool, RelayError>>;
}

/// Identities, presence and waits as the other nodes see them.
pub trait Members {
    /// A registration as the nodes share it.
    fn merge_registration(&self, registration: Registration);

    /// The identities bound on this node heard from since `published` says they were last
    /// published: `(id, session, seen)`.
    fn heard_since(&self, published: &mut HashMap<String, i64>) -> Vec<(String, String, i64)>;

    /// How long a participant stays present without a word.
    fn presence_ttl(&self) -> Duration;

    /// Hands this node's presence changes to `tx`, naming this node `node`.
    fn share_presence(&self, tx: mpsc::UnboundedSender<Outgoing>, node: String);

    /// A change in presence on another node.
    fn merge_presence(&self, change: PresenceChange);

    /// Another node's waits on `channel` changed: look again at whether everyone waits.
    fn check_release(&self, channel: &ChannelName);
}

/// This node's read cursors.
pub trait CursorMoves {
    /// A cursor another node moved or removed.
    fn merge_cursor(&self, change: CursorChange);

    /// Moves `who`'s cursors on this node (each channel to its id); answers once the moves are
    /// durable.
    fn move_cursors(&self, who: &str, moves: Vec<(ChannelName, u64)>) -> BoxFuture<'static, Result<(), RelayError>>;
}

impl std::fmt::Debug for dyn Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cluster")
    }
}

/// A relay on its own: its store is the whole truth, and there is nobody to tell. Its roles are
/// the traits' defaults.
#[derive(Debug, Default, Clone, Copy)]
pub struct Embedded;

fn ready<T: Send + 'static>(value: T) -> BoxFuture<'static, T> {
    Box::pin(std::future::ready(value))
}

impl Cluster for Embedded {
    fn claim_store(&self, store: &dyn EventStore) -> Result<bool, RelayError> {
        claim_store(store, None)
    }

    fn health(&self) -> Result<(), String> {
        Ok(())
    }

    fn channel_log(&self, _: &ChannelName) -> Box<dyn ChannelLog> {
        Box::new(OwnLog)
    }

    fn shared_data(&self, local: &dyn Fn() -> Arc<dyn SharedDataStore>, _: usize) -> Arc<dyn SharedDataStore> {
        local()
    }

    fn records(&self, local: &dyn Fn() -> Arc<dyn RecordStore>) -> Arc<dyn RecordStore> {
        local()
    }
}

impl CursorSharing for Embedded {}
impl RegistrationSharing for Embedded {}
impl WaitSharing for Embedded {}

/// Key (in [`Space::Jobs`]) naming the stream a node's store is a copy of.
const CLAIM_KEY: &[u8] = b"shared-log";

/// [`Cluster::claim_store`] for a relay on its own (`stream: None`) or a copy of `stream`.
pub fn claim_store(store: &dyn EventStore, stream: Option<&str>) -> Result<bool, RelayError> {
    let claimed = store
        .get_aux(Space::Jobs, CLAIM_KEY)?
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    match (claimed.as_deref(), stream) {
        (None, None) => Ok(false),
        (Some(c), Some(s)) if c == s => Ok(true),
        (Some(c), None) => Err(RelayError::Conflict(format!(
            "this data directory is a cluster node's copy of the NATS stream {c}; start it with --store nats://… \
             (or give this relay a data directory of its own)"
        ))),
        (Some(c), Some(s)) => Err(RelayError::Conflict(format!(
            "this data directory is a copy of the NATS stream {c}, not {s}"
        ))),
        (None, Some(s)) => {
            if !store.channels()?.is_empty() {
                return Err(RelayError::Conflict(
                    "this data directory holds a relay's own channels; a cluster node needs an empty data \
                     directory of its own (it fills it from the stream)"
                        .into(),
                ));
            }
            store.put_aux(Space::Jobs, CLAIM_KEY, Some(s.as_bytes()))?;
            store.flush()?;
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push((
                    path.to_string_lossy().into_owned(),
                    std::fs::read_to_string(&path).unwrap(),
                ));
            }
        }
    }

    /// The actors never ask which store they run on: what differs is behaviour the store
    /// implementation owns ([`super::ChannelLog`], [`super::CursorSharing`] and the other
    /// roles). So no actor names an implementation (beyond the relay's default of a relay on
    /// its own), and the embedded implementation's roles are the traits' defaults, not a list
    /// of no-ops of its own.
    #[test]
    fn the_actors_do_not_ask_which_store_they_run_on() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        // Built here, so this file's own text does not count as a use.
        let names = [
            format!("{}Cluster", "Nats"),
            format!("{}Log", "Own"),
            format!("{}log(", "shared_"),
            format!("{}cluster(", "is_"),
        ];
        let mut found = Vec::new();
        for (path, text) in &files {
            let rel = path.strip_prefix(src.to_str().unwrap()).unwrap_or(path);
            if rel.starts_with("/nats") || rel == "/cluster.rs" || rel == "/lib.rs" {
                continue;
            }
            for name in &names {
                if text.contains(name.as_str()) {
                    found.push(format!("{rel} names {name}"));
                }
            }
        }
        assert!(found.is_empty(), "an actor asks which store it runs on: {found:?}");
        let own = std::fs::read_to_string(src.join("cluster.rs")).unwrap();
        for role in ["CursorSharing", "RegistrationSharing", "WaitSharing"] {
            let empty = format!("impl {role} for Embedded {{}}");
            assert!(own.contains(&empty), "the embedded {role} is not the trait's defaults");
        }
    }
}
