//! What `crosstalk wake` keeps on the relay for an identity it runs turns for: which wake
//! process holds the identity (one at a time, across processes and cluster nodes), how far
//! each channel's messages have been handled, what it is doing now, and its last turns. It is
//! kept on the relay, not beside the process, so a restart of either hands nothing twice and
//! misses nothing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Turns kept per identity, newest last.
pub const TURNS_KEPT: usize = 20;

/// One identity's wake state.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WakeState {
    pub identity: String,
    /// The wake process that holds the identity, while one does.
    pub lease: Option<WakeLease>,
    /// Per channel, the newest message id a finished turn handled or passed over: nothing at or
    /// before it wakes the identity again.
    pub handled: BTreeMap<String, u64>,
    pub activity: Activity,
    /// The last turns, newest last (at most [`TURNS_KEPT`]).
    pub turns: Vec<Turn>,
    /// Whose request made this state, as its principal's key, when that was one client's token
    /// (a participant's, or an OAuth connection's, which may act as anyone): what such a token
    /// keeps is counted, and bounded. `None` for one the admin's token, a relay without tokens
    /// or an earlier release made.
    pub made_by: Option<String>,
}

/// A wake state as the first release with wake stored it, before `made_by`.
#[derive(Deserialize)]
struct WakeStateV1 {
    identity: String,
    lease: Option<WakeLease>,
    handled: BTreeMap<String, u64>,
    activity: Activity,
    turns: Vec<Turn>,
}

impl From<WakeStateV1> for WakeState {
    fn from(v: WakeStateV1) -> Self {
        WakeState {
            identity: v.identity,
            lease: v.lease,
            handled: v.handled,
            activity: v.activity,
            turns: v.turns,
            made_by: None,
        }
    }
}

/// Version 2 added `made_by`.
impl crate::Stored for WakeState {
    const KIND: &'static str = "wake state";
    const VERSION: u8 = 2;

    fn upgrade(version: u8, payload: &[u8]) -> Result<Self, crate::CodecError> {
        match version {
            1 => crate::codec::payload_of::<WakeStateV1>(payload).map(Into::into),
            v => Err(crate::CodecError::unknown::<Self>(v)),
        }
    }
}

/// Who holds an identity's turns, until when (ms since the epoch; renewed while it runs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeLease {
    /// The holder's own random id.
    pub holder: String,
    pub host: String,
    pub pid: u32,
    pub until_ms: i64,
}

/// What a woken identity is doing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Activity {
    /// Waiting for a message that wakes it.
    #[default]
    Listening,
    /// A turn runs, since `since_ms`, for messages of these channels.
    Working { since_ms: i64, channels: Vec<String> },
    /// Waking stopped until a person answers or writes: the loop guard stopped it for
    /// `channel`, or the hourly budget for every channel (`channel` is then where it asked;
    /// `None` in states written before it said). `question` asks a person there.
    Paused {
        channel: Option<String>,
        why: String,
        question: Option<u64>,
    },
}

/// One turn as it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Turn {
    pub started_ms: i64,
    pub ended_ms: i64,
    /// The channels whose messages it was handed, and how many messages.
    pub channels: Vec<String>,
    pub messages: u32,
    /// `ok`, or how it failed (`exit 3`, `killed`, `timed out after 600 s`).
    pub outcome: String,
    /// Its attempt at those messages, from 1.
    pub attempt: u32,
}
