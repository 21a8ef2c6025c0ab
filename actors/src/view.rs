//! The read side of a channel: what its actor has committed, shared by every reader without a
//! round trip to the actor. Only the channel actor writes it, and only with durable batches.

use crate::error::RelayError;
use crate::store::EventStore;
use crosstalk_schema::{codec, ChannelMeta, ChannelName, ChannelState, Message, Overlay, Record};
use parking_lot::RwLock;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Milliseconds since the first time anything asked: a clock cheap enough to stamp on every
/// channel lookup.
pub(crate) fn now_ms() -> u64 {
    now_us() / 1000
}

fn now_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Committed messages each channel keeps in memory, so tail reads and fan-out skip the store.
pub const RECENT_CAPACITY: usize = 1024;

/// What [`ChannelView::read_scanned`] found.
pub struct Scan {
    pub found: Vec<Arc<Posted>>,
    /// The last event looked at: a cursor moves here.
    pub scanned: u64,
    /// The byte budget ended the read before `limit` (more may follow at once).
    pub full: bool,
    /// Bytes of the messages' JSON found.
    pub bytes: usize,
}

/// Most events read from the store at once by a read that may stop early.
const STORE_PAGE: usize = 256;

/// Messages collected up to a count and a number of bytes of their JSON; the first one is
/// always taken, however large, so every read moves on.
struct Budget {
    found: Vec<Arc<Posted>>,
    limit: usize,
    bytes_left: usize,
    /// Bytes taken so far.
    bytes: usize,
    /// The byte budget turned a message away.
    full: bool,
}

impl Budget {
    fn new(limit: usize, max_bytes: usize) -> Budget {
        Budget {
            found: Vec::new(),
            limit,
            bytes_left: max_bytes,
            bytes: 0,
            full: false,
        }
    }

    /// Takes `p` if there is room; false once there is none (for `p` or any later one).
    fn take(&mut self, p: Arc<Posted>) -> bool {
        if self.done() {
            return false;
        }
        let size = p.json().len();
        if size > self.bytes_left && !self.found.is_empty() {
            self.full = true;
            return false;
        }
        self.bytes_left = self.bytes_left.saturating_sub(size);
        self.bytes += size;
        self.found.push(p);
        true
    }

    fn done(&self) -> bool {
        self.full || self.found.len() >= self.limit
    }

    fn len(&self) -> usize {
        self.found.len()
    }

    fn last_id(&self) -> Option<u64> {
        self.found.last().map(|p| p.id())
    }
}

/// A committed message, with its JSON encoded once for every reader: every face's answer
/// that holds messages serialises this raw JSON as it is (its `Serialize`), so there is one
/// JSON encoding of a message, made once.
#[derive(Debug)]
pub struct Posted {
    pub message: Message,
    json: Box<RawValue>,
}

impl Posted {
    pub fn new(message: Message) -> Self {
        // A Message is strings and integers: JSON encoding cannot fail.
        let json = serde_json::value::to_raw_value(&message).expect("a Message always encodes as JSON");
        Posted { message, json }
    }

    pub fn id(&self) -> u64 {
        self.message.id
    }

    /// The message's JSON, encoded once.
    pub fn json(&self) -> &[u8] {
        self.json.get().as_bytes()
    }
}

impl Serialize for Posted {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

impl JsonSchema for Posted {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        Message::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        Message::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        Message::json_schema(generator)
    }
}

pub struct ChannelView {
    name: ChannelName,
    store: Arc<dyn EventStore>,
    /// Id of the newest committed event. Subscribers wait on it.
    watermark: watch::Sender<u64>,
    state: RwLock<ViewState>,
    /// When a face last looked the channel up ([`now_ms`]): what makes an actor idle.
    touched: AtomicU64,
    /// When the newest batch became visible (µs, same clock): wake latency is measured from it.
    published: AtomicU64,
}

struct ViewState {
    /// The newest committed messages, oldest first, as posted (no overlay applied).
    recent: VecDeque<Arc<Posted>>,
    /// Every committed message with an id above this is in `recent`.
    floor: u64,
    meta: ChannelMeta,
    channel: ChannelState,
    /// Reply counts and answers of earlier messages.
    overlays: HashMap<u64, Overlay>,
    /// Ids at or below this were removed by retention.
    compacted_upto: u64,
}

/// What one committed batch changes in the view.
pub(crate) struct Published {
    pub messages: Vec<Arc<Posted>>,
    pub meta: ChannelMeta,
    pub state: Option<ChannelState>,
    pub overlays: Vec<(u64, Overlay)>,
}

impl ChannelView {
    pub(crate) fn new(
        name: ChannelName,
        meta: ChannelMeta,
        channel: ChannelState,
        overlays: HashMap<u64, Overlay>,
        store: Arc<dyn EventStore>,
    ) -> Self {
        ChannelView {
            name,
            store,
            watermark: watch::Sender::new(meta.last_id),
            state: RwLock::new(ViewState {
                recent: VecDeque::new(),
                floor: meta.last_id,
                meta,
                channel,
                overlays,
                compacted_upto: 0,
            }),
            touched: AtomicU64::new(now_ms()),
            published: AtomicU64::new(0),
        }
    }

    /// A view of a channel that is not open, straight from the store (`None` if the channel
    /// was never written): what a search shows of a channel whose actor went idle.
    pub(crate) fn detached(name: &ChannelName, store: Arc<dyn EventStore>) -> Result<Option<Self>, RelayError> {
        let Some(meta) = store.meta(name)? else {
            return Ok(None);
        };
        let state = store.state(name)?;
        let overlays = store.overlays(name)?.into_iter().collect();
        Ok(Some(ChannelView::new(name.clone(), meta, state, overlays, store)))
    }

    /// A view of a closed channel for reading its log only (no state, no overlays).
    pub(crate) fn detached_log(name: &ChannelName, store: Arc<dyn EventStore>) -> Result<Option<Self>, RelayError> {
        let Some(meta) = store.meta(name)? else {
            return Ok(None);
        };
        Ok(Some(ChannelView::new(
            name.clone(),
            meta,
            ChannelState::default(),
            HashMap::new(),
            store,
        )))
    }

    /// Puts the channel's newest message in the recent window of a view just opened, so what
    /// depends on the newest message (a pending `done`) survives the actor being reopened.
    pub(crate) fn seed_newest(&self) -> Result<(), RelayError> {
        let newest = self.meta().last_message_id;
        if newest == 0 || !self.state.read().recent.is_empty() {
            return Ok(());
        }
        // As posted: overlays are applied when it is read.
        let Some(message) = self
            .store
            .read_one(&self.name, newest)?
            .and_then(|bytes| self.decode(newest, &bytes))
        else {
            return Ok(());
        };
        let mut state = self.state.write();
        if state.recent.is_empty() && state.meta.last_message_id == newest {
            // Every message above the floor is in `recent`, and only the newest one is.
            state.floor = newest - 1;
            state.recent.push_back(Arc::new(Posted::new(message)));
        }
        Ok(())
    }

    /// Records that a face is using the channel now.
    pub fn touch(&self) {
        self.touched.store(now_ms(), Ordering::Relaxed);
    }

    /// How long since the newest batch became visible: a reader woken by it measures its
    /// wake latency with this.
    pub fn since_published(&self) -> Duration {
        Duration::from_micros(now_us().saturating_sub(self.published.load(Ordering::Relaxed)))
    }

    /// How long since a face last used the channel.
    pub fn idle_for(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.touched.load(Ordering::Relaxed)))
    }

    pub fn name(&self) -> &ChannelName {
        &self.name
    }

    /// Id of the newest committed event (0 if none).
    pub fn last_id(&self) -> u64 {
        *self.watermark.borrow()
    }

    pub fn meta(&self) -> ChannelMeta {
        self.state.read().meta
    }

    /// The committed channel state: description, session, open questions.
    pub fn channel_state(&self) -> ChannelState {
        self.state.read().channel.clone()
    }

    /// Every committed overlay (what the channel actor goes back to when a batch fails).
    pub(crate) fn overlays(&self) -> HashMap<u64, Overlay> {
        self.state.read().overlays.clone()
    }

    pub fn overlay(&self, id: u64) -> Option<Overlay> {
        self.state.read().overlays.get(&id).copied()
    }

    /// A receiver that wakes whenever new events are committed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.watermark.subscribe()
    }

    fn dressed(p: &Arc<Posted>, overlays: &HashMap<u64, Overlay>) -> Arc<Posted> {
        match overlays.get(&p.id()) {
            None => p.clone(),
            Some(o) => Arc::new(Posted::new(p.message.clone().with_overlay(o))),
        }
    }

    /// Decodes stored events into messages with their overlays (events that are not
    /// messages are skipped; a damaged one is logged and skipped).
    fn decode_all(&self, events: Vec<(u64, Vec<u8>)>) -> Vec<Arc<Posted>> {
        let messages: Vec<Message> = events
            .iter()
            .filter_map(|(id, bytes)| self.decode(*id, bytes))
            .collect();
        let state = self.state.read();
        messages
            .into_iter()
            .map(|m| {
                let m = match state.overlays.get(&m.id) {
                    Some(o) => m.with_overlay(o),
                    None => m,
                };
                Arc::new(Posted::new(m))
            })
            .collect()
    }

    fn decode(&self, id: u64, bytes: &[u8]) -> Option<Message> {
        match codec::decode::<Record>(bytes) {
            Ok(Record::Message(record)) => Some(Message::new(id, &self.name, record)),
            Ok(_) => None,
            Err(e) => {
                tracing::error!(channel = %self.name, id, error = %e, "skipping a damaged record");
                None
            }
        }
    }

    /// Committed messages with id > `after`, oldest first, at most `limit`.
    pub fn read(&self, after: u64, limit: usize) -> Result<Vec<Arc<Posted>>, RelayError> {
        Ok(self.read_scanned(after, limit, usize::MAX)?.found)
    }

    /// Like [`read`](Self::read), within `max_bytes` of messages' JSON (at least one message),
    /// and also the id of the last event looked at (messages and other events alike), so a
    /// cursor can move past events that are not messages.
    pub fn read_scanned(&self, after: u64, limit: usize, max_bytes: usize) -> Result<Scan, RelayError> {
        let mut cursor = after;
        let mut out = Budget::new(limit, max_bytes);
        while !out.done() {
            let upto = {
                let state = self.state.read();
                let upto = state.meta.last_id;
                if cursor >= upto {
                    break;
                }
                if cursor >= state.floor {
                    let start = state.recent.partition_point(|p| p.id() <= cursor);
                    for p in state.recent.iter().skip(start) {
                        if !out.take(Self::dressed(p, &state.overlays)) {
                            break;
                        }
                    }
                    // Everything up to the watermark is in `recent` (events that are not
                    // messages included, being skipped).
                    cursor = if out.done() {
                        out.last_id().unwrap_or(upto)
                    } else {
                        upto
                    };
                    break;
                }
                upto
            };
            // In pages, so a budget met early does not decode (or hold) the rest.
            let page = (limit - out.len()).min(STORE_PAGE);
            let batch = self.store.read(&self.name, cursor, upto, page)?;
            let Some(last) = batch.last().map(|e| e.0) else {
                cursor = upto;
                break;
            };
            cursor = last;
            for p in self.decode_all(batch) {
                if !out.take(p) {
                    break;
                }
            }
            if out.full {
                cursor = out.last_id().unwrap_or(cursor);
            }
        }
        Ok(Scan {
            full: out.full,
            bytes: out.bytes,
            found: out.found,
            scanned: cursor,
        })
    }

    /// The newest committed messages with `id < before`, at most `limit`, within `max_bytes`
    /// of their JSON (at least one message), oldest first; and whether the byte budget left
    /// older ones out.
    pub fn newest(&self, before: u64, limit: usize, max_bytes: usize) -> Result<(Vec<Arc<Posted>>, bool), RelayError> {
        let mut out = Budget::new(limit, max_bytes);
        let (floor, compacted) = {
            let state = self.state.read();
            let end = state.recent.partition_point(|p| p.id() < before);
            for p in state.recent.range(..end).rev() {
                if !out.take(Self::dressed(p, &state.overlays)) {
                    break;
                }
            }
            (state.floor, state.compacted_upto)
        };
        // Older messages are in the store, below the recent window (events that are not
        // messages are skipped, so read in pages until enough or none are left).
        let mut upto = floor.min(before.saturating_sub(1));
        while !out.done() && upto > compacted {
            let page = self
                .store
                .read_back(&self.name, upto, (limit - out.len()).clamp(16, STORE_PAGE))?;
            let Some(last) = page.last().map(|e| e.0) else { break };
            for p in self.decode_all(page) {
                if !out.take(p) {
                    break;
                }
            }
            upto = last.saturating_sub(1);
        }
        let full = out.full;
        let mut found = out.found;
        found.reverse();
        Ok((found, full))
    }

    /// One committed message by id.
    pub fn get(&self, id: u64) -> Result<Option<Arc<Posted>>, RelayError> {
        {
            let state = self.state.read();
            if id > state.meta.last_id || id <= state.compacted_upto {
                return Ok(None);
            }
            if id > state.floor {
                let at = state.recent.partition_point(|p| p.id() < id);
                return Ok(state
                    .recent
                    .get(at)
                    .filter(|p| p.id() == id)
                    .map(|p| Self::dressed(p, &state.overlays)));
            }
        }
        Ok(self
            .store
            .read_one(&self.name, id)?
            .and_then(|bytes| self.decode_all(vec![(id, bytes)]).pop()))
    }

    /// The messages replying to `parent`, oldest first.
    pub fn replies(&self, parent: u64, limit: usize) -> Result<Vec<Arc<Posted>>, RelayError> {
        let last = self.last_id();
        let mut out = Vec::new();
        for id in self.store.replies(&self.name, parent, limit)? {
            if id > last {
                break;
            }
            if let Some(p) = self.get(id)? {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Makes a durable batch visible. Only the store thread calls this, with the hook the
    /// channel actor gave its batch: one batch of a channel at a time, in id order.
    pub(crate) fn publish(&self, p: Published) {
        {
            let mut state = self.state.write();
            for m in p.messages {
                state.recent.push_back(m);
            }
            while state.recent.len() > RECENT_CAPACITY {
                if let Some(old) = state.recent.pop_front() {
                    state.floor = old.id();
                }
            }
            state.meta = p.meta;
            if let Some(channel) = p.state {
                state.channel = channel;
            }
            for (id, o) in p.overlays {
                state.overlays.insert(id, o);
            }
        }
        self.published.store(now_us(), Ordering::Relaxed);
        self.watermark.send_replace(p.meta.last_id);
    }

    /// Every id at or below this was removed by retention.
    pub fn compacted_upto(&self) -> u64 {
        self.state.read().compacted_upto
    }

    /// Records that retention removed everything up to `upto`.
    pub(crate) fn compacted(&self, upto: u64, meta: ChannelMeta) {
        let mut state = self.state.write();
        state.compacted_upto = state.compacted_upto.max(upto);
        state.meta.count = meta.count;
        while state.recent.front().is_some_and(|p| p.id() <= upto) {
            if let Some(old) = state.recent.pop_front() {
                state.floor = state.floor.max(old.id());
            }
        }
        state.floor = state.floor.max(upto);
    }
}
