//! Retention: removing what falls outside a channel's policy (age, count), in bounded steps.

use super::ChannelActor;
use crosstalk_schema::{codec, Record, Timestamp};
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
    /// One retention pass: removes what falls outside the retention policy.
    pub(super) fn compact(&mut self) {
        let Retention { max_age, max_count } = self.config.retention;
        let committed = self.view.meta();
        let mut upto = 0u64;
        if let Some(max) = max_count {
            let excess = committed.count.saturating_sub(max) as usize;
            if excess > 0 {
                if let Ok(old) = self.view.read(0, excess.min(COMPACT_STEP)) {
                    upto = upto.max(old.last().map_or(0, |p| p.id()));
                }
            }
        }
        if let Some(age) = max_age {
            let cutoff = Timestamp::now().0 - age.as_micros() as i64;
            if let Ok(old) = self.store.read(self.view.name(), 0, committed.last_id, COMPACT_STEP) {
                for (id, bytes) in old {
                    match codec::decode::<Record>(&bytes) {
                        Ok(Record::Message(m)) if m.created_at.0 >= cutoff => break,
                        _ => upto = upto.max(id),
                    }
                }
            }
        }
        if upto == 0 {
            return;
        }
        match self.store.compact(self.view.name(), upto, COMPACT_STEP, &committed) {
            Ok(0) => {}
            Ok(removed) => {
                let after = self.store.meta(self.view.name()).ok().flatten().unwrap_or(committed);
                self.meta.count = self.meta.count.saturating_sub(committed.count - after.count);
                self.view.compacted(upto, after);
                tracing::info!(channel = %self.view.name(), removed, upto, "retention removed old messages");
            }
            Err(e) => tracing::error!(channel = %self.view.name(), error = %e, "retention failed"),
        }
    }
}
