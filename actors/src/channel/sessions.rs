//! Channel state changes that are not messages: sessions (start, end) and the description.

use super::{ChannelActor, MAX_DESCRIPTION};
use crate::error::RelayError;
use actix::prelude::*;
use crosstalk_schema::{ChannelState, InvalidInput, Record, Timestamp};

/// Start a session (ending an active one first).
#[derive(Message)]
#[rtype(result = "Result<ChannelState, RelayError>")]
pub struct StartSession {
    pub max_turns: Option<u32>,
}

/// End the active session.
#[derive(Message)]
#[rtype(result = "Result<ChannelState, RelayError>")]
pub struct EndSession;

/// Set the channel's description.
#[derive(Message)]
#[rtype(result = "Result<ChannelState, RelayError>")]
pub struct Describe(pub String);

impl Handler<StartSession> for ChannelActor {
    type Result = ResponseFuture<Result<ChannelState, RelayError>>;

    fn handle(&mut self, msg: StartSession, ctx: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.writable() {
            return Box::pin(async move { Err(e) });
        }
        let now = Timestamp::now();
        let session_id = format!("sess-{}", uuid::Uuid::new_v4().simple());
        let started = Record::SessionStarted {
            session_id,
            max_turns: msg.max_turns,
            at: now,
        };
        // The fold replaces whatever session is active when it reaches the start.
        self.state_when_folded(started, ctx)
    }
}

impl Handler<EndSession> for ChannelActor {
    type Result = ResponseFuture<Result<ChannelState, RelayError>>;

    fn handle(&mut self, _: EndSession, ctx: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.writable() {
            return Box::pin(async move { Err(e) });
        }
        let Some(active) = self.state.active_session().map(str::to_owned) else {
            let state = self.state.clone();
            return Box::pin(async move { Ok(state) });
        };
        let ended = Record::SessionEnded {
            session_id: active,
            reason: "ended".into(),
            at: Timestamp::now(),
        };
        self.state_when_folded(ended, ctx)
    }
}

impl Handler<Describe> for ChannelActor {
    type Result = ResponseFuture<Result<ChannelState, RelayError>>;

    fn handle(&mut self, Describe(description): Describe, ctx: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.writable() {
            return Box::pin(async move { Err(e) });
        }
        let description = description.trim().to_owned();
        if description.len() > MAX_DESCRIPTION {
            let e = InvalidInput::TooLong {
                field: "description",
                len: description.len(),
                max: MAX_DESCRIPTION,
            };
            return Box::pin(async move { Err(e.into()) });
        }
        if self.state.description.as_deref() == Some(description.as_str()) {
            let state = self.state.clone();
            return Box::pin(async move { Ok(state) });
        }
        let described = Record::Described {
            description,
            at: Timestamp::now(),
        };
        self.state_when_folded(described, ctx)
    }
}
