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

/// One participant on one channel, as `GET /api/channels/{channel}/presence` shows it:
/// crosstalk-mcp's fields (`id`, `display_name`, `kind`, `side`, `last_seen` in epoch
/// seconds) and crosstalk's (`participant_id`, `activity`, `last_seen_at`).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
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
                    .map(|e| Participant {
                        last_seen: e.at.0 as f64 / 1e6,
                        last_seen_at: e.at.to_rfc3339(),
                        ..e.participant.clone()
                    })
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
