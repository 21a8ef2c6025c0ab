//! The persisted encoding of every stored value, on sled and in every NATS bucket and stream:
//! `[layout version][crc32 of payload, LE][postcard payload]`.
//!
//! Each stored type says what it is and which layout it writes ([`Stored`]). postcard is not
//! self-describing, so the version byte is what tells a reader which layout it holds:
//! - the layout this build writes is read directly;
//! - an older one goes through the type's explicit migration ([`Stored::upgrade`]), one step
//!   per version, each tested against committed bytes (`tests/fixtures/stored/`);
//! - a newer one (written by a later release) is refused with an error naming it, never
//!   guessed at.
//!
//! The checksum turns a torn or corrupted value into an error at read time instead of a
//! garbage message.

use serde::{de::DeserializeOwned, Serialize};

/// Bytes before the payload: version (1) + crc32 (4).
const HEADER: usize = 5;

/// A type kept in a store.
///
/// Changing its layout (a field added, removed, reordered or retyped) means raising
/// [`Stored::VERSION`] and teaching [`Stored::upgrade`] the layout before; the stored-format
/// test (`tests/it/stored.rs`) fails until both are done and the new layout's bytes are
/// committed beside the old ones.
pub trait Stored: Serialize + DeserializeOwned {
    /// What it is, in errors and in the names of its fixtures.
    const KIND: &'static str;
    /// The layout this build writes (1 is the first).
    const VERSION: u8;

    /// Reads `payload`, written in the older layout `version` (1 ≤ `version` < `VERSION`),
    /// as today's type. A type that never changed layout knows no older one.
    fn upgrade(version: u8, payload: &[u8]) -> Result<Self, CodecError> {
        let _ = payload;
        Err(CodecError::unknown::<Self>(version))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("record is {0} bytes, shorter than its header")]
    Truncated(usize),
    #[error(
        "a stored {kind} has layout version {version}, and this build reads versions 1 to {writes}: \
         it was written by a newer release (docs/operations.md, Upgrades)"
    )]
    UnknownVersion {
        kind: &'static str,
        version: u8,
        writes: u8,
    },
    #[error("record checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("record payload is malformed: {0}")]
    Malformed(String),
}

impl CodecError {
    /// `version` is not a layout of `T` this build reads.
    pub fn unknown<T: Stored>(version: u8) -> CodecError {
        CodecError::UnknownVersion {
            kind: T::KIND,
            version,
            writes: T::VERSION,
        }
    }
}

/// `value` in the layout its type writes today.
pub fn encode<T: Stored>(value: &T) -> Vec<u8> {
    frame(T::VERSION, value)
}

/// `view` (a borrowed form of `T` that serialises exactly as `T` does) in `T`'s layout.
pub fn encode_as<T: Stored, V: Serialize + ?Sized>(view: &V) -> Vec<u8> {
    frame(T::VERSION, view)
}

/// `value` framed as layout `version`: what an older release wrote, for the migrations' tests.
#[cfg(test)]
pub(crate) fn framed<V: Serialize>(version: u8, value: &V) -> Vec<u8> {
    frame(version, value)
}

fn frame<V: Serialize + ?Sized>(version: u8, value: &V) -> Vec<u8> {
    // Sized first, so the record is written into one allocation of its length: grown from
    // empty, a message's record took six reallocations and copies on the actors' thread.
    let size = postcard::experimental::serialized_size(value).unwrap_or(0);
    let mut out = Vec::with_capacity(HEADER + size);
    out.extend_from_slice(&[version, 0, 0, 0, 0]);
    // Serialising an owned value of plain types into a Vec cannot fail.
    out = postcard::to_extend(value, out).expect("postcard encoding into a Vec is infallible");
    let crc = crc32fast::hash(&out[HEADER..]);
    out[1..HEADER].copy_from_slice(&crc.to_le_bytes());
    out
}

/// A stored `T`, of this build's layout or, through its migrations, an older one.
pub fn decode<T: Stored>(bytes: &[u8]) -> Result<T, CodecError> {
    let (version, payload) = unframe(bytes)?;
    if version == T::VERSION {
        payload_of(payload)
    } else if (1..T::VERSION).contains(&version) {
        T::upgrade(version, payload)
    } else {
        Err(CodecError::unknown::<T>(version))
    }
}

/// The version byte and the checked payload of a stored value.
pub fn unframe(bytes: &[u8]) -> Result<(u8, &[u8]), CodecError> {
    if bytes.len() < HEADER {
        return Err(CodecError::Truncated(bytes.len()));
    }
    let stored = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    let computed = crc32fast::hash(&bytes[HEADER..]);
    if stored != computed {
        return Err(CodecError::Checksum { stored, computed });
    }
    Ok((bytes[0], &bytes[HEADER..]))
}

/// A payload read as `T`'s layout (a migration reads an older layout's struct with it).
pub fn payload_of<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    postcard::from_bytes(payload).map_err(|e| CodecError::Malformed(e.to_string()))
}

/// Release 0.1 wrote two layouts of a few types under version 1 (before the versions were
/// each type's own): a payload of version 1 is read as `Now`'s layout and, failing that, as
/// `Old`'s. This is those types' migration from version 1, and theirs only.
pub fn upgrade_either<Now: DeserializeOwned, Old: DeserializeOwned + Into<Now>>(
    payload: &[u8],
) -> Result<Now, CodecError> {
    match payload_of::<Now>(payload) {
        Err(e) => payload_of::<Old>(payload).map(Into::into).map_err(|_| e),
        ok => ok,
    }
}

/// Marks types whose layout never changed: each is [`Stored`] at version 1, under the name
/// given (`stored!(Record => "log record")`).
#[macro_export]
macro_rules! stored {
    ($($ty:ty => $kind:literal),+ $(,)?) => {
        $(impl $crate::codec::Stored for $ty {
            const KIND: &'static str = $kind;
            const VERSION: u8 = 1;
        })+
    };
}
