//! Read cursors of a relay cluster (how far each identity has read each channel: the inbox,
//! "read by…"), in a key-value bucket (`<STREAM>_CURSORS`, key `<who>.<channel>`). A cursor
//! only moves forward (compare-and-set keeps the larger); every node mirrors the bucket.

use super::kv::{hex, unhex, Bucket, Change, Step};
use crate::cluster::{Claim, CursorChange};
use crate::error::RelayError;
use crosstalk_schema::ChannelName;

#[derive(Clone)]
pub(super) struct SharedCursors {
    pub bucket: Bucket<u64>,
}

fn key(who: &str, channel: &ChannelName) -> String {
    format!("{}.{}", hex(who), hex(channel.as_str()))
}

fn contended(who: &str, channel: &ChannelName) -> RelayError {
    RelayError::Conflict(format!(
        "the cursor of {who:?} on {channel} is being moved elsewhere; try again"
    ))
}

impl SharedCursors {
    /// Moves `who`'s cursor on `channel` to `id` unless it is already there or beyond.
    pub async fn advance(&self, who: &str, channel: &ChannelName, id: u64) -> Result<(), RelayError> {
        let done = self
            .bucket
            .change(&key(who, channel), |current| {
                Ok(match current.and_then(|s| s.value) {
                    Some(at) if at >= id && at != 0 => Step::Done(()),
                    _ => Step::Write(id, ()),
                })
            })
            .await?;
        done.ok_or_else(|| contended(who, channel))
    }

    /// Claims what `who`'s inbox hands out of `channel`: moves its cursor from exactly `from`
    /// (0: none yet) to `to`. [`Claim::Elsewhere`] when the cluster's cursor is somewhere else
    /// (another node's inbox moved it first, or a move of this node's is still on its way),
    /// [`Claim::Left`] when the identity left the channel. Two nodes' inboxes therefore never
    /// hand out one message twice.
    pub async fn claim(&self, who: &str, channel: &ChannelName, from: u64, to: u64) -> Result<Claim, RelayError> {
        let claimed = self
            .bucket
            .change(&key(who, channel), |current| {
                Ok(match current.map(|s| s.value) {
                    // Removed: the identity left the channel.
                    Some(None) => Step::Done(Claim::Left),
                    Some(Some(at)) if at != from => Step::Done(Claim::Elsewhere(at)),
                    None if from != 0 => Step::Done(Claim::Elsewhere(0)),
                    _ => Step::Write(to, Claim::Claimed),
                })
            })
            .await?;
        claimed.ok_or_else(|| contended(who, channel))
    }

    /// Removes `who`'s cursor on `channel`.
    pub async fn forget(&self, who: &str, channel: &ChannelName) -> Result<(), RelayError> {
        self.bucket.delete(&key(who, channel)).await
    }

    /// Every cursor, then each change as it happens.
    pub async fn watch(&self) -> Result<impl futures_util::Stream<Item = CursorChange> + Unpin, RelayError> {
        self.bucket.watch(cursor_change).await
    }
}

fn cursor_change(change: Change<u64>) -> Option<CursorChange> {
    let (who, channel) = change.key.split_once('.')?;
    let (who, channel) = (unhex(who)?, ChannelName::parse(&unhex(channel)?).ok()?);
    Some(CursorChange {
        who,
        channel,
        id: change.value,
    })
}
