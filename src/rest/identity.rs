//! Identity and what hangs off it over REST: register, instances, inbox, shared data; plus
//! channel creation, channel finding and message search.

use super::{channel_name, limit, messages_json, session};
use crate::error::ApiError;
use crate::server::AppState;
use actix_web::{web, HttpRequest, HttpResponse};
use crosstalk_actors::search::Query;
use crosstalk_schema::InstanceKind;
use serde::Deserialize;

#[derive(Deserialize)]
pub struct RegisterBody {
    instance_id: String,
    description: Option<String>,
    kind: Option<String>,
}

pub async fn register(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<RegisterBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    crate::auth::acting_as(&req, &body.instance_id)?;
    let kind = InstanceKind::parse(body.kind.as_deref())?;
    let registered = state
        .relay
        .register(
            &body.instance_id,
            body.description,
            kind,
            session(&req).map(str::to_owned),
        )
        .await?;
    Ok(HttpResponse::Created().json(registered))
}

pub async fn instances(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.relay.list_instances().await?))
}

#[derive(Deserialize)]
pub struct InboxQuery {
    instance_id: String,
    limit: Option<usize>,
}

pub async fn inbox(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<InboxQuery>,
) -> Result<HttpResponse, ApiError> {
    let who = query.instance_id.trim();
    crate::auth::acting_as(&req, who)?;
    state.relay.authorize(who, session(&req)).await?;
    let found = state.relay.inbox(who, limit(query.limit)?).await?;
    Ok(messages_json(&found))
}

#[derive(Deserialize)]
pub struct CreateBody {
    #[serde(alias = "channel")]
    name: String,
    #[serde(default)]
    description: String,
}

pub async fn create_channel(state: web::Data<AppState>, body: web::Json<CreateBody>) -> Result<HttpResponse, ApiError> {
    let channel = channel_name(&body.name)?;
    let info = state.relay.create_channel(&channel, &body.description).await?;
    Ok(HttpResponse::Created().json(info))
}

#[derive(Deserialize)]
pub struct FindQuery {
    q: String,
}

pub async fn find_channels(state: web::Data<AppState>, query: web::Query<FindQuery>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.relay.find_channels(&query.q).await?))
}

#[derive(Deserialize)]
pub struct SearchQuery {
    q: String,
    channel: Option<String>,
    sender: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    limit: Option<usize>,
}

pub async fn search(state: web::Data<AppState>, query: web::Query<SearchQuery>) -> Result<HttpResponse, ApiError> {
    let q = query.into_inner();
    let channel = q.channel.as_deref().map(channel_name).transpose()?;
    let found = state
        .relay
        .search(Query {
            text: q.q,
            channel,
            sender: q.sender,
            kind: q.kind,
            limit: limit(q.limit.or(Some(50)))?,
        })
        .await?;
    Ok(messages_json(&found))
}

#[derive(Deserialize)]
pub struct ShareBody {
    key: String,
    content: String,
    description: Option<String>,
    /// The owner: the caller's instance id.
    #[serde(alias = "instance_id")]
    owner: String,
}

pub async fn share_data(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Json<ShareBody>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    crate::auth::acting_as(&req, &b.owner)?;
    let summary = state
        .relay
        .share_data(b.owner.trim(), &b.key, b.content, b.description, session(&req))
        .await?;
    Ok(HttpResponse::Created().json(summary))
}

pub async fn list_data(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.relay.list_shared_data().await?))
}

#[derive(Deserialize)]
pub struct VersionQuery {
    version: Option<u64>,
}

pub async fn get_data(
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: web::Query<VersionQuery>,
) -> Result<HttpResponse, ApiError> {
    let d = state.relay.get_shared_data(&path, query.version).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "key": d.key,
        "owner": d.owner,
        "description": d.description,
        "content": d.content,
        "version": d.version,
        "updated_at": d.updated_at.to_rfc3339(),
        "deleted": d.deleted,
    })))
}

#[derive(Deserialize)]
pub struct OwnerQuery {
    #[serde(alias = "instance_id")]
    owner: String,
}

pub async fn delete_data(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<OwnerQuery>,
) -> Result<HttpResponse, ApiError> {
    crate::auth::acting_as(&req, &query.owner)?;
    let summary = state
        .relay
        .delete_shared_data(query.owner.trim(), &path, session(&req))
        .await?;
    Ok(HttpResponse::Ok().json(summary))
}
