//! The event store seam. Channels append batches of encoded records and read ranges back;
//! everything else (ids, visibility, broadcast) is the actors' business. sled implements it
//! today ([`crate::sled_store`]); a distributed log can replace it without touching the faces.

use crosstalk_schema::{ChannelMeta, ChannelName, ChannelState, Overlay};

/// One stored event: its id and its encoded record (`crosstalk_schema::codec`).
pub type StoredEvent = (u64, Vec<u8>);

/// Auxiliary entries: key (without the space's prefix) and value.
pub type AuxEntries = Vec<(Vec<u8>, Vec<u8>)>;

/// Everything one commit of a channel writes, applied atomically.
pub struct Append<'a> {
    pub channel: &'a ChannelName,
    /// New events, ids strictly increasing and above the channel's last id.
    pub events: &'a [StoredEvent],
    pub meta: &'a ChannelMeta,
    /// The channel's state snapshot, when the batch changed it.
    pub state: Option<&'a ChannelState>,
    /// Overlays of earlier messages the batch changed.
    pub overlays: &'a [(u64, Overlay)],
    /// `(parent, reply)` pairs for the reply index.
    pub replies: &'a [(u64, u64)],
    /// Idempotency keys of the batch's posts, with the id each one got.
    pub idempotency: &'a [(String, u64)],
}

/// How to take back writes that were applied to the store's memory but not made durable:
/// every key written, with the value it had before (`None`: it did not exist). Only the
/// store that made it can apply it ([`EventStore::undo`]).
#[derive(Debug, Default, Clone)]
pub struct Undo(pub Vec<(Vec<u8>, Option<Vec<u8>>)>);

/// Auxiliary writes: key (without the space's prefix) and value, `None` to delete.
pub type AuxWrites = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// Key spaces for state that is not a channel's log: each owner encodes its own values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// Registered instances, by instance id.
    Instances,
    /// Read cursors, by instance id and channel.
    Cursors,
    /// Current shared data entries, by key.
    SharedData,
    /// Every version of every shared data entry, by key and version.
    SharedVersions,
    /// Search postings of the first index format: one key per term and message
    /// (`term\0{id}` → channel). Nothing writes here any more; the indexer converts what a
    /// store of an earlier version holds into [`Space::Postings`] and empties it.
    Search,
    /// Search postings, one key per term and block of 64 message ids
    /// (`term\0{id / 64}` → the block's ids and channels, see `search.rs`).
    Postings,
    /// Bookkeeping of background jobs (search indexer progress, …).
    Jobs,
    /// Small records (`crate::records`): OAuth's invites, clients, codes, grants and tokens,
    /// webhooks and their delivery state, each kind under a one-byte prefix.
    Records,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Io(String),
    #[error("stored data is damaged: {0}")]
    Corrupt(String),
}

/// What [`EventStore::repair`] found at start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Channels whose newest records were damaged, and what was removed.
    pub damaged: Vec<Repair>,
    /// The store ends before the last id it had acknowledged: its tail was cut off.
    pub truncated: Option<Truncation>,
}

impl RepairReport {
    pub fn is_clean(&self) -> bool {
        self.damaged.is_empty() && self.truncated.is_none()
    }
}

/// The store's newest id is below the newest id it had made durable before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    pub store_last_id: u64,
    pub acknowledged_last_id: u64,
}

/// A damaged tail found by [`EventStore::repair`]: what was dropped from which channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub channel: ChannelName,
    /// Ids of the damaged records that were removed.
    pub dropped: Vec<u64>,
    /// The channel's last good id after the repair.
    pub last_good: u64,
}

pub trait EventStore: Send + Sync + 'static {
    /// Appends `events` (ids strictly increasing, all above the channel's last id) and stores
    /// `meta` with them, atomically: after a crash either all of it is there or none.
    /// Not durable until [`EventStore::flush`] returns; returns how to take it back.
    fn append(&self, batch: Append<'_>) -> Result<Undo, StoreError>;

    /// Auxiliary writes (`None` deletes), atomically; returns how to take them back.
    fn write_aux(&self, space: Space, writes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<Undo, StoreError>;

    /// Takes back writes that were applied but must not become durable (their flush failed,
    /// or their writer gave up).
    fn undo(&self, undo: Undo) -> Result<(), StoreError>;

    /// Events with `after < id <= upto`, oldest first, at most `limit`.
    fn read(&self, channel: &ChannelName, after: u64, upto: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError>;

    /// Events with `id <= upto`, newest first, at most `limit`.
    fn read_back(&self, channel: &ChannelName, upto: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError>;

    /// One event by id.
    fn read_one(&self, channel: &ChannelName, id: u64) -> Result<Option<Vec<u8>>, StoreError>;

    /// The channel's state snapshot (default when never written).
    fn state(&self, channel: &ChannelName) -> Result<ChannelState, StoreError>;

    /// Every overlay of the channel. Costs one read per message that has one.
    fn overlays(&self, channel: &ChannelName) -> Result<Vec<(u64, Overlay)>, StoreError>;

    /// Ids of the replies to `parent`, oldest first, at most `limit`.
    fn replies(&self, channel: &ChannelName, parent: u64, limit: usize) -> Result<Vec<u64>, StoreError>;

    /// The id an idempotency key was given on the channel.
    fn idempotent(&self, channel: &ChannelName, key: &str) -> Result<Option<u64>, StoreError>;

    /// Removes the channel's events with `id <= upto` (retention), leaving at most `max`
    /// removed per call; returns how many were removed. Updates the summary's count.
    fn compact(&self, channel: &ChannelName, upto: u64, max: usize, meta: &ChannelMeta) -> Result<usize, StoreError>;

    /// Auxiliary state: `None` deletes.
    fn put_aux(&self, space: Space, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError>;
    /// Many auxiliary writes at once (one atomic batch).
    fn put_aux_batch(&self, space: Space, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError>;
    fn get_aux(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Entries whose key starts with `prefix`, in key order, at most `limit`.
    fn scan_aux(&self, space: Space, prefix: &[u8], limit: usize) -> Result<AuxEntries, StoreError> {
        self.scan_aux_after(space, prefix, None, limit)
    }
    /// Entries whose key starts with `prefix` and sorts before `before` (every one when
    /// `None`), newest (greatest key) first, at most `limit`: the next page of a scan that
    /// stopped at `before`.
    fn scan_aux_before(
        &self,
        space: Space,
        prefix: &[u8],
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<AuxEntries, StoreError>;
    /// Entries whose key starts with `prefix` and sorts after `after` (every one when `None`),
    /// in key order, at most `limit`: the next page of a scan that stopped at `after`.
    fn scan_aux_after(
        &self,
        space: Space,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<AuxEntries, StoreError>;

    /// The channel's summary, `None` for a channel never written.
    fn meta(&self, channel: &ChannelName) -> Result<Option<ChannelMeta>, StoreError>;

    /// Every channel ever written, with its summary. Costs one read per channel, not per event.
    fn channels(&self) -> Result<Vec<(ChannelName, ChannelMeta)>, StoreError>;

    /// The largest id ever handed out that may no longer be in the log (a repaired tail's).
    /// New ids must start above it.
    fn id_floor(&self) -> Result<u64, StoreError>;

    /// The store thread begins a round of writes ([`crate::commit`]): until
    /// [`EventStore::end_round`] the store may gather the round's appends and write them
    /// together. Whatever is read meanwhile, by anyone, sees every append made before the read.
    fn begin_round(&self) {}

    /// The round's writes are all made: writes what was gathered. An error refuses every
    /// append of the round (each one's undo then takes back nothing).
    fn end_round(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Makes everything appended so far durable against a crash of the process.
    fn flush(&self) -> Result<(), StoreError>;

    /// Like [`flush`](EventStore::flush), and also forces it to stable storage (`fdatasync`),
    /// so it survives a power loss on hardware that honours cache flushes.
    fn sync(&self) -> Result<(), StoreError>;

    /// Opens the store again after a failed write, when the store keeps an I/O error past its
    /// cause (sled does): what is on disk is read back, and what only its memory held is gone.
    /// Only the store thread calls it, with no write in flight. Nothing to do for a store that
    /// recovers by itself.
    fn reopen(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Bytes the store takes on disk, if it can tell.
    fn size_on_disk(&self) -> Option<u64> {
        None
    }

    /// Checks the newest records of every channel and removes a damaged tail, so the relay
    /// serves everything before it; raises [`EventStore::id_floor`] above the removed ids.
    /// Returns what it removed.
    fn repair(&self) -> Result<RepairReport, StoreError>;
}
