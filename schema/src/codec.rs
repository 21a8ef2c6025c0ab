//! The persisted encoding of a record (and of any other stored value): `[format version][crc32 of payload, LE][postcard payload]`.
//! The version byte lets a later release read today's logs; the checksum turns a torn or
//! corrupted value into an error at read time instead of a garbage message.

use serde::{de::DeserializeOwned, Serialize};

/// Version of the record encoding written by this build.
pub const FORMAT_VERSION: u8 = 1;

/// Bytes before the payload: version (1) + crc32 (4).
const HEADER: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("record is {0} bytes, shorter than its header")]
    Truncated(usize),
    #[error("record has format version {0}, this build reads version {FORMAT_VERSION}")]
    UnknownVersion(u8),
    #[error("record checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("record payload is malformed: {0}")]
    Malformed(String),
}

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![FORMAT_VERSION, 0, 0, 0, 0];
    // Serialising an owned value of plain types into a Vec cannot fail.
    out = postcard::to_extend(value, out).expect("postcard encoding into a Vec is infallible");
    let crc = crc32fast::hash(&out[HEADER..]);
    out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Decodes a value stored as `T` or, by a release before a field was added, as `Old`: postcard
/// is not self-describing, so an older layout reads as malformed and is tried second. An
/// error is the newer layout's.
pub fn decode_or_older<T: DeserializeOwned, Old: DeserializeOwned + Into<T>>(bytes: &[u8]) -> Result<T, CodecError> {
    match decode::<T>(bytes) {
        Err(e @ CodecError::Malformed(_)) => decode::<Old>(bytes).map(Into::into).map_err(|_| e),
        other => other,
    }
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    if bytes.len() < HEADER {
        return Err(CodecError::Truncated(bytes.len()));
    }
    if bytes[0] != FORMAT_VERSION {
        return Err(CodecError::UnknownVersion(bytes[0]));
    }
    let stored = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let computed = crc32fast::hash(&bytes[HEADER..]);
    if stored != computed {
        return Err(CodecError::Checksum { stored, computed });
    }
    postcard::from_bytes(&bytes[HEADER..]).map_err(|e| CodecError::Malformed(e.to_string()))
}
