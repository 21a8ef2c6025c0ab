//! The REST face: crosstalk-mcp's paths and JSON shapes, plus the route table the server and
//! the tests share.

use crate::error::{self, ApiError};
use crate::server::{AppState, Gauge};
use crate::sse;
use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use bytes::{BufMut, BytesMut};
use crosstalk_actors::presence::Heartbeat;
use crosstalk_actors::Posted;
use crosstalk_schema::{ChannelName, NewMessage};
use serde::Deserialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Messages returned by one read when the client names no `limit`.
pub const DEFAULT_LIMIT: usize = 1000;
/// Largest `limit` a client may ask for.
pub const MAX_LIMIT: usize = 10_000;
/// Long-poll wait when the client names no `timeout_s`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

pub fn routes(cfg: &mut web::ServiceConfig) {
    let not_allowed = || web::route().to(error::method_not_allowed);
    cfg.service(
        web::resource("/healthz")
            .route(web::get().to(healthz))
            .default_service(not_allowed()),
    )
    .service(
        web::scope("/api")
            .service(
                web::resource("/channels")
                    .route(web::get().to(list_channels))
                    .default_service(not_allowed()),
            )
            .service(
                web::resource("/channels/{channel}/messages")
                    .route(web::get().to(get_messages))
                    .route(web::post().to(post_message))
                    .default_service(not_allowed()),
            )
            .service(
                web::resource("/channels/{channel}/wait")
                    .route(web::get().to(wait))
                    .default_service(not_allowed()),
            )
            .service(
                web::resource("/channels/{channel}/stream")
                    .route(web::get().to(sse::stream))
                    .default_service(not_allowed()),
            )
            .service(
                web::resource("/channels/{channel}/presence")
                    .route(web::get().to(presence))
                    .default_service(not_allowed()),
            ),
    )
    .default_service(web::route().to(error::not_found));
}

pub fn channel_name(raw: &str) -> Result<ChannelName, ApiError> {
    Ok(ChannelName::parse(raw)?)
}

/// A JSON array of already-encoded messages.
pub fn messages_json(messages: &[Arc<Posted>]) -> HttpResponse {
    let len = messages.iter().map(|m| m.json.len() + 1).sum::<usize>() + 2;
    let mut body = BytesMut::with_capacity(len);
    body.put_u8(b'[');
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            body.put_u8(b',');
        }
        body.extend_from_slice(&m.json);
    }
    body.put_u8(b']');
    HttpResponse::Ok().content_type("application/json").body(body.freeze())
}

#[derive(Debug, Deserialize)]
pub struct ReadQuery {
    #[serde(default)]
    pub since_id: u64,
    pub limit: Option<usize>,
    pub timeout_s: Option<f64>,
}

impl ReadQuery {
    pub fn limit(&self) -> Result<usize, ApiError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            Some(n) => Err(ApiError::bad_request(format!(
                "limit {n} is out of range: use 1 to {MAX_LIMIT}"
            ))),
        }
    }
}

async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let status = if state.relay.shutdown_token().is_cancelled() {
        "stopping"
    } else {
        "ok"
    };
    HttpResponse::Ok().json(serde_json::json!({
        "status": status,
        "streams": state.streams.load(Ordering::Relaxed),
        "waits": state.waits.load(Ordering::Relaxed),
    }))
}

async fn list_channels(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.relay.list_channels()?))
}

async fn get_messages(
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: web::Query<ReadQuery>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let found = state.relay.read(&channel, query.since_id, query.limit()?).await?;
    Ok(messages_json(&found))
}

async fn post_message(
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Json<NewMessage>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let post = body.into_inner();
    let sender = post.sender.trim().to_owned();
    let posted = state.relay.post(&channel, post).await?;
    state.relay.heartbeat(Heartbeat {
        channel,
        participant_id: sender,
        display_name: None,
        kind: None,
        side: posted.message.side.clone(),
        activity: "posted",
    });
    Ok(HttpResponse::build(StatusCode::CREATED)
        .content_type("application/json")
        .body(posted.json.clone()))
}

async fn wait(
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: web::Query<ReadQuery>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let timeout = match query.timeout_s {
        None => DEFAULT_WAIT,
        Some(t) if t.is_finite() && t >= 0.0 => Duration::from_secs_f64(t.min(state.wait_cap.as_secs_f64())),
        Some(t) => {
            return Err(ApiError::bad_request(format!(
                "timeout_s {t} must be a number of seconds >= 0"
            )))
        }
    };
    let limit = query.limit()?;
    let _waiting = Gauge::enter(&state.waits);
    let found = state.relay.wait(&channel, query.since_id, limit, timeout).await?;
    Ok(messages_json(&found))
}

async fn presence(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let participants = state.relay.presence(&channel).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "channel": channel, "participants": participants })))
}
