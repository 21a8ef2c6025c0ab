//! Who is on which channel across a relay cluster, in a key-value bucket (`<STREAM>_PRESENCE`,
//! key `<channel>.<participant>.<node>`, entries expiring after the presence TTL). Each node
//! publishes the participants it hears from, refreshing them while they stay, and deletes them
//! when they leave; every node mirrors the others' into its presence supervisor.

use super::kv::{hex, unhex, Bucket, Change, Coded};
use crate::error::RelayError;
use crate::presence::{PresenceChange, PresenceRecord};
use crosstalk_schema::ChannelName;

impl Coded for PresenceRecord {}

#[derive(Clone)]
pub(super) struct SharedPresence {
    pub bucket: Bucket<PresenceRecord>,
    /// This node's id in the keys.
    pub node: String,
}

impl SharedPresence {
    fn key(&self, channel: &str, participant_id: &str) -> String {
        format!("{}.{}.{}", hex(channel), hex(participant_id), self.node)
    }

    /// Publishes a participant heard from on this node.
    pub async fn here(&self, record: &PresenceRecord) -> Result<(), RelayError> {
        let key = self.key(&record.channel, &record.participant.participant_id);
        self.bucket.put(&key, record).await
    }

    /// Withdraws a participant that left this node's channel.
    pub async fn gone(&self, channel: &ChannelName, participant_id: &str) -> Result<(), RelayError> {
        self.bucket.delete(&self.key(channel.as_str(), participant_id)).await
    }

    /// Every live entry, then each change as it happens.
    pub async fn watch(&self) -> Result<impl futures_util::Stream<Item = PresenceChange> + Unpin, RelayError> {
        self.bucket.watch(presence_change).await
    }
}

fn presence_change(change: Change<PresenceRecord>) -> Option<PresenceChange> {
    let mut parts = change.key.splitn(3, '.');
    let (channel, participant_id, node) = (parts.next()?, parts.next()?, parts.next()?.to_owned());
    match change.value {
        Some(record) => Some(PresenceChange::Here { node, record }),
        None => Some(PresenceChange::Gone {
            node,
            channel: ChannelName::parse(&unhex(channel)?).ok()?,
            participant_id: unhex(participant_id)?,
        }),
    }
}
