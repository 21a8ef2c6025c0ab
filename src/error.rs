//! The HTTP error: every failure is a JSON body `{"error": message, "code": code}` with the
//! right status, including the extractors' own (bad JSON, bad query, unknown route).

use actix_web::error::{JsonPayloadError, QueryPayloadError};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use crosstalk_actors::RelayError;
use crosstalk_schema::InvalidInput;
use serde::Serialize;
use std::fmt;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    code: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
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
        HttpResponse::build(self.status).json(Body {
            error: &self.message,
            code: self.code,
        })
    }
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

impl From<RelayError> for ApiError {
    fn from(e: RelayError) -> Self {
        match e {
            RelayError::Invalid(e) => e.into(),
            RelayError::Store(e) => {
                tracing::error!(error = %e, "storage error");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "storage",
                    "the store failed; nothing was acknowledged",
                )
            }
            RelayError::Forbidden(m) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", m),
            RelayError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            RelayError::NotFound(m) => ApiError::new(StatusCode::NOT_FOUND, "not_found", m),
            RelayError::Unavailable(why) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why),
            RelayError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the relay is shutting down",
            ),
        }
    }
}

pub fn json_error(err: JsonPayloadError, _: &HttpRequest) -> actix_web::Error {
    let e = match &err {
        JsonPayloadError::Overflow { limit } | JsonPayloadError::OverflowKnownLength { limit, .. } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("request body is larger than {limit} bytes"),
        ),
        JsonPayloadError::Deserialize(e) if e.is_data() => ApiError::bad_request(format!("invalid fields: {e}")),
        JsonPayloadError::Deserialize(e) => ApiError::bad_request(format!("malformed JSON: {e}")),
        other => ApiError::bad_request(format!("unreadable body: {other}")),
    };
    e.into()
}

pub fn query_error(err: QueryPayloadError, _: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request(format!("invalid query string: {err}")).into()
}

pub async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {} {}", req.method(), req.path()),
    )
    .error_response()
}

pub async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.path()),
    )
    .error_response()
}
