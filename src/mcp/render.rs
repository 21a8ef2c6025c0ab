//! Text renderings of the operations' answers, for MCP hosts that show a model only the text
//! content: short, with the next call spelled out. The structured content is the answer
//! itself; these never carry anything the structured content lacks.

mod cc;

use crate::ops::channels::{ChannelList, FoundChannels, Present};
use crate::ops::identity::Instances;
use crate::ops::messages::{Asked, MessageList, Page, Readers, Waited};
use crate::ops::sessions::{DirectivesView, SessionEnded, SessionView};
use crate::ops::shared::{SharedEntry, SharedList};
use crosstalk_actors::{ChannelInfo, Posted, SharedSummary, WaitOutcome};
use std::fmt::Write as _;
use std::sync::Arc;

/// Longest body quoted in the text form of a message list; structured content is complete.
pub const TEXT_BODY_MAX: usize = 4000;

/// A count of messages in words: "1 message", "2 messages".
pub fn messages(n: u64) -> String {
    match n {
        1 => "1 message".into(),
        n => format!("{n} messages"),
    }
}

/// The text form of an answer.
pub trait Render {
    fn text(&self) -> String;
}

/// One line per message: `#id sender [type, status] to recipient re #parent: body`.
fn lines(text: &mut String, messages: &[Arc<Posted>]) {
    for p in messages {
        let m = &p.message;
        let _ = write!(text, "\n#{} {} [{}", m.id, m.sender, m.kind);
        if let Some(s) = &m.status {
            let _ = write!(text, ", {s}");
        }
        text.push(']');
        if let Some(r) = &m.recipient {
            let _ = write!(text, " to {r}");
        }
        if let Some(r) = m.reply_to {
            let _ = write!(text, " re #{r}");
        }
        text.push_str(": ");
        if m.body.len() > TEXT_BODY_MAX {
            let mut cut = TEXT_BODY_MAX;
            while !m.body.is_char_boundary(cut) {
                cut -= 1;
            }
            let _ = write!(
                text,
                "{}… (truncated; the structured content has it all)",
                &m.body[..cut]
            );
        } else {
            text.push_str(&m.body);
        }
    }
}

impl Render for Arc<Posted> {
    fn text(&self) -> String {
        let m = &self.message;
        format!(
            "Posted #{id} to {ch}. To get the answer: wait_for_message(channel=\"{ch}\", since_id={id}).",
            id = m.id,
            ch = m.channel
        )
    }
}

impl Render for Page {
    fn text(&self) -> String {
        let name = &self.channel;
        let mut text = format!("{} message(s) on {name}", self.messages.len());
        if self.messages.is_empty() {
            let _ = write!(text, " after #{}.", self.next_since_id);
            return text;
        }
        lines(&mut text, &self.messages);
        let more = if self.has_more {
            " More are waiting: call get_messages at once."
        } else {
            ""
        };
        let _ = write!(text, "\nnext since_id: {}.{more}", self.next_since_id);
        text
    }
}

impl Render for Waited {
    fn text(&self) -> String {
        let name = &self.channel;
        let mut text = if self.messages.is_empty() {
            format!(
                "[] No new messages on {name} after #{next}. To keep waiting: \
                 wait_for_message(channel=\"{name}\", since_id={next}).",
                next = self.next_since_id
            )
        } else {
            let mut text = format!("{} message(s) on {name}", self.messages.len());
            lines(&mut text, &self.messages);
            let _ = write!(text, "\nnext since_id: {}.", self.next_since_id);
            text
        };
        if !matches!(self.outcome, WaitOutcome::Messages | WaitOutcome::Timeout) {
            let outcome = serde_json::to_value(self.outcome).unwrap_or_default();
            let _ = write!(text, " [{}] {}", outcome.as_str().unwrap_or(""), self.hint);
        }
        text
    }
}

impl Render for ChannelList {
    fn text(&self) -> String {
        let mut text = format!("{} channel(s)", self.channels.len());
        for c in &self.channels {
            let _ = write!(text, "\n{}: {}, last #{}", c.channel, messages(c.count), c.last_id);
            if let Some(at) = &c.last_at {
                let _ = write!(text, " at {at}");
            }
            if c.open_questions > 0 {
                let _ = write!(text, ", {} open question(s)", c.open_questions);
            }
        }
        text
    }
}

impl Render for MessageList {
    fn text(&self) -> String {
        let mut text = format!("{} message(s)", self.messages.len());
        lines(&mut text, &self.messages);
        text
    }
}

impl Render for Readers {
    fn text(&self) -> String {
        let list = |l: &[String]| {
            if l.is_empty() {
                "nobody".to_owned()
            } else {
                l.join(", ")
            }
        };
        format!(
            "message {} on {}: read by {}; not yet by {}",
            self.message_id,
            self.channel,
            list(&self.read_by),
            list(&self.not_yet)
        )
    }
}

impl Render for SessionView {
    fn text(&self) -> String {
        let max = self.max_turns.map_or("no limit".to_owned(), |m| format!("max {m}"));
        format!(
            "session {} on {}: {}, {} turn(s), {max}",
            self.session_id, self.channel, self.status, self.turn_count
        )
    }
}

impl Render for SessionEnded {
    fn text(&self) -> String {
        match &self.session_id {
            Some(s) => format!("session {s} on {} ended.", self.channel),
            None => format!("no active session on {} to end.", self.channel),
        }
    }
}

impl Render for DirectivesView {
    fn text(&self) -> String {
        let mut text = format!(
            "{} directive(s), {} open question(s); next since_id {}",
            self.directives.len(),
            self.open_questions.len(),
            self.next_since_id
        );
        lines(&mut text, &self.directives);
        lines(&mut text, &self.open_questions);
        text
    }
}

impl Render for crate::ops::identity::RegisterAnswer {
    fn text(&self) -> String {
        self.next.clone()
    }
}

impl Render for Instances {
    fn text(&self) -> String {
        if self.instances.is_empty() {
            return "no instances".into();
        }
        self.instances
            .iter()
            .map(|i| format!("{} ({:?}, {})", i.instance_id, i.kind, i.status))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Render for ChannelInfo {
    fn text(&self) -> String {
        format!("Channel {} is ready.", self.summary.channel)
    }
}

impl Render for FoundChannels {
    fn text(&self) -> String {
        if self.channels.is_empty() {
            return "no channel matches".into();
        }
        self.channels
            .iter()
            .map(|c| format!("{}: {}", c.summary.channel, c.description.as_deref().unwrap_or("")))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Render for Present {
    fn text(&self) -> String {
        let mut text = format!("{} participant(s) on {}", self.participants.len(), self.channel);
        for p in &self.participants {
            let _ = write!(text, "\n{} ({}, {})", p.participant_id, p.kind, p.activity);
        }
        text
    }
}

impl Render for Asked {
    fn text(&self) -> String {
        match &self.answer {
            Some(a) => {
                let who = match &self.answered_by {
                    Some(by) if by.person => "a person",
                    _ => "not known to be a person",
                };
                format!("Answer from {} ({who}): {}", a.message.sender, a.message.body)
            }
            None => format!(
                "No answer yet to question #{} (it stays open); check get_directives or ask again later.",
                self.question.id()
            ),
        }
    }
}

impl Render for SharedSummary {
    fn text(&self) -> String {
        if self.deleted {
            format!("Deleted {}.", self.key)
        } else {
            format!("Shared {} (version {}, {} bytes).", self.key, self.version, self.size)
        }
    }
}

impl Render for SharedEntry {
    fn text(&self) -> String {
        self.content.clone()
    }
}

impl Render for SharedList {
    fn text(&self) -> String {
        if self.entries.is_empty() {
            return "no shared data".into();
        }
        self.entries
            .iter()
            .map(|e| format!("{} (v{}, {} bytes, by {})", e.key, e.version, e.size, e.owner))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Render for crate::ops::reservations::ReservationsAnswer {
    fn text(&self) -> String {
        use crate::ops::reservations::{ReservationView, ReservationsAnswer as A};
        let one = |r: &ReservationView| {
            format!(
                "{} holds {} ({}{}, until {}): {} [id {}]",
                r.holder,
                r.paths.join(", "),
                if r.exclusive { "exclusive" } else { "shared" },
                r.project.as_deref().map(|p| format!(" in {p}")).unwrap_or_default(),
                r.expires_at,
                if r.reason.is_empty() {
                    "no reason given"
                } else {
                    &r.reason
                },
                r.id
            )
        };
        match self {
            A::Reserved(r) if r.granted => match &r.reservation {
                Some(v) => format!(
                    "Granted: {}. Release it when done: reserve(action=\"release\", id=\"{}\").",
                    one(v),
                    v.id
                ),
                None => "Granted.".into(),
            },
            A::Reserved(r) => {
                let mut text = String::from("Refused: these stand in the way:");
                for c in &r.conflicts {
                    let _ = write!(
                        text,
                        "\n{} holds {} ({}, until {}): {}",
                        c.holder,
                        c.paths.join(", "),
                        if c.exclusive { "exclusive" } else { "shared" },
                        c.expires_at,
                        if c.reason.is_empty() {
                            "no reason given"
                        } else {
                            &c.reason
                        }
                    );
                }
                text.push_str("\nAsk the holder on a channel, work elsewhere, or try after they expire.");
                text
            }
            A::Renewed(v) => format!("Renewed: {}.", one(v)),
            A::Released(r) => format!("Released {}.", r.id),
            A::Listed(l) if l.reservations.is_empty() => "Nobody holds any paths.".into(),
            A::Listed(l) => l.reservations.iter().map(one).collect::<Vec<_>>().join("\n"),
        }
    }
}

impl Render for crate::ops::channels::SearchResults {
    fn text(&self) -> String {
        if self.hits.is_empty() {
            return "Nothing found. Fewer or shorter words find more; a word also matches as a prefix.".into();
        }
        let mut text = format!("{} found, best first:", self.hits.len());
        for (h, p) in self.hits.iter().zip(&self.messages) {
            let _ = write!(
                text,
                "\n#{} {} in {} [{}]: {}",
                h.id, p.message.sender, h.channel, p.message.kind, h.snippet
            );
        }
        text
    }
}
