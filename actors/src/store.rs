//! The event store seam. Channels append batches of encoded records and read ranges back;
//! everything else (ids, visibility, broadcast) is the actors' business. sled implements it
//! today ([`crate::sled_store`]); a distributed log can replace it without touching the faces.

use crosstalk_schema::{ChannelMeta, ChannelName};

/// One stored event: its id and its encoded record (`crosstalk_schema::codec`).
pub type StoredEvent = (u64, Vec<u8>);

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Io(String),
    #[error("stored data is damaged: {0}")]
    Corrupt(String),
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
    /// Not durable until [`EventStore::flush`] returns.
    fn append(&self, channel: &ChannelName, events: &[StoredEvent], meta: &ChannelMeta) -> Result<(), StoreError>;

    /// Events with `after < id <= upto`, oldest first, at most `limit`.
    fn read(&self, channel: &ChannelName, after: u64, upto: u64, limit: usize) -> Result<Vec<StoredEvent>, StoreError>;

    /// The channel's summary, `None` for a channel never written.
    fn meta(&self, channel: &ChannelName) -> Result<Option<ChannelMeta>, StoreError>;

    /// Every channel ever written, with its summary. Costs one read per channel, not per event.
    fn channels(&self) -> Result<Vec<(ChannelName, ChannelMeta)>, StoreError>;

    /// Makes everything appended so far durable.
    fn flush(&self) -> Result<(), StoreError>;

    /// Checks the newest records of every channel and removes a damaged tail, so the relay
    /// serves everything before it. Returns what it removed.
    fn repair(&self) -> Result<Vec<Repair>, StoreError>;

    /// Bytes the store occupies on disk.
    fn size_on_disk(&self) -> Result<u64, StoreError>;
}
