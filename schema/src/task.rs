//! An MCP task as the relay stores it: a blocking tool call (`wait_for_message`, `ask_human`,
//! cross-claude's `wait_for_reply`) that became a task its client polls or is told about, so
//! it can outlive the host's limit on one tool call, and the relay's restarts.
//!
//! A task is a wait with its arguments pinned: what the call had left to the session (the
//! identity it registered as, where cross-claude's wait starts, the question already posted)
//! is written into the record when the task is made, so any node, or this one after a
//! restart, can run the rest of the wait from the record alone.

use serde::{Deserialize, Serialize};

/// Where a task is in its life. Only `Working` changes; the others are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// The wait is running (or will again, after a restart).
    Working,
    /// The wait ended; `result` holds the tool's answer (which may be a tool error).
    Completed,
    /// The wait could not run; `result` holds the JSON-RPC error.
    Failed,
    /// The client cancelled it.
    Cancelled,
}

impl TaskState {
    pub fn is_final(self) -> bool {
        self != TaskState::Working
    }

    /// The state's name in both generations of MCP tasks.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Working => "working",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub id: String,
    /// Whose it is: the principal's key (a participant's identity, or a key no identity has).
    /// Only the same principal may read or cancel it.
    pub owner: String,
    /// The MCP face it was made on (`mcp`, `cc-mcp`): which tool table runs it.
    pub face: String,
    /// The tool the client called.
    pub tool: String,
    /// What the runner calls, as JSON: the tool's arguments with what the session supplied
    /// pinned (for `ask_human`, the question posted and the wait for its answer).
    pub run: String,
    /// The identity the session had registered as when the task was made.
    pub bound: Option<String>,
    pub state: TaskState,
    /// A sentence for people about the state.
    pub message: Option<String>,
    /// The answer, as JSON: the tool's result (`Completed`) or a JSON-RPC error (`Failed`).
    pub result: Option<String>,
    /// Milliseconds since the epoch.
    pub created_ms: i64,
    pub updated_ms: i64,
    /// When the wait gives up (milliseconds since the epoch).
    pub deadline_ms: i64,
    /// How long after `created_ms` the record is kept, in milliseconds.
    pub ttl_ms: i64,
    /// The node that runs it (and resumes it after a restart).
    pub node: String,
    /// The OAuth grant whose token made it, if one did: the task lives no longer than the
    /// grant. (Without one, it lives as long as its owner's token is configured.)
    pub grant: Option<String>,
}

/// A task as the first release with tasks stored it, before `grant`.
#[derive(Deserialize)]
struct TaskRecordV1 {
    id: String,
    owner: String,
    face: String,
    tool: String,
    run: String,
    bound: Option<String>,
    state: TaskState,
    message: Option<String>,
    result: Option<String>,
    created_ms: i64,
    updated_ms: i64,
    deadline_ms: i64,
    ttl_ms: i64,
    node: String,
}

/// Made before tasks named their grant: it lives by its owner's token.
impl From<TaskRecordV1> for TaskRecord {
    fn from(v: TaskRecordV1) -> Self {
        TaskRecord {
            id: v.id,
            owner: v.owner,
            face: v.face,
            tool: v.tool,
            run: v.run,
            bound: v.bound,
            state: v.state,
            message: v.message,
            result: v.result,
            created_ms: v.created_ms,
            updated_ms: v.updated_ms,
            deadline_ms: v.deadline_ms,
            ttl_ms: v.ttl_ms,
            node: v.node,
            grant: None,
        }
    }
}

/// Version 2 added `grant`; version 1 holds either layout (release 0.1 wrote both).
impl crate::Stored for TaskRecord {
    const KIND: &'static str = "task";
    const VERSION: u8 = 2;

    fn upgrade(version: u8, payload: &[u8]) -> Result<Self, crate::CodecError> {
        match version {
            1 => crate::codec::upgrade_either::<TaskRecord, TaskRecordV1>(payload),
            v => Err(crate::CodecError::unknown::<Self>(v)),
        }
    }
}

impl TaskRecord {
    /// Decodes a stored task, of this release or of one before.
    pub fn decode(bytes: &[u8]) -> Result<TaskRecord, crate::CodecError> {
        crate::codec::decode(bytes)
    }

    /// The record once the wait ended with `state` (final) and `result`, at `now_ms`.
    pub fn settled(&self, state: TaskState, result: Option<String>, message: Option<String>, now_ms: i64) -> Self {
        debug_assert!(state.is_final());
        TaskRecord {
            state,
            result,
            message,
            updated_ms: now_ms.max(self.updated_ms),
            ..self.clone()
        }
    }

    /// Whether the record may be forgotten at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        now_ms >= self.created_ms.saturating_add(self.ttl_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TaskRecord {
        TaskRecord {
            id: "t".into(),
            owner: "\0anyone".into(),
            face: "mcp".into(),
            tool: "wait_for_message".into(),
            run: "{}".into(),
            bound: None,
            state: TaskState::Working,
            message: None,
            result: None,
            created_ms: 1_000,
            updated_ms: 1_000,
            deadline_ms: 61_000,
            ttl_ms: 3_600_000,
            node: "n".into(),
            grant: None,
        }
    }

    #[test]
    fn a_task_stored_before_grants_reads_as_made_without_one() {
        // `record()` as the release before `grant` encoded it.
        const V1: &str = "01d4c40e0501740700616e796f6e65036d637010776169745f666f725f6d657373616765027b7d00000000d00fd00f90b90780bab703016e";
        let bytes: Vec<u8> = (0..V1.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&V1[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(TaskRecord::decode(&bytes).unwrap(), record());
        let mut granted = record();
        granted.grant = Some("3f2a9c1b7d0e".into());
        assert_eq!(TaskRecord::decode(&crate::encode(&granted)).unwrap(), granted);
    }

    #[test]
    fn a_record_round_trips_and_settles_once() {
        let r = record();
        assert_eq!(crate::decode::<TaskRecord>(&crate::encode(&r)).unwrap(), r);
        assert!(!r.state.is_final());
        let done = r.settled(TaskState::Completed, Some("{}".into()), None, 500);
        assert_eq!(done.state, TaskState::Completed);
        assert_eq!(done.updated_ms, 1_000, "time never runs backwards in a record");
        assert!(!done.expired(3_600_999));
        assert!(done.expired(3_601_000));
    }
}
