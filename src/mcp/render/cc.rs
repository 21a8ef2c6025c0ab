//! Text renderings of the cross-claude face's answers (`/cc/mcp`), in cross-claude-mcp's own
//! forms where its clients and the agents reading them look for something: `Message #N sent
//! to #channel`, `Last message ID: N`, `Registered instances:`. The wording around them is
//! ours; `structuredContent` carries the same answer as fields.

use super::Render;
use crate::ops::cross_claude::{
    CcChannels, CcEntry, CcInstances, CcItems, CcMessage, CcPage, CcRegistered, CcShared, Created, Found, Reply, Sent,
    Subscription, Thread,
};
use crosstalk_actors::WaitOutcome;
use std::fmt::Write as _;

/// cross-claude's message block: `#id [type] sender (created_at) (reply to #p):\ncontent`,
/// separated by `---`.
fn blocks(messages: &[CcMessage], replies: bool) -> String {
    messages
        .iter()
        .map(|m| {
            let mut t = format!("#{} [{}] {} ({})", m.id, m.message_type, m.sender, m.created_at);
            if let Some(r) = m.in_reply_to {
                let _ = write!(t, " (reply to #{r})");
            }
            if replies && m.reply_count > 0 {
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
        format!(
            "Registered as \"{}\".\n\nNEXT STEPS: Call 'list_channels' to find the right channel for your work, \
             then 'check_messages' on that channel. Use 'general' only if no more specific channel exists.",
            self.instance_id
        )
    }
}

impl Render for Sent {
    fn text(&self) -> String {
        let mut t = format!(
            "Message #{} sent to #{} as \"{}\" [{}]",
            self.id, self.channel, self.sender, self.message_type
        );
        if self.message_type == "response" {
            t.push_str("\n\nIf this is your final reply, send a follow-up \"done\" message so the other instance stops waiting.");
        }
        let _ = write!(
            t,
            "\nFor the answer: wait_for_reply(channel=\"{}\", after_id={}).",
            self.channel, self.id
        );
        t
    }
}

impl Render for CcPage {
    fn text(&self) -> String {
        let place = self
            .channel
            .as_deref()
            .map_or_else(|| "your channels".to_owned(), |c| format!("#{c}"));
        let Some(last) = self.last_id else {
            return format!("No {}messages in {place}.", if self.since { "new " } else { "" });
        };
        format!(
            "{} message(s) in {place}:\n\n{}\n\n---\nLast message ID: {last} (use as after_id to poll for new messages)",
            self.messages.len(),
            blocks(&self.messages, true)
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
                    blocks(&self.messages, false),
                    self.last_id
                );
                if self.messages.iter().any(|m| m.message_type == "done") {
                    t.push_str("\n\nThe other instance signaled DONE -- no further replies expected.");
                }
                t
            }
            WaitOutcome::Timeout => format!(
                "No new messages in #{ch} after waiting {}s. The other instance may be busy, offline, or waiting too — \
                 send a message to break the tie, or wait again with after_id={}.",
                self.waited_s, self.last_id
            ),
            WaitOutcome::Superseded => format!(
                "This wait on #{ch} was superseded by a newer wait_for_reply from \"{}\" on the same channel. Only the \
                 newest wait stays live; nothing was lost.",
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
            blocks(&self.replies, false)
        )
    }
}

impl Render for Created {
    fn text(&self) -> String {
        let mut t = format!("Channel #{} created.", self.channel);
        if let Some(d) = &self.description {
            let _ = write!(t, " Purpose: {d}");
        }
        t
    }
}

impl Render for CcChannels {
    fn text(&self) -> String {
        if self.channels.is_empty() {
            return match &self.query {
                Some(q) => format!("No channels matching {q:?}. Call list_channels to see them all."),
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
                        if let Some(s) = c.active_senders.as_deref().filter(|s| !s.is_empty()) {
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
            Some(q) => format!("{} channel(s) matching {q:?}:\n{list}", self.channels.len()),
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
            return format!("No messages matching {:?}.", self.query);
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
        format!("{} result(s) for {:?}:\n\n{list}", self.messages.len(), self.query)
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
                "Subscribed \"{}\" to #{}: check_messages without a channel now includes it. Live delivery needs a \
                 session launched with channels enabled; otherwise wait_for_reply or poll check_messages.",
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
