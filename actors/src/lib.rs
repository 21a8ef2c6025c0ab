//! crosstalk's state: one actix actor per channel owning that channel's append-only event log,
//! a registry actor (channels and identities), a presence supervisor, shared data, the search
//! indexer, the group committer that makes writes durable, and the event store behind a small
//! trait.
//!
//! Nothing here speaks HTTP or MCP: the faces in the `crosstalk` binary talk to [`Relay`].

pub mod channel;
pub mod commit;
pub mod error;
pub mod identities;
pub mod ids;
pub mod nats;
pub mod presence;
pub mod registry;
pub mod relay;
pub mod search;
pub mod shared;
pub mod sled_store;
pub mod store;
pub mod view;

pub use channel::{ChannelHandle, Retention, Role};
pub use commit::Durability;
pub use error::RelayError;
pub use identities::InstanceView;
pub use presence::{Participant, PresenceEvent};
pub use registry::Registered;
pub use relay::{ChannelInfo, Directives, Relay, RelayConfig, WaitOptions, WaitOutcome, WaitResult};
pub use shared::SharedSummary;
pub use store::{EventStore, RepairReport, StoreError};
pub use view::{ChannelView, Posted};

/// Gives a map's memory back after a burst: 100,000 channels touched at once leave the maps
/// that tracked them with room for 100,000 entries after they emptied again. Once a map holds
/// under a quarter of its room (above a small floor) it shrinks to fit.
pub(crate) trait ShrinkAfterBurst {
    fn shrink_after_burst(&mut self);
}

/// Entries below which a map keeps its room: shrinking and growing again would cost more.
const SHRINK_FLOOR: usize = 1024;

impl<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher> ShrinkAfterBurst for std::collections::HashMap<K, V, S> {
    fn shrink_after_burst(&mut self) {
        if self.capacity() > 4 * self.len().max(SHRINK_FLOOR) {
            self.shrink_to_fit();
        }
    }
}

impl<K: Eq + std::hash::Hash, S: std::hash::BuildHasher> ShrinkAfterBurst for std::collections::HashSet<K, S> {
    fn shrink_after_burst(&mut self) {
        if self.capacity() > 4 * self.len().max(SHRINK_FLOOR) {
            self.shrink_to_fit();
        }
    }
}
