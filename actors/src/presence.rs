//! The presence supervisor: who is on which channel. Every call from a participant is a
//! heartbeat; a participant not heard from within the TTL is dropped. Arrivals and departures
//! are broadcast per channel, for the streams to show.

use actix::prelude::*;
use crosstalk_schema::{ChannelName, Timestamp};
use serde::Serialize;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// Presence changes buffered per channel for slow streams; a stream that falls further
/// behind skips changes (presence is a snapshot away, `ListPresence`).
const EVENTS_CAPACITY: usize = 64;
/// Longest pause between expiry sweeps.
const MAX_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// One participant on one channel, as `GET /api/channels/{channel}/presence` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Participant {
    pub participant_id: String,
    pub display_name: Option<String>,
    /// `agent` or `human`.
    pub kind: String,
    pub side: Option<String>,
    /// What it last did: `streaming`, `waiting` or `posted`.
    pub activity: String,
    pub last_seen: String,
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
}

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
    channels: HashMap<ChannelName, HashMap<String, Entry>>,
    events: HashMap<ChannelName, broadcast::Sender<PresenceEvent>>,
}

impl PresenceSupervisor {
    pub fn new(ttl: Duration) -> Self {
        PresenceSupervisor {
            ttl,
            channels: HashMap::new(),
            events: HashMap::new(),
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
        for (channel, participant_id) in gone {
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
        ctx.run_interval(every, |act, _| act.sweep());
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
                if hb.display_name.is_some() {
                    e.participant.display_name = hb.display_name;
                }
                if hb.side.is_some() {
                    e.participant.side = hb.side;
                }
            }
            None => {
                let participant = Participant {
                    participant_id: hb.participant_id.clone(),
                    display_name: hb.display_name,
                    kind: hb.kind.unwrap_or_else(|| "agent".to_owned()),
                    side: hb.side,
                    activity: hb.activity.to_owned(),
                    last_seen: now.to_rfc3339(),
                };
                members.insert(
                    hb.participant_id,
                    Entry {
                        participant: participant.clone(),
                        seen: Instant::now(),
                        at: now,
                    },
                );
                let channel = hb.channel.to_string();
                self.emit(&hb.channel, PresenceEvent::Joined { channel, participant });
            }
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
        let mut list: Vec<Participant> = self
            .channels
            .get(&channel)
            .map(|m| {
                m.values()
                    .filter(|e| e.seen.elapsed() < ttl)
                    .map(|e| e.participant.clone())
                    .collect()
            })
            .unwrap_or_default();
        list.sort_by(|a, b| a.participant_id.cmp(&b.participant_id));
        MessageResult(list)
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
