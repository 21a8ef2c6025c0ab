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
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tantivy::collector::TopDocs;
use tantivy::directory::MmapDirectory;
use tantivy::query::{
    AllQuery, BooleanQuery, BoostQuery, FuzzyTermQuery, Occur, PhraseQuery, Query as TQuery, RangeQuery, TermQuery,
};
use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, FAST, INDEXED, STORED, STRING,
};
use tantivy::{
    doc, DocAddress, Index, IndexReader, IndexWriter, ReloadPolicy, Score, SegmentReader, TantivyDocument, Term,
};

/// How often the indexer looks for new messages.
const INDEX_EVERY: Duration = Duration::from_millis(100);
/// Messages of one channel indexed per pass.
const INDEX_BATCH: usize = 1000;
/// The background indexer works only when no channel has committed for this long, so under
/// load the relay keeps its cores; a search catches the index up on demand.
const QUIET_FOR: Duration = Duration::from_millis(300);
/// Closed channels one pass indexes from the store at most.
const BACKLOG_PER_PASS: usize = 1000;
/// The background indexer commits at most this often (a search commits at once).
const COMMIT_EVERY: Duration = Duration::from_secs(1);
/// The index writer's memory budget.
const WRITER_HEAP: usize = 32 * 1024 * 1024;
/// Words shorter than this match exactly or as a prefix; longer ones also within one edit.
const FUZZY_FROM: usize = 5;
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
    // Reading every segment's files now finds a damaged index before a search does.
    let reader = index.reader()?;
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
            activity: (0, Instant::now()),
        }
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

    /// The views to index: every open channel, and up to [`BACKLOG_PER_PASS`] closed ones
    /// read from the store. The first call also finds what the index lacks of the log.
    fn sources(&mut self) -> Vec<Arc<ChannelView>> {
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

    /// Indexes what the views hold beyond the index, deletes what retention removed, and
    /// commits when `now` or a while has passed; returns whether anything moved.
    fn index_pass(&mut self, now: bool) -> bool {
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
        let sources = self.sources();
        let Some(writer) = self.writer.as_mut() else {
            return false;
        };
        for view in sources {
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
            for p in &batch {
                let m = &p.message;
                let added = writer.add_document(doc!(
                    f.id => p.id(),
                    f.channel => name.as_str(),
                    f.sender => m.sender.to_lowercase(),
                    f.kind => m.kind.to_lowercase(),
                    f.body => m.body.as_str(),
                    f.created => Timestamp::parse_rfc3339(&m.created_at).map_or(0, |t| t.0),
                ));
                if let Err(e) = added {
                    crate::throttled!(error, error = %e, "adding a message to the search index failed");
                }
            }
            self.progress.indexed.insert(name, scanned);
            self.dirty = true;
            advanced = true;
        }
        if self.dirty && (now || self.last_commit.elapsed() >= COMMIT_EVERY) {
            self.commit();
        }
        if behind == 0 && self.backlog.lock().is_empty() && !self.dirty {
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
        // Background work: let the relay's threads have the cores first (Linux: nice is per
        // thread). Failing to lower the priority only costs speed.
        // SAFETY: setpriority has no memory-safety preconditions.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, 0, 19);
        }
        ctx.run_interval(INDEX_EVERY, |act, _| {
            // A batch of an earlier version's keys each tick, whatever the load: small
            // deletes, on this low-priority thread.
            act.cleanup_pass();
            if act.quiet() {
                act.index_pass(false);
            }
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if self.dirty {
            self.commit();
        }
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
        while self.index_pass(true) {}
        if self.dirty {
            self.commit();
        }
    }
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
        let mut stream = analyzer.token_stream(text);
        let mut out = Vec::new();
        while stream.advance() {
            out.push(stream.token().text.clone());
        }
        out
    }

    /// The query for one part: a word matches exactly (scored highest), as a prefix, and for
    /// longer words within one edit; a phrase matches its words in order.
    fn part(&self, part: &Part) -> Option<Box<dyn TQuery>> {
        let body = self.fields.body;
        let words = match part {
            Part::Word(w) | Part::Phrase(w) => self.tokens(w),
        };
        match words.as_slice() {
            [] => None,
            [one] => {
                let term = Term::from_field_text(body, one);
                let mut alternatives: Vec<(Occur, Box<dyn TQuery>)> = vec![(
                    Occur::Should,
                    Box::new(BoostQuery::new(
                        Box::new(TermQuery::new(term.clone(), IndexRecordOption::WithFreqs)),
                        2.0,
                    )),
                )];
                if matches!(part, Part::Word(_)) {
                    alternatives.push((
                        Occur::Should,
                        Box::new(FuzzyTermQuery::new_prefix(term.clone(), 0, true)),
                    ));
                    if one.chars().count() >= FUZZY_FROM {
                        alternatives.push((
                            Occur::Should,
                            Box::new(BoostQuery::new(Box::new(FuzzyTermQuery::new(term, 1, true)), 0.5)),
                        ));
                    }
                }
                Some(Box::new(BooleanQuery::new(alternatives)))
            }
            many => Some(Box::new(PhraseQuery::new(
                many.iter().map(|w| Term::from_field_text(body, w)).collect(),
            ))),
        }
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
    let mut clauses: Vec<(Occur, Box<dyn TQuery>)> = Vec::new();
    let mut positive = false;
    for (negated, parts) in &groups {
        let alternatives: Vec<(Occur, Box<dyn TQuery>)> = parts
            .iter()
            .filter_map(|p| index.part(p))
            .map(|q| (Occur::Should, q))
            .collect();
        if alternatives.is_empty() {
            continue;
        }
        positive |= !negated;
        let group: Box<dyn TQuery> = Box::new(BooleanQuery::new(alternatives));
        clauses.push((if *negated { Occur::MustNot } else { Occur::Must }, group));
    }
    if !positive {
        return Err(RelayError::Invalid(InvalidInput::Other(
            "the query has no searchable word (words are letters and digits)".into(),
        )));
    }
    // What the snippet marks: the words searched for (not excluded ones, not the filters).
    let marks: Vec<String> = groups
        .iter()
        .filter(|(negated, _)| !negated)
        .flat_map(|(_, parts)| parts.iter())
        .flat_map(|p| match p {
            Part::Word(w) | Part::Phrase(w) => index.tokens(w),
        })
        .collect();
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
    let query = BooleanQuery::new(clauses);
    let searcher = index.reader.searcher();
    // A few more than asked: a hit whose message retention removed is left out.
    let want = q.limit.saturating_add(q.limit / 4 + 8);
    let ranked = TopDocs::with_limit(want).tweak_score(move |segment: &SegmentReader| {
        let ids = segment.fast_fields().u64("id").map(|c| c.first_or_default_col(0)).ok();
        move |doc, score: Score| (score, ids.as_ref().map_or(0, |c| c.get_val(doc)))
    });
    let top: Vec<((Score, u64), DocAddress)> = searcher
        .search(&query, &ranked)
        .map_err(|e| unavailable("search the index", e))?;
    let mut out = Vec::with_capacity(q.limit.min(top.len()));
    for ((score, id), address) in top {
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

/// Whether a body's word matches a searched word as the index does: the same, starting with
/// it, or for longer words within one edit (a transposition counts as one).
fn word_matches(word: &str, searched: &str) -> bool {
    word.starts_with(searched) || (searched.chars().count() >= FUZZY_FROM && one_edit(word, searched))
}

/// Damerau-Levenshtein distance at most 1.
fn one_edit(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let (la, lb) = (a.len(), b.len());
    if la.abs_diff(lb) > 1 {
        return false;
    }
    let start = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if start == la && start == lb {
        return true;
    }
    let (ra, rb) = (&a[start..], &b[start..]);
    match la.cmp(&lb) {
        std::cmp::Ordering::Equal => {
            ra[1..] == rb[1..] || (ra.len() >= 2 && ra[0] == rb[1] && ra[1] == rb[0] && ra[2..] == rb[2..])
        }
        std::cmp::Ordering::Greater => ra[1..] == *rb,
        std::cmp::Ordering::Less => *ra == rb[1..],
    }
}

/// The passage of `body` around its first match, at most [`SNIPPET_CHARS`] characters, with
/// every word that matches a searched one in `**`.
fn snippet(body: &str, searched: &[String]) -> String {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in body.char_indices().chain(std::iter::once((body.len(), ' '))) {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                let lower = body[s..i].to_lowercase();
                if searched.iter().any(|w| word_matches(&lower, w)) {
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
    fn snippets_mark_exact_prefix_and_one_edit_matches() {
        let s = |body: &str, w: &[&str]| snippet(body, &w.iter().map(|w| w.to_string()).collect::<Vec<_>>());
        assert_eq!(s("The migration plan", &["migrat"]), "The **migration** plan");
        assert_eq!(
            s("fix the token path", &["token", "path"]),
            "fix the **token** **path**"
        );
        assert_eq!(s("a migration", &["migratoin"]), "a **migration**", "a transposition");
        assert_eq!(
            s("tokens and tokn", &["tokn"]),
            "tokens and **tokn**",
            "short words: exact or prefix only"
        );
        let long = format!("{} needle {}", "hay ".repeat(100), "hay ".repeat(100));
        let cut = s(&long, &["needle"]);
        assert!(
            cut.starts_with('…') && cut.ends_with('…') && cut.contains("**needle**"),
            "{cut}"
        );
        assert!(cut.chars().count() <= SNIPPET_CHARS + 10, "{cut}");
        assert_eq!(s("ünïcode wörds", &["wörd"]), "ünïcode **wörds**");
    }

    #[test]
    fn one_edit_is_one_insertion_deletion_substitution_or_transposition() {
        for (a, b) in [
            ("migration", "migratoin"),
            ("token", "tokens"),
            ("token", "toke"),
            ("token", "tuken"),
            ("same", "same"),
        ] {
            assert!(one_edit(a, b), "{a} {b}");
        }
        for (a, b) in [("migration", "migrtaoin"), ("token", "tokenss"), ("abc", "xyz")] {
            assert!(!one_edit(a, b), "{a} {b}");
        }
    }
}
