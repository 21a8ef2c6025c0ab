//! Who is on the relay (registered instances) and what they share (shared data entries).

use crate::{InvalidInput, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Longest instance id, in bytes.
pub const MAX_INSTANCE_ID: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InstanceKind {
    #[default]
    Agent,
    Human,
}

impl InstanceKind {
    pub fn parse(raw: Option<&str>) -> Result<Self, InvalidInput> {
        match raw.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("agent") => Ok(InstanceKind::Agent),
            Some("human") => Ok(InstanceKind::Human),
            Some(_) => Err(InvalidInput::Invalid {
                field: "kind",
                reason: "must be `agent` or `human`",
            }),
        }
    }
}

/// A registered participant: an agent or a human.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub instance_id: String,
    pub description: Option<String>,
    pub kind: InstanceKind,
    pub registered_at: Timestamp,
}

/// Validates an instance id: 1–128 printable characters without spaces at either end.
pub fn instance_id(raw: &str) -> Result<String, InvalidInput> {
    let id = raw.trim();
    if id.is_empty() {
        return Err(InvalidInput::Missing { field: "instance_id" });
    }
    if id.len() > MAX_INSTANCE_ID {
        return Err(InvalidInput::TooLong {
            field: "instance_id",
            len: id.len(),
            max: MAX_INSTANCE_ID,
        });
    }
    if id.chars().any(char::is_control) {
        return Err(InvalidInput::ControlChars { field: "instance_id" });
    }
    Ok(id.to_owned())
}

/// One version of a shared data entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedData {
    pub key: String,
    pub owner: String,
    pub description: Option<String>,
    pub content: String,
    pub version: u64,
    pub updated_at: Timestamp,
    /// A deletion is a version too: the entry is gone from then on.
    pub deleted: bool,
}
