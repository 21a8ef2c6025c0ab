//! Coordination over REST: single messages and threads, sessions, directives and asking a
//! human (crosstalk-mcp's `/session` and `/directives` keep their paths and shapes).

use super::{channel_name, messages_value, session, timeout};
use crate::error::ApiError;
use crate::server::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use crosstalk_schema::{ChannelName, ChannelState, NewMessage};
use serde::Deserialize;
use std::time::Duration;

/// How long `ask` waits for an answer when the client names no `timeout_s`.
const DEFAULT_ASK_WAIT: Duration = Duration::from_secs(60);

/// crosstalk-mcp's session object.
pub fn session_value(channel: &ChannelName, state: &ChannelState) -> serde_json::Value {
    match &state.session {
        None => serde_json::json!({ "channel": channel, "active": false, "session_id": null }),
        Some(s) => serde_json::json!({
            "channel": channel,
            "session_id": s.session_id,
            "active": s.is_active(),
            "turns": s.turns,
            "max_turns": s.max_turns,
            "done_by": s.done_by,
            "started_at": s.started_at.to_rfc3339(),
            "ended_at": s.ended_at.map(|t| t.to_rfc3339()),
            "end_reason": s.end_reason,
        }),
    }
}

pub async fn get_message(state: web::Data<AppState>, path: web::Path<(String, u64)>) -> Result<HttpResponse, ApiError> {
    let (channel, id) = path.into_inner();
    let channel = channel_name(&channel)?;
    let handle = state.relay.channel(&channel).await?;
    match handle.view.get(id)? {
        Some(p) => Ok(HttpResponse::Ok().content_type("application/json").body(p.json.clone())),
        None => Err(ApiError::new(
            actix_web::http::StatusCode::NOT_FOUND,
            "not_found",
            format!("no message {id} in channel {channel}"),
        )),
    }
}

#[derive(Deserialize)]
pub struct LimitQuery {
    limit: Option<usize>,
}

pub async fn replies(
    state: web::Data<AppState>,
    path: web::Path<(String, u64)>,
    query: web::Query<LimitQuery>,
) -> Result<HttpResponse, ApiError> {
    let (channel, id) = path.into_inner();
    let channel = channel_name(&channel)?;
    let found = state.relay.replies(&channel, id, super::limit(query.limit)?).await?;
    Ok(super::messages_json(&found))
}

pub async fn get_session(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let st = state.relay.channel_state(&channel).await?;
    Ok(HttpResponse::Ok().json(session_value(&channel, &st)))
}

#[derive(Deserialize, Default)]
pub struct StartBody {
    max_turns: Option<u32>,
}

pub async fn start_session(
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: Option<web::Json<StartBody>>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let max_turns = body.and_then(|b| b.max_turns);
    if max_turns == Some(0) {
        return Err(ApiError::bad_request("max_turns must be at least 1"));
    }
    let st = state.relay.start_session(&channel, max_turns).await?;
    Ok(HttpResponse::Created().json(session_value(&channel, &st)))
}

pub async fn end_session(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let st = state.relay.end_session(&channel).await?;
    Ok(HttpResponse::Ok().json(session_value(&channel, &st)))
}

#[derive(Deserialize)]
pub struct DirectivesQuery {
    recipient: Option<String>,
    #[serde(default)]
    since_id: u64,
}

pub async fn directives(
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: web::Query<DirectivesQuery>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let recipient = query.recipient.as_deref().map(str::trim).filter(|r| !r.is_empty());
    let d = state.relay.directives(&channel, recipient, query.since_id).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "channel": channel,
        "directives": messages_value(&d.directives),
        "open_questions": messages_value(&d.open_questions),
        "next_since_id": d.next_since_id,
    })))
}

#[derive(Deserialize)]
pub struct AskBody {
    #[serde(flatten)]
    question: NewMessage,
    timeout_s: Option<f64>,
}

pub async fn ask(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Json<AskBody>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let body = body.into_inner();
    crate::auth::acting_as(&req, &body.question.sender)?;
    let wait = timeout(body.timeout_s, DEFAULT_ASK_WAIT, state.wait_cap)?;
    let (q, answer) = state.relay.ask(&channel, body.question, session(&req), wait).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "question": q.message,
        "answered": answer.is_some(),
        "answer": answer.as_ref().map(|a| &a.message),
        "hint": if answer.is_some() { "The human answered." } else {
            "No answer yet: the question stays open; ask again or poll get_directives."
        },
    })))
}
