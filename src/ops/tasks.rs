//! MCP tasks' records and rules: a blocking tool call that became a task is a
//! [`TaskRecord`] in the small-records seam, so it lives on sled or in the cluster's bucket,
//! survives a restart, and is read by whichever node a client's `tasks/get` reaches. What a
//! task is on the wire (the two generations of MCP tasks) and the runner that waits are the
//! MCP face's (`crate::mcp::tasks`).
//!
//! The rules: a task is its owner's (the principal that made it) and nobody else's; only a
//! working task changes, once, to completed, failed or cancelled, and of two nodes or runners
//! racing to settle it the first wins (a compare-and-set); a principal keeps at most
//! [`MAX_TASKS_PER_PRINCIPAL`] records (counted by each node; at the limit, counted again from
//! the store); a record is forgotten after its time to live.
//!
//! A task's id is `<owner group>.<uuid>` ([`TaskStore::new_id`]), its record's key, so
//! `tasks/list` reads the caller's group of records and no one else's: what one principal's
//! listing costs does not grow with what every other principal holds. Ids an earlier
//! release made are a bare uuid; while any such record is stored, listings read every task
//! (they are forgotten after their time to live, a day at most, and a sweep notices).

use super::{readable, ErrorKind, OpError, Principal, Recounts};
use crosstalk_actors::records::{Kind, RecordStore};
use crosstalk_actors::{RelayError, StoreError};
use crosstalk_schema::task::{TaskRecord, TaskState};
use crosstalk_schema::{codec, Timestamp};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Task records one principal may hold (working or finished, until they expire): the bound
/// on what a client can make the relay keep.
pub const MAX_TASKS_PER_PRINCIPAL: usize = 1_000;

/// Records read at a time by what reads every task (start-up, the sweep), a page at a time
/// ([`RecordStore::list_after`]): a store's plain listing stops at `MAX_LISTED`, and tasks past
/// it were never swept. As large as that listing, so that up to it a sweep costs what it did
/// (on a cluster each page has the leader name every key again).
const PAGE: usize = crosstalk_actors::records::MAX_LISTED;

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    Timestamp::now().millis()
}

fn decode(bytes: &[u8]) -> Result<TaskRecord, RelayError> {
    TaskRecord::decode(bytes)
        .map_err(|e| RelayError::Store(StoreError::Corrupt(format!("a stored task is damaged: {e}"))))
}

/// The part of a task's id that names its owner: the first 8 bytes of the SHA-256 of the
/// owner's key, in hex. Two owners sharing one only share a listing's reads (each record
/// names its owner, which is what is checked).
pub fn owner_group(owner: &str) -> String {
    super::digest_hex(owner, 8)
}

/// Whether a stored task's key is an earlier release's, with no owner group.
fn is_legacy(key: &str) -> bool {
    !key.contains('.')
}

/// The tasks' records, with this node's count of each principal's.
#[derive(Clone)]
pub struct TaskStore {
    store: Arc<dyn RecordStore>,
    held: Arc<Mutex<HashMap<String, usize>>>,
    /// Whether a record an earlier release made (its key has no owner group) may be stored:
    /// then a listing reads every task, as that release's did. True until a full listing
    /// ([`TaskStore::load`], each [`TaskStore::sweep`]) finds none.
    legacy: Arc<AtomicBool>,
    /// Owners counted again from the store at their limit lately: at most one listing per
    /// owner per [`super::RECOUNT_EVERY`], however often it asks.
    recounts: Arc<Recounts>,
    /// Records a page of [`TaskStore::pages`] holds.
    page: usize,
}

/// Every stored task, a page at a time, in key order ([`TaskStore::pages`]).
struct Pages<'a> {
    tasks: &'a TaskStore,
    after: Option<String>,
    done: bool,
}

impl Pages<'_> {
    async fn next(&mut self) -> Result<Option<Vec<(String, Vec<u8>)>>, RelayError> {
        if self.done {
            return Ok(None);
        }
        let (store, size) = (&self.tasks.store, self.tasks.page);
        let page = store.list_after(Kind::Tasks, self.after.take(), size).await?;
        // A page shorter than asked for is the last.
        self.done = page.len() < size;
        self.after = page.last().map(|(k, _)| k.clone());
        Ok(Some(page))
    }
}

/// A record as read, with its stored bytes: what a compare-and-set compares against.
#[derive(Debug, Clone)]
pub struct Read {
    pub record: TaskRecord,
    bytes: Vec<u8>,
}

impl TaskStore {
    pub fn new(store: Arc<dyn RecordStore>) -> Self {
        TaskStore {
            store,
            held: Default::default(),
            legacy: Arc::new(AtomicBool::new(true)),
            recounts: Default::default(),
            page: PAGE,
        }
    }

    /// This store, reading every task `page` records at a time.
    #[cfg(test)]
    fn paging_by(mut self, page: usize) -> Self {
        self.page = page.max(1);
        self
    }

    /// Every stored task, read a page at a time: what start-up and the sweep read.
    fn pages(&self) -> Pages<'_> {
        Pages {
            tasks: self,
            after: None,
            done: false,
        }
    }

    /// This store, counting an owner again at its limit at most once per `every`.
    #[cfg(test)]
    fn recounting_every(mut self, every: std::time::Duration) -> Self {
        self.recounts = Arc::new(Recounts::every(every));
        self
    }

    /// A new task's id (its record's key): `<owner group>.<uuid>`.
    pub fn new_id(owner: &str) -> String {
        format!("{}.{}", owner_group(owner), uuid::Uuid::new_v4().simple())
    }

    /// Every stored task, counting each principal's.
    #[cfg(test)]
    async fn load(&self) -> Result<Vec<TaskRecord>, RelayError> {
        self.load_only(|_| true).await
    }

    /// Counts each principal's stored tasks, read once at start, and answers those `keep`
    /// holds (this node's working tasks), so that start-up does not keep every task in memory.
    pub async fn load_only(&self, keep: impl Fn(&TaskRecord) -> bool) -> Result<Vec<TaskRecord>, RelayError> {
        let (mut kept, mut held, mut legacy) = (Vec::new(), HashMap::new(), false);
        let mut pages = self.pages();
        while let Some(page) = pages.next().await? {
            legacy |= page.iter().any(|(key, _)| is_legacy(key));
            for r in readable::<TaskRecord>(page) {
                *held.entry(r.owner.clone()).or_default() += 1;
                if keep(&r) {
                    kept.push(r);
                }
            }
        }
        self.legacy.store(legacy, Ordering::Relaxed);
        *self.held.lock() = held;
        Ok(kept)
    }

    /// Whether `owner` may make another task (checked before a task's question is posted).
    /// This node's count answers at once below the limit; at it, the store is counted first.
    pub async fn has_room(&self, owner: &str) -> Result<bool, RelayError> {
        Ok(self.count(owner).await? < MAX_TASKS_PER_PRINCIPAL)
    }

    /// This node's count of `owner`'s tasks; at the limit, counted again from the store
    /// first (at most once per [`super::RECOUNT_EVERY`]). On a cluster this node's count is
    /// only what it loaded and made: another node's sweep may have forgotten some of them
    /// since, and without the recount the owner was refused for tasks it no longer held.
    async fn count(&self, owner: &str) -> Result<usize, RelayError> {
        let n = self.held.lock().get(owner).copied().unwrap_or(0);
        if n < MAX_TASKS_PER_PRINCIPAL || self.recounts.recent(owner) {
            return Ok(n);
        }
        self.recounts.counted(owner);
        let n = self.stored_of(owner).await?.len();
        let mut held = self.held.lock();
        match n {
            0 => held.remove(owner),
            n => held.insert(owner.to_owned(), n),
        };
        Ok(n)
    }

    /// `owner`'s stored tasks: its group, or every task's while an earlier release's may be
    /// stored (its id names no group).
    async fn stored_of(&self, owner: &str) -> Result<Vec<TaskRecord>, RelayError> {
        let listed = if self.legacy.load(Ordering::Relaxed) {
            self.store.list(Kind::Tasks).await?
        } else {
            self.store.list_group(Kind::Tasks, owner_group(owner)).await?
        };
        let mut mine = readable::<TaskRecord>(listed);
        mine.retain(|r| r.owner == owner);
        Ok(mine)
    }

    /// Stores a new task, or refuses when its owner already holds too many.
    pub async fn create(&self, record: &TaskRecord) -> Result<(), OpError> {
        self.count(&record.owner).await?;
        {
            let mut held = self.held.lock();
            let n = held.entry(record.owner.clone()).or_default();
            if *n >= MAX_TASKS_PER_PRINCIPAL {
                return Err(OpError::new(
                    ErrorKind::LimitReached,
                    format!(
                        "this token already holds {MAX_TASKS_PER_PRINCIPAL} tasks; finished ones are forgotten after their ttl"
                    ),
                ));
            }
            *n += 1;
        }
        let stored = self
            .store
            .put(Kind::Tasks, record.id.clone(), codec::encode(record))
            .await;
        if stored.is_err() {
            self.forget_one(&record.owner);
        }
        Ok(stored?)
    }

    fn forget_one(&self, owner: &str) {
        let mut held = self.held.lock();
        if let Some(n) = held.get_mut(owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(owner);
            }
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<Read>, RelayError> {
        let Some(bytes) = self.store.get(Kind::Tasks, id.to_owned()).await? else {
            return Ok(None);
        };
        Ok(Some(Read {
            record: decode(&bytes)?,
            bytes,
        }))
    }

    /// The task `id` if `principal` owns it; one it does not own is not found, as one that
    /// does not exist.
    pub async fn owned(&self, principal: &Principal, id: &str) -> Result<Read, OpError> {
        match self.get(id).await? {
            Some(r) if r.record.owner == principal.key() => Ok(r),
            _ => Err(OpError::not_found(format!(
                "no task {id:?} of yours (it may have expired)"
            ))),
        }
    }

    /// Settles a working task: `next` replaces `current` if nobody changed it since it was
    /// read. `false`: someone did (a cancel, another node's runner), and nothing was written.
    pub async fn settle(&self, current: &Read, next: &TaskRecord) -> Result<bool, RelayError> {
        if current.record.state.is_final() {
            return Ok(false);
        }
        self.store
            .swap(
                Kind::Tasks,
                current.record.id.clone(),
                Some(current.bytes.clone()),
                Some(codec::encode(next)),
            )
            .await
    }

    /// Cancels a working task of `principal`'s; a finished one is refused (it stays as it is).
    pub async fn cancel(&self, principal: &Principal, id: &str) -> Result<TaskRecord, OpError> {
        for _ in 0..8 {
            let current = self.owned(principal, id).await?;
            if current.record.state.is_final() {
                return Err(OpError::new(
                    ErrorKind::Conflict,
                    format!(
                        "task {id:?} is already {}; it cannot be cancelled",
                        current.record.state.as_str()
                    ),
                ));
            }
            let next = current.record.settled(
                TaskState::Cancelled,
                None,
                Some("Cancelled by its client.".into()),
                now_ms(),
            );
            if self.settle(&current, &next).await? {
                return Ok(next);
            }
        }
        Err(OpError::new(
            ErrorKind::Unavailable,
            "the task kept changing; try again",
        ))
    }

    /// `principal`'s tasks, newest first.
    pub async fn list_owned(&self, principal: &Principal) -> Result<Vec<TaskRecord>, RelayError> {
        let mut mine = self.stored_of(principal.key()).await?;
        mine.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then_with(|| b.id.cmp(&a.id)));
        Ok(mine)
    }

    /// Forgets the records whose time to live has passed; answers how many.
    pub async fn sweep(&self, now: i64) -> Result<usize, RelayError> {
        let (mut gone, mut legacy) = (0, false);
        let mut pages = self.pages();
        while let Some(page) = pages.next().await? {
            for (key, bytes) in page {
                let old = is_legacy(&key);
                let Ok(r) = decode(&bytes) else {
                    legacy |= old;
                    continue;
                };
                if r.expired(now) && self.store.swap(Kind::Tasks, key, Some(bytes), None).await? {
                    self.forget_one(&r.owner);
                    gone += 1;
                } else {
                    legacy |= old;
                }
            }
        }
        // Also set again when a node of an earlier release made one since the last sweep.
        self.legacy.store(legacy, Ordering::Relaxed);
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::memory::Memory;

    fn record(id: &str, owner: &str, created_ms: i64) -> TaskRecord {
        TaskRecord {
            id: id.into(),
            owner: owner.into(),
            face: "mcp".into(),
            tool: "wait_for_message".into(),
            run: "{}".into(),
            bound: None,
            state: TaskState::Working,
            message: None,
            result: None,
            created_ms,
            updated_ms: created_ms,
            deadline_ms: created_ms + 1_000,
            ttl_ms: 10_000,
            node: "n".into(),
            grant: None,
        }
    }

    /// Start-up and the sweep read every task a page at a time: a store's listing stops at
    /// `MAX_LISTED` records, and the tasks past it were never counted nor swept (their owners'
    /// counts stayed up, their records stayed for good).
    #[tokio::test]
    async fn every_task_is_counted_and_swept_however_many_a_listing_holds() {
        // A store whose listings stop at 10 records; 25 tasks of 5 owners, read 4 at a time.
        let store = Arc::new(Memory::listing_at_most(10));
        let tasks = TaskStore::new(store.clone()).paging_by(4);
        for i in 0..25 {
            let owner = format!("owner-{}", i % 5);
            let mut r = record(&TaskStore::new_id(&owner), &owner, 0);
            r.ttl_ms = 1_000 + i;
            store.put(Kind::Tasks, r.id.clone(), codec::encode(&r)).await.unwrap();
        }
        assert_eq!(tasks.load().await.unwrap().len(), 25, "every task loaded");
        for i in 0..5 {
            assert_eq!(tasks.count(&format!("owner-{i}")).await.unwrap(), 5, "owner-{i}");
        }
        // Not yet expired: nothing goes. Then the first 12 by time to live, then the rest.
        assert_eq!(tasks.sweep(0).await.unwrap(), 0);
        assert_eq!(tasks.sweep(1_011).await.unwrap(), 12);
        assert_eq!(tasks.sweep(10_000).await.unwrap(), 13);
        assert!(store.list(Kind::Tasks).await.unwrap().is_empty(), "every record swept");
        for i in 0..5 {
            assert_eq!(tasks.count(&format!("owner-{i}")).await.unwrap(), 0, "owner-{i}");
        }
    }

    #[tokio::test]
    async fn a_task_is_settled_once_owned_by_one_principal_and_forgotten_after_its_ttl() {
        let tasks = TaskStore::new(Arc::new(Memory::default()));
        let alice = Principal::Participant("alice".into());
        let bob = Principal::Participant("bob".into());
        tasks.create(&record("t1", "alice", 0)).await.unwrap();
        // Not bob's: not found, as an unknown one.
        assert_eq!(tasks.owned(&bob, "t1").await.unwrap_err().kind, ErrorKind::NotFound);
        assert_eq!(tasks.cancel(&bob, "t1").await.unwrap_err().kind, ErrorKind::NotFound);
        // Two settlers race from the same read: the first wins, the second writes nothing.
        let read = tasks.owned(&alice, "t1").await.unwrap();
        let done = read.record.settled(TaskState::Completed, Some("{}".into()), None, 5);
        assert!(tasks.settle(&read, &done).await.unwrap());
        let late = read.record.settled(TaskState::Failed, None, None, 6);
        assert!(!tasks.settle(&read, &late).await.unwrap());
        assert_eq!(
            tasks.owned(&alice, "t1").await.unwrap().record.state,
            TaskState::Completed
        );
        // A finished task cannot be cancelled.
        assert_eq!(tasks.cancel(&alice, "t1").await.unwrap_err().kind, ErrorKind::Conflict);
        tasks.create(&record("t2", "alice", 100)).await.unwrap();
        assert_eq!(tasks.cancel(&alice, "t2").await.unwrap().state, TaskState::Cancelled);
        let listed: Vec<_> = tasks
            .list_owned(&alice)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(listed, ["t2", "t1"], "newest first");
        assert!(tasks.list_owned(&bob).await.unwrap().is_empty());
        // Past t1's ttl (created 0 + 10 s), not t2's.
        assert_eq!(tasks.sweep(10_050).await.unwrap(), 1);
        assert!(tasks.get("t1").await.unwrap().is_none());
        assert!(tasks.get("t2").await.unwrap().is_some());
    }

    fn ids(records: Vec<TaskRecord>) -> Vec<String> {
        records.into_iter().map(|r| r.id).collect()
    }

    #[tokio::test]
    async fn a_principals_listing_reads_its_own_tasks_only() {
        let store = Arc::new(Memory::default());
        let tasks = TaskStore::new(store.clone());
        for owner in (0..40).map(|i| format!("p{i}")) {
            for at in 0..25 {
                let id = TaskStore::new_id(&owner);
                assert!(id.starts_with(&format!("{}.", owner_group(&owner))), "{id}");
                tasks.create(&record(&id, &owner, at)).await.unwrap();
            }
        }
        assert_eq!(tasks.load().await.unwrap().len(), 1_000);
        store.take_listed();
        let p7 = Principal::Participant("p7".into());
        assert_eq!(p7.key(), "p7");
        let mine = tasks.list_owned(&p7).await.unwrap();
        assert_eq!(mine.len(), 25);
        assert!(mine.iter().all(|r| r.owner == "p7"));
        assert!(
            mine.windows(2).all(|w| w[0].created_ms >= w[1].created_ms),
            "newest first"
        );
        assert_eq!(store.take_listed(), 25, "the 975 records of 39 others are not read");
    }

    #[tokio::test]
    async fn a_task_an_earlier_release_made_is_listed_until_it_is_forgotten() {
        let store = Arc::new(Memory::default());
        let tasks = TaskStore::new(store.clone());
        let alice = Principal::Participant("alice".into());
        // An earlier release's id is a bare uuid; it lives 10 s.
        let old = "0123456789abcdef0123456789abcdef";
        store
            .put(Kind::Tasks, old.into(), codec::encode(&record(old, "alice", 0)))
            .await
            .unwrap();
        let new = TaskStore::new_id("alice");
        let mut fresh = record(&new, "alice", 5_000);
        fresh.ttl_ms = 60_000;
        tasks.create(&fresh).await.unwrap();
        let mut bobs = record(&TaskStore::new_id("bob"), "bob", 5_000);
        bobs.ttl_ms = 60_000;
        tasks.create(&bobs).await.unwrap();
        tasks.load().await.unwrap();
        store.take_listed();
        assert_eq!(
            ids(tasks.list_owned(&alice).await.unwrap()),
            [new.clone(), old.to_owned()]
        );
        assert_eq!(store.take_listed(), 3, "while one is stored, every task is read");
        // Forgotten after its ttl: from then on a listing reads alice's group only.
        assert_eq!(tasks.sweep(10_050).await.unwrap(), 1);
        store.take_listed();
        assert_eq!(ids(tasks.list_owned(&alice).await.unwrap()), std::slice::from_ref(&new));
        assert_eq!(store.take_listed(), 1);
        // One made since by a node of that release is seen again at the next sweep.
        let late = "fedcba9876543210fedcba9876543210";
        let mut made = record(late, "alice", 20_000);
        made.ttl_ms = 60_000;
        store.put(Kind::Tasks, late.into(), codec::encode(&made)).await.unwrap();
        assert_eq!(tasks.sweep(20_000).await.unwrap(), 0);
        assert_eq!(ids(tasks.list_owned(&alice).await.unwrap()), [late.to_owned(), new]);
    }

    /// Two nodes on one cluster's records: what one node's sweep forgets, the other still
    /// counted, and refused its owner for tasks the owner no longer held.
    #[tokio::test]
    async fn tasks_another_node_forgot_are_not_held_against_their_owner() {
        let shared = Arc::new(Memory::default());
        let a = TaskStore::new(shared.clone()).recounting_every(std::time::Duration::ZERO);
        let b = TaskStore::new(shared);
        for _ in 0..MAX_TASKS_PER_PRINCIPAL {
            a.create(&record(&TaskStore::new_id("alice"), "alice", 0))
                .await
                .unwrap();
        }
        a.load().await.unwrap();
        b.load().await.unwrap();
        assert!(!a.has_room("alice").await.unwrap());
        // Node b's sweep wins every record: node a's count is not told.
        assert_eq!(b.sweep(20_000).await.unwrap(), MAX_TASKS_PER_PRINCIPAL);
        assert!(a.has_room("alice").await.unwrap());
        // The recount is node a's count again: the limit still holds on it.
        for _ in 0..MAX_TASKS_PER_PRINCIPAL {
            a.create(&record(&TaskStore::new_id("alice"), "alice", 20_000))
                .await
                .unwrap();
        }
        let e = a
            .create(&record(&TaskStore::new_id("alice"), "alice", 20_000))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::LimitReached);
        // Its own sweep makes room, as before.
        assert_eq!(a.sweep(40_000).await.unwrap(), MAX_TASKS_PER_PRINCIPAL);
        a.create(&record(&TaskStore::new_id("alice"), "alice", 40_000))
            .await
            .unwrap();
        assert!(a.has_room("alice").await.unwrap());
    }

    /// A token at its limit asking again and again is counted from the store once per
    /// interval, not once per request: each count is a listing of its tasks.
    #[tokio::test]
    async fn a_token_at_its_limit_is_counted_again_once_per_interval() {
        let store = Arc::new(Memory::default());
        let tasks = TaskStore::new(store.clone());
        for _ in 0..MAX_TASKS_PER_PRINCIPAL {
            tasks
                .create(&record(&TaskStore::new_id("alice"), "alice", 0))
                .await
                .unwrap();
        }
        tasks.load().await.unwrap();
        store.take_listed();
        for _ in 0..50 {
            assert!(!tasks.has_room("alice").await.unwrap());
            let e = tasks
                .create(&record(&TaskStore::new_id("alice"), "alice", 0))
                .await
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::LimitReached);
        }
        assert_eq!(
            store.take_listed(),
            MAX_TASKS_PER_PRINCIPAL,
            "one count of alice's tasks"
        );
    }

    #[tokio::test]
    async fn a_principal_holds_a_bounded_number_of_tasks() {
        let tasks = TaskStore::new(Arc::new(Memory::default()));
        for i in 0..MAX_TASKS_PER_PRINCIPAL {
            tasks.create(&record(&format!("t{i}"), "alice", 0)).await.unwrap();
        }
        assert!(!tasks.has_room("alice").await.unwrap());
        let e = tasks.create(&record("one-more", "alice", 0)).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::LimitReached);
        assert!(tasks.has_room("bob").await.unwrap(), "the bound is per principal");
        // Forgotten ones make room again; a restart counts what is stored.
        assert_eq!(tasks.sweep(20_000).await.unwrap(), MAX_TASKS_PER_PRINCIPAL);
        assert!(tasks.has_room("alice").await.unwrap());
        tasks.create(&record("again", "alice", 20_000)).await.unwrap();
        assert_eq!(tasks.load().await.unwrap().len(), 1);
    }
}
