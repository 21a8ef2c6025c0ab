//! crosstalk-mcp's sessions (turn counting, ending at `max_turns` or on two `done`s) and
//! directives (INTERRUPT / DIRECTIVE messages and open QUESTIONs for a recipient).

use super::channels::ChannelRequest;
use super::messages::Messages;
use super::{Caller, Ctx, ErrorKind, OpError, Operation};
use crosstalk_schema::{ChannelName, ChannelState, Session};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

/// A session as crosstalk-mcp shows it (`session_id`, `max_turns`, `turn_count`, `status`),
/// with what crosstalk adds (`active`, `done_by`, times, why it ended).
#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionView {
    pub channel: ChannelName,
    pub session_id: String,
    /// `active` or `ended`.
    pub status: &'static str,
    pub active: bool,
    pub max_turns: Option<u32>,
    /// Messages posted in the session so far.
    pub turn_count: u32,
    /// Distinct senders that posted done.
    pub done_by: Vec<String>,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// `ended`, `replaced`, `max_turns` or `done`.
    pub end_reason: Option<String>,
}

impl SessionView {
    fn new(channel: &ChannelName, s: &Session) -> Self {
        SessionView {
            channel: channel.clone(),
            session_id: s.session_id.clone(),
            status: if s.is_active() { "active" } else { "ended" },
            active: s.is_active(),
            max_turns: s.max_turns,
            turn_count: s.turns,
            done_by: s.done_by.clone(),
            started_at: s.started_at.to_rfc3339(),
            ended_at: s.ended_at.map(|t| t.to_rfc3339()),
            end_reason: s.end_reason.clone(),
        }
    }
}

fn no_active_session(channel: &ChannelName) -> OpError {
    OpError::new(
        ErrorKind::NoActiveSession,
        format!("channel {channel} has no active session"),
    )
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StartRequest {
    pub channel: ChannelName,
    /// End after this many messages.
    pub max_turns: Option<NonZeroU32>,
}

pub struct StartSession;

impl Operation for StartSession {
    const NAME: &'static str = "start_session";
    const DESCRIPTION: &'static str =
        "Start a session: turns are counted; it ends at max_turns or on two participants' done.";
    const READ_ONLY: bool = false;
    type Request = StartRequest;
    type Response = SessionView;

    async fn run(cx: &Ctx, _: Caller, r: StartRequest) -> Result<SessionView, OpError> {
        let name = r.channel;
        let state = cx.relay.start_session(&name, r.max_turns.map(NonZeroU32::get)).await?;
        let session = state.session.as_ref().ok_or_else(|| no_active_session(&name))?;
        Ok(SessionView::new(&name, session))
    }
}

pub struct GetSession;

impl Operation for GetSession {
    const NAME: &'static str = "get_session";
    const DESCRIPTION: &'static str = "The channel's active session (status no_active_session if none).";
    const READ_ONLY: bool = true;
    type Request = ChannelRequest;
    type Response = SessionView;

    async fn run(cx: &Ctx, _: Caller, r: ChannelRequest) -> Result<SessionView, OpError> {
        let name = r.channel;
        let state: ChannelState = cx.relay.channel_state(&name)?;
        match state.session.as_ref().filter(|s| s.is_active()) {
            Some(s) => Ok(SessionView::new(&name, s)),
            None => Err(no_active_session(&name)),
        }
    }
}

/// What ending a session did: crosstalk-mcp's `{channel, session_id, status}`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SessionEnded {
    pub channel: ChannelName,
    /// `ended`, or `no_active_session` when there was none to end.
    pub status: &'static str,
    /// The session that ended.
    pub session_id: Option<String>,
    pub turn_count: Option<u32>,
}

pub struct EndSession;

impl Operation for EndSession {
    const NAME: &'static str = "end_session";
    const DESCRIPTION: &'static str = "End the channel's session now, whatever its turns.";
    const READ_ONLY: bool = false;
    const DESTRUCTIVE: bool = true;
    const IDEMPOTENT: bool = true;
    type Request = ChannelRequest;
    type Response = SessionEnded;

    async fn run(cx: &Ctx, _: Caller, r: ChannelRequest) -> Result<SessionEnded, OpError> {
        let name = r.channel;
        let ended = cx.relay.end_session(&name).await?;
        let session = ended.as_ref().and_then(|st| st.session.as_ref());
        Ok(SessionEnded {
            status: if ended.is_some() { "ended" } else { "no_active_session" },
            session_id: session.map(|s| s.session_id.clone()),
            turn_count: session.map(|s| s.turns),
            channel: name,
        })
    }
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct DirectivesRequest {
    pub channel: ChannelName,
    /// Whose directives: a participant id (none: everyone's).
    pub recipient: Option<String>,
    /// Directives with an id greater than this.
    #[serde(default)]
    pub since_id: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct DirectivesView {
    /// INTERRUPT and DIRECTIVE messages after since_id, for the recipient or everyone.
    pub directives: Messages,
    /// QUESTIONs still open for the recipient or everyone.
    pub open_questions: Messages,
    /// Pass as since_id next time.
    pub next_since_id: u64,
}

impl DirectivesView {
    /// crosstalk-mcp's shape: one list, oldest first, directives and open questions alike.
    pub fn flat(self) -> Messages {
        let mut all = self.directives;
        for q in self.open_questions {
            if !all.iter().any(|m| m.id() == q.id()) {
                all.push(q);
            }
        }
        all.sort_by_key(|m| m.id());
        all
    }
}

pub struct Directives;

impl Operation for Directives {
    const NAME: &'static str = "get_directives";
    const DESCRIPTION: &'static str =
        "INTERRUPTs, DIRECTIVEs and open QUESTIONs for recipient after since_id; check between steps.";
    const READ_ONLY: bool = true;
    type Request = DirectivesRequest;
    type Response = DirectivesView;

    async fn run(cx: &Ctx, _: Caller, r: DirectivesRequest) -> Result<DirectivesView, OpError> {
        let name = r.channel;
        let recipient = r.recipient.as_deref().map(str::trim).filter(|r| !r.is_empty());
        let d = cx.relay.directives(&name, recipient, r.since_id).await?;
        Ok(DirectivesView {
            directives: d.directives,
            open_questions: d.open_questions,
            next_since_id: d.next_since_id,
        })
    }
}
