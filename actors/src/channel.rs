//! A channel: the actor that is the only writer of the channel's log, and the view through
//! which everyone reads what it has committed.
//!
//! Invariants:
//! - ids are assigned here, in mailbox order, so they strictly increase within the channel;
//! - a batch becomes visible (view, watermark, cache) only after the committer says it is
//!   durable, and batches commit one at a time in id order, so a reader never sees id N+1
//!   while N is not readable, and never sees what a crash could take back;
//! - the watermark is a wake-up, not a queue: subscribers re-read from the view by cursor, so
//!   a slow one costs the channel nothing and misses nothing.

use crate::commit::Committer;
use crate::error::RelayError;
use crate::relay::IdAllocator;
use crate::store::EventStore;
use actix::prelude::*;
use bytes::Bytes;
use crosstalk_schema::{codec, ChannelMeta, ChannelName, Limits, Message, NewMessage, Record, Timestamp};
use parking_lot::RwLock;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// Committed messages each channel keeps in memory, so tail reads and fan-out skip the store.
pub const RECENT_CAPACITY: usize = 1024;
/// Posts queued in a channel's mailbox before senders wait.
const MAILBOX_CAPACITY: usize = 4096;

/// A committed message, with its JSON encoded once for every reader.
#[derive(Debug)]
pub struct Posted {
    pub message: Message,
    pub json: Bytes,
}

impl Posted {
    fn new(message: Message) -> Self {
        // A Message is strings and integers: JSON encoding cannot fail.
        let json = serde_json::to_vec(&message).expect("a Message always encodes as JSON");
        Posted {
            message,
            json: Bytes::from(json),
        }
    }

    pub fn id(&self) -> u64 {
        self.message.id
    }
}

/// The read side of a channel: what has been committed, shared by every reader.
pub struct ChannelView {
    name: ChannelName,
    store: Arc<dyn EventStore>,
    /// Id of the newest committed message. Subscribers wait on it.
    watermark: watch::Sender<u64>,
    state: RwLock<ViewState>,
}

struct ViewState {
    /// The newest committed messages, oldest first.
    recent: VecDeque<Arc<Posted>>,
    /// Every committed message with an id above this is in `recent`.
    floor: u64,
    /// Committed summary (count, last id, times).
    meta: ChannelMeta,
}

impl ChannelView {
    pub(crate) fn new(name: ChannelName, meta: ChannelMeta, store: Arc<dyn EventStore>) -> Self {
        ChannelView {
            name,
            store,
            watermark: watch::Sender::new(meta.last_id),
            state: RwLock::new(ViewState {
                recent: VecDeque::new(),
                floor: meta.last_id,
                meta,
            }),
        }
    }

    pub fn name(&self) -> &ChannelName {
        &self.name
    }

    /// Id of the newest committed message (0 if none).
    pub fn last_id(&self) -> u64 {
        *self.watermark.borrow()
    }

    pub fn meta(&self) -> ChannelMeta {
        self.state.read().meta
    }

    /// A receiver that wakes whenever new messages are committed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.watermark.subscribe()
    }

    /// Committed messages with id > `after`, oldest first, at most `limit`.
    pub fn read(&self, after: u64, limit: usize) -> Result<Vec<Arc<Posted>>, RelayError> {
        let upto = {
            let state = self.state.read();
            let upto = state.meta.last_id;
            if after >= upto || limit == 0 {
                return Ok(Vec::new());
            }
            if after >= state.floor {
                let start = state.recent.partition_point(|p| p.id() <= after);
                return Ok(state.recent.iter().skip(start).take(limit).cloned().collect());
            }
            upto
        };
        let mut out = Vec::new();
        for (id, bytes) in self.store.read(&self.name, after, upto, limit)? {
            match codec::decode::<Record>(&bytes) {
                Ok(Record::Message(record)) => out.push(Arc::new(Posted::new(Message::new(id, &self.name, record)))),
                Err(e) => tracing::error!(channel = %self.name, id, error = %e, "skipping a damaged record"),
            }
        }
        Ok(out)
    }

    /// Like [`read`](Self::read), but when nothing is there yet waits until something is
    /// committed, `timeout` passes, or `cancel` completes; then returns what there is.
    pub async fn wait(
        &self,
        after: u64,
        limit: usize,
        timeout: Duration,
        cancel: impl Future<Output = ()>,
    ) -> Result<Vec<Arc<Posted>>, RelayError> {
        // Subscribe before reading, so a commit between the read and the wait still wakes us.
        let mut rx = self.subscribe();
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline, cancel);
        loop {
            let found = self.read(after, limit)?;
            if !found.is_empty() {
                return Ok(found);
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { return Ok(Vec::new()) },
                _ = &mut deadline => return Ok(Vec::new()),
                _ = &mut cancel => return Ok(Vec::new()),
            }
        }
    }

    /// Makes a durable batch visible. Only the channel actor calls this, in id order.
    fn publish(&self, batch: Vec<Arc<Posted>>, meta: ChannelMeta) {
        {
            let mut state = self.state.write();
            for p in batch {
                state.recent.push_back(p);
            }
            while state.recent.len() > RECENT_CAPACITY {
                if let Some(old) = state.recent.pop_front() {
                    state.floor = old.id();
                }
            }
            state.meta = meta;
        }
        self.watermark.send_replace(meta.last_id);
    }
}

/// Post a message; answers once it is durable and visible.
#[derive(Message)]
#[rtype(result = "Result<Arc<Posted>, RelayError>")]
pub struct Post(pub NewMessage);

struct Pending {
    posted: Arc<Posted>,
    encoded: Vec<u8>,
    reply: oneshot::Sender<Result<Arc<Posted>, RelayError>>,
}

/// The single writer of one channel's log.
pub struct ChannelActor {
    view: Arc<ChannelView>,
    store: Arc<dyn EventStore>,
    committer: Committer,
    ids: Arc<IdAllocator>,
    limits: Limits,
    /// Summary including the batch in flight (the view's is the committed one).
    meta: ChannelMeta,
    /// Posts accepted while a batch is being committed; they form the next batch.
    pending: Vec<Pending>,
    /// A batch is between append and durable. At most one, so batches commit in order.
    in_flight: bool,
}

impl ChannelActor {
    pub(crate) fn new(
        view: Arc<ChannelView>,
        store: Arc<dyn EventStore>,
        committer: Committer,
        ids: Arc<IdAllocator>,
        limits: Limits,
    ) -> Self {
        let meta = view.meta();
        ChannelActor {
            view,
            store,
            committer,
            ids,
            limits,
            meta,
            pending: Vec::new(),
            in_flight: false,
        }
    }

    fn start_commit(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight || self.pending.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        let mut meta = self.meta;
        for p in &batch {
            meta.count += 1;
            meta.last_id = p.posted.id();
        }
        let now = Timestamp::now();
        meta.last_at = Some(now);
        meta.created_at.get_or_insert(now);
        let events: Vec<_> = batch.iter().map(|p| (p.posted.id(), p.encoded.clone())).collect();
        if let Err(e) = self.store.append(self.view.name(), &events, &meta) {
            tracing::error!(channel = %self.view.name(), error = %e, "append failed");
            for p in batch {
                let _ = p.reply.send(Err(e.clone().into()));
            }
            return;
        }
        self.meta = meta;
        self.in_flight = true;
        let durable = self.committer.durable();
        ctx.spawn(
            async move {
                durable
                    .await
                    .unwrap_or_else(|_| Err(crate::StoreError::Io("committer gone".into())))
            }
            .into_actor(self)
            .map(move |result, act, ctx| {
                act.in_flight = false;
                match result {
                    Ok(()) => {
                        let posted: Vec<_> = batch.iter().map(|p| p.posted.clone()).collect();
                        act.view.publish(posted, meta);
                        for p in batch {
                            let _ = p.reply.send(Ok(p.posted));
                        }
                    }
                    Err(e) => {
                        // The batch may still reach disk later; it is never acknowledged
                        // and never shown until a restart reads it back.
                        for p in batch {
                            let _ = p.reply.send(Err(e.clone().into()));
                        }
                    }
                }
                act.start_commit(ctx);
            }),
        );
    }
}

impl Actor for ChannelActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
    }
}

impl Handler<Post> for ChannelActor {
    type Result = ResponseFuture<Result<Arc<Posted>, RelayError>>;

    fn handle(&mut self, Post(post): Post, ctx: &mut Context<Self>) -> Self::Result {
        let record = match post.into_record(&self.limits, Timestamp::now()) {
            Ok(r) => r,
            Err(e) => return Box::pin(async move { Err(e.into()) }),
        };
        let id = self.ids.next();
        let encoded = codec::encode(&Record::Message(record.clone()));
        let posted = Arc::new(Posted::new(Message::new(id, self.view.name(), record)));
        let (reply, rx) = oneshot::channel();
        self.pending.push(Pending { posted, encoded, reply });
        self.start_commit(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(RelayError::Unavailable("channel stopped"))) })
    }
}

/// What a face holds to use a channel: its actor for writes, its view for reads.
#[derive(Clone)]
pub struct ChannelHandle {
    pub addr: Addr<ChannelActor>,
    pub view: Arc<ChannelView>,
}
