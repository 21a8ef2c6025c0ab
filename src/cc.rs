//! The cross-claude face at `/cc`: cross-claude-mcp's REST routes (`/cc/api`), its MCP tools
//! and prompt (`/cc/mcp`), `/cc/health` and `/cc/openapi.json` with its operationIds, so a
//! cross-claude-mcp user switches by changing a URL. Routes and tools are tables over the
//! operations ([`ops`] adapts cross-claude's argument names and answer shapes); the rules are
//! the operations'. `?api_key=` is accepted on `/cc/*` only (`crate::auth`).
//!
//! A cross-claude REST client sends no session: its calls share the session `cc-rest:<who the
//! token is>`, so an identity it registers is bound to its token, and an MCP session (or
//! another token) cannot post as it while it is active — nor it as theirs.

pub mod ops;

use crate::http::caller;
use crate::ops::{channels, identity, shared, Caller, Principal};
use crate::rest::{route, Endpoint, Face};
use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};
use std::sync::LazyLock;

pub const HEALTH_PATH: &str = "/cc/health";
pub const OPENAPI_PATH: &str = "/cc/openapi.json";
pub const MCP_PATH: &str = "/cc/mcp";

/// A cross-claude REST caller: the request's session if it sends one, else one per token.
fn cc_caller(req: &HttpRequest) -> Caller {
    let mut c = caller(req, None);
    if c.session.is_none() {
        let who = match &c.principal {
            Principal::Anyone => "anyone",
            Principal::Shared => "shared",
            Principal::Participant(id) => id.as_str(),
        };
        c.session = Some(format!("cc-rest:{who}"));
    }
    c
}

const CC_REST: Face = Face {
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
        cc::<ops::Register>(M::POST, "/cc/api/register", "register"),
        cc::<identity::ListInstances>(M::GET, "/cc/api/instances", "listInstances"),
        cc::<ops::CreateChannel>(M::POST, "/cc/api/channels", "createChannel"),
        cc::<channels::ListChannels>(M::GET, "/cc/api/channels", "listChannels"),
        cc::<ops::FindChannelByQ>(M::GET, "/cc/api/channels/search", "findChannel"),
        cc::<ops::SearchByQ>(M::GET, "/cc/api/search", "searchMessages"),
        cc::<shared::Share>(M::POST, "/cc/api/data", "shareData"),
        cc::<shared::ListData>(M::GET, "/cc/api/data", "listSharedData"),
        cc::<shared::GetData>(M::GET, "/cc/api/data/{key}", "getSharedData"),
    ]
});

/// Mounts `/cc/api`, `/cc/health` and `/cc/openapi.json` (`/cc/mcp` is mounted with `/mcp`).
pub fn routes(cfg: &mut web::ServiceConfig) {
    crate::rest::mount(cfg, &ENDPOINTS);
    cfg.service(crate::rest::resource(HEALTH_PATH, &[Method::GET]).route(web::get().to(crate::http::healthz)));
    cfg.service(crate::rest::resource(OPENAPI_PATH, &[Method::GET]).route(web::get().to(serve_openapi)));
}

fn transport_routes(paths: &mut Map<String, Value>) {
    paths.insert(
        HEALTH_PATH.into(),
        json!({ "get": {
            "operationId": "health", "summary": "health", "security": [],
            "description": "Liveness; needs no token.",
            "responses": { "200": { "description": "the relay is up", "content": { "application/json": { "schema": { "type": "object" } } } } }
        } }),
    );
}

/// `/cc/openapi.json`, built once from the table.
pub static DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    crate::openapi::document(
        &ENDPOINTS,
        json!({
            "title": "Cross-Claude MCP message bus (crosstalk)",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "cross-claude-mcp's REST API, served by crosstalk: register, then read and send messages on named channels. Send message_type done when you are finished. MCP is at /cc/mcp.",
        }),
        transport_routes,
    )
});

async fn serve_openapi() -> HttpResponse {
    HttpResponse::Ok().json(&*DOCUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_has_cross_claudes_operation_ids() {
        let doc = &*DOCUMENT;
        let mut ids: Vec<&str> = Vec::new();
        for item in doc["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                ids.push(op["operationId"].as_str().unwrap());
            }
        }
        for want in [
            "register",
            "listInstances",
            "createChannel",
            "listChannels",
            "findChannel",
            "sendMessage",
            "getMessages",
            "getReplies",
            "searchMessages",
            "shareData",
            "listSharedData",
            "getSharedData",
        ] {
            assert!(ids.contains(&want), "{want} missing from {ids:?}");
        }
        let q = &doc["paths"]["/cc/api/search"]["get"]["parameters"];
        assert!(q.as_array().unwrap().iter().any(|p| p["name"] == "q"), "{q}");
    }
}
