//! crosstalk's types: channel names, messages on the wire (JSON) and in the log (postcard),
//! and the versioned, checksummed encoding of persisted records. No IO, no async.

pub mod channel;
pub mod codec;
pub mod identity;
pub mod message;
pub mod oauth;
pub mod reservation;
pub mod state;
pub mod task;
pub mod time;
pub mod wake;
pub mod webhook;

pub use channel::{ChannelMeta, ChannelName, ChannelSummary, HeldMessage, IdFloor, Position};
pub use codec::{decode, encode, CodecError, Stored};
pub use identity::{Instance, InstanceId, InstanceKind, SharedData};
pub use message::{
    Limits, Meaning, Message, MessageRecord, MessageType, NewMessage, Overlay, Record, StreamEntry,
    DEFAULT_MAX_BODY_BYTES,
};
pub use state::{ChannelState, CutState, Effects, Session, Trim};
pub use time::Timestamp;

/// A client's input was not acceptable. The message is shown to the client as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    #[error("invalid channel name {name:?}: {reason}")]
    ChannelName { name: String, reason: &'static str },
    #[error("field `{field}` is required and must not be empty")]
    Missing { field: &'static str },
    #[error("field `{field}` is too long: {len} bytes, the limit is {max}")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("field `{field}` must not contain control characters")]
    ControlChars { field: &'static str },
    #[error("field `{field}` is invalid: {reason}")]
    Invalid { field: &'static str, reason: &'static str },
    #[error("{0}")]
    Other(String),
}
