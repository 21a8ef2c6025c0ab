//! Writes proposed to a shared log and waiting for the fold to reach them (see
//! `crate::channel`'s `logged` module): the fold's verdict on each event, and the proposals of
//! this node that wait for one. A channel's [`crate::cluster::ChannelLog`] keeps them where
//! its events are put in order elsewhere.

use crate::error::RelayError;
use crate::view::Posted;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Verdicts kept for proposals whose acknowledgement arrives after the fold reached them.
const RECENT_VERDICTS: usize = 4096;

/// What the fold made of one event.
#[derive(Clone)]
pub enum Folded {
    /// Stored under this id (the message, for a message).
    Stored(u64, Option<Arc<Posted>>),
    /// A retried post: the original's id.
    Duplicate(u64),
    /// Nothing to change (ending a session that already ended, the same description).
    Unchanged,
    /// Kept in the channel's state alone, under no id (a lone relay's description or session
    /// change): durable once this receiver says so.
    Noted,
    /// Refused; nothing stored.
    Rejected(RelayError),
}

/// What a proposer is told: the fold's verdict, and when the node's store has it.
pub struct Outcome {
    pub folded: Folded,
    pub durable: oneshot::Receiver<Result<(), RelayError>>,
}

pub type Verdict = oneshot::Sender<Result<Outcome, RelayError>>;

/// Proposals of this node waiting for the fold, and the fold's recent verdicts: kept by the
/// channel's log where it is shared ([`crate::cluster::ChannelLog::proposals`]).
#[derive(Default)]
pub struct Proposals {
    /// Appends sent to the log and not yet acknowledged.
    pub appending: usize,
    /// Acknowledged, waiting for the fold to reach their id (each proposal's own), since when.
    pub waiting: HashMap<u64, (Verdict, Instant)>,
    recent: VecDeque<(u64, Folded)>,
}

impl Proposals {
    pub fn busy(&self) -> bool {
        self.appending > 0 || !self.waiting.is_empty()
    }

    /// What the fold made of `id`, if it is recent enough to be kept.
    pub fn recent(&self, id: u64) -> Option<Folded> {
        self.recent.iter().rev().find(|(s, _)| *s == id).map(|(_, f)| f.clone())
    }

    /// Keeps what the fold made of `id`, for a proposal acknowledged after the fold reached it.
    pub fn remember(&mut self, id: u64, folded: Folded) {
        self.recent.push_back((id, folded));
        if self.recent.len() > RECENT_VERDICTS {
            self.recent.pop_front();
        }
    }
}
