//! A channel's commit path: pending events become one batch for the store thread, one batch
//! in flight at a time.
//!
//! Who is told what, and from which thread:
//! - the store thread, the moment the batch is durable, publishes it to the view (waking
//!   readers) and answers its posters (the [`Answers`] hook). A post therefore crosses three
//!   threads (HTTP worker → actors' thread → store thread → worker), not five, and the worker
//!   hears nothing before the verdict: the post's reply travels with it ([`super::Post`]);
//! - the actor learns the verdict afterwards, through the ticket, and only does its own
//!   bookkeeping then (idempotency keys, parties, the next batch);
//! - a refused or abandoned batch is never published: the actor answers its posters with the
//!   error and goes back to the view's state.

use super::{ChannelActor, Done};
use crate::error::RelayError;
use crate::store::{Append, EventStore, StoreError};
use crate::view::{Posted, Published};
use actix::prelude::*;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// An event accepted but not yet durable.
pub(super) struct Pending {
    pub id: u64,
    /// Whether it is an event of the log. A lone relay keeps a description or a session
    /// start or end in the channel's state alone, under no id of its own (`id` 0): only
    /// messages take ids there, as in the relays crosstalk replaces.
    pub logged: bool,
    pub encoded: Vec<u8>,
    pub posted: Option<Arc<Posted>>,
    pub idem: Option<String>,
    /// Told when the event is durable (or failed), until it joins a batch.
    pub done: Vec<Done>,
}

/// The batch between append and durable.
pub(super) struct InFlight {
    pub events: Vec<Pending>,
    pub answers: Arc<Answers>,
}

/// Everyone waiting for one batch's verdict. The first verdict wins; a waiter added after it
/// is answered at once.
pub(super) struct Answers(Mutex<Verdict>);

enum Verdict {
    Waiting(Vec<Done>),
    Decided(Result<(), StoreError>),
}

impl Answers {
    fn new(waiting: Vec<Done>) -> Self {
        Answers(Mutex::new(Verdict::Waiting(waiting)))
    }

    fn add(&self, done: Done) {
        match &mut *self.0.lock() {
            Verdict::Waiting(all) => all.push(done),
            Verdict::Decided(r) => done.send(r.clone().map_err(RelayError::from)),
        }
    }

    fn decide(&self, result: Result<(), StoreError>) {
        let waiting = {
            let mut v = self.0.lock();
            if matches!(*v, Verdict::Decided(_)) {
                return;
            }
            std::mem::replace(&mut *v, Verdict::Decided(result.clone()))
        };
        if let Verdict::Waiting(all) = waiting {
            for d in all {
                d.send(result.clone().map_err(RelayError::from));
            }
        }
    }
}

impl ChannelActor {
    /// A receiver told when event `id` (pending or in flight) is durable; at once if it is
    /// already.
    pub(super) fn when_durable(&mut self, id: u64) -> oneshot::Receiver<Result<(), RelayError>> {
        let (tx, rx) = oneshot::channel();
        self.on_durable(id, Done::Durable(tx));
        rx
    }

    /// Tells `done` when event `id` (pending or in flight) is durable; at once if it is
    /// already.
    pub(super) fn on_durable(&mut self, id: u64, done: Done) {
        // From the newest: a post's own event was accepted just now, so this finds it at once
        // however many are pending behind a slow store.
        if let Some(p) = self.pending.iter_mut().rev().find(|p| p.logged && p.id == id) {
            p.done.push(done);
        } else if let Some(f) = self
            .in_flight
            .as_ref()
            .filter(|f| f.events.iter().any(|p| p.logged && p.id == id))
        {
            f.answers.add(done);
        } else {
            done.send(Ok(()));
        }
    }

    /// A receiver told when the newest change kept in the state alone ([`ChannelActor::note`])
    /// is durable; at once if none waits.
    pub(super) fn when_noted(&mut self) -> oneshot::Receiver<Result<(), RelayError>> {
        let (tx, rx) = oneshot::channel();
        match self.pending.iter_mut().rev().find(|p| !p.logged) {
            Some(p) => p.done.push(Done::Durable(tx)),
            None => {
                let _ = tx.send(Ok(()));
            }
        }
        rx
    }

    /// The events accepted but not yet durable, oldest first.
    pub(super) fn uncommitted(&self) -> impl Iterator<Item = &Pending> {
        self.in_flight
            .iter()
            .flat_map(|f| f.events.iter())
            .chain(self.pending.iter())
    }

    /// Hands the pending events to the store thread as one batch (one at a time, so batches
    /// become durable and visible in id order). The actor does no store IO itself.
    pub(super) fn start_commit(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_some() || self.pending.is_empty() {
            return;
        }
        let mut batch = std::mem::take(&mut self.pending);
        let events: Vec<_> = batch
            .iter()
            .filter(|p| p.logged)
            .map(|p| (p.id, p.encoded.clone()))
            .collect();
        let overlays: Vec<(u64, crosstalk_schema::Overlay)> = std::mem::take(&mut self.next_overlays)
            .into_iter()
            .map(|id| (id, self.overlays.get(&id).copied().unwrap_or_default()))
            .collect();
        let replies = std::mem::take(&mut self.next_replies);
        let state = std::mem::take(&mut self.next_state_dirty).then(|| self.state.clone());
        let idempotency: Vec<(String, u64)> = batch.iter().filter_map(|p| p.idem.clone().map(|k| (k, p.id))).collect();
        let meta = self.meta;
        let publish = Published {
            messages: batch.iter().filter_map(|p| p.posted.clone()).collect(),
            meta,
            state: state.clone(),
            overlays: overlays.clone(),
        };
        let senders: Vec<String> = publish.messages.iter().map(|m| m.message.sender.clone()).collect();
        let answers = Arc::new(Answers::new(batch.iter_mut().flat_map(|p| p.done.drain(..)).collect()));
        let channel = self.view.name().clone();
        let apply = Box::new(move |store: &dyn EventStore| {
            store.append(Append {
                channel: &channel,
                events: &events,
                meta: &meta,
                state: state.as_ref(),
                overlays: &overlays,
                replies: &replies,
                idempotency: &idempotency,
            })
        });
        let (view, told) = (self.view.clone(), answers.clone());
        let ticket = self.committer.write_then(
            apply,
            Box::new(move || {
                view.publish(publish);
                told.decide(Ok(()));
            }),
        );
        self.in_flight = Some(InFlight { events: batch, answers });
        // The channel's log says how long a batch may wait (see `fail`).
        let limit = self.log.commit_deadline();
        ctx.spawn(ticket.durable_within(limit).into_actor(self).map(move |result, act, ctx| {
            let Some(batch) = act.in_flight.take() else {
                return;
            };
            match result {
                Ok(()) => {
                    // Published and answered by the store thread already.
                    let now = Instant::now();
                    for s in senders {
                        act.parties.insert(s, now);
                    }
                    act.spoken += 1;
                    if let Some(t) = act.release_timer.take() {
                        ctx.cancel_future(t);
                    }
                    for p in batch.events {
                        if let Some(k) = &p.idem {
                            act.idem_uncommitted.remove(k);
                        }
                    }
                }
                Err(e) => {
                    crate::throttled!(error, channel = %act.view.name(), error = %e, "commit failed; nothing acknowledged");
                    act.fail(batch, e);
                }
            }
            act.start_commit(ctx);
        }));
    }

    /// A batch failed: tell its waiters and those of every event accepted after it, and go
    /// back to the store's idea of the state (the batch is never shown; if it reached the
    /// store's memory, a restart may read it back).
    fn fail(&mut self, batch: InFlight, e: StoreError) {
        // Returns only if the relay can go on without the batch (not on a node's copy of a
        // shared log, which must stay a prefix of it).
        self.log.refused_batch(&e);
        batch.answers.decide(Err(e.clone()));
        for p in batch.events.into_iter().chain(std::mem::take(&mut self.pending)) {
            if let Some(k) = &p.idem {
                self.idem_uncommitted.remove(k);
            }
            for d in p.done {
                d.send(Err(e.clone().into()));
            }
        }
        self.meta = self.view.meta();
        self.state = self.view.channel_state();
        self.next_overlays.clear();
        self.next_replies.clear();
        self.next_state_dirty = false;
        self.overlays = self.view.overlays();
    }
}
