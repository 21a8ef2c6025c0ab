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
//!
//! And where rmcp is looser than JSON-RPC: it answers a body that is not JSON with HTTP 415,
//! and a known method whose params do not parse (`tools/call` with `arguments: [1]`, a
//! `logging/setLevel` to `"loud"`) with `-32601 method not found`, since its untagged request
//! union falls through to "custom request". This layer answers those as JSON-RPC says: `-32700`
//! parse error or `-32600` invalid request with HTTP 400, and `-32602` invalid params, the
//! params read by rmcp's own types. A `?tools=`/`X-Crosstalk-Tools` choice that is neither
//! `core` nor `full` is refused on every request, not only on `tools/list`.

use crate::http::Body;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpResponse};
use rmcp::model::{self, ConstString, ErrorCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

const MCP_METHOD: &str = "mcp-method";

pub async fn notifications(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    // The guard read the body (`http::Body`); rmcp reads its copy in the payload. Ours goes
    // now: a tool call that waits keeps its request, and all it holds, for minutes.
    let body = req.extensions_mut().remove::<Body>();
    // The body, read once for all this layer asks of it (rmcp reads it again, its own way).
    let read = body
        .as_ref()
        .filter(|_| req.method() == Method::POST)
        .map(|b| read(&b.0));
    let probe = match &read {
        Some(Read::Message(p)) => Some(p),
        _ => None,
    };
    let header = req.headers().get(super::TOOLS_HEADER).and_then(|v| v.to_str().ok());
    let refusal = match super::tools::choice(req.query_string(), header) {
        Some(Err(why)) => Some(Refusal::new(StatusCode::BAD_REQUEST, ErrorCode::INVALID_PARAMS, why)),
        _ => match &read {
            Some(Read::Refused(r)) => Some(r.clone()),
            _ => probe.and_then(Probe::refusal),
        },
    };
    if let Some(r) = refusal {
        let id = probe.and_then(Probe::id).unwrap_or(Value::Null);
        let answer = HttpResponse::build(r.status)
            .content_type("application/json")
            .body(json!({"jsonrpc": "2.0", "id": id, "error": {"code": r.code.0, "message": r.message}}).to_string());
        return Ok(req.into_response(answer).map_into_right_body());
    }
    if let Some(method) = probe.and_then(Probe::notification) {
        if !req.headers().contains_key(MCP_METHOD) {
            if let Ok(value) = HeaderValue::from_str(method) {
                req.headers_mut().insert(HeaderName::from_static(MCP_METHOD), value);
            }
        }
    }
    next.call(req).await.map(ServiceResponse::map_into_left_body)
}

/// A request answered here, before rmcp: as JSON-RPC, with this HTTP status.
#[derive(Debug, Clone, PartialEq)]
struct Refusal {
    status: StatusCode,
    code: ErrorCode,
    message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        Refusal {
            status,
            code,
            message: message.into(),
        }
    }
}

/// One JSON-RPC message, read without copying its params.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// A POST body as this layer reads it.
enum Read<'a> {
    Message(Probe<'a>),
    /// A batch (an array): rmcp's to answer.
    Batch,
    /// Not JSON, or not a JSON-RPC message.
    Refused(Refusal),
}

fn read(body: &[u8]) -> Read<'_> {
    let bad = |code, why: String| Read::Refused(Refusal::new(StatusCode::BAD_REQUEST, code, why));
    match serde_json::from_slice(body) {
        Ok(p) => Read::Message(p),
        Err(e) if e.is_syntax() || e.is_eof() => bad(ErrorCode::PARSE_ERROR, format!("Parse error: {e}")),
        Err(_) if serde_json::from_slice::<Vec<&RawValue>>(body).is_ok() => Read::Batch,
        Err(e) => bad(ErrorCode::INVALID_REQUEST, format!("Invalid request: {e}")),
    }
}

impl Probe<'_> {
    /// Its `id`, when it has one that reads.
    fn id(&self) -> Option<Value> {
        serde_json::from_str(self.id?.get()).ok()
    }

    /// The method of a notification (a message with a `method` and no `id`).
    fn notification(&self) -> Option<&str> {
        self.id.is_none().then_some(())?;
        self.method.as_deref()
    }

    /// Why rmcp must not see this request: a known method whose params do not read as that
    /// method's. A response, a notification and an unknown method pass on to rmcp.
    fn refusal(&self) -> Option<Refusal> {
        let (Some(_), Some(method)) = (self.id, self.method.as_deref()) else {
            return None;
        };
        let params = self.params.map_or("null", RawValue::get);
        let (_, check) = PARAMS.iter().find(|(m, _)| *m == method)?;
        check(params).err().map(|e| {
            Refusal::new(
                StatusCode::OK,
                ErrorCode::INVALID_PARAMS,
                format!("Invalid params for {method}: {e}"),
            )
        })
    }
}

/// Reads `params` as `P`, as rmcp will.
fn reads_as<P: DeserializeOwned>(params: &str) -> Result<(), serde_json::Error> {
    serde_json::from_str::<P>(params).map(drop)
}

/// `tools/call`'s params, read lightly: its arguments can be a whole post, so they are looked
/// at, not parsed (the tool parses them into its own request type).
fn tool_call(params: &str) -> Result<(), serde_json::Error> {
    #[derive(Deserialize)]
    struct Call<'a> {
        #[allow(dead_code)]
        name: std::borrow::Cow<'a, str>,
        #[serde(borrow, default)]
        arguments: Option<&'a RawValue>,
    }
    let call: Call = serde_json::from_str(params)?;
    match call.arguments.map(RawValue::get) {
        Some(a) if !a.starts_with('{') && a != "null" => Err(serde::de::Error::custom("arguments must be an object")),
        _ => Ok(()),
    }
}

type Check = fn(&str) -> Result<(), serde_json::Error>;

/// The client requests rmcp knows that take params, each with rmcp's own params type. Methods
/// without params (`ping`) and `initialize` (the session's start, which rmcp's transport
/// answers) are left to rmcp.
const PARAMS: [(&str, Check); 14] = [
    (model::CallToolRequestMethod::VALUE, tool_call),
    (
        model::SetLevelRequestMethod::VALUE,
        reads_as::<model::SetLevelRequestParams>,
    ),
    (
        model::GetPromptRequestMethod::VALUE,
        reads_as::<model::GetPromptRequestParams>,
    ),
    (
        model::ReadResourceRequestMethod::VALUE,
        reads_as::<model::ReadResourceRequestParams>,
    ),
    (
        model::SubscribeRequestMethod::VALUE,
        reads_as::<model::SubscribeRequestParams>,
    ),
    (
        model::UnsubscribeRequestMethod::VALUE,
        reads_as::<model::UnsubscribeRequestParams>,
    ),
    (
        model::CompleteRequestMethod::VALUE,
        reads_as::<model::CompleteRequestParams>,
    ),
    (model::GetTaskMethod::VALUE, reads_as::<model::GetTaskParams>),
    (model::CancelTaskMethod::VALUE, reads_as::<model::CancelTaskParams>),
    (
        model::ListToolsRequestMethod::VALUE,
        reads_as::<Option<model::PaginatedRequestParams>>,
    ),
    (
        model::ListPromptsRequestMethod::VALUE,
        reads_as::<Option<model::PaginatedRequestParams>>,
    ),
    (
        model::ListResourcesRequestMethod::VALUE,
        reads_as::<Option<model::PaginatedRequestParams>>,
    ),
    (
        model::ListResourceTemplatesRequestMethod::VALUE,
        reads_as::<Option<model::PaginatedRequestParams>>,
    ),
    (
        model::ListSkillsRequestMethod::VALUE,
        reads_as::<Option<model::PaginatedRequestParams>>,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_rmcp_would_misanswer_is_answered_as_json_rpc() {
        let code = |body: &str| {
            let r = match read(body.as_bytes()) {
                Read::Message(p) => p.refusal(),
                Read::Batch => None,
                Read::Refused(r) => Some(r),
            };
            r.map(|r| (r.status.as_u16(), r.code.0))
        };
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":1,"#), Some((400, -32700)));
        assert_eq!(code("not json"), Some((400, -32700)));
        assert_eq!(code(""), Some((400, -32700)));
        assert_eq!(code(r#""a string""#), Some((400, -32600)));
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":{"a":1},"method":7}"#),
            Some((400, -32600))
        );
        let call = |args: &str| {
            code(&format!(
                r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"list_channels","arguments":{args}}}}}"#
            ))
        };
        for bad in ["[1,2]", "1", "\"x\"", "true"] {
            assert_eq!(call(bad), Some((200, -32602)), "{bad}");
        }
        for good in ["{}", r#"{"a":[1]}"#, "null"] {
            assert_eq!(call(good), None, "{good}");
        }
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{}}}"#),
            Some((200, -32602)),
            "a call names its tool"
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":3,"method":"logging/setLevel","params":{"level":"loud"}}"#),
            Some((200, -32602))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":3,"method":"logging/setLevel","params":{"level":"debug"}}"#),
            None
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#), None);
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":7}"#),
            Some((200, -32602))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":3,"method":"no/such"}"#),
            None,
            "rmcp says -32601"
        );
        assert_eq!(
            code(r#"[{"jsonrpc":"2.0","id":3,"method":"ping"}]"#),
            None,
            "a batch is rmcp's"
        );
        assert_eq!(code(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#), None);
        let Read::Message(p) = read(br#"{"jsonrpc":"2.0","id":"a-1","method":"x"}"#) else {
            panic!("a message")
        };
        assert_eq!(p.id(), Some(json!("a-1")));
    }

    #[test]
    fn only_notifications_get_the_header() {
        let notification = |body: &[u8]| match read(body) {
            Read::Message(p) => p.notification().map(str::to_owned),
            _ => None,
        };
        assert_eq!(
            notification(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}"#).as_deref(),
            Some("notifications/cancelled")
        );
        assert_eq!(notification(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#), None);
        assert_eq!(notification(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#), None);
        assert_eq!(notification(b"not json"), None);
    }
}
