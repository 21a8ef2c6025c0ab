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
use crate::records::RecordStore;
use crate::shared::SharedDataStore;
use crate::store::{EventStore, Space, StoreError};
use crosstalk_schema::{ChannelName, CutState, Instance, Record};
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

/// What claiming an inbox range ([`Cluster::claim_cursor`]) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This node alone keeps cursors: the registry's own durable move hands the range out.
    Own,
    /// The nodes' shared cursor moved to the range's end: it is this caller's to hand out.
    Moved,
    /// The shared cursor is at `at` instead (another node's inbox moved it first).
    Elsewhere(u64),
    /// The identity left the channel.
    Left,
}

/// What a relay shares with the other nodes it runs with, if any. See the module's doc.
pub trait Cluster: Send + Sync + 'static {
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

    /// Whether channels are shared with other nodes through a log. Retention is then decided
    /// once, as an event of the log ([`crosstalk_schema::Record::Trimmed`]), so every node
    /// removes the same events and judges later events alike.
    fn shared_log(&self) -> bool;

    /// How long a channel's batch may wait for the store before it is given up (answered with
    /// an error). A relay on its own gives up soon ([`crate::commit::COMMIT_TIMEOUT`]); a
    /// node's copy of a shared log cannot go on without a batch it gave up on, so it waits
    /// longer for a slow store ([`crate::commit::FOLD_COMMIT_TIMEOUT`]).
    fn commit_deadline(&self) -> std::time::Duration {
        crate::commit::COMMIT_TIMEOUT
    }

    /// Records `cut`, the state of `channel` right after a logged retention cut as this node
    /// computed it, for nodes that will not fold what the cut removed; then removes those
    /// events from the shared log.
    fn publish_cut(&self, channel: &ChannelName, cut: CutState) -> BoxFuture<'static, Result<(), RelayError>>;

    /// Puts `record`, a new event of `channel`, in order.
    fn sequence(&self, channel: &ChannelName, record: &Record, idempotency_key: Option<&str>) -> Sequenced;

    /// This node's store refused a batch of `channel`'s events. Returns only if the relay can
    /// go on without them (the batch's writers are told it failed); a node's copy of a shared
    /// log cannot, since a hole in it would never be filled.
    fn refused_batch(&self, channel: &ChannelName, error: &StoreError);

    /// Binds `registration`'s id to its session on every node, unless another live session
    /// holds it; answers the registration as the nodes keep it.
    /// (A live binding to a session whose name starts with `take_over` is replaced.)
    fn claim_registration(
        &self,
        registration: Registration,
        ttl: Duration,
        take_over: Option<String>,
    ) -> BoxFuture<'static, Result<Registration, RelayError>>;

    /// Moves `who`'s cursor on `channel` to `id` on every node (never back).
    fn advance_cursor(&self, who: &str, channel: &ChannelName, id: u64) -> BoxFuture<'static, Result<(), RelayError>>;

    /// Claims what `who`'s inbox hands out of `channel`: the shared cursor from exactly `from`
    /// (0: none yet) to `to`, so two nodes' inboxes never hand out one message twice.
    fn claim_cursor(
        &self,
        who: &str,
        channel: &ChannelName,
        from: u64,
        to: u64,
    ) -> BoxFuture<'static, Result<Claim, RelayError>>;

    /// Removes `who`'s cursor on `channel` on every node.
    fn forget_cursor(&self, who: &str, channel: &ChannelName) -> BoxFuture<'static, Result<(), RelayError>>;

    /// Where shared data is kept: this node's own (`local` starts it), or the nodes' common
    /// store, taking contents of up to `max_size` bytes.
    fn shared_data(&self, local: &dyn Fn() -> Arc<dyn SharedDataStore>, max_size: usize) -> Arc<dyn SharedDataStore>;

    /// Where OAuth records are kept: this node's own (`local` starts it), or the nodes'
    /// common buckets.
    fn records(&self, local: &dyn Fn() -> Arc<dyn RecordStore>) -> Arc<dyn RecordStore>;

    /// The identities waiting actively on `channel` on other nodes (for the mutual-wait
    /// release).
    fn waiting_elsewhere(&self, channel: &ChannelName) -> Vec<String>;

    /// Tells the other nodes that `instance` waits actively on `channel` here, or no longer.
    fn publish_wait(&self, channel: &ChannelName, instance: &str, waiting: bool);

    /// Starts following what the other nodes share, handing it to `node`; the tasks end when
    /// `node`'s shutdown token is cancelled.
    fn start(&self, node: Arc<dyn Node>) -> Vec<tokio::task::JoinHandle<()>>;
}

/// What a cluster hands back to this node. The relay implements it.
pub trait Node: Send + Sync + 'static {
    /// Cancelled when the relay shuts down.
    fn shutdown(&self) -> CancellationToken;

    /// This node's store (read only: writes go through [`Node::write_aux`]).
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

    /// A cursor another node moved or removed.
    fn merge_cursor(&self, change: CursorChange);
}

impl std::fmt::Debug for dyn Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cluster")
    }
}

/// A relay on its own: its store is the whole truth, and there is nobody to tell.
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

    fn shared_log(&self) -> bool {
        false
    }

    fn publish_cut(&self, _: &ChannelName, _: CutState) -> BoxFuture<'static, Result<(), RelayError>> {
        ready(Ok(()))
    }

    fn sequence(&self, _: &ChannelName, _: &Record, _: Option<&str>) -> Sequenced {
        Sequenced::Here
    }

    fn refused_batch(&self, _: &ChannelName, _: &StoreError) {}

    fn claim_registration(
        &self,
        registration: Registration,
        _: Duration,
        _: Option<String>,
    ) -> BoxFuture<'static, Result<Registration, RelayError>> {
        ready(Ok(registration))
    }

    fn advance_cursor(&self, _: &str, _: &ChannelName, _: u64) -> BoxFuture<'static, Result<(), RelayError>> {
        ready(Ok(()))
    }

    fn claim_cursor(&self, _: &str, _: &ChannelName, _: u64, _: u64) -> BoxFuture<'static, Result<Claim, RelayError>> {
        ready(Ok(Claim::Own))
    }

    fn forget_cursor(&self, _: &str, _: &ChannelName) -> BoxFuture<'static, Result<(), RelayError>> {
        ready(Ok(()))
    }

    fn shared_data(&self, local: &dyn Fn() -> Arc<dyn SharedDataStore>, _: usize) -> Arc<dyn SharedDataStore> {
        local()
    }

    fn records(&self, local: &dyn Fn() -> Arc<dyn RecordStore>) -> Arc<dyn RecordStore> {
        local()
    }

    fn waiting_elsewhere(&self, _: &ChannelName) -> Vec<String> {
        Vec::new()
    }

    fn publish_wait(&self, _: &ChannelName, _: &str, _: bool) {}

    fn start(&self, _: Arc<dyn Node>) -> Vec<tokio::task::JoinHandle<()>> {
        Vec::new()
    }
}

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
    /// The actors may not branch on which store they run on: what differs is the store
    /// implementation's behaviour (a method of [`super::Cluster`]). Two places still ask
    /// [`super::Cluster::shared_log`], the retention pass and its start; this holds the line
    /// there, so no new branch is added while they are moved behind the seam.
    #[test]
    fn no_new_actor_branches_on_the_store() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        // Built here, so this file's own text does not count.
        let needle = format!(".{}()", "shared_log");
        let mut found = Vec::new();
        let mut dirs = vec![src.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let calls = text.matches(needle.as_str()).count();
                    if calls > 0 {
                        let rel = path.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
                        found.push((rel, calls));
                    }
                }
            }
        }
        found.sort();
        assert_eq!(
            found,
            [("channel.rs".to_owned(), 1), ("channel/retention.rs".to_owned(), 1)],
            "an actor branches on which store it runs on: make it the store's behaviour instead"
        );
    }
}
