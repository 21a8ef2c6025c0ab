//! Idle channels cost nothing: an actor with no waiter, stream, pending write or recent
//! party stops after a quiet period, and the registry reopens it from the store's summary on
//! the next use.
//!
//! Race-free by construction: every face holds the channel's view (a [`ChannelHandle`]
//! clone, a stream, a wait) for as long as it uses the actor, and handles are cloned only
//! under the directory lock. So with the directory's write lock held, a view held by nobody
//! but the directory and the actor means no face is mid-call and none can start: removing
//! the entry then leaves later lookups to open a fresh actor.
//!
//! [`ChannelHandle`]: super::ChannelHandle

use super::ChannelActor;
use actix::prelude::*;
use std::sync::Arc;

/// Stop if idle. Sent by the registry's sweep to channels nobody has touched for a while.
#[derive(Message)]
#[rtype(result = "Closed")]
pub struct CloseIfIdle;

/// What [`CloseIfIdle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub enum Closed {
    /// Still in use (or not quiet long enough): kept open.
    Busy,
    /// Stopped; `written` says whether the channel has anything in the store.
    Stopped { written: bool },
}

impl ChannelActor {
    /// Whether anything keeps this actor in memory besides a face holding its view.
    fn busy(&mut self) -> bool {
        let ttl = self.config.presence_ttl;
        // A party heard from recently still counts in mutual-wait detection, which only
        // this actor remembers.
        self.parties.retain(|_, seen| seen.elapsed() < ttl);
        !self.waiters.is_empty()
            || !self.pending.is_empty()
            || self.in_flight.is_some()
            || self.compacting
            || self.release_timer.is_some()
            || !self.parties.is_empty()
            || self.log.proposals().is_some_and(|p| p.busy())
    }
}

impl Handler<CloseIfIdle> for ChannelActor {
    type Result = Closed;

    fn handle(&mut self, _: CloseIfIdle, ctx: &mut Context<Self>) -> Closed {
        let Some(quiet) = self.config.idle_after else {
            return Closed::Busy;
        };
        if self.view.idle_for() < quiet || self.busy() {
            return Closed::Busy;
        }
        let name = self.view.name().clone();
        let mut directory = self.directory.write();
        let ours = directory.get(&name).is_some_and(|h| Arc::ptr_eq(&h.view, &self.view));
        // Two holders: the directory's handle and this actor. Any more is a face using it.
        if !ours || Arc::strong_count(&self.view) != 2 {
            return Closed::Busy;
        }
        directory.remove(&name);
        drop(directory);
        ctx.stop();
        tracing::debug!(channel = %name, "idle channel closed");
        Closed::Stopped {
            written: self.view.meta().written(),
        }
    }
}
