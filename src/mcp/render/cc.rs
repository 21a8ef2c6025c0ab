//! Text renderings of the cross-claude face's answers (`/cc/mcp`), in cross-claude-mcp's own
//! words wherever its clients and the agents reading them look for something: `Message #N
//! sent to #channel`, `Last message ID: N`, `(reply to #N)`, `[N replies]`, `Registered
//! instances:`, and the sentences around them. Where crosstalk says something else on
//! purpose, docs/cross-claude.md lists it. `structuredContent` carries the same answer as
//! fields.

use super::Render;
use crate::ops::cross_claude::{
    CcChannels, CcEntry, CcInstances, CcItems, CcMessage, CcPage, CcRegistered, CcShared, Created, Found, Reply, Sent,
    Subscription, Thread, REMINDER,
};
use crosstalk_actors::WaitOutcome;
use std::fmt::Write as _;

/// Which of a message block's notes cross-claude writes where.
#[derive(Clone, Copy)]
enum Notes {
    /// `(reply to #p)` and `[n replies]` (check_messages).
    Both,
    /// `(reply to #p)` only (wait_for_reply).
    ReplyTo,
    /// Neither (get_replies' replies).
    None,
}

/// cross-claude's message block: `#id [type] sender (created_at) (reply to #p) [n replies]:\n
/// content`, separated by `---`.
fn blocks(messages: &[CcMessage], notes: Notes) -> String {
    messages
        .iter()
        .map(|m| {
            let mut t = format!("#{} [{}] {} ({})", m.id, m.message_type, m.sender, m.created_at);
            if let (Some(r), Notes::Both | Notes::ReplyTo) = (m.in_reply_to, notes) {
                let _ = write!(t, " (reply to #{r})");
            }
            if matches!(notes, Notes::Both) && m.reply_count > 0 {
                let _ = write!(t, " [{} replies]", m.reply_count);
            }
            let _ = write!(t, ":\n{}", m.content);
            t
        })
        .collect::<Vec<_>>()
        .join("\n\n---\n\n")
}

fn kb(bytes: usize) -> String {
    format!("{:.1}", bytes as f64 / 1024.0)
}

impl Render for CcRegistered {
    fn text(&self) -> String {
        let mut t = format!("Registered as \"{}\".", self.instance_id);
        if self.active.is_empty() {
            t.push_str(
                "\n\nNo active channels yet. Create a topic-specific channel with 'create_channel', or use 'general' \
                 for initial contact.",
            );
        } else {
            t.push_str("\n\nActive channels:");
            for c in &self.active {
                let _ = write!(
                    t,
                    "\n  #{} ({} msgs, last: {})",
                    c.name,
                    c.message_count,
                    c.last_message_at.as_deref().unwrap_or("")
                );
                if let Some(d) = &c.description {
                    let _ = write!(t, " - {d}");
                }
            }
        }
        if self.online.is_empty() {
            t.push_str("\n\nNo other instances online.");
        } else {
            t.push_str("\n\nOnline instances:");
            for (id, description) in &self.online {
                let _ = write!(t, "\n  {id}");
                if let Some(d) = description.as_deref().filter(|d| !d.is_empty()) {
                    let _ = write!(t, " - {d}");
                }
            }
        }
        t.push_str(
            "\n\nNEXT STEPS: Call 'list_channels' to find the right channel for your work, then 'check_messages' \
             on that channel. Do NOT default to 'general' if a more specific channel exists.",
        );
        t
    }
}

impl Render for Sent {
    fn text(&self) -> String {
        let mut t = format!(
            "Message #{} sent to #{} as \"{}\" [{}]",
            self.id, self.channel, self.sender, self.message_type
        );
        if self.message_type == "response" {
            t.push_str(
                "\n\n\u{1f4a1} If this is your final reply, send a follow-up \"done\" message so the other instance \
                 stops polling.",
            );
        }
        t
    }
}

impl Render for CcPage {
    fn text(&self) -> String {
        let place = format!("#{}", self.channel.as_deref().unwrap_or(""));
        let Some(last) = self.last_id else {
            return format!("No {}messages in {place}.", if self.since { "new " } else { "" });
        };
        format!(
            "{} message(s) in {place}:\n\n{}\n\n---\nLast message ID: {last} (use as after_id to poll for new \
             messages)\n{REMINDER}",
            self.messages.len(),
            blocks(&self.messages, Notes::Both)
        )
    }
}

impl Render for Reply {
    fn text(&self) -> String {
        let ch = &self.channel;
        match self.outcome {
            WaitOutcome::Messages | WaitOutcome::Done => {
                let mut t = format!(
                    "{} new message(s) in #{ch}:\n\n{}\n\n---\nLast message ID: {}",
                    self.messages.len(),
                    blocks(&self.messages, Notes::ReplyTo),
                    self.last_id
                );
                if self.messages.iter().any(|m| m.message_type == "done") {
                    t.push_str("\n\nThe other instance signaled DONE -- no further replies expected.");
                }
                t
            }
            WaitOutcome::Timeout if !self.persistent => format!(
                "No new messages in #{ch} after waiting {}s. The other instance may be busy or offline, or the other \
                 instance may also be waiting — send a message to break the tie instead of waiting. You can try \
                 again, send a message to prompt them, or check list_instances.",
                self.waited_s
            ),
            WaitOutcome::Timeout => format!(
                "\u{23f3} This wait hit the ~{}-min transport-safe ceiling with no new message in #{ch} (expected, not a \
                 failure). You are NOT passively listening now — a returned wait delivers nothing further, and a \
                 backgrounded wait_for_reply does not wake an idle session.\n\nTO KEEP LISTENING: schedule an \
                 external re-invoker (ScheduleWakeup / cron) that calls check_messages every few minutes, or just \
                 call check_messages yourself on your next turn — do NOT tell the user you're \"still listening\" in \
                 the meantime. If a peer might also be waiting, send a message to break the tie instead, or check \
                 list_instances. For real passive push that wakes an idle session, relaunch channels-enabled \
                 (cc-listen / --channels).",
                self.waited_s.div_ceil(60).max(1)
            ),
            WaitOutcome::Superseded => format!(
                "This wait on #{ch} was superseded by a newer wait_for_reply from \"{}\" on the same channel. Only the \
                 newest wait stays live — this one has stopped, nothing was lost, and the newer wait is listening.",
                self.instance_id.as_deref().unwrap_or("you")
            ),
            WaitOutcome::SpeakFirst => format!(
                "MUTUAL WAIT: everyone else on #{ch} is waiting too, so nobody will speak first. Send a message to break \
                 the tie instead of waiting. (A worker that should never hold this up waits with role='parked'.)"
            ),
            WaitOutcome::ShuttingDown => format!(
                "The relay is restarting; wait again on #{ch} in a moment with after_id={}.",
                self.last_id
            ),
        }
    }
}

impl Render for Thread {
    fn text(&self) -> String {
        let p = &self.parent;
        if self.replies.is_empty() {
            return format!("No replies to message #{}.", p.id);
        }
        format!(
            "Original #{} from {}: {}\n\n{} replies:\n\n{}",
            p.id,
            p.sender,
            p.content,
            self.replies.len(),
            blocks(&self.replies, Notes::None)
        )
    }
}

impl Render for Created {
    fn text(&self) -> String {
        let mut t = format!("Channel #{} created.", self.channel);
        if let Some(d) = &self.description {
            let _ = write!(t, " Purpose: {d}");
        }
        if !self.similar.is_empty() {
            let names: Vec<String> = self.similar.iter().map(|c| format!("#{c}")).collect();
            let _ = write!(t, "\nNote: similar channels exist: {}", names.join(", "));
        }
        t
    }
}

impl Render for CcChannels {
    fn text(&self) -> String {
        if self.channels.is_empty() {
            return match &self.query {
                Some(q) if self.all.is_empty() => {
                    format!("No channels matching \"{q}\".\n\nNo channels exist yet. Create one with create_channel.")
                }
                Some(q) => {
                    let names: Vec<String> = self.all.iter().map(|c| format!("#{c}")).collect();
                    format!(
                        "No channels matching \"{q}\".\n\nAvailable channels: {}",
                        names.join(", ")
                    )
                }
                None => "No channels exist yet.".into(),
            };
        }
        let list = self
            .channels
            .iter()
            .map(|c| {
                let mut t = format!("#{}", c.name);
                if let Some(d) = &c.description {
                    let _ = write!(t, " - {d}");
                }
                match &c.last_message_at {
                    Some(at) if c.message_count > 0 => {
                        let _ = write!(t, " ({} msgs, last: {at})", c.message_count);
                        // find_channel names no participants, list_channels does.
                        let senders = c.active_senders.as_deref().filter(|_| self.query.is_none());
                        if let Some(s) = senders.filter(|s| !s.is_empty()) {
                            let _ = write!(t, " [participants: {s}]");
                        }
                    }
                    _ => t.push_str(" (empty)"),
                }
                t
            })
            .collect::<Vec<_>>()
            .join("\n");
        match &self.query {
            Some(q) => format!("{} channel(s) matching \"{q}\":\n{list}", self.channels.len()),
            None => format!("Channels:\n{list}"),
        }
    }
}

impl Render for CcInstances {
    fn text(&self) -> String {
        if self.instances.is_empty() {
            return "No instances registered yet.".into();
        }
        let list = self
            .instances
            .iter()
            .map(|i| {
                let mut t = format!(
                    "{} [{}] - last seen: {}",
                    i.instance_id,
                    i.status,
                    i.last_seen.as_deref().unwrap_or("never")
                );
                if let Some(d) = &i.description {
                    let _ = write!(t, " - {d}");
                }
                t
            })
            .collect::<Vec<_>>()
            .join("\n");
        format!("Registered instances:\n{list}")
    }
}

impl Render for Found {
    fn text(&self) -> String {
        if self.messages.is_empty() {
            return format!("No messages matching \"{}\".", self.query);
        }
        let list = self
            .messages
            .iter()
            .map(|m| {
                format!(
                    "#{} [#{}] {} ({}) [{}]:\n{}",
                    m.id, m.channel, m.sender, m.created_at, m.message_type, m.content
                )
            })
            .collect::<Vec<_>>()
            .join("\n\n---\n\n");
        format!("{} result(s) for \"{}\":\n\n{list}", self.messages.len(), self.query)
    }
}

impl Render for CcShared {
    fn text(&self) -> String {
        format!(
            "Shared data stored as {:?} ({} KB). Other instances can retrieve it with get_shared_data.",
            self.key,
            kb(self.size_bytes)
        )
    }
}

impl Render for CcEntry {
    fn text(&self) -> String {
        let mut t = format!(
            "Shared data {:?} (by {}, {})",
            self.key, self.created_by, self.created_at
        );
        if let Some(d) = &self.description {
            let _ = write!(t, " -- {d}");
        }
        let _ = write!(t, ":\n\n{}", self.content);
        t
    }
}

impl Render for CcItems {
    fn text(&self) -> String {
        if self.items.is_empty() {
            return "No shared data stored yet.".into();
        }
        let list = self
            .items
            .iter()
            .map(|d| {
                let mut t = format!(
                    "{:?} ({} KB, by {}, {})",
                    d.key,
                    kb(d.size_bytes),
                    d.created_by,
                    d.created_at
                );
                if let Some(desc) = &d.description {
                    let _ = write!(t, " -- {desc}");
                }
                t
            })
            .collect::<Vec<_>>()
            .join("\n");
        format!("Shared data:\n{list}")
    }
}

impl Render for Subscription {
    fn text(&self) -> String {
        if self.subscribed {
            format!(
                "Subscribed \"{}\" to #{} (interest registered; server push disabled — live delivery needs crosstalk \
                 mcp's listen_live).\n\n{HONESTY}",
                self.instance_id, self.channel
            )
        } else {
            format!(
                "Unsubscribed \"{}\" from #{}. Polling via check_messages / wait_for_reply still works.",
                self.instance_id, self.channel
            )
        }
    }
}

/// What cross-claude tells an instance that subscribes, about what it will really hear.
const HONESTY: &str = "\u{26a0}\u{fe0f} IMPORTANT — whether you will actually receive messages depends on how THIS \
    session was launched. Channels-enabled (cc-listen, or --channels / --dangerously-load-development-channels): live \
    delivery is real — messages will be injected into your context, even while idle. Any other session (assume this \
    if unsure): nothing is delivered passively, and once your turn ends you are deaf to this channel — do NOT tell \
    the user you are \"listening\", \"watching\", \"standing by\", or \"staying subscribed\". A wait_for_reply only \
    blocks synchronously for ~2 min before Claude Code backgrounds it, and a BACKGROUNDED wait does NOT wake an idle \
    session (verified CC v2.1.214) — so it is not durable listening. Your honest options: stay blocked in a short \
    wait_for_reply right now, schedule an external re-invoker (ScheduleWakeup / cron) that polls check_messages on an \
    interval, or say plainly you will only see new messages the next time they prompt you and you poll check_messages.";
