//! One typed helper for the cluster's JetStream key-value buckets: opening one (and waiting
//! for its leader), reading an entry with its revision, compare-and-set, and watching every
//! change. Each bucket names its value type; keys are made of hex so that any identity or
//! channel name is a valid KV key.

use super::{unavailable, until_ready};
use crate::error::RelayError;
use crate::store::StoreError;
use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use std::marker::PhantomData;
use std::time::Duration;

/// What a bucket holds, and how it is written.
pub(super) trait Value: Sized + Send + 'static {
    fn encode(&self) -> Bytes;
    fn decode(bytes: &[u8]) -> Result<Self, String>;
}

/// Values kept in the relay's record codec (`crosstalk_schema::codec`), each with its layout
/// version.
pub(super) trait Coded: crosstalk_schema::Stored + Send + 'static {}

impl<T: Coded> Value for T {
    fn encode(&self) -> Bytes {
        Bytes::from(crosstalk_schema::codec::encode(self))
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        crosstalk_schema::codec::decode(bytes).map_err(|e| e.to_string())
    }
}

/// A position (a read cursor), as [`crosstalk_schema::Position`] keeps it (with its version;
/// the eight bytes earlier releases wrote read too).
impl Value for u64 {
    fn encode(&self) -> Bytes {
        Bytes::from(crosstalk_schema::Position(*self).encode())
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        crosstalk_schema::Position::decode(bytes)
            .map(|p| p.0)
            .map_err(|e| e.to_string())
    }
}

/// Bytes the owner encodes itself (OAuth records).
impl Value for Vec<u8> {
    fn encode(&self) -> Bytes {
        Bytes::copy_from_slice(self)
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(bytes.to_vec())
    }
}

/// An entry whose presence is all it says (a wait, a node's heartbeat).
pub(super) struct Mark;

impl Value for Mark {
    fn encode(&self) -> Bytes {
        Bytes::from_static(b"1")
    }

    fn decode(_: &[u8]) -> Result<Self, String> {
        Ok(Mark)
    }
}

/// Compare-and-set attempts before a change of shared state is given up as contended.
const CAS_ATTEMPTS: usize = 16;

/// How many reads (or marker removals) a listing has in flight at once.
const LISTING_AT_ONCE: usize = 16;

/// A key's latest entry: its value (`None`: deleted) and its revision, for compare-and-set.
pub(super) struct Stored<V> {
    pub value: Option<V>,
    pub revision: u64,
}

/// What [`Bucket::change`] makes of a key's latest entry.
pub(super) enum Step<V, R> {
    /// Nothing to write: the change answers `R`.
    Done(R),
    /// Write `V` if the key is still as it was read, then answer `R`.
    Write(V, R),
}

/// One change, as a watch sees it.
pub(super) struct Change<V> {
    pub key: String,
    /// `None`: deleted (or expired).
    pub value: Option<V>,
    /// When the entry was written, ns since the epoch.
    pub created_ns: i128,
}

/// A bucket `<STREAM>_<SUFFIX>` of values `V`.
pub(super) struct Bucket<V> {
    store: kv::Store,
    /// Names the bucket in errors and logs.
    what: &'static str,
    /// Reads go to the stream's leader ([`Bucket::reading_from_leader`]).
    from_leader: bool,
    /// A listing removes the delete markers it meets ([`Bucket::forgetting_deletes`]).
    forget_deletes: bool,
    value: PhantomData<fn() -> V>,
}

impl<V> Clone for Bucket<V> {
    fn clone(&self) -> Self {
        Bucket {
            store: self.store.clone(),
            what: self.what,
            from_leader: self.from_leader,
            forget_deletes: self.forget_deletes,
            value: PhantomData,
        }
    }
}

/// How a bucket is opened: where, with how many replicas, and until when start-up waits.
pub(super) struct Open<'a> {
    /// The context the relay's requests go on.
    pub js: &'a jetstream::Context,
    /// The context of start-up's own requests (short time-outs).
    pub setup: &'a jetstream::Context,
    pub stream: &'a str,
    pub replicas: usize,
    pub deadline: tokio::time::Instant,
}

/// Whether a compare-and-set failed because another writer came first. The server answers
/// a lost race with one of two "wrong last sequence" codes (10071, and 10164 when the key's
/// subject had a newer message); the client library gives only the first its own kind.
fn lost_race(e: &impl std::fmt::Display) -> bool {
    e.to_string().contains("wrong last sequence")
}

impl<V: Value> Bucket<V> {
    /// Creates (or opens) the bucket `<stream>_<suffix>`, whose entries expire after `max_age`
    /// (`ZERO`: never), and waits until it has a leader: on a new cluster a created bucket
    /// answers "no stream found" until its replicas elect one.
    pub async fn open(at: &Open<'_>, suffix: &str, max_age: Duration, what: &'static str) -> Result<Self, RelayError> {
        let config = kv::Config {
            bucket: format!("{}_{suffix}", at.stream),
            history: 1,
            num_replicas: at.replicas,
            storage: stream::StorageType::File,
            max_age,
            ..Default::default()
        };
        let step = format!("creating the {} bucket", config.bucket);
        until_ready(
            &step,
            at.deadline,
            || at.setup.create_or_update_key_value(config.clone()),
            |_| false,
        )
        .await?;
        let step = format!("waiting for the {} bucket's leader", config.bucket);
        let name = format!("KV_{}", config.bucket);
        until_ready(&step, at.deadline, || super::has_leader(at.setup, &name), |_| false).await?;
        // Opened again on `js`, whose requests wait as long as the relay's own.
        let store = until_ready(&step, at.deadline, || at.js.get_key_value(&config.bucket), |_| false).await?;
        Ok(Bucket {
            store,
            what,
            from_leader: false,
            forget_deletes: false,
            value: PhantomData,
        })
    }

    /// The bucket, its every read answered by the stream's leader rather than by any replica.
    /// A replica may be a moment behind a write another node was just answered for, and a
    /// record that says who may do what (an OAuth grant, a token, a single-use code) must
    /// not read as it was before a revocation: a refresh on one node must see the revocation
    /// answered on another, and a code typed a moment after it was minted must be found.
    pub fn reading_from_leader(mut self) -> Self {
        self.from_leader = true;
        self
    }

    /// The bucket, its listings ([`Bucket::values`]) removing each delete marker they meet, up
    /// to and including the marker and never past it. A bucket keeps each key's last message
    /// for good, a delete's marker too, and its listing names every key that has one: without
    /// this a bucket of records made and deleted (tasks, codes, deliveries) would be listed
    /// with one more read for every record it ever held. Only for a bucket no one watches: a
    /// watch that starts again from the bucket's history would no longer see the delete.
    pub fn forgetting_deletes(mut self) -> Self {
        self.forget_deletes = true;
        self
    }

    fn corrupt(&self, key: &str, why: String) -> RelayError {
        RelayError::Store(StoreError::Corrupt(format!("{} entry {key}: {why}", self.what)))
    }

    /// The key's latest entry, `None` if it never existed.
    pub async fn entry(&self, key: &str) -> Result<Option<Stored<V>>, RelayError> {
        let Some(key) = literal(key) else { return Ok(None) };
        if self.from_leader {
            return self.entry_at_leader(key).await;
        }
        let entry = self
            .store
            .entry(key)
            .await
            .map_err(|e| unavailable(&format!("reading the {} bucket", self.what), e))?;
        let Some(e) = entry else { return Ok(None) };
        let value = match e.operation {
            kv::Operation::Put => Some(V::decode(&e.value).map_err(|why| self.corrupt(key, why))?),
            _ => None,
        };
        Ok(Some(Stored {
            value,
            revision: e.revision,
        }))
    }

    /// The key's latest entry as the stream's leader holds it (the message API, not the
    /// direct get any replica answers).
    async fn entry_at_leader(&self, key: &str) -> Result<Option<Stored<V>>, RelayError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let subject = format!("{}{key}", self.store.prefix);
        let m = match self.store.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(unavailable(&format!("reading the {} bucket", self.what), e)),
        };
        // A delete or purge is a marker message: the header says which (a purge that aged
        // out says why instead).
        let removed = m
            .headers
            .get("KV-Operation")
            .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
            || m.headers.get("Nats-Marker-Reason").is_some();
        let value = if removed {
            None
        } else {
            Some(V::decode(&m.payload).map_err(|why| self.corrupt(key, why))?)
        };
        Ok(Some(Stored {
            value,
            revision: m.sequence,
        }))
    }

    /// The key's current value.
    pub async fn get(&self, key: &str) -> Result<Option<V>, RelayError> {
        Ok(self.entry(key).await?.and_then(|s| s.value))
    }

    pub async fn put(&self, key: &str, value: &V) -> Result<(), RelayError> {
        let key = literal(key).ok_or_else(|| unholdable(self.what, key))?;
        self.store
            .put(key, value.encode())
            .await
            .map(|_| ())
            .map_err(|e| unavailable(&format!("writing the {} bucket", self.what), e))
    }

    pub async fn delete(&self, key: &str) -> Result<(), RelayError> {
        // Nothing is stored under a key no entry can have: deleting it is done.
        let Some(key) = literal(key) else { return Ok(()) };
        self.store
            .delete(key)
            .await
            .map_err(|e| unavailable(&format!("deleting from the {} bucket", self.what), e))
    }

    /// Changes `key` by compare-and-set: reads its latest entry (`None`: it never existed),
    /// asks `step` what to make of it, and writes that only if the key is still as it was
    /// read. When another writer came first it reads again, after a pause that grows with each
    /// loss (1, 2, 4 … ms, at most 32): a read may be answered by a replica that has not yet
    /// applied the write that won, and read again at once it showed the same stale revision
    /// attempt after attempt (seen in tests/nats/, an inbox drained on two nodes at once).
    /// `None` when every attempt lost.
    pub async fn change<R>(
        &self,
        key: &str,
        mut step: impl FnMut(Option<Stored<V>>) -> Result<Step<V, R>, RelayError>,
    ) -> Result<Option<R>, RelayError> {
        for attempt in 0..CAS_ATTEMPTS {
            let current = self.entry(key).await?;
            // Written over only as it was read; a deleted key is created anew.
            let revision = current.as_ref().and_then(|s| s.value.as_ref().map(|_| s.revision));
            match step(current)? {
                Step::Done(answer) => return Ok(Some(answer)),
                Step::Write(value, answer) => {
                    if self.compare_and_set(key, revision, &value).await? {
                        return Ok(Some(answer));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(1 << attempt.min(5))).await;
        }
        Ok(None)
    }

    /// Writes `value` under `key` if the key is still at `revision` (`None`: if it has no
    /// value); `false` if another writer came first.
    async fn compare_and_set(&self, key: &str, revision: Option<u64>, value: &V) -> Result<bool, RelayError> {
        let key = literal(key).ok_or_else(|| unholdable(self.what, key))?;
        let what = || format!("writing the {} bucket", self.what);
        match revision {
            None => match self.store.create(key, value.encode()).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists || lost_race(&e) => Ok(false),
                Err(e) => Err(unavailable(&what(), e)),
            },
            Some(rev) => match self.store.update(key, value.encode(), rev).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision || lost_race(&e) => Ok(false),
                Err(e) => Err(unavailable(&what(), e)),
            },
        }
    }

    /// Deletes the key's value and answers it, if it still has the value read: of several
    /// nodes taking one key at once, one gets it and the others `None`.
    pub async fn take(&self, key: &str) -> Result<Option<V>, RelayError> {
        for attempt in 0..CAS_ATTEMPTS {
            let Some(Stored {
                value: Some(value),
                revision,
            }) = self.entry(key).await?
            else {
                return Ok(None);
            };
            match self.store.delete_expect_revision(key, Some(revision)).await {
                Ok(()) => return Ok(Some(value)),
                Err(e) if lost_race(&e) => {}
                Err(e) => return Err(unavailable(&format!("taking from the {} bucket", self.what), e)),
            }
            tokio::time::sleep(Duration::from_millis(1 << attempt.min(5))).await;
        }
        Ok(None)
    }

    /// Writes `new` (`None`: deletes) over the key if its value is still `expected` (`None`:
    /// it has none); `false` if another writer came first.
    pub async fn swap(&self, key: &str, expected: Option<V>, new: Option<V>) -> Result<bool, RelayError>
    where
        V: PartialEq,
    {
        let current = self.entry(key).await?;
        let (value, revision) = match &current {
            Some(s) => (s.value.as_ref(), Some(s.revision)),
            None => (None, None),
        };
        if value != expected.as_ref() {
            return Ok(false);
        }
        let revision = value.and(revision);
        match new {
            Some(v) => self.compare_and_set(key, revision, &v).await,
            None => match revision {
                None => Ok(true),
                Some(rev) => match self.store.delete_expect_revision(key, Some(rev)).await {
                    Ok(()) => Ok(true),
                    Err(e) if lost_race(&e) => Ok(false),
                    Err(e) => Err(unavailable(&format!("deleting from the {} bucket", self.what), e)),
                },
            },
        }
    }

    /// The bucket's latest revision: it changes whenever any key is written.
    pub async fn revision(&self) -> Result<u64, RelayError> {
        let mut stream = self.store.stream.clone();
        let info = stream
            .info()
            .await
            .map_err(|e| unavailable(&format!("reading the {} bucket's state", self.what), e))?;
        Ok(info.state.last_sequence)
    }

    /// Every key the bucket holds, in order; a deleted key may be among them (its delete's
    /// marker is the key's last message), so [`Bucket::values`] reads each.
    ///
    /// One answer of the stream's leader, of the subjects it holds messages on, taken at one
    /// moment. Not the client's key listing: that walks a consumer over each key's last
    /// message and stops when the server counts nothing left, so a key whose only message
    /// is replaced during the walk (a task settling while its owner lists tasks) can be
    /// skipped at its old place and not yet counted at its new one, and is missing from the
    /// list. A listing also then cost a consumer, created and deleted through the cluster's
    /// meta group.
    async fn keys(&self, under: &str) -> Result<Vec<String>, RelayError> {
        let what = format!("listing the {} bucket", self.what);
        let filter = format!("{}{under}>", self.store.prefix);
        let mut subjects = self
            .store
            .stream
            .info_with_subjects(&filter)
            .await
            .map_err(|e| unavailable(&what, e))?;
        let mut out = Vec::new();
        while let Some(subject) = subjects.next().await {
            let (subject, _messages) = subject.map_err(|e| unavailable(&what, e))?;
            if let Some(key) = subject.strip_prefix(self.store.prefix.as_str()) {
                out.push(key.to_owned());
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Every key's current value, in key order, at most `max` of them. A key met deleted is
    /// skipped, and in a bucket [`Bucket::forgetting_deletes`] its marker is removed: purged
    /// from its subject up to the marker's own sequence, so a value written after the marker
    /// (the key made again while this listed) is kept. The keys are read, and the markers
    /// removed, [`LISTING_AT_ONCE`] at a time: one after another, a listing of a few thousand
    /// keys took a third of a second on loopback.
    pub async fn values(&self, max: usize) -> Result<Vec<(String, V)>, RelayError> {
        self.values_under("", max).await
    }

    /// [`Bucket::values`] of the keys `<group>.<rest>` only: the leader names only the
    /// subjects under the group, so the listing costs what the group holds. A `group` that is
    /// not one literal key part holds none.
    pub async fn values_in(&self, group: &str, max: usize) -> Result<Vec<(String, V)>, RelayError> {
        if !crate::records::is_group(group) {
            return Ok(Vec::new());
        }
        self.values_under(&format!("{group}."), max).await
    }

    /// [`Bucket::values`] of the keys that sort after `after` (every key when `None`): the next
    /// page of a listing that stopped there. The leader still names every key; only the page's
    /// values are read.
    pub async fn values_after(&self, after: Option<&str>, max: usize) -> Result<Vec<(String, V)>, RelayError> {
        let mut keys = self.keys("").await?;
        if let Some(after) = after {
            keys.retain(|k| k.as_str() > after);
        }
        self.values_of(keys, max).await
    }

    /// The values of the keys that start with `under` (empty, or key parts each ending in `.`).
    async fn values_under(&self, under: &str, max: usize) -> Result<Vec<(String, V)>, RelayError> {
        self.values_of(self.keys(under).await?, max).await
    }

    /// The values of `keys` (in their order), deleted ones skipped, until `max` are found.
    async fn values_of(&self, keys: Vec<String>, max: usize) -> Result<Vec<(String, V)>, RelayError> {
        let mut entries = futures_util::stream::iter(keys)
            .map(|key| async move { self.entry(&key).await.map(|e| (key, e)) })
            .buffered(LISTING_AT_ONCE);
        let (mut out, mut deleted) = (Vec::new(), Vec::new());
        while let Some(read) = entries.next().await {
            match read? {
                (key, Some(Stored { value: Some(v), .. })) => out.push((key, v)),
                (key, Some(Stored { value: None, revision })) if self.forget_deletes => deleted.push((key, revision)),
                _ => {}
            }
            if out.len() == max {
                break;
            }
        }
        futures_util::stream::iter(deleted)
            .for_each_concurrent(LISTING_AT_ONCE, |(key, revision)| async move {
                self.forget(&key, revision).await
            })
            .await;
        Ok(out)
    }

    /// Removes the delete marker at `revision` and whatever the key held before it. A failure
    /// is logged and left: the marker is met again at the next listing.
    async fn forget(&self, key: &str, revision: u64) {
        let subject = format!("{}{key}", self.store.prefix);
        let purged = self.store.stream.purge().filter(subject).sequence(revision + 1).await;
        if let Err(e) = purged {
            tracing::debug!(bucket = self.what, %key, error = %e, "could not remove a delete marker; the next listing tries again");
        }
    }

    /// Every entry (its latest value per key), then each change as it happens, each made into
    /// a `T` by `parse` (entries it cannot read are skipped). The changes end at the watch's
    /// first error (its consumer lived on a server that died, say: then the client's watch
    /// keeps failing rather than recovering), so the caller watches again, from the bucket's
    /// history; every change is a merge, so seeing an entry twice changes nothing.
    pub async fn watch<T>(
        &self,
        parse: fn(Change<V>) -> Option<T>,
    ) -> Result<impl futures_util::Stream<Item = T> + Unpin, RelayError> {
        let what = self.what;
        debug_assert!(
            !self.forget_deletes,
            "the {what} bucket forgets its deletes and is watched"
        );
        let watch = self
            .store
            .watch_with_history(">")
            .await
            .map_err(|e| unavailable(&format!("watching the {what} bucket"), e))?;
        Ok(watch
            .take_while(move |e| {
                if let Err(e) = e {
                    tracing::warn!(error = %e, "watching the {what} bucket failed; watching it again");
                }
                std::future::ready(e.is_ok())
            })
            .filter_map(move |e| {
                let change = e.ok().and_then(|e| {
                    let value = match e.operation {
                        kv::Operation::Put => Some(V::decode(&e.value).ok()?),
                        _ => None,
                    };
                    Some(Change {
                        key: e.key,
                        value,
                        created_ns: e.created.unix_timestamp_nanos(),
                    })
                });
                std::future::ready(change.and_then(parse))
            }))
    }
}

/// `key` as a literal subject token sequence of a bucket, or `None` for a key no entry can
/// have ([`crate::records::is_key`]). A key is put into a subject as it is, and a subject
/// with a wildcard token (`*`, `>`) or an empty one is a filter or an error to the servers,
/// not a name: read with one, a leader answers the newest message of *any* key it matches.
/// A key from outside (a task id, a client id, a reservation's record as its id names it) is
/// checked here, so a read of a key nobody could have made answers "absent", on every kind
/// of bucket.
fn literal(key: &str) -> Option<&str> {
    crate::records::is_key(key).then_some(key)
}

/// A write under a key no bucket can hold: the relay makes every key it writes, so this is
/// a bug of the caller's, refused before it reaches the servers.
fn unholdable(what: &str, key: &str) -> RelayError {
    RelayError::Store(StoreError::Io(format!(
        "the {what} bucket cannot hold the key {key:?}; nothing was written"
    )))
}

/// Any string as a KV key part (keys allow only `[-/_=.a-zA-Z0-9]`): its bytes in hex.
pub(super) fn hex(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The string a [`hex`] key part stands for.
pub(super) fn unhex(hex: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| hex.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_parts_are_hex_and_come_back() {
        for s in ["alice", "team.alpha", "with space/and.dots", "ünïcode ✓", ""] {
            let h = hex(s);
            assert!(h.bytes().all(|b| b.is_ascii_hexdigit()), "{h}");
            assert_eq!(unhex(&h).as_deref(), Some(s));
        }
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn only_a_literal_key_names_an_entry() {
        let long = "k".repeat(crate::records::MAX_KEY + 1);
        let made = [
            "0123abcd",
            "ct_client_9f",
            "0a1b2c.5e6f",
            "3f2a.1",
            "A-b_c/d=e",
            "k".repeat(crate::records::MAX_KEY).leak(),
        ];
        for key in made {
            assert_eq!(literal(key), Some(key), "{key:?}");
        }
        let nobodys = [
            "",
            ">",
            "*",
            "a.>",
            "a.*",
            "*.b",
            ".",
            "a.",
            ".a",
            "a..b",
            "a b",
            "a\tb",
            "é",
            "a\u{0}",
            "a$b",
            long.as_str(),
        ];
        for key in nobodys {
            assert_eq!(literal(key), None, "{key:?}");
        }
        // Every key made of hex parts is one (a part is never empty: no name is), the longest
        // the relay makes too: a shared data key of 256 bytes with its version.
        for name in ["alice", "team.alpha", "ünïcode ✓", "é".repeat(128).leak()] {
            let key = format!("{}.{}", hex(name), u64::MAX);
            assert!(literal(&key).is_some(), "{name:?}");
        }
    }

    #[test]
    fn positions_carry_their_version_and_the_older_eight_bytes_still_read() {
        assert_eq!(u64::decode(&7u64.encode()).unwrap(), 7);
        assert_eq!(7u64.encode()[0], 1, "the layout version");
        assert_eq!(u64::decode(&[0, 0, 0, 0, 0, 0, 0x12, 0x34]).unwrap(), 0x1234);
        assert!(u64::decode(b"short").is_err());
    }
}
