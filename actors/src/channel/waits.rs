//! Wait coordination on a channel: one wait per identity (a newer one supersedes the older),
//! roles, and releasing one party when every active party is waiting and nobody speaks. On a
//! cluster node the other nodes' active waits count too ([`ClusterWaits`]): the party released
//! is the same on every node, and the node holding its wait releases it.

use super::ChannelActor;
use crate::nats::{WaitChange, WaitsEvent};
use actix::prelude::*;
use crosstalk_schema::ChannelName;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// A change in this node's active waits, for the cluster: `(channel, instance, waiting)`.
pub type WaitNews = (ChannelName, String, bool);

/// How often a cluster node says it is alive in the waits bucket.
pub const NODE_ALIVE_EVERY: Duration = Duration::from_secs(5);
/// A node not heard from for this long is taken for gone: its waits no longer count.
const NODE_GONE_AFTER: Duration = Duration::from_secs(20);

/// On a cluster node: the active waits on the other nodes (channel → instance → nodes), as the
/// shared bucket shows them, when each node last said it is alive, and the queue of this
/// node's own changes to publish, in order.
pub struct ClusterWaits {
    others: parking_lot::Mutex<HashMap<ChannelName, HashMap<String, HashSet<String>>>>,
    alive: parking_lot::Mutex<HashMap<String, Instant>>,
    publish: mpsc::UnboundedSender<WaitNews>,
}

impl std::fmt::Debug for ClusterWaits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterWaits").finish_non_exhaustive()
    }
}

impl ClusterWaits {
    pub fn new() -> (Arc<ClusterWaits>, mpsc::UnboundedReceiver<WaitNews>) {
        let (publish, rx) = mpsc::unbounded_channel();
        let waits = ClusterWaits {
            others: Default::default(),
            alive: Default::default(),
            publish,
        };
        (Arc::new(waits), rx)
    }

    fn publish(&self, channel: &ChannelName, instance: &str, waiting: bool) {
        let _ = self.publish.send((channel.clone(), instance.to_owned(), waiting));
    }

    /// The instances waiting actively on `channel` on other nodes that are alive.
    fn elsewhere(&self, channel: &ChannelName) -> Vec<String> {
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

/// Look again at whether every active party waits (another node's waits changed).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CheckRelease;

impl Handler<CheckRelease> for ChannelActor {
    type Result = ();

    fn handle(&mut self, _: CheckRelease, ctx: &mut Context<Self>) {
        self.check_release(ctx);
    }
}

/// How a waiting party takes part in mutual-wait detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// A normal party: when every active party waits, one is told to speak first.
    #[default]
    Active,
    /// A background worker: hears everything, never counts as a party.
    Parked,
}

/// Why a wait was ended by the channel rather than by a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitControl {
    /// The same identity started a newer wait on this channel.
    Superseded,
    /// Every active party was waiting and nobody spoke: this one should speak first.
    SpeakFirst,
}

/// Register a wait by `instance`; any earlier wait of the same instance is superseded.
#[derive(Message)]
#[rtype(result = "(u64, oneshot::Receiver<WaitControl>)")]
pub struct BeginWait {
    pub instance: String,
    pub role: Role,
}

/// A wait ended (however it ended).
#[derive(Message)]
#[rtype(result = "()")]
pub struct EndWait {
    pub instance: String,
    pub generation: u64,
}

pub(super) struct Waiter {
    pub(super) generation: u64,
    pub(super) role: Role,
    pub(super) control: oneshot::Sender<WaitControl>,
}

impl ChannelActor {
    /// Tells the other nodes that `instance` waits actively here, or no longer does.
    fn tell_cluster(&self, instance: &str, waiting: bool) {
        if let Some(cluster) = &self.config.cluster_waits {
            cluster.publish(self.view.name(), instance, waiting);
        }
    }

    /// The active parties, and whether each waits actively (here or on another node).
    fn parties_waiting(&self) -> Vec<(String, bool)> {
        let elsewhere: HashSet<String> = self
            .config
            .cluster_waits
            .as_ref()
            .map(|c| c.elsewhere(self.view.name()).into_iter().collect())
            .unwrap_or_default();
        let mut parties: Vec<(String, bool)> = self
            .parties
            .keys()
            .map(|p| {
                let here = self.waiters.get(p).is_some_and(|w| w.role == Role::Active);
                (p.clone(), here || elsewhere.contains(p))
            })
            .collect();
        parties.extend(
            elsewhere
                .into_iter()
                .filter(|p| !self.parties.contains_key(p))
                .map(|p| (p, true)),
        );
        parties
    }

    pub(super) fn check_release(&mut self, ctx: &mut Context<Self>) {
        let ttl = self.config.presence_ttl;
        let waiters = &self.waiters;
        self.parties
            .retain(|p, seen| seen.elapsed() < ttl || waiters.contains_key(p));
        if self.release_timer.is_some() {
            return;
        }
        let parties = self.parties_waiting();
        if parties.len() < 2 || !parties.iter().all(|(_, waiting)| *waiting) {
            return;
        }
        let spoken = self.spoken;
        let handle = ctx.run_later(self.config.release_grace, move |act, ctx| {
            act.release_timer = None;
            if act.spoken != spoken {
                return act.check_release(ctx);
            }
            let parties = act.parties_waiting();
            if parties.len() < 2 || !parties.iter().all(|(_, waiting)| *waiting) {
                return;
            }
            // Deterministic: the smallest instance id speaks first. Every node decides the
            // same; the one holding its wait releases it.
            if let Some(first) = parties.into_iter().map(|(p, _)| p).min() {
                if let Some(w) = act.waiters.remove(&first) {
                    tracing::debug!(channel = %act.view.name(), instance = %first, "mutual wait: released to speak first");
                    let _ = w.control.send(WaitControl::SpeakFirst);
                    act.tell_cluster(&first, false);
                }
            }
        });
        self.release_timer = Some(handle);
    }
}

impl Handler<BeginWait> for ChannelActor {
    type Result = MessageResult<BeginWait>;

    fn handle(&mut self, msg: BeginWait, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(old) = self.waiters.remove(&msg.instance) {
            let _ = old.control.send(WaitControl::Superseded);
            if old.role == Role::Active && msg.role != Role::Active {
                self.tell_cluster(&msg.instance, false);
            }
        }
        if msg.role == Role::Active {
            self.tell_cluster(&msg.instance, true);
        }
        self.next_generation += 1;
        let generation = self.next_generation;
        let (control, rx) = oneshot::channel();
        match msg.role {
            Role::Active => {
                self.parties.insert(msg.instance.clone(), Instant::now());
            }
            Role::Parked => {
                self.parties.remove(&msg.instance);
            }
        }
        self.waiters.insert(
            msg.instance,
            Waiter {
                generation,
                role: msg.role,
                control,
            },
        );
        self.check_release(ctx);
        MessageResult((generation, rx))
    }
}

impl Handler<EndWait> for ChannelActor {
    type Result = ();

    fn handle(&mut self, msg: EndWait, _: &mut Context<Self>) {
        if self
            .waiters
            .get(&msg.instance)
            .is_some_and(|w| w.generation == msg.generation)
        {
            if let Some(w) = self.waiters.remove(&msg.instance) {
                if w.role == Role::Active {
                    self.tell_cluster(&msg.instance, false);
                }
            }
        }
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
