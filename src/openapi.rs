//! The OpenAPI 3.1 documents of the REST faces, `/openapi.json` (crosstalk's `/api`) and
//! `/cc/openapi.json` (cross-claude's `/cc/api`), generated from each face's route table and
//! the operations' request and response types (their JSON Schemas, draft 2020-12, which is
//! OpenAPI 3.1's dialect). Nothing in them is written by hand except the transport routes
//! (`/healthz`, the SSE stream, `/metrics`, this document, `/mcp`; `/cc/health`) and the error
//! body. It documents every REST face, so it is composition: no face imports it.

use crate::http::routes::Endpoint;
use crate::http::{HEALTH_PATH, OPENAPI_PATH, STREAM_PATH};
use crate::rest::ENDPOINTS;
use crate::telemetry::METRICS_PATH;
use actix_web::HttpResponse;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};
use std::sync::LazyLock;

/// Every error's body.
#[derive(JsonSchema, serde::Serialize)]
#[allow(dead_code)] // described, never built: `ApiError` writes it
struct ErrorBody {
    /// What went wrong, for a person.
    error: String,
    /// What went wrong, for a program: invalid_input, unauthorized, forbidden, not_found,
    /// no_active_session, conflict, too_large, method_not_allowed, not_acceptable,
    /// unsupported_media_type, storage, unavailable, shutting_down, internal.
    code: String,
    /// `no_active_session` on that error (crosstalk-mcp's field); absent on the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<String>,
}

const COMPONENTS: &str = "/components/schemas";

fn generator(serialize: bool) -> SchemaGenerator {
    let settings = SchemaSettings::draft2020_12().with(|s| s.definitions_path = COMPONENTS.into());
    if serialize {
        settings.for_serialize().into_generator()
    } else {
        settings.for_deserialize().into_generator()
    }
}

/// The path's parameters: `{channel}` → `channel`.
pub fn path_params(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .collect()
}

/// An object schema's own form: follows a `$ref` into the generated definitions.
fn resolve(schema: &Value, defs: &Map<String, Value>) -> Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or_default();
            defs.get(name).cloned().unwrap_or(Value::Null)
        }
        None => schema.clone(),
    }
}

fn error_responses(e: &Endpoint) -> Map<String, Value> {
    let error = json!({ "$ref": "#/components/schemas/ErrorBody" });
    let mut out = Map::new();
    let mut add = |status: &str, what: &str| {
        out.insert(
            status.into(),
            json!({ "description": what, "content": { "application/json": { "schema": error } } }),
        );
    };
    add("400", "invalid input; nothing changed");
    add("401", "missing or wrong bearer token");
    add("403", "the token or session may not act as that identity");
    add("404", "what the request names does not exist");
    if e.method != actix_web::http::Method::GET || e.conflicts {
        add("409", "conflicts with the current state");
    }
    if e.method != actix_web::http::Method::GET {
        add("413", "the body is too large");
    }
    add(
        "429",
        "too many requests: the token's --rate-limit, the waits and streams it holds, or failed authentications \
         from this address; see Retry-After",
    );
    add("500", "the store failed; nothing was acknowledged");
    add("503", "overloaded or shutting down; try again");
    out
}

fn operation(e: &Endpoint, req: &mut SchemaGenerator, resp: &mut SchemaGenerator) -> Value {
    let request = Value::from((e.request)(req));
    let request = resolve(&request, req.definitions());
    let in_path = path_params(e.path);
    let required: Vec<&str> = request
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let properties = request
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut parameters: Vec<Value> = in_path
        .iter()
        .map(|p| {
            let schema = properties.get(*p).cloned().unwrap_or(json!({ "type": "string" }));
            json!({ "name": p, "in": "path", "required": true, "schema": schema })
        })
        .collect();
    parameters.push(session_header());
    let mut op = json!({
        "operationId": e.operation_id.map_or_else(
            || format!("{}_{}", e.name, e.method.as_str().to_ascii_lowercase()),
            str::to_owned,
        ),
        "summary": e.name,
        "description": e.description,
    });
    if e.method == actix_web::http::Method::POST {
        let mut body = request.clone();
        if let Some(props) = body.get_mut("properties").and_then(Value::as_object_mut) {
            for p in &in_path {
                props.remove(*p);
            }
        }
        if let Some(req) = body.get_mut("required").and_then(Value::as_array_mut) {
            req.retain(|r| !in_path.contains(&r.as_str().unwrap_or_default()));
        }
        op["requestBody"] = json!({
            "required": !body["required"].as_array().is_none_or(|r| r.is_empty()),
            "content": { "application/json": { "schema": body } }
        });
    } else {
        for (name, schema) in &properties {
            if in_path.contains(&name.as_str()) {
                continue;
            }
            parameters.push(json!({
                "name": name,
                "in": "query",
                "required": required.contains(&name.as_str()),
                "schema": schema,
            }));
        }
    }
    op["parameters"] = Value::Array(parameters);
    let mut responses = error_responses(e);
    responses.insert(
        e.status.as_u16().to_string(),
        json!({
            "description": "success",
            "content": { "application/json": { "schema": Value::from((e.response)(resp)) } }
        }),
    );
    op["responses"] = Value::Object(responses);
    op
}

/// The session a registered identity is bound to (`POST /api/register` returns it): needed
/// to act as that identity.
fn session_header() -> Value {
    json!({
        "name": crate::http::SESSION_HEADER, "in": "header", "required": false,
        "description": "The session POST /api/register returned; needed to act as a registered identity.",
        "schema": { "type": "string" }
    })
}

fn transport_routes(paths: &mut Map<String, Value>) {
    paths.insert(HEALTH_PATH.into(), json!({ "get": {
        "operationId": "healthz", "summary": "health", "security": [],
        "description": "Liveness and the number of open streams, waits and MCP sessions (and of those still in their \
            handshake). Needs no token.",
        "responses": { "200": { "description": "the relay is up", "content": { "application/json": { "schema": {
            "type": "object", "required": ["status", "streams", "waits", "sessions", "sessions_initializing"],
            "properties": { "status": { "type": "string" }, "streams": { "type": "integer" }, "waits": { "type": "integer" },
                "sessions": { "type": "integer" }, "sessions_initializing": { "type": "integer" } }
        } } } } }
    } }));
    paths.insert(STREAM_PATH.into(), json!({ "get": {
        "operationId": "stream", "summary": "stream",
        "description": "Server-sent events: `ready`, then every message after since_id (or Last-Event-ID) and every new one as `message` with `id:` its id; `presence` events. `?token=` / `?relay_token=` are accepted here for EventSource.",
        "parameters": [
            { "name": "channel", "in": "path", "required": true, "schema": { "type": "string" } },
            { "name": "since_id", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 0 } },
            { "name": "participant_id", "in": "query", "required": false, "schema": { "type": "string" } },
            { "name": "display_name", "in": "query", "required": false, "schema": { "type": "string" } },
            { "name": "kind", "in": "query", "required": false, "schema": { "type": "string" } },
            { "name": "side", "in": "query", "required": false, "schema": { "type": "string" } },
            { "name": "session", "in": "query", "required": false, "description": "the session header's value, for EventSource", "schema": { "type": "string" } },
            { "name": "token", "in": "query", "required": false, "description": "the bearer token, for EventSource (also `relay_token`)", "schema": { "type": "string" } },
            { "name": "relay_token", "in": "query", "required": false, "schema": { "type": "string" } },
            { "name": "x-crosstalk-session", "in": "header", "required": false, "schema": { "type": "string" } },
            { "name": "Last-Event-ID", "in": "header", "required": false, "schema": { "type": "string" } }
        ],
        "responses": {
            "200": { "description": "an event stream", "content": { "text/event-stream": { "schema": { "type": "string" } } } },
            "400": { "description": "invalid input", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } } },
            "401": { "description": "missing or wrong token", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } } },
            "403": { "description": "may not act as that participant", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } } },
            "429": { "description": "too many requests: the waits and streams this token holds, its --rate-limit, or failed authentications from this address; see Retry-After", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } } }
        }
    } }));
    paths.insert(METRICS_PATH.into(), json!({ "get": {
        "operationId": "metrics", "summary": "metrics",
        "description": "Prometheus text format: operations by face and outcome, refusals by reason, commit round sizes, flush and wake latency, channel actors, waits, streams, store size, search index lag.",
        "responses": {
            "200": { "description": "Prometheus text exposition format", "content": { "text/plain": { "schema": { "type": "string" } } } },
            "401": { "description": "missing or wrong token", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } } },
            "429": { "description": "too many requests: the waits and streams this token holds, its --rate-limit, or failed authentications from this address; see Retry-After", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } } }
        }
    } }));
    paths.insert(OPENAPI_PATH.into(), json!({ "get": {
        "operationId": "openapi", "summary": "this document",
        "responses": {
            "200": { "description": "OpenAPI 3.1", "content": { "application/json": { "schema": { "type": "object" } } } },
            "401": { "description": "missing or wrong token", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } } },
            "429": { "description": "too many requests: the waits and streams this token holds, its --rate-limit, or failed authentications from this address; see Retry-After", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } } }
        }
    } }));
}

/// The document, built once.
pub static DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    document(
        &ENDPOINTS,
        json!({
            "title": "crosstalk",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A durable, ordered relay for AI coding agents and the humans overseeing them. MCP is at /mcp; this document covers the REST face.",
        }),
        transport_routes,
    )
});

/// An OpenAPI document for a route table, with the routes `transport` adds by hand.
pub fn document(table: &[Endpoint], info: Value, transport: fn(&mut Map<String, Value>)) -> Value {
    let mut req = generator(false);
    let mut resp = generator(true);
    let mut paths = Map::new();
    for e in table.iter() {
        let op = operation(e, &mut req, &mut resp);
        let item = paths.entry(e.path).or_insert_with(|| json!({}));
        item[e.method.as_str().to_ascii_lowercase()] = op;
    }
    transport(&mut paths);
    let _ = resp.subschema_for::<ErrorBody>();
    let mut schemas = req.take_definitions(true);
    for (k, v) in resp.take_definitions(true) {
        schemas.entry(k).or_insert(v);
    }
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": info,
        "servers": [{ "url": "/" }],
        "security": [{ "bearer": [] }],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
        },
    })
}

/// `/cc/openapi.json`, built once from the cross-claude table, with its operationIds.
pub static CC_DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    document(
        &crate::cc::ENDPOINTS,
        crate::cc::openapi_info(),
        crate::cc::transport_routes,
    )
});

pub async fn serve() -> HttpResponse {
    HttpResponse::Ok().json(&*DOCUMENT)
}

pub async fn serve_cc() -> HttpResponse {
    HttpResponse::Ok().json(&*CC_DOCUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_documented() {
        let paths = DOCUMENT["paths"].as_object().unwrap();
        for e in ENDPOINTS.iter() {
            let method = e.method.as_str().to_ascii_lowercase();
            let op = &paths[e.path][&method];
            assert!(op.is_object(), "{} {} is missing", e.method, e.path);
            assert!(
                op["responses"][e.status.as_str()].is_object(),
                "{} {}: its {} is not documented",
                e.method,
                e.path,
                e.status
            );
        }
        for path in [HEALTH_PATH, STREAM_PATH, OPENAPI_PATH, METRICS_PATH] {
            assert!(paths[path]["get"].is_object(), "{path} is missing");
        }
        // Every $ref points at a schema the document holds.
        let text = DOCUMENT.to_string();
        let schemas = DOCUMENT["components"]["schemas"].as_object().unwrap();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(schemas.contains_key(name), "dangling $ref {name}");
        }
    }

    #[test]
    fn the_document_has_cross_claudes_operation_ids() {
        let doc = &*CC_DOCUMENT;
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
