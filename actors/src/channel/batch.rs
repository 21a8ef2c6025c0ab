//! A channel's commit path: pending events become one batch for the store thread, up to
//! [`MAX_IN_FLIGHT`] batches in flight, each written only if the one before it is
//! ([`Committer::write_after`]): while one batch is flushed the next waits in the store
//! thread's queue, so the store thread goes from one to the next without waiting for the
//! actor to hear the first verdict.
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
use crate::commit::Link;
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

/// Batches a channel has with the store thread at once: one being written, the next queued
/// behind it.
pub(super) const MAX_IN_FLIGHT: usize = 2;

/// A batch between append and durable.
pub(super) struct InFlight {
    /// Which batch it is, for its verdict to find it.
    pub number: u64,
    pub events: Vec<Pending>,
    pub answers: Arc<Answers>,
    /// Its write, for the next batch to follow.
    pub link: Link,
    /// Refused with one before it: its verdict only tells its waiters.
    pub doomed: bool,
    /// Its verdict, when it came before the verdict of a batch sent before it: verdicts are
    /// handled in the order the batches were sent.
    pub verdict: Option<Result<(), StoreError>>,
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
            .iter()
            .find(|f| f.events.iter().any(|p| p.logged && p.id == id))
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

    /// Hands the pending events to the store thread as one batch, following the batch before
    /// it if one is in flight, so batches become durable and visible in id order. The actor
    /// does no store IO itself.
    pub(super) fn start_commit(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.len() >= MAX_IN_FLIGHT || self.pending.is_empty() || self.draining {
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
        let follows = self.in_flight.back().map(|f| f.link.clone());
        let ticket = self.committer.write_after(
            apply,
            Box::new(move || {
                view.publish(publish);
                told.decide(Ok(()));
            }),
            follows,
        );
        let number = self.next_batch;
        self.next_batch += 1;
        self.in_flight.push_back(InFlight {
            number,
            events: batch,
            answers,
            link: ticket.link(),
            doomed: false,
            verdict: None,
        });
        // The channel's log says how long a batch may wait (see `fail`).
        let limit = self.log.commit_deadline();
        ctx.spawn(
            ticket
                .durable_within(limit)
                .into_actor(self)
                .map(move |result, act, ctx| {
                    if let Some(batch) = act.in_flight.iter_mut().find(|f| f.number == number) {
                        batch.verdict = Some(result);
                    }
                    while act.in_flight.front().is_some_and(|f| f.verdict.is_some()) {
                        if let Some(mut batch) = act.in_flight.pop_front() {
                            let verdict = batch.verdict.take().unwrap_or(Ok(()));
                            act.decided(batch, verdict, ctx);
                        }
                    }
                    if act.in_flight.is_empty() {
                        act.draining = false;
                    }
                    act.start_commit(ctx);
                }),
        );
    }

    /// The bookkeeping of a batch's verdict, oldest batch first. Its posters were answered,
    /// and a durable batch published, by the store thread already.
    fn decided(&mut self, batch: InFlight, verdict: Result<(), StoreError>, ctx: &mut Context<Self>) {
        match verdict {
            Ok(()) if batch.doomed => {
                // Cannot be: a batch is written only if the one before it is.
                crate::throttled!(error, channel = %self.view.name(), "a batch after a refused one was written");
            }
            Ok(()) => {
                let now = Instant::now();
                for p in batch.events {
                    if let Some(posted) = &p.posted {
                        self.parties.insert(posted.message.sender.clone(), now);
                    }
                    if let Some(k) = &p.idem {
                        self.idem_uncommitted.remove(k);
                    }
                }
                self.spoken += 1;
                if let Some(t) = self.release_timer.take() {
                    ctx.cancel_future(t);
                }
            }
            Err(e) if batch.doomed => self.unfollowed(batch, e),
            Err(e) => {
                crate::throttled!(error, channel = %self.view.name(), error = %e, "commit failed; nothing acknowledged");
                self.fail(batch, e);
            }
        }
    }

    /// A batch sent after a refused one came back refused too: its waiters are told. The
    /// state went back to the view's when the first was refused, and what was accepted since
    /// was accepted on that state: it stays.
    fn unfollowed(&mut self, batch: InFlight, e: StoreError) {
        batch.answers.decide(Err(e.clone()));
        for p in batch.events {
            if let Some(k) = &p.idem {
                self.idem_uncommitted.remove(k);
            }
            for d in p.done {
                d.send(Err(e.clone().into()));
            }
        }
    }

    /// A batch failed: tell its waiters and those of every event accepted after it, and go
    /// back to the store's idea of the state (the batch is never shown; if it reached the
    /// store's memory, a restart may read it back). The batches sent after it follow it, so
    /// they will be refused too: they are marked, and no batch starts until they are back.
    fn fail(&mut self, batch: InFlight, e: StoreError) {
        // Returns only if the relay can go on without the batch (not on a node's copy of a
        // shared log, which must stay a prefix of it).
        self.log.refused_batch(&e);
        for later in self.in_flight.iter_mut() {
            later.doomed = true;
        }
        self.draining = !self.in_flight.is_empty();
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
