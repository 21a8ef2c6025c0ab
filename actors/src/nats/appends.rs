//! A node's appends to the log, gathered per channel. While one message of a channel's events
//! is on its way to the log, the channel's next events wait, and then go together as the next
//! message: one publish, one replication and one write on each server for all of them. An
//! event that finds nothing on its way goes at once; under load a message carries as many
//! events as arrived during the previous append.
//!
//! Under heavier load the node also lingers: when the channel's last message carried at least
//! [`LINGER_AFTER`] events and fewer than [`LINGER_BELOW`] wait now, the next message waits
//! [`LINGER`] for more before it goes. Every message costs each server a replication round and
//! an fsync whatever it carries (about 1 ms of the three servers' CPU on the development box,
//! docs/scaling.md), so when the servers share the nodes' cores, fewer and fuller messages leave
//! more of them to everything else: an A/B on two cores read 12–16% more posts a second from 32
//! to 64 connections over two nodes, and no change at 16 connections or over 4 and 16 channels,
//! where messages are smaller. A lightly loaded channel never lingers.
//!
//! One message of a channel at a time from each node keeps a node's events of a channel in
//! the order it put them in. Events from different nodes were never ordered among themselves
//! but by the log.
//!
//! What it costs is measured here (`/metrics`, docs/operations.md): how long an event waited
//! for the message before its own, the linger included (`crosstalk_cluster_append_gather_seconds`),
//! how many events a message carried (`crosstalk_cluster_append_events`), its publish to
//! JetStream's acknowledgement (`crosstalk_cluster_append_seconds`), and the events waiting now
//! (`crosstalk_cluster_appends_waiting`).

use super::log::{entry_id, Log, MAX_ENTRIES, MAX_MESSAGE_BYTES};
use crate::error::RelayError;
use bytes::Bytes;
use crosstalk_schema::ChannelName;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a loaded channel's next message waits for more events ([`lingers`]).
pub(super) const LINGER: Duration = Duration::from_millis(2);
/// A channel is loaded when its last message carried at least this many events.
pub(super) const LINGER_AFTER: usize = 8;
/// ... and it lingers only while fewer than this many wait: a message this full already
/// spreads a server round over as many posts as lingering longer would gain.
pub(super) const LINGER_BELOW: usize = 24;

/// Whether the next message of a channel waits [`LINGER`] for more events before it goes, given
/// how many events its last message carried and how many wait now.
fn lingers(last: usize, waiting: usize) -> bool {
    last >= LINGER_AFTER && waiting > 0 && waiting < LINGER_BELOW
}

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
        let mut last = 0;
        loop {
            let waiting = self.waiting.lock().get(&channel).map_or(0, Vec::len);
            if lingers(last, waiting) {
                tokio::time::sleep(LINGER).await;
            }
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
            last = batch.len();
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

    #[test]
    fn only_a_loaded_channel_lingers_and_only_for_a_thin_message() {
        // A channel's first message, and any after a small one, goes at once.
        assert!(!lingers(0, 1));
        assert!(!lingers(LINGER_AFTER - 1, 5));
        // After a full message, a few waiting events wait for more...
        assert!(lingers(LINGER_AFTER, 1));
        assert!(lingers(40, LINGER_BELOW - 1));
        // ...but not when enough wait already, nor when none does (the sender stops).
        assert!(!lingers(40, LINGER_BELOW));
        assert!(!lingers(40, 0));
    }
}
