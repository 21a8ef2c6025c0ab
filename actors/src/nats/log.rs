//! The cluster's log: every channel's events in one JetStream stream, one subject per channel
//! (`crosstalk.ch.<channel>`). A message of the stream holds one or more events that a node
//! appended together ([`super::appends`]): of one channel, on that channel's subject, or of
//! several, each event naming its channel, on a subject of their own
//! (`crosstalk.ch.+several`, [`SEVERAL`]; a channel name cannot hold a `+`). An event's id is
//! its message's stream sequence shifted left by [`ENTRY_BITS`], plus its place in the
//! message ([`entry_id`]): unique across the cluster, increasing along the log and within
//! each channel, and the same on every node.
//!
//! A retention cut removes its channel's own messages up to the cut ([`Log::purge_through`]);
//! a message of several channels goes once each of them was cut past it
//! ([`super::several`]).

use super::unavailable;
use crate::cluster::{LogEntry, LogEvent};
use crate::error::RelayError;
use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use crosstalk_schema::{codec, ChannelName, Record, StreamEntry};
use futures_util::StreamExt;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Bits of an event's id that number it within its message: a message holds at most 1,024
/// events.
pub(super) const ENTRY_BITS: u32 = 10;
/// Most events one message holds.
pub(super) const MAX_ENTRIES: usize = 1 << ENTRY_BITS;
/// Most bytes of events one message carries (NATS's own limit is 1 MiB by default); one event
/// bigger than this goes alone.
pub(super) const MAX_MESSAGE_BYTES: usize = 512 * 1024;

/// The last token of the subject of messages holding several channels' events.
pub(super) const SEVERAL: &str = "+several";

/// The id of the `index`th event of the message at stream sequence `seq`.
pub(super) fn entry_id(seq: u64, index: usize) -> u64 {
    (seq << ENTRY_BITS) | index as u64
}

/// The stream sequence of the message holding the event `id`.
pub(super) fn message_of(id: u64) -> u64 {
    id >> ENTRY_BITS
}

/// A [`StreamEntry`] as an append borrows it: it serialises exactly as one.
#[derive(Serialize)]
struct EntryOut<'a> {
    record: &'a Record,
    idempotency_key: Option<&'a str>,
}

/// Longest an append waits for JetStream's acknowledgement.
const APPEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the server tells a node following the log that it is still there when it has
/// nothing to deliver; two missed ones and the node follows again on a new consumer.
const FOLLOW_HEARTBEAT: Duration = Duration::from_secs(1);
/// Longest setting up a consumer to follow the log may take before the node tries again. While
/// the cluster elects a leader after a server died, a request to create one can go unanswered
/// until the client's own 10 s time-out; a new attempt a moment later usually lands. A consumer
/// the server did make for an abandoned attempt is removed once idle (`inactive_threshold`).
const FOLLOW_SETUP_TIMEOUT: Duration = Duration::from_secs(3);

/// The stream, as the relay writes and follows it. Cloning is cheap.
#[derive(Clone)]
pub(super) struct Log {
    pub js: jetstream::Context,
    pub stream: String,
    /// Subject prefix of the stream's channel events.
    pub prefix: String,
}

/// Subject prefix of a stream's channel events: `crosstalk.ch.` for the default stream
/// `CROSSTALK` (two streams may not share subjects, so each has its own).
pub(super) fn subject_prefix(stream: &str) -> String {
    format!("{}.ch.", stream.to_ascii_lowercase())
}

fn subject(prefix: &str, channel: &ChannelName) -> String {
    // `.` separates subject tokens; `~` is not allowed in channel names, so this reverses.
    format!("{prefix}{}", channel.as_str().replace('.', "~"))
}

fn several(prefix: &str) -> String {
    format!("{prefix}{SEVERAL}")
}

fn channel_of(prefix: &str, subject: &str) -> Option<ChannelName> {
    let name = subject.strip_prefix(prefix)?.replace('~', ".");
    ChannelName::parse(&name).ok()
}

impl Log {
    /// An event as a message carries it ([`Log::append`]).
    pub fn entry(record: &Record, idempotency_key: Option<&str>) -> Bytes {
        Bytes::from(codec::encode_as::<StreamEntry, _>(&EntryOut {
            record,
            idempotency_key,
        }))
    }

    /// Appends `events` (each its channel and its entry from [`Log::entry`]) as one message:
    /// on the channel's subject when they are all of one channel, else on [`SEVERAL`]'s, each
    /// naming its channel. Answers its stream sequence once JetStream has acknowledged it; its
    /// events' ids follow from it ([`entry_id`]).
    pub async fn append<'a>(
        &self,
        events: impl Iterator<Item = (&'a ChannelName, &'a [u8])> + Clone,
    ) -> Result<u64, RelayError> {
        let Some((channel, _)) = events.clone().next() else {
            return Err(RelayError::Unavailable("an append of no events"));
        };
        let (subject, payload) = if events.clone().all(|(c, _)| c == channel) {
            (subject(&self.prefix, channel), frame(events.map(|(_, e)| e)))
        } else {
            (several(&self.prefix), frame_several(events))
        };
        let publish = jetstream::message::PublishMessage::build().payload(payload);
        let append = async {
            let mut pause = Duration::from_millis(10);
            loop {
                let ack = self
                    .js
                    .send_publish(subject.clone(), publish.clone())
                    .await
                    .map_err(|e| unavailable("publishing", e))?;
                match ack.await {
                    // No one listens on the subject (NATS's "no responders"): the event reached
                    // no stream, so sending it again cannot store it twice. A new stream's
                    // subjects reach every server of a cluster a moment after it has a leader.
                    Err(e) if e.kind() == jetstream::context::PublishErrorKind::StreamNotFound => {
                        // At most a line a second however many appends wait (a stream taken
                        // away holds every post of the node).
                        crate::throttled!(
                            info,
                            channel = channel.as_str(),
                            "no stream takes the channel's subject yet; sending its events again until one does"
                        );
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(200));
                    }
                    ack => return ack.map_err(|e| unavailable("waiting for the acknowledgement", e)),
                }
            }
        };
        let ack = tokio::time::timeout(APPEND_TIMEOUT, append)
            .await
            .map_err(|_| unavailable("appending", "no acknowledgement in time"))??;
        Ok(ack.sequence)
    }

    /// Removes `channel`'s events up to and including `through` from the log.
    /// The message holding `through` stays: its other events may be newer, and a node that
    /// starts the channel from the cut skips the ones it holds up to `through`.
    pub async fn purge_through(&self, channel: &ChannelName, through: u64) -> Result<(), RelayError> {
        // Messages before this one go (a purge's sequence is the first it keeps).
        let keep = message_of(through);
        if keep <= 1 {
            return Ok(());
        }
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| unavailable("opening the stream", e))?;
        stream
            .purge()
            .filter(subject(&self.prefix, channel))
            .sequence(keep)
            .await
            .map_err(|e| unavailable("removing a channel's events up to its cut", e))?;
        Ok(())
    }

    /// Removes the messages at `seqs` (each of several channels' events, each of those
    /// channels cut past it); answers how many this removed (one already gone is not counted).
    pub async fn delete(&self, seqs: &[u64]) -> Result<usize, RelayError> {
        if seqs.is_empty() {
            return Ok(0);
        }
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| unavailable("opening the stream", e))?;
        let mut removed = 0;
        for &seq in seqs {
            match stream.delete_message(seq).await {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(e) if gone(&e) => {}
                Err(e) => return Err(unavailable("removing a message of several channels' events", e)),
            }
        }
        Ok(removed)
    }

    /// The sequence of the newest event in the log (0 when it is empty).
    pub async fn last_sequence(&self) -> Result<u64, RelayError> {
        let mut stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| unavailable("opening the stream", e))?;
        let info = stream
            .info()
            .await
            .map_err(|e| unavailable("reading the stream's state", e))?;
        Ok(info.state.last_sequence)
    }

    /// Every event from stream sequence `from` on, in order, then new ones as they come. The
    /// stream yields an error when the consumer is lost (its server died: [`FOLLOW_HEARTBEAT`]
    /// twice without a word) or a message went missing on the way (a gap in the consumer's own
    /// sequence); follow again from the next sequence. Beside it, the stream sequence of the
    /// last message the consumer delivered, events or not (one that is not an event is skipped).
    ///
    /// Not the client's ordered consumer: that one waits for its fixed 15 s heartbeat to be
    /// missed twice before it recreates itself, so a node whose consumer lived on a server that
    /// died stopped folding the log, and answering its own posts, for up to a minute.
    pub async fn follow(
        &self,
        from: u64,
    ) -> Result<
        (
            impl futures_util::Stream<Item = Result<LogMessage, RelayError>> + Unpin,
            Arc<AtomicU64>,
        ),
        RelayError,
    > {
        let deliver_policy = if from <= 1 {
            consumer::DeliverPolicy::All
        } else {
            consumer::DeliverPolicy::ByStartSequence { start_sequence: from }
        };
        let setup = async {
            let stream = self
                .js
                .get_stream(&self.stream)
                .await
                .map_err(|e| unavailable("opening the stream", e))?;
            // What the ordered consumer would be: ephemeral, in memory, one replica, no acks;
            // the server removes it once nobody has pulled for a while.
            let consumer = stream
                .create_consumer(consumer::pull::Config {
                    filter_subject: format!("{}>", self.prefix),
                    deliver_policy,
                    ack_policy: consumer::AckPolicy::None,
                    max_deliver: 1,
                    inactive_threshold: Duration::from_secs(30),
                    num_replicas: 1,
                    memory_storage: true,
                    ..Default::default()
                })
                .await
                .map_err(|e| unavailable("creating a consumer", e))?;
            consumer
                .stream()
                .max_messages_per_batch(500)
                .expires(Duration::from_secs(30))
                .heartbeat(FOLLOW_HEARTBEAT)
                .messages()
                .await
                .map_err(|e| unavailable("reading the stream", e))
        };
        let messages = tokio::time::timeout(FOLLOW_SETUP_TIMEOUT, setup).await.map_err(|_| {
            unavailable(
                "setting up a consumer",
                format!("no answer in {FOLLOW_SETUP_TIMEOUT:?}"),
            )
        })??;
        let prefix = self.prefix.clone();
        let mut delivered = 0u64;
        let through = Arc::new(AtomicU64::new(from.saturating_sub(1)));
        let through_now = through.clone();
        let events = messages.filter_map(move |m| {
            let m = m.map_err(|e| unavailable("reading the stream", e)).and_then(|m| {
                let info = m.info().map_err(|e| unavailable("reading a message's sequence", e))?;
                if info.consumer_sequence != delivered + 1 {
                    return Err(unavailable(
                        "reading the stream",
                        format!(
                            "message {} of the consumer came after {delivered}: one went missing",
                            info.consumer_sequence
                        ),
                    ));
                }
                delivered = info.consumer_sequence;
                through_now.store(info.stream_sequence, Ordering::Relaxed);
                Ok(m)
            });
            std::future::ready(log_message(&prefix, m))
        });
        Ok((events, through))
    }
}

/// Whether a deletion failed because the message is not there (any more).
fn gone(e: &jetstream::stream::DeleteMessageError) -> bool {
    use jetstream::stream::DeleteMessageErrorKind as K;
    match e.kind() {
        K::JetStream(js) => {
            js.error_code() == jetstream::ErrorCode::NO_MESSAGE_FOUND
                || js.to_string().to_ascii_lowercase().contains("no message found")
        }
        _ => false,
    }
}

/// One stream message of the log: its events, a [`LogEvent`] for each channel they belong to
/// (one unless it holds several channels' events), in the order of their first events.
pub(super) struct LogMessage {
    pub seq: u64,
    /// Whether it is a message of several channels' events ([`SEVERAL`]).
    pub several: bool,
    pub events: Vec<LogEvent>,
}

/// One stream message as the log's events; `None` (logged) for one that is not.
fn log_message(prefix: &str, m: Result<jetstream::Message, RelayError>) -> Option<Result<LogMessage, RelayError>> {
    let m = match m {
        Ok(m) => m,
        Err(e) => return Some(Err(e)),
    };
    let seq = match m.info() {
        Ok(info) => info.stream_sequence,
        Err(e) => return Some(Err(unavailable("reading a message's sequence", e))),
    };
    let several = m.subject.as_str() == several(prefix);
    let events = if several {
        unframe_several(&m.payload).map(|entries| by_channel(seq, entries))
    } else {
        let Some(channel) = channel_of(prefix, m.subject.as_str()) else {
            tracing::warn!(seq, subject = %m.subject, "skipping a log entry on a subject that names no channel");
            return None;
        };
        unframe(&m.payload).map(|entries| {
            let entries = entries
                .into_iter()
                .enumerate()
                .map(|(index, e)| numbered(seq, index, e))
                .collect();
            vec![LogEvent { seq, channel, entries }]
        })
    };
    match events {
        Ok(events) => Some(Ok(LogMessage { seq, several, events })),
        Err(e) => {
            tracing::error!(seq, subject = %m.subject, error = %e, "skipping a log entry that does not decode");
            None
        }
    }
}

/// The `index`th event of the message at `seq`.
fn numbered(seq: u64, index: usize, e: StreamEntry) -> LogEntry {
    LogEntry {
        id: entry_id(seq, index),
        record: e.record,
        idempotency_key: e.idempotency_key,
    }
}

/// A message of several channels' events, numbered by their place in it, as a [`LogEvent`]
/// for each channel, in the order of their first events.
fn by_channel(seq: u64, entries: Vec<(ChannelName, StreamEntry)>) -> Vec<LogEvent> {
    let mut events: Vec<LogEvent> = Vec::new();
    // A message may hold up to 1,024 channels: each found by name, not by a walk of the others.
    let mut at: std::collections::HashMap<ChannelName, usize> = std::collections::HashMap::new();
    for (index, (channel, e)) in entries.into_iter().enumerate() {
        let entry = numbered(seq, index, e);
        match at.get(&channel) {
            Some(&i) => events[i].entries.push(entry),
            None => {
                at.insert(channel.clone(), events.len());
                events.push(LogEvent {
                    seq,
                    channel,
                    entries: vec![entry],
                });
            }
        }
    }
    events
}

/// A message's payload: each entry after its length (4 bytes, little-endian).
fn frame<'a>(entries: impl Iterator<Item = &'a [u8]> + Clone) -> Bytes {
    let mut out = Vec::with_capacity(entries.clone().map(|e| 4 + e.len()).sum());
    for e in entries {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    Bytes::from(out)
}

/// Bytes a message of several channels spends on an event besides the event itself: its
/// channel's name (after its length, one byte) and the event's length.
pub(super) fn several_overhead(channel: &ChannelName) -> usize {
    1 + channel.as_str().len() + 4
}

/// The payload of a message of several channels' events: each entry after its channel's name
/// (after the name's length, one byte) and its own length (4 bytes, little-endian).
fn frame_several<'a>(events: impl Iterator<Item = (&'a ChannelName, &'a [u8])> + Clone) -> Bytes {
    let mut out = Vec::with_capacity(events.clone().map(|(c, e)| several_overhead(c) + e.len()).sum());
    for (channel, e) in events {
        // A channel name is at most 64 bytes ([`crosstalk_schema::MAX_CHANNEL_NAME`]).
        out.push(channel.as_str().len() as u8);
        out.extend_from_slice(channel.as_str().as_bytes());
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    Bytes::from(out)
}

fn unframe_several(mut payload: &[u8]) -> Result<Vec<(ChannelName, StreamEntry)>, String> {
    let mut entries = Vec::new();
    while let Some((&name_len, rest)) = payload.split_first() {
        let Some(name) = rest.get(..name_len as usize) else {
            return Err(format!("a channel name of {name_len} bytes with {} left", rest.len()));
        };
        let channel = std::str::from_utf8(name)
            .ok()
            .and_then(|name| ChannelName::parse(name).ok().filter(|c| c.as_str() == name))
            .ok_or_else(|| format!("{:?} names no channel", String::from_utf8_lossy(name)))?;
        let (entry, rest) = unframe_one(&rest[name_len as usize..])?;
        entries.push((channel, entry));
        payload = rest;
    }
    check_count(entries)
}

/// The first entry of `payload` (after its length), and what follows it.
fn unframe_one(payload: &[u8]) -> Result<(StreamEntry, &[u8]), String> {
    let Some((len, rest)) = payload.split_first_chunk::<4>() else {
        return Err(format!("{} bytes where an entry's length belongs", payload.len()));
    };
    let len = u32::from_le_bytes(*len) as usize;
    let Some(entry) = rest.get(..len) else {
        return Err(format!("an entry of {len} bytes with {} left", rest.len()));
    };
    Ok((
        codec::decode::<StreamEntry>(entry).map_err(|e| e.to_string())?,
        &rest[len..],
    ))
}

fn check_count<T>(entries: Vec<T>) -> Result<Vec<T>, String> {
    match entries.len() {
        0 => Err("no entries".into()),
        n if n > MAX_ENTRIES => Err(format!("{n} entries, more than {MAX_ENTRIES}")),
        _ => Ok(entries),
    }
}

fn unframe(mut payload: &[u8]) -> Result<Vec<StreamEntry>, String> {
    let mut entries = Vec::new();
    while !payload.is_empty() {
        let (entry, rest) = unframe_one(payload)?;
        entries.push(entry);
        payload = rest;
    }
    check_count(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_name_channels_reversibly() {
        let prefix = subject_prefix("CROSSTALK");
        assert_eq!(prefix, "crosstalk.ch.");
        for name in ["general", "team.alpha", "a-b_c.d.e"] {
            let c = ChannelName::parse(name).unwrap();
            let s = subject(&prefix, &c);
            assert!(!s[prefix.len()..].contains('.'), "{s}");
            assert_eq!(channel_of(&prefix, &s).unwrap(), c);
        }
        assert!(channel_of(&prefix, "other.subject").is_none());
    }

    #[test]
    fn a_message_carries_its_entries_and_keys_in_order() {
        let records: Vec<Record> = (0..3)
            .map(|n| Record::Described {
                description: format!("d{n}"),
                at: Default::default(),
            })
            .collect();
        let keys = [Some("line\r\nbreak ünïcode ✓"), None, Some("100%")];
        let entries: Vec<Bytes> = records.iter().zip(keys).map(|(r, k)| Log::entry(r, k)).collect();
        let back = unframe(&frame(entries.iter().map(|e| &e[..]))).unwrap();
        assert_eq!(back.len(), 3);
        for ((e, r), k) in back.iter().zip(&records).zip(keys) {
            assert_eq!(codec::encode(&e.record), codec::encode(r));
            assert_eq!(e.idempotency_key.as_deref(), k);
        }
        // A payload cut short, or one of the layout before messages held several events.
        let whole = frame(entries.iter().map(|e| &e[..]));
        assert!(unframe(&whole[..whole.len() - 1]).is_err());
        assert!(unframe(&codec::encode(&records[0])).is_err());
        assert!(unframe(&[]).is_err());
    }

    #[test]
    fn a_message_of_several_channels_names_each_events_channel_and_numbers_them_in_it() {
        let entry = |n: usize| {
            Log::entry(
                &Record::Described {
                    description: format!("d{n}"),
                    at: Default::default(),
                },
                None,
            )
        };
        let (dev, ops) = (
            ChannelName::parse("dev").unwrap(),
            ChannelName::parse("team.ops").unwrap(),
        );
        let entries: Vec<Bytes> = (0..4).map(entry).collect();
        let channels = [&dev, &ops, &dev, &ops];
        let payload = frame_several(channels.iter().copied().zip(entries.iter().map(|e| &e[..])));
        let back = unframe_several(&payload).unwrap();
        let events = by_channel(5, back);
        assert_eq!(events.len(), 2);
        assert_eq!((&events[0].channel, &events[1].channel), (&dev, &ops));
        let ids = |e: &LogEvent| e.entries.iter().map(|x| x.id).collect::<Vec<_>>();
        assert_eq!(ids(&events[0]), [entry_id(5, 0), entry_id(5, 2)]);
        assert_eq!(ids(&events[1]), [entry_id(5, 1), entry_id(5, 3)]);
        assert!(matches!(&events[1].entries[1].record, Record::Described { description, .. } if description == "d3"));
        // Cut short, or naming what no channel is called, it does not decode.
        assert!(unframe_several(&payload[..payload.len() - 1]).is_err());
        let mut bad = payload.to_vec();
        bad[1] = b'D';
        assert!(unframe_several(&bad).is_err(), "a name a channel is not stored under");
        assert!(unframe_several(&[]).is_err());
        assert_ne!(
            several(&subject_prefix("CROSSTALK")),
            subject(&subject_prefix("CROSSTALK"), &dev)
        );
        assert!(channel_of(&subject_prefix("CROSSTALK"), &several(&subject_prefix("CROSSTALK"))).is_none());
    }

    #[test]
    fn ids_number_events_within_their_message_and_increase_along_the_log() {
        assert_eq!(entry_id(1, 0), 1024);
        assert_eq!(message_of(entry_id(7, 1023)), 7);
        assert!(entry_id(7, MAX_ENTRIES - 1) < entry_id(8, 0));
    }
}
