//! The webhooks face: the admin's `/api/webhooks` routes, and the loop that delivers — each
//! webhook's channel read from its durable cursor, each message of its types POSTed, signed,
//! the cursor moved only once the receiver said 2xx, failures retried with a growing pause
//! (1 s to 5 minutes) and shown in the webhook's state. A receiver that is down loses
//! nothing; on a cluster one node at a time delivers each webhook (its lease). The rules and
//! records are [`crate::ops::webhooks`]'s. See docs/webhooks.md.

use crate::api;
use crate::http::routes::at;
use crate::http::Body;
use crate::ops::webhooks::{self, NewWebhook, WebhookList, Webhooks};
use crate::ops::{Ctx, Principal};
use actix_web::http::StatusCode;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse, ResponseError};
use crosstalk_schema::webhook::{Webhook, WebhookFormat};
use crosstalk_schema::ChannelName;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

/// How long one delivery may take.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages read from a channel at a time.
const BATCH: usize = 50;
/// How often an idle webhook looks for new messages, and the set of webhooks is looked at.
const IDLE: Duration = Duration::from_millis(300);

/// What the routes and the loop share.
pub struct Settings {
    pub hooks: Webhooks,
    /// Deliver to loopback and private addresses too (`--webhooks-allow-private`).
    pub allow_private: bool,
}

fn error(status: StatusCode, code: &'static str, message: impl Into<String>) -> HttpResponse {
    crate::error::ApiError::new(status, code, message).error_response()
}

fn admin(req: &HttpRequest) -> Result<(), Box<HttpResponse>> {
    match req.extensions().get::<Principal>() {
        Some(p) if p.manages_webhooks() => Ok(()),
        _ => Err(Box::new(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only the relay's own token (--token) may manage webhooks",
        ))),
    }
}

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route(api::ADD_WEBHOOK.path, at(api::ADD_WEBHOOK.verb).to(create));
    cfg.route(api::LIST_WEBHOOKS.path, at(api::LIST_WEBHOOKS.verb).to(list));
    cfg.route(api::REMOVE_WEBHOOK.path, at(api::REMOVE_WEBHOOK.verb).to(remove));
}

/// A client for `url`: http(s), no user or password, and (by [`crate::client::pinned`]) to a
/// public address unless private ones are allowed, connected to the address checked.
async fn target(url: &str, allow_private: bool) -> Result<(reqwest::Url, reqwest::Client), String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") || !u.username().is_empty() || u.password().is_some() {
        return Err("a webhook URL is http:// or https://, without a user or password".into());
    }
    match crate::client::pinned(&u, allow_private, DELIVERY_TIMEOUT, None).await {
        Ok(http) => Ok((u, http)),
        Err(e) if e.private => Err(format!(
            "{}: webhooks go to public addresses unless the relay runs with --webhooks-allow-private",
            e.message
        )),
        Err(e) => Err(e.message),
    }
}

async fn create(req: HttpRequest, s: web::Data<Settings>, cx: web::Data<Ctx>) -> HttpResponse {
    if let Err(r) = admin(&req) {
        return *r;
    }
    let body = Body::take(&req).unwrap_or_default();
    let r: NewWebhook = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_input",
                format!("invalid webhook: {e}"),
            )
        }
    };
    let channel = match ChannelName::parse(&r.channel) {
        Ok(c) => c,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_input", e.to_string()),
    };
    if let Err(why) = target(&r.url, s.allow_private).await {
        return error(StatusCode::BAD_REQUEST, "invalid_input", why);
    }
    let from = match cx.relay.channel_last_id(&channel) {
        Ok(id) => id,
        Err(e) => return stored(e),
    };
    match s
        .hooks
        .create(&channel, r.url, r.types, r.format.unwrap_or(WebhookFormat::Json), from)
        .await
    {
        Ok(v) => HttpResponse::Created().json(v),
        Err(e) => crate::error::ApiError::from(e).error_response(),
    }
}

async fn list(req: HttpRequest, s: web::Data<Settings>) -> HttpResponse {
    if let Err(r) = admin(&req) {
        return *r;
    }
    match s.hooks.list().await {
        Ok(webhooks) => HttpResponse::Ok().json(WebhookList { webhooks }),
        Err(e) => stored(e),
    }
}

async fn remove(req: HttpRequest, s: web::Data<Settings>, id: web::Path<String>) -> HttpResponse {
    if let Err(r) = admin(&req) {
        return *r;
    }
    match s.hooks.delete(&id).await {
        Ok(true) => HttpResponse::NoContent().finish(),
        Ok(false) => error(StatusCode::NOT_FOUND, "not_found", format!("no webhook {id:?}")),
        Err(e) => stored(e),
    }
}

/// A store's error as every operation answers it (503 `store_unavailable` for a write that
/// failed, 500 `storage` for damage), not one status for all.
fn stored(e: crosstalk_actors::RelayError) -> HttpResponse {
    crate::error::ApiError::from(crate::ops::OpError::from(e)).error_response()
}

// ---- delivery

/// This node's name for delivery leases: random, kept in the data directory, so a restart
/// takes its own lease back at once, and two nodes (each with its own directory) never share
/// one.
pub fn node_id(data_dir: &std::path::Path) -> String {
    let path = data_dir.join("webhook-node-id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        let id = id.trim();
        if !id.is_empty() {
            return id.to_owned();
        }
    }
    let id = crate::ops::oauth::random_hex(8);
    if let Err(e) = std::fs::write(&path, &id) {
        tracing::warn!(error = %e, path = %path.display(), "cannot keep this node's webhook id; a restart waits for its old lease");
    }
    id
}

/// Longest the webhook supervisor goes without listing every webhook, however unchanged
/// their version says they are.
const RELIST_EVERY: Duration = Duration::from_secs(60);

/// Starts delivering as `node`: one task watching the set of webhooks, one per webhook,
/// until the relay shuts down.
pub fn start(cx: Ctx, settings: web::Data<Settings>, node: String) {
    let shutdown = cx.relay.shutdown_token();
    tokio::spawn(async move {
        let mut running: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
        // The webhooks' version at the last listing, and when that was: on a cluster, listing
        // a bucket makes and drops a consumer on the servers, so the set is listed only when
        // it changed, a task ended, or a while has passed.
        let mut listed: Option<(u64, tokio::time::Instant)> = None;
        loop {
            let version = settings.hooks.version().await.ok().flatten();
            let unchanged = matches!((listed, version), (Some((was, at)), Some(now)) if was == now && at.elapsed() < RELIST_EVERY)
                && running.values().all(|task| !task.is_finished());
            let listing = if unchanged {
                None
            } else {
                settings.hooks.all().await.ok()
            };
            if let Some(all) = listing {
                listed = version.map(|v| (v, tokio::time::Instant::now()));
                let ids: Vec<String> = all.iter().map(|h| h.id.clone()).collect();
                running.retain(|id, task| {
                    let keep = ids.contains(id) && !task.is_finished();
                    if !keep {
                        task.abort();
                    }
                    keep
                });
                for h in all {
                    if let std::collections::hash_map::Entry::Vacant(slot) = running.entry(h.id.clone()) {
                        let task = tokio::spawn(deliver(cx.clone(), settings.clone(), h.id, node.clone()));
                        slot.insert(task.abort_handle());
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        for task in running.values() {
            task.abort();
        }
    });
}

/// Delivers one webhook while this node holds its lease (the supervisor ends the task when
/// the webhook is deleted). The webhook and its cursor are read when the lease is taken —
/// only the holder writes the cursor, so they stay right in memory while it holds it — and
/// the lease is renewed when half of it has run, not on every look at the channel.
async fn deliver(cx: Ctx, s: web::Data<Settings>, id: String, node: String) {
    let hooks = &s.hooks;
    // The webhook, its channel and its delivery state, while this node holds the lease.
    let mut held: Option<(Webhook, ChannelName, crosstalk_schema::webhook::Delivery)> = None;
    let mut renew_at = tokio::time::Instant::now();
    loop {
        if held.is_none() || tokio::time::Instant::now() >= renew_at {
            if !hooks.hold(&id, &node).await.unwrap_or(false) {
                held = None;
                tokio::time::sleep(webhooks::LEASE / 3).await;
                continue;
            }
            renew_at = tokio::time::Instant::now() + webhooks::LEASE / 2;
            if held.is_none() {
                let (Ok(Some(hook)), Ok(state)) = (hooks.get(&id).await, hooks.delivery(&id).await) else {
                    tokio::time::sleep(IDLE).await;
                    continue;
                };
                let Ok(channel) = ChannelName::parse(&hook.channel) else {
                    return;
                };
                held = Some((hook, channel, state));
            }
        }
        let Some((hook, channel, state)) = held.as_mut() else {
            continue;
        };
        let batch = cx
            .relay
            .read(channel, state.last_id, BATCH, None)
            .await
            .unwrap_or_default();
        if batch.is_empty() {
            tokio::time::sleep(IDLE).await;
            continue;
        }
        // Removed meanwhile: send nothing more (the supervisor would end this task within a
        // second; a message posted in that second must not go out).
        if batch
            .iter()
            .any(|p| webhooks::wanted(&hook.types, p.message.kind.as_str()))
            && !matches!(hooks.get(&id).await, Ok(Some(_)))
        {
            return;
        }
        let mut written = state.last_id;
        for posted in batch {
            if webhooks::wanted(&hook.types, posted.message.kind.as_str()) {
                if let Err(why) = send(hook, &posted, s.allow_private).await {
                    let wait = webhooks::backoff(state.attempts);
                    state.attempts += 1;
                    state.failing_since.get_or_insert(webhooks::now());
                    state.last_error = Some(why.clone());
                    state.next_attempt_at = Some(webhooks::now() + wait.as_secs() as i64);
                    crosstalk_actors::throttled!(warn, webhook = %id, error = %why, "a webhook delivery failed; retrying");
                    let _ = hooks.put_delivery(&id, state).await;
                    written = state.last_id;
                    // Hold the lease while waiting, so no other node starts over meanwhile.
                    let until = tokio::time::Instant::now() + wait;
                    while tokio::time::Instant::now() < until {
                        tokio::time::sleep((until - tokio::time::Instant::now()).min(webhooks::LEASE / 3)).await;
                        let _ = hooks.hold(&id, &node).await;
                    }
                    renew_at = tokio::time::Instant::now() + webhooks::LEASE / 2;
                    break;
                }
                state.delivered += 1;
                state.attempts = 0;
                state.failing_since = None;
                state.last_error = None;
                state.next_attempt_at = None;
                state.last_id = posted.id();
                // Durable before the next delivery: a restart sends again at most the one in
                // flight.
                if hooks.put_delivery(&id, state).await.is_err() {
                    held = None;
                    break;
                }
                written = state.last_id;
            } else {
                // Passed over: written with the next delivery, or at the batch's end.
                state.last_id = posted.id();
            }
        }
        if let Some((_, _, state)) = held.as_ref() {
            if state.last_id != written && hooks.put_delivery(&id, state).await.is_err() {
                held = None;
            }
        }
    }
}

/// The body of a delivery in the webhook's format.
fn body(hook: &Webhook, posted: &crosstalk_actors::Posted) -> Value {
    let m = &posted.message;
    match hook.format {
        WebhookFormat::Json => json!({"webhook": hook.id, "channel": m.channel, "message": m}),
        WebhookFormat::Slack => {
            let mut text = format!("[#{}] {}", m.channel, m.sender);
            if !m.kind.is(crosstalk_schema::Meaning::Message) {
                text.push_str(&format!(" ({})", m.kind));
            }
            if let Some(to) = &m.recipient {
                text.push_str(&format!(" → {to}"));
            }
            text.push_str(&format!(": {}", m.body));
            json!({ "text": text })
        }
    }
}

/// One POST to the receiver, to the address checked just before; `Err` unless it says 2xx.
async fn send(hook: &Webhook, posted: &crosstalk_actors::Posted, allow_private: bool) -> Result<(), String> {
    let (url, http) = target(&hook.url, allow_private).await?;
    let payload = serde_json::to_vec(&body(hook, posted)).map_err(|e| e.to_string())?;
    let ts = webhooks::now();
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .header("x-crosstalk-webhook", &hook.id)
        .header("x-crosstalk-event-id", posted.id().to_string())
        .header("x-crosstalk-timestamp", ts.to_string())
        .header("x-crosstalk-signature", webhooks::sign(&hook.secret, ts, &payload))
        .body(payload)
        .send()
        .await
        .map_err(|e| format!("cannot reach it: {}", crate::client::root(&e)))?;
    if r.status().is_success() {
        Ok(())
    } else {
        Err(format!("it answered {}", r.status()))
    }
}
