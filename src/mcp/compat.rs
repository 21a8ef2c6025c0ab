//! Where rmcp is stricter than the MCP specification, and clients we did not write trip on it.
//!
//! The 2026-07-28 transport (SEP-2243) requires the `Mcp-Method` header on every *request*.
//! A notification is not a request (it has no `id`), and the TypeScript SDK 2.x sends the
//! header on requests only; rmcp 3.11 demands it on notifications too and answers
//! `400 -32020 missing required Mcp-Method header`, so every `listen().close()` of that SDK
//! raised an error. This layer mirrors a notification's `method` into the header rmcp wants
//! before rmcp sees it. A header that is present is left alone (rmcp still checks that it
//! matches the body), and requests are untouched: a request without the header is still
//! refused, as the specification says.

use crate::http::Body;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use serde_json::Value;

const MCP_METHOD: &str = "mcp-method";

/// The method of a JSON-RPC notification (a message with a `method` and no `id`).
fn notification_method(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object()?;
    if o.contains_key("id") {
        return None;
    }
    o.get("method")?.as_str().map(str::to_owned)
}

pub async fn notifications(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    // The guard read the body (`http::Body`); rmcp reads its copy in the payload. Ours goes
    // now: a tool call that waits keeps its request, and all it holds, for minutes.
    let body = req.extensions_mut().remove::<Body>();
    if req.method() == Method::POST && !req.headers().contains_key(MCP_METHOD) {
        let method = body.and_then(|b| notification_method(&b.0));
        if let Some(value) = method.and_then(|m| HeaderValue::from_str(&m).ok()) {
            req.headers_mut().insert(HeaderName::from_static(MCP_METHOD), value);
        }
    }
    next.call(req).await
}

#[cfg(test)]
mod tests {
    use super::notification_method;

    #[test]
    fn only_notifications_get_the_header() {
        assert_eq!(
            notification_method(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#).as_deref(),
            Some("notifications/cancelled")
        );
        assert_eq!(
            notification_method(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        assert_eq!(notification_method(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#), None);
        assert_eq!(notification_method(b"not json"), None);
    }
}
