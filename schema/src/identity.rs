//! Who is on the relay (registered instances) and what they share (shared data entries).

use crate::{InvalidInput, Timestamp};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize};
use std::borrow::Cow;
use std::fmt;

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

/// An instance id a request registers: checked by [`instance_id`] when the request is
/// deserialized (so it is trimmed, 1–128 bytes, without control characters), and its JSON
/// Schema gives the bounds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceId(String);

impl InstanceId {
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        instance_id(raw).map(InstanceId)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for InstanceId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Cow::<str>::deserialize(d)?;
        InstanceId::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for InstanceId {
    /// Inline, as the `String` it replaces: a field keeps its own description.
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "InstanceId".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "minLength": 1, "maxLength": MAX_INSTANCE_ID })
    }
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

crate::stored!(Instance => "registration", SharedData => "shared data");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_id_is_checked_when_it_is_deserialized() {
        let ok: InstanceId = serde_json::from_str(r#"" builder ""#).unwrap();
        assert_eq!(ok.as_str(), "builder");
        for bad in [r#""""#, r#""   ""#, r#""a\u0007b""#] {
            assert!(serde_json::from_str::<InstanceId>(bad).is_err(), "{bad} accepted");
        }
        let long = format!("{:?}", "x".repeat(MAX_INSTANCE_ID + 1));
        let e = serde_json::from_str::<InstanceId>(&long).unwrap_err();
        assert!(e.to_string().contains("too long"), "{e}");
        assert!(serde_json::from_str::<InstanceId>(&format!("{:?}", "x".repeat(MAX_INSTANCE_ID))).is_ok());
    }
}
