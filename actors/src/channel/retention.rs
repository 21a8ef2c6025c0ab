//! Retention: removing what falls outside a channel's policy (age, count), in bounded steps.

use super::ChannelActor;
use crate::cluster::{TrimNext, TrimPlan, TrimStep};
use crate::error::RelayError;
use crate::store::{Append, EventStore, Space, StoreError, Undo};
use crate::view::Published;
use actix::prelude::*;
use crosstalk_schema::{codec, ChannelMeta, ChannelName, ChannelState, CutState, Record, Timestamp, Trim};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// Events removed per retention pass, so a pass never stalls the channel for long.
const COMPACT_STEP: usize = 10_000;

/// Retention of a channel's messages; compaction removes what falls outside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    pub max_age: Option<Duration>,
    pub max_count: Option<u64>,
}

impl ChannelActor {
    /// One retention pass, run by the store thread: finds what falls outside the policy and
    /// removes it (at most [`COMPACT_STEP`] events). Skipped while a batch is in flight or
    /// pending, so the summary it writes is the committed one.
    ///
    /// What the policy's cut then does is the channel log's ([`crate::cluster::ChannelLog::trim_pass`]): a log
    /// of the channel's own removes it; on a shared log it is proposed to the log as a
    /// [`Record::Trimmed`] event, and every node removes what a committed cut reaches, at the
    /// same place in the log, whatever its own policy.
    pub(super) fn compact(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_some() || !self.pending.is_empty() || self.compacting {
            return;
        }
        let Retention { max_age, max_count } = self.retention;
        let committed = self.view.meta();
        let excess = max_count.map_or(0, |max| committed.count.saturating_sub(max) as usize);
        let policy = excess > 0 || max_age.is_some();
        let Some(step) = self.log.trim_pass(policy, &self.view.channel_state()) else {
            return;
        };
        let channel = self.view.name().clone();
        let outcome: Arc<Mutex<Outcome>> = Default::default();
        let out = outcome.clone();
        let ticket = self.committer.write(Box::new(move |store: &dyn EventStore| {
            let mut upto = 0u64;
            if policy {
                // The oldest events, in id order: the first `excess` messages go (count
                // limit), and every message older than the cutoff (age limit); events between
                // them that are not messages go with them.
                let cutoff = max_age.map(|age| Timestamp::now().0 - age.as_micros() as i64);
                let mut messages = 0usize;
                for (id, bytes) in store.read(&channel, 0, committed.last_id, COMPACT_STEP)? {
                    let expired = match codec::decode::<Record>(&bytes) {
                        Ok(Record::Message(m)) => {
                            messages += 1;
                            messages <= excess || cutoff.is_some_and(|c| m.created_at.0 < c)
                        }
                        // Session, description and cut events, and damaged records, go with
                        // the messages around them.
                        _ => true,
                    };
                    if !expired {
                        break;
                    }
                    upto = id;
                }
            }
            let plan = step(store, &channel, upto)?;
            let mut o = out.lock();
            if plan.remove > 0 {
                let removed = store.compact(&channel, plan.remove, COMPACT_STEP, &committed)?;
                let after = store.meta(&channel)?.unwrap_or(committed);
                o.removed = Some((plan.remove, removed, after));
            }
            o.plan = plan;
            // Removing expired history needs no undo: if the flush fails, the next pass
            // removes it again.
            Ok(Undo::default())
        }));
        self.compacting = true;
        // Not `durable`: an abandoned removal is not undone, and the view must learn what the
        // store removed before the next pass counts what is in excess.
        ctx.spawn(ticket.settled().into_actor(self).map(move |result, act, ctx| {
            act.compacting = false;
            if let Err(e) = result {
                crate::throttled!(error, channel = %act.view.name(), error = %e, "retention failed");
                return;
            }
            let Outcome { plan, removed } = std::mem::take(&mut *outcome.lock());
            if let Some((upto, removed, after)) = removed {
                if removed > 0 {
                    act.meta.count = act.meta.count.saturating_sub(committed.count - after.count);
                    act.view.compacted(upto, after);
                    tracing::info!(channel = %act.view.name(), removed, upto, "retention removed old messages");
                }
            }
            let trimmed_through = act.trimmed_through();
            let next = act
                .log
                .trimmed(plan, removed.map(|(upto, n, _)| (upto, n)), trimmed_through);
            if let Some(cut) = next.publish {
                act.publish_cut(cut, ctx);
            }
            if let Some(through) = next.propose {
                act.propose_trim(through, ctx);
            }
        }));
    }

    /// Records the state after the log's cut for the cluster, once this node has applied it.
    fn publish_cut(&mut self, cut: CutState, ctx: &mut Context<Self>) {
        let through = cut.trim.through;
        let publish = self.log.publish_cut(cut);
        ctx.spawn(publish.into_actor(self).map(move |result, act, _| match result {
            Ok(()) => {
                tracing::info!(channel = %act.view.name(), through, "recorded the state after the retention cut; the log no longer holds what it removed");
                act.log.cut_published(through);
            }
            Err(e) => {
                crate::throttled!(warn, channel = %act.view.name(), error = %e, "recording a retention cut for the cluster failed; next pass")
            }
        }));
    }

    /// Logs this node's retention cut for every node to apply.
    fn propose_trim(&mut self, through: u64, ctx: &mut Context<Self>) {
        let record = Record::Trimmed {
            through,
            at: Timestamp::now(),
        };
        let super::Submitted::Proposed(verdict) = self.submit(record, None, ctx) else {
            // Not a shared log after all: nothing to log.
            return;
        };
        self.log.proposing(true);
        ctx.spawn(verdict.into_actor(self).map(move |verdict, act, _| {
            act.log.proposing(false);
            if let Ok(Err(e)) = verdict {
                crate::throttled!(warn, channel = %act.view.name(), error = %e, "logging a retention cut failed; next pass");
            }
        }));
    }
}

/// What a retention pass found: the channel log's plan, and what the store removed.
#[derive(Default)]
struct Outcome {
    plan: TrimPlan,
    removed: Option<(u64, usize, ChannelMeta)>,
}

/// Retention on a node's copy of a shared log ([`crate::cluster::ChannelLog`]'s retention for it): the node
/// proposes its own policy's cut to the log, and applies the cuts the log committed, whatever
/// its own policy.
#[derive(Debug, Default)]
pub struct LoggedTrims {
    /// The logged cut this copy has applied.
    applied: u64,
    /// Whether this node has a cut of its own on its way to the log.
    proposed: bool,
    /// The cut whose state this node last recorded for the cluster.
    published: u64,
}

impl LoggedTrims {
    /// [`crate::cluster::ChannelLog::trim_pass`]: the policy's cut is proposed, and the log's last cut
    /// (`state.trimmed`, once this copy has committed the event that logs it) is carried and
    /// removed.
    pub fn pass(&self, policy: bool, state: &ChannelState) -> Option<TrimStep> {
        let cut = state.trimmed;
        if !policy && cut.map_or(0, |t| t.through) <= self.applied {
            return None;
        }
        Some(Box::new(move |store, channel, upto| {
            let mut plan = TrimPlan {
                propose: upto,
                ..TrimPlan::default()
            };
            if let Some(cut) = cut {
                let state = carry_cut(store, channel, cut)?;
                plan.remove = state.trim.through;
                if state.trim == cut {
                    plan.cut = Some(state);
                }
            }
            Ok(plan)
        }))
    }

    /// [`crate::cluster::ChannelLog::trimmed`].
    pub fn trimmed(&mut self, plan: TrimPlan, removed: Option<(u64, usize)>, trimmed_through: u64) -> TrimNext {
        // Up to the step's limit: a long cut is applied over several passes.
        if let Some((upto, _)) = removed.filter(|(_, n)| *n < COMPACT_STEP) {
            self.applied = self.applied.max(upto);
        }
        TrimNext {
            publish: plan.cut.filter(|c| c.trim.through > self.published),
            propose: (plan.propose > trimmed_through && !self.proposed).then_some(plan.propose),
        }
    }

    pub fn published(&mut self, through: u64) {
        self.published = self.published.max(through);
    }

    pub fn proposing(&mut self, busy: bool) {
        self.proposed = busy;
    }

    pub fn installed(&mut self, through: u64) {
        self.applied = through;
        self.published = through;
    }
}

/// Where a node keeps the state after the last cut it applied to a channel.
fn cut_key(channel: &ChannelName) -> Vec<u8> {
    format!("cut/{channel}").into_bytes()
}

/// What a node that never folds the events `cut` removes starts from: the state right after
/// them, carried forward from the last cut by the events themselves (at most [`COMPACT_STEP`]
/// of them a pass) and recorded before they go. Its `trim` is `cut` once it holds them all.
fn carry_cut(store: &dyn EventStore, channel: &ChannelName, cut: Trim) -> Result<CutState, StoreError> {
    let mut state = stored_cut(store, channel)?;
    if state.trim.through >= cut.through {
        return Ok(state);
    }
    let events = store.read(channel, state.trim.through, cut.through, COMPACT_STEP)?;
    let whole = events.len() < COMPACT_STEP;
    for (id, bytes) in &events {
        match codec::decode::<Record>(bytes) {
            Ok(record) => state.replay(*id, &record),
            Err(e) => {
                tracing::error!(%channel, id, error = %e, "an event that does not decode is left out of the cut's state");
                state.trim.through = *id;
            }
        }
    }
    if whole {
        state.trim = cut;
    }
    store.put_aux(Space::Jobs, &cut_key(channel), Some(&codec::encode(&state)))?;
    Ok(state)
}

fn stored_cut(store: &dyn EventStore, channel: &ChannelName) -> Result<CutState, StoreError> {
    match store.get_aux(Space::Jobs, &cut_key(channel))? {
        None => Ok(CutState::default()),
        Some(bytes) => codec::decode(&bytes).map_err(|e| StoreError::Corrupt(format!("cut state of {channel}: {e}"))),
    }
}

/// Starts a channel from a cut of the shared log, on a node that has not folded every event
/// the cut removed (it joined after they left the log, or was away while they did): its copy
/// of the channel is emptied and takes the cut's state, and the fold goes on from the first
/// event after the cut. Answers whether it did (`false`: the channel is past the cut already).
/// `Err` while a batch of the channel is on its way to the store: try again.
#[derive(Message)]
#[rtype(result = "Result<bool, RelayError>")]
pub struct Install(pub CutState);

impl Handler<Install> for ChannelActor {
    type Result = ResponseActFuture<Self, Result<bool, RelayError>>;

    fn handle(&mut self, Install(cut): Install, _: &mut Context<Self>) -> Self::Result {
        let through = cut.trim.through;
        if through <= self.meta.last_id {
            return Box::pin(fut::ready(Ok(false)));
        }
        if self.in_flight.is_some() || !self.pending.is_empty() || self.compacting {
            return Box::pin(fut::ready(Err(RelayError::Unavailable("the channel is writing"))));
        }
        let mut state = cut.state.clone();
        state.trimmed = Some(cut.trim);
        let meta = ChannelMeta {
            count: 0,
            last_id: through,
            last_at: cut.last_at,
            created_at: cut.created_at,
            last_message_id: cut.last_message_id,
        };
        // The fold goes on from the cut at once; the store and the view follow in order.
        self.meta = meta;
        self.state = state.clone();
        self.overlays.clear();
        self.next_overlays.clear();
        self.next_replies.clear();
        self.next_state_dirty = false;
        self.idem_uncommitted.clear();
        self.log.installed(through);
        let channel = self.view.name().clone();
        let encoded = codec::encode(&cut);
        let published = state.clone();
        let apply = Box::new(move |store: &dyn EventStore| {
            // Whatever this copy held of the channel is behind the cut.
            loop {
                let left = store.meta(&channel)?.unwrap_or_default();
                if store.compact(&channel, through, COMPACT_STEP, &left)? < COMPACT_STEP {
                    break;
                }
            }
            store.append(Append {
                channel: &channel,
                events: &[],
                meta: &meta,
                state: Some(&state),
                overlays: &[],
                replies: &[],
                idempotency: &[],
            })?;
            store.put_aux(Space::Jobs, &cut_key(&channel), Some(&encoded))?;
            Ok(Undo::default())
        });
        let view = self.view.clone();
        let ticket = self.committer.write_then(
            apply,
            Box::new(move || {
                view.compacted(through, meta);
                view.publish(Published {
                    messages: Vec::new(),
                    meta,
                    state: Some(published),
                    overlays: Vec::new(),
                });
            }),
        );
        Box::pin(ticket.durable().into_actor(self).map(move |result, act, _| match result {
            Ok(()) => {
                tracing::info!(channel = %act.view.name(), through, "started the channel from the log's retention cut");
                Ok(true)
            }
            Err(e) => {
                // Returns only if the relay can go on without it, which a node's copy cannot.
                act.log.refused_batch(&e);
                Err(e.into())
            }
        }))
    }
}
