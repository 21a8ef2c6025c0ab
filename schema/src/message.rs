//! Messages: what a client posts (`NewMessage`), what the log stores (`Record`), and what
//! every face returns (`Message`, crosstalk-mcp's JSON shape).

use crate::{ChannelName, InvalidInput, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The `type` a message gets when the poster names none.
pub const DEFAULT_TYPE: &str = "message";

/// Size bounds on a posted message. The relay's configuration chooses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest `body`, in bytes.
    pub max_body: usize,
    /// Largest `sender`, `type`, `recipient`, `session_id`, `status` or `side`, in bytes.
    pub max_field: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body: 256 * 1024,
            max_field: 256,
        }
    }
}

/// A post as a client sends it (`POST /api/channels/{channel}/messages`, MCP `post_message`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct NewMessage {
    /// Who posts (default: you, if registered).
    #[serde(default)]
    pub sender: String,
    /// message (default), request, response, status, handoff, done, QUESTION, PERMISSION, ANSWER (set reply_to).
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub body: String,
    /// The one participant it is for.
    #[serde(default)]
    pub recipient: Option<String>,
    /// Id of the message this answers.
    #[serde(default)]
    pub reply_to: Option<u64>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub side: Option<String>,
    /// A retry with the same key returns the original.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

impl NewMessage {
    /// Checks the post against `limits` and turns it into the record the log stores.
    /// Empty optional fields are dropped; `type` defaults to `message`.
    pub fn into_record(self, limits: &Limits, now: Timestamp) -> Result<MessageRecord, InvalidInput> {
        let short = |field: &'static str, value: String| -> Result<String, InvalidInput> {
            if value.len() > limits.max_field {
                return Err(InvalidInput::TooLong {
                    field,
                    len: value.len(),
                    max: limits.max_field,
                });
            }
            if value.chars().any(char::is_control) {
                return Err(InvalidInput::ControlChars { field });
            }
            Ok(value)
        };
        let optional = |field, value: Option<String>| -> Result<Option<String>, InvalidInput> {
            match value.map(|v| v.trim().to_owned()) {
                Some(v) if !v.is_empty() => short(field, v).map(Some),
                _ => Ok(None),
            }
        };
        let sender = self.sender.trim().to_owned();
        if sender.is_empty() {
            return Err(InvalidInput::Missing { field: "sender" });
        }
        if self.body.is_empty() {
            return Err(InvalidInput::Missing { field: "body" });
        }
        if self.body.len() > limits.max_body {
            return Err(InvalidInput::TooLong {
                field: "body",
                len: self.body.len(),
                max: limits.max_body,
            });
        }
        let kind = optional("type", self.kind)?.unwrap_or_else(|| DEFAULT_TYPE.to_owned());
        let mut status = optional("status", self.status)?;
        if asks(&kind) && status.is_none() {
            status = Some(STATUS_OPEN.to_owned());
        }
        Ok(MessageRecord {
            sender: short("sender", sender)?,
            kind,
            body: self.body,
            created_at: now,
            session_id: optional("session_id", self.session_id)?,
            recipient: optional("recipient", self.recipient)?,
            reply_to: self.reply_to,
            status,
            side: optional("side", self.side)?,
        })
    }

    /// The idempotency key, validated like the other short fields.
    pub fn idempotency_key(&self, limits: &Limits) -> Result<Option<String>, InvalidInput> {
        match self.idempotency_key.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(k) if k.len() > limits.max_field => Err(InvalidInput::TooLong {
                field: "idempotency_key",
                len: k.len(),
                max: limits.max_field,
            }),
            Some(k) => Ok(Some(k.to_owned())),
        }
    }
}

/// Message types that carry meaning (compared case-insensitively; any other type is free text).
pub const QUESTION: &str = "question";
/// A host asking a human whether its agent may use a tool (Claude Code's relayed permission
/// prompt): a QUESTION whose ANSWER is `allow` or `deny`, decided by a human only.
pub const PERMISSION: &str = "permission";
pub const ANSWER: &str = "answer";
pub const INTERRUPT: &str = "interrupt";
pub const DIRECTIVE: &str = "directive";
pub const DONE: &str = "done";
/// Status of a QUESTION until an ANSWER replies to it, and after.
pub const STATUS_OPEN: &str = "open";
pub const STATUS_ANSWERED: &str = "answered";
/// A recipient that means "every human".
pub const ANY_HUMAN: &str = "any-human";

/// Whether a message of this type waits for an ANSWER (a QUESTION or a PERMISSION).
pub fn asks(kind: &str) -> bool {
    kind_is(kind, QUESTION) || kind_is(kind, PERMISSION)
}

/// A PERMISSION's verdicts.
pub const VERDICTS: [&str; 2] = ["allow", "deny"];

/// Whether a message's `type` is `kind`, ignoring case.
pub fn kind_is(kind: &str, wanted: &str) -> bool {
    kind.eq_ignore_ascii_case(wanted)
}

/// One event of a channel's log. New kinds are added at the end only: postcard encodes the
/// variant by index, so logs written today stay readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    Message(MessageRecord),
    /// A session began on the channel (crosstalk-mcp's `start_session`).
    SessionStarted {
        session_id: String,
        max_turns: Option<u32>,
        at: Timestamp,
    },
    /// The session ended: `reason` is `ended`, `max_turns` or `done`.
    SessionEnded {
        session_id: String,
        reason: String,
        at: Timestamp,
    },
    /// The channel's description was set.
    Described {
        description: String,
        at: Timestamp,
    },
    /// Retention, decided once for every node of a cluster: the channel's events up to and
    /// including id `through` leave every node's copy when the fold reaches this event (a
    /// relay on its own compacts directly and never logs one).
    Trimmed {
        through: u64,
        at: Timestamp,
    },
}

impl Record {
    /// The event's own time: a message's creation, or when the session, description or cut
    /// was recorded.
    pub fn at(&self) -> Timestamp {
        match self {
            Record::Message(m) => m.created_at,
            Record::SessionStarted { at, .. }
            | Record::SessionEnded { at, .. }
            | Record::Described { at, .. }
            | Record::Trimmed { at, .. } => *at,
        }
    }
}

/// A message as the log stores it. The id and the channel are the record's key, not part of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageRecord {
    pub sender: String,
    pub kind: String,
    pub body: String,
    pub created_at: Timestamp,
    pub session_id: Option<String>,
    pub recipient: Option<String>,
    pub reply_to: Option<u64>,
    pub status: Option<String>,
    pub side: Option<String>,
}

/// A stored message as every face shows it: crosstalk-mcp's field names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Message {
    pub id: u64,
    pub channel: String,
    pub sender: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub body: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub session_id: Option<String>,
    pub recipient: Option<String>,
    pub reply_to: Option<u64>,
    pub status: Option<String>,
    pub side: Option<String>,
    /// Messages whose `reply_to` names this one.
    #[serde(default)]
    pub reply_count: u64,
}

impl Message {
    pub fn new(id: u64, channel: &ChannelName, record: MessageRecord) -> Self {
        Message {
            id,
            channel: channel.to_string(),
            sender: record.sender,
            kind: record.kind,
            body: record.body,
            created_at: record.created_at.to_rfc3339(),
            session_id: record.session_id,
            recipient: record.recipient,
            reply_to: record.reply_to,
            status: record.status,
            side: record.side,
            reply_count: 0,
        }
    }

    /// Applies what later events changed about this message.
    pub fn with_overlay(mut self, overlay: &Overlay) -> Self {
        self.reply_count = overlay.reply_count;
        if overlay.answered_by.is_some() {
            self.status = Some(STATUS_ANSWERED.to_owned());
        }
        self
    }
}

/// What later messages changed about an earlier one: how many replies it has, and (for a
/// QUESTION) which ANSWER closed it. Kept beside the log, updated in the replies' batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Overlay {
    pub reply_count: u64,
    pub answered_by: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(sender: &str, body: &str) -> NewMessage {
        NewMessage {
            sender: sender.into(),
            body: body.into(),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_and_trims() {
        let mut p = post(" alice ", "hi\nthere");
        p.recipient = Some("  ".into());
        let r = p.into_record(&Limits::default(), Timestamp(1)).unwrap();
        assert_eq!(r.sender, "alice");
        assert_eq!(r.kind, "message");
        assert_eq!(r.recipient, None);
        assert_eq!(r.body, "hi\nthere");
    }

    #[test]
    fn rejects_bad_posts() {
        let limits = Limits {
            max_body: 8,
            max_field: 4,
        };
        let cases = [
            (post("", "x"), InvalidInput::Missing { field: "sender" }),
            (post("a", ""), InvalidInput::Missing { field: "body" }),
            (
                post("a", "123456789"),
                InvalidInput::TooLong {
                    field: "body",
                    len: 9,
                    max: 8,
                },
            ),
            (
                post("abcde", "x"),
                InvalidInput::TooLong {
                    field: "sender",
                    len: 5,
                    max: 4,
                },
            ),
            (post("a\nb", "x"), InvalidInput::ControlChars { field: "sender" }),
        ];
        for (p, want) in cases {
            assert_eq!(p.into_record(&limits, Timestamp(0)).unwrap_err(), want);
        }
    }

    #[test]
    fn wire_shape_is_crosstalk_mcps() {
        let ch = ChannelName::parse("dev").unwrap();
        let rec = post("a", "b").into_record(&Limits::default(), Timestamp(0)).unwrap();
        let json = serde_json::to_value(Message::new(7, &ch, rec)).unwrap();
        let keys: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
        for k in [
            "id",
            "channel",
            "sender",
            "type",
            "body",
            "created_at",
            "session_id",
            "recipient",
            "reply_to",
            "status",
            "side",
        ] {
            assert!(keys.contains(&k.to_string()), "missing {k}");
        }
        assert_eq!(json["created_at"], "1970-01-01T00:00:00.000000Z");
    }
}
