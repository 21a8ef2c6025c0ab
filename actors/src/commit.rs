//! The store thread. Every write to the store happens here, never on the actors' thread: an
//! actor hands the committer a [`Job`] (what to write) and gets a [`Ticket`] (when it is
//! durable). The thread takes every job queued, applies each (in memory, in queue order), then
//! makes them durable with one flush for all of them (group commit), then answers each ticket.
//! The store may gather the round's appends and write them as one at the round's end
//! ([`EventStore::begin_round`]); that write failing fails the round as its flush would.
//! A job may also carry an [`OnDurable`] hook, run on this thread the moment the job is
//! durable, before its ticket is answered: the channel actor's hook publishes the batch to its
//! view and answers the posters, so neither waits for a hop back through the actors' thread.
//!
//! Failure rules, so that a write is acknowledged only once it will survive a crash, and a
//! write that was refused never turns up later:
//! - a job whose writes fail is answered with the error; the others go on;
//! - when the flush fails, every job of the round is undone (the store's memory goes back to
//!   what it held, so a later flush cannot persist a refused write) and answered with the error;
//! - a ticket its owner gave up on ([`Abandon`], a flush that hangs) is undone when its
//!   flush finally returns, never acknowledged;
//! - [`Health`] says whether the store is answering and why not, for `/healthz` and for
//!   writers to fail fast while it hangs;
//! - after a failure the idle thread tries the store every second; a store that keeps its
//!   error past the cause (sled, once a write hit a full disk) is opened again from its disk,
//!   and told again to take back every write a failed round refused, before anything new is
//!   written ([`Heal`]), so writes resume by themselves once space returns.

use crate::store::{EventStore, Space, StoreError, Undo};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};

/// Longest anyone waits for a write's verdict ([`Ticket::durable`]). Past it the write is
/// abandoned: never acknowledged, undone if it lands. Shorter than the faces' own timeout, so
/// the client's error always comes from here.
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a relay node on a shared log waits for its store to commit a batch of the fold.
/// Giving up on one leaves the node's copy with a hole, so the node stops to replay the log
/// from its store on restart; a store that is only slow (a box far past its cores) is waited
/// for instead. The posters waiting on such a batch keep their own bound (the faces' 10 s).
pub const FOLD_COMMIT_TIMEOUT: Duration = Duration::from_secs(60);
/// A round (apply + flush) running longer than this means the store is not answering:
/// writers are refused at once until it returns.
pub const STALL: Duration = Duration::from_secs(2);
/// How often an idle store thread retries the store after a failed write.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The longest pause between two attempts to open a failed store again.
const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(8);
/// What a store opened again must take (and then let go of) before it counts as healed: a
/// disk with room for a few bytes but not for a message is still full.
const PROBE_BYTES: usize = 64 * 1024;
const PROBE_KEY: &[u8] = b"\0heal-probe";

/// The store thread's memory of a failure, until the store answers again.
struct Heal {
    /// The undos of every round whose flush failed since the store last flushed well: what
    /// the store's memory was told to take back, which a store opened again from its disk
    /// must be told again (a failed flush may have written part of what it refused).
    refused: Vec<Undo>,
    /// When to try opening the store again next, and how long to wait after that.
    next_reopen: Option<Instant>,
    backoff: Duration,
}

impl Default for Heal {
    fn default() -> Self {
        Heal {
            refused: Vec::new(),
            next_reopen: None,
            backoff: PROBE_EVERY,
        }
    }
}

impl Heal {
    /// The store flushed well: what it was told to take back is durable too.
    fn flushed(&mut self) {
        self.refused.clear();
        self.next_reopen = None;
        self.backoff = PROBE_EVERY;
    }

    /// After a failure: true once the store answers again. A flush is tried first; a store
    /// that keeps its error past its cause (sled does, after a full disk) is then opened
    /// again, with a growing pause between attempts, and told to take back what the failed
    /// rounds refused before anything new is written.
    fn try_store(&mut self, store: &dyn EventStore) -> bool {
        if store.flush().is_ok() {
            self.flushed();
            tracing::info!("the store answers again");
            return true;
        }
        let now = Instant::now();
        if self.next_reopen.is_some_and(|at| now < at) {
            return false;
        }
        // The next attempt waits longer, whatever this one finds: a store that takes the probe
        // but not the next write (a file-size limit) is not opened again at every write.
        self.next_reopen = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(REOPEN_BACKOFF_MAX);
        let healed = store.reopen().and_then(|()| {
            for undo in self.refused.iter().rev() {
                store.undo(undo.clone())?;
            }
            store.flush()?;
            store.put_aux(Space::Jobs, PROBE_KEY, Some(&[0; PROBE_BYTES]))?;
            store.put_aux(Space::Jobs, PROBE_KEY, None)?;
            store.flush()
        });
        match healed {
            Ok(()) => {
                tracing::info!(
                    taken_back = self.refused.len(),
                    "the store was opened again and answers; refused writes are not in it"
                );
                self.refused.clear();
                true
            }
            Err(e) => {
                crate::throttled!(warn, error = %e, "the store does not answer yet; will try again");
                false
            }
        }
    }
}

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// After the store has flushed it (default): written to the disk with sled's flush, so an
    /// acknowledged write survives a crash of the process. sled's flush on Linux is
    /// `sync_file_range`, which neither flushes the drive's cache nor commits file metadata;
    /// sled fsyncs in the background every 500 ms.
    Flush,
    /// After the flush and an `fdatasync` of the store's log: an acknowledged write also
    /// survives a power loss on hardware that honours cache flushes. Slower.
    Fsync,
    /// As soon as it is in the store's memory; the store flushes in the background every
    /// 500 ms, so a crash can lose up to that much acknowledged data. For throwaway relays.
    Relaxed,
}

/// The writes of one job, run on the store thread; returns how to undo them.
pub type Apply = Box<dyn FnOnce(&dyn EventStore) -> Result<Undo, StoreError> + Send>;

/// Run on the store thread once a job is durable, and only then (never for a refused or
/// abandoned job). It must be quick and must not block: it runs between a flush and the
/// answers of every other job of the round.
pub type OnDurable = Box<dyn FnOnce() + Send>;

/// What a ticket's owner and the store thread agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Pending,
    /// The owner gave up waiting: never acknowledge it; undo it if it lands.
    Abandoned,
    /// The store thread decided (and answered).
    Settled,
}

type Answer = oneshot::Sender<Result<(), StoreError>>;

struct Job {
    apply: Apply,
    on_durable: Option<OnDurable>,
    fate: Arc<Mutex<Fate>>,
    done: Answer,
}

/// A write's durability: resolves once it is durable (`Ok`) or refused (`Err`).
pub struct Ticket {
    rx: oneshot::Receiver<Result<(), StoreError>>,
    fate: Arc<Mutex<Fate>>,
}

impl Ticket {
    /// Waits for the verdict, at most [`COMMIT_TIMEOUT`]: a store that does not answer by then
    /// (a flush that hangs) gets the write abandoned, so no waiter (a channel's batch, the
    /// fold's watermark, a registration) is held by the store for longer.
    pub async fn durable(self) -> Result<(), StoreError> {
        self.durable_within(COMMIT_TIMEOUT).await
    }

    /// As [`Ticket::durable`], giving the store `limit` to answer. For a write whose waiters
    /// have bounds of their own and which costs more to give up on than to wait for: a relay
    /// node's fold of the shared log, where an abandoned batch means the node must stop
    /// ([`FOLD_COMMIT_TIMEOUT`]).
    pub async fn durable_within(self, limit: Duration) -> Result<(), StoreError> {
        let Ticket { mut rx, fate } = self;
        match tokio::time::timeout(limit, &mut rx).await {
            Ok(verdict) => verdict.unwrap_or_else(|_| Err(stopped())),
            Err(_) if abandon(&fate) => Err(StoreError::Io(format!(
                "the store did not answer within {} s",
                limit.as_secs()
            ))),
            // It decided just now: the verdict is on its way.
            Err(_) => rx.await.unwrap_or_else(|_| Err(stopped())),
        }
    }

    /// Waits for the verdict however long the store takes, never abandoning the write: for a
    /// write nobody is answered for, whose outcome its owner must know (retention's removal of
    /// history, which has no undo).
    pub async fn settled(self) -> Result<(), StoreError> {
        self.rx.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// What a writer is told when the store thread is gone.
fn stopped() -> StoreError {
    StoreError::Io("the store thread has stopped".into())
}

/// Gives up on a ticket unless the store thread has already decided: the write will then
/// never be acknowledged, and is undone if it lands. False if the verdict is already sent
/// (then it is coming: wait for it).
fn abandon(fate: &Mutex<Fate>) -> bool {
    let mut fate = fate.lock();
    match *fate {
        Fate::Pending => {
            *fate = Fate::Abandoned;
            true
        }
        _ => false,
    }
}

/// Whether the store is answering. Shared by the store thread (the writer) and everyone who
/// asks.
#[derive(Default)]
pub struct Health {
    /// When the running round began (µs on a monotonic clock since `epoch`), 0 when idle.
    round_started: AtomicI64,
    /// Why the last round failed; `None` once one succeeds.
    last_error: Mutex<Option<String>>,
    epoch: std::sync::OnceLock<Instant>,
}

impl Health {
    fn now_us(&self) -> i64 {
        self.epoch.get_or_init(Instant::now).elapsed().as_micros() as i64 + 1
    }

    /// `Err(why)` when writes cannot succeed now: the store has been stuck in a round for
    /// longer than [`STALL`].
    pub fn writable(&self) -> Result<(), String> {
        let started = self.round_started.load(Ordering::Acquire);
        if started != 0 {
            let for_us = self.now_us() - started;
            if for_us > STALL.as_micros() as i64 {
                return Err(format!("the store has not answered for {:.1} s", for_us as f64 / 1e6));
            }
        }
        Ok(())
    }

    /// `Err(why)` when the store is stuck or its last write failed.
    pub fn check(&self) -> Result<(), String> {
        self.writable()?;
        match self.last_error.lock().as_ref() {
            Some(e) => Err(format!("the last store write failed: {e}")),
            None => Ok(()),
        }
    }
}

/// A handle to the store thread. Cloning it is cheap; the thread ends when every handle is gone.
#[derive(Clone)]
pub struct Committer {
    tx: mpsc::Sender<Job>,
    health: Arc<Health>,
    /// Counts the rounds that ended: a reader that looks across every channel waits on it.
    rounds: Arc<watch::Sender<u64>>,
}

impl Committer {
    pub fn start(store: Arc<dyn EventStore>, durability: Durability) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let health = Arc::new(Health::default());
        let h = health.clone();
        let rounds = Arc::new(watch::Sender::new(0u64));
        let ended = rounds.clone();
        std::thread::Builder::new()
            .name("crosstalk-commit".into())
            .spawn(move || {
                let mut round = Vec::new();
                let mut heal = Heal::default();
                loop {
                    let first = match rx.recv_timeout(PROBE_EVERY) {
                        Ok(job) => job,
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            // After a failure and with nothing to write, try the store again, so
                            // it heals by itself once the cause is gone.
                            if h.last_error.lock().is_some() && durability != Durability::Relaxed {
                                h.round_started.store(h.now_us(), Ordering::Release);
                                if heal.try_store(store.as_ref()) {
                                    *h.last_error.lock() = None;
                                }
                                h.round_started.store(0, Ordering::Release);
                            }
                            continue;
                        }
                    };
                    // Everything queued now goes into this round: one flush for all of it.
                    round.push(first);
                    round.extend(rx.try_iter());
                    h.round_started.store(h.now_us(), Ordering::Release);
                    // Writers that keep trying keep the thread from idling: heal here too.
                    if h.last_error.lock().is_some()
                        && durability != Durability::Relaxed
                        && heal.try_store(store.as_ref())
                    {
                        *h.last_error.lock() = None;
                    }
                    run_round(store.as_ref(), durability, &mut round, &h, &mut heal);
                    h.round_started.store(0, Ordering::Release);
                    // After the round's hooks: what it made visible is there to read.
                    ended.send_modify(|n| *n = n.wrapping_add(1));
                }
            })?;
        Ok(Committer { tx, health, rounds })
    }

    /// Queues `apply`; the ticket resolves once its writes are durable, or refused.
    pub fn write(&self, apply: Apply) -> Ticket {
        self.queue(apply, None)
    }

    /// As [`Committer::write`], and runs `on_durable` on the store thread once the writes are
    /// durable, before the ticket resolves.
    pub fn write_then(&self, apply: Apply, on_durable: OnDurable) -> Ticket {
        self.queue(apply, Some(on_durable))
    }

    fn queue(&self, apply: Apply, on_durable: Option<OnDurable>) -> Ticket {
        let (done, rx) = oneshot::channel();
        let fate = Arc::new(Mutex::new(Fate::Pending));
        let job = Job {
            apply,
            on_durable,
            fate: fate.clone(),
            done,
        };
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            let _ = job.done.send(Err(stopped()));
        }
        Ticket { rx, fate }
    }

    /// Resolves once everything queued before it is durable.
    pub fn barrier(&self) -> Ticket {
        self.write(Box::new(|_| Ok(Undo::default())))
    }

    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// A receiver that wakes after every round of writes (every channel's commits, and the
    /// records'): what waits for something new anywhere waits on this instead of polling.
    pub fn rounds(&self) -> watch::Receiver<u64> {
        self.rounds.subscribe()
    }
}

/// A job whose writes are in the store's memory, with how to take them back.
struct Applied {
    fate: Arc<Mutex<Fate>>,
    done: Answer,
    on_durable: Option<OnDurable>,
    undo: Undo,
}

fn run_round(store: &dyn EventStore, durability: Durability, round: &mut Vec<Job>, health: &Health, heal: &mut Heal) {
    let mut applied: Vec<Applied> = Vec::with_capacity(round.len());
    let mut failed = None;
    store.begin_round();
    for job in round.drain(..) {
        if *job.fate.lock() == Fate::Abandoned {
            // Given up before it was written: nothing to write, nothing to undo.
            settle(
                &job.fate,
                job.done,
                Err(StoreError::Io("abandoned: the store did not answer in time".into())),
            );
            continue;
        }
        match (job.apply)(store) {
            Ok(undo) => applied.push(Applied {
                fate: job.fate,
                done: job.done,
                on_durable: job.on_durable,
                undo,
            }),
            Err(e) => {
                crate::throttled!(error, error = %e, "store write failed; not acknowledged");
                failed = Some(e.to_string());
                // Health first: a writer told "failed" must find the store unhealthy.
                *health.last_error.lock() = failed.clone();
                settle(&job.fate, job.done, Err(e));
            }
        }
    }
    // What the store gathered is written now; if that fails, every write of the round is
    // refused like a failed flush.
    let ended = store.end_round();
    if applied.is_empty() {
        *health.last_error.lock() = failed;
        return;
    }
    metrics::histogram!("crosstalk_commit_round_writes").record(applied.len() as f64);
    let flush_started = std::time::Instant::now();
    let flushed = ended.and_then(|()| match durability {
        Durability::Relaxed => Ok(()),
        Durability::Flush => store.flush(),
        Durability::Fsync => store.sync(),
    });
    metrics::histogram!("crosstalk_flush_seconds").record(flush_started.elapsed().as_secs_f64());
    if flushed.is_err() {
        metrics::counter!("crosstalk_flush_failures_total").increment(1);
    }
    match flushed {
        Ok(()) => {
            if durability != Durability::Relaxed {
                heal.flushed();
            }
            // Health first: a writer told "durable" must find the store healthy, neither
            // failed nor stuck (the stall clock restarts: the store has just answered; a
            // flush that took longer than `STALL` would otherwise still read as a stall
            // until the thread leaves the round).
            *health.last_error.lock() = failed;
            health.round_started.store(health.now_us(), Ordering::Release);
            let mut take_back = Vec::new();
            for job in applied {
                let mut f = job.fate.lock();
                if *f == Fate::Abandoned {
                    // Its owner already told the client it failed: take it back.
                    take_back.push(job.undo);
                } else {
                    *f = Fate::Settled;
                    drop(f);
                    if let Some(hook) = job.on_durable {
                        hook();
                    }
                    let _ = job.done.send(Ok(()));
                }
            }
            if !take_back.is_empty() {
                let copy = take_back.clone();
                if !revert(store, durability, take_back) {
                    heal.refused.extend(copy);
                }
            }
        }
        Err(e) => {
            crate::throttled!(error, error = %e, jobs = applied.len(), "store flush failed; the round is undone, nothing acknowledged");
            *health.last_error.lock() = Some(e.to_string());
            let mut answers = Vec::with_capacity(applied.len());
            let mut undos = Vec::with_capacity(applied.len());
            for job in applied {
                answers.push((job.fate, job.done));
                heal.refused.push(job.undo.clone());
                undos.push(job.undo);
            }
            revert(store, Durability::Relaxed, undos);
            for (fate, done) in answers {
                settle(&fate, done, Err(e.clone()));
            }
        }
    }
}

/// Undoes writes, newest first, and (but for `Relaxed`) flushes the undo; false when that
/// failed.
fn revert(store: &dyn EventStore, durability: Durability, undos: Vec<Undo>) -> bool {
    let mut done = true;
    for undo in undos.into_iter().rev() {
        if let Err(e) = store.undo(undo) {
            done = false;
            crate::throttled!(error, error = %e, "undoing a refused write failed");
        }
    }
    if durability != Durability::Relaxed {
        if let Err(e) = store.flush() {
            done = false;
            crate::throttled!(error, error = %e, "flushing an undo failed; it is applied again once the store answers");
        }
    }
    done
}

fn settle(fate: &Mutex<Fate>, done: Answer, result: Result<(), StoreError>) {
    *fate.lock() = Fate::Settled;
    let _ = done.send(result);
}
