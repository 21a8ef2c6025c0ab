//! The one error type of this layer: what went wrong, in terms a face can map to a status.

use crate::store::StoreError;
use crosstalk_schema::InvalidInput;

#[derive(Debug, Clone, thiserror::Error)]
pub enum RelayError {
    /// The client's input was refused; nothing was stored.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The store failed; the write, if any, was not acknowledged.
    #[error("storage error: {0}")]
    Store(#[from] StoreError),
    /// The store is not answering (a flush that hangs): writes are refused at once.
    #[error("the store is not answering: {0}")]
    StoreUnavailable(String),
    /// A configured limit is reached (channels per relay).
    #[error("{0}")]
    LimitReached(String),
    /// An actor did not answer in time or has stopped.
    #[error("the relay is overloaded or stopping: {0}")]
    Unavailable(&'static str),
    /// The caller may not do this (e.g. act as an identity bound to another session).
    #[error("{0}")]
    Forbidden(String),
    /// Conflicts with the current state (e.g. an instance id live in another session).
    #[error("{0}")]
    Conflict(String),
    /// What the request names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The relay is shutting down and takes no new work.
    #[error("the relay is shutting down")]
    ShuttingDown,
}

impl From<actix::MailboxError> for RelayError {
    fn from(e: actix::MailboxError) -> Self {
        match e {
            actix::MailboxError::Closed => RelayError::Unavailable("actor mailbox closed"),
            actix::MailboxError::Timeout => RelayError::Unavailable("actor did not answer in time"),
        }
    }
}
