//! When a message of several channels' events ([`super::log::SEVERAL`]) leaves the log.
//!
//! A retention cut removes its channel's own messages from the stream by their subject
//! ([`super::log::Log::purge_through`]). A message that holds several channels' events can go
//! only once every one of those channels was cut past its events there: until then a node that
//! joins later still needs the events of the channels not cut yet. Each node keeps, in its own
//! store ([`Space::Jobs`]), which such messages it has folded and which of their channels are
//! not cut past them yet ([`HeldMessage`]), with a key per channel and message to find a
//! channel's messages when it is cut. They are written with the fold's watermark
//! ([`super::follow`]), so a restart that folds the log again from the watermark writes again
//! exactly those it had not written.
//!
//! After a node has recorded a channel's cut and purged its subject ([`super::cuts::Cuts`]), it
//! takes the channel off each of its messages of several channels up to the cut
//! ([`Several::release`]); the node that takes the last channel off a message removes it from
//! the stream. Every node does this for every cut, as every node purges: removing a message
//! already removed changes nothing.
//!
//! Left to a later cut: a message folded so shortly before its channel's cut that the fold had
//! not yet recorded it (its watermark is written every second) keeps that channel until the
//! channel's next cut; a node that joined after a channel's cut keeps the channel on messages
//! it folds from before that cut until the channel's next cut. Another node that did fold them
//! before the cut takes the channel off at the cut itself.

use super::log::{message_of, Log};
use crate::cluster::{LogEvent, Node};
use crate::error::RelayError;
use crate::store::Space;
use crosstalk_schema::{codec, ChannelName, HeldMessage};
use std::sync::{Arc, OnceLock};

/// A held message's key: this, then its stream sequence (8 bytes, big-endian).
const MESSAGE: &[u8] = b"several/m/";
/// A channel's key for each message it is held on: this, the channel's name, a zero byte, then
/// the message's sequence (8 bytes, big-endian); no value.
const CHANNEL: &[u8] = b"several/c/";
/// Keys a release reads at a time.
const BATCH: usize = 256;

/// Writes to a node's store: each key, and its new value or none to remove it.
pub(super) type Writes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn message_key(seq: u64) -> Vec<u8> {
    [MESSAGE, &seq.to_be_bytes()].concat()
}

fn channel_prefix(channel: &ChannelName) -> Vec<u8> {
    [CHANNEL, channel.as_str().as_bytes(), &[0]].concat()
}

/// The writes that record the message at `seq` (of several channels), whose events are
/// `events`, one for each channel.
pub(super) fn held(seq: u64, events: &[LogEvent]) -> Writes {
    let channels: Vec<(ChannelName, u64)> = events
        .iter()
        .filter_map(|e| Some((e.channel.clone(), e.entries.last()?.id)))
        .collect();
    let mut writes: Vec<_> = channels
        .iter()
        .map(|(c, _)| {
            (
                [channel_prefix(c), seq.to_be_bytes().to_vec()].concat(),
                Some(Vec::new()),
            )
        })
        .collect();
    writes.push((message_key(seq), Some(codec::encode(&HeldMessage { channels }))));
    writes
}

/// This node's messages of several channels, and the one release at a time that changes them.
pub(super) struct Several {
    log: Log,
    /// The node, once the cluster started on it.
    node: OnceLock<Arc<dyn Node>>,
    releasing: tokio::sync::Mutex<()>,
}

impl Several {
    pub(super) fn new(log: Log) -> Self {
        Several {
            log,
            node: OnceLock::new(),
            releasing: Default::default(),
        }
    }

    pub(super) fn attach(&self, node: Arc<dyn Node>) {
        let _ = self.node.set(node);
    }

    /// After `channel`'s cut through `through` is recorded: takes the channel off each of
    /// this node's messages of several channels whose events of it the cut passed, and
    /// removes from the stream each message that no channel then holds.
    pub(super) async fn release(&self, channel: &ChannelName, through: u64) -> Result<(), RelayError> {
        let Some(node) = self.node.get() else {
            return Ok(());
        };
        let _one = self.releasing.lock().await;
        let store = node.store();
        let prefix = channel_prefix(channel);
        loop {
            let keys = store.scan_aux(Space::Jobs, &prefix, BATCH)?;
            let mut done = keys.len() < BATCH;
            let mut writes = Vec::new();
            // Messages no channel holds any more: removed from the stream before their
            // records are.
            let mut gone = Vec::new();
            for (key, _) in keys {
                let Some(seq) = <[u8; 8]>::try_from(&key[prefix.len()..]).ok().map(u64::from_be_bytes) else {
                    writes.push((key, None));
                    continue;
                };
                if seq > message_of(through) {
                    done = true;
                    break;
                }
                let message = message_key(seq);
                let Some(bytes) = store.get_aux(Space::Jobs, &message)? else {
                    // A channel's key without its message's record: nothing says which
                    // channels still need the message, so it stays in the stream.
                    writes.push((key, None));
                    continue;
                };
                let mut kept = codec::decode::<HeldMessage>(&bytes)
                    .map_err(|e| crate::StoreError::Corrupt(format!("a held message of the log: {e}")))?;
                if kept.channels.iter().any(|(c, last)| c == channel && *last > through) {
                    // The message holding the cut's last event has later events of the channel.
                    done = true;
                    break;
                }
                kept.channels.retain(|(c, _)| c != channel);
                writes.push((key, None));
                if kept.channels.is_empty() {
                    gone.push(seq);
                    writes.push((message, None));
                } else {
                    writes.push((message, Some(codec::encode(&kept))));
                }
            }
            let removed = self.log.delete(&gone).await?;
            metrics::counter!("crosstalk_cluster_several_removed_total").increment(removed as u64);
            if !writes.is_empty() {
                node.write_aux(Space::Jobs, writes).await?;
            }
            if done {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::LogEntry;
    use crosstalk_schema::Record;

    #[test]
    fn a_held_message_names_each_channel_with_its_last_event() {
        let event = |channel: &str, ids: &[u64]| LogEvent {
            seq: 9,
            channel: ChannelName::parse(channel).unwrap(),
            entries: ids
                .iter()
                .map(|&id| LogEntry {
                    id,
                    record: Record::Described {
                        description: String::new(),
                        at: Default::default(),
                    },
                    idempotency_key: None,
                })
                .collect(),
        };
        let writes = held(
            9,
            &[event("dev", &[9 << 10, (9 << 10) | 2]), event("ops", &[(9 << 10) | 1])],
        );
        let (last_key, last_value) = writes.last().unwrap();
        assert_eq!(last_key, &message_key(9));
        let kept: HeldMessage = codec::decode(last_value.as_deref().unwrap()).unwrap();
        assert_eq!(
            kept.channels,
            [
                (ChannelName::parse("dev").unwrap(), (9 << 10) | 2),
                (ChannelName::parse("ops").unwrap(), (9 << 10) | 1)
            ]
        );
        // Each channel's key sorts by the message's sequence under that channel alone.
        let dev: Vec<_> = writes
            .iter()
            .filter(|(k, _)| k.starts_with(&channel_prefix(&kept.channels[0].0)))
            .collect();
        assert_eq!(dev.len(), 1);
        assert!(!channel_prefix(&ChannelName::parse("dev").unwrap())
            .starts_with(&channel_prefix(&ChannelName::parse("de").unwrap())));
    }
}
