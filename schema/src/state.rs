//! A channel's derived state — its description, its session, its open questions — and the
//! fold that derives it from the channel's events. The actor keeps a snapshot beside the log,
//! written in the same batch as the events it folds, so start-up needs no replay and a replay
//! gives exactly the snapshot.

use crate::message::{Meaning, MessageRecord, Record};
use crate::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChannelState {
    pub description: Option<String>,
    /// The current or last session.
    pub session: Option<Session>,
    /// QUESTIONs no ANSWER has closed yet: id → recipient.
    pub open_questions: BTreeMap<u64, Option<String>>,
    /// The last retention cut a cluster logged ([`Record::Trimmed`]). Added in version 2.
    pub trimmed: Option<Trim>,
}

/// Version 2 added `trimmed`; version 1 holds either layout (release 0.1 wrote both).
impl crate::Stored for ChannelState {
    const KIND: &'static str = "channel state";
    const VERSION: u8 = 2;

    fn upgrade(version: u8, payload: &[u8]) -> Result<Self, crate::CodecError> {
        match version {
            1 => crate::codec::upgrade_either::<ChannelState, ChannelStateV1>(payload),
            v => Err(crate::CodecError::unknown::<Self>(v)),
        }
    }
}

/// A logged retention cut: every event up to `through` is gone from every node's copy; the
/// cut itself is event `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Trim {
    pub through: u64,
    pub at: u64,
}

/// What a node needs to fold a channel whose events up to `trim.through` are gone from the
/// shared log: the channel's state and summary right after that event, as every node that
/// folded them computes it ([`ChannelState::replay`]). A node that joins later starts the
/// channel from it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CutState {
    pub trim: Trim,
    pub state: ChannelState,
    pub created_at: Option<Timestamp>,
    pub last_message_id: u64,
    pub last_at: Option<Timestamp>,
}

/// Kept in a cluster's bucket of cuts. It embeds [`ChannelState`]: a new layout of that is a
/// new layout of this, and version 1 is the one with [`ChannelState`]'s version 2.
impl crate::Stored for CutState {
    const KIND: &'static str = "retention cut";
    const VERSION: u8 = 1;
}

impl CutState {
    /// Folds one stored event (the next after what it holds) into the state after it.
    pub fn replay(&mut self, id: u64, record: &Record) {
        self.state.replay(id, record);
        self.created_at.get_or_insert(record.at());
        if let Record::Message(m) = record {
            self.last_message_id = id;
            self.last_at = Some(m.created_at);
        }
        self.trim.through = id;
    }
}

/// The state as releases before [`Trim`] stored it.
#[derive(Deserialize)]
struct ChannelStateV1 {
    description: Option<String>,
    session: Option<Session>,
    open_questions: BTreeMap<u64, Option<String>>,
}

impl From<ChannelStateV1> for ChannelState {
    fn from(v: ChannelStateV1) -> Self {
        ChannelState {
            description: v.description,
            session: v.session,
            open_questions: v.open_questions,
            trimmed: None,
        }
    }
}

/// crosstalk-mcp's opt-in session: counts turns, ends at `max_turns` or when two distinct
/// senders have posted `done`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub session_id: String,
    pub started_at: Timestamp,
    pub max_turns: Option<u32>,
    pub turns: u32,
    /// Distinct senders that posted `done` during the session.
    pub done_by: Vec<String>,
    pub ended_at: Option<Timestamp>,
    pub end_reason: Option<String>,
}

impl Session {
    pub fn is_active(&self) -> bool {
        self.ended_at.is_none()
    }
}

/// What folding one message produced beyond itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Effects {
    /// The QUESTION this ANSWER closed.
    pub answered: Option<u64>,
    /// The session ended because of this message; the reason.
    pub session_ended: Option<String>,
}

impl ChannelState {
    /// Decodes a stored state, of this release or of one before.
    pub fn decode(bytes: &[u8]) -> Result<ChannelState, crate::CodecError> {
        crate::codec::decode(bytes)
    }

    /// The active session's id, which a message posted without one joins.
    pub fn active_session(&self) -> Option<&str> {
        self.session
            .as_ref()
            .filter(|s| s.is_active())
            .map(|s| s.session_id.as_str())
    }

    /// Folds one stored event as the channel's fold did, with the session end the fold
    /// derives from it (which takes no id of its own).
    pub fn replay(&mut self, id: u64, record: &Record) -> Effects {
        let effects = self.apply(id, record);
        if let Some(reason) = &effects.session_ended {
            let session_id = self.session.as_ref().map(|s| s.session_id.clone()).unwrap_or_default();
            let ended = Record::SessionEnded {
                session_id,
                reason: reason.clone(),
                at: record.at(),
            };
            self.apply(id, &ended);
        }
        effects
    }

    /// Folds one event into the state. `answered_question` is the id of the QUESTION an
    /// ANSWER replies to, if the channel has that QUESTION open.
    pub fn apply(&mut self, id: u64, record: &Record) -> Effects {
        match record {
            Record::Message(m) => self.apply_message(id, m),
            Record::SessionStarted {
                session_id,
                max_turns,
                at,
            } => {
                self.session = Some(Session {
                    session_id: session_id.clone(),
                    started_at: *at,
                    max_turns: *max_turns,
                    turns: 0,
                    done_by: Vec::new(),
                    ended_at: None,
                    end_reason: None,
                });
                Effects::default()
            }
            Record::SessionEnded { session_id, reason, at } => {
                if let Some(s) = self
                    .session
                    .as_mut()
                    .filter(|s| &s.session_id == session_id && s.is_active())
                {
                    s.ended_at = Some(*at);
                    s.end_reason = Some(reason.clone());
                }
                Effects::default()
            }
            Record::Described { description, .. } => {
                self.description = Some(description.clone());
                Effects::default()
            }
            Record::Trimmed { through, .. } => {
                self.trimmed = Some(Trim {
                    through: *through,
                    at: id,
                });
                Effects::default()
            }
        }
    }

    fn apply_message(&mut self, id: u64, m: &MessageRecord) -> Effects {
        let mut effects = Effects::default();
        if m.kind.asks() {
            self.open_questions.insert(id, m.recipient.clone());
        }
        if m.kind.is(Meaning::Answer) {
            if let Some(q) = m.reply_to.filter(|q| self.open_questions.contains_key(q)) {
                self.open_questions.remove(&q);
                effects.answered = Some(q);
            }
        }
        if let Some(s) = self.session.as_mut().filter(|s| s.is_active()) {
            let in_session = m.session_id.as_deref().is_none_or(|sid| sid == s.session_id);
            if in_session {
                s.turns += 1;
                if m.kind.is(Meaning::Done) && !s.done_by.contains(&m.sender) {
                    s.done_by.push(m.sender.clone());
                }
                let reason = if s.done_by.len() >= 2 {
                    Some("done")
                } else if s.max_turns.is_some_and(|max| s.turns >= max) {
                    Some("max_turns")
                } else {
                    None
                };
                effects.session_ended = reason.map(str::to_owned);
            }
        }
        effects
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_stored_before_trims_existed_still_decodes() {
        #[derive(Serialize)]
        struct Old {
            description: Option<String>,
            session: Option<Session>,
            open_questions: BTreeMap<u64, Option<String>>,
        }
        let old = crate::codec::framed(
            1,
            &Old {
                description: Some("d".into()),
                session: None,
                open_questions: BTreeMap::from([(7, Some("bob".into()))]),
            },
        );
        let state = ChannelState::decode(&old).unwrap();
        assert_eq!(state.description.as_deref(), Some("d"));
        assert_eq!(state.open_questions.get(&7), Some(&Some("bob".into())));
        assert_eq!(state.trimmed, None);
        let mut now = state.clone();
        now.apply(
            12,
            &Record::Trimmed {
                through: 9,
                at: Timestamp(0),
            },
        );
        assert_eq!(now.trimmed, Some(Trim { through: 9, at: 12 }));
        assert_eq!(ChannelState::decode(&crate::codec::encode(&now)).unwrap(), now);
    }

    fn m(sender: &str, kind: &str, reply_to: Option<u64>) -> Record {
        Record::Message(MessageRecord {
            sender: sender.into(),
            kind: crate::MessageType::stored(kind.into()),
            body: "b".into(),
            created_at: Timestamp(0),
            session_id: None,
            recipient: None,
            reply_to,
            status: None,
            side: None,
        })
    }

    fn start(max_turns: Option<u32>) -> Record {
        Record::SessionStarted {
            session_id: "s".into(),
            max_turns,
            at: Timestamp(1),
        }
    }

    #[test]
    fn an_answer_closes_its_question_once() {
        let mut st = ChannelState::default();
        st.apply(1, &m("agent", "QUESTION", None));
        assert!(st.open_questions.contains_key(&1));
        assert_eq!(st.apply(2, &m("human", "answer", Some(1))).answered, Some(1));
        assert!(st.open_questions.is_empty());
        assert_eq!(st.apply(3, &m("human", "ANSWER", Some(1))).answered, None);
    }

    #[test]
    fn a_permission_is_open_until_its_first_answer() {
        let mut st = ChannelState::default();
        st.apply(1, &m("claude-code", "PERMISSION", None));
        assert!(st.open_questions.contains_key(&1));
        assert_eq!(st.apply(2, &m("dana", "ANSWER", Some(1))).answered, Some(1));
        assert_eq!(st.apply(3, &m("lee", "ANSWER", Some(1))).answered, None);
    }

    #[test]
    fn session_ends_when_two_distinct_senders_say_done() {
        let mut st = ChannelState::default();
        st.apply(1, &start(None));
        assert_eq!(st.active_session(), Some("s"));
        assert_eq!(st.apply(2, &m("a", "DONE", None)).session_ended, None);
        assert_eq!(
            st.apply(3, &m("a", "done", None)).session_ended,
            None,
            "same sender twice"
        );
        assert_eq!(
            st.apply(4, &m("b", "Done", None)).session_ended.as_deref(),
            Some("done")
        );
        assert_eq!(st.session.as_ref().unwrap().turns, 3);
    }

    #[test]
    fn session_ends_at_max_turns_and_replay_is_deterministic() {
        let events = [start(Some(2)), m("a", "message", None), m("b", "message", None)];
        let mut st = ChannelState::default();
        let mut ended = None;
        for (i, e) in events.iter().enumerate() {
            ended = st.apply(i as u64 + 1, e).session_ended.or(ended);
        }
        assert_eq!(ended.as_deref(), Some("max_turns"));
        let end = Record::SessionEnded {
            session_id: "s".into(),
            reason: "max_turns".into(),
            at: Timestamp(9),
        };
        st.apply(4, &end);
        assert!(st.active_session().is_none());
        let mut replay = ChannelState::default();
        for (i, e) in events.iter().chain([&end]).enumerate() {
            replay.apply(i as u64 + 1, e);
        }
        assert_eq!(replay, st);
    }
}
