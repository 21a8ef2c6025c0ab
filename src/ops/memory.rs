//! Records in memory, for the rules' own tests (`ops::oauth`, `ops::tasks`, `ops::wake`,
//! `ops::webhooks`), counting what they are asked: a test of what a rule costs reads the
//! counts.

use crosstalk_actors::records::{Answer, Kind, RecordStore};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Records in memory, for the rules' own tests.
#[derive(Default)]
pub struct Memory {
    records: Mutex<BTreeMap<(u8, String), Vec<u8>>>,
    /// Reads (`get`, `take`, `list`, `list_group`, `list_after`) asked of each kind, by its tag.
    reads: Mutex<BTreeMap<u8, usize>>,
    /// Records handed out by listings, since [`Memory::take_listed`].
    listed: AtomicUsize,
    /// Most records `list` and `list_group` hand out, as a store's listing stops at
    /// `MAX_LISTED` ([`Memory::listing_at_most`]; `None`: `MAX_LISTED`).
    most: Option<usize>,
}

impl Memory {
    /// A store whose listings stop at `most` records, as every store's stops at `MAX_LISTED`.
    pub fn listing_at_most(most: usize) -> Self {
        Memory {
            most: Some(most),
            ..Memory::default()
        }
    }

    /// Reads asked of `kind` so far.
    pub fn reads(&self, kind: Kind) -> usize {
        self.reads.lock().get(&kind.tag().0).copied().unwrap_or(0)
    }

    /// Records the listings handed out since the last call.
    pub fn take_listed(&self) -> usize {
        self.listed.swap(0, Relaxed)
    }

    fn read(&self, kind: Kind) {
        *self.reads.lock().entry(kind.tag().0).or_default() += 1;
    }

    fn listing(&self, kind: Kind, keep: impl Fn(&str) -> bool) -> Answer<Vec<(String, Vec<u8>)>> {
        self.read(kind);
        let v: Vec<_> = self
            .records
            .lock()
            .iter()
            .filter(|((k, key), _)| *k == kind.tag().0 && keep(key))
            .take(self.most.unwrap_or(crosstalk_actors::records::MAX_LISTED))
            .map(|((_, key), v)| (key.clone(), v.clone()))
            .collect();
        self.listed.fetch_add(v.len(), Relaxed);
        Box::pin(async move { Ok(v) })
    }
}

impl RecordStore for Memory {
    fn get(&self, kind: Kind, key: String) -> Answer<Option<Vec<u8>>> {
        self.read(kind);
        let v = self.records.lock().get(&(kind.tag().0, key)).cloned();
        Box::pin(async move { Ok(v) })
    }
    fn put(&self, kind: Kind, key: String, value: Vec<u8>) -> Answer<()> {
        self.records.lock().insert((kind.tag().0, key), value);
        Box::pin(async { Ok(()) })
    }
    fn delete(&self, kind: Kind, key: String) -> Answer<()> {
        self.records.lock().remove(&(kind.tag().0, key));
        Box::pin(async { Ok(()) })
    }
    fn take(&self, kind: Kind, key: String) -> Answer<Option<Vec<u8>>> {
        self.read(kind);
        let v = self.records.lock().remove(&(kind.tag().0, key));
        Box::pin(async move { Ok(v) })
    }
    fn swap(&self, kind: Kind, key: String, expected: Option<Vec<u8>>, new: Option<Vec<u8>>) -> Answer<bool> {
        let mut map = self.records.lock();
        let k = (kind.tag().0, key);
        let ok = map.get(&k) == expected.as_ref();
        if ok {
            match new {
                Some(v) => map.insert(k, v),
                None => map.remove(&k),
            };
        }
        Box::pin(async move { Ok(ok) })
    }
    fn list(&self, kind: Kind) -> Answer<Vec<(String, Vec<u8>)>> {
        self.listing(kind, |_| true)
    }
    fn list_after(&self, kind: Kind, after: Option<String>, max: usize) -> Answer<Vec<(String, Vec<u8>)>> {
        self.read(kind);
        let from = (kind.tag().0, after.clone().unwrap_or_default());
        let v: Vec<_> = self
            .records
            .lock()
            .range(from..)
            .take_while(|((k, _), _)| *k == kind.tag().0)
            .filter(|((_, key), _)| after.as_ref().is_none_or(|a| key > a))
            .take(max)
            .map(|((_, key), v)| (key.clone(), v.clone()))
            .collect();
        self.listed.fetch_add(v.len(), Relaxed);
        Box::pin(async move { Ok(v) })
    }
    fn list_group(&self, kind: Kind, group: String) -> Answer<Vec<(String, Vec<u8>)>> {
        let ok = crosstalk_actors::records::is_group(&group);
        let prefix = format!("{group}.");
        self.listing(kind, move |key| ok && key.starts_with(&prefix))
    }
}
