//! The REST face: crosstalk-mcp's paths and JSON shapes (channels, messages, wait, stream,
//! presence, session, directives), cross-claude-mcp's capabilities under `/api` (register,
//! instances, replies, search, shared data, inbox), and the route table the server and the
//! tests share. Handlers translate HTTP into [`crosstalk_actors::Relay`] calls; no rules here.

pub mod coord;
mod identity;

use crate::error::{self, ApiError};
use crate::server::{AppState, Gauge};
use crate::sse;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, Route};
use bytes::{BufMut, BytesMut};
use crosstalk_actors::{Posted, Role, WaitOptions, WaitResult};
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
/// Header carrying the session token `POST /api/register` returned.
pub const SESSION_HEADER: &str = "x-crosstalk-session";

/// One path with its methods; any other method is a JSON 405.
fn resource(path: &str, routes: Vec<Route>) -> actix_web::Resource {
    routes
        .into_iter()
        .fold(web::resource(path), |r, route| r.route(route))
        .default_service(web::route().to(error::method_not_allowed))
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/healthz", vec![web::get().to(healthz)]))
        .service(
            web::scope("/api")
                .service(resource(
                    "/channels",
                    vec![web::get().to(list_channels), web::post().to(identity::create_channel)],
                ))
                .service(resource(
                    "/channels/search",
                    vec![web::get().to(identity::find_channels)],
                ))
                .service(resource(
                    "/channels/{channel}/messages",
                    vec![web::get().to(get_messages), web::post().to(post_message)],
                ))
                .service(resource(
                    "/channels/{channel}/messages/{id}",
                    vec![web::get().to(coord::get_message)],
                ))
                .service(resource(
                    "/channels/{channel}/messages/{id}/replies",
                    vec![web::get().to(coord::replies)],
                ))
                .service(resource("/channels/{channel}/wait", vec![web::get().to(wait)]))
                .service(resource("/channels/{channel}/stream", vec![web::get().to(sse::stream)]))
                .service(resource("/channels/{channel}/presence", vec![web::get().to(presence)]))
                .service(resource(
                    "/channels/{channel}/session",
                    vec![
                        web::get().to(coord::get_session),
                        web::post().to(coord::start_session),
                        web::delete().to(coord::end_session),
                    ],
                ))
                .service(resource(
                    "/channels/{channel}/directives",
                    vec![web::get().to(coord::directives)],
                ))
                .service(resource("/channels/{channel}/ask", vec![web::post().to(coord::ask)]))
                .service(resource("/register", vec![web::post().to(identity::register)]))
                .service(resource("/instances", vec![web::get().to(identity::instances)]))
                .service(resource("/inbox", vec![web::get().to(identity::inbox)]))
                .service(resource("/search", vec![web::get().to(identity::search)]))
                .service(resource(
                    "/data",
                    vec![web::get().to(identity::list_data), web::post().to(identity::share_data)],
                ))
                .service(resource(
                    "/data/{key}",
                    vec![
                        web::get().to(identity::get_data),
                        web::delete().to(identity::delete_data),
                    ],
                )),
        )
        .default_service(web::route().to(error::not_found));
}

pub fn channel_name(raw: &str) -> Result<ChannelName, ApiError> {
    Ok(ChannelName::parse(raw)?)
}

/// The session token the request carries, if any.
pub fn session(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// A JSON array of already-encoded messages.
pub fn messages_json(messages: &[Arc<Posted>]) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(json_array(messages).freeze())
}

pub fn json_array(messages: &[Arc<Posted>]) -> BytesMut {
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
    body
}

/// Messages as JSON values, for responses that wrap them in an object.
pub fn messages_value(messages: &[Arc<Posted>]) -> serde_json::Value {
    serde_json::Value::Array(messages.iter().map(|m| m.value()).collect())
}

pub fn limit(raw: Option<usize>) -> Result<usize, ApiError> {
    match raw {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit {n} is out of range: use 1 to {MAX_LIMIT}"
        ))),
    }
}

pub fn timeout(raw: Option<f64>, default: Duration, cap: Duration) -> Result<Duration, ApiError> {
    match raw {
        None => Ok(default.min(cap)),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Duration::from_secs_f64(t.min(cap.as_secs_f64()))),
        Some(t) => Err(ApiError::bad_request(format!(
            "timeout_s {t} must be a number of seconds >= 0"
        ))),
    }
}

#[derive(Debug, Deserialize)]
pub struct ReadQuery {
    #[serde(default)]
    pub since_id: u64,
    pub limit: Option<usize>,
    /// The reader's identity: its read cursor moves past what it gets.
    pub instance_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct WaitQuery {
    #[serde(default)]
    pub since_id: u64,
    pub limit: Option<usize>,
    pub timeout_s: Option<f64>,
    /// The waiter's identity. With it the answer is an object (see README), and the wait
    /// takes part in one-wait-per-identity, roles and release.
    pub instance_id: Option<String>,
    /// `active` (default) or `parked`.
    pub role: Option<String>,
    /// Skip the waiter's own messages (default true with an identity).
    pub exclude_self: Option<bool>,
}

pub fn role(raw: Option<&str>) -> Result<Role, ApiError> {
    match raw.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("active") => Ok(Role::Active),
        Some("parked") => Ok(Role::Parked),
        Some(other) => Err(ApiError::bad_request(format!(
            "role {other:?} is not one of: active, parked"
        ))),
    }
}

/// The object a wait with an identity answers with.
pub fn wait_value(r: &WaitResult) -> serde_json::Value {
    serde_json::json!({
        "messages": messages_value(&r.messages),
        "outcome": r.outcome,
        "next_since_id": r.next_since_id,
        "hint": r.outcome.hint(),
    })
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
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<ReadQuery>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let reader = query.instance_id.as_deref().map(str::trim).filter(|s| !s.is_empty());
    if let Some(who) = reader {
        crate::auth::acting_as(&req, who)?;
        state.relay.authorize(who, session(&req)).await?;
    }
    let found = state
        .relay
        .read(&channel, query.since_id, limit(query.limit)?, reader)
        .await?;
    Ok(messages_json(&found))
}

async fn post_message(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Json<NewMessage>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    crate::auth::acting_as(&req, &body.sender)?;
    let posted = state.relay.post(&channel, body.into_inner(), session(&req)).await?;
    Ok(HttpResponse::build(StatusCode::CREATED)
        .content_type("application/json")
        .body(posted.json.clone()))
}

async fn wait(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<WaitQuery>,
) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let instance = query
        .instance_id
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    if let Some(who) = &instance {
        crate::auth::acting_as(&req, who)?;
        state.relay.authorize(who, session(&req)).await?;
    }
    let opts = WaitOptions {
        since_id: query.since_id,
        limit: limit(query.limit)?,
        timeout: timeout(query.timeout_s, DEFAULT_WAIT, state.wait_cap)?,
        exclude_self: instance.is_some() && query.exclude_self.unwrap_or(true),
        role: role(query.role.as_deref())?,
        instance,
    };
    let identified = opts.instance.is_some();
    let _waiting = Gauge::enter(&state.waits);
    let result = state.relay.wait(&channel, opts).await?;
    if identified {
        Ok(HttpResponse::Ok().json(wait_value(&result)))
    } else {
        Ok(messages_json(&result.messages))
    }
}

async fn presence(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&path)?;
    let participants = state.relay.presence(&channel).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "channel": channel, "participants": participants })))
}
