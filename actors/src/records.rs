//! Where the relay's small records are kept: OAuth's (`crosstalk serve --oauth`: invites,
//! registered clients, authorization codes, grants, the token index), webhooks' (their
//! settings, delivery cursors and state, and which node delivers each), MCP tasks' and path
//! reservations', each a kind of record
//! the caller encodes. One seam, two implementations chosen by the cluster
//! ([`crate::Cluster::records`]): [`Local`], this relay's own store (sled, written through the
//! committer, so a write is answered once it is durable), and on a NATS cluster one key-value
//! bucket per kind (`crate::nats`), so what one node writes every other reads.
//!
//! Keys are hex or plain ids, valid on both stores ([`is_key`]). What the records mean — lifetimes,
//! rotation, leases, who may do what — is the caller's business (the relay's `ops::oauth`
//! and `ops::webhooks`); the seam promises durability, that [`RecordStore::take`] hands a
//! record to one caller however many race for it, and that [`RecordStore::swap`] changes a
//! record only if it is as the caller last saw it — on one node or several.

use crate::commit::Committer;
use crate::error::RelayError;
use crate::store::{EventStore, Space};
use futures_util::future::BoxFuture;
use std::sync::Arc;

/// The kinds of record, each a key space of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Invite codes not yet used, by the hash of the code.
    Invites,
    /// Dynamically registered clients, by client id.
    Clients,
    /// Authorization codes not yet exchanged, by the hash of the code.
    Codes,
    /// Grants (one consent each), by grant id.
    Grants,
    /// Access and refresh tokens, by the hash of the token: which grant each belongs to.
    Tokens,
    /// Webhooks' settings, by id.
    Webhooks,
    /// Webhooks' delivery: the last message delivered, the failure state, and the node
    /// holding the delivery lease, by webhook id.
    Deliveries,
    /// MCP tasks (waits that outlive a tool call), by task id.
    Tasks,
    /// Path reservations, one record per project (every reservation of it).
    Reservations,
    Wake,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Invites,
        Kind::Clients,
        Kind::Codes,
        Kind::Grants,
        Kind::Tokens,
        Kind::Webhooks,
        Kind::Deliveries,
        Kind::Tasks,
        Kind::Reservations,
        Kind::Wake,
    ];

    /// The one-byte prefix of its keys in a relay's own store, and its bucket's suffix on a
    /// cluster.
    pub fn tag(self) -> (u8, &'static str) {
        match self {
            Kind::Invites => (b'i', "OAUTH_INVITES"),
            Kind::Clients => (b'c', "OAUTH_CLIENTS"),
            Kind::Codes => (b'a', "OAUTH_CODES"),
            Kind::Grants => (b'g', "OAUTH_GRANTS"),
            Kind::Tokens => (b't', "OAUTH_TOKENS"),
            Kind::Webhooks => (b'w', "WEBHOOKS"),
            Kind::Deliveries => (b'd', "WEBHOOK_DELIVERIES"),
            Kind::Tasks => (b'k', "MCP_TASKS"),
            Kind::Reservations => (b'r', "RESERVATIONS"),
            Kind::Wake => (b'z', "WAKE"),
        }
    }
}

pub type Answer<T> = BoxFuture<'static, Result<T, RelayError>>;

/// OAuth records, durable where the implementation keeps them.
pub trait RecordStore: Send + Sync + 'static {
    fn get(&self, kind: Kind, key: String) -> Answer<Option<Vec<u8>>>;
    /// Writes (or overwrites) a record; answers once it is durable.
    fn put(&self, kind: Kind, key: String, value: Vec<u8>) -> Answer<()>;
    fn delete(&self, kind: Kind, key: String) -> Answer<()>;
    /// Removes the record and answers it: of several callers racing for one record, on this
    /// node or others, exactly one gets it (a single-use invite or code).
    fn take(&self, kind: Kind, key: String) -> Answer<Option<Vec<u8>>>;
    /// Every record of a kind.
    fn list(&self, kind: Kind) -> Answer<Vec<(String, Vec<u8>)>>;
    /// The records of a kind in `group`: those whose key is `<group>.<rest>`. What one
    /// owner's records cost to list, whatever every other owner holds. A group that is not
    /// one part of a key (empty, or holding a `.` or a character no key has) holds none.
    fn list_group(&self, kind: Kind, group: String) -> Answer<Vec<(String, Vec<u8>)>>;
    /// The records of a kind whose keys sort after `after` (from the first when `None`), in
    /// key order, at most `max`: a listing in pages, for what must read every record however
    /// many there are (a sweep), where [`RecordStore::list`] stops at [`MAX_LISTED`]. A page
    /// shorter than `max` is the last.
    fn list_after(&self, kind: Kind, after: Option<String>, max: usize) -> Answer<Vec<(String, Vec<u8>)>>;
    /// Writes `new` (`None`: deletes) if the record is still `expected` (`None`: absent);
    /// `false` if it was not (another writer came first). A lease's compare-and-set.
    fn swap(&self, kind: Kind, key: String, expected: Option<Vec<u8>>, new: Option<Vec<u8>>) -> Answer<bool>;
    /// A number that changes whenever a record of the kind changes, for a reader that looks
    /// for changes often to skip a listing that would find none; `None` where the store has
    /// none to give cheaply (a relay's own store, where a listing is cheap anyway).
    fn version(&self, _kind: Kind) -> Answer<Option<u64>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// Most records a listing reads: a bound on what `crosstalk clients` costs.
pub const MAX_LISTED: usize = 100_000;

/// A relay's own OAuth records, in [`Space::Records`] of its store. Changes are serialised on
/// one lock, so a `take` is atomic on this node (the only one).
#[derive(Clone)]
pub struct Local {
    pub store: Arc<dyn EventStore>,
    pub committer: Committer,
    pub lock: Arc<tokio::sync::Mutex<()>>,
}

fn key(kind: Kind, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(kind.tag().0);
    k.extend_from_slice(key.as_bytes());
    k
}

impl Local {
    pub fn new(store: Arc<dyn EventStore>, committer: Committer) -> Self {
        Local {
            store,
            committer,
            lock: Default::default(),
        }
    }

    async fn write(&self, k: Vec<u8>, value: Option<Vec<u8>>) -> Result<(), RelayError> {
        let writes = vec![(k, value)];
        let ticket = self.committer.write(Box::new(move |store: &dyn EventStore| {
            store.write_aux(Space::Records, &writes)
        }));
        Ok(ticket.durable().await?)
    }
}

impl RecordStore for Local {
    fn get(&self, kind: Kind, k: String) -> Answer<Option<Vec<u8>>> {
        let store = self.store.clone();
        Box::pin(async move { Ok(store.get_aux(Space::Records, &key(kind, &k))?) })
    }

    fn put(&self, kind: Kind, k: String, value: Vec<u8>) -> Answer<()> {
        let this = self.clone();
        Box::pin(async move {
            let _one = this.lock.lock().await;
            this.write(key(kind, &k), Some(value)).await
        })
    }

    fn delete(&self, kind: Kind, k: String) -> Answer<()> {
        let this = self.clone();
        Box::pin(async move {
            let _one = this.lock.lock().await;
            this.write(key(kind, &k), None).await
        })
    }

    fn take(&self, kind: Kind, k: String) -> Answer<Option<Vec<u8>>> {
        let this = self.clone();
        Box::pin(async move {
            let _one = this.lock.lock().await;
            let k = key(kind, &k);
            let Some(found) = this.store.get_aux(Space::Records, &k)? else {
                return Ok(None);
            };
            this.write(k, None).await?;
            Ok(Some(found))
        })
    }

    fn swap(&self, kind: Kind, k: String, expected: Option<Vec<u8>>, new: Option<Vec<u8>>) -> Answer<bool> {
        let this = self.clone();
        Box::pin(async move {
            let _one = this.lock.lock().await;
            let k = key(kind, &k);
            if this.store.get_aux(Space::Records, &k)? != expected {
                return Ok(false);
            }
            this.write(k, new).await?;
            Ok(true)
        })
    }

    fn list(&self, kind: Kind) -> Answer<Vec<(String, Vec<u8>)>> {
        self.scan(key(kind, ""), None, MAX_LISTED)
    }

    fn list_group(&self, kind: Kind, group: String) -> Answer<Vec<(String, Vec<u8>)>> {
        if !is_group(&group) {
            return Box::pin(std::future::ready(Ok(Vec::new())));
        }
        self.scan(key(kind, &format!("{group}.")), None, MAX_LISTED)
    }

    fn list_after(&self, kind: Kind, after: Option<String>, max: usize) -> Answer<Vec<(String, Vec<u8>)>> {
        self.scan(key(kind, ""), after.map(|a| key(kind, &a)), max)
    }
}

impl Local {
    /// The records whose stored key starts with `prefix` (a kind's tag, then a key's start)
    /// and sorts after `after` (a stored key too), in key order, at most `max`.
    fn scan(&self, prefix: Vec<u8>, after: Option<Vec<u8>>, max: usize) -> Answer<Vec<(String, Vec<u8>)>> {
        let store = self.store.clone();
        Box::pin(async move {
            Ok(store
                .scan_aux_after(Space::Records, &prefix, after.as_deref(), max)?
                .into_iter()
                .map(|(k, v)| (String::from_utf8_lossy(&k[1..]).into_owned(), v))
                .collect())
        })
    }
}

/// Longest key a record may have on every store. The longest a cluster makes is a shared data
/// version's, a 256-byte name in hex and its version: 533 bytes. (A subject must fit in a
/// server's 4 KiB control line with its bucket's prefix and a reply inbox.)
pub const MAX_KEY: usize = 1024;

/// Whether every store can hold a record under `key`: non-empty parts, split by `.`, of ASCII
/// letters, digits and `-_/=`, at most [`MAX_KEY`] bytes. A cluster puts a key into a
/// subject as it is, where anything else is a wildcard, an error or another token, so a key
/// made from what a client sends is either checked with this or encoded (as hex). On a
/// cluster a key that is not one names no record: a read answers none.
pub fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY
        && key.split('.').all(|part| !part.is_empty())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'/' | b'=' | b'.'))
}

/// Whether `group` can be the first part of a key ([`RecordStore::list_group`]): a key with
/// no `.`.
pub fn is_group(group: &str) -> bool {
    is_key(group) && !group.contains('.')
}
