//! The cross-claude face at `/cc`: cross-claude-mcp's REST routes (`/cc/api`), its MCP tools
//! and prompt (`/cc/mcp`), `/cc/health` and `/cc/openapi.json` with its operationIds, so a
//! cross-claude-mcp user switches by changing a URL. Routes and tools are tables over the
//! operations (`crate::ops::cross_claude` holds cross-claude's argument names, answer shapes
//! and its own rules). `?api_key=` is accepted on `/cc/*` only (`crate::auth`).
//!
//! A cross-claude REST client sends no session: its calls share the session `cc-rest` of its
//! token (every session is its token's, see [`crate::ops::Principal::session`]), so an
//! identity it registers is bound to its token, and an MCP session (or another token) cannot
//! post as it while it is active — nor it as theirs.

use crate::http::routes::{mount, resource, route, Endpoint, RestFace};
use crate::http::{caller, CC_HEALTH_PATH};
use crate::ops::cross_claude as ops;
use crate::ops::Caller;
use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpRequest};
use serde_json::{json, Map, Value};
use std::sync::LazyLock;

pub const HEALTH_PATH: &str = CC_HEALTH_PATH;
pub const OPENAPI_PATH: &str = "/cc/openapi.json";
pub const MCP_PATH: &str = "/cc/mcp";

/// A cross-claude REST caller: the request's session if it sends one, else one per token.
fn cc_caller(req: &HttpRequest) -> Caller {
    let mut c = caller(req, None);
    if c.session.is_none() {
        c.session = Some(c.principal.session("cc-rest"));
    }
    c
}

const CC_REST: RestFace = RestFace {
    name: "cc-rest",
    caller: cc_caller,
};

/// A route answering with the operation's response as it is.
fn cc<O: crate::ops::Operation>(method: Method, path: &'static str, operation_id: &'static str) -> Endpoint {
    route::<O, O::Response>(CC_REST, Some(operation_id), method, path, StatusCode::OK, |r| r)
}

/// cross-claude-mcp's routes, their shapes and operationIds.
pub static ENDPOINTS: LazyLock<Vec<Endpoint>> = LazyLock::new(|| {
    use Method as M;
    vec![
        cc::<ops::GetMessages>(M::GET, "/cc/api/messages/{channel}", "getMessages"),
        cc::<ops::SendMessage>(M::POST, "/cc/api/messages", "sendMessage"),
        cc::<ops::GetReplies>(M::GET, "/cc/api/messages/{channel}/{message_id}/replies", "getReplies"),
        cc::<ops::CcRegister>(M::POST, "/cc/api/register", "register"),
        cc::<ops::ListInstances>(M::GET, "/cc/api/instances", "listInstances"),
        cc::<ops::CreateChannel>(M::POST, "/cc/api/channels", "createChannel"),
        cc::<ops::ListChannels>(M::GET, "/cc/api/channels", "listChannels"),
        cc::<ops::FindChannelByQ>(M::GET, "/cc/api/channels/search", "findChannel"),
        cc::<ops::SearchByQ>(M::GET, "/cc/api/search", "searchMessages"),
        cc::<ops::ShareData>(M::POST, "/cc/api/data", "shareData"),
        cc::<ops::ListSharedData>(M::GET, "/cc/api/data", "listSharedData"),
        cc::<ops::GetSharedData>(M::GET, "/cc/api/data/{key}", "getSharedData"),
    ]
});

/// Mounts `/cc/api` and `/cc/health` (`/cc/mcp` is mounted with `/mcp`, `/cc/openapi.json`
/// with `/openapi.json`).
pub fn routes(cfg: &mut web::ServiceConfig) {
    mount(cfg, &ENDPOINTS);
    cfg.service(resource(HEALTH_PATH, &[Method::GET]).route(web::get().to(crate::http::healthz)));
}

/// What `/cc/openapi.json` documents besides the table: the health check.
pub fn transport_routes(paths: &mut Map<String, Value>) {
    paths.insert(
        HEALTH_PATH.into(),
        json!({ "get": {
            "operationId": "health", "summary": "health", "security": [],
            "description": "Liveness; needs no token.",
            "responses": { "200": { "description": "the relay is up", "content": { "application/json": { "schema": { "type": "object" } } } } }
        } }),
    );
}

/// `/cc/openapi.json`'s `info`.
pub fn openapi_info() -> Value {
    json!({
        "title": "Cross-Claude MCP message bus (crosstalk)",
        "version": env!("CARGO_PKG_VERSION"),
        "description": "cross-claude-mcp's REST API, served by crosstalk: register, then read and send messages on named channels. Send message_type done when you are finished. MCP is at /cc/mcp.",
    })
}
