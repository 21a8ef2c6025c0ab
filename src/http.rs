//! What the HTTP faces and the middleware share: who a request's caller is (the auth
//! middleware's principal and the session header), the request body the guard read, the REST
//! faces' policy, the transport routes' paths, the paths open without a token and the SSE
//! route's test, `/healthz`, and the REST route tables' machinery ([`routes`]).

pub mod routes;

use crate::error::ApiError;
use crate::ops::{Caller, Ctx, FacePolicy, Principal};
use actix_web::http::StatusCode;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse, ResponseError};
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
            agents: false,
            default_limit: DEFAULT_LIMIT,
            wait_cap,
        })
    }
}

/// A request's body, read whole by the guard (`crate::guard`) within the time and size limits
/// before any handler runs: the one place a body is read and measured. The guard also puts it
/// back as the payload, for the libraries that read that (rmcp).
#[derive(Debug, Clone)]
pub struct Body(pub web::Bytes);

impl Body {
    /// Takes the body the guard read (each handler reads its request's body once).
    pub fn take(req: &HttpRequest) -> Result<web::Bytes, ApiError> {
        req.extensions_mut().remove::<Body>().map(|b| b.0).ok_or_else(|| {
            // Every route is behind the guard (`crate::server`): this is a wiring mistake.
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the request body was not read",
            )
        })
    }
}

/// Routes that are transport, not operations (documented by hand in the OpenAPI document).
pub const STREAM_PATH: &str = "/api/channels/{channel}/stream";
pub const HEALTH_PATH: &str = "/healthz";
pub const OPENAPI_PATH: &str = "/openapi.json";
/// cross-claude-mcp's health check (the `/cc` face's).
pub const CC_HEALTH_PATH: &str = "/cc/health";

/// The health checks: they answer any Host and need no token (load balancers and
/// orchestrators probe them by address, and they tell nothing).
pub const HEALTH_PATHS: [&str; 2] = [HEALTH_PATH, CC_HEALTH_PATH];

/// The web console's page and its static files (`/` redirects to the page): served without a
/// token, since the page holds no data and asks the person for theirs.
pub mod console {
    pub const ROOT: &str = "/";
    pub const PAGE: &str = "/ui";
    pub const PAGE_SLASH: &str = "/ui/";
    pub const SCRIPT: &str = "/ui/app.js";
    pub const STYLE: &str = "/ui/app.css";
    pub const PATHS: [&str; 5] = [ROOT, PAGE, PAGE_SLASH, SCRIPT, STYLE];
}

/// The paths served without a token: the health checks, the console's files, and where an
/// MCP client looks for OAuth.
pub fn is_open(path: &str) -> bool {
    HEALTH_PATHS.contains(&path) || console::PATHS.contains(&path) || oauth_discovery(path)
}

/// Where an MCP client looks for OAuth (RFC 9728 / RFC 8414 metadata) and walks through it
/// (registration, the consent page, tokens), under `/oauth/` and at the root, where clients
/// that could not read the metadata look. With `--oauth` the OAuth face answers them without
/// a token; without it they answer 404 with or without one, which the MCP authorization spec
/// reads as "no authorization server", rather than a 401 that sends a client such as
/// mcp-remote into a registration it cannot complete.
pub fn oauth_discovery(path: &str) -> bool {
    path.starts_with("/.well-known/oauth-")
        || path.starts_with("/.well-known/openid-configuration")
        || matches!(
            path,
            "/oauth/register"
                | "/oauth/authorize"
                | "/oauth/token"
                | "/oauth/revoke"
                | "/register"
                | "/authorize"
                | "/token"
                | "/revoke"
        )
}

/// The `WWW-Authenticate` of a 401 when OAuth is on: where the metadata of what was asked for
/// is, and, if a token was sent, that it is not (or no longer) good.
pub fn oauth_challenge(issuer: &str, path: &str, token_sent: bool) -> String {
    let suffix = if path == "/mcp" || path.starts_with("/mcp/") {
        "/mcp"
    } else if path == "/cc/mcp" || path.starts_with("/cc/mcp/") {
        "/cc/mcp"
    } else {
        ""
    };
    let error = if token_sent { "error=\"invalid_token\", " } else { "" };
    format!(
        "Bearer {error}resource_metadata=\"{issuer}/.well-known/oauth-protected-resource{suffix}\", scope=\"{}\"",
        crate::ops::oauth::SCOPE
    )
}

/// The 401 for a request to `path` whose token is missing (`presented` false), wrong, or no
/// longer good, saying where the OAuth metadata is when the relay is an authorization server.
pub fn unauthorized(path: &str, presented: bool, oauth: Option<&crate::ops::oauth::OAuth>) -> HttpResponse {
    let mut resp = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        match (presented, oauth) {
            (true, Some(_)) => "the bearer token is wrong, expired or revoked (an OAuth client refreshes it or connects again)",
            (false, Some(_)) => "a bearer token is required: connect with OAuth (see WWW-Authenticate), or send Authorization: Bearer <token>",
            _ => "missing or wrong bearer token (send Authorization: Bearer <token>)",
        },
    )
    .error_response();
    let challenge = match oauth {
        Some(o) => oauth_challenge(&o.issuer, path, presented),
        None => "Bearer".to_owned(),
    };
    if let Ok(v) = actix_web::http::header::HeaderValue::from_str(&challenge) {
        resp.headers_mut().insert(actix_web::http::header::WWW_AUTHENTICATE, v);
    }
    resp
}

/// [`STREAM_PATH`], `/api/channels/{channel}/stream`, and nothing else: where EventSource
/// clients, which cannot send headers, may send their token in the query, and whose answers
/// set their own caching headers.
pub fn is_sse_stream(path: &str) -> bool {
    path.strip_prefix("/api/channels/")
        .and_then(|rest| rest.strip_suffix("/stream"))
        .is_some_and(|channel| !channel.is_empty() && !channel.contains('/'))
}

/// A health check's path.
pub fn is_health(path: &str) -> bool {
    HEALTH_PATHS.contains(&path)
}

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
    let principal = req
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or(Principal::Anyone);
    Caller {
        session: session(req)
            .map(str::to_owned)
            .or(session_override)
            .map(|s| principal.session(&s)),
        principal,
        bound: None,
        bound_only: true,
        policy: policy.0,
    }
}

pub async fn healthz(cx: web::Data<Ctx>) -> HttpResponse {
    use std::sync::atomic::Ordering;
    let streams = cx.streams.load(Ordering::Relaxed);
    let waits = cx.waits.load(Ordering::Relaxed);
    let sessions = cx.mcp_sessions.load(Ordering::Relaxed);
    let initializing = cx.mcp_initializing.load(Ordering::Relaxed);
    // A load balancer or orchestrator takes a 503 as "not ready": the store (or NATS) failing,
    // or a cluster node still folding what the shared log held when it connected (it serves
    // meanwhile, but a post waits behind the catch-up).
    let not_ready = (cx.relay.store_health().map_err(|why| ("unhealthy", why)))
        .and_then(|()| cx.relay.readiness().map_err(|why| ("catching_up", why)));
    if let Err((status, reason)) = not_ready {
        return HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": status, "reason": reason, "streams": streams, "waits": waits,
            "sessions": sessions, "sessions_initializing": initializing,
        }));
    }
    let status = if cx.relay.shutdown_token().is_cancelled() {
        "stopping"
    } else {
        "ok"
    };
    HttpResponse::Ok().json(serde_json::json!({
        "status": status, "streams": streams, "waits": waits,
        "sessions": sessions, "sessions_initializing": initializing,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sse_route_is_the_sse_route() {
        assert!(is_sse_stream("/api/channels/dev/stream"));
        for other in [
            "/api/data/stream",
            "/api/channels//stream",
            "/api/channels/a/b/stream",
            "/cc/api/messages/stream",
            "/stream",
        ] {
            assert!(!is_sse_stream(other), "{other}");
        }
    }
}
