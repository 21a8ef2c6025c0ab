//! Channels: reading, listing, creating and finding them, their state and sessions, one
//! message and its replies, and message search.

use super::{Relay, ACTOR_CALL_TIMEOUT, SEARCH_CATCH_UP_TIMEOUT};
use crate::channel::{Describe, EndSession, StartSession};
use crate::error::RelayError;
use crate::search::{self, Query};
use crate::view::{ChannelView, Posted};
use crosstalk_schema::{ChannelMeta, ChannelName, ChannelState, ChannelSummary};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// A channel found by name or description.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ChannelInfo {
    #[serde(flatten)]
    pub summary: ChannelSummary,
    /// Always said, `null` when there is none (the row leaves it out then).
    pub description: Option<String>,
}

impl ChannelInfo {
    /// A channel's row with its description, which moves out of the row so it is said once.
    fn of(mut summary: ChannelSummary) -> Self {
        let description = summary.description.take();
        ChannelInfo { summary, description }
    }
}

impl Relay {
    /// Committed messages with id > `after`, oldest first. An unknown channel is empty and is
    /// not created by being read. With `reader`, its read cursor moves past what it got.
    pub async fn read(
        &self,
        channel: &ChannelName,
        after: u64,
        limit: usize,
        reader: Option<&str>,
    ) -> Result<Vec<Arc<Posted>>, RelayError> {
        Ok(self.read_page(channel, after, limit, reader).await?.0)
    }

    /// As [`read`](Self::read), and whether `--max-answer-bytes` cut the page short (more
    /// messages follow at once).
    pub async fn read_page(
        &self,
        channel: &ChannelName,
        after: u64,
        limit: usize,
        reader: Option<&str>,
    ) -> Result<(Vec<Arc<Posted>>, bool), RelayError> {
        if !self.inner.directory.read().contains_key(channel) && self.inner.store.meta(channel)?.is_none() {
            return Ok((Vec::new(), false));
        }
        let scan = self
            .channel(channel)
            .await?
            .view
            .read_scanned(after, limit, self.inner.max_answer_bytes)?;
        if let Some(who) = reader {
            self.advance_cursor(who, channel, scan.scanned);
        }
        Ok((scan.found, scan.full))
    }

    /// The newest `limit` committed messages, oldest first (an unknown channel is empty). With
    /// `reader`, its read cursor moves past them.
    pub async fn newest(
        &self,
        channel: &ChannelName,
        limit: usize,
        reader: Option<&str>,
    ) -> Result<Vec<Arc<Posted>>, RelayError> {
        let Some(view) = self.existing_view(channel).await? else {
            return Ok(Vec::new());
        };
        let (found, _) = view.newest(u64::MAX, limit, self.inner.max_answer_bytes)?;
        if let (Some(who), Some(last)) = (reader, found.last()) {
            self.advance_cursor(who, channel, last.id());
        }
        Ok(found)
    }

    /// The newest `limit` committed messages with id < `before`, oldest first: a page back
    /// through history, and whether `--max-answer-bytes` left older ones out. Moves no read
    /// cursor.
    pub async fn older(
        &self,
        channel: &ChannelName,
        before: u64,
        limit: usize,
    ) -> Result<(Vec<Arc<Posted>>, bool), RelayError> {
        match self.existing_view(channel).await? {
            Some(view) => view.newest(before, limit, self.inner.max_answer_bytes),
            None => Ok((Vec::new(), false)),
        }
    }

    /// Every channel with at least one event, most recently active first, with its committed
    /// summary: the summaries only, so a caller reads a channel's state ([`Relay::described`])
    /// for the rows it answers with, not for every channel of the relay.
    pub fn list_channels(&self) -> Result<Vec<(ChannelName, ChannelMeta)>, RelayError> {
        let mut metas: HashMap<ChannelName, _> = self.inner.store.channels()?.into_iter().collect();
        // Open channels may have a batch in flight: show only what they have committed.
        for (name, handle) in self.inner.directory.read().iter() {
            metas.insert(name.clone(), handle.view.meta());
        }
        let mut list: Vec<_> = metas.into_iter().filter(|(_, m)| m.written()).collect();
        // Most recently active first; by name among equals, so pages are stable.
        list.sort_by(|(a, am), (b, bm)| {
            bm.last_message_id
                .cmp(&am.last_message_id)
                .then_with(|| a.as_str().cmp(b.as_str()))
        });
        Ok(list)
    }

    /// A channel's row of a listing and its state, read once (one store read for a channel
    /// that is not open): the row's open questions and session come from the state.
    pub fn described(
        &self,
        name: &ChannelName,
        meta: &ChannelMeta,
    ) -> Result<(ChannelSummary, ChannelState), RelayError> {
        let state = self.channel_state(name)?;
        Ok((row(name, meta, &state), state))
    }

    /// Creates a channel (or updates its description).
    pub async fn create_channel(&self, channel: &ChannelName, description: &str) -> Result<ChannelInfo, RelayError> {
        let handle = self.channel(channel).await?;
        let state = handle
            .addr
            .send(Describe(description.to_owned()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await??;
        Ok(ChannelInfo::of(row(channel, &handle.view.meta(), &state)))
    }

    /// Channels whose name or description contains `query` (case-insensitive), most recently
    /// active first; every channel for `None`.
    pub fn find_channels(&self, query: Option<&str>) -> Result<Vec<ChannelInfo>, RelayError> {
        let needle = query.map(|q| q.trim().to_lowercase());
        let mut out = Vec::new();
        for (name, meta) in self.list_channels()? {
            let (summary, _) = self.described(&name, &meta)?;
            let info = ChannelInfo::of(summary);
            let hit = needle.as_ref().is_none_or(|n| {
                info.summary.channel.contains(n.as_str())
                    || info
                        .description
                        .as_ref()
                        .is_some_and(|d| d.to_lowercase().contains(n.as_str()))
            });
            if hit {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// The id of the channel's newest committed event (0 for a channel never written).
    pub fn channel_last_id(&self, channel: &ChannelName) -> Result<u64, RelayError> {
        match self.open_view(channel) {
            Some(v) => Ok(v.last_id()),
            None => Ok(self.inner.store.meta(channel)?.map_or(0, |m| m.last_id)),
        }
    }

    /// Whether the channel was ever written: a message, or (a channel created with a
    /// description alone, which takes no id on a lone relay) its state. Starts nothing.
    pub fn channel_exists(&self, channel: &ChannelName) -> Result<bool, RelayError> {
        match self.open_view(channel) {
            Some(v) => Ok(v.meta().written()),
            None => Ok(self.inner.store.meta(channel)?.is_some_and(|m| m.written())),
        }
    }

    /// The committed state of a channel (default for a channel never written); starts nothing.
    pub fn channel_state(&self, channel: &ChannelName) -> Result<ChannelState, RelayError> {
        match self.open_view(channel) {
            Some(v) => Ok(v.channel_state()),
            None => Ok(self.inner.store.state(channel)?),
        }
    }

    /// One committed message, `None` if there is none with that id; starts nothing for a
    /// channel never written.
    pub async fn message(&self, channel: &ChannelName, id: u64) -> Result<Option<Arc<Posted>>, RelayError> {
        match self.existing_view(channel).await? {
            Some(view) => view.get(id),
            None => Ok(None),
        }
    }

    pub async fn start_session(
        &self,
        channel: &ChannelName,
        max_turns: Option<u32>,
    ) -> Result<ChannelState, RelayError> {
        let handle = self.channel(channel).await?;
        handle
            .addr
            .send(StartSession { max_turns })
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    /// Ends the active session; `None` when there was none (nothing is written).
    pub async fn end_session(&self, channel: &ChannelName) -> Result<Option<ChannelState>, RelayError> {
        if self.channel_state(channel)?.active_session().is_none() {
            return Ok(None);
        }
        let handle = self.channel(channel).await?;
        handle
            .addr
            .send(EndSession)
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
            .map(Some)
    }

    /// The replies to a message, oldest first.
    pub async fn replies(&self, channel: &ChannelName, id: u64, limit: usize) -> Result<Vec<Arc<Posted>>, RelayError> {
        let not_found = || RelayError::NotFound(format!("no message {id} in channel {channel}"));
        let view = self.existing_view(channel).await?.ok_or_else(not_found)?;
        if view.get(id)?.is_none() && view.overlay(id).is_none() {
            return Err(RelayError::NotFound(format!("no message {id} in channel {channel}")));
        }
        view.replies(id, limit)
    }

    /// Full-text search across channels, best matches first, served from the index.
    /// Channels that are not open are read from the store (they are not opened).
    pub async fn search(&self, query: Query) -> Result<Vec<search::Hit>, RelayError> {
        // The index lags under load (it runs at the lowest priority): bring it up to date.
        self.inner
            .indexer
            .send(search::CatchUp)
            .timeout(SEARCH_CATCH_UP_TIMEOUT)
            .await?;
        let closed = parking_lot::Mutex::new(HashMap::new());
        let view_of = |c: &ChannelName| {
            self.open_view(c).or_else(|| {
                closed
                    .lock()
                    .entry(c.clone())
                    .or_insert_with(|| {
                        ChannelView::detached(c, self.inner.store.clone())
                            .ok()
                            .flatten()
                            .map(Arc::new)
                    })
                    .clone()
            })
        };
        search::search(&self.inner.search_index, &view_of, &query)
    }
}

/// A channel's row of a listing: its summary, with its open questions and running session
/// from its state.
fn row(name: &ChannelName, meta: &ChannelMeta, state: &ChannelState) -> ChannelSummary {
    ChannelSummary::new(
        name,
        meta,
        state.open_questions.len(),
        state.active_session(),
        state.description.as_deref(),
    )
}
