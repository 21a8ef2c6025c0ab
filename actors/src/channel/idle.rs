//! Idle channels cost nothing: an actor with no waiter, stream or pending write stops after a
//! quiet period (or sooner, when more than `--max-open-channels` are open: see
//! [`crate::registry`]), and the registry reopens it from the store's summary on the next use.
//!
//! Who spoke on a channel lately outlives its actor: mutual-wait detection counts every party
//! heard within the presence TTL, so a closing actor leaves its parties in [`QuietParties`] and
//! the next actor of that channel takes them back. Without that, a channel closed early would
//! forget a party that spoke a moment ago and could tell two waiters to speak first while a
//! third is about to.
//!
//! Race-free by construction: every face holds the channel's view (a [`ChannelHandle`]
//! clone, a stream, a wait) for as long as it uses the actor, and handles are cloned only
//! under the directory lock. So with the directory's write lock held, a view held by nobody
//! but the directory and the actor means no face is mid-call and none can start: removing
//! the entry then leaves later lookups to open a fresh actor.
//!
//! [`ChannelHandle`]: super::ChannelHandle

use super::ChannelActor;
use crate::ShrinkAfterBurst;
use actix::prelude::*;
use crosstalk_schema::ChannelName;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stop if idle. Sent by the registry's sweep to channels nobody has touched for `quiet`.
#[derive(Message)]
#[rtype(result = "Closed")]
pub struct CloseIfIdle {
    /// How long nobody must have used the channel: the quiet period, or less when too many
    /// channels are open.
    pub quiet: Duration,
}

/// The parties of channels whose actors closed while those parties still counted: instance
/// → when last heard, by channel. Bounded by what the closed actors held; a channel's parties
/// leave once the newest of them is older than the presence TTL ([`QuietParties::expire`]) or
/// the channel reopens ([`QuietParties::take`]).
#[derive(Debug, Default)]
pub(crate) struct QuietParties(Mutex<Kept>);

#[derive(Debug, Default)]
struct Kept {
    parties: HashMap<ChannelName, HashMap<String, Instant>>,
    /// When each keep's newest party was heard, in the order kept: expiry looks only at the
    /// front, so it costs what expires, not what is kept (tens of thousands while a burst of
    /// new channels closes early).
    order: VecDeque<(Instant, ChannelName)>,
}

/// How a channel actor leaves: the directory it leaves, and where its parties wait for the
/// channel's next actor.
#[derive(Clone)]
pub(crate) struct Exit {
    pub(crate) directory: super::Directory,
    pub(crate) parties: Arc<QuietParties>,
}

impl QuietParties {
    /// Keeps a closing channel's parties.
    fn keep(&self, channel: &ChannelName, parties: HashMap<String, Instant>) {
        let Some(newest) = parties.values().max().copied() else {
            return;
        };
        let mut kept = self.0.lock();
        kept.parties.insert(channel.clone(), parties);
        kept.order.push_back((newest, channel.clone()));
    }

    /// A reopening channel's parties, taken back.
    pub(crate) fn take(&self, channel: &ChannelName) -> HashMap<String, Instant> {
        self.0.lock().parties.remove(channel).unwrap_or_default()
    }

    /// Forgets every party not heard from for `ttl`. A keep whose newest party is older than
    /// one kept before it leaves once that one has: late by at most the gap between them.
    pub(crate) fn expire(&self, ttl: Duration) {
        let mut kept = self.0.lock();
        let Kept { parties, order } = &mut *kept;
        while let Some((newest, channel)) = order.front() {
            if newest.elapsed() < ttl {
                break;
            }
            // The channel may have reopened since (and been kept again, with later parties).
            if let Some(p) = parties.get_mut(channel) {
                p.retain(|_, seen| seen.elapsed() < ttl);
                if p.is_empty() {
                    parties.remove(channel);
                }
            }
            order.pop_front();
        }
        parties.shrink_after_burst();
        order.shrink_after_burst();
    }
}

/// What [`CloseIfIdle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub enum Closed {
    /// Still in use (or not quiet long enough): kept open.
    Busy,
    /// Stopped; `written` says whether the channel has anything in the store.
    Stopped { written: bool },
}

impl ChannelActor {
    /// Whether anything keeps this actor in memory besides a face holding its view. Recent
    /// parties do not: they are kept in [`QuietParties`] while the channel is closed.
    fn busy(&mut self) -> bool {
        !self.waiters.is_empty()
            || !self.pending.is_empty()
            || self.in_flight.is_some()
            || self.compacting
            || self.release_timer.is_some()
            || self.log.proposals().is_some_and(|p| p.busy())
    }
}

impl Handler<CloseIfIdle> for ChannelActor {
    type Result = Closed;

    fn handle(&mut self, msg: CloseIfIdle, ctx: &mut Context<Self>) -> Closed {
        if self.view.idle_for() < msg.quiet || self.busy() {
            return Closed::Busy;
        }
        let name = self.view.name().clone();
        let mut directory = self.exit.directory.write();
        let ours = directory.get(&name).is_some_and(|h| Arc::ptr_eq(&h.view, &self.view));
        // Two holders: the directory's handle and this actor. Any more is a face using it.
        if !ours || Arc::strong_count(&self.view) != 2 {
            return Closed::Busy;
        }
        directory.remove(&name);
        // Before the directory is free again: the next actor of this channel can open only
        // after this, and finds them.
        let ttl = self.config.presence_ttl;
        let mut parties = std::mem::take(&mut self.parties);
        parties.retain(|_, seen| seen.elapsed() < ttl);
        self.exit.parties.keep(&name, parties);
        drop(directory);
        ctx.stop();
        tracing::debug!(channel = %name, "idle channel closed");
        Closed::Stopped {
            written: self.view.meta().written(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QuietParties;
    use crosstalk_schema::ChannelName;
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    fn parties(ago: &[(&str, u64)]) -> HashMap<String, Instant> {
        let now = Instant::now();
        ago.iter()
            .map(|(who, secs)| (who.to_string(), now - Duration::from_secs(*secs)))
            .collect()
    }

    #[test]
    fn kept_parties_expire_by_their_newest_and_a_reopened_channel_keeps_its_later_ones() {
        let ch = |n: &str| ChannelName::parse(n).unwrap();
        let kept = QuietParties::default();
        let ttl = Duration::from_secs(60);
        kept.keep(&ch("old"), parties(&[("a", 100), ("b", 90)]));
        kept.keep(&ch("mixed"), parties(&[("a", 100), ("b", 1)]));
        // Kept, reopened (taken back), and kept again with a later party.
        kept.keep(&ch("again"), parties(&[("a", 100)]));
        assert_eq!(kept.take(&ch("again")).len(), 1);
        kept.keep(&ch("again"), parties(&[("c", 2)]));
        kept.keep(&ch("empty"), HashMap::new());
        kept.expire(ttl);
        assert!(kept.take(&ch("old")).is_empty());
        // Kept while its newest party counts (the actor drops the older one as it reads them).
        assert_eq!(kept.take(&ch("mixed")).len(), 2);
        assert_eq!(kept.take(&ch("again")).into_keys().collect::<Vec<_>>(), ["c"]);
        assert!(kept.take(&ch("empty")).is_empty());
        // "old" left the queue; the first "again" waits behind "mixed", which still counts.
        assert_eq!(kept.0.lock().order.len(), 3);
    }
}
