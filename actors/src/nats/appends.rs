//! A node's appends to the log, gathered across its channels. While one message is on its way
//! to the log, the node's next events, of whichever channels, wait, and then go together as the
//! next message: one publish, one replication and one write on each server for all of them.
//! An event that finds nothing on its way goes at once; under load a message carries as many
//! events as arrived during the previous append. The events of one channel go on that
//! channel's subject; events of several go as one message of several channels
//! ([`super::log`]), so a load spread over many channels costs the servers as few messages as
//! one on a single channel (docs/scaling.md, "What a server's round costs").
//!
//! Under heavier load the node also lingers: when its last message carried at least
//! [`LINGER_AFTER`] events and fewer than [`LINGER_BELOW`] wait now, the next message waits
//! [`LINGER`] for more before it goes, or until [`LINGER_BELOW`] wait. Every message costs each
//! server a replication round and an fsync whatever it carries, so when the servers share the
//! nodes' cores, fewer and fuller messages leave more of them to everything else; where
//! messages are small anyway it changes nothing (docs/benchmarks.md, "Measurements behind
//! design choices"). A lightly loaded node never lingers.
//!
//! One message at a time from each node keeps a node's events of a channel in the order it
//! put them in. Events from different nodes were never ordered among themselves but by the
//! log.
//!
//! What it costs is measured here (`/metrics`, docs/operations.md): how long an event waited
//! for the message before its own, the linger included (`crosstalk_cluster_append_gather_seconds`),
//! how many events a message carried (`crosstalk_cluster_append_events`) and of how many
//! channels (`crosstalk_cluster_append_channels`), its publish to JetStream's acknowledgement
//! (`crosstalk_cluster_append_seconds`), and the events waiting now
//! (`crosstalk_cluster_appends_waiting`).

use super::log::{entry_id, Log, MAX_ENTRIES, MAX_MESSAGE_BYTES};
use crate::error::RelayError;
use bytes::Bytes;
use crosstalk_schema::ChannelName;
use parking_lot::Mutex;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a loaded node's next message waits for more events ([`lingers`]) unless the
/// node is told otherwise (`--nats-linger-ms`).
pub(super) const LINGER: Duration = Duration::from_millis(2);
/// A node is loaded when its last message carried at least this many events.
pub(super) const LINGER_AFTER: usize = 8;
/// ... and it lingers only while fewer than this many wait: a message this full already
/// spreads a server round over as many posts as lingering longer would gain, so a linger also
/// ends as soon as this many wait.
pub(super) const LINGER_BELOW: usize = 24;

/// Whether the node's next message waits [`LINGER`] for more events before it goes, given how
/// many events its last message carried and how many wait now.
fn lingers(last: usize, waiting: usize) -> bool {
    last >= LINGER_AFTER && waiting > 0 && waiting < LINGER_BELOW
}

/// The log, and the events waiting for the message on its way.
pub(super) struct Appends {
    log: Log,
    /// [`LINGER`] unless set; zero: no message lingers.
    linger: Duration,
    waiting: Mutex<Queue>,
}

struct Waiting {
    channel: ChannelName,
    entry: Bytes,
    id: oneshot::Sender<Result<u64, RelayError>>,
    since: Instant,
}

impl Waiting {
    /// What the event takes of a message: a message of several channels names each event's
    /// channel, so this counts that too.
    fn size(&self) -> usize {
        super::log::several_overhead(&self.channel) + self.entry.len()
    }
}

/// The events waiting for the message on its way, whether a sender is sending them, and the
/// sender's linger, if it lingers, to end once enough of them wait.
#[derive(Default)]
struct Queue {
    events: Vec<Waiting>,
    sending: bool,
    filled: Option<oneshot::Sender<()>>,
}

impl Queue {
    fn push(&mut self, waiting: Waiting) {
        self.events.push(waiting);
        if self.events.len() >= LINGER_BELOW {
            if let Some(filled) = self.filled.take() {
                let _ = filled.send(());
            }
        }
    }

    /// If the next message lingers (a linger of `linger` is set, and [`lingers`] after a
    /// message of `last` events): what ends the linger early, once [`LINGER_BELOW`] events wait.
    fn linger(&mut self, linger: Duration, last: usize) -> Option<oneshot::Receiver<()>> {
        if linger.is_zero() || !lingers(last, self.events.len()) {
            return None;
        }
        let (filled, rx) = oneshot::channel();
        self.filled = Some(filled);
        Some(rx)
    }

    /// The events of the next message, from the first (at least one unless none waits).
    fn take(&mut self) -> Vec<Waiting> {
        self.filled = None;
        let take = fitting(self.events.iter().map(Waiting::size));
        self.events.drain(..take).collect()
    }
}

impl Appends {
    pub(super) fn new(log: Log, linger: Duration) -> Self {
        Appends {
            log,
            linger,
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
            channel: channel.clone(),
            entry,
            id: tx,
            since: Instant::now(),
        };
        metrics::gauge!("crosstalk_cluster_appends_waiting").increment(1.0);
        let first = {
            let mut queue = self.waiting.lock();
            queue.push(waiting_one);
            !std::mem::replace(&mut queue.sending, true)
        };
        if first {
            tokio::spawn(self.clone().send());
        }
        async move {
            rx.await
                .unwrap_or(Err(RelayError::Unavailable("the append to the log was dropped")))
        }
    }

    /// Sends the waiting events, a message at a time, until none is left.
    async fn send(self: Arc<Self>) {
        let mut last = 0;
        loop {
            let linger = self.waiting.lock().linger(self.linger, last);
            if let Some(filled) = linger {
                let _ = tokio::time::timeout(self.linger, filled).await;
            }
            let batch: Vec<Waiting> = {
                let mut queue = self.waiting.lock();
                if queue.events.is_empty() {
                    queue.sending = false;
                    return;
                }
                queue.take()
            };
            let sent = Instant::now();
            last = batch.len();
            metrics::gauge!("crosstalk_cluster_appends_waiting").decrement(batch.len() as f64);
            metrics::histogram!("crosstalk_cluster_append_events").record(batch.len() as f64);
            metrics::histogram!("crosstalk_cluster_append_channels").record(channels(&batch) as f64);
            let gathered = metrics::histogram!("crosstalk_cluster_append_gather_seconds");
            for w in &batch {
                gathered.record(sent.saturating_duration_since(w.since));
            }
            let appended = self.log.append(batch.iter().map(|w| (&w.channel, &w.entry[..]))).await;
            metrics::histogram!("crosstalk_cluster_append_seconds").record(sent.elapsed());
            for (index, w) in batch.into_iter().enumerate() {
                let _ = w.id.send(appended.clone().map(|seq| entry_id(seq, index)));
            }
        }
    }
}

/// How many channels' events `batch` holds.
fn channels(batch: &[Waiting]) -> usize {
    batch
        .iter()
        .map(|w| &w.channel)
        .collect::<std::collections::HashSet<_>>()
        .len()
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
    fn only_a_loaded_node_lingers_and_only_for_a_thin_message() {
        // A node's first message, and any after a small one, goes at once.
        assert!(!lingers(0, 1));
        assert!(!lingers(LINGER_AFTER - 1, 5));
        // After a full message, a few waiting events wait for more...
        assert!(lingers(LINGER_AFTER, 1));
        assert!(lingers(40, LINGER_BELOW - 1));
        // ...but not when enough wait already, nor when none does (the sender stops).
        assert!(!lingers(40, LINGER_BELOW));
        assert!(!lingers(40, 0));
    }

    fn event() -> Waiting {
        Waiting {
            channel: ChannelName::parse("dev").unwrap(),
            entry: Bytes::from_static(b"entry"),
            id: oneshot::channel().0,
            since: Instant::now(),
        }
    }

    #[test]
    fn a_linger_ends_once_enough_events_wait() {
        let mut queue = Queue::default();
        queue.push(event());
        assert!(queue.linger(LINGER, LINGER_AFTER - 1).is_none(), "after a thin message");
        assert!(queue.linger(Duration::ZERO, 40).is_none(), "--nats-linger-ms 0");
        let mut filled = queue
            .linger(LINGER, LINGER_AFTER)
            .expect("after a full one, it lingers");
        for _ in 1..LINGER_BELOW - 1 {
            queue.push(event());
        }
        assert_eq!(filled.try_recv(), Err(oneshot::error::TryRecvError::Empty));
        queue.push(event());
        assert_eq!(filled.try_recv(), Ok(()), "{LINGER_BELOW} wait: the linger ends");
        assert_eq!(queue.take().len(), LINGER_BELOW);
        assert!(queue.events.is_empty() && queue.filled.is_none());
    }

    #[test]
    fn a_linger_that_timed_out_is_forgotten_with_its_message() {
        let mut queue = Queue::default();
        queue.push(event());
        let filled = queue.linger(LINGER, LINGER_AFTER).unwrap();
        drop(filled);
        assert_eq!(queue.take().len(), 1);
        assert!(queue.filled.is_none());
        // A later message's events fill nothing stale.
        for _ in 0..LINGER_BELOW {
            queue.push(event());
        }
        assert!(queue.filled.is_none());
    }
}
