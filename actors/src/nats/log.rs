//! The cluster's log: every channel's events in one JetStream stream, one subject per channel
//! (`crosstalk.ch.<channel>`). An event's id is its stream sequence.

use super::unavailable;
use crate::cluster::LogEvent;
use crate::error::RelayError;
use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use crosstalk_schema::{codec, ChannelName, Record};
use futures_util::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Header carrying a post's idempotency key, for the fold (the record does not hold it).
const IDEMPOTENCY_HEADER: &str = "Crosstalk-Idempotency-Key";
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

/// `key` as a NATS header value: printable ASCII kept, anything else (and `%`) escaped.
fn header_safe(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn header_unescape(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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

fn channel_of(prefix: &str, subject: &str) -> Option<ChannelName> {
    let name = subject.strip_prefix(prefix)?.replace('~', ".");
    ChannelName::parse(&name).ok()
}

impl Log {
    /// Appends one event; answers its id once JetStream has acknowledged it. A retried post
    /// within the stream's duplicate window gets the original's id.
    pub async fn append(
        &self,
        channel: ChannelName,
        payload: Bytes,
        idempotency_key: Option<String>,
    ) -> Result<u64, RelayError> {
        let mut publish = jetstream::message::PublishMessage::build().payload(payload);
        if let Some(key) = idempotency_key {
            // JetStream drops a second publish with the same id within its window; the fold
            // recognises one beyond it by the header.
            let key = header_safe(&key);
            publish = publish
                .message_id(format!("{channel}/{key}"))
                .header(IDEMPOTENCY_HEADER, key.as_str());
        }
        let append = async {
            let mut pause = Duration::from_millis(10);
            loop {
                let ack = self
                    .js
                    .send_publish(subject(&self.prefix, &channel), publish.clone())
                    .await
                    .map_err(|e| unavailable("publishing", e))?;
                match ack.await {
                    // No one listens on the subject (NATS's "no responders"): the event reached
                    // no stream, so sending it again cannot store it twice. A new stream's
                    // subjects reach every server of a cluster a moment after it has a leader.
                    Err(e) if e.kind() == jetstream::context::PublishErrorKind::StreamNotFound => {
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
    pub async fn purge_through(&self, channel: &ChannelName, through: u64) -> Result<(), RelayError> {
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| unavailable("opening the stream", e))?;
        stream
            .purge()
            .filter(subject(&self.prefix, channel))
            .sequence(through + 1)
            .await
            .map_err(|e| unavailable("removing a channel's events up to its cut", e))?;
        Ok(())
    }

    /// The record as the log carries it.
    pub fn payload(record: &Record) -> Bytes {
        Bytes::from(codec::encode(record))
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
            impl futures_util::Stream<Item = Result<LogEvent, RelayError>> + Unpin,
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
            std::future::ready(log_event(&prefix, m))
        });
        Ok((events, through))
    }
}

/// One stream message as an event of the log; `None` (logged) for one that is not.
fn log_event(prefix: &str, m: Result<jetstream::Message, RelayError>) -> Option<Result<LogEvent, RelayError>> {
    let m = match m {
        Ok(m) => m,
        Err(e) => return Some(Err(e)),
    };
    let seq = match m.info() {
        Ok(info) => info.stream_sequence,
        Err(e) => return Some(Err(unavailable("reading a message's sequence", e))),
    };
    let Some(channel) = channel_of(prefix, m.subject.as_str()) else {
        tracing::warn!(seq, subject = %m.subject, "skipping a log entry on a subject that names no channel");
        return None;
    };
    let record = match codec::decode::<Record>(&m.payload) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(seq, channel = %channel, error = %e, "skipping a log entry that does not decode");
            return None;
        }
    };
    let idempotency_key = m
        .headers
        .as_ref()
        .and_then(|h| h.get(IDEMPOTENCY_HEADER))
        .and_then(|v| header_unescape(v.as_str()));
    Some(Ok(LogEvent {
        seq,
        channel,
        record,
        idempotency_key,
    }))
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
    fn idempotency_keys_survive_headers() {
        for key in ["plain-key_1", "with space", "line\r\nbreak", "100%", "ünïcode ✓"] {
            let h = header_safe(key);
            assert!(h.bytes().all(|b| b.is_ascii_graphic()), "{h}");
            assert_eq!(header_unescape(&h).as_deref(), Some(key));
        }
    }
}
