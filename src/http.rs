//! What the HTTP faces share: who a request's caller is (the auth middleware's principal and
//! the session header), the REST face's policy and body limit, the transport routes'
//! paths, and `/healthz`.

use crate::ops::{Caller, Ctx, FacePolicy, Principal};
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use std::time::Duration;

/// Messages one read returns when the client names no `limit`.
pub const DEFAULT_LIMIT: usize = 1000;
/// Header carrying the session token `POST /api/register` returned.
pub const SESSION_HEADER: &str = "x-crosstalk-session";

/// The REST face's policy: scripts page in large steps and may block for minutes.
#[derive(Debug, Clone, Copy)]
pub struct RestPolicy(pub FacePolicy);

impl RestPolicy {
    pub fn new(wait_cap: Duration) -> Self {
        RestPolicy(FacePolicy {
            default_limit: DEFAULT_LIMIT,
            wait_cap,
        })
    }
}

/// Largest JSON body a route reads; set from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Routes that are transport, not operations (documented by hand in the OpenAPI document).
pub const STREAM_PATH: &str = "/api/channels/{channel}/stream";
pub const HEALTH_PATH: &str = "/healthz";
pub const OPENAPI_PATH: &str = "/openapi.json";

/// The session token the request carries, if any.
pub fn session(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The caller of a REST request: the auth middleware's principal and the session header.
pub fn caller(req: &HttpRequest, session_override: Option<String>) -> Caller {
    let policy = req
        .app_data::<web::Data<RestPolicy>>()
        .map_or(RestPolicy::new(Duration::from_secs(300)), |p| *p.get_ref());
    Caller {
        principal: req
            .extensions()
            .get::<Principal>()
            .cloned()
            .unwrap_or(Principal::Anyone),
        session: session(req).map(str::to_owned).or(session_override),
        bound: None,
        policy: policy.0,
    }
}

pub async fn healthz(cx: web::Data<Ctx>) -> HttpResponse {
    use std::sync::atomic::Ordering;
    let streams = cx.streams.load(Ordering::Relaxed);
    let waits = cx.waits.load(Ordering::Relaxed);
    if let Err(reason) = cx.relay.store_health() {
        // A load balancer or orchestrator takes a 503 as "not ready".
        return HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": "unhealthy", "reason": reason, "streams": streams, "waits": waits,
        }));
    }
    let status = if cx.relay.shutdown_token().is_cancelled() {
        "stopping"
    } else {
        "ok"
    };
    HttpResponse::Ok().json(serde_json::json!({ "status": status, "streams": streams, "waits": waits }))
}
