//! The registry: the directory of channels. It starts a channel's actor on first use and is
//! the only writer of the directory; faces look channels up through [`crate::Relay`], which
//! reads the directory without a round trip once a channel is open.

use crate::channel::{ChannelActor, ChannelHandle, ChannelView};
use crate::commit::Committer;
use crate::error::RelayError;
use crate::relay::IdAllocator;
use crate::store::EventStore;
use actix::prelude::*;
use crosstalk_schema::{ChannelName, Limits};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) type Directory = Arc<RwLock<HashMap<ChannelName, ChannelHandle>>>;

/// Open a channel, starting its actor if it is not running yet.
#[derive(Message)]
#[rtype(result = "Result<ChannelHandle, RelayError>")]
pub struct OpenChannel(pub ChannelName);

pub struct Registry {
    pub(crate) directory: Directory,
    pub(crate) store: Arc<dyn EventStore>,
    pub(crate) committer: Committer,
    pub(crate) ids: Arc<IdAllocator>,
    pub(crate) limits: Limits,
}

impl Actor for Registry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
    }
}

impl Handler<OpenChannel> for Registry {
    type Result = Result<ChannelHandle, RelayError>;

    fn handle(&mut self, OpenChannel(name): OpenChannel, _: &mut Context<Self>) -> Self::Result {
        if let Some(handle) = self.directory.read().get(&name) {
            return Ok(handle.clone());
        }
        let meta = self.store.meta(&name)?.unwrap_or_default();
        let view = Arc::new(ChannelView::new(name.clone(), meta, self.store.clone()));
        let addr = ChannelActor::new(
            view.clone(),
            self.store.clone(),
            self.committer.clone(),
            self.ids.clone(),
            self.limits,
        )
        .start();
        let handle = ChannelHandle { addr, view };
        self.directory.write().insert(name.clone(), handle.clone());
        tracing::debug!(channel = %name, last_id = meta.last_id, "channel opened");
        Ok(handle)
    }
}
