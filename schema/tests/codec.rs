//! The record codec as every store reads it: round trips, damage detected, no input that
//! makes decoding panic. (Beside the crate, so that the codec's own module names no type it
//! encodes.)

use crosstalk_schema::codec::{decode, encode, CodecError};
use crosstalk_schema::{ChannelMeta, ChannelState, MessageRecord, MessageType, Record, Timestamp};

fn record() -> Record {
    Record::Message(MessageRecord {
        sender: "alice".into(),
        kind: MessageType::default(),
        body: "hello".into(),
        created_at: Timestamp(42),
        session_id: None,
        recipient: Some("bob".into()),
        reply_to: Some(3),
        status: None,
        side: None,
    })
}

#[test]
fn round_trips() {
    assert_eq!(decode::<Record>(&encode(&record())).unwrap(), record());
}

#[test]
fn detects_damage() {
    let good = encode(&record());
    assert_eq!(decode::<Record>(&good[..3]), Err(CodecError::Truncated(3)));
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 0x40;
    assert!(matches!(decode::<Record>(&flipped), Err(CodecError::Checksum { .. })));
    let mut cut = good.clone();
    cut.truncate(good.len() - 2);
    assert!(matches!(decode::<Record>(&cut), Err(CodecError::Checksum { .. })));
    // A layout this build does not know (a newer release's, or none) is refused, not guessed.
    for version in [0, 2, 9] {
        let mut other = good.clone();
        other[0] = version;
        assert_eq!(
            decode::<Record>(&other),
            Err(CodecError::UnknownVersion {
                kind: "log record",
                version,
                writes: 1
            })
        );
    }
}

/// A tiny deterministic generator: the fuzz tests below are the same on every run.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn no_input_makes_decoding_panic() {
    // Random bytes, and every record damaged at random (bit flips, cuts, garbage), with
    // and without a valid checksum: decoding returns an error or a record, never panics.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let good = encode(&record());
    for round in 0..20_000 {
        let bytes: Vec<u8> = match round % 3 {
            0 => {
                let len = (xorshift(&mut seed) % 64) as usize;
                (0..len).map(|_| xorshift(&mut seed) as u8).collect()
            }
            1 => {
                let mut b = good.clone();
                let at = (xorshift(&mut seed) as usize) % b.len();
                b[at] ^= 1 << (xorshift(&mut seed) % 8);
                b.truncate(b.len() - (xorshift(&mut seed) % 4) as usize);
                b
            }
            _ => {
                // A payload of garbage behind a valid header and checksum: postcard
                // itself must refuse it.
                let len = (xorshift(&mut seed) % 48) as usize;
                let payload: Vec<u8> = (0..len).map(|_| xorshift(&mut seed) as u8).collect();
                // Versions 1 and 2: the current layouts and the migrations from version 1.
                let mut b = vec![(round % 2 + 1) as u8, 0, 0, 0, 0];
                b[1..5].copy_from_slice(&crc32fast::hash(&payload).to_le_bytes());
                b.extend(payload);
                b
            }
        };
        let _ = decode::<Record>(&bytes);
        let _ = decode::<ChannelState>(&bytes);
        let _ = ChannelState::decode(&bytes);
        let _ = ChannelMeta::decode(&bytes);
    }
}

#[test]
fn small_on_disk() {
    // A 100-byte body costs little more than itself.
    let Record::Message(mut m) = record() else {
        unreachable!()
    };
    m.body = "x".repeat(100);
    assert!(encode(&Record::Message(m)).len() < 140);
}
