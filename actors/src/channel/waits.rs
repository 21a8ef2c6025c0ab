//! Wait coordination on a channel: one wait per identity (a newer one supersedes the older),
//! roles, and releasing one party when every active party is waiting and nobody speaks. On a
//! cluster node the other nodes' active waits count too ([`crate::cluster::Cluster`]): the
//! party released is the same on every node, and the node holding its wait releases it.

use super::ChannelActor;
use actix::prelude::*;
use std::collections::HashSet;
use std::time::Instant;
use tokio::sync::oneshot;

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
        self.config.cluster.publish_wait(self.view.name(), instance, waiting);
    }

    /// The active parties, and whether each waits actively (here or on another node).
    fn parties_waiting(&self) -> Vec<(String, bool)> {
        let elsewhere: HashSet<String> = self
            .config
            .cluster
            .waiting_elsewhere(self.view.name())
            .into_iter()
            .collect();
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
