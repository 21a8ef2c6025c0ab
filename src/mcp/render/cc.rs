//! Text renderings of the cross-claude face's answers (`/cc/mcp`): cross-claude-mcp's
//! field names, the next call spelled out.

use super::Render;
use crate::ops::cross_claude::{CcMessage, CcPage, CcRegistered, Created, Found, Reply, Sent, Subscription, Thread};
use crosstalk_actors::WaitOutcome;
use std::fmt::Write as _;

/// `#id sender [type] re #parent: content`, one per line.
fn lines(text: &mut String, messages: &[CcMessage]) {
    for m in messages {
        let _ = write!(text, "\n#{} {} [{}]", m.id, m.sender, m.message_type);
        if let Some(r) = m.in_reply_to {
            let _ = write!(text, " re #{r}");
        }
        let _ = write!(text, ": {}", m.content);
    }
}

impl Render for CcRegistered {
    fn text(&self) -> String {
        format!(
            "Registered as {}. Next: list_channels, then check_messages on the channel you work in.",
            self.instance_id
        )
    }
}

impl Render for Sent {
    fn text(&self) -> String {
        format!(
            "Sent #{id} to {ch} ({ty}). For the answer: wait_for_reply(channel=\"{ch}\", after_id={id}).",
            id = self.id,
            ch = self.channel,
            ty = self.message_type
        )
    }
}

impl Render for CcPage {
    fn text(&self) -> String {
        if self.messages.is_empty() {
            return "No new messages.".into();
        }
        let mut t = format!("{} message(s); last_id {}:", self.messages.len(), self.last_id);
        lines(&mut t, &self.messages);
        t
    }
}

impl Render for Reply {
    fn text(&self) -> String {
        let mut t = match self.outcome {
            WaitOutcome::Messages => format!("{} new message(s):", self.messages.len()),
            WaitOutcome::Done => "The other side said done:".to_owned(),
            _ => format!("No reply ({:?}).", self.outcome).to_lowercase(),
        };
        lines(&mut t, &self.messages);
        let _ = write!(t, "\n{} Next after_id: {}.", self.hint, self.last_id);
        t
    }
}

impl Render for Thread {
    fn text(&self) -> String {
        let mut t = String::from("Message:");
        lines(&mut t, std::slice::from_ref(&self.parent));
        let _ = write!(t, "\n{} repl(ies):", self.replies.len());
        lines(&mut t, &self.replies);
        t
    }
}

impl Render for Created {
    fn text(&self) -> String {
        format!("Channel {} is ready.", self.channel.summary.channel)
    }
}

impl Render for Found {
    fn text(&self) -> String {
        let mut t = format!("{} match(es):", self.messages.len());
        lines(&mut t, &self.messages);
        t
    }
}

impl Render for Subscription {
    fn text(&self) -> String {
        if self.subscribed {
            format!("{} joined {}.", self.instance_id, self.channel)
        } else {
            format!("{} left {}.", self.instance_id, self.channel)
        }
    }
}
