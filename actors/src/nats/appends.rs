//! A node's appends to the log, gathered per channel. While one message of a channel's events
//! is on its way to the log, the channel's next events wait, and then go together as the next
//! message: one publish, one replication and one write on each server for all of them. An
//! event that finds nothing on its way goes at once, so gathering adds no wait; under load a
//! message carries as many events as arrived during the previous append.
//!
//! One message of a channel at a time from each node keeps a node's events of a channel in
//! the order it put them in. Events from different nodes were never ordered among themselves
//! but by the log.
//!
//! What it costs is measured here (`/metrics`, docs/operations.md): how long an event waited
//! for the message before its own (`crosstalk_cluster_append_gather_seconds`), how many events
//! a message carried (`crosstalk_cluster_append_events`), its publish to JetStream's
//! acknowledgement (`crosstalk_cluster_append_seconds`), and the events waiting now
//! (`crosstalk_cluster_appends_waiting`).

use super::log::{entry_id, Log, MAX_ENTRIES, MAX_MESSAGE_BYTES};
use crate::error::RelayError;
use bytes::Bytes;
use crosstalk_schema::ChannelName;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// The log, and the events of each channel waiting for the message on its way; a channel is
/// present while one is.
pub(super) struct Appends {
    log: Log,
    waiting: Mutex<HashMap<ChannelName, Vec<Waiting>>>,
}

struct Waiting {
    entry: Bytes,
    id: oneshot::Sender<Result<u64, RelayError>>,
    since: Instant,
}

impl Appends {
    pub(super) fn new(log: Log) -> Self {
        Appends {
            log,
            waiting: Default::default(),
        }
    }

    /// Appends `entry` ([`Log::entry`]) to `channel`'s events; answers its id once JetStream
    /// has acknowledged the message that holds it.
    pub(super) fn append(
        self: &Arc<Self>,
        channel: &ChannelName,
        entry: Bytes,
    ) -> impl Future<Output = Result<u64, RelayError>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let waiting_one = Waiting {
            entry,
            id: tx,
            since: Instant::now(),
        };
        metrics::gauge!("crosstalk_cluster_appends_waiting").increment(1.0);
        let first = {
            let mut waiting = self.waiting.lock();
            match waiting.get_mut(channel) {
                Some(queue) => {
                    queue.push(waiting_one);
                    false
                }
                None => {
                    waiting.insert(channel.clone(), vec![waiting_one]);
                    true
                }
            }
        };
        if first {
            tokio::spawn(self.clone().send(channel.clone()));
        }
        async move {
            rx.await
                .unwrap_or(Err(RelayError::Unavailable("the append to the log was dropped")))
        }
    }

    /// Sends `channel`'s waiting events, a message at a time, until none is left.
    async fn send(self: Arc<Self>, channel: ChannelName) {
        loop {
            let batch: Vec<Waiting> = {
                let mut waiting = self.waiting.lock();
                let Some(queue) = waiting.get_mut(&channel) else {
                    return;
                };
                if queue.is_empty() {
                    waiting.remove(&channel);
                    return;
                }
                let take = fitting(queue.iter().map(|w| w.entry.len()));
                queue.drain(..take).collect()
            };
            let sent = Instant::now();
            metrics::gauge!("crosstalk_cluster_appends_waiting").decrement(batch.len() as f64);
            metrics::histogram!("crosstalk_cluster_append_events").record(batch.len() as f64);
            let gathered = metrics::histogram!("crosstalk_cluster_append_gather_seconds");
            for w in &batch {
                gathered.record(sent.saturating_duration_since(w.since));
            }
            let appended = self.log.append(&channel, batch.iter().map(|w| &w.entry[..])).await;
            metrics::histogram!("crosstalk_cluster_append_seconds").record(sent.elapsed());
            for (index, w) in batch.into_iter().enumerate() {
                let _ = w.id.send(appended.clone().map(|seq| entry_id(seq, index)));
            }
        }
    }
}

/// How many of the entries of these sizes, from the first, go in one message: at most
/// [`MAX_ENTRIES`] and [`MAX_MESSAGE_BYTES`], and at least one.
fn fitting(sizes: impl Iterator<Item = usize>) -> usize {
    let mut bytes = 0;
    let mut count = 0;
    for size in sizes.take(MAX_ENTRIES) {
        bytes += 4 + size;
        if count > 0 && bytes > MAX_MESSAGE_BYTES {
            break;
        }
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_takes_what_fits_and_always_one() {
        assert_eq!(fitting([10; 3].into_iter()), 3);
        assert_eq!(fitting(std::iter::repeat_n(1, 5000)), MAX_ENTRIES);
        assert_eq!(fitting([MAX_MESSAGE_BYTES * 2, 1].into_iter()), 1);
        assert_eq!(
            fitting([MAX_MESSAGE_BYTES / 2, MAX_MESSAGE_BYTES / 2, 1].into_iter()),
            1
        );
        assert_eq!(fitting(std::iter::empty()), 0);
    }
}
