//! The HTTP error: every failure is a JSON body `{"error": message, "code": code}` with the
//! right status, including the extractors' own (bad JSON, bad query, unknown route).

use crate::ops::{ErrorKind, OpError};
use actix_web::error::QueryPayloadError;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde::Serialize;
use std::fmt;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds after which a retry can succeed (`Retry-After`).
    pub retry_after: Option<u32>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    code: &'a str,
    /// crosstalk-mcp's clients read `status` on some errors (`no_active_session`).
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a str>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_input", message)
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status);
        if let Some(s) = self.retry_after {
            res.insert_header((actix_web::http::header::RETRY_AFTER, s.to_string()));
        }
        res.json(Body {
            error: &self.message,
            code: self.code,
            status: (self.code == ErrorKind::NoActiveSession.code()).then_some(self.code),
        })
    }
}

/// The answer actix-http writes itself to a request no middleware sees (a head it cannot
/// parse, or too large; set with `actix_http::h1::set_error_answer`, vendor/actix-http): the
/// same JSON as every other error, and the headers the guard adds to its own refusals.
pub fn dispatcher_error(
    status: StatusCode,
    detail: &str,
    headers: &mut actix_web::http::header::HeaderMap,
) -> Option<actix_web::web::Bytes> {
    use actix_web::http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
    let (code, message) = match status.as_u16() {
        414 => (
            "uri_too_long",
            "the URL is longer than 65,534 bytes, the most the HTTP layer holds".to_owned(),
        ),
        431 => (
            "too_large",
            "the request head is too large: at most 128 KiB and 96 headers".to_owned(),
        ),
        s if s >= 500 => ("internal", "internal server error".to_owned()),
        _ => ("invalid_input", format!("malformed request: {detail}")),
    };
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let body = Body {
        error: &message,
        code,
        status: None,
    };
    serde_json::to_vec(&body).ok().map(Into::into)
}

impl From<crosstalk_actors::RelayError> for ApiError {
    fn from(e: crosstalk_actors::RelayError) -> Self {
        OpError::from(e).into()
    }
}

impl From<OpError> for ApiError {
    /// The one place an operation's error becomes an HTTP status.
    fn from(e: OpError) -> Self {
        let status = match e.kind {
            ErrorKind::Invalid => StatusCode::BAD_REQUEST,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound | ErrorKind::NoActiveSession => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::LimitReached => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Storage => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorKind::Unavailable | ErrorKind::ShuttingDown | ErrorKind::StoreUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        let mut api = ApiError::new(status, e.kind.code(), e.message);
        if matches!(
            e.kind,
            ErrorKind::StoreUnavailable | ErrorKind::Unavailable | ErrorKind::LimitReached
        ) {
            api.retry_after = Some(1);
        }
        api
    }
}

pub fn query_error(err: QueryPayloadError, _: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request(format!("invalid query string: {err}")).into()
}

/// The error code of a relay without `--oauth` on its `/api/oauth/…` routes: a client tells
/// "this relay has no OAuth" from "no such connection" by it.
pub const OAUTH_OFF: &str = "oauth_off";

pub async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {} {}", req.method(), req.path()),
    )
    .error_response()
}

/// A 405 that says which methods the path has (`Allow`, as RFC 9110 requires).
pub fn method_not_allowed(req: &HttpRequest, allow: &str) -> HttpResponse {
    let mut res = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}; use {allow}", req.method(), req.path()),
    )
    .error_response();
    if let Ok(v) = actix_web::http::header::HeaderValue::from_str(allow) {
        res.headers_mut().insert(actix_web::http::header::ALLOW, v);
    }
    res
}

/// Longest plain-text error body [`json_errors`] reads before wrapping it.
const TEXT_ERROR_LIMIT: usize = 4096;

/// Middleware for routes whose errors come from a library (the MCP transport answers unknown
/// sessions, a refused Host, a wrong media type, … in plain text): every error the relay
/// answers is JSON, so a plain-text error is rewritten as `{"error", "code"}` with the same
/// status and headers. JSON answers (JSON-RPC errors among them) and successes pass as they are.
pub async fn json_errors(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
    let res = next.call(req).await?;
    let status = res.status();
    let is_json = res
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return Ok(res.map_into_boxed_body());
    }
    let (req, res) = res.into_parts();
    let headers = res.headers().clone();
    let text = match actix_web::body::to_bytes_limited(res.into_body(), TEXT_ERROR_LIMIT).await {
        Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        _ => String::new(),
    };
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let code = match status.as_u16() {
        400 => "invalid_input",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        406 => "not_acceptable",
        413 => "too_large",
        415 => "unsupported_media_type",
        s if s >= 500 => "internal",
        _ => "error",
    };
    let mut json = ApiError::new(status, code, message).error_response();
    for (name, value) in headers.iter() {
        if name != CONTENT_TYPE && name != CONTENT_LENGTH {
            json.headers_mut().append(name.clone(), value.clone());
        }
    }
    Ok(actix_web::dev::ServiceResponse::new(req, json))
}
