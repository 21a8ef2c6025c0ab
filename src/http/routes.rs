//! The REST route tables' machinery, shared by every REST face (crosstalk's `/api`, cross-
//! claude's `/cc/api`): an [`Endpoint`] is a method, a path and an [`Operation`], plus the
//! status it answers with and a projection of the operation's response; [`mount`] mounts a
//! table, and `crate::openapi` documents one.
//!
//! A request is the operation's request type, read from the path parameters and the query
//! string (GET, DELETE) or the path parameters and a JSON object body (POST). Nothing here
//! decides anything about messages, identities or sessions.

use super::Body;
use crate::error::{self, ApiError};
use crate::ops::oauth::{Credential, OAuth};
use crate::ops::{fields, Caller, Ctx, Operation};
use actix_web::http::{Method, StatusCode};
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use futures_util::future::{self, Either};
use futures_util::FutureExt;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;

/// Bytes reserved for an answer up front: a page of ten messages fits without regrowing.
const RESPONSE_CAPACITY: usize = 4096;

type Mount = Arc<dyn Fn() -> actix_web::Route + Send + Sync>;

/// Who a REST face's caller is: how it reads the caller from a request, and its name in the
/// metrics.
#[derive(Clone, Copy)]
pub struct RestFace {
    pub name: &'static str,
    pub caller: fn(&HttpRequest) -> Caller,
}

/// One REST route of the table.
pub struct Endpoint {
    pub method: Method,
    pub path: &'static str,
    /// The status of a successful answer.
    pub status: StatusCode,
    /// The operation's name and description.
    pub name: &'static str,
    /// The OpenAPI `operationId` when it is not derived from the name and method.
    pub operation_id: Option<&'static str>,
    /// A GET that may answer 409 ([`crate::ops::Operation::CONFLICTS`]).
    pub conflicts: bool,
    pub description: &'static str,
    /// Schemas of the operation's request and of this route's answer.
    pub request: fn(&mut SchemaGenerator) -> Schema,
    pub response: fn(&mut SchemaGenerator) -> Schema,
    mount: Mount,
}

fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// A route of any face: its caller, an explicit `operationId` if it has one, and the
/// projection of the operation's answer.
pub fn route<O, P>(
    face: RestFace,
    operation_id: Option<&'static str>,
    method: Method,
    path: &'static str,
    status: StatusCode,
    project: fn(O::Response) -> P,
) -> Endpoint
where
    O: Operation,
    P: Serialize + JsonSchema + 'static,
{
    let m = method.clone();
    Endpoint {
        method,
        path,
        status,
        name: O::NAME,
        operation_id,
        conflicts: O::CONFLICTS,
        description: O::DESCRIPTION,
        request: schema::<O::Request>,
        response: schema::<P>,
        mount: Arc::new(move || {
            let route = web::route().guard(OnlyMethod(m.clone()));
            if m == Method::POST {
                route.to(
                    move |req: HttpRequest, payload: web::Payload, cx: web::Data<Ctx>| async move {
                        // The guard's copy of the body, for libraries: ours is `Body`. Dropped
                        // at once, as a blocking call (ask) keeps its request for minutes.
                        drop(payload);
                        let request = posted::<O::Request>(&req)
                            .inspect_err(|e| crate::ops::counted(face.name, O::NAME, e.code))?;
                        answer::<O, P>(face, &req, &cx, request, project, status).await
                    },
                )
            } else {
                route.to(move |req: HttpRequest, cx: web::Data<Ctx>| async move {
                    let request = from_query::<O::Request>(&req)
                        .inspect_err(|e| crate::ops::counted(face.name, O::NAME, e.code))?;
                    answer::<O, P>(face, &req, &cx, request, project, status).await
                })
            }
        }),
    }
}

/// A route's method. actix's own method guard also writes each method it is asked about
/// into the request's extensions (an allocation and a map insert per route tried, on every
/// request), for a `405` the relay answers itself ([`resource`]).
struct OnlyMethod(Method);

impl actix_web::guard::Guard for OnlyMethod {
    fn check(&self, ctx: &actix_web::guard::GuardContext<'_>) -> bool {
        ctx.head().method == self.0
    }
}

/// An actix route for `verb`.
pub fn at(verb: crate::api::Verb) -> actix_web::Route {
    web::route().method(method(verb))
}

/// The HTTP method of `verb`.
pub fn method(verb: crate::api::Verb) -> Method {
    match verb {
        crate::api::Verb::Get => Method::GET,
        crate::api::Verb::Post => Method::POST,
        crate::api::Verb::Delete => Method::DELETE,
    }
}

/// Mounts a route table.
pub fn mount(cfg: &mut web::ServiceConfig, table: &'static [Endpoint]) {
    let mut paths: Vec<&'static str> = Vec::new();
    for e in table.iter() {
        if !paths.contains(&e.path) {
            paths.push(e.path);
        }
    }
    for path in paths {
        let methods: Vec<Method> = table
            .iter()
            .filter(|e| e.path == path)
            .map(|e| e.method.clone())
            .collect();
        let r = table
            .iter()
            .filter(|e| e.path == path)
            .fold(resource(path, &methods), |r, e| r.route((e.mount)()));
        cfg.service(r);
    }
}

/// A path whose other methods are a JSON 405.
pub fn resource(path: &str, methods: &[Method]) -> actix_web::Resource {
    let allow: String = methods.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
    web::resource(path).default_service(web::route().to(move |req: HttpRequest| {
        let allow = allow.clone();
        async move { error::method_not_allowed(&req, &allow) }
    }))
}

/// A POST's request: a JSON object body (none is `{}`) with the path parameters set.
fn posted<T: DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    // A JSON body says so: a form or text/plain POST is what a web page can send cross-site
    // without asking first.
    let json = req
        .headers()
        .get(actix_web::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .is_some_and(|m| m == "application/json" || m.ends_with("+json"));
    let body = Body::take(req)?;
    if !json && !body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON with Content-Type: application/json",
        ));
    }
    from_body(req, body)
}

/// Runs the operation and writes its (projected) answer. A combinator for the same reason
/// as [`crate::ops::call`]: a parked long-poll holds only the operation's future. A request
/// that waits ([`Operation::WAITS`]) made with an OAuth token is answered 401 if the token
/// ends (revoked, rotated away from, expired) while it still waits: a long-poll or an ask
/// lasts no longer than the token.
fn answer<'a, O, P>(
    face: RestFace,
    req: &HttpRequest,
    cx: &'a Ctx,
    request: O::Request,
    project: fn(O::Response) -> P,
    status: StatusCode,
) -> impl Future<Output = Result<HttpResponse, ApiError>> + 'a
where
    O: Operation,
    P: Serialize + 'a,
{
    let answered = crate::ops::call::<O>(face.name, cx, (face.caller)(req), request).map(move |answer| {
        let answer = answer?;
        let mut json = Vec::with_capacity(RESPONSE_CAPACITY);
        serde_json::to_writer(&mut json, &project(answer))
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
        Ok(HttpResponse::build(status).content_type("application/json").body(json))
    });
    // Only what blocks outlives a token's end by long enough to watch for it: a post or a
    // read is answered at once, and is never cut off halfway.
    let credential = O::WAITS
        .then(|| req.extensions().get::<Credential>().cloned())
        .flatten();
    let watched = credential.and_then(|c| Some((c, req.app_data::<web::Data<OAuth>>()?.get_ref().clone())));
    match watched {
        Some((credential, oauth)) => {
            let path = req.path().to_owned();
            Either::Right(async move {
                match future::select(Box::pin(answered), Box::pin(oauth.clone().ended(credential))).await {
                    Either::Left((answered, _)) => answered,
                    Either::Right(((), _)) => {
                        crate::ops::counted(face.name, O::NAME, "unauthorized");
                        Ok(super::unauthorized(&path, true, Some(&oauth)))
                    }
                }
            })
        }
        None => Either::Left(answered),
    }
}

/// A POST's request: its JSON object body (none is `{}`) with the path parameters set, read
/// in one pass from the client's bytes ([`fields::WithParams`]: a path parameter decides over
/// a body field of its name).
fn from_body<T: DeserializeOwned>(req: &HttpRequest, body: web::Bytes) -> Result<T, ApiError> {
    let json: &[u8] = match body.iter().position(|b| !b.is_ascii_whitespace()) {
        None => b"{}",
        Some(start) => &body[start..],
    };
    if json.first() != Some(&b'{') {
        return Err(match serde_json::from_slice::<serde::de::IgnoredAny>(json) {
            Err(e) => malformed(&e),
            Ok(_) => ApiError::bad_request("invalid fields: the body must be a JSON object"),
        });
    }
    let params: Vec<(&str, String)> = req.match_info().iter().map(|(n, v)| (n, path_param(v))).collect();
    let mut de = serde_json::Deserializer::from_slice(json);
    let read = serde_path_to_error::deserialize(fields::WithParams {
        inner: &mut de,
        params: &params,
    });
    match read {
        Ok(request) => de.end().map(|()| request).map_err(|e| malformed(&e)),
        Err(e) => {
            let path = e.path().to_string();
            let e = e.into_inner();
            match e.classify() {
                serde_json::error::Category::Syntax | serde_json::error::Category::Eof => Err(malformed(&e)),
                _ => Err(invalid("invalid fields", path, unplaced(&e))),
            }
        }
    }
}

/// A body that is not JSON.
fn malformed(e: &serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("malformed JSON: {e}"))
}

/// A field's error without where in the body the parser was: a field is named by its path.
fn unplaced(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let place = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&place) {
        Some(bare) if e.line() > 0 => bare.to_owned(),
        _ => text,
    }
}

/// A GET's or DELETE's request: the path parameters and the query string, read in one pass
/// (the transport's own parameters, a token or a session, are fields no request has).
fn from_query<T: DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    let mut encoded = form_urlencoded::Serializer::new(String::new());
    for (name, value) in req.match_info().iter() {
        encoded.append_pair(name, &path_param(value));
    }
    let mut encoded = encoded.finish();
    let query = req.query_string();
    if !query.is_empty() {
        if !encoded.is_empty() {
            encoded.push('&');
        }
        encoded.push_str(query);
    }
    let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(encoded.as_bytes()));
    serde_path_to_error::deserialize(de)
        .map_err(|e| invalid("invalid query string", e.path().to_string(), e.into_inner()))
}

/// A path parameter as the client meant it. actix decodes a path's escapes except `%2F`,
/// `%25` and `%2B` (so that a `/` in a parameter cannot split it); those are decoded here,
/// once, so a shared-data key may hold `/`, `%` and `+` like any other character.
fn path_param(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned()
}

fn invalid(what: &str, path: String, e: impl std::fmt::Display) -> ApiError {
    if path == "." || path.is_empty() {
        ApiError::bad_request(format!("{what}: {e}"))
    } else {
        ApiError::bad_request(format!("{what}: `{path}`: {e}"))
    }
}
