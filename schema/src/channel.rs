//! Channel names (normalised and validated) and the per-channel summary kept beside the log.

use crate::{InvalidInput, Timestamp};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize};
use std::borrow::Cow;
use std::fmt;

/// Longest channel name accepted, in bytes.
pub const MAX_CHANNEL_NAME: usize = 64;

/// What a channel name may start with, and what it may hold after that, as a client may send
/// them (before lowercasing): the classes of [`ChannelName::pattern`]. [`ChannelName::parse`]
/// checks the same characters (a test holds the two together).
const FIRST_CHARS: &str = "[A-Za-z0-9_-]";
const NAME_CHARS: &str = "[A-Za-z0-9._-]";

/// A valid channel name: 1–64 of `a-z`, `0-9`, `-`, `_`, `.`, not starting with `.`.
/// Input is trimmed and lowercased first, so `General` and `general` are one channel.
///
/// A request names a channel with this type: it is checked when the request is deserialized,
/// and its JSON Schema carries the rule ([`ChannelName::pattern`]), so every face and every
/// schema has it from here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ChannelName(String);

impl ChannelName {
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let name = raw.trim().to_ascii_lowercase();
        let bad = |reason| InvalidInput::ChannelName {
            name: raw.chars().take(80).collect(),
            reason,
        };
        if name.is_empty() {
            return Err(bad("must not be empty"));
        }
        if name.len() > MAX_CHANNEL_NAME {
            return Err(bad(TOO_LONG));
        }
        if name.starts_with('.') {
            return Err(bad("must not start with '.'"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(bad("only letters, digits, '-', '_' and '.' are allowed"));
        }
        Ok(ChannelName(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The rule as a regular expression over what a client sends (it may pad the name with
    /// whitespace, which is trimmed): the schemas' `pattern`.
    pub fn pattern() -> String {
        format!(r"^\s*{FIRST_CHARS}{NAME_CHARS}{{0,{}}}\s*$", MAX_CHANNEL_NAME - 1)
    }
}

impl<'de> Deserialize<'de> for ChannelName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Cow::<str>::deserialize(d)?;
        ChannelName::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for ChannelName {
    /// Inline, as the `String` it replaces: a field keeps its own description, and an
    /// `Option` of it is `["string", "null"]`.
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "ChannelName".into()
    }

    /// An answer's channel (the serialize contract) also says what it is: a request's field
    /// describes itself, and every description in a tool's input costs a model's context.
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let mut schema = json_schema!({ "type": "string", "pattern": ChannelName::pattern() });
        if g.contract().is_serialize() {
            let about = format!(
                "A valid channel name: 1–{MAX_CHANNEL_NAME} of `a-z`, `0-9`, `-`, `_`, `.`, not starting with `.`.\n\
                 Input is trimmed and lowercased first, so `General` and `general` are one channel."
            );
            schema.insert("description".into(), about.into());
        }
        schema
    }
}

impl fmt::Display for ChannelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a name longer than [`MAX_CHANNEL_NAME`] is refused (a test checks that it says so).
const TOO_LONG: &str = "must be at most 64 characters";

/// What the log knows about a channel without reading its messages. Written in the same
/// atomic batch as the events it counts, so it never disagrees with the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChannelMeta {
    /// Number of messages in the channel.
    pub count: u64,
    /// Id of the newest event of the channel's log, 0 when there is none. On a lone relay
    /// only messages are events (a store written before that also has its description and
    /// session events among them); on a cluster node every event of the shared log is.
    pub last_id: u64,
    /// When the newest message was stored.
    pub last_at: Option<Timestamp>,
    /// When the channel's first event, or first change of state, was stored.
    pub created_at: Option<Timestamp>,
    /// Id of the newest message.
    pub last_message_id: u64,
}

impl ChannelMeta {
    /// Whether anything was ever written to the channel: an event, or a change of its state
    /// (a description alone, on a lone relay).
    pub fn written(&self) -> bool {
        self.last_id > 0 || self.created_at.is_some()
    }
}

/// The summary as release 0.1 stored it, before `last_message_id`.
#[derive(Deserialize)]
struct ChannelMetaV1 {
    count: u64,
    last_id: u64,
    last_at: Option<Timestamp>,
    created_at: Option<Timestamp>,
}

/// Its `last_id` is then the best knowledge of the newest message.
impl From<ChannelMetaV1> for ChannelMeta {
    fn from(v: ChannelMetaV1) -> Self {
        ChannelMeta {
            count: v.count,
            last_id: v.last_id,
            last_at: v.last_at,
            created_at: v.created_at,
            last_message_id: v.last_id,
        }
    }
}

/// The highest id a store handed out that it may no longer hold (dropped as damaged, or
/// acknowledged before a crash that lost it): ids never go below it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdFloor(pub u64);

crate::stored!(IdFloor => "id floor");

/// A message of a cluster's shared log that holds several channels' events, as a node keeps
/// it until every one of them is cut past it: the channels not cut past it yet, each with the
/// id of its last event in the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldMessage {
    pub channels: Vec<(ChannelName, u64)>,
}

crate::stored!(HeldMessage => "held message");

/// A position in the log kept on its own: a read cursor (how far an identity has read a
/// channel), or how far a node has folded the shared log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position(pub u64);

crate::stored!(Position => "position");

impl Position {
    pub fn encode(self) -> Vec<u8> {
        crate::codec::encode(&self)
    }

    /// A stored position. Releases before positions carried a version wrote eight bytes,
    /// big-endian: read as such when the first byte is 0, which no stored value's version is
    /// (an id below 2^56, as every id is).
    pub fn decode(bytes: &[u8]) -> Result<Position, crate::CodecError> {
        match <[u8; 8]>::try_from(bytes) {
            Ok(raw) if raw[0] == 0 => Ok(Position(u64::from_be_bytes(raw))),
            _ => crate::codec::decode(bytes),
        }
    }
}

/// Version 2 added `last_message_id`; version 1 holds either layout (release 0.1 wrote both).
impl crate::Stored for ChannelMeta {
    const KIND: &'static str = "channel summary";
    const VERSION: u8 = 2;

    fn upgrade(version: u8, payload: &[u8]) -> Result<Self, crate::CodecError> {
        match version {
            1 => crate::codec::upgrade_either::<ChannelMeta, ChannelMetaV1>(payload),
            v => Err(crate::CodecError::unknown::<Self>(v)),
        }
    }
}

impl ChannelMeta {
    /// Decodes a stored summary, of this release or of one before.
    pub fn decode(bytes: &[u8]) -> Result<ChannelMeta, crate::CodecError> {
        crate::codec::decode(bytes)
    }
}

/// One row of `GET /api/channels`: crosstalk-mcp's fields, then what a person scanning the
/// list needs to see without opening each channel. `last_id` is the newest message's id and
/// `last_at` its time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChannelSummary {
    pub channel: String,
    pub count: u64,
    pub last_id: u64,
    pub last_at: Option<String>,
    pub created_at: Option<String>,
    /// QUESTIONs and PERMISSION prompts on the channel that no ANSWER has closed yet. Absent
    /// from relays before it, hence the default.
    #[serde(default)]
    pub open_questions: u64,
    /// The id of the session running on the channel (`GET /api/channels/{channel}/session`
    /// shows it); absent when none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_session: Option<String>,
    /// What the channel is for (set by `POST /api/channels` or `create_channel`); absent when
    /// it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl ChannelSummary {
    /// The row of a channel from its summary and what its state says: its open questions,
    /// running session and description.
    pub fn new(
        name: &ChannelName,
        meta: &ChannelMeta,
        open_questions: usize,
        active_session: Option<&str>,
        description: Option<&str>,
    ) -> Self {
        ChannelSummary {
            channel: name.to_string(),
            count: meta.count,
            last_id: meta.last_message_id,
            last_at: meta.last_at.map(Timestamp::to_rfc3339),
            created_at: meta.created_at.map(Timestamp::to_rfc3339),
            open_questions: open_questions as u64,
            active_session: active_session.map(str::to_owned),
            description: description.map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_and_validates() {
        assert_eq!(ChannelName::parse(" Dev-Ops_1.x ").unwrap().as_str(), "dev-ops_1.x");
        for bad in ["", "   ", "a b", "a/b", ".hidden", "é", &"x".repeat(65), "a\0b"] {
            assert!(ChannelName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(ChannelName::parse(&"x".repeat(64)).is_ok());
        assert!(TOO_LONG.contains(&MAX_CHANNEL_NAME.to_string()));
    }

    /// A class of [`FIRST_CHARS`] or [`NAME_CHARS`] as the set of bytes it matches.
    fn class(class: &str) -> Vec<u8> {
        let body = class
            .strip_prefix('[')
            .and_then(|c| c.strip_suffix(']'))
            .unwrap()
            .as_bytes();
        let mut bytes = Vec::new();
        let mut i = 0;
        while i < body.len() {
            if i + 2 < body.len() && body[i + 1] == b'-' {
                bytes.extend(body[i]..=body[i + 2]);
                i += 3;
            } else {
                bytes.push(body[i]);
                i += 1;
            }
        }
        bytes
    }

    #[test]
    fn the_pattern_says_what_parse_accepts() {
        let (first, rest) = (class(FIRST_CHARS), class(NAME_CHARS));
        for b in 0u8..128 {
            let c = b as char;
            // Leading whitespace is trimmed (the pattern's `\s*`).
            assert_eq!(
                ChannelName::parse(&format!("{c}x")).is_ok(),
                first.contains(&b) || c.is_whitespace(),
                "{c:?} first"
            );
            assert_eq!(
                ChannelName::parse(&format!("x{c}x")).is_ok(),
                rest.contains(&b),
                "{c:?} inside"
            );
        }
        let long = "x".repeat(MAX_CHANNEL_NAME);
        assert!(ChannelName::parse(&long).is_ok());
        assert!(ChannelName::parse(&format!("{long}x")).is_err());
    }

    #[test]
    fn a_name_is_checked_when_it_is_deserialized() {
        let ok: ChannelName = serde_json::from_str(r#"" Dev ""#).unwrap();
        assert_eq!(ok.as_str(), "dev");
        let e = serde_json::from_str::<ChannelName>(r#""a b""#).unwrap_err();
        assert!(e.to_string().contains("invalid channel name"), "{e}");
    }

    #[test]
    fn summaries_of_the_previous_release_still_decode() {
        #[derive(Serialize)]
        struct V1 {
            count: u64,
            last_id: u64,
            last_at: Option<Timestamp>,
            created_at: Option<Timestamp>,
        }
        let old = crate::codec::framed(
            1,
            &V1 {
                count: 3,
                last_id: 9,
                last_at: Some(Timestamp(5)),
                created_at: Some(Timestamp(1)),
            },
        );
        let m = ChannelMeta::decode(&old).unwrap();
        assert_eq!((m.count, m.last_id, m.last_message_id), (3, 9, 9));
        let new = ChannelMeta {
            last_message_id: 7,
            ..m
        };
        assert_eq!(ChannelMeta::decode(&crate::codec::encode(&new)).unwrap(), new);
    }
}
