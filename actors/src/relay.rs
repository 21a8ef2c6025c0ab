//! [`Relay`]: the cheap, cloneable handle every face uses. It sends messages to the actors,
//! reads committed state through channel views, and owns the shutdown signal.

use crate::channel::{ChannelHandle, Post, Posted};
use crate::commit::{Committer, Durability};
use crate::error::RelayError;
use crate::presence::{Heartbeat, Leave, ListPresence, Participant, PresenceEvent, PresenceSupervisor, WatchPresence};
use crate::registry::{Directory, OpenChannel, Registry};
use crate::store::{EventStore, RepairReport};
use actix::prelude::*;
use crosstalk_schema::{ChannelName, ChannelSummary, Limits, NewMessage};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Longest a face waits for an actor to answer before reporting the relay unavailable.
/// A post's answer includes its flush, so this is generous.
pub const ACTOR_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Hands out message ids: unique across the relay, increasing. Starts above the largest id
/// in the store, so ids continue after a restart without reuse of any acknowledged id.
pub struct IdAllocator(AtomicU64);

impl IdAllocator {
    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub limits: Limits,
    pub durability: Durability,
    /// A participant not heard from for this long is gone.
    pub presence_ttl: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            limits: Limits::default(),
            durability: Durability::Flush,
            presence_ttl: Duration::from_secs(120),
        }
    }
}

#[derive(Clone)]
pub struct Relay {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Addr<Registry>,
    presence: Addr<PresenceSupervisor>,
    directory: Directory,
    store: Arc<dyn EventStore>,
    shutdown: CancellationToken,
}

impl Relay {
    /// Repairs a damaged tail if there is one, then starts the actors on the current actix
    /// system. Costs one read per channel, whatever the size of the log.
    pub fn start(store: Arc<dyn EventStore>, config: RelayConfig) -> Result<(Relay, RepairReport), RelayError> {
        let repairs = store.repair()?;
        for r in &repairs.damaged {
            tracing::warn!(channel = %r.channel, dropped = ?r.dropped, last_good = r.last_good,
                "damaged tail removed from the store; serving everything before it");
        }
        if let Some(t) = repairs.truncated {
            tracing::warn!(
                store_last_id = t.store_last_id,
                acknowledged_last_id = t.acknowledged_last_id,
                "the store lost its tail: acknowledged messages above store_last_id are gone"
            );
        }
        // Ids of dropped records may have been seen by someone: never hand them out again.
        let stored_max = store.channels()?.iter().map(|(_, m)| m.last_id).max().unwrap_or(0);
        let last_id = stored_max.max(store.id_floor()?);
        let ids = Arc::new(IdAllocator(AtomicU64::new(last_id)));
        let committer = Committer::start(store.clone(), config.durability)
            .map_err(|e| RelayError::Store(crate::StoreError::Io(e.to_string())))?;
        let directory = Directory::default();
        let registry = Registry {
            directory: directory.clone(),
            store: store.clone(),
            committer,
            ids,
            limits: config.limits,
        }
        .start();
        let presence = PresenceSupervisor::new(config.presence_ttl).start();
        tracing::info!(last_id, "relay started");
        let inner = Inner {
            registry,
            presence,
            directory,
            store,
            shutdown: CancellationToken::new(),
        };
        Ok((Relay { inner: Arc::new(inner) }, repairs))
    }

    /// The channel's handle, starting its actor on first use.
    pub async fn channel(&self, name: &ChannelName) -> Result<ChannelHandle, RelayError> {
        if let Some(h) = self.inner.directory.read().get(name) {
            return Ok(h.clone());
        }
        if self.inner.shutdown.is_cancelled() {
            return Err(RelayError::ShuttingDown);
        }
        self.inner
            .registry
            .send(OpenChannel(name.clone()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?
    }

    /// Posts a message; returns it once it is durable and visible to every reader.
    pub async fn post(&self, channel: &ChannelName, post: NewMessage) -> Result<Arc<Posted>, RelayError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(RelayError::ShuttingDown);
        }
        let handle = self.channel(channel).await?;
        handle.addr.send(Post(post)).timeout(ACTOR_CALL_TIMEOUT).await?
    }

    /// Committed messages with id > `after`, oldest first. An unknown channel is empty and is
    /// not created by being read.
    pub async fn read(&self, channel: &ChannelName, after: u64, limit: usize) -> Result<Vec<Arc<Posted>>, RelayError> {
        if !self.inner.directory.read().contains_key(channel) && self.inner.store.meta(channel)?.is_none() {
            return Ok(Vec::new());
        }
        self.channel(channel).await?.view.read(after, limit)
    }

    /// Like `read`, but waits up to `timeout` for something to arrive. Ends early, empty, when
    /// the relay shuts down.
    pub async fn wait(
        &self,
        channel: &ChannelName,
        after: u64,
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<Arc<Posted>>, RelayError> {
        let handle = self.channel(channel).await?;
        handle
            .view
            .wait(after, limit, timeout, self.inner.shutdown.cancelled())
            .await
    }

    /// Every channel with at least one message, most recently active first.
    pub fn list_channels(&self) -> Result<Vec<ChannelSummary>, RelayError> {
        let mut metas: HashMap<ChannelName, _> = self.inner.store.channels()?.into_iter().collect();
        // Open channels may have a batch in flight: show only what they have committed.
        for (name, handle) in self.inner.directory.read().iter() {
            metas.insert(name.clone(), handle.view.meta());
        }
        let mut list: Vec<ChannelSummary> = metas
            .iter()
            .filter(|(_, m)| m.count > 0)
            .map(|(name, meta)| ChannelSummary::new(name, meta))
            .collect();
        list.sort_by_key(|c| std::cmp::Reverse(c.last_id));
        Ok(list)
    }

    /// Records that a participant is on a channel. Best effort: presence is advisory, and a
    /// full supervisor mailbox must not slow a post down.
    pub fn heartbeat(&self, hb: Heartbeat) {
        if let Err(e) = self.inner.presence.try_send(hb) {
            tracing::debug!(error = %e, "presence heartbeat dropped");
        }
    }

    pub fn leave(&self, channel: ChannelName, participant_id: String) {
        let _ = self.inner.presence.try_send(Leave {
            channel,
            participant_id,
        });
    }

    pub async fn presence(&self, channel: &ChannelName) -> Result<Vec<Participant>, RelayError> {
        Ok(self
            .inner
            .presence
            .send(ListPresence(channel.clone()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?)
    }

    pub async fn watch_presence(
        &self,
        channel: &ChannelName,
    ) -> Result<broadcast::Receiver<PresenceEvent>, RelayError> {
        Ok(self
            .inner
            .presence
            .send(WatchPresence(channel.clone()))
            .timeout(ACTOR_CALL_TIMEOUT)
            .await?)
    }

    /// Cancelled when the relay begins to shut down: streams and waits end on it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Stops taking work, ends streams and waits, and flushes the store.
    pub fn shutdown(&self) -> Result<(), RelayError> {
        self.inner.shutdown.cancel();
        self.inner.store.flush()?;
        Ok(())
    }

    pub fn size_on_disk(&self) -> Result<u64, RelayError> {
        Ok(self.inner.store.size_on_disk()?)
    }
}
