//! Who waits actively on which channel across a relay cluster, for the mutual-wait release, in
//! a key-value bucket (`<STREAM>_WAITS`, key `<channel>.<instance>.<node>`): each node publishes
//! its own active waits and withdraws them when they end, and mirrors the others' into
//! [`ClusterWaits`], so "every active party of the channel is waiting" is decided over the
//! whole cluster. Each node also says it is alive there every [`NODE_ALIVE_EVERY`]: the waits of
//! a node silent for [`NODE_GONE_AFTER`] no longer count.

use super::kv::{hex, unhex, Bucket, Change, Mark};
use crate::error::RelayError;
use crosstalk_schema::ChannelName;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often a cluster node says it is alive in the waits bucket.
pub(super) const NODE_ALIVE_EVERY: Duration = Duration::from_secs(5);
/// A node not heard from for this long is taken for gone: its waits no longer count.
const NODE_GONE_AFTER: Duration = Duration::from_secs(20);
/// The waits of a node that stopped are dropped by the bucket after this long.
pub(super) const WAITS_MAX_AGE: Duration = Duration::from_secs(3600);

/// A change in this node's active waits, for the cluster: `(channel, instance, waiting)`.
pub(super) type WaitNews = (ChannelName, String, bool);

#[derive(Clone)]
pub(super) struct SharedWaits {
    pub bucket: Bucket<Mark>,
    /// This node's id in the keys.
    pub node: String,
}

/// A change in who waits where, as the bucket shows it.
#[derive(Debug, Clone)]
pub(super) struct WaitChange {
    pub node: String,
    pub channel: ChannelName,
    pub instance: String,
    /// `false`: the wait ended.
    pub waiting: bool,
}

/// What the waits bucket tells a node.
#[derive(Debug, Clone)]
pub(super) enum WaitsEvent {
    /// A wait began or ended on another node (or this one).
    Change(WaitChange),
    /// A node said it is alive, `age` ago: waits of a node silent for long are not counted.
    Alive { node: String, age: Duration },
}

impl SharedWaits {
    fn key(&self, channel: &ChannelName, instance: &str) -> String {
        format!("{}.{}.{}", hex(channel.as_str()), hex(instance), self.node)
    }

    /// Publishes that `instance` waits actively on `channel` on this node, or no longer does.
    pub async fn set(&self, channel: &ChannelName, instance: &str, waiting: bool) -> Result<(), RelayError> {
        let key = self.key(channel, instance);
        if waiting {
            self.bucket.put(&key, &Mark).await
        } else {
            self.bucket.delete(&key).await
        }
    }

    /// Says this node is alive (every few seconds while it runs).
    pub async fn alive(&self) -> Result<(), RelayError> {
        self.bucket.put(&format!("node.{}", self.node), &Mark).await
    }

    /// Every wait and node heartbeat, then each change as it happens.
    pub async fn watch(&self) -> Result<impl futures_util::Stream<Item = WaitsEvent> + Unpin, RelayError> {
        self.bucket.watch(waits_event).await
    }
}

fn waits_event(change: Change<Mark>) -> Option<WaitsEvent> {
    // A channel's key part is hex, so never "node".
    if let Some(node) = change.key.strip_prefix("node.") {
        change.value.as_ref()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let age = u64::try_from(now - change.created_ns).unwrap_or(0);
        return Some(WaitsEvent::Alive {
            node: node.to_owned(),
            age: Duration::from_nanos(age),
        });
    }
    let mut parts = change.key.splitn(3, '.');
    let (channel, instance, node) = (parts.next()?, parts.next()?, parts.next()?);
    Some(WaitsEvent::Change(WaitChange {
        node: node.to_owned(),
        channel: ChannelName::parse(&unhex(channel)?).ok()?,
        instance: unhex(instance)?,
        waiting: change.value.is_some(),
    }))
}

/// On a cluster node: the active waits on the other nodes (channel → instance → nodes), as the
/// shared bucket shows them, when each node last said it is alive, and the queue of this
/// node's own changes to publish, in order.
pub(super) struct ClusterWaits {
    others: parking_lot::Mutex<HashMap<ChannelName, HashMap<String, HashSet<String>>>>,
    alive: parking_lot::Mutex<HashMap<String, Instant>>,
    publish: mpsc::UnboundedSender<WaitNews>,
}

impl ClusterWaits {
    pub fn new() -> (ClusterWaits, mpsc::UnboundedReceiver<WaitNews>) {
        let (publish, rx) = mpsc::unbounded_channel();
        let waits = ClusterWaits {
            others: Default::default(),
            alive: Default::default(),
            publish,
        };
        (waits, rx)
    }

    pub fn publish(&self, channel: &ChannelName, instance: &str, waiting: bool) {
        let _ = self.publish.send((channel.clone(), instance.to_owned(), waiting));
    }

    /// The instances waiting actively on `channel` on other nodes that are alive.
    pub fn elsewhere(&self, channel: &ChannelName) -> Vec<String> {
        let alive = self.alive.lock();
        let live = |node: &String| alive.get(node).is_some_and(|at| at.elapsed() < NODE_GONE_AFTER);
        self.others
            .lock()
            .get(channel)
            .map(|m| {
                m.iter()
                    .filter(|(_, nodes)| nodes.iter().any(live))
                    .map(|(instance, _)| instance.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Takes in what the bucket says (this node's own waits, `own`, are skipped); answers the
    /// channels whose counted waits changed: a wait's, or every channel a node that comes
    /// back (or is first heard from) waits on.
    pub fn merge(&self, event: WaitsEvent, own: &str) -> Vec<ChannelName> {
        match event {
            WaitsEvent::Alive { node, age } => {
                let at = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
                let was_live = self
                    .alive
                    .lock()
                    .insert(node.clone(), at)
                    .is_some_and(|before| before.elapsed() < NODE_GONE_AFTER);
                if was_live {
                    return Vec::new();
                }
                self.others
                    .lock()
                    .iter()
                    .filter(|(_, waits)| waits.values().any(|nodes| nodes.contains(&node)))
                    .map(|(channel, _)| channel.clone())
                    .collect()
            }
            WaitsEvent::Change(change) => {
                let channel = change.channel.clone();
                if self.merge_change(change, own) {
                    vec![channel]
                } else {
                    Vec::new()
                }
            }
        }
    }

    fn merge_change(&self, change: WaitChange, own: &str) -> bool {
        if change.node == own {
            return false;
        }
        let mut others = self.others.lock();
        if change.waiting {
            let nodes = others
                .entry(change.channel)
                .or_default()
                .entry(change.instance)
                .or_default();
            return nodes.insert(change.node);
        }
        let Some(instances) = others.get_mut(&change.channel) else {
            return false;
        };
        let removed = instances
            .get_mut(&change.instance)
            .is_some_and(|nodes| nodes.remove(&change.node));
        instances.retain(|_, nodes| !nodes.is_empty());
        if instances.is_empty() {
            others.remove(&change.channel);
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(node: &str, instance: &str, waiting: bool) -> WaitsEvent {
        WaitsEvent::Change(WaitChange {
            node: node.into(),
            channel: ChannelName::parse("dev").unwrap(),
            instance: instance.into(),
            waiting,
        })
    }

    fn alive(node: &str, secs: u64) -> WaitsEvent {
        WaitsEvent::Alive {
            node: node.into(),
            age: Duration::from_secs(secs),
        }
    }

    #[test]
    fn only_live_nodes_waits_count_and_a_node_coming_back_is_looked_at_again() {
        let (waits, _news) = ClusterWaits::new();
        let dev = ChannelName::parse("dev").unwrap();
        assert!(waits.merge(alive("a", 0), "me").is_empty(), "no waits of a yet");
        assert_eq!(waits.merge(wait("a", "alice", true), "me"), vec![dev.clone()]);
        assert_eq!(waits.elsewhere(&dev), vec!["alice".to_owned()]);
        // This node's own waits come back through the bucket: skipped.
        assert!(waits.merge(wait("me", "bob", true), "me").is_empty());
        // A node last heard from long ago: its waits do not count...
        waits.merge(alive("b", 60), "me");
        waits.merge(wait("b", "carl", true), "me");
        assert_eq!(waits.elsewhere(&dev), vec!["alice".to_owned()]);
        // ...until it is heard from again, which makes its channels look again.
        assert_eq!(waits.merge(alive("b", 0), "me"), vec![dev.clone()]);
        let mut now = waits.elsewhere(&dev);
        now.sort();
        assert_eq!(now, ["alice", "carl"]);
        // A wait that ends is gone; a second heartbeat from a live node changes nothing.
        assert_eq!(waits.merge(wait("a", "alice", false), "me"), vec![dev.clone()]);
        assert_eq!(waits.elsewhere(&dev), vec!["carl".to_owned()]);
        assert!(waits.merge(alive("b", 0), "me").is_empty());
    }
}
