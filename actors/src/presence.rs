//! The presence supervisor: who is on which channel. Every call from a participant is a
//! heartbeat; a participant not heard from within the TTL is dropped. Arrivals and departures
//! are broadcast per channel, for the streams to show.
//!
//! On a cluster node ([`crate::cluster`]) it also publishes the participants heard on this node
//! (on arrival, when who they are changes, and about every third of the TTL while they stay)
//! and mirrors the other nodes' ([`MergePresence`]): a channel's presence is the cluster's, a
//! participant is listed once (as last heard on any node), and leaves when no node has it any
//! more.

use crate::ShrinkAfterBurst;
use actix::prelude::*;
use crosstalk_schema::{ChannelName, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc};

/// Presence changes buffered per channel for slow streams; a stream that falls further
/// behind skips changes (presence is a snapshot away, `ListPresence`).
const EVENTS_CAPACITY: usize = 64;
/// Longest pause between expiry sweeps.
const MAX_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// One participant on one channel, as `GET /api/channels/{channel}/presence` shows it:
/// crosstalk-mcp's fields (`id`, `display_name`, `kind`, `side`, `last_seen` in epoch
/// seconds) and crosstalk's (`participant_id`, `activity`, `last_seen_at`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Participant {
    pub id: String,
    pub participant_id: String,
    /// The name to show; the id unless the participant gave one.
    pub display_name: String,
    /// `agent` or `human`.
    pub kind: String,
    /// The side it said it is on (crosstalk never guesses one from a name).
    pub side: Option<String>,
    /// What it last did: `streaming`, `waiting` or `posted`.
    pub activity: String,
    /// When it was last heard from, in seconds since the epoch.
    pub last_seen: f64,
    /// The same, RFC 3339.
    pub last_seen_at: String,
}

/// A change in who is on a channel.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PresenceEvent {
    Joined { channel: String, participant: Participant },
    Left { channel: String, participant_id: String },
}

struct Entry {
    /// `last_seen` is filled in when listed, not on every heartbeat.
    participant: Participant,
    seen: Instant,
    at: Timestamp,
    /// When this node last published it to the cluster (local entries on a cluster node).
    published: Option<Instant>,
}

/// One participant on one channel as a node last published it to the others.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PresenceRecord {
    pub channel: String,
    pub participant: Participant,
    /// When that node last heard from it, µs since the epoch.
    pub seen: i64,
}

crosstalk_schema::stored!(PresenceRecord => "presence");

/// A change in the cluster's presence, as the other nodes published it.
#[derive(Debug, Clone)]
pub enum PresenceChange {
    /// A participant heard from on `node`.
    Here { node: String, record: PresenceRecord },
    /// A participant that left, or whose node stopped refreshing it.
    Gone {
        node: String,
        channel: ChannelName,
        participant_id: String,
    },
}

/// What a cluster node tells the others about its own participants.
#[derive(Debug)]
pub enum Outgoing {
    Here(PresenceRecord),
    Gone(ChannelName, String),
}

/// Publish this node's presence to `tx` and mirror the other nodes' (`node` is this node's
/// id in the shared bucket, whose own entries are skipped when they come back).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishPresence {
    pub tx: mpsc::UnboundedSender<Outgoing>,
    pub node: String,
}

/// A change in the cluster's presence, from the shared bucket.
#[derive(Message)]
#[rtype(result = "()")]
pub struct MergePresence(pub PresenceChange);

/// A participant was heard from on a channel.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Heartbeat {
    pub channel: ChannelName,
    pub participant_id: String,
    pub display_name: Option<String>,
    pub kind: Option<String>,
    pub side: Option<String>,
    pub activity: &'static str,
}

/// A participant left a channel (its stream closed).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Leave {
    pub channel: ChannelName,
    pub participant_id: String,
}

/// Who is on a channel now.
#[derive(Message)]
#[rtype(result = "Vec<Participant>")]
pub struct ListPresence(pub ChannelName);

/// Receive a channel's presence changes.
#[derive(Message)]
#[rtype(result = "broadcast::Receiver<PresenceEvent>")]
pub struct WatchPresence(pub ChannelName);

pub struct PresenceSupervisor {
    ttl: Duration,
    /// Participants heard on this node.
    channels: HashMap<ChannelName, HashMap<String, Entry>>,
    /// On a cluster node, participants heard on the others: by channel, participant, node.
    remote: HashMap<ChannelName, HashMap<String, HashMap<String, Entry>>>,
    share: Option<PublishPresence>,
    events: HashMap<ChannelName, broadcast::Sender<PresenceEvent>>,
}

impl PresenceSupervisor {
    pub fn new(ttl: Duration) -> Self {
        PresenceSupervisor {
            ttl,
            channels: HashMap::new(),
            remote: HashMap::new(),
            share: None,
            events: HashMap::new(),
        }
    }

    /// Whether another node has `participant_id` on `channel`.
    fn elsewhere(&self, channel: &ChannelName, participant_id: &str) -> bool {
        self.remote
            .get(channel)
            .and_then(|m| m.get(participant_id))
            .is_some_and(|nodes| !nodes.is_empty())
    }

    /// Whether this node has `participant_id` on `channel`.
    fn here(&self, channel: &ChannelName, participant_id: &str) -> bool {
        self.channels
            .get(channel)
            .is_some_and(|m| m.contains_key(participant_id))
    }

    /// Tells the cluster about a participant of this node (a no-op on a relay of its own).
    fn publish(&mut self, channel: &ChannelName, participant_id: &str) {
        let Some(share) = &self.share else { return };
        let Some(e) = self.channels.get_mut(channel).and_then(|m| m.get_mut(participant_id)) else {
            return;
        };
        e.published = Some(Instant::now());
        let record = PresenceRecord {
            channel: channel.to_string(),
            participant: e.participant.clone(),
            seen: e.at.0,
        };
        let _ = share.tx.send(Outgoing::Here(record));
    }

    /// Tells the cluster a participant left this node's channel.
    fn withdraw(&self, channel: &ChannelName, participant_id: &str) {
        if let Some(share) = &self.share {
            let _ = share
                .tx
                .send(Outgoing::Gone(channel.clone(), participant_id.to_owned()));
        }
    }

    /// Refreshes, in the cluster, this node's participants heard from since they were last
    /// published a third of the TTL ago or more: often enough that no other node (nor the
    /// bucket) expires one still heard, rarely enough that thousands of participants cost
    /// little.
    fn refresh(&mut self) {
        if self.share.is_none() {
            return;
        }
        let every = self.ttl / 3;
        let due: Vec<(ChannelName, String)> = self
            .channels
            .iter()
            .flat_map(|(c, m)| {
                m.iter()
                    .filter(|(_, e)| e.published.is_none_or(|p| e.seen > p && p.elapsed() >= every))
                    .map(move |(id, _)| (c.clone(), id.clone()))
            })
            .collect();
        for (channel, id) in due {
            self.publish(&channel, &id);
        }
    }

    fn emit(&mut self, channel: &ChannelName, event: PresenceEvent) {
        if let Some(tx) = self.events.get(channel) {
            if tx.send(event).is_err() {
                self.events.remove(channel);
            }
        }
    }

    fn sweep(&mut self) {
        let ttl = self.ttl;
        let mut gone = Vec::new();
        for (channel, members) in &mut self.channels {
            members.retain(|id, e| {
                let alive = e.seen.elapsed() < ttl;
                if !alive {
                    gone.push((channel.clone(), id.clone()));
                }
                alive
            });
        }
        self.channels.retain(|_, m| !m.is_empty());
        for (channel, participant_id) in &gone {
            self.withdraw(channel, participant_id);
        }
        for (channel, members) in &mut self.remote {
            members.retain(|id, nodes| {
                nodes.retain(|_, e| e.seen.elapsed() < ttl);
                if nodes.is_empty() {
                    gone.push((channel.clone(), id.clone()));
                }
                !nodes.is_empty()
            });
        }
        self.remote.retain(|_, m| !m.is_empty());
        self.channels.shrink_after_burst();
        self.remote.shrink_after_burst();
        self.events.shrink_after_burst();
        let mut told = std::collections::HashSet::new();
        for (channel, participant_id) in gone {
            if !told.insert((channel.clone(), participant_id.clone())) {
                continue;
            }
            if self.here(&channel, &participant_id) || self.elsewhere(&channel, &participant_id) {
                continue;
            }
            tracing::debug!(channel = %channel, participant = %participant_id, "presence expired");
            self.emit(
                &channel,
                PresenceEvent::Left {
                    channel: channel.to_string(),
                    participant_id,
                },
            );
        }
    }
}

impl Actor for PresenceSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(4096);
        let every = (self.ttl / 4).clamp(Duration::from_millis(100), MAX_SWEEP_INTERVAL);
        ctx.run_interval(every, |act, _| {
            act.sweep();
            act.refresh();
        });
    }
}

impl Handler<Heartbeat> for PresenceSupervisor {
    type Result = ();

    fn handle(&mut self, hb: Heartbeat, _: &mut Context<Self>) {
        let members = self.channels.entry(hb.channel.clone()).or_default();
        let now = Timestamp::now();
        match members.get_mut(&hb.participant_id) {
            Some(e) => {
                e.seen = Instant::now();
                e.at = now;
                if e.participant.activity != hb.activity {
                    e.participant.activity = hb.activity.to_owned();
                }
                let before = (
                    e.participant.display_name.clone(),
                    e.participant.kind.clone(),
                    e.participant.side.clone(),
                );
                if let Some(name) = hb.display_name {
                    e.participant.display_name = name;
                }
                if hb.side.is_some() {
                    e.participant.side = hb.side;
                }
                // A stream that says it is a human is one, even if the id posted first.
                if let Some(kind) = hb.kind {
                    e.participant.kind = kind;
                }
                let changed = before
                    != (
                        e.participant.display_name.clone(),
                        e.participant.kind.clone(),
                        e.participant.side.clone(),
                    );
                if changed {
                    // Who others see changed (a poster opened a stream as a human, say):
                    // announce it as it now is.
                    let participant = e.participant.clone();
                    let channel = hb.channel.to_string();
                    self.emit(&hb.channel, PresenceEvent::Joined { channel, participant });
                    self.publish(&hb.channel, &hb.participant_id);
                }
            }
            None => {
                let participant = Participant {
                    id: hb.participant_id.clone(),
                    participant_id: hb.participant_id.clone(),
                    display_name: hb.display_name.unwrap_or_else(|| hb.participant_id.clone()),
                    kind: hb.kind.unwrap_or_else(|| "agent".to_owned()),
                    side: hb.side,
                    activity: hb.activity.to_owned(),
                    last_seen: now.0 as f64 / 1e6,
                    last_seen_at: now.to_rfc3339(),
                };
                members.insert(
                    hb.participant_id.clone(),
                    Entry {
                        participant: participant.clone(),
                        seen: Instant::now(),
                        at: now,
                        published: None,
                    },
                );
                if !self.elsewhere(&hb.channel, &hb.participant_id) {
                    let channel = hb.channel.to_string();
                    self.emit(&hb.channel, PresenceEvent::Joined { channel, participant });
                }
                self.publish(&hb.channel, &hb.participant_id);
            }
        }
    }
}

/// A participant leaves every channel it is on (its session ended).
#[derive(Message)]
#[rtype(result = "()")]
pub struct LeaveAll(pub String);

impl Handler<LeaveAll> for PresenceSupervisor {
    type Result = ();

    fn handle(&mut self, LeaveAll(who): LeaveAll, ctx: &mut Context<Self>) {
        let on: Vec<ChannelName> = self
            .channels
            .iter()
            .filter(|(_, m)| m.contains_key(&who))
            .map(|(c, _)| c.clone())
            .collect();
        for channel in on {
            self.handle(
                Leave {
                    channel,
                    participant_id: who.clone(),
                },
                ctx,
            );
        }
    }
}

impl Handler<Leave> for PresenceSupervisor {
    type Result = ();

    fn handle(&mut self, leave: Leave, _: &mut Context<Self>) {
        let removed = self
            .channels
            .get_mut(&leave.channel)
            .and_then(|m| m.remove(&leave.participant_id))
            .is_some();
        if removed {
            self.withdraw(&leave.channel, &leave.participant_id);
        }
        if removed && !self.elsewhere(&leave.channel, &leave.participant_id) {
            self.emit(
                &leave.channel,
                PresenceEvent::Left {
                    channel: leave.channel.to_string(),
                    participant_id: leave.participant_id,
                },
            );
        }
    }
}

impl Handler<ListPresence> for PresenceSupervisor {
    type Result = MessageResult<ListPresence>;

    fn handle(&mut self, ListPresence(channel): ListPresence, _: &mut Context<Self>) -> Self::Result {
        let ttl = self.ttl;
        let here = self.channels.get(&channel).into_iter().flat_map(|m| m.values());
        let elsewhere = self
            .remote
            .get(&channel)
            .into_iter()
            .flat_map(|m| m.values().flat_map(|nodes| nodes.values()));
        // A participant heard on several nodes is listed once, as it was last heard.
        let mut latest: HashMap<&str, &Entry> = HashMap::new();
        for e in here.chain(elsewhere).filter(|e| e.seen.elapsed() < ttl) {
            let slot = latest.entry(e.participant.participant_id.as_str()).or_insert(e);
            if e.at > slot.at {
                *slot = e;
            }
        }
        let mut list: Vec<Participant> = latest
            .into_values()
            .map(|e| Participant {
                last_seen: e.at.0 as f64 / 1e6,
                last_seen_at: e.at.to_rfc3339(),
                ..e.participant.clone()
            })
            .collect();
        list.sort_by(|a, b| a.participant_id.cmp(&b.participant_id));
        MessageResult(list)
    }
}

impl Handler<PublishPresence> for PresenceSupervisor {
    type Result = ();

    fn handle(&mut self, share: PublishPresence, _: &mut Context<Self>) {
        self.share = Some(share);
        for m in self.channels.values_mut() {
            for e in m.values_mut() {
                e.published = None;
            }
        }
        self.refresh();
    }
}

impl Handler<MergePresence> for PresenceSupervisor {
    type Result = ();

    fn handle(&mut self, MergePresence(change): MergePresence, _: &mut Context<Self>) {
        let own = self.share.as_ref().map(|s| s.node.as_str());
        match change {
            PresenceChange::Here { node, record } => {
                if Some(node.as_str()) == own {
                    return;
                }
                let Ok(channel) = ChannelName::parse(&record.channel) else {
                    return;
                };
                // Its age by the other node's clock: an entry from the bucket's history may be
                // nearly expired already.
                let age = Duration::from_micros((Timestamp::now().0 - record.seen).max(0) as u64);
                if age >= self.ttl {
                    return;
                }
                let id = record.participant.participant_id.clone();
                let before = self.here(&channel, &id) || self.elsewhere(&channel, &id);
                let nodes = self
                    .remote
                    .entry(channel.clone())
                    .or_default()
                    .entry(id.clone())
                    .or_default();
                let who = |p: &Participant| (p.display_name.clone(), p.kind.clone(), p.side.clone());
                let changed = nodes
                    .get(&node)
                    .is_some_and(|e| who(&e.participant) != who(&record.participant));
                let participant = record.participant.clone();
                nodes.insert(
                    node,
                    Entry {
                        participant: record.participant,
                        seen: Instant::now().checked_sub(age).unwrap_or_else(Instant::now),
                        at: Timestamp(record.seen),
                        published: None,
                    },
                );
                if !before || changed {
                    let name = channel.to_string();
                    self.emit(
                        &channel,
                        PresenceEvent::Joined {
                            channel: name,
                            participant,
                        },
                    );
                }
            }
            PresenceChange::Gone {
                node,
                channel,
                participant_id,
            } => {
                if Some(node.as_str()) == own {
                    return;
                }
                let removed = self
                    .remote
                    .get_mut(&channel)
                    .and_then(|m| m.get_mut(&participant_id))
                    .and_then(|nodes| nodes.remove(&node))
                    .is_some();
                if let Some(m) = self.remote.get_mut(&channel) {
                    m.retain(|_, nodes| !nodes.is_empty());
                    if m.is_empty() {
                        self.remote.remove(&channel);
                    }
                }
                if removed && !self.here(&channel, &participant_id) && !self.elsewhere(&channel, &participant_id) {
                    self.emit(
                        &channel,
                        PresenceEvent::Left {
                            channel: channel.to_string(),
                            participant_id,
                        },
                    );
                }
            }
        }
    }
}

impl Handler<WatchPresence> for PresenceSupervisor {
    type Result = MessageResult<WatchPresence>;

    fn handle(&mut self, WatchPresence(channel): WatchPresence, _: &mut Context<Self>) -> Self::Result {
        let tx = self
            .events
            .entry(channel)
            .or_insert_with(|| broadcast::channel(EVENTS_CAPACITY).0);
        MessageResult(tx.subscribe())
    }
}
