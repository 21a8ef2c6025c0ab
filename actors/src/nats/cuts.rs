//! Retention on the shared log. A cut is decided once, as an event of the log
//! ([`crosstalk_schema::Record::Trimmed`]); every node removes what it reaches from its copy
//! and computes, from the events it removes, the channel's state right after the cut
//! ([`CutState`]). A node that has done so records it here (`<STREAM>_CUTS`, key: the channel),
//! unless a later cut is recorded already, and then removes the channel's events up to the cut
//! from the stream. A node that finds events missing from the log (it joined after they were
//! removed, or was away while they were) starts each channel they belonged to from its
//! recorded cut instead of from its first event (`follow::KnownCuts`).

use super::kv::{hex, unhex, Bucket, Coded, Step};
use super::log::Log;
use super::several::Several;
use crate::error::RelayError;
use crosstalk_schema::{ChannelName, CutState};
use std::collections::HashMap;

impl Coded for CutState {}

#[derive(Clone)]
pub(super) struct Cuts {
    pub bucket: Bucket<CutState>,
}

impl Cuts {
    /// Records `cut` unless a later one of the channel is recorded, then removes the channel's
    /// events up to it from the log: its own messages, and each message of several channels
    /// once every channel in it is cut past it ([`Several`]). Every node that applies a cut
    /// does this: whichever comes first records it, and removing what is already removed
    /// changes nothing.
    pub async fn publish(
        &self,
        log: &Log,
        several: &Several,
        channel: &ChannelName,
        cut: CutState,
    ) -> Result<(), RelayError> {
        let through = cut.trim.through;
        self.bucket
            .change(&hex(channel.as_str()), |current| {
                Ok(match current.and_then(|s| s.value) {
                    Some(recorded) if recorded.trim.through >= through => Step::Done(()),
                    _ => Step::Write(cut.clone(), ()),
                })
            })
            .await?
            .ok_or_else(|| RelayError::Conflict(format!("the cut of {channel} is being recorded elsewhere")))?;
        // Only once the state after them is recorded: a node missing them starts from it.
        log.purge_through(channel, through).await?;
        several.release(channel, through).await
    }

    /// Every channel's recorded cut, and the bucket's revision before they were read.
    pub async fn all(&self) -> Result<(u64, HashMap<ChannelName, CutState>), RelayError> {
        let revision = self.bucket.revision().await?;
        let mut out = HashMap::new();
        for (key, cut) in self.bucket.values(usize::MAX).await? {
            let Some(channel) = unhex(&key).and_then(|name| ChannelName::parse(&name).ok()) else {
                tracing::warn!(%key, "skipping a recorded cut whose key names no channel");
                continue;
            };
            out.insert(channel, cut);
        }
        Ok((revision, out))
    }

    /// The bucket's revision: when it has not moved since [`Cuts::all`], no cut was recorded
    /// since.
    pub async fn revision(&self) -> Result<u64, RelayError> {
        self.bucket.revision().await
    }
}
