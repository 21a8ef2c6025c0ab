//! Full-text search over every channel, served from a tantivy index in the data directory
//! (`search-index/`): prefix matching, quoted phrases, `OR` and `-`, one-edit typo tolerance
//! for longer words, BM25 ranking with recency breaking ties, filters by channel, sender, type
//! and time, and a snippet with the match marked.
//!
//! The index is a cache of the log, never the record: the indexer pulls committed messages
//! from channel views by cursor on a thread of its own at the lowest CPU priority, so posting
//! never waits for it; every search first asks it to catch up, so results are complete. Each
//! commit stores, in the index itself, how far every channel is indexed (the commit's
//! payload), so after a crash the indexer resumes from what the index holds and adds the rest
//! again. An index that is missing, of another schema or damaged is rebuilt from the log.
//! Messages removed by retention are deleted from the index, and a hit whose message is gone
//! is never answered. Channels whose actor went idle before they were indexed wait in a
//! backlog and are read from the store.

use crate::error::RelayError;
use crate::store::{EventStore, Space};
use crate::view::{ChannelView, Posted, Scan};
use crate::ShrinkAfterBurst;
use actix::prelude::*;
use crosstalk_schema::{ChannelName, InvalidInput, Timestamp};
use levenshtein_automata::{Distance, LevenshteinAutomatonBuilder, DFA};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::{HashMap, HashSet};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tantivy::collector::{Collector, SegmentCollector};
use tantivy::directory::MmapDirectory;
use tantivy::fieldnorm::FieldNormReader;
use tantivy::postings::BlockSegmentPostings;
use tantivy::query::{
    intersect_scorers, AllQuery, Bm25Weight, BooleanQuery, BoostQuery, EnableScoring, Explanation, Occur, PhraseQuery,
    Query as TQuery, RangeQuery, Scorer, TermQuery, TermSetQuery, Weight,
};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, FAST, INDEXED, STORED, STRING,
};
use tantivy::tokenizer::TextAnalyzer;
use tantivy::{
    DocAddress, DocId, DocSet, Index, IndexReader, IndexWriter, ReloadPolicy, Score, Searcher, SegmentReader,
    TantivyDocument, Term, TERMINATED,
};

/// How often the indexer looks for new messages.
const INDEX_EVERY: Duration = Duration::from_millis(100);
/// Messages of one channel indexed per pass.
const INDEX_BATCH: usize = 1000;
/// The background indexer works when no channel has committed for this long, so under load
/// the relay keeps its cores; a search catches the index up on demand.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// ... or, [`BUSY_BATCH`] messages a pass, once the index has lagged the log this long: a
/// relay that is never quiet for [`QUIET_FOR`] (agents posting more often than that, all day)
/// would otherwise leave the whole day to its first search, which waits at most 30 s for it.
const LAG_AT_MOST: Duration = Duration::from_secs(2);
/// Messages indexed a pass while channels are busy (1,000 a second): enough to keep up with a
/// steady stream of agents' posts, and a bound on what indexing takes from a relay under load
/// (indexing costs about as much CPU as a post; unbounded, at the lowest priority even, it
/// doubled the post p99 of a saturated relay in an A/B: docs/benchmarks.md).
const BUSY_BATCH: usize = 100;
/// While channels are busy the index commits at most this often: a commit writes and syncs a
/// segment (and the merges it sets off), on the disk the relay flushes its posts to. Until then
/// a search finds what is indexed but not committed by committing it first (its catch-up).
const BUSY_COMMIT_EVERY: Duration = Duration::from_secs(60);
/// Closed channels one pass indexes from the store at most.
const BACKLOG_PER_PASS: usize = 1000;
/// The background indexer commits at most this often (a search commits at once).
const COMMIT_EVERY: Duration = Duration::from_secs(1);
/// The index writer's memory budget.
const WRITER_HEAP: usize = 32 * 1024 * 1024;
/// Words shorter than this match exactly or as a prefix; longer ones also within one edit.
const FUZZY_FROM: usize = 5;
/// A prefix's or a typo's terms scored one by one, the commonest first; the rest of them
/// match at a low constant score.
const SCORED_EXPANSIONS: usize = 64;
/// A word one edit away is searched too when it is in this many times more messages than the
/// word as typed (a typo is rare; the word it misspells is not).
const TYPO_COMMONER: u64 = 10;
/// How a word one edit away scores against the word itself (2) and its completions (1).
const TYPO_BOOST: Score = 0.5;
/// A query's words, phrases and clauses at most.
const MAX_CLAUSES: usize = 32;
/// Snippet length, in characters.
const SNIPPET_CHARS: usize = 160;
/// First-format keys removed per quiet pass (earlier versions' own index, now unused).
const CLEANUP_BATCH: usize = 2000;

/// Channels that are not open and may have messages the index lacks.
pub(crate) type Backlog = Arc<Mutex<HashSet<ChannelName>>>;

/// When the index last had every committed message ([`crate::view::now_ms`]).
pub(crate) type CaughtUp = Arc<std::sync::atomic::AtomicU64>;

/// What to search for.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Words (a prefix matches: `migrat` finds migration), `"quoted phrases"`, `OR` between
    /// two, `-word` to exclude; every other word must match.
    pub text: String,
    pub channel: Option<ChannelName>,
    pub sender: Option<String>,
    pub kind: Option<String>,
    /// Posted at or after, and before (microseconds since the epoch).
    pub since: Option<i64>,
    pub until: Option<i64>,
    pub limit: usize,
}

/// One result: the message, its score (BM25; higher is better) and its best passage with the
/// matched words marked `**like this**`.
#[derive(Debug, Clone)]
pub struct Hit {
    pub message: Arc<Posted>,
    pub score: f32,
    pub snippet: String,
}

#[derive(Clone, Copy)]
struct Fields {
    id: Field,
    channel: Field,
    sender: Field,
    kind: Field,
    body: Field,
    pairs: Field,
    created: Field,
}

fn schema() -> (Schema, Fields) {
    let mut b = Schema::builder();
    let body = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer("default")
            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
    );
    let fields = Fields {
        id: b.add_u64_field("id", INDEXED | FAST | STORED),
        channel: b.add_text_field("channel", STRING | STORED),
        sender: b.add_text_field("sender", STRING),
        kind: b.add_text_field("type", STRING),
        body: b.add_text_field("body", body),
        // Each pair of adjacent words of the body as one term: a two-word phrase is one
        // term's postings, not an intersection of two common words checked by position.
        pairs: b.add_text_field(
            "pairs",
            TextOptions::default().set_indexing_options(
                TextFieldIndexing::default()
                    .set_tokenizer("raw")
                    .set_index_option(IndexRecordOption::WithFreqs),
            ),
        ),
        created: b.add_i64_field("created", INDEXED | FAST),
    };
    (b.build(), fields)
}

/// How far the index holds each channel, stored as the payload of every commit.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Progress {
    /// The last id indexed, by channel.
    indexed: HashMap<String, u64>,
    /// Ids at or below this were removed by retention and deleted from the index, by channel.
    deleted: HashMap<String, u64>,
}

/// The index, shared by the indexer (which writes) and searches (which read).
#[derive(Clone)]
pub struct SearchIndex {
    index: Index,
    reader: IndexReader,
    fields: Fields,
}

impl SearchIndex {
    /// Opens the index in `dir`, or in memory without one. An index that cannot be opened
    /// (missing, of another schema, damaged) is moved aside and built again from the log.
    pub fn open(dir: Option<&Path>) -> Result<SearchIndex, RelayError> {
        let (schema, fields) = schema();
        let index = match dir {
            None => Index::create_in_ram(schema),
            Some(dir) => match open_dir(dir, &schema) {
                Ok(index) => index,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "the search index cannot be opened; rebuilding it from the log");
                    let _ = std::fs::remove_dir_all(dir);
                    open_dir(dir, &schema).map_err(|e| unavailable("create the search index", e))?
                }
            },
        };
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|e| unavailable("open the search index", e))?;
        Ok(SearchIndex { index, reader, fields })
    }

    fn progress(&self) -> Progress {
        self.index
            .load_metas()
            .ok()
            .and_then(|m| m.payload)
            .and_then(|p| serde_json::from_str(&p).ok())
            .unwrap_or_default()
    }
}

fn open_dir(dir: &Path, schema: &Schema) -> tantivy::Result<Index> {
    std::fs::create_dir_all(dir)?;
    let index = Index::open_or_create(MmapDirectory::open(dir)?, schema.clone())?;
    // Reading every segment's files now finds a damaged index before a search does. A reader
    // of the default policy would start tantivy's meta-file watcher, a thread that reads
    // meta.json twice a second for as long as the index is open; the relay's readers reload
    // when it commits ([`ReloadPolicy::Manual`]).
    let reader: IndexReader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
    for segment in reader.searcher().segment_readers() {
        segment.get_store_reader(0)?;
    }
    Ok(index)
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> RelayError {
    tracing::error!(error = %e, "cannot {what}");
    RelayError::Unavailable("the search index failed")
}

/// Keeps the index up to date. Channels come from `views`, a function that lists the views
/// of every open channel, so the indexer needs no knowledge of the registry.
pub struct Indexer {
    store: Arc<dyn EventStore>,
    views: Arc<dyn Fn() -> Vec<Arc<ChannelView>> + Send + Sync>,
    index: SearchIndex,
    writer: Option<IndexWriter>,
    progress: Progress,
    /// Documents added or deleted since the last commit.
    dirty: bool,
    last_commit: Instant,
    /// Closed channels still to index, read through detached views.
    backlog: Backlog,
    /// Whether the stored channels have been checked for a backlog since the start.
    surveyed: bool,
    /// Whether the earlier versions' index keys are all removed.
    cleaned: bool,
    caught_up: CaughtUp,
    /// Where the next busy pass starts in the list of open channels.
    busy_from: usize,
    /// The sum of channel watermarks at the last look, and when it last changed.
    activity: (u64, Instant),
}

impl Indexer {
    pub(crate) fn new(
        store: Arc<dyn EventStore>,
        views: Arc<dyn Fn() -> Vec<Arc<ChannelView>> + Send + Sync>,
        index: SearchIndex,
        backlog: Backlog,
        caught_up: CaughtUp,
    ) -> Self {
        // Before the writer starts tantivy's threads, which take this thread's priority: they
        // index (`add_document` hands them the document), merge segments and compress the
        // stored documents. Lowered only in `started`, the merging ones ran at the relay's
        // priority, and the indexing one until a commit started it anew from here.
        lower_priority();
        let writer = index
            .index
            .writer_with_num_threads(1, WRITER_HEAP)
            .inspect_err(|e| tracing::error!(error = %e, "cannot write the search index; search answers what it holds"))
            .ok();
        Indexer {
            store,
            views,
            progress: index.progress(),
            index,
            writer,
            dirty: false,
            last_commit: Instant::now(),
            backlog,
            surveyed: false,
            cleaned: false,
            caught_up,
            busy_from: 0,
            activity: (0, Instant::now()),
        }
    }

    /// Whether the index has not held every committed message for [`LAG_AT_MOST`].
    fn lagging(&self) -> bool {
        let at = self.caught_up.load(std::sync::atomic::Ordering::Relaxed);
        crate::view::now_ms().saturating_sub(at) >= LAG_AT_MOST.as_millis() as u64
    }

    /// Whether no channel has committed anything for [`QUIET_FOR`].
    fn quiet(&mut self) -> bool {
        let sum = (self.views)().iter().map(|v| v.last_id()).fold(0u64, u64::wrapping_add);
        if sum != self.activity.0 {
            self.activity = (sum, Instant::now());
        }
        self.activity.1.elapsed() >= QUIET_FOR
    }

    fn indexed(&self, channel: &ChannelName) -> u64 {
        self.progress.indexed.get(channel.as_str()).copied().unwrap_or(0)
    }

    /// The views to index: every open channel, and up to `closed` closed ones read from the
    /// store. The first call also finds what the index lacks of the log.
    fn sources(&mut self, closed: usize) -> Vec<Arc<ChannelView>> {
        if !self.surveyed {
            self.surveyed = true;
            match self.store.channels() {
                Ok(stored) => {
                    let behind: Vec<ChannelName> = stored
                        .into_iter()
                        .filter(|(name, meta)| meta.last_id > self.indexed(name))
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
        if closed == 0 {
            return views;
        }
        let open: HashSet<ChannelName> = views.iter().map(|v| v.name().clone()).collect();
        let closed: Vec<ChannelName> = {
            let mut backlog = self.backlog.lock();
            // An open channel is indexed through its own view.
            backlog.retain(|name| !open.contains(name));
            backlog.shrink_after_burst();
            backlog.iter().take(closed).cloned().collect()
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

    /// Indexes what the views hold beyond the index, as much as `pass` allows (and at most
    /// [`INDEX_BATCH`] of a channel), deletes what retention removed, and commits when `now` or
    /// the pass's interval has passed since the last commit; returns whether anything moved.
    fn index_pass(&mut self, now: bool, pass: Pass) -> bool {
        let (busy, mut budget, commit_every) = match pass {
            Pass::Full => (false, usize::MAX, COMMIT_EVERY),
            Pass::Busy => (true, BUSY_BATCH, BUSY_COMMIT_EVERY),
        };
        if self.writer.is_none() {
            // It could not be opened (or reopened after a failed commit): try again.
            self.writer = self.index.index.writer_with_num_threads(1, WRITER_HEAP).ok();
            if self.writer.is_none() {
                return false;
            }
            self.progress = self.index.progress();
            self.surveyed = false;
        }
        let f = self.index.fields;
        let mut advanced = false;
        let mut behind = 0usize;
        // While busy, only open channels, whose views are in memory: opening closed ones from
        // the store, up to a thousand a pass, cost a relay that had just touched 100,000
        // channels its live channel's post p99 (BENCHMARKS.md row 10: 1.77 -> 5.11 ms).
        let mut sources = self.sources(if busy { 0 } else { BACKLOG_PER_PASS });
        if busy && !sources.is_empty() {
            // From where the last busy pass stopped (the directory's order, which holds while
            // no channel opens or closes): the budget runs out before the end of a long list,
            // and every channel gets its turn.
            let from = self.busy_from % sources.len();
            sources.rotate_left(from);
        }
        let mut analyzer = self.index.index.tokenizer_for_field(f.body).ok();
        let Some(writer) = self.writer.as_mut() else {
            return false;
        };
        let listed = sources.len();
        for (visited, view) in sources.into_iter().enumerate() {
            if busy && budget == 0 {
                // The rest wait for the next pass; this one is not caught up.
                self.busy_from = self.busy_from.wrapping_add(visited);
                behind += listed - visited;
                break;
            }
            let name = view.name().as_str().to_owned();
            let removed = view.compacted_upto();
            if removed > self.progress.deleted.get(&name).copied().unwrap_or(0) {
                let gone = BooleanQuery::new(vec![
                    (
                        Occur::Must,
                        Box::new(TermQuery::new(
                            Term::from_field_text(f.channel, &name),
                            IndexRecordOption::Basic,
                        )) as Box<dyn TQuery>,
                    ),
                    (
                        Occur::Must,
                        Box::new(RangeQuery::new(
                            Bound::Unbounded,
                            Bound::Included(Term::from_field_u64(f.id, removed)),
                        )),
                    ),
                ]);
                if writer.delete_query(Box::new(gone)).is_ok() {
                    self.progress.deleted.insert(name.clone(), removed);
                    self.dirty = true;
                }
            }
            let done = self.progress.indexed.get(&name).copied().unwrap_or(0);
            let last = view.last_id();
            if last <= done {
                self.backlog.lock().remove(view.name());
                continue;
            }
            let Ok(Scan {
                found: batch, scanned, ..
            }) = view.read_scanned(done, INDEX_BATCH.min(budget), usize::MAX)
            else {
                behind += 1;
                continue;
            };
            budget = budget.saturating_sub(batch.len());
            // Still behind after this pass: more than one batch was waiting.
            if scanned < last {
                behind += 1;
            }
            for p in &batch {
                let m = &p.message;
                let words = match analyzer.as_mut() {
                    Some(analyzer) => analyze(analyzer, &m.body),
                    None => Vec::new(),
                };
                let mut d = TantivyDocument::new();
                d.add_u64(f.id, p.id());
                d.add_text(f.channel, name.as_str());
                d.add_text(f.sender, m.sender.to_lowercase());
                d.add_text(f.kind, m.kind.as_str().to_lowercase());
                d.add_text(f.body, m.body.as_str());
                // Split again here by tantivy's own indexing: handing it our tokens instead
                // (a pre-tokenized body) indexed slower (docs/benchmarks.md, "Measurements
                // behind design choices").
                for w in words.windows(2) {
                    d.add_text(f.pairs, format!("{} {}", w[0], w[1]));
                }
                d.add_i64(f.created, Timestamp::parse_rfc3339(&m.created_at).map_or(0, |t| t.0));
                let added = writer.add_document(d);
                if let Err(e) = added {
                    crate::throttled!(error, error = %e, "adding a message to the search index failed");
                }
            }
            self.progress.indexed.insert(name, scanned);
            self.dirty = true;
            advanced = true;
        }
        if self.dirty && (now || self.last_commit.elapsed() >= commit_every) {
            self.commit();
        }
        // Everything indexed, committed or not (a search commits first, in a moment).
        if behind == 0 && self.backlog.lock().is_empty() {
            self.caught_up
                .store(crate::view::now_ms(), std::sync::atomic::Ordering::Relaxed);
        }
        metrics::gauge!("crosstalk_search_channels_behind").set((behind + self.backlog.lock().len()) as f64);
        advanced
    }

    /// Commits what was added with how far it goes, and lets searches see it.
    fn commit(&mut self) {
        let Some(writer) = self.writer.as_mut() else { return };
        let payload = serde_json::to_string(&self.progress).unwrap_or_default();
        let committed = writer.prepare_commit().and_then(|mut c| {
            c.set_payload(&payload);
            c.commit()
        });
        match committed {
            Ok(_) => {
                self.dirty = false;
                self.last_commit = Instant::now();
                if let Err(e) = self.index.reader.reload() {
                    crate::throttled!(error, error = %e, "reloading the search index failed");
                }
            }
            Err(e) => {
                // A full disk, say. The writer may not be usable after a failed commit: start a
                // new one from what the index last committed, and add the rest again.
                crate::throttled!(error, error = %e, "committing the search index failed; will retry from its last commit");
                self.writer = None;
                self.writer = self
                    .index
                    .index
                    .writer_with_num_threads(1, WRITER_HEAP)
                    .inspect_err(|e| crate::throttled!(error, error = %e, "reopening the search index writer failed"))
                    .ok();
                self.progress = self.index.progress();
                self.dirty = false;
                self.surveyed = false;
            }
        }
    }

    /// Removes a batch of the keys earlier versions kept their own index under.
    fn cleanup_pass(&mut self) {
        if self.cleaned {
            return;
        }
        let mut any = false;
        for space in [Space::Postings, Space::Search] {
            match self.store.scan_aux(space, b"", CLEANUP_BATCH) {
                Ok(keys) if !keys.is_empty() => {
                    any = true;
                    let deletes: Vec<(Vec<u8>, Option<Vec<u8>>)> = keys.into_iter().map(|(k, _)| (k, None)).collect();
                    if let Err(e) = self.store.write_aux(space, &deletes) {
                        crate::throttled!(error, error = %e, "removing the earlier search index failed; will retry");
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    crate::throttled!(error, error = %e, "reading the earlier search index failed; will retry");
                    return;
                }
            }
        }
        self.cleaned = !any;
    }
}

impl Actor for Indexer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // `new` lowered this thread's priority already when it ran here; an indexer made on
        // another thread is lowered now (its writer's threads keep the priority they had).
        lower_priority();
        ctx.run_interval(INDEX_EVERY, |act, _| {
            // A batch of an earlier version's keys each tick, whatever the load: small
            // deletes, on this low-priority thread.
            act.cleanup_pass();
            if act.quiet() {
                act.index_pass(false, Pass::Full);
            } else if act.lagging() {
                act.index_pass(false, Pass::Busy);
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if self.dirty {
            self.commit();
        }
    }
}

/// How much one pass of the indexer does.
#[derive(Clone, Copy)]
enum Pass {
    /// Everything behind, open channels and closed ones, committing every [`COMMIT_EVERY`].
    Full,
    /// While channels are busy: [`BUSY_BATCH`] messages of open channels, committing every
    /// [`BUSY_COMMIT_EVERY`].
    Busy,
}

/// Background work: the relay's own threads have the cores first. Linux's nice is per thread,
/// and a thread started later inherits it. Failing to lower it only costs speed.
fn lower_priority() {
    // SAFETY: setpriority has no memory-safety preconditions.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
    }
}

/// Index everything committed so far and commit it, then answer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CatchUp;

impl Handler<CatchUp> for Indexer {
    type Result = ();

    fn handle(&mut self, _: CatchUp, _: &mut Context<Self>) {
        // Until a pass finds nothing to do (or cannot move: then search answers with what is
        // indexed rather than hang).
        while self.index_pass(true, Pass::Full) {}
        if self.dirty {
            self.commit();
        }
    }
}

/// The body field's tokens of `text` (lowercased words of letters and digits).
fn analyze(analyzer: &mut TextAnalyzer, text: &str) -> Vec<String> {
    let mut stream = analyzer.token_stream(text);
    let mut out = Vec::new();
    while stream.advance() {
        out.push(stream.token().text.clone());
    }
    out
}

/// A query's parts, as typed.
#[derive(Debug, PartialEq)]
enum Part {
    Word(String),
    Phrase(String),
}

/// Groups of alternatives (`a OR b`), each required unless negated (`-a`).
fn parse(text: &str) -> Vec<(bool, Vec<Part>)> {
    let mut groups: Vec<(bool, Vec<Part>)> = Vec::new();
    let mut or_next = false;
    let mut rest = text.trim();
    while !rest.is_empty() {
        let negated = rest.starts_with('-');
        if negated {
            rest = &rest[1..];
        }
        let part = if let Some(after) = rest.strip_prefix('"') {
            let end = after.find('"').unwrap_or(after.len());
            let phrase = after[..end].to_owned();
            rest = after.get(end + 1..).unwrap_or("");
            Part::Phrase(phrase)
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            let word = rest[..end].to_owned();
            rest = &rest[end..];
            if word == "OR" && !negated {
                or_next = !groups.is_empty();
                rest = rest.trim_start();
                continue;
            }
            if word == "AND" && !negated {
                rest = rest.trim_start();
                continue;
            }
            Part::Word(word)
        };
        rest = rest.trim_start();
        match groups.last_mut() {
            Some((false, alternatives)) if or_next && !negated => alternatives.push(part),
            _ => groups.push((negated, vec![part])),
        }
        or_next = false;
    }
    groups
}

impl SearchIndex {
    fn tokens(&self, text: &str) -> Vec<String> {
        let Ok(mut analyzer) = self.index.tokenizer_for_field(self.fields.body) else {
            return Vec::new();
        };
        analyze(&mut analyzer, text)
    }

    /// A word's terms in the index and how each scores: the word itself highest, its
    /// completions (a prefix matches), and for longer words those within one edit (a
    /// transposition counts as one) lowest. Each is a term query of its own, so a search
    /// of single words is a union of terms that block-max WAND can prune; past
    /// [`SCORED_EXPANSIONS`] (the commonest), the rest match at a low constant score.
    fn word(&self, searcher: &Searcher, word: &str, marks: &mut HashSet<String>) -> Vec<Alt> {
        let body = self.fields.body;
        // term → (documents with it, boost)
        let mut found: HashMap<Vec<u8>, (u64, Score)> = HashMap::new();
        let mut note = |key: &[u8], docs: u64, boost: Score| {
            let e = found.entry(key.to_vec()).or_insert((0, boost));
            e.0 += docs;
            e.1 = e.1.max(boost);
        };
        let fuzzy = (word.chars().count() >= FUZZY_FROM).then(|| {
            static BUILDER: std::sync::OnceLock<LevenshteinAutomatonBuilder> = std::sync::OnceLock::new();
            BUILDER
                .get_or_init(|| LevenshteinAutomatonBuilder::new(1, true))
                .build_dfa(word)
        });
        for segment in searcher.segment_readers() {
            let Ok(inverted) = segment.inverted_index(body) else {
                continue;
            };
            let terms = inverted.terms();
            if let Ok(mut stream) = terms.range().ge(word.as_bytes()).into_stream() {
                while stream.advance() && stream.key().starts_with(word.as_bytes()) {
                    let boost = if stream.key() == word.as_bytes() { 2.0 } else { 1.0 };
                    note(stream.key(), u64::from(stream.value().doc_freq), boost);
                }
            }
            if let Some(dfa) = &fuzzy {
                if let Ok(mut stream) = terms.search(OneEdit(dfa)).into_stream() {
                    while stream.advance() {
                        if stream.key().starts_with(word.as_bytes()) {
                            continue; // a completion, noted above
                        }
                        note(stream.key(), u64::from(stream.value().doc_freq), TYPO_BOOST);
                    }
                }
            }
        }
        let mut found: Vec<(Vec<u8>, (u64, Score))> = found.into_iter().collect();
        // A neighbour is what the word is likely a typo of only when it is far more common:
        // a word many messages use is meant as typed.
        let itself = found
            .iter()
            .find(|(key, _)| key == word.as_bytes())
            .map_or(0, |(_, (docs, _))| *docs);
        found.retain(|(_, (docs, boost))| *boost > TYPO_BOOST || *docs > itself.saturating_mul(TYPO_COMMONER));
        // The word itself first, then the commonest.
        found.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1).then(b.1 .0.cmp(&a.1 .0)).then(a.0.cmp(&b.0)));
        let term = |key: &[u8]| std::str::from_utf8(key).ok().map(|t| Term::from_field_text(body, t));
        marks.extend(found.iter().filter_map(|(key, _)| String::from_utf8(key.clone()).ok()));
        if found.is_empty() {
            // Nothing matches it: the word itself, which finds nothing (and ANDed, nothing).
            return vec![Alt::Term(Term::from_field_text(body, word))];
        }
        if found.len() == 1 {
            // Alone, a bare term query: tantivy prunes it block by block only unwrapped.
            return term(&found[0].0).map(Alt::Term).into_iter().collect();
        }
        let mut out: Vec<Alt> = found
            .iter()
            .take(SCORED_EXPANSIONS)
            .filter_map(|(key, (_, boost))| {
                let q = TermQuery::new(term(key)?, IndexRecordOption::WithFreqs);
                Some(Alt::Query(Box::new(BoostQuery::new(Box::new(q), *boost))))
            })
            .collect();
        if found.len() > SCORED_EXPANSIONS {
            let rest = TermSetQuery::new(found[SCORED_EXPANSIONS..].iter().filter_map(|(key, _)| term(key)));
            out.push(Alt::Query(Box::new(BoostQuery::new(Box::new(rest), 0.1))));
        }
        out
    }

    /// The alternatives one part matches by: a word's terms (see [`Self::word`]); a phrase's
    /// words in order. A two-word phrase is one term of the pair index; a longer one needs
    /// each of its pairs (which narrows it fast) and its words in order.
    fn part(&self, searcher: &Searcher, part: &Part, marks: &mut HashSet<String>) -> Vec<Alt> {
        let words = match part {
            Part::Word(w) | Part::Phrase(w) => self.tokens(w),
        };
        if let Part::Phrase(_) = part {
            marks.extend(words.iter().cloned());
        }
        let pair = |w: &[String]| Term::from_field_text(self.fields.pairs, &format!("{} {}", w[0], w[1]));
        match (part, words.as_slice()) {
            (_, []) => Vec::new(),
            (Part::Word(_), [one]) => self.word(searcher, one, marks),
            (Part::Word(_), many) => many.iter().flat_map(|w| self.word(searcher, w, marks)).collect(),
            (Part::Phrase(_), [one]) => vec![Alt::Term(Term::from_field_text(self.fields.body, one))],
            (Part::Phrase(_), [_, _]) => vec![Alt::Term(pair(&words))],
            (Part::Phrase(_), many) => {
                let mut all: Vec<(Occur, Box<dyn TQuery>)> = many
                    .windows(2)
                    .map(|w| (Occur::Must, Alt::Term(pair(w)).query()))
                    .collect();
                all.push((
                    Occur::Must,
                    Box::new(PhraseQuery::new(
                        many.iter()
                            .map(|w| Term::from_field_text(self.fields.body, w))
                            .collect(),
                    )),
                ));
                vec![Alt::Query(Box::new(BooleanQuery::new(all)))]
            }
        }
    }
}

/// One way a part of a query matches: one term (scored by BM25), or a query of several.
enum Alt {
    Term(Term),
    Query(Box<dyn TQuery>),
}

impl Alt {
    fn query(self) -> Box<dyn TQuery> {
        match self {
            Alt::Term(t) => Box::new(TermQuery::new(t, IndexRecordOption::WithFreqs)),
            Alt::Query(q) => q,
        }
    }
}

/// A one-edit Levenshtein automaton, walked over a term dictionary.
struct OneEdit<'a>(&'a DFA);

impl tantivy_fst::Automaton for OneEdit<'_> {
    type State = u32;

    fn start(&self) -> u32 {
        self.0.initial_state()
    }

    fn is_match(&self, state: &u32) -> bool {
        matches!(self.0.distance(*state), Distance::Exact(_))
    }

    fn can_match(&self, state: &u32) -> bool {
        *state != levenshtein_automata::SINK_STATE
    }

    fn accept(&self, state: &u32, byte: u8) -> u32 {
        self.0.transition(*state, byte)
    }
}

/// Runs a query: the best matches first (BM25; the newest first among equals), filters
/// applied, messages removed by retention left out.
pub fn search(
    index: &SearchIndex,
    view_of: &dyn Fn(&ChannelName) -> Option<Arc<ChannelView>>,
    q: &Query,
) -> Result<Vec<Hit>, RelayError> {
    let f = index.fields;
    let groups = parse(&q.text);
    if groups.len() > MAX_CLAUSES || groups.iter().map(|g| g.1.len()).sum::<usize>() > MAX_CLAUSES {
        return Err(RelayError::Invalid(InvalidInput::Other(format!(
            "the query has more than {MAX_CLAUSES} words and phrases"
        ))));
    }
    let searcher = index.reader.searcher();
    let mut clauses: Vec<(Occur, Box<dyn TQuery>)> = Vec::new();
    let mut positive = false;
    // Required single terms, while every group so far is one.
    let mut all_terms: Option<Vec<Term>> = Some(Vec::new());
    // What the snippet marks: the terms that matched (not excluded ones, not the filters).
    let mut marks = HashSet::new();
    for (negated, parts) in &groups {
        let mut excluded = HashSet::new();
        let into = if *negated { &mut excluded } else { &mut marks };
        let mut alternatives: Vec<Alt> = parts.iter().flat_map(|p| index.part(&searcher, p, into)).collect();
        if alternatives.is_empty() {
            continue;
        }
        positive |= !negated;
        let group: Box<dyn TQuery> = match (alternatives.len(), alternatives.pop()) {
            (1, Some(Alt::Term(t))) => {
                if let (false, Some(terms)) = (negated, all_terms.as_mut()) {
                    terms.push(t.clone());
                } else {
                    all_terms = None;
                }
                Alt::Term(t).query()
            }
            (1, Some(one)) => {
                all_terms = None;
                one.query()
            }
            (_, last) => {
                all_terms = None;
                Box::new(BooleanQuery::new(
                    alternatives
                        .into_iter()
                        .chain(last)
                        .map(|a| (Occur::Should, a.query()))
                        .collect(),
                ))
            }
        };
        clauses.push((if *negated { Occur::MustNot } else { Occur::Must }, group));
    }
    if !positive {
        return Err(RelayError::Invalid(InvalidInput::Other(
            "the query has no searchable word (words are letters and digits)".into(),
        )));
    }
    let exact = |field: Field, value: &str| -> (Occur, Box<dyn TQuery>) {
        (
            Occur::Must,
            Box::new(TermQuery::new(
                Term::from_field_text(field, value),
                IndexRecordOption::Basic,
            )),
        )
    };
    if let Some(c) = &q.channel {
        clauses.push(exact(f.channel, c.as_str()));
    }
    if let Some(s) = &q.sender {
        clauses.push(exact(f.sender, &s.to_lowercase()));
    }
    if let Some(k) = &q.kind {
        clauses.push(exact(f.kind, &k.to_lowercase()));
    }
    if q.since.is_some() || q.until.is_some() {
        let lower = q.since.map_or(Bound::Unbounded, |t| {
            Bound::Included(Term::from_field_i64(f.created, t))
        });
        let upper = q.until.map_or(Bound::Unbounded, |t| {
            Bound::Excluded(Term::from_field_i64(f.created, t))
        });
        clauses.push((Occur::Must, Box::new(RangeQuery::new(lower, upper))));
    }
    if clauses.iter().all(|(o, _)| *o == Occur::MustNot) {
        clauses.push((Occur::Must, Box::new(AllQuery)));
    }
    // One group alone is searched as itself: a term or a union of terms is then pruned block
    // by block; so is a conjunction of single terms.
    let query: Box<dyn TQuery> = if let Some(terms) = all_terms.filter(|t| t.len() > 1 && t.len() == clauses.len()) {
        Box::new(AllOf(terms))
    } else if clauses.len() == 1 && clauses[0].0 == Occur::Must {
        clauses.pop().map(|(_, q)| q).unwrap_or_else(|| Box::new(AllQuery))
    } else {
        Box::new(BooleanQuery::new(clauses))
    };
    // A few more than asked: a hit whose message retention removed is left out.
    let want = q.limit.saturating_add(q.limit / 4 + 8);
    let top = ranked(&searcher, &*query, want).map_err(|e| unavailable("search the index", e))?;
    let mut out = Vec::with_capacity(q.limit.min(top.len()));
    for (score, address) in top {
        if out.len() >= q.limit {
            break;
        }
        let Ok(stored) = searcher.doc::<TantivyDocument>(address) else {
            continue;
        };
        let Some(channel) = stored
            .get_first(f.channel)
            .and_then(|v| v.as_str())
            .and_then(|c| ChannelName::parse(c).ok())
        else {
            continue;
        };
        let Some(id) = stored.get_first(f.id).and_then(|v| v.as_u64()) else {
            continue;
        };
        let Some(view) = view_of(&channel) else { continue };
        let Some(message) = view.get(id)? else { continue };
        let snippet = snippet(&message.message.body, &marks);
        out.push(Hit {
            message,
            score,
            snippet,
        });
    }
    Ok(out)
}

/// Runs `query` over the segments newest first, so that the best held soon include the
/// newest of the top scores and equal scores in older segments can be passed over.
fn ranked(searcher: &Searcher, query: &dyn TQuery, want: usize) -> tantivy::Result<Vec<(Score, DocAddress)>> {
    let weight = query.weight(EnableScoring::enabled_from_searcher(searcher))?;
    let collector = Ranked::new(want);
    let segments = searcher.segment_readers();
    let mut order: Vec<(i64, usize)> = segments
        .iter()
        .enumerate()
        .map(|(i, r)| (r.fast_fields().i64("created").map_or(i64::MAX, |c| c.max_value()), i))
        .collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    let mut fruits = Vec::new();
    for (_, i) in order {
        fruits.push(collector.collect_segment(&*weight, i as u32, &segments[i])?);
    }
    collector.merge_fruits(fruits)
}

/// The best `limit` documents by score, the newest first among equal scores. Unlike
/// tantivy's `TopDocs` with a tweaked score it lets the query prune: it asks only for
/// documents scoring at least the worst it holds (an equal one may be newer), so blocks of
/// postings that cannot reach that are skipped, and what it holds carries from one segment
/// to the next.
struct Ranked {
    limit: usize,
    best: Mutex<Best>,
}

impl Ranked {
    fn new(limit: usize) -> Self {
        Ranked {
            limit: limit.max(1),
            best: Mutex::new(Best::default()),
        }
    }
}

/// A hit as ranked: score, then posting time (microseconds), then the earlier address.
#[derive(PartialEq)]
struct Entry(Score, i64, DocAddress);

impl Eq for Entry {}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0
            .total_cmp(&other.0)
            .then(self.1.cmp(&other.1))
            .then(other.2.cmp(&self.2))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The best so far, worst on top.
#[derive(Default)]
struct Best(BinaryHeap<Reverse<Entry>>);

impl Best {
    /// Offers a hit; answers the score a document must pass to be offered next.
    fn offer(&mut self, limit: usize, entry: Entry) -> Score {
        if self.0.len() < limit {
            self.0.push(Reverse(entry));
        } else if self.0.peek().is_some_and(|Reverse(worst)| entry > *worst) {
            self.0.pop();
            self.0.push(Reverse(entry));
        }
        self.bar(limit, i64::MAX)
    }

    /// The score a document must pass to be held, when none is newer than `newest`: an
    /// equal score still passes if it could be newer than the worst held.
    fn bar(&self, limit: usize, newest: i64) -> Score {
        match self.0.peek() {
            Some(Reverse(worst)) if self.0.len() >= limit && worst.1 >= newest => worst.0,
            Some(Reverse(worst)) if self.0.len() >= limit => just_below(worst.0),
            _ => Score::MIN,
        }
    }
}

/// The largest score below `s`: a document scoring `s` is still offered.
fn just_below(s: Score) -> Score {
    if s > 0.0 {
        Score::from_bits(s.to_bits() - 1)
    } else if s == 0.0 {
        -Score::MIN_POSITIVE
    } else {
        Score::from_bits(s.to_bits() + 1)
    }
}

/// One segment's hits, for a query that cannot prune (tantivy's generic path).
struct RankedSegment {
    limit: usize,
    segment: u32,
    created: Option<tantivy::columnar::Column<i64>>,
    best: Best,
}

fn created(column: Option<&tantivy::columnar::Column<i64>>, doc: DocId) -> i64 {
    column.and_then(|c| c.first(doc)).unwrap_or(0)
}

impl SegmentCollector for RankedSegment {
    type Fruit = Vec<Entry>;

    fn collect(&mut self, doc: DocId, score: Score) {
        let entry = Entry(
            score,
            created(self.created.as_ref(), doc),
            DocAddress::new(self.segment, doc),
        );
        self.best.offer(self.limit, entry);
    }

    fn harvest(self) -> Vec<Entry> {
        self.best.0.into_iter().map(|Reverse(e)| e).collect()
    }
}

impl Collector for Ranked {
    type Fruit = Vec<(Score, DocAddress)>;
    type Child = RankedSegment;

    fn for_segment(&self, segment: u32, reader: &SegmentReader) -> tantivy::Result<RankedSegment> {
        Ok(RankedSegment {
            limit: self.limit,
            segment,
            created: reader.fast_fields().i64("created").ok(),
            best: Best::default(),
        })
    }

    fn requires_scoring(&self) -> bool {
        true
    }

    fn merge_fruits(&self, fruits: Vec<Vec<Entry>>) -> tantivy::Result<Self::Fruit> {
        let held = std::mem::take(&mut self.best.lock().0);
        let mut all: Vec<Entry> = fruits
            .into_iter()
            .flatten()
            .chain(held.into_iter().map(|Reverse(e)| e))
            .collect();
        all.sort_by(|a, b| b.cmp(a));
        all.truncate(self.limit);
        Ok(all.into_iter().map(|Entry(s, _, a)| (s, a)).collect())
    }

    fn collect_segment(
        &self,
        weight: &dyn tantivy::query::Weight,
        segment: u32,
        reader: &SegmentReader,
    ) -> tantivy::Result<Vec<Entry>> {
        let column = reader.fast_fields().i64("created").ok();
        let newest = column.as_ref().map_or(i64::MAX, |c| c.max_value());
        let alive = reader.alive_bitset();
        let mut best = self.best.lock();
        let bar = best.bar(self.limit, newest);
        weight.for_each_pruning(bar, reader, &mut |doc, score| {
            if !alive.is_some_and(|a| a.is_deleted(doc)) {
                let entry = Entry(score, created(column.as_ref(), doc), DocAddress::new(segment, doc));
                best.offer(self.limit, entry);
            }
            best.bar(self.limit, newest)
        })?;
        Ok(Vec::new())
    }
}

/// Documents holding every one of several terms, scored by the sum of their BM25 scores.
/// The same as a `BooleanQuery` of `Must` terms, except that ranking prunes it block-max
/// AND style: a stretch of documents where the terms' block maxima cannot add up to what the
/// best so far need is skipped without scoring (tantivy scores every document of an
/// intersection).
#[derive(Clone, Debug)]
struct AllOf(Vec<Term>);

impl TQuery for AllOf {
    fn weight(&self, scoring: EnableScoring<'_>) -> tantivy::Result<Box<dyn Weight>> {
        let weights = self
            .0
            .iter()
            .map(|t| TermQuery::new(t.clone(), IndexRecordOption::WithFreqs).weight(scoring))
            .collect::<tantivy::Result<_>>()?;
        let bm25 = match scoring {
            EnableScoring::Enabled {
                statistics_provider, ..
            } => Some(
                self.0
                    .iter()
                    .map(|t| {
                        Ok((
                            t.clone(),
                            Bm25Weight::for_terms(statistics_provider, std::slice::from_ref(t))?,
                        ))
                    })
                    .collect::<tantivy::Result<_>>()?,
            ),
            EnableScoring::Disabled { .. } => None,
        };
        Ok(Box::new(AllOfWeight { weights, bm25 }))
    }

    fn query_terms<'a>(&'a self, visitor: &mut dyn FnMut(&'a Term, bool)) {
        for t in &self.0 {
            visitor(t, false);
        }
    }
}

struct AllOfWeight {
    /// Each term's own weight: tantivy's intersection of them, where nothing is pruned.
    weights: Vec<Box<dyn Weight>>,
    /// Each term's BM25 weight, when scoring.
    bm25: Option<Vec<(Term, Bm25Weight)>>,
}

impl Weight for AllOfWeight {
    fn scorer(&self, reader: &SegmentReader, boost: Score) -> tantivy::Result<Box<dyn Scorer>> {
        let scorers = self
            .weights
            .iter()
            .map(|w| w.scorer(reader, boost))
            .collect::<tantivy::Result<Vec<_>>>()?;
        Ok(intersect_scorers(scorers))
    }

    fn explain(&self, reader: &SegmentReader, doc: DocId) -> tantivy::Result<Explanation> {
        let mut scorer = self.scorer(reader, 1.0)?;
        if scorer.doc() > doc || scorer.seek(doc) != doc {
            return Err(tantivy::TantivyError::InvalidArgument(format!(
                "document {doc} does not match"
            )));
        }
        Ok(Explanation::new("every term (sum of BM25)", scorer.score()))
    }

    fn for_each_pruning(
        &self,
        threshold: Score,
        reader: &SegmentReader,
        callback: &mut dyn FnMut(DocId, Score) -> Score,
    ) -> tantivy::Result<()> {
        let Some(bm25) = &self.bm25 else {
            // Only a collector that scores prunes; ranking without scores is not asked for.
            return Err(tantivy::TantivyError::InvalidArgument("pruning needs scores".into()));
        };
        let mut cursors = Vec::with_capacity(bm25.len());
        for (term, weight) in bm25 {
            let inverted = reader.inverted_index(term.field())?;
            let Some(postings) = inverted.read_block_postings(term, IndexRecordOption::WithFreqs)? else {
                return Ok(()); // a term this segment lacks: nothing here matches
            };
            let norms = reader
                .fieldnorms_readers()
                .get_field(term.field())?
                .unwrap_or_else(|| FieldNormReader::constant(reader.max_doc(), 1));
            cursors.push(Cursor {
                postings,
                weight: weight.clone(),
                norms,
                at: 0,
            });
        }
        cursors.sort_by_key(|c| c.postings.doc_freq());
        block_max_and(&mut cursors, threshold, callback);
        Ok(())
    }
}

/// A term's postings read block by block, with what scores them.
struct Cursor {
    postings: BlockSegmentPostings,
    weight: Bm25Weight,
    norms: FieldNormReader,
    /// The current document's place in the loaded block.
    at: usize,
}

impl Cursor {
    fn doc(&self) -> DocId {
        self.postings.docs().get(self.at).copied().unwrap_or(TERMINATED)
    }

    fn last_in_block(&self) -> DocId {
        self.postings.docs().last().copied().unwrap_or(TERMINATED)
    }

    /// Moves to the first document at or after `target` (never back).
    fn seek(&mut self, target: DocId) -> DocId {
        if self.last_in_block() < target {
            self.postings.seek(target);
            self.at = 0;
        }
        let docs = self.postings.docs();
        let from = self.at.min(docs.len());
        self.at = from + docs[from..].partition_point(|&d| d < target);
        if self.at == docs.len() && !docs.is_empty() {
            // Every document left in the block is before the target: the last block.
            return TERMINATED;
        }
        self.doc()
    }

    fn advance(&mut self) -> DocId {
        self.at += 1;
        if self.at >= self.postings.docs().len() {
            self.postings.advance();
            self.at = 0;
        }
        self.doc()
    }

    fn block_max(&mut self) -> Score {
        self.postings.block_max_score(&self.norms, &self.weight)
    }

    fn score(&self) -> Score {
        let doc = self.doc();
        let freq = self.postings.freqs().get(self.at).copied().unwrap_or(1);
        self.weight.score(self.norms.fieldnorm_id(doc), freq)
    }
}

/// Visits the documents holding every term (`terms[0]` the rarest) that score above the
/// threshold, which the callback raises. Over a stretch where each term stays in one block
/// of postings, no document scores more than the sum of the blocks' maxima: when that sum
/// cannot pass the threshold, the whole stretch is skipped unscored.
fn block_max_and(terms: &mut [Cursor], mut threshold: Score, callback: &mut dyn FnMut(DocId, Score) -> Score) {
    let Some((lead, rest)) = terms.split_first_mut() else {
        return;
    };
    let mut doc = lead.doc();
    while doc != TERMINATED {
        // The stretch from `doc` to where the first of the terms' current blocks ends.
        let mut end = lead.last_in_block();
        let mut bound = lead.block_max();
        for t in rest.iter_mut() {
            if t.seek(doc) == TERMINATED {
                return;
            }
            end = end.min(t.last_in_block());
            bound += t.block_max();
        }
        if bound <= threshold {
            doc = match end.checked_add(1) {
                Some(next) if next < TERMINATED => lead.seek(next),
                _ => TERMINATED,
            };
            continue;
        }
        let others = bound - lead.block_max();
        // Intersect within the stretch, scoring what matches.
        while doc <= end && doc != TERMINATED {
            let lead_score = lead.score();
            if lead_score + others <= threshold {
                doc = lead.advance(); // the others' best here cannot lift it
                continue;
            }
            let mut target = doc;
            for t in rest.iter_mut() {
                let at = t.seek(target);
                if at != target {
                    target = at;
                    break;
                }
            }
            if target == doc {
                let score = lead_score + rest.iter().map(Cursor::score).sum::<Score>();
                if score > threshold {
                    threshold = callback(doc, score);
                }
                doc = lead.advance();
            } else {
                doc = if target == TERMINATED {
                    TERMINATED
                } else {
                    lead.seek(target)
                };
            }
        }
    }
}

/// The passage of `body` around its first match, at most [`SNIPPET_CHARS`] characters, with
/// every word that is one of the terms the query matched by in `**`.
fn snippet(body: &str, matched: &HashSet<String>) -> String {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in body.char_indices().chain(std::iter::once((body.len(), ' '))) {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if matched.contains(&body[s..i].to_lowercase()) {
                    words.push(s..i);
                }
                start = None;
            }
            _ => {}
        }
    }
    // From a little before the first match, on a character boundary.
    let first = words.first().map_or(0, |r| r.start);
    let mut from = body[..first]
        .char_indices()
        .rev()
        .nth(SNIPPET_CHARS / 4)
        .map_or(0, |(i, _)| i);
    if from > 0 {
        from = body[from..]
            .find(char::is_whitespace)
            .map_or(from, |j| from + j + 1)
            .min(first);
    }
    let to = body[from..]
        .char_indices()
        .nth(SNIPPET_CHARS)
        .map_or(body.len(), |(i, _)| from + i);
    let mut out = String::with_capacity(to - from + 16);
    if from > 0 {
        out.push('…');
    }
    let mut at = from;
    for r in words.iter().filter(|r| r.start >= from && r.end <= to) {
        out.push_str(&body[at..r.start]);
        out.push_str("**");
        out.push_str(&body[r.clone()]);
        out.push_str("**");
        at = r.end;
    }
    out.push_str(&body[at..to]);
    if to < body.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_into_required_optional_and_excluded_parts() {
        let w = |s: &str| Part::Word(s.into());
        assert_eq!(
            parse("token refresh"),
            vec![(false, vec![w("token")]), (false, vec![w("refresh")])]
        );
        assert_eq!(
            parse("\"refresh path\" bug OR issue -lunch"),
            vec![
                (false, vec![Part::Phrase("refresh path".into())]),
                (false, vec![w("bug"), w("issue")]),
                (true, vec![w("lunch")]),
            ]
        );
        assert_eq!(parse("a AND b"), vec![(false, vec![w("a")]), (false, vec![w("b")])]);
        assert_eq!(parse("OR x"), vec![(false, vec![w("x")])], "a leading OR joins nothing");
        assert_eq!(
            parse("\"unclosed phrase"),
            vec![(false, vec![Part::Phrase("unclosed phrase".into())])]
        );
        assert!(parse("   ").is_empty());
    }

    #[test]
    fn snippets_mark_the_terms_that_matched() {
        let s = |body: &str, w: &[&str]| snippet(body, &w.iter().map(|w| w.to_string()).collect());
        assert_eq!(s("The Migration plan", &["migration"]), "The **Migration** plan");
        assert_eq!(
            s("fix the token path", &["token", "path"]),
            "fix the **token** **path**"
        );
        assert_eq!(
            s("tokens and tokn", &["tokn"]),
            "tokens and **tokn**",
            "only the terms themselves"
        );
        let long = format!("{} needle {}", "hay ".repeat(100), "hay ".repeat(100));
        let cut = s(&long, &["needle"]);
        assert!(
            cut.starts_with('…') && cut.ends_with('…') && cut.contains("**needle**"),
            "{cut}"
        );
        assert!(cut.chars().count() <= SNIPPET_CHARS + 10, "{cut}");
        assert_eq!(s("ünïcode Wörds", &["wörds"]), "ünïcode **Wörds**");
    }

    /// An index in memory of `docs` (body, created), committed every `per_segment`.
    fn index_of(docs: &[(String, i64)], per_segment: usize) -> (Index, Fields) {
        let (schema, f) = schema();
        let index = Index::create_in_ram(schema);
        let mut writer: IndexWriter = index.writer_with_num_threads(1, 15_000_000).unwrap();
        writer.set_merge_policy(Box::new(tantivy::indexer::NoMergePolicy));
        for (i, (body, created)) in docs.iter().enumerate() {
            let mut d = TantivyDocument::new();
            d.add_u64(f.id, i as u64);
            d.add_text(f.body, body);
            d.add_i64(f.created, *created);
            writer.add_document(d).unwrap();
            if (i + 1) % per_segment == 0 {
                writer.commit().unwrap();
            }
        }
        writer.commit().unwrap();
        (index, f)
    }

    #[test]
    fn all_of_finds_and_scores_what_tantivys_intersection_does() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        // Few words, skewed, bodies of varied length: many near-equal scores.
        let docs: Vec<(String, i64)> = (0..20_000)
            .map(|_| {
                let n = 3 + next() % 12;
                let words: Vec<String> = (0..n).map(|_| format!("w{}", (next() % 64).min(next() % 64))).collect();
                (words.join(" "), (next() % 3000) as i64)
            })
            .collect();
        let (index, f) = index_of(&docs, 3000);
        let searcher = index.reader().unwrap().searcher();
        assert!(searcher.segment_readers().len() > 5);

        for words in [
            &["w0", "w1"][..],
            &["w0", "w3", "w7"],
            &["w2", "w40"],
            &["w1", "nothing"],
        ] {
            let terms: Vec<Term> = words.iter().map(|w| Term::from_field_text(f.body, w)).collect();
            let plain = BooleanQuery::new(
                terms
                    .iter()
                    .map(|t| {
                        (
                            Occur::Must,
                            Box::new(TermQuery::new(t.clone(), IndexRecordOption::WithFreqs)) as Box<dyn TQuery>,
                        )
                    })
                    .collect(),
            );
            for want in [1, 7, 40] {
                let a = ranked(&searcher, &AllOf(terms.clone()), want).unwrap();
                let b = ranked(&searcher, &plain, want).unwrap();
                assert_eq!(a.len(), b.len(), "{words:?} {want}");
                for ((sa, da), (sb, db)) in a.iter().zip(&b) {
                    assert!((sa - sb).abs() < 1e-4, "{words:?} {want}: {a:?} {b:?}");
                    // Equal scores (to the last bit, summed in another order) may swap.
                    if (sa - sb).abs() < 1e-6 && da != db {
                        continue;
                    }
                    assert_eq!(da, db, "{words:?} {want}");
                }
            }
        }
    }

    #[test]
    fn equal_scores_rank_the_newest_first_across_segments() {
        // The same body 50 times in shuffled time order over many segments, and one better.
        let mut docs: Vec<(String, i64)> = (0..50)
            .map(|i| ("deploy done".to_owned(), (i * 37 % 50) as i64))
            .collect();
        docs.push(("deploy deploy".to_owned(), 1));
        let (index, f) = index_of(&docs, 6);
        let searcher = index.reader().unwrap().searcher();
        let q = TermQuery::new(Term::from_field_text(f.body, "deploy"), IndexRecordOption::WithFreqs);
        let created = |q: &dyn TQuery, want: usize| -> Vec<i64> {
            ranked(&searcher, q, want)
                .unwrap()
                .iter()
                .map(|(_, a)| {
                    let d: TantivyDocument = searcher.doc(*a).unwrap();
                    docs[d.get_first(f.id).and_then(|v| v.as_u64()).unwrap() as usize].1
                })
                .collect()
        };
        assert_eq!(
            created(&q, 6),
            [1, 49, 48, 47, 46, 45],
            "the better one, then the newest equals"
        );
        let q = AllOf(vec![
            Term::from_field_text(f.body, "deploy"),
            Term::from_field_text(f.body, "done"),
        ]);
        assert_eq!(created(&q, 3), [49, 48, 47]);
    }

    #[test]
    fn a_prefix_with_more_completions_than_are_scored_still_finds_them_all() {
        let docs: Vec<(String, i64)> = (0..SCORED_EXPANSIONS + 6)
            .map(|i| (format!("deploy{i} done"), i as i64))
            .collect();
        let (index, fields) = index_of(&docs, 40);
        let reader = index.reader().unwrap();
        let searcher = reader.searcher();
        let search = SearchIndex { index, reader, fields };
        let mut marks = HashSet::new();
        let alternatives = search.part(&searcher, &Part::Word("deploy".into()), &mut marks);
        assert_eq!(
            alternatives.len(),
            SCORED_EXPANSIONS + 1,
            "64 scored, the rest in one set"
        );
        let q = BooleanQuery::new(alternatives.into_iter().map(|a| (Occur::Should, a.query())).collect());
        assert_eq!(ranked(&searcher, &q, 1000).unwrap().len(), docs.len());
        assert_eq!(marks.len(), docs.len(), "every completion is marked in snippets");
    }
}
