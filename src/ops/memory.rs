//! Records in memory, for the rules' own tests (`ops::oauth`, `ops::tasks`).

use crosstalk_actors::records::{Kind, RecordStore};

/// Records in memory, for the rules' own tests.
#[derive(Default)]
pub struct Memory(pub parking_lot::Mutex<std::collections::BTreeMap<(u8, String), Vec<u8>>>);

impl RecordStore for Memory {
    fn get(&self, kind: Kind, key: String) -> crosstalk_actors::records::Answer<Option<Vec<u8>>> {
        let v = self.0.lock().get(&(kind.tag().0, key)).cloned();
        Box::pin(async move { Ok(v) })
    }
    fn put(&self, kind: Kind, key: String, value: Vec<u8>) -> crosstalk_actors::records::Answer<()> {
        self.0.lock().insert((kind.tag().0, key), value);
        Box::pin(async { Ok(()) })
    }
    fn delete(&self, kind: Kind, key: String) -> crosstalk_actors::records::Answer<()> {
        self.0.lock().remove(&(kind.tag().0, key));
        Box::pin(async { Ok(()) })
    }
    fn take(&self, kind: Kind, key: String) -> crosstalk_actors::records::Answer<Option<Vec<u8>>> {
        let v = self.0.lock().remove(&(kind.tag().0, key));
        Box::pin(async move { Ok(v) })
    }
    fn swap(
        &self,
        kind: Kind,
        key: String,
        expected: Option<Vec<u8>>,
        new: Option<Vec<u8>>,
    ) -> crosstalk_actors::records::Answer<bool> {
        let mut map = self.0.lock();
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
    fn list(&self, kind: Kind) -> crosstalk_actors::records::Answer<Vec<(String, Vec<u8>)>> {
        let v = self
            .0
            .lock()
            .iter()
            .filter(|((k, _), _)| *k == kind.tag().0)
            .map(|((_, key), v)| (key.clone(), v.clone()))
            .collect();
        Box::pin(async move { Ok(v) })
    }
    fn list_group(&self, kind: Kind, group: String) -> crosstalk_actors::records::Answer<Vec<(String, Vec<u8>)>> {
        let ok = crosstalk_actors::records::is_group(&group);
        let prefix = format!("{group}.");
        let v = self
            .0
            .lock()
            .iter()
            .filter(|((k, key), _)| ok && *k == kind.tag().0 && key.starts_with(&prefix))
            .map(|((_, key), v)| (key.clone(), v.clone()))
            .collect();
        Box::pin(async move { Ok(v) })
    }
}
