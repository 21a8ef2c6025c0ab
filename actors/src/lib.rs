//! crosstalk's state: one actix actor per channel owning that channel's append-only event log,
//! a registry actor (channels and identities), a presence supervisor, shared data, the search
//! indexer, the group committer that makes writes durable, and the event store behind a small
//! trait. What a relay shares with other nodes goes through one seam, [`cluster::Cluster`]:
//! [`cluster::Embedded`] on a relay of its own, [`nats::NatsCluster`] on a NATS JetStream cluster.
//!
//! Nothing here speaks HTTP or MCP: the faces in the `crosstalk` binary talk to [`Relay`].

pub mod channel;
pub mod cluster;
pub mod commit;
pub mod error;
pub mod identities;
pub mod ids;
pub mod nats;
pub mod presence;
pub mod proposals;
pub mod records;
pub mod registry;
pub mod relay;
pub mod search;
pub mod shared;
pub mod sled_store;
pub mod store;
pub mod throttle;
pub mod view;

pub use channel::{ChannelHandle, Retention, Role};
pub use cluster::{Cluster, Embedded};
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

/// Whether a map of `len` entries with room for `capacity` is left over from a burst.
fn burst_room(capacity: usize, len: usize) -> bool {
    capacity > 4 * len.max(SHRINK_FLOOR)
}

impl<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher> ShrinkAfterBurst for std::collections::HashMap<K, V, S> {
    fn shrink_after_burst(&mut self) {
        if burst_room(self.capacity(), self.len()) {
            self.shrink_to_fit();
        }
    }
}

impl<K: Eq + std::hash::Hash, S: std::hash::BuildHasher> ShrinkAfterBurst for std::collections::HashSet<K, S> {
    fn shrink_after_burst(&mut self) {
        if burst_room(self.capacity(), self.len()) {
            self.shrink_to_fit();
        }
    }
}

impl<T> ShrinkAfterBurst for std::collections::VecDeque<T> {
    fn shrink_after_burst(&mut self) {
        if burst_room(self.capacity(), self.len()) {
            self.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ShrinkAfterBurst;
    use std::collections::{HashMap, HashSet};

    #[test]
    fn a_map_gives_back_the_room_of_a_burst_and_keeps_a_small_one() {
        let mut burst: HashMap<u32, u32> = (0..100_000).map(|i| (i, i)).collect();
        burst.retain(|k, _| *k < 10);
        burst.shrink_after_burst();
        assert!(burst.capacity() < 100, "{}", burst.capacity());
        assert_eq!(burst.len(), 10);

        let mut small: HashSet<u32> = (0..500).collect();
        small.retain(|k| *k < 10);
        // (What `capacity` reports moves with removals, so it is read after them.)
        let room = small.capacity();
        small.shrink_after_burst();
        assert_eq!(small.capacity(), room, "under the floor a map keeps its room");
    }

    /// Every open channel costs its actor: one that held its own copy of the shared settings
    /// doubled the peak of many open channels (docs/benchmarks.md, "Measurements behind design
    /// choices").
    #[test]
    fn a_channel_actor_stays_small() {
        let size = std::mem::size_of::<crate::channel::ChannelActor>();
        assert!(size <= 1024, "ChannelActor is {size} bytes");
    }
}
