//! crosstalk's state: one actix actor per channel owning that channel's append-only event log,
//! a registry actor that starts channels on first use, a presence supervisor, the group
//! committer that makes writes durable, and the event store behind a small trait.
//!
//! Nothing here speaks HTTP or MCP: the faces in the `crosstalk` binary talk to [`Relay`].

pub mod channel;
pub mod commit;
pub mod error;
pub mod presence;
pub mod registry;
pub mod relay;
pub mod sled_store;
pub mod store;

pub use channel::{ChannelHandle, ChannelView, Posted};
pub use commit::Durability;
pub use error::RelayError;
pub use presence::{Participant, PresenceEvent};
pub use relay::{Relay, RelayConfig};
pub use store::{EventStore, RepairReport, StoreError};
