//! An MCP session belongs to the principal that opened it. The transport only knows a session
//! by its id, so this middleware remembers who created each session (from the answer that
//! carries a new `Mcp-Session-Id`) and answers any request, stream, resumption or DELETE
//! naming that session on behalf of another principal as if the session did not exist (404).
//! A DELETE of a session nobody opened is 404 too, and a DELETE that ended one is 204.
//! With a shared token (or none) every caller is the same principal, as the token means.
//!
//! A session's event stream (its `GET`) is held open for as long as the client reads it, so
//! it counts against the principal's `--max-waits-per-principal`, like every other wait and
//! stream, and in `/healthz`'s `streams`, for exactly as long as its answer is being sent.

use crate::error::ApiError;
use crate::ops::{Ctx, Gauge, Held, Principal};
use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, ResponseError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::pin::Pin;
use std::task::{Context, Poll};

/// An event stream's answer, holding its principal's slot (and the streams gauge) until the
/// answer ends or the client goes.
pub struct Counted {
    body: BoxBody,
    _held: Held,
    _open: Gauge,
}

impl MessageBody for Counted {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<web::Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

const SESSION_HEADER: &str = "mcp-session-id";

/// Who opened each live MCP session.
#[derive(Default)]
pub struct Owners(Mutex<HashMap<String, Principal>>);

impl Owners {
    fn owner(&self, session: &str) -> Option<Principal> {
        self.0.lock().get(session).cloned()
    }
}

pub async fn bind(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let Some(owners) = req.app_data::<web::Data<Owners>>().cloned() else {
        let res = next.call(req).await?;
        return Ok(res.map_body(|_, body| EitherBody::left(EitherBody::right(body))));
    };
    let principal = req
        .extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or(Principal::Anyone);
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(s) = &session {
        if owners.owner(s).is_some_and(|owner| owner != principal) {
            let e = ApiError::new(StatusCode::NOT_FOUND, "not_found", "Session not found");
            return Ok(req.into_response(e.error_response()).map_into_right_body());
        }
    }
    let deleting = req.method() == Method::DELETE;
    if deleting && session.as_deref().is_some_and(|s| owners.owner(s).is_none()) {
        // rmcp answers 202 to any DELETE; a session nobody opened (or already ended) is 404.
        let e = ApiError::new(StatusCode::NOT_FOUND, "not_found", "Session not found");
        return Ok(req.into_response(e.error_response()).map_into_right_body());
    }
    // A GET opens the session's event stream: it takes one of the principal's slots.
    let stream = match (req.method() == Method::GET, req.app_data::<web::Data<Ctx>>()) {
        (true, Some(cx)) => match cx.hold(&principal) {
            Ok(held) => Some((held, Gauge::enter(&cx.streams))),
            Err(e) => {
                return Ok(req
                    .into_response(ApiError::from(e).error_response())
                    .map_into_right_body());
            }
        },
        _ => None,
    };
    let mut res = next.call(req).await?;
    if deleting && res.status() == StatusCode::ACCEPTED {
        // The session is gone when the DELETE returns: 204, which every SDK accepts (the
        // Python SDK warns on 202).
        *res.response_mut().status_mut() = StatusCode::NO_CONTENT;
    }
    match &session {
        None => {
            if let Some(new) = res.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
                owners.0.lock().insert(new.to_owned(), principal);
            }
        }
        Some(s) => {
            if res.status() == StatusCode::NOT_FOUND || (deleting && res.status().is_success()) {
                owners.0.lock().remove(s);
            }
        }
    }
    Ok(match stream {
        Some((held, open)) => res.map_body(|_, body| {
            EitherBody::left(EitherBody::left(Counted {
                body: body.boxed(),
                _held: held,
                _open: open,
            }))
        }),
        None => res.map_body(|_, body| EitherBody::left(EitherBody::right(body))),
    })
}
