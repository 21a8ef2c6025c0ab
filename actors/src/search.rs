//! Full-text search over every channel, served from an inverted index kept in the store
//! (`term\0{id}` → channel). The indexer pulls committed messages from channel views by
//! cursor on a thread of its own at the lowest CPU priority, so posting never waits for it
//! and under load it yields the cores to the relay; every search first asks it to catch up,
//! so results are always complete. A restart resumes where it stopped. Channels whose actor
//! went idle before they were indexed wait in a backlog and are read from the store.

use crate::error::RelayError;
use crate::store::{EventStore, Space};
use crate::view::{ChannelView, Posted};
use crate::ShrinkAfterBurst;
use actix::prelude::*;
use crosstalk_schema::{kind_is, ChannelName};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// How often the indexer looks for new messages.
const INDEX_EVERY: Duration = Duration::from_millis(100);
/// Messages indexed per store batch: a sled batch holds a store-wide lock while it applies,
/// so batches stay short enough (a few ms) never to stall a channel's commit for long.
const INDEX_BATCH: usize = 100;
/// The background indexer works only when no channel has committed for this long, so under
/// load the relay keeps its cores and locks; a search catches the index up on demand.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// Distinct terms indexed per message.
const MAX_TERMS: usize = 64;
/// Shortest and longest indexed term, in bytes.
const TERM_LEN: std::ops::RangeInclusive<usize> = 2..=40;
/// Postings looked at per query term when choosing the rarest one.
const SELECTIVITY_PROBE: usize = 2000;
/// Postings a query scans at most before answering with what it found.
const MAX_SCAN: usize = 200_000;
/// Closed channels one pass indexes from the store at most (each costs a few store reads).
const BACKLOG_PER_PASS: usize = 1000;

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

fn posting_key(term: &str, id: u64) -> Vec<u8> {
    let mut k = term.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(&id.to_be_bytes());
    k
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
                    tracing::error!(error = %e, "listing channels to index failed; will retry");
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
                Err(e) => tracing::error!(channel = %name, error = %e, "reading a closed channel to index failed"),
            }
        }
        views
    }

    /// Indexes up to [`INDEX_BATCH`] new messages of every channel; returns whether any
    /// channel moved forward (a failing channel is retried next pass, not spun on).
    fn index_pass(&mut self) -> bool {
        let mut advanced = false;
        let mut behind = 0usize;
        for view in self.sources() {
            let done = self.progress(view.name());
            if view.last_id() <= done {
                self.backlog.lock().remove(view.name());
                continue;
            }
            behind += 1;
            let Ok((batch, scanned)) = view.read_scanned(done, INDEX_BATCH) else {
                continue;
            };
            let channel = view.name().as_str().as_bytes().to_vec();
            let postings: Vec<(Vec<u8>, Vec<u8>)> = batch
                .iter()
                .flat_map(|p| {
                    let id = p.id();
                    terms(&p.message.body)
                        .into_iter()
                        .map(move |term| posting_key(&term, id))
                })
                .map(|k| (k, channel.clone()))
                .collect();
            if let Err(e) = self.store.put_aux_batch(Space::Search, &postings) {
                tracing::error!(channel = %view.name(), error = %e, "indexing failed; will retry");
                continue;
            }
            // Postings first, progress second: a crash between them re-indexes, never skips.
            if self
                .store
                .put_aux(Space::Jobs, &progress_key(view.name()), Some(&scanned.to_be_bytes()))
                .is_ok()
            {
                advanced = true;
            }
        }
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
                .scan_aux(
                    Space::Search,
                    &posting_key(t, 0)[..t.len() + 1],
                    true,
                    SELECTIVITY_PROBE,
                )
                .map_or(0, |v| v.len())
        })
        .cloned()
        .unwrap_or_default();
    let prefix = &posting_key(&rarest, 0)[..rarest.len() + 1];
    let mut out = Vec::new();
    for (key, channel) in store.scan_aux(Space::Search, prefix, true, MAX_SCAN)? {
        if out.len() >= q.limit {
            break;
        }
        let Ok(id_bytes) = <[u8; 8]>::try_from(&key[key.len() - 8..]) else {
            continue;
        };
        let id = u64::from_be_bytes(id_bytes);
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
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::terms;

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
