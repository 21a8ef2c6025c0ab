//! This node as a cluster sees it ([`Node`]): where the tasks following the other nodes hand
//! what they find. On a relay of its own nothing calls it.

use super::{Relay, ACTOR_CALL_TIMEOUT};
use crate::channel::{Apply, CheckRelease, Install};
use crate::cluster::{CursorChange, CursorMoves, Fold, LogEvent, Members, Node, Registration};
use crate::error::RelayError;
use crate::presence::{MergePresence, Outgoing, PresenceChange, PublishPresence};
use crate::registry::{MergeCursor, MoveCursors};
use crate::store::{EventStore, Space, StoreError};
use crosstalk_schema::{ChannelName, CutState};
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

impl Node for Relay {
    fn shutdown(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }
}

impl Fold for Relay {
    fn store(&self) -> Arc<dyn EventStore> {
        self.inner.store.clone()
    }

    fn write_aux(
        &self,
        space: Space,
        writes: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let ticket = self
            .inner
            .committer
            .write(Box::new(move |store: &dyn EventStore| store.write_aux(space, &writes)));
        Box::pin(ticket.durable())
    }

    fn channel_last_id(&self, channel: &ChannelName) -> Result<u64, RelayError> {
        Relay::channel_last_id(self, channel)
    }

    fn apply(&self, event: LogEvent) -> BoxFuture<'static, Result<Option<u64>, RelayError>> {
        let relay = self.clone();
        Box::pin(async move {
            // An actor that stopped between the lookup and the send: the caller tries again,
            // and the channel is reopened.
            let handle = relay.open_channel(&event.channel, true).await?;
            Ok(handle.addr.send(Apply(event)).await?)
        })
    }

    fn install(&self, channel: ChannelName, cut: CutState) -> BoxFuture<'static, Result<bool, RelayError>> {
        let relay = self.clone();
        Box::pin(async move {
            let handle = relay.open_channel(&channel, true).await?;
            handle.addr.send(Install(cut)).await?
        })
    }
}

impl Members for Relay {
    fn merge_registration(&self, r: Registration) {
        self.inner.identities.merge(r.instance, r.session, r.seen);
    }

    fn heard_since(&self, published: &mut HashMap<String, i64>) -> Vec<(String, String, i64)> {
        self.inner.identities.heard_since(published)
    }

    fn presence_ttl(&self) -> Duration {
        self.inner.identities.ttl()
    }

    fn share_presence(&self, tx: mpsc::UnboundedSender<Outgoing>, node: String) {
        self.inner.presence.do_send(PublishPresence { tx, node });
    }

    fn merge_presence(&self, change: PresenceChange) {
        self.inner.presence.do_send(MergePresence(change));
    }

    fn check_release(&self, channel: &ChannelName) {
        if let Some(handle) = self.inner.directory.read().get(channel) {
            handle.addr.do_send(CheckRelease);
        }
    }
}

impl CursorMoves for Relay {
    fn merge_cursor(&self, change: CursorChange) {
        self.inner.registry.do_send(MergeCursor(change));
    }

    fn move_cursors(&self, who: &str, moves: Vec<(ChannelName, u64)>) -> BoxFuture<'static, Result<(), RelayError>> {
        let moved = self.inner.registry.send(MoveCursors {
            instance_id: who.to_owned(),
            moves,
        });
        Box::pin(async move {
            moved
                .timeout(ACTOR_CALL_TIMEOUT)
                .await
                .map_err(RelayError::from)
                .and_then(|r| r)
        })
    }
}
