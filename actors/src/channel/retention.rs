//! Retention: removing what falls outside a channel's policy (age, count), in bounded steps.

use super::ChannelActor;
use crate::store::{EventStore, Undo};
use actix::prelude::*;
use crosstalk_schema::{codec, ChannelMeta, Record, Timestamp};
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
    pub(super) fn compact(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight.is_some() || !self.pending.is_empty() || self.compacting {
            return;
        }
        let Retention { max_age, max_count } = self.retention;
        let committed = self.view.meta();
        let excess = max_count.map_or(0, |max| committed.count.saturating_sub(max) as usize);
        if excess == 0 && max_age.is_none() {
            return;
        }
        let channel = self.view.name().clone();
        let outcome: Arc<Mutex<Option<(u64, usize, ChannelMeta)>>> = Default::default();
        let out = outcome.clone();
        let ticket = self.committer.write(Box::new(move |store: &dyn EventStore| {
            // The oldest events, in id order: the first `excess` messages go (count limit),
            // and every message older than the cutoff (age limit); events between them that
            // are not messages go with them.
            let cutoff = max_age.map(|age| Timestamp::now().0 - age.as_micros() as i64);
            let mut upto = 0u64;
            let mut messages = 0usize;
            for (id, bytes) in store.read(&channel, 0, committed.last_id, COMPACT_STEP)? {
                let expired = match codec::decode::<Record>(&bytes) {
                    Ok(Record::Message(m)) => {
                        messages += 1;
                        messages <= excess || cutoff.is_some_and(|c| m.created_at.0 < c)
                    }
                    // Session and description events, and damaged records, go with the
                    // messages around them.
                    _ => true,
                };
                if !expired {
                    break;
                }
                upto = id;
            }
            if upto > 0 {
                let removed = store.compact(&channel, upto, COMPACT_STEP, &committed)?;
                let after = store.meta(&channel)?.unwrap_or(committed);
                *out.lock() = Some((upto, removed, after));
            }
            // Removing expired history needs no undo: if the flush fails, the next pass
            // removes it again.
            Ok(Undo::default())
        }));
        self.compacting = true;
        // Not `durable`: an abandoned removal is not undone, and the view must learn what the
        // store removed before the next pass counts what is in excess.
        ctx.spawn(ticket.settled().into_actor(self).map(move |result, act, _| {
            act.compacting = false;
            if let Err(e) = result {
                crate::throttled!(error, channel = %act.view.name(), error = %e, "retention failed");
                return;
            }
            if let Some((upto, removed, after)) = outcome.lock().take().filter(|o| o.1 > 0) {
                act.meta.count = act.meta.count.saturating_sub(committed.count - after.count);
                act.view.compacted(upto, after);
                tracing::info!(channel = %act.view.name(), removed, upto, "retention removed old messages");
            }
        }));
    }
}
