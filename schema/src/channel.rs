//! Channel names (normalised and validated) and the per-channel summary kept beside the log.

use crate::{InvalidInput, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Longest channel name accepted, in bytes.
pub const MAX_CHANNEL_NAME: usize = 64;

/// A valid channel name: 1–64 of `a-z`, `0-9`, `-`, `_`, `.`, not starting with `.`.
/// Input is trimmed and lowercased first, so `General` and `general` are one channel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, JsonSchema)]
#[schemars(transparent)]
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
            return Err(bad("must be at most 64 characters"));
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
}

impl fmt::Display for ChannelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the log knows about a channel without reading its messages. Written in the same
/// atomic batch as the events it counts, so it never disagrees with the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChannelMeta {
    /// Number of messages in the channel.
    pub count: u64,
    /// Id of the newest message, 0 when there is none.
    pub last_id: u64,
    /// When the newest message was stored.
    pub last_at: Option<Timestamp>,
    /// When the channel's first event was stored.
    pub created_at: Option<Timestamp>,
    /// Id of the newest message (`last_id` counts session and description events too).
    pub last_message_id: u64,
}

/// The summary as release 0.1 stored it, before `last_message_id`.
#[derive(Deserialize)]
struct ChannelMetaV1 {
    count: u64,
    last_id: u64,
    last_at: Option<Timestamp>,
    created_at: Option<Timestamp>,
}

impl ChannelMeta {
    /// Decodes a stored summary, of this release or of the one before (whose `last_id` is
    /// then the best knowledge of the newest message).
    pub fn decode(bytes: &[u8]) -> Result<ChannelMeta, crate::CodecError> {
        match crate::codec::decode::<ChannelMeta>(bytes) {
            Ok(m) => Ok(m),
            Err(e @ crate::CodecError::Malformed(_)) => crate::codec::decode::<ChannelMetaV1>(bytes)
                .map(|v| ChannelMeta {
                    count: v.count,
                    last_id: v.last_id,
                    last_at: v.last_at,
                    created_at: v.created_at,
                    last_message_id: v.last_id,
                })
                .map_err(|_| e),
            Err(e) => Err(e),
        }
    }
}

/// One row of `GET /api/channels`: crosstalk-mcp's fields. `last_id` is the newest message's
/// id and `last_at` its time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ChannelSummary {
    pub channel: String,
    pub count: u64,
    pub last_id: u64,
    pub last_at: Option<String>,
    pub created_at: Option<String>,
}

impl ChannelSummary {
    pub fn new(name: &ChannelName, meta: &ChannelMeta) -> Self {
        ChannelSummary {
            channel: name.to_string(),
            count: meta.count,
            last_id: meta.last_message_id,
            last_at: meta.last_at.map(Timestamp::to_rfc3339),
            created_at: meta.created_at.map(Timestamp::to_rfc3339),
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
        let old = crate::codec::encode(&V1 {
            count: 3,
            last_id: 9,
            last_at: Some(Timestamp(5)),
            created_at: Some(Timestamp(1)),
        });
        let m = ChannelMeta::decode(&old).unwrap();
        assert_eq!((m.count, m.last_id, m.last_message_id), (3, 9, 9));
        let new = ChannelMeta {
            last_message_id: 7,
            ..m
        };
        assert_eq!(ChannelMeta::decode(&crate::codec::encode(&new)).unwrap(), new);
    }
}
