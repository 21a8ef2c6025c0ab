//! The sled implementation of [`EventStore`]. One tree holds every channel, so one sled batch
//! writes a commit atomically and a range scan reads a channel in id order. Keys (ids are
//! u64 big-endian, `\0` separates a channel name from what follows):
//!
//! | key | value |
//! | --- | --- |
//! | `e{channel}\0{id}` | an event (codec-encoded `Record`) |
//! | `c{channel}` | the channel's summary (`ChannelMeta`) |
//! | `s{channel}` | the channel's state snapshot (`ChannelState`) |
//! | `o{channel}\0{id}` | overlay of a message (`Overlay`) |
//! | `p{channel}\0{parent}{reply}` | reply index (empty) |
//! | `k{channel}\0{idempotency key}` | id the key was given |
//! | `g` | relay-wide id floor |
//! | `a{space}{key}` | auxiliary state of other actors |

use crate::store::{
    Append, AuxEntries, EventStore, Repair, RepairReport, Space, StoreError, StoredEvent, Truncation, Undo,
};
use crosstalk_schema::{codec, ChannelMeta, ChannelName, ChannelState, IdFloor, Overlay, Record};
use parking_lot::RwLock;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tree holding the log and the channel summaries.
const LOG_TREE: &str = "log";
/// How many of a channel's newest records start-up checks for damage.
const REPAIR_WINDOW: usize = 64;
/// sled's page cache. The relay keeps its own cache of recent messages, so this stays small: sled
/// counts serialised bytes, and what it holds in memory is several times that, while reads are
/// served from the relay's own cache (docs/benchmarks.md, "Measurements behind design choices").
const CACHE_BYTES: u64 = 2 * 1024 * 1024;
/// sled's background flush interval; acknowledged writes never wait for it (see `commit`).
const BACKGROUND_FLUSH_MS: u64 = 500;

/// File beside sled's own holding the newest id made durable, so start-up can tell when the
/// store lost its tail. Rewritten after every flush without an fsync of its own: it survives a
/// process crash (the page cache has it), which is what it is for.
const MARKER_FILE: &str = "crosstalk.durable";

pub struct SledStore {
    dir: PathBuf,
    /// The open database; `None` only while [`EventStore::reopen`] is between closing and
    /// opening it (or after an open that failed, until the next one succeeds).
    open: RwLock<Option<Arc<Handles>>>,
    /// Newest id appended so far (not necessarily durable).
    appended: AtomicU64,
    marker: File,
    /// The marker's value when the store was opened.
    marked_at_open: u64,
    /// A committer round's appends, gathered into one sled batch ([`EventStore::begin_round`]).
    /// sled writes its log buffer out twice for every batch it applies, each time waiting for
    /// the disk (`Tree::apply_batch` pins the log, `vendor/sled/src/pagecache/mod.rs`), so a
    /// batch per channel cost a round that many waits (docs/benchmarks.md, "A load spread over
    /// channels").
    round: parking_lot::Mutex<Round>,
    /// Whether `round` holds writes not yet applied: every other operation applies them first.
    gathered: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Round {
    /// Between `begin_round` and `end_round`.
    open: bool,
    /// The writes gathered, in order.
    writes: Writes,
    /// The keys of `writes` that an append overwrites (a summary, a state, an overlay): an
    /// append that reads one of them for its undo applies the writes first. Events, replies
    /// and idempotency keys are new by construction and never read back here.
    keys: std::collections::HashSet<Vec<u8>>,
}

type Writes = Vec<(Vec<u8>, sled::IVec)>;

impl Round {
    /// Applies what was gathered, as one atomic batch (holding the round's lock, so that no
    /// one flushes, reads or ends the round before it is applied).
    fn apply(&mut self, log: &sled::Tree) -> Result<(), StoreError> {
        if self.writes.is_empty() {
            return Ok(());
        }
        self.keys.clear();
        log.apply_batch(batch_of(std::mem::take(&mut self.writes))).map_err(io)
    }
}

fn batch_of(writes: Writes) -> sled::Batch {
    let mut batch = sled::Batch::default();
    for (key, value) in writes {
        batch.insert(key, value);
    }
    batch
}

/// sled's handles, replaced together when the store is opened again.
struct Handles {
    db: sled::Db,
    log: sled::Tree,
    /// sled's log file, for `sync` (sled's own flush uses sync_file_range on Linux).
    log_file: File,
}

impl Handles {
    fn new(dir: &Path) -> Result<Handles, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .flush_every_ms(Some(BACKGROUND_FLUSH_MS))
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(io)?;
        let log = db.open_tree(LOG_TREE).map_err(io)?;
        let log_file = File::open(dir.join("db")).map_err(|e| StoreError::Io(format!("sled log file: {e}")))?;
        Ok(Handles { db, log, log_file })
    }
}

/// How long [`EventStore::reopen`] waits for the readers of the old database to let go of it.
const REOPEN_WAIT: Duration = Duration::from_secs(5);

fn io(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Corruption { .. } => StoreError::Corrupt(e.to_string()),
        other => StoreError::Io(other.to_string()),
    }
}

fn event_key(channel: &ChannelName, id: u64) -> Vec<u8> {
    channel_id_key(b'e', channel, id)
}

/// Key of the relay-wide id floor (see [`EventStore::id_floor`]).
const ID_FLOOR_KEY: &[u8] = b"g";

fn meta_key(channel: &ChannelName) -> Vec<u8> {
    let mut key = Vec::with_capacity(channel.as_str().len() + 1);
    key.push(b'c');
    key.extend_from_slice(channel.as_str().as_bytes());
    key
}

/// `{tag}{channel}\0`: the prefix of a channel's keys of one kind.
fn channel_prefix(tag: u8, channel: &ChannelName) -> Vec<u8> {
    let name = channel.as_str().as_bytes();
    let mut key = Vec::with_capacity(name.len() + 18);
    key.push(tag);
    key.extend_from_slice(name);
    key.push(0);
    key
}

fn channel_id_key(tag: u8, channel: &ChannelName, id: u64) -> Vec<u8> {
    let mut key = channel_prefix(tag, channel);
    key.extend_from_slice(&id.to_be_bytes());
    key
}

fn aux_key(space: Space, key: &[u8]) -> Vec<u8> {
    let tag = match space {
        Space::Instances => b'i',
        Space::Cursors => b'u',
        Space::SharedData => b'd',
        Space::SharedVersions => b'v',
        Space::Search => b'w',
        Space::Postings => b'p',
        Space::Jobs => b'j',
        Space::Records => b'o',
    };
    let mut k = Vec::with_capacity(key.len() + 2);
    k.push(b'a');
    k.push(tag);
    k.extend_from_slice(key);
    k
}

/// Up to `limit` entries of an aux scan, their keys without the first `strip` bytes (the space).
fn aux_entries(
    scan: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
    strip: usize,
    limit: usize,
) -> Result<AuxEntries, StoreError> {
    scan.take(limit)
        .map(|item| {
            let (k, v) = item.map_err(io)?;
            Ok((k[strip..].to_vec(), v.to_vec()))
        })
        .collect()
}

fn id_of(key: &[u8]) -> Result<u64, StoreError> {
    let tail: [u8; 8] = key
        .len()
        .checked_sub(8)
        .and_then(|at| key[at..].try_into().ok())
        .ok_or_else(|| StoreError::Corrupt(format!("event key of {} bytes", key.len())))?;
    Ok(u64::from_be_bytes(tail))
}

impl SledStore {
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let open = Handles::new(dir)?;
        let marker = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(MARKER_FILE))
            .map_err(|e| StoreError::Io(format!("{MARKER_FILE}: {e}")))?;
        let mut buf = [0u8; 12];
        let marked_at_open = match marker.read_exact_at(&mut buf, 0) {
            Ok(()) if crc32fast::hash(&buf[..8]).to_le_bytes() == buf[8..] => {
                u64::from_le_bytes(buf[..8].try_into().unwrap_or_default())
            }
            _ => 0,
        };
        Ok(SledStore {
            dir: dir.to_path_buf(),
            open: RwLock::new(Some(Arc::new(open))),
            appended: AtomicU64::new(0),
            marker,
            marked_at_open,
            round: Default::default(),
            gathered: Default::default(),
        })
    }

    /// The open database, for one operation, with every append made so far applied.
    fn handles(&self) -> Result<Arc<Handles>, StoreError> {
        let h = self.handles_as_is()?;
        if self.gathered.load(Ordering::Acquire) {
            self.apply_gathered(&mut self.round.lock(), &h)?;
        }
        Ok(h)
    }

    /// The open database, with what the round gathered still gathered.
    fn handles_as_is(&self) -> Result<Arc<Handles>, StoreError> {
        self.open
            .read()
            .clone()
            .ok_or_else(|| StoreError::Io("the store is being opened again after a failed write".into()))
    }

    /// What `b` writes, how to take it back, and how many of the undo's first entries are keys
    /// it overwrites. Such a key is read first for its undo; when the round's gathered writes
    /// hold it, they are applied first.
    fn append_writes(
        &self,
        h: &Handles,
        mut round: Option<&mut Round>,
        b: &Append<'_>,
    ) -> Result<(Writes, Undo, usize), StoreError> {
        let mut writes: Writes = Vec::new();
        let mut undo = Vec::new();
        // Keys that may exist already: their undo restores what they held.
        let mut overwrite = |writes: &mut Writes, key: Vec<u8>, value: Vec<u8>| -> Result<(), StoreError> {
            if let Some(round) = round.as_deref_mut() {
                if round.keys.contains(&key) {
                    self.apply_gathered(round, h)?;
                }
            }
            let before = h.log.get(&key).map_err(io)?.map(|v| v.to_vec());
            writes.push((key.clone(), value.into()));
            undo.push((key, before));
            Ok(())
        };
        overwrite(&mut writes, meta_key(b.channel), codec::encode(b.meta))?;
        if let Some(state) = b.state {
            let mut key = meta_key(b.channel);
            key[0] = b's';
            overwrite(&mut writes, key, codec::encode(state))?;
        }
        for (id, overlay) in b.overlays {
            overwrite(
                &mut writes,
                channel_id_key(b'o', b.channel, *id),
                codec::encode(overlay),
            )?;
        }
        let overwritten = undo.len();
        // Keys that are new by construction (fresh ids, fresh keys): their undo removes them.
        for (id, bytes) in b.events {
            let key = event_key(b.channel, *id);
            writes.push((key.clone(), bytes.as_slice().into()));
            undo.push((key, None));
        }
        for (parent, reply) in b.replies {
            let mut key = channel_id_key(b'p', b.channel, *parent);
            key.extend_from_slice(&reply.to_be_bytes());
            writes.push((key.clone(), sled::IVec::default()));
            undo.push((key, None));
        }
        for (idem, id) in b.idempotency {
            let mut key = channel_prefix(b'k', b.channel);
            key.extend_from_slice(idem.as_bytes());
            writes.push((key.clone(), id.to_be_bytes().as_slice().into()));
            undo.push((key, None));
        }
        Ok((writes, Undo(undo), overwritten))
    }

    fn appended_through(&self, b: &Append<'_>) {
        if let Some((last, _)) = b.events.last() {
            self.appended.fetch_max(*last, Ordering::AcqRel);
        }
    }

    fn apply_gathered(&self, round: &mut Round, h: &Handles) -> Result<(), StoreError> {
        let applied = round.apply(&h.log);
        self.gathered.store(false, Ordering::Release);
        applied
    }

    fn write_marker(&self, id: u64) -> Result<(), StoreError> {
        let mut buf = [0u8; 12];
        buf[..8].copy_from_slice(&id.to_le_bytes());
        let crc = crc32fast::hash(&buf[..8]);
        buf[8..].copy_from_slice(&crc.to_le_bytes());
        self.marker
            .write_all_at(&buf, 0)
            .map_err(|e| StoreError::Io(format!("{MARKER_FILE}: {e}")))
    }

    /// Writes raw bytes under an event key, bypassing the codec. Tests use it to simulate
    /// a damaged record.
    #[doc(hidden)]
    pub fn put_raw_event(&self, channel: &ChannelName, id: u64, bytes: &[u8]) -> Result<(), StoreError> {
        let h = self.handles()?;
        h.log.insert(event_key(channel, id), bytes).map_err(io)?;
        Ok(())
    }
}

impl EventStore for SledStore {
    fn append(&self, b: Append<'_>) -> Result<Undo, StoreError> {
        let mut round = self.round.lock();
        if !round.open {
            drop(round);
            let h = self.handles()?;
            let (writes, undo, _) = self.append_writes(&h, None, &b)?;
            h.log.apply_batch(batch_of(writes)).map_err(io)?;
            self.appended_through(&b);
            return Ok(undo);
        }
        // In a round: gathered with the round's other appends, applied at its end or before
        // anything else reads or writes the store.
        let h = self.handles_as_is()?;
        let (writes, undo, overwritten) = self.append_writes(&h, Some(&mut round), &b)?;
        round
            .keys
            .extend(undo.0[..overwritten].iter().map(|(key, _)| key.clone()));
        round.writes.extend(writes);
        self.gathered.store(true, Ordering::Release);
        self.appended_through(&b);
        Ok(undo)
    }

    fn begin_round(&self) {
        self.round.lock().open = true;
    }

    fn end_round(&self) -> Result<(), StoreError> {
        let mut round = self.round.lock();
        round.open = false;
        match self.handles_as_is() {
            Ok(h) => self.apply_gathered(&mut round, &h),
            Err(e) => {
                *round = Round::default();
                self.gathered.store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    fn write_aux(&self, space: Space, writes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<Undo, StoreError> {
        let h = self.handles()?;
        let mut batch = sled::Batch::default();
        let mut undo = Vec::with_capacity(writes.len());
        for (k, v) in writes {
            let key = aux_key(space, k);
            let before = h.log.get(&key).map_err(io)?.map(|v| v.to_vec());
            match v {
                Some(v) => batch.insert(key.clone(), v.as_slice()),
                None => batch.remove(key.clone()),
            }
            undo.push((key, before));
        }
        h.log.apply_batch(batch).map_err(io)?;
        Ok(Undo(undo))
    }

    fn undo(&self, undo: Undo) -> Result<(), StoreError> {
        let h = self.handles()?;
        let mut batch = sled::Batch::default();
        // Newest write first, so a key written twice ends with its oldest value.
        for (key, before) in undo.0.into_iter().rev() {
            match before {
                Some(v) => batch.insert(key, v),
                None => batch.remove(key),
            }
        }
        h.log.apply_batch(batch).map_err(io)
    }

    fn read_one(&self, channel: &ChannelName, id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let h = self.handles()?;
        Ok(h.log.get(event_key(channel, id)).map_err(io)?.map(|v| v.to_vec()))
    }

    fn state(&self, channel: &ChannelName) -> Result<ChannelState, StoreError> {
        let h = self.handles()?;
        let mut key = meta_key(channel);
        key[0] = b's';
        match h.log.get(key).map_err(io)? {
            None => Ok(ChannelState::default()),
            Some(bytes) => {
                ChannelState::decode(&bytes).map_err(|e| StoreError::Corrupt(format!("state of {channel}: {e}")))
            }
        }
    }

    fn overlays(&self, channel: &ChannelName) -> Result<Vec<(u64, Overlay)>, StoreError> {
        let h = self.handles()?;
        let mut out = Vec::new();
        for item in h.log.scan_prefix(channel_prefix(b'o', channel)) {
            let (key, value) = item.map_err(io)?;
            let overlay =
                codec::decode(&value).map_err(|e| StoreError::Corrupt(format!("overlay in {channel}: {e}")))?;
            out.push((id_of(&key)?, overlay));
        }
        Ok(out)
    }

    fn replies(&self, channel: &ChannelName, parent: u64, limit: usize) -> Result<Vec<u64>, StoreError> {
        let h = self.handles()?;
        let mut out = Vec::new();
        for item in h.log.scan_prefix(channel_id_key(b'p', channel, parent)).take(limit) {
            let (key, _) = item.map_err(io)?;
            out.push(id_of(&key)?);
        }
        Ok(out)
    }

    fn idempotent(&self, channel: &ChannelName, idem: &str) -> Result<Option<u64>, StoreError> {
        let h = self.handles()?;
        let mut key = channel_prefix(b'k', channel);
        key.extend_from_slice(idem.as_bytes());
        match h.log.get(key).map_err(io)? {
            None => Ok(None),
            Some(v) => id_of(&v).map(Some),
        }
    }

    fn compact(&self, channel: &ChannelName, upto: u64, max: usize, meta: &ChannelMeta) -> Result<usize, StoreError> {
        let h = self.handles()?;
        let mut batch = sled::Batch::default();
        let mut removed = 0usize;
        let mut messages = 0u64;
        for item in h.log.range(event_key(channel, 0)..=event_key(channel, upto)).take(max) {
            let (key, value) = item.map_err(io)?;
            if matches!(codec::decode::<Record>(&value), Ok(Record::Message(_)) | Err(_)) {
                messages += 1;
            }
            batch.remove(key);
            removed += 1;
        }
        if removed == 0 {
            return Ok(0);
        }
        let mut meta = *meta;
        meta.count = meta.count.saturating_sub(messages);
        batch.insert(meta_key(channel), codec::encode(&meta));
        h.log.apply_batch(batch).map_err(io)?;
        Ok(removed)
    }

    fn put_aux(&self, space: Space, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        let h = self.handles()?;
        let key = aux_key(space, key);
        match value {
            Some(v) => h.log.insert(key, v).map(drop).map_err(io),
            None => h.log.remove(key).map(drop).map_err(io),
        }
    }

    fn put_aux_batch(&self, space: Space, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        let h = self.handles()?;
        let mut batch = sled::Batch::default();
        for (k, v) in entries {
            batch.insert(aux_key(space, k), v.as_slice());
        }
        h.log.apply_batch(batch).map_err(io)
    }

    fn get_aux(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let h = self.handles()?;
        Ok(h.log.get(aux_key(space, key)).map_err(io)?.map(|v| v.to_vec()))
    }

    fn scan_aux_before(
        &self,
        space: Space,
        prefix: &[u8],
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<AuxEntries, StoreError> {
        let h = self.handles()?;
        let full = aux_key(space, prefix);
        let strip = full.len() - prefix.len();
        match before {
            // A key past the prefix bounds nothing more than the prefix does.
            Some(b) if b.starts_with(prefix) => {
                aux_entries(h.log.range(full.clone()..aux_key(space, b)).rev(), strip, limit)
            }
            Some(b) if b < prefix => Ok(Vec::new()),
            _ => aux_entries(h.log.scan_prefix(&full).rev(), strip, limit),
        }
    }

    fn scan_aux_after(
        &self,
        space: Space,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<AuxEntries, StoreError> {
        let h = self.handles()?;
        let full = aux_key(space, prefix);
        let strip = full.len() - prefix.len();
        match after {
            Some(a) if a.starts_with(prefix) => {
                let from = std::ops::Bound::Excluded(aux_key(space, a));
                let within = |item: &sled::Result<(sled::IVec, sled::IVec)>| {
                    item.as_ref().map_or(true, |(k, _)| k.starts_with(&full))
                };
                aux_entries(
                    h.log.range((from, std::ops::Bound::Unbounded)).take_while(within),
                    strip,
                    limit,
                )
            }
            // Past every key with the prefix.
            Some(a) if a > prefix => Ok(Vec::new()),
            _ => aux_entries(h.log.scan_prefix(&full), strip, limit),
        }
    }

    fn read(&self, channel: &ChannelName, after: u64, upto: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        let h = self.handles()?;
        if after >= upto || limit == 0 {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(limit.min(256));
        for item in h
            .log
            .range(event_key(channel, after + 1)..=event_key(channel, upto))
            .take(limit)
        {
            let (key, value) = item.map_err(io)?;
            out.push((id_of(&key)?, value.to_vec()));
        }
        Ok(out)
    }

    fn read_back(&self, channel: &ChannelName, upto: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError> {
        let h = self.handles()?;
        let mut out = Vec::with_capacity(limit.min(256));
        for item in h
            .log
            .range(event_key(channel, 0)..=event_key(channel, upto))
            .rev()
            .take(limit)
        {
            let (key, value) = item.map_err(io)?;
            out.push((id_of(&key)?, value.to_vec()));
        }
        Ok(out)
    }

    fn meta(&self, channel: &ChannelName) -> Result<Option<ChannelMeta>, StoreError> {
        let h = self.handles()?;
        match h.log.get(meta_key(channel)).map_err(io)? {
            None => Ok(None),
            Some(bytes) => ChannelMeta::decode(&bytes)
                .map(Some)
                .map_err(|e| StoreError::Corrupt(format!("summary of channel {channel}: {e}"))),
        }
    }

    fn channels(&self) -> Result<Vec<(ChannelName, ChannelMeta)>, StoreError> {
        let h = self.handles()?;
        let mut out = Vec::new();
        for item in h.log.scan_prefix(b"c") {
            let (key, value) = item.map_err(io)?;
            let name = std::str::from_utf8(&key[1..])
                .ok()
                .and_then(|s| ChannelName::parse(s).ok())
                .ok_or_else(|| StoreError::Corrupt("a channel summary key is not a channel name".into()))?;
            let meta = ChannelMeta::decode(&value)
                .map_err(|e| StoreError::Corrupt(format!("summary of channel {name}: {e}")))?;
            out.push((name, meta));
        }
        Ok(out)
    }

    fn id_floor(&self) -> Result<u64, StoreError> {
        let h = self.handles()?;
        match h.log.get(ID_FLOOR_KEY).map_err(io)? {
            None => Ok(0),
            Some(bytes) => codec::decode(&bytes)
                .map(|IdFloor(f)| f)
                .map_err(|e| StoreError::Corrupt(format!("id floor: {e}"))),
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        let h = self.handles()?;
        // Everything appended before the flush starts is durable when it returns.
        let appended = self.appended.load(Ordering::Acquire);
        h.db.flush().map_err(io)?;
        if appended > 0 {
            self.write_marker(appended)?;
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), StoreError> {
        let h = self.handles()?;
        let appended = self.appended.load(Ordering::Acquire);
        h.db.flush().map_err(io)?;
        h.log_file
            .sync_data()
            .map_err(|e| StoreError::Io(format!("fdatasync: {e}")))?;
        if appended > 0 {
            self.write_marker(appended)?;
        }
        Ok(())
    }

    fn size_on_disk(&self) -> Option<u64> {
        self.handles().ok()?.db.size_on_disk().ok()
    }

    /// sled keeps the first I/O error of a write (a full disk's) and fails every later flush
    /// with it, so the store would never heal in this process. This closes the database and
    /// opens it again from what is on disk, as a restart would; the committer then takes back
    /// what the failed rounds may have left there (docs/operations.md#durability).
    fn reopen(&self) -> Result<(), StoreError> {
        let mut slot = self.open.write();
        if let Some(mut old) = slot.take() {
            // Readers hold the old database for one operation at most; sled releases its files
            // (and its lock on them) only when the last handle goes.
            let deadline = Instant::now() + REOPEN_WAIT;
            loop {
                match Arc::try_unwrap(old) {
                    Ok(open) => {
                        drop(open);
                        break;
                    }
                    Err(still) if Instant::now() < deadline => {
                        old = still;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(still) => {
                        *slot = Some(still);
                        return Err(StoreError::Io("the store's readers did not let go of it".into()));
                    }
                }
            }
        }
        // sled's background flusher lets go of the files a moment after the last handle.
        let deadline = Instant::now() + REOPEN_WAIT;
        loop {
            match Handles::new(&self.dir) {
                Ok(open) => {
                    *slot = Some(Arc::new(open));
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline && e.to_string().contains("lock") => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn repair(&self) -> Result<RepairReport, StoreError> {
        let h = self.handles()?;
        let mut report = RepairReport::default();
        for (channel, mut meta) in self.channels()? {
            let prefix = {
                let mut p = event_key(&channel, 0);
                p.truncate(p.len() - 8);
                p
            };
            let mut dropped = Vec::new();
            let mut last_good = 0;
            for item in h.log.scan_prefix(&prefix).rev().take(REPAIR_WINDOW) {
                let (key, value) = item.map_err(io)?;
                let id = id_of(&key)?;
                if codec::decode::<Record>(&value).is_ok() {
                    last_good = id;
                    break;
                }
                dropped.push(id);
            }
            // Events and summary are written in one atomic batch, so they agree unless the
            // store was damaged: then the records are the truth.
            if dropped.is_empty() && meta.last_id == last_good {
                continue;
            }
            let mut batch = sled::Batch::default();
            for id in &dropped {
                batch.remove(event_key(&channel, *id));
            }
            meta.count = meta.count.saturating_sub(dropped.len() as u64);
            meta.last_id = last_good;
            batch.insert(meta_key(&channel), codec::encode(&meta));
            let floor = dropped.iter().copied().max().unwrap_or(0).max(self.id_floor()?);
            batch.insert(ID_FLOOR_KEY, codec::encode(&IdFloor(floor)));
            h.log.apply_batch(batch).map_err(io)?;
            report.damaged.push(Repair {
                channel,
                dropped,
                last_good,
            });
        }
        let store_last_id = self.channels()?.iter().map(|(_, m)| m.last_id).max().unwrap_or(0);
        let floor = self.id_floor()?;
        if self.marked_at_open > store_last_id.max(floor) {
            report.truncated = Some(Truncation {
                store_last_id,
                acknowledged_last_id: self.marked_at_open,
            });
            // Those ids were acknowledged and may have been seen: never hand them out again.
            h.log
                .insert(ID_FLOOR_KEY, codec::encode(&IdFloor(self.marked_at_open)))
                .map_err(io)?;
        }
        if !report.is_clean() {
            self.flush()?;
        }
        self.appended
            .fetch_max(store_last_id.max(self.id_floor()?), Ordering::AcqRel);
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens the store, waiting out the file lock a just-dropped store's background flusher
    /// may still hold for a moment.
    fn open(dir: &Path) -> SledStore {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match SledStore::open(dir) {
                Ok(s) => return s,
                Err(e) if std::time::Instant::now() < deadline && e.to_string().contains("lock") => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("open: {e}"),
            }
        }
    }
    use crosstalk_schema::{Limits, NewMessage, Timestamp};

    fn record(body: &str) -> Vec<u8> {
        let m = NewMessage {
            sender: "a".into(),
            body: body.into(),
            ..Default::default()
        };
        codec::encode(&Record::Message(
            m.into_record(&Limits::default(), Timestamp(1)).unwrap(),
        ))
    }

    fn append(store: &SledStore, channel: &ChannelName, events: &[StoredEvent], meta: &ChannelMeta) {
        store
            .append(Append {
                channel,
                events,
                meta,
                state: None,
                overlays: &[],
                replies: &[],
                idempotency: &[],
            })
            .unwrap();
    }

    fn meta(count: u64, last_id: u64) -> ChannelMeta {
        ChannelMeta {
            count,
            last_id,
            ..Default::default()
        }
    }

    #[test]
    fn channels_do_not_bleed_into_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let a = ChannelName::parse("a").unwrap();
        let ab = ChannelName::parse("a.b").unwrap();
        append(&store, &a, &[(1, record("1")), (3, record("3"))], &meta(2, 3));
        append(&store, &ab, &[(2, record("2"))], &meta(1, 2));
        let ids: Vec<u64> = store.read(&a, 0, u64::MAX, 10).unwrap().iter().map(|e| e.0).collect();
        assert_eq!(ids, [1, 3]);
        let ids: Vec<u64> = store.read(&a, 1, 3, 10).unwrap().iter().map(|e| e.0).collect();
        assert_eq!(ids, [3]);
        assert_eq!(store.read(&a, 0, 1, 10).unwrap().len(), 1);
        assert_eq!(store.channels().unwrap().len(), 2);
        assert_eq!(store.meta(&ab).unwrap(), Some(meta(1, 2)));
    }

    // A committer round's appends go to sled as one batch at its end; meanwhile every read
    // sees them, an undo restores what the round's earlier appends wrote, and a store opened
    // again after the round's flush holds them all.
    #[test]
    fn a_rounds_appends_are_gathered_and_read_as_if_applied() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (ChannelName::parse("a").unwrap(), ChannelName::parse("b").unwrap());
        {
            let store = open(dir.path());
            store.begin_round();
            append(&store, &a, &[(1, record("1"))], &meta(1, 1));
            append(&store, &b, &[(2, record("2"))], &meta(1, 2));
            assert!(store.gathered.load(Ordering::Acquire));
            assert!(
                store.handles_as_is().unwrap().log.get(meta_key(&a)).unwrap().is_none(),
                "not yet in sled"
            );
            // A read applies what was gathered first.
            assert_eq!(store.meta(&a).unwrap(), Some(meta(1, 1)));
            assert!(!store.gathered.load(Ordering::Acquire));
            append(&store, &b, &[(3, record("3"))], &meta(2, 3));
            // The same channel again in the round: its summary was gathered, so the undo of the
            // second append takes it back to the first's, not to nothing.
            let undo = store
                .append(Append {
                    channel: &b,
                    events: &[(4, record("4"))],
                    meta: &meta(3, 4),
                    state: None,
                    overlays: &[],
                    replies: &[],
                    idempotency: &[],
                })
                .unwrap();
            store.end_round().unwrap();
            assert!(!store.gathered.load(Ordering::Acquire));
            store.undo(undo).unwrap();
            assert_eq!(store.meta(&b).unwrap(), Some(meta(2, 3)));
            let ids: Vec<u64> = store.read(&b, 0, u64::MAX, 10).unwrap().iter().map(|e| e.0).collect();
            assert_eq!(ids, [2, 3]);
            store.flush().unwrap();
            // Outside a round an append is applied at once.
            append(&store, &a, &[(5, record("5"))], &meta(2, 5));
            assert!(!store.gathered.load(Ordering::Acquire));
            store.flush().unwrap();
        }
        let store = open(dir.path());
        assert_eq!(store.meta(&a).unwrap(), Some(meta(2, 5)));
        assert_eq!(store.meta(&b).unwrap(), Some(meta(2, 3)));
        let ids: Vec<u64> = store.read(&a, 0, u64::MAX, 10).unwrap().iter().map(|e| e.0).collect();
        assert_eq!(ids, [1, 5]);
    }

    #[test]
    fn repair_drops_a_damaged_tail_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let a = ChannelName::parse("a").unwrap();
        {
            let store = open(dir.path());
            append(
                &store,
                &a,
                &[(1, record("1")), (2, record("2")), (3, record("3"))],
                &meta(3, 3),
            );
            let mut torn = record("3");
            torn.truncate(torn.len() - 1);
            store.put_raw_event(&a, 3, &torn).unwrap();
            store.flush().unwrap();
        }
        let store = open(dir.path());
        let report = store.repair().unwrap();
        assert_eq!(report.truncated, None);
        assert_eq!(
            report.damaged,
            [Repair {
                channel: a.clone(),
                dropped: vec![3],
                last_good: 2
            }]
        );
        assert_eq!(store.meta(&a).unwrap(), Some(meta(2, 2)));
        assert_eq!(store.read(&a, 0, u64::MAX, 10).unwrap().len(), 2);
        assert!(store.repair().unwrap().is_clean(), "a second repair finds nothing");
        assert_eq!(store.id_floor().unwrap(), 3, "the dropped id is never handed out again");
    }

    #[test]
    fn a_lost_tail_is_reported_and_its_ids_are_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let a = ChannelName::parse("a").unwrap();
        {
            let store = open(dir.path());
            append(&store, &a, &[(1, record("1")), (2, record("2"))], &meta(2, 2));
            store.flush().unwrap();
            // The tail is lost after it was made durable (simulated: the summary and
            // record 2 disappear, as if the store's file had been cut).
            let h = store.handles().unwrap();
            h.log.remove(event_key(&a, 2)).unwrap();
            h.log.insert(meta_key(&a), codec::encode(&meta(1, 1))).unwrap();
            h.db.flush().unwrap();
        }
        let store = open(dir.path());
        let report = store.repair().unwrap();
        assert_eq!(
            report.truncated,
            Some(Truncation {
                store_last_id: 1,
                acknowledged_last_id: 2
            })
        );
        assert_eq!(store.id_floor().unwrap(), 2);
        assert!(store.repair().unwrap().is_clean());
    }
}
