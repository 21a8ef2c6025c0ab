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
