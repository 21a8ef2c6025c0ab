//! Registered identities, shared read-mostly: the registry actor is the only writer (it
//! serialises registrations and persists them); every call from an identity checks its
//! binding and records its heartbeat here without an actor round trip.

use crate::error::RelayError;
use crosstalk_schema::{Instance, InstanceKind, Timestamp};
use parking_lot::RwLock;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One registered identity.
pub struct Identity {
    pub instance: Instance,
    /// The session it is bound to (`None` for an identity loaded from the store and not yet
    /// re-registered since the restart: free until someone registers it).
    pub session: Option<String>,
    /// When it was last heard from (µs since the epoch; 0 = not since the restart; negative:
    /// signed off at that time, offline until heard from again).
    seen: AtomicI64,
}

impl Identity {
    pub(crate) fn new(instance: Instance, session: Option<String>, seen: Option<Timestamp>) -> Self {
        Identity {
            instance,
            session,
            seen: AtomicI64::new(seen.map_or(0, |t| t.0)),
        }
    }

    fn seen(&self) -> Option<Timestamp> {
        match self.seen.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Timestamp(us.abs())),
        }
    }
}

/// An instance as `list_instances` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct InstanceView {
    pub instance_id: String,
    pub description: Option<String>,
    pub kind: InstanceKind,
    /// `online` if heard from within the presence TTL, else `offline`.
    pub status: &'static str,
    pub last_seen: Option<String>,
    pub registered_at: String,
}

pub struct Identities {
    map: RwLock<Table>,
    /// Heard from within this long = live.
    ttl: Duration,
}

/// The identities by id, and the ids bound to each session: a call that names nobody asks
/// what its session registered ([`Identities::bound_to`]), and a session's end signs off its
/// identities ([`Identities::sign_off`]), each without going through every identity.
#[derive(Default)]
struct Table {
    by_id: HashMap<String, Arc<Identity>>,
    by_session: HashMap<String, BTreeSet<String>>,
}

impl Table {
    fn get(&self, who: &str) -> Option<&Arc<Identity>> {
        self.by_id.get(who)
    }

    /// Puts `id` in (replacing the identity of that id); returns the one it replaced.
    fn put(&mut self, id: Arc<Identity>) -> Option<Arc<Identity>> {
        let who = id.instance.instance_id.clone();
        let before = self.by_id.insert(who.clone(), id.clone());
        if let Some(old) = before.as_ref().and_then(|b| b.session.as_deref()) {
            self.unbind(old, &who);
        }
        if let Some(session) = &id.session {
            self.by_session.entry(session.clone()).or_default().insert(who);
        }
        before
    }

    fn remove(&mut self, who: &str) -> Option<Arc<Identity>> {
        let before = self.by_id.remove(who);
        if let Some(old) = before.as_ref().and_then(|b| b.session.as_deref()) {
            self.unbind(old, who);
        }
        before
    }

    fn unbind(&mut self, session: &str, who: &str) {
        if let Some(ids) = self.by_session.get_mut(session) {
            ids.remove(who);
            if ids.is_empty() {
                self.by_session.remove(session);
            }
        }
    }

    /// The identities bound to `session`.
    fn of_session<'a>(&'a self, session: &str) -> impl Iterator<Item = &'a Arc<Identity>> + 'a {
        self.by_session
            .get(session)
            .into_iter()
            .flatten()
            .filter_map(|who| self.by_id.get(who))
    }
}

impl Identities {
    pub(crate) fn new(ttl: Duration) -> Self {
        Identities {
            map: RwLock::new(Table::default()),
            ttl,
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn live(&self, id: &Identity) -> bool {
        let seen = id.seen.load(Ordering::Relaxed);
        seen > 0 && Timestamp::now().0 - seen < self.ttl.as_micros() as i64
    }

    /// The identities bound to `session` go offline now (their session ended: the process
    /// behind it exited), rather than when the presence TTL runs out; their names are free to
    /// register at once. Returns their ids.
    pub fn sign_off(&self, session: &str) -> Vec<String> {
        let now = Timestamp::now().0;
        self.map
            .read()
            .of_session(session)
            .map(|i| {
                i.seen.store(-now, Ordering::Relaxed);
                i.instance.instance_id.clone()
            })
            .collect()
    }

    /// Whether `who` is online (heard from within the presence TTL, not signed off); `None`
    /// for an identity never registered.
    pub fn online(&self, who: &str) -> Option<bool> {
        self.get(who).map(|i| self.live(&i))
    }

    pub fn get(&self, who: &str) -> Option<Arc<Identity>> {
        self.map.read().get(who).cloned()
    }

    /// Whether `who` is bound to a live session other than `session`, and not one that
    /// `session` may take it over from: a session whose name starts with `owner` (the same
    /// principal, which has proved it is the same client).
    pub fn live_elsewhere(&self, who: &str, session: Option<&str>, owner: Option<&str>) -> bool {
        self.get(who).is_some_and(|i| {
            let theirs = i.session.as_deref();
            let taken_over = owner.is_some_and(|o| theirs.is_some_and(|t| t.starts_with(o)));
            theirs.is_some() && theirs != session && !taken_over && self.live(&i)
        })
    }

    /// The live identities bound to `session`, at most `most` of them (a caller asking for
    /// "the one" asks for two, to tell one from several).
    pub fn bound_to(&self, session: &str, most: usize) -> Vec<String> {
        self.map
            .read()
            .of_session(session)
            .filter(|i| self.live(i))
            .take(most)
            .map(|i| i.instance.instance_id.clone())
            .collect()
    }

    /// Checks that `session` may act as `who`, and records the heartbeat. An identity bound
    /// to a live session can only be used with that session; an unknown or stale one is free.
    pub fn authorize(&self, who: &str, session: Option<&str>) -> Result<(), RelayError> {
        let Some(id) = self.get(who) else { return Ok(()) };
        if id.session.is_some() && id.session.as_deref() != session {
            if self.live(&id) {
                return Err(RelayError::Forbidden(format!(
                    "instance {who:?} is registered to another session; send that session's token to act as it"
                )));
            }
            return Ok(());
        }
        id.seen.store(Timestamp::now().0, Ordering::Relaxed);
        Ok(())
    }

    /// Takes in what another node of the cluster says about an identity: its binding, and
    /// when it was last heard from (or signed off). For the same binding the later of the two
    /// times wins; a different binding replaces this node's.
    pub(crate) fn merge(&self, instance: Instance, session: Option<String>, seen: i64) {
        let mut map = self.map.write();
        if let Some(cur) = map.get(&instance.instance_id).filter(|c| c.session == session) {
            if seen.abs() > cur.seen.load(Ordering::Relaxed).abs() {
                cur.seen.store(seen, Ordering::Relaxed);
            }
            return;
        }
        map.put(Arc::new(Identity {
            instance,
            session,
            seen: AtomicI64::new(seen),
        }));
    }

    /// Identities bound to a session whose last-heard time changed since `published` says
    /// it was told to the cluster: `(id, session, seen)`. Updates `published`.
    pub(crate) fn heard_since(&self, published: &mut HashMap<String, i64>) -> Vec<(String, String, i64)> {
        let mut out = Vec::new();
        for (id, i) in self.map.read().by_id.iter() {
            let (Some(session), seen) = (&i.session, i.seen.load(Ordering::Relaxed)) else {
                continue;
            };
            if seen != 0 && published.get(id) != Some(&seen) {
                published.insert(id.clone(), seen);
                out.push((id.clone(), session.clone(), seen));
            }
        }
        out
    }

    /// Inserts (or replaces) an identity; returns the one it replaced.
    pub(crate) fn insert(&self, id: Identity) -> Option<Arc<Identity>> {
        self.map.write().put(Arc::new(id))
    }

    /// Puts back what `who` was before a registration that did not become durable.
    pub(crate) fn restore(&self, who: &str, before: Option<Arc<Identity>>) {
        let mut map = self.map.write();
        match before {
            Some(b) => map.put(b),
            None => map.remove(who),
        };
    }

    pub fn view(&self, id: &Identity) -> InstanceView {
        InstanceView {
            instance_id: id.instance.instance_id.clone(),
            description: id.instance.description.clone(),
            kind: id.instance.kind,
            status: if self.live(id) { "online" } else { "offline" },
            last_seen: id.seen().map(Timestamp::to_rfc3339),
            registered_at: id.instance.registered_at.to_rfc3339(),
        }
    }

    /// Identities and sessions in the index (for tests of its upkeep).
    #[cfg(test)]
    fn table_sizes(&self) -> (usize, usize) {
        let t = self.map.read();
        (t.by_id.len(), t.by_session.len())
    }

    /// Every known instance, by id.
    pub fn list(&self) -> Vec<InstanceView> {
        let mut list: Vec<InstanceView> = self.map.read().by_id.values().map(|i| self.view(i)).collect();
        list.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(who: &str, session: &str) -> Identity {
        let instance = Instance {
            instance_id: who.into(),
            description: None,
            kind: InstanceKind::Agent,
            registered_at: Timestamp::now(),
        };
        Identity::new(instance, Some(session.into()), Some(Timestamp::now()))
    }

    /// The session index follows every change of binding: a registration, a move to
    /// another session, a registration taken back, a cluster's word, a sign-off.
    #[test]
    fn the_session_index_follows_every_binding() {
        let ids = Identities::new(Duration::from_secs(60));
        ids.insert(identity("a", "s1"));
        ids.insert(identity("b", "s1"));
        assert_eq!(ids.bound_to("s1", 3), ["a", "b"]);
        let before = ids.insert(identity("a", "s2"));
        assert_eq!(
            (ids.bound_to("s1", 3), ids.bound_to("s2", 3)),
            (vec!["b".to_owned()], vec!["a".to_owned()])
        );
        ids.restore("a", before);
        assert_eq!(ids.bound_to("s1", 3), ["a", "b"]);
        assert!(ids.bound_to("s2", 3).is_empty(), "a taken back leaves s2");
        ids.restore("b", None);
        assert_eq!(ids.bound_to("s1", 3), ["a"]);
        ids.merge(identity("a", "s3").instance, Some("s3".into()), Timestamp::now().0);
        assert!(ids.bound_to("s1", 3).is_empty());
        assert_eq!(ids.sign_off("s3"), ["a"]);
        assert!(ids.bound_to("s3", 3).is_empty(), "signed off: not live");
        assert_eq!(ids.table_sizes(), (1, 1));
    }
}
