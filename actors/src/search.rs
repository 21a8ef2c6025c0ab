//! Full-text search over every channel, served from an inverted index kept in the store.
//! The indexer pulls committed messages from channel views by cursor on a thread of its own at
//! the lowest CPU priority, so posting never waits for it and under load it yields the cores to
//! the relay; every search first asks it to catch up, so results are always complete. A restart
//! resumes where it stopped. Channels whose actor went idle before they were indexed wait in a
//! backlog and are read from the store.
//!
//! The index holds one key per term and block of [`BLOCK_IDS`] consecutive message ids
//! (`term\0{id / BLOCK_IDS}`, in [`Space::Postings`]); its value lists the block's ids that
//! hold the term, each with its channel. sled keeps state in memory for every page of keys,
//! and a page holds a handful of keys: one key per term and message (the first format, which
//! a store of an earlier version still holds in [`Space::Search`] and the indexer converts)
//! made the index most of a large store's resident memory.

use crate::error::RelayError;
use crate::store::{AuxEntries, EventStore, Space};
use crate::view::{ChannelView, Posted, Scan};
use crate::ShrinkAfterBurst;
use actix::prelude::*;
use crosstalk_schema::{kind_is, ChannelName};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the indexer looks for new messages.
const INDEX_EVERY: Duration = Duration::from_millis(100);
/// Messages of one channel indexed per pass.
const INDEX_BATCH: usize = 100;
/// Postings written per store batch at most (plus one channel's): a sled batch holds a
/// store-wide lock while it applies, so batches stay short enough (a few ms) never to stall
/// a channel's commit for long.
const WRITE_POSTINGS: usize = 4000;
/// The background indexer works only when no channel has committed for this long, so under
/// load the relay keeps its cores and locks; a search catches the index up on demand.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// Distinct terms indexed per message.
const MAX_TERMS: usize = 64;
/// Shortest and longest indexed term, in bytes.
const TERM_LEN: std::ops::RangeInclusive<usize> = 2..=40;
/// Message ids per postings block (a power of two: an id's offset in its block is one byte).
const BLOCK_IDS: u64 = 64;
/// Newest blocks looked at per query term when choosing the rarest one.
const SELECTIVITY_PROBE: usize = 32;
/// Blocks a query reads from the store at a time.
const SCAN_PAGE: usize = 16;
/// Postings a query scans at most before answering with what it found.
const MAX_SCAN: usize = 200_000;
/// Closed channels one pass indexes from the store at most (each costs a few store reads).
const BACKLOG_PER_PASS: usize = 1000;
/// First-format postings converted per store batch, and per indexer pass at most.
const CONVERT_BATCH: usize = 500;
const CONVERT_PER_PASS: Duration = Duration::from_millis(100);

/// Channels that are not open and may have messages the index lacks.
pub(crate) type Backlog = Arc<Mutex<HashSet<ChannelName>>>;

/// When the index last had every committed message ([`crate::view::now_ms`]).
pub(crate) type CaughtUp = Arc<std::sync::atomic::AtomicU64>;

/// The lowercase terms of a text, deduplicated, in order of first appearance.
pub fn terms(text: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    text.split(|c: char| !c.is_alphanumeric())
        .map(|t| t.to_lowercase())
        .filter(|t| TERM_LEN.contains(&t.len()) && seen.insert(t.clone()))
        .take(MAX_TERMS)
        .collect()
}

/// `term\0` then a big-endian number: a block (in [`Space::Postings`]) or, in the first
/// format, a message id. Terms are letters and digits, so the NUL ends every term.
fn term_key(term: &str, n: u64) -> Vec<u8> {
    let mut k = term_prefix(term);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// The key prefix of every block of `term`.
fn term_prefix(term: &str) -> Vec<u8> {
    let mut k = term.as_bytes().to_vec();
    k.push(0);
    k
}

/// The term and number of a [`term_key`].
fn parse_term_key(key: &[u8]) -> Option<(&str, u64)> {
    let (term, n) = key.split_at_checked(key.len().checked_sub(9)?)?;
    let (&0, n) = n.split_first()? else { return None };
    Some((std::str::from_utf8(term).ok()?, u64::from_be_bytes(n.try_into().ok()?)))
}

/// One block's postings: message id → channel, in id order.
type Block = BTreeMap<u64, Vec<u8>>;

/// A term, the id of a message holding it, and the message's channel.
type Posting = (String, u64, Vec<u8>);

/// A block's value: per posting, in id order, the id's offset in the block (one byte), the
/// channel name's length (one byte; names are at most 64 bytes) and the name.
fn encode_block(block: &Block) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.values().map(|c| c.len() + 2).sum());
    for (id, channel) in block {
        out.push((id % BLOCK_IDS) as u8);
        out.push(channel.len() as u8);
        out.extend_from_slice(channel);
    }
    out
}

/// The postings of block number `n`; `None` when the value is not a block's.
fn decode_block(n: u64, mut value: &[u8]) -> Option<Block> {
    let mut block = Block::new();
    while let [offset, len, rest @ ..] = value {
        let (offset, len) = (u64::from(*offset), usize::from(*len));
        if offset >= BLOCK_IDS || rest.len() < len {
            return None;
        }
        block.insert(n * BLOCK_IDS + offset, rest[..len].to_vec());
        value = &rest[len..];
    }
    value.is_empty().then_some(block)
}

/// Adds postings (`term`, message id, channel) to the index: each block they fall in is
/// read, extended and written back in one batch. Adding a posting the index has is a no-op,
/// so a pass repeated after a crash leaves the index as one pass would.
fn add_postings(store: &dyn EventStore, postings: impl IntoIterator<Item = Posting>) -> Result<(), RelayError> {
    let mut blocks: BTreeMap<(String, u64), Block> = BTreeMap::new();
    for (term, id, channel) in postings {
        // A block gives a name one length byte; names are at most 64 bytes, so a longer one
        // is damage (converted from a first-format value), and would make the block unreadable.
        if channel.len() > usize::from(u8::MAX) {
            tracing::error!(
                term,
                id,
                "search posting with a channel name of {} bytes; dropped",
                channel.len()
            );
            continue;
        }
        blocks.entry((term, id / BLOCK_IDS)).or_default().insert(id, channel);
    }
    let mut writes = Vec::with_capacity(blocks.len());
    for ((term, n), new) in blocks {
        let key = term_key(&term, n);
        let mut block = match store.get_aux(Space::Postings, &key)? {
            Some(v) => decode_block(n, &v).unwrap_or_else(|| {
                // Rebuilt from what this pass adds; a message it lacks is found again only
                // by re-indexing its channel. Not expected: blocks are written only here.
                tracing::error!(term, block = n, "unreadable search postings block; replacing it");
                Block::new()
            }),
            None => Block::new(),
        };
        block.extend(new);
        writes.push((key, encode_block(&block)));
    }
    store.put_aux_batch(Space::Postings, &writes)?;
    Ok(())
}

fn progress_key(channel: &ChannelName) -> Vec<u8> {
    let mut k = b"index:".to_vec();
    k.extend_from_slice(channel.as_str().as_bytes());
    k
}

/// What to search for.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub text: String,
    pub channel: Option<ChannelName>,
    pub sender: Option<String>,
    pub kind: Option<String>,
    pub limit: usize,
}

/// Keeps the index up to date. Channels come from `channels`, a function that lists the
/// views of every channel (open or not), so the indexer needs no knowledge of the registry.
pub struct Indexer {
    store: Arc<dyn EventStore>,
    views: Arc<dyn Fn() -> Vec<Arc<ChannelView>> + Send + Sync>,
    /// Closed channels still to index, read through detached views.
    backlog: Backlog,
    /// Whether the stored channels have been checked for a backlog since the start.
    surveyed: bool,
    /// Whether no first-format postings are left to convert ([`Space::Search`] is empty).
    converted: bool,
    caught_up: CaughtUp,
    /// The sum of channel watermarks at the last look, and when it last changed.
    activity: (u64, std::time::Instant),
}

impl Indexer {
    pub(crate) fn new(
        store: Arc<dyn EventStore>,
        views: Arc<dyn Fn() -> Vec<Arc<ChannelView>> + Send + Sync>,
        backlog: Backlog,
        caught_up: CaughtUp,
    ) -> Self {
        Indexer {
            store,
            views,
            backlog,
            surveyed: false,
            converted: false,
            caught_up,
            activity: (0, std::time::Instant::now()),
        }
    }

    /// Whether no channel has committed anything for [`QUIET_FOR`].
    fn quiet(&mut self) -> bool {
        let sum = (self.views)().iter().map(|v| v.last_id()).fold(0u64, u64::wrapping_add);
        if sum != self.activity.0 {
            self.activity = (sum, std::time::Instant::now());
        }
        self.activity.1.elapsed() >= QUIET_FOR
    }

    fn progress(&self, channel: &ChannelName) -> u64 {
        self.store
            .get_aux(Space::Jobs, &progress_key(channel))
            .ok()
            .flatten()
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_be_bytes)
    }

    /// The views to index: every open channel, and up to [`BACKLOG_PER_PASS`] closed ones
    /// read from the store. The first call also finds what a previous run left unindexed.
    fn sources(&mut self) -> Vec<Arc<ChannelView>> {
        if !self.surveyed {
            self.surveyed = true;
            match self.store.channels() {
                Ok(stored) => {
                    let behind: Vec<ChannelName> = stored
                        .into_iter()
                        .filter(|(name, meta)| meta.last_id > self.progress(name))
                        .map(|(name, _)| name)
                        .collect();
                    self.backlog.lock().extend(behind);
                }
                Err(e) => {
                    crate::throttled!(error, error = %e, "listing channels to index failed; will retry");
                    self.surveyed = false;
                }
            }
        }
        let mut views = (self.views)();
        let open: HashSet<ChannelName> = views.iter().map(|v| v.name().clone()).collect();
        let closed: Vec<ChannelName> = {
            let mut backlog = self.backlog.lock();
            // An open channel is indexed through its own view.
            backlog.retain(|name| !open.contains(name));
            backlog.shrink_after_burst();
            backlog.iter().take(BACKLOG_PER_PASS).cloned().collect()
        };
        for name in closed {
            match ChannelView::detached_log(&name, self.store.clone()) {
                Ok(Some(view)) => views.push(Arc::new(view)),
                Ok(None) => {
                    self.backlog.lock().remove(&name);
                }
                Err(e) => {
                    crate::throttled!(error, channel = %name, error = %e, "reading a closed channel to index failed")
                }
            }
        }
        views
    }

    /// Converts first-format postings (one key per term and message, left by an earlier
    /// version) into blocks, for up to [`CONVERT_PER_PASS`]; returns whether any were, or
    /// `None` once there are none left. Blocks are written before the old keys are deleted,
    /// so a crash in between converts those again, which changes nothing.
    fn convert_pass(&mut self) -> Option<bool> {
        if self.converted {
            return None;
        }
        let started = Instant::now();
        let mut moved = 0usize;
        while started.elapsed() < CONVERT_PER_PASS {
            let old = match self.store.scan_aux(Space::Search, b"", CONVERT_BATCH) {
                Ok(old) => old,
                Err(e) => {
                    crate::throttled!(error, error = %e, "reading first-format search postings failed; will retry");
                    return Some(moved > 0);
                }
            };
            if old.is_empty() {
                self.converted = true;
                if moved > 0 {
                    tracing::info!("search index converted to postings blocks");
                }
                return (moved > 0).then_some(true);
            }
            let postings = old.iter().filter_map(|(key, channel)| {
                let (term, id) = parse_term_key(key)?;
                Some((term.to_owned(), id, channel.clone()))
            });
            let deletes: Vec<_> = old.iter().map(|(key, _)| (key.clone(), None)).collect();
            let done = add_postings(self.store.as_ref(), postings)
                .and_then(|()| Ok(self.store.write_aux(Space::Search, &deletes).map(drop)?));
            if let Err(e) = done {
                crate::throttled!(error, error = %e, "converting search postings failed; will retry");
                return Some(moved > 0);
            }
            moved += old.len();
        }
        Some(true)
    }

    /// Adds `postings` to the index, then records how far their channels are indexed; empties
    /// both. Returns whether the index moved forward (a failure is retried next pass).
    fn write(&self, postings: &mut Vec<Posting>, progress: &mut AuxEntries) -> bool {
        if progress.is_empty() {
            return false;
        }
        let postings = std::mem::take(postings);
        let progress = std::mem::take(progress);
        // Postings first, progress second: a crash between them re-indexes, never skips.
        let done = add_postings(self.store.as_ref(), postings)
            .and_then(|()| Ok(self.store.put_aux_batch(Space::Jobs, &progress)?));
        if let Err(e) = &done {
            crate::throttled!(error, channels = progress.len(), error = %e, "indexing failed; will retry");
        }
        done.is_ok()
    }

    /// Converts what is left of the first index format, then indexes up to [`INDEX_BATCH`]
    /// new messages of every channel; returns whether anything moved forward (a failing
    /// channel is retried next pass, not spun on).
    fn index_pass(&mut self) -> bool {
        if let Some(moved) = self.convert_pass() {
            return moved;
        }
        let mut advanced = false;
        let mut behind = 0usize;
        // Postings of several channels go to the store together, so a block their ids share
        // is rewritten once per write, not once per channel.
        let mut postings = Vec::new();
        let mut progress = Vec::new();
        for view in self.sources() {
            let done = self.progress(view.name());
            if view.last_id() <= done {
                self.backlog.lock().remove(view.name());
                continue;
            }
            behind += 1;
            let Ok(Scan {
                found: batch, scanned, ..
            }) = view.read_scanned(done, INDEX_BATCH, usize::MAX)
            else {
                continue;
            };
            let channel = view.name().as_str().as_bytes();
            for p in &batch {
                postings.extend(
                    terms(&p.message.body)
                        .into_iter()
                        .map(|t| (t, p.id(), channel.to_vec())),
                );
            }
            progress.push((progress_key(view.name()), scanned.to_be_bytes().to_vec()));
            if postings.len() >= WRITE_POSTINGS {
                advanced |= self.write(&mut postings, &mut progress);
            }
        }
        advanced |= self.write(&mut postings, &mut progress);
        if behind == 0 && self.backlog.lock().is_empty() {
            self.caught_up
                .store(crate::view::now_ms(), std::sync::atomic::Ordering::Relaxed);
        }
        metrics::gauge!("crosstalk_search_channels_behind").set((behind + self.backlog.lock().len()) as f64);
        advanced
    }
}

impl Actor for Indexer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Background work: let the relay's threads have the cores first (Linux: nice is per
        // thread). Failing to lower the priority only costs speed.
        // SAFETY: setpriority has no memory-safety preconditions.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        }
        ctx.run_interval(INDEX_EVERY, |act, _| {
            if act.quiet() {
                act.index_pass();
            }
        });
    }
}

/// Index everything committed so far, then answer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CatchUp;

impl Handler<CatchUp> for Indexer {
    type Result = ();

    fn handle(&mut self, _: CatchUp, _: &mut Context<Self>) {
        // Until a pass finds nothing to do (or cannot move: then search answers with what is
        // indexed rather than hang).
        while self.index_pass() {}
    }
}

/// Runs a query: newest first, every term present (case-insensitive), filters applied.
pub fn search(
    store: &dyn EventStore,
    view_of: &dyn Fn(&ChannelName) -> Option<Arc<ChannelView>>,
    q: &Query,
) -> Result<Vec<Arc<Posted>>, RelayError> {
    let wanted = terms(&q.text);
    if wanted.is_empty() {
        return Err(RelayError::Invalid(crosstalk_schema::InvalidInput::Other(
            "query has no searchable term (terms are 2-40 letters or digits)".into(),
        )));
    }
    // Scan the postings of the rarest term; check the others on the message itself.
    let rarest = wanted
        .iter()
        .min_by_key(|t| {
            store
                .scan_aux_before(Space::Postings, &term_prefix(t), None, SELECTIVITY_PROBE)
                .map_or(0, |blocks| blocks.iter().map(|(k, v)| block_len(k, v)).sum::<usize>())
        })
        .cloned()
        .unwrap_or_default();
    let prefix = term_prefix(&rarest);
    let mut out = Vec::new();
    let mut scanned = 0usize;
    let mut before: Option<Vec<u8>> = None;
    'pages: loop {
        let page = store.scan_aux_before(Space::Postings, &prefix, before.as_deref(), SCAN_PAGE)?;
        let Some((last, _)) = page.last() else { break };
        before = Some(last.clone());
        for (key, value) in &page {
            let Some(block) = parse_term_key(key).and_then(|(_, n)| decode_block(n, value)) else {
                tracing::error!(term = rarest, "unreadable search postings block; skipped");
                continue;
            };
            for (id, channel) in block.into_iter().rev() {
                scanned += 1;
                if out.len() >= q.limit || scanned > MAX_SCAN {
                    break 'pages;
                }
                let Some(channel) = std::str::from_utf8(&channel)
                    .ok()
                    .and_then(|c| ChannelName::parse(c).ok())
                else {
                    continue;
                };
                if q.channel.as_ref().is_some_and(|c| c != &channel) {
                    continue;
                }
                let Some(view) = view_of(&channel) else { continue };
                let Some(p) = view.get(id)? else { continue };
                let m = &p.message;
                if q.sender.as_ref().is_some_and(|s| !m.sender.eq_ignore_ascii_case(s)) {
                    continue;
                }
                if q.kind.as_ref().is_some_and(|k| !kind_is(&m.kind, k)) {
                    continue;
                }
                let body_terms: HashSet<String> = terms(&m.body).into_iter().collect();
                if wanted.iter().all(|t| body_terms.contains(t)) {
                    out.push(p);
                }
            }
        }
        if page.len() < SCAN_PAGE {
            break;
        }
    }
    Ok(out)
}

/// How many postings a block holds (none when it cannot be read).
fn block_len(key: &[u8], value: &[u8]) -> usize {
    parse_term_key(key)
        .and_then(|(_, n)| decode_block(n, value))
        .map_or(0, |b| b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_keeps_its_postings_in_id_order_and_a_bad_value_is_refused() {
        let n = 7;
        let block: Block = [
            (n * BLOCK_IDS + 63, b"b".to_vec()),
            (n * BLOCK_IDS, b"a-long-channel".to_vec()),
        ]
        .into_iter()
        .collect();
        let value = encode_block(&block);
        assert_eq!(block_len(&term_key("fox", n), &value), 2);
        let back = decode_block(n, &value).unwrap();
        assert_eq!(back, block);
        assert_eq!(back.keys().copied().collect::<Vec<_>>(), [448, 511]);
        assert_eq!(decode_block(n, &[]), Some(Block::new()));
        // An offset past the block, a name cut short, a trailing byte.
        assert_eq!(decode_block(n, &[64, 1, b'a']), None);
        assert_eq!(decode_block(n, &[0, 5, b'a']), None);
        assert_eq!(decode_block(n, &[value.as_slice(), &[1]].concat()), None);
        assert_eq!(parse_term_key(&term_key("fox", 9)), Some(("fox", 9)));
        assert_eq!(parse_term_key(b"fox"), None);
        assert_eq!(
            parse_term_key(&[b"fox\x01".as_slice(), &9u64.to_be_bytes()].concat()),
            None
        );
    }

    #[test]
    fn adding_postings_merges_into_blocks_and_drops_a_name_no_block_can_hold() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::sled_store::SledStore::open(dir.path()).unwrap();
        let add = |id: u64, channel: &[u8]| add_postings(&store, [("fox".to_owned(), id, channel.to_vec())]).unwrap();
        add(130, b"a");
        add(129, b"b");
        add(130, b"a"); // Again, as after a crash: no change.
        add(131, &[b'x'; 300]);
        add(200, b"c");
        let block = |n| {
            let v = store.get_aux(Space::Postings, &term_key("fox", n)).unwrap().unwrap();
            decode_block(n, &v).unwrap()
        };
        assert_eq!(
            block(2),
            [(129, b"b".to_vec()), (130, b"a".to_vec())].into_iter().collect()
        );
        assert_eq!(block(3), [(200, b"c".to_vec())].into_iter().collect());
    }

    #[test]
    fn terms_are_lowercase_unique_and_bounded() {
        assert_eq!(
            terms("Fix the AUTH bug; auth-token x"),
            ["fix", "the", "auth", "bug", "token"]
        );
        assert_eq!(terms("Ünïcode wörds"), ["ünïcode", "wörds"]);
        assert!(terms(&"word ".repeat(500)).len() == 1);
    }
}
