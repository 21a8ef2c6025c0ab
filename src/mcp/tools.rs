//! The MCP tools: crosstalk-mcp's names and argument names, each one small async function
//! that calls the [`Relay`] and returns structured content (with an output schema) plus a
//! short text form for hosts that show only text. Adding a tool is one function and one
//! line in [`routes`].
//!
//! Bad arguments and refused input are tool errors (`isError: true` with a message the
//! model can act on), never JSON-RPC errors and never panics.
#![allow(deprecated)] // `LoggingLevel`: MCP logging is deprecated by SEP-2577; 2025-11-25 clients still use it

use crate::rest::{DEFAULT_LIMIT, MAX_LIMIT};
use crate::server::Gauge;
use crosstalk_actors::{Posted, Relay, RelayError, Role, WaitOptions, WaitOutcome};
use crosstalk_schema::{ChannelName, ChannelSummary, NewMessage};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use rmcp::handler::server::common::schema_for_input;
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam,
    ProgressToken, Tool, ToolAnnotations,
};
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Messages one `get_messages` or `wait_for_message` returns when the caller names no
/// `limit`: a model pays for every message it reads, so pages are small.
pub const MCP_DEFAULT_LIMIT: usize = 100;
/// `wait_for_message` timeout when the caller names none (crosstalk-mcp's default).
pub const DEFAULT_WAIT_SECS: f64 = 30.0;
/// How often a pending wait reports progress, when the client asked for progress: hosts
/// that reset their tool-call timeout on progress then never give up on a long wait.
pub const WAIT_PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// Longest body quoted in the text form of a message list; structured content is complete.
pub const TEXT_BODY_MAX: usize = 4000;

const _: () = assert!(MCP_DEFAULT_LIMIT <= DEFAULT_LIMIT && DEFAULT_LIMIT <= MAX_LIMIT);

/// What a tool call may use: the relay, the request's cancellation, the client.
#[derive(Clone)]
pub struct Cx {
    pub relay: Relay,
    /// The session an identity registered from this client is bound to.
    pub session: Option<String>,
    /// The identity the client's participant token is bound to, if it used one.
    pub principal: Option<String>,
    /// The identity this MCP session registered as.
    pub bound: Arc<Mutex<Option<String>>>,
    /// Longest `wait_for_message`.
    pub wait_cap: Duration,
    /// Cancelled when the client cancels the call, goes away, or the session ends.
    pub cancel: CancellationToken,
    pub peer: Peer<RoleServer>,
    /// Set when the client asked for progress notifications on this call.
    pub progress: Option<ProgressToken>,
    /// The session's `logging/setLevel`.
    pub log_level: Arc<Mutex<LoggingLevel>>,
    /// Pending waits, for `/healthz`.
    pub waits: Arc<AtomicUsize>,
}

/// A tool's answer: structured content and its short text form.
pub struct Output {
    pub structured: Value,
    pub text: String,
}

/// A tool failure the model should read and act on.
#[derive(Debug)]
pub struct ToolError(pub String);

impl From<RelayError> for ToolError {
    fn from(e: RelayError) -> Self {
        ToolError(match e {
            RelayError::Invalid(e) => format!("refused: {e}"),
            RelayError::Store(e) => {
                tracing::error!(error = %e, "storage error in an MCP tool");
                "the relay's store failed; nothing was stored. Try again later.".into()
            }
            RelayError::Unavailable(why) => format!("the relay is busy or stopping ({why}); try again shortly"),
            RelayError::ShuttingDown => "the relay is shutting down; reconnect and try again".into(),
            RelayError::Forbidden(m) | RelayError::Conflict(m) | RelayError::NotFound(m) => m,
        })
    }
}

impl From<crosstalk_schema::InvalidInput> for ToolError {
    fn from(e: crosstalk_schema::InvalidInput) -> Self {
        ToolError(format!("refused: {e}"))
    }
}

type Call = Arc<dyn Fn(Cx, JsonObject) -> BoxFuture<'static, Result<Output, ToolError>> + Send + Sync>;

pub(crate) struct Route {
    tool: Tool,
    call: Call,
}

/// Makes a route from an argument type (its schema is the input schema), an output schema,
/// and the function.
pub(crate) fn route<A, F, Fut>(
    name: &'static str,
    description: &'static str,
    output: Value,
    read_only: bool,
    f: F,
) -> Route
where
    A: DeserializeOwned + JsonSchema + 'static,
    F: Fn(Cx, A) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Output, ToolError>> + Send + 'static,
{
    let mut input = (*schema_for_input::<A>().unwrap_or_else(|e| panic!("tool {name}: bad input schema: {e}"))).clone();
    // Every byte of tools/list is in every agent's context: drop what tells a model nothing
    // (the dialect marker, integer formats, `minimum: 0` on unsigned ids, `default: null`).
    input.remove("$schema");
    if let Some(Value::Object(props)) = input.get_mut("properties") {
        for p in props.values_mut() {
            if let Value::Object(p) = p {
                p.remove("format");
                if p.get("minimum") == Some(&json!(0)) {
                    p.remove("minimum");
                }
                if p.get("default") == Some(&Value::Null) {
                    p.remove("default");
                }
            }
        }
    }
    let input = Arc::new(input);
    let Value::Object(output) = output else {
        panic!("tool {name}: output schema must be an object");
    };
    let mut annotations = ToolAnnotations::new();
    if read_only {
        annotations.read_only_hint = Some(true);
    } else {
        annotations.destructive_hint = Some(false);
    }
    let tool = Tool::new_with_raw(name, Some(description.into()), input)
        .with_raw_output_schema(Arc::new(output))
        .with_annotations(annotations);
    let f = Arc::new(f);
    let call: Call = Arc::new(move |cx, args| {
        let f = f.clone();
        Box::pin(async move {
            let args: A = serde_path_to_error::deserialize(Value::Object(args)).map_err(|e| {
                let path = e.path().to_string();
                let e = e.into_inner();
                if path == "." {
                    ToolError(format!("invalid arguments for {name}: {e}"))
                } else {
                    ToolError(format!("invalid arguments for {name}: {path}: {e}"))
                }
            })?;
            f(cx, args).await
        })
    });
    Route { tool, call }
}

/// The tool table, built once.
static ROUTES: LazyLock<Vec<Route>> = LazyLock::new(routes);

fn routes() -> Vec<Route> {
    vec![
        route(
            "post_message",
            "Post a message to a channel (created on first post). Returns the stored message; keep \
             its id and call wait_for_message(channel, since_id=id) to block until someone answers. \
             type: message (default), question, answer (set reply_to), status, or done when you are \
             finished. recipient names one participant; omit it to address everyone.",
            message_schema(),
            false,
            post_message,
        ),
        route(
            "get_messages",
            "Read a channel's messages with id > since_id, oldest first, without waiting. Pass the \
             returned next_since_id as since_id on your next call so you never read a message twice; \
             has_more means call again at once.",
            page_schema(false),
            true,
            get_messages,
        ),
        route(
            "wait_for_message",
            "Block until a channel has messages with id > since_id, then return them (oldest \
             first); [] after timeout_s. Use it instead of polling: post, then wait with since_id = \
             the largest id you have seen. On timeout call it again with the same since_id.",
            page_schema(true),
            true,
            wait_for_message,
        ),
        route(
            "list_channels",
            "List channels that have messages, most recently active first, with their message \
             count and last id.",
            channels_schema(),
            true,
            list_channels,
        ),
    ]
    .into_iter()
    .chain(super::coord_tools::routes())
    .collect()
}

/// Every tool's definition, for `tools/list`.
pub fn list() -> Vec<Tool> {
    ROUTES.iter().map(|r| r.tool.clone()).collect()
}

pub fn get(name: &str) -> Option<Tool> {
    ROUTES.iter().find(|r| r.tool.name == name).map(|r| r.tool.clone())
}

/// Runs a tool. An unknown name is a protocol error (the spec's `-32602`); anything a tool
/// refuses is an `isError` result.
pub async fn call(cx: Cx, name: &str, args: JsonObject) -> Result<CallToolResult, McpError> {
    let Some(route) = ROUTES.iter().find(|r| r.tool.name == name) else {
        let names: Vec<_> = ROUTES.iter().map(|r| r.tool.name.as_ref()).collect();
        return Err(McpError::invalid_params(
            format!("unknown tool {name:?}; the tools are: {}", names.join(", ")),
            None,
        ));
    };
    let started = std::time::Instant::now();
    let result = (route.call)(cx, args).await;
    match result {
        Ok(out) => {
            tracing::debug!(tool = name, ms = started.elapsed().as_millis() as u64, "tool call");
            let mut r = CallToolResult::structured(out.structured);
            r.content = vec![ContentBlock::text(out.text)];
            Ok(r)
        }
        Err(ToolError(message)) => {
            tracing::debug!(tool = name, error = %message, "tool call refused");
            Ok(CallToolResult::error(vec![ContentBlock::text(message)]))
        }
    }
}

pub(crate) fn channel(raw: &str) -> Result<ChannelName, ToolError> {
    Ok(ChannelName::parse(raw)?)
}

pub(crate) fn limit(requested: Option<usize>) -> Result<usize, ToolError> {
    match requested {
        None => Ok(MCP_DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(n) => Err(ToolError(format!("limit {n} is out of range: use 1 to {MAX_LIMIT}"))),
    }
}

/// The identity a call acts as, checked against the client's participant token and the
/// identity this session registered as. The relay checks the session binding itself.
pub(crate) fn act_as(cx: &Cx, who: &str) -> Result<String, ToolError> {
    let who = who.trim().to_owned();
    if let Some(p) = cx.principal.as_ref().filter(|p| **p != who) {
        return Err(ToolError(format!(
            "this client's token belongs to {p:?}; it cannot act as {who:?}"
        )));
    }
    if let Some(b) = cx.bound.lock().as_ref().filter(|b| **b != who) {
        return Err(ToolError(format!(
            "this session is registered as {b:?}; it cannot act as {who:?}"
        )));
    }
    Ok(who)
}

// ---- post_message ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostArgs {
    pub channel: String,
    pub sender: String,
    /// message (default), question, answer, status, done
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub body: String,
    #[serde(default)]
    pub session_id: Option<String>,
    /// The one participant this is for
    #[serde(default)]
    pub recipient: Option<String>,
    /// Id of the message this answers
    #[serde(default)]
    pub reply_to: Option<u64>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub side: Option<String>,
    /// A retry with the same key returns the original
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

async fn post_message(cx: Cx, a: PostArgs) -> Result<Output, ToolError> {
    let name = channel(&a.channel)?;
    let sender = act_as(&cx, &a.sender)?;
    let posted = cx
        .relay
        .post(
            &name,
            NewMessage {
                sender,
                kind: a.kind,
                body: a.body,
                recipient: a.recipient,
                reply_to: a.reply_to,
                session_id: a.session_id,
                status: a.status,
                side: a.side,
                idempotency_key: a.idempotency_key,
            },
            cx.session.as_deref(),
        )
        .await?;
    let m = &posted.message;
    tracing::debug!(channel = %name, id = m.id, "posted over MCP");
    let text = format!(
        "Posted #{id} to {name}. To get the answer: wait_for_message(channel=\"{name}\", since_id={id}).",
        id = m.id
    );
    Ok(Output {
        structured: posted.value(),
        text,
    })
}

// ---- get_messages ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetArgs {
    /// Channel name.
    pub channel: String,
    /// Return messages with id greater than this (0 = from the start).
    #[serde(default)]
    pub since_id: u64,
    /// At most this many messages (default 100, at most 10000).
    #[serde(default)]
    pub limit: Option<usize>,
}

async fn get_messages(cx: Cx, a: GetArgs) -> Result<Output, ToolError> {
    let name = channel(&a.channel)?;
    let limit = limit(a.limit)?;
    // One more than asked tells whether more follow without a second read.
    let reader = cx.bound.lock().clone();
    let mut found = cx.relay.read(&name, a.since_id, limit + 1, reader.as_deref()).await?;
    let has_more = found.len() > limit;
    found.truncate(limit);
    page(&name, a.since_id, &found, has_more, None)
}

// ---- wait_for_message ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// Channel name.
    pub channel: String,
    /// Wait for messages with id greater than this: the largest id you have seen.
    #[serde(default)]
    pub since_id: u64,
    /// Seconds to wait before returning [] (default 30; capped by the server, 55 by default).
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// active (default) or parked (a worker that must never hold a coordinator's wait).
    #[serde(default)]
    pub role: Option<String>,
}

async fn wait_for_message(cx: Cx, a: WaitArgs) -> Result<Output, ToolError> {
    let name = channel(&a.channel)?;
    let asked = a.timeout_s.unwrap_or(DEFAULT_WAIT_SECS);
    let timeout = capped_timeout(asked, cx.wait_cap)?;
    if asked > timeout.as_secs_f64() {
        warn_client(
            &cx,
            format!(
                "wait_for_message: timeout_s {asked} is above this relay's cap; waiting {} s",
                timeout.as_secs_f64()
            ),
        )
        .await;
    }
    let limit = MCP_DEFAULT_LIMIT;
    let _pending = Gauge::enter(&cx.waits);
    let role = match a.role.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("active") => Role::Active,
        Some("parked") => Role::Parked,
        Some(other) => return Err(ToolError(format!("role {other:?} is not one of: active, parked"))),
    };
    let me = cx.bound.lock().clone();
    let opts = WaitOptions {
        since_id: a.since_id,
        limit: limit + 1,
        timeout,
        exclude_self: me.is_some(),
        instance: me,
        role,
    };
    let wait = cx.relay.wait(&name, opts);
    tokio::pin!(wait);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + WAIT_PROGRESS_EVERY, WAIT_PROGRESS_EVERY);
    let started = std::time::Instant::now();
    let mut found = loop {
        tokio::select! {
            found = &mut wait => break found?,
            _ = cx.cancel.cancelled() => {
                tracing::debug!(channel = %name, "wait cancelled by its client");
                return Err(ToolError("cancelled".into()));
            }
            _ = ticks.tick() => {
                if let Some(token) = &cx.progress {
                    let waited = started.elapsed().as_secs_f64();
                    let mut p = ProgressNotificationParam::new(token.clone(), waited);
                    p.total = Some(timeout.as_secs_f64());
                    p.message = Some(format!("waiting for messages on {name} after #{}", a.since_id));
                    let _ = cx.peer.notify_progress(p).await;
                }
            }
        }
    };
    let outcome = found.outcome;
    let next = found.next_since_id;
    let has_more = found.messages.len() > limit;
    found.messages.truncate(limit);
    let timed_out = found.messages.is_empty();
    let mut out = page(&name, a.since_id, &found.messages, has_more, Some(timed_out))?;
    out.structured["outcome"] = json!(outcome);
    out.structured["hint"] = json!(outcome.hint());
    if !has_more {
        out.structured["next_since_id"] = json!(next);
    }
    if !matches!(outcome, WaitOutcome::Messages | WaitOutcome::Timeout) {
        out.text = format!(
            "{} [{}] {}",
            out.text,
            serde_json::to_value(outcome).unwrap_or_default(),
            outcome.hint()
        );
    }
    Ok(out)
}

/// A tool's `timeout_s`, checked and capped: blocking tools must stay under the host's
/// tool-call time-out.
pub(crate) fn capped_timeout(asked: f64, cap: Duration) -> Result<Duration, ToolError> {
    if !asked.is_finite() || asked < 0.0 {
        return Err(ToolError(format!(
            "timeout_s must be a number of seconds >= 0, got {asked}"
        )));
    }
    Ok(Duration::from_secs_f64(asked.min(cap.as_secs_f64())))
}

/// Sends a `notifications/message` at warning level if the client asked for warnings.
async fn warn_client(cx: &Cx, text: String) {
    let wanted = *cx.log_level.lock();
    if severity(wanted) > severity(LoggingLevel::Warning) {
        return;
    }
    let mut p = LoggingMessageNotificationParam::new(LoggingLevel::Warning, Value::String(text));
    p.logger = Some("crosstalk".into());
    let _ = cx.peer.notify_logging_message(p).await;
}

/// RFC 5424 order of MCP log levels, lowest first.
#[allow(deprecated)] // MCP logging is deprecated by SEP-2577 but 2025-11-25 clients use it
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

// ---- list_channels ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

async fn list_channels(cx: Cx, _: NoArgs) -> Result<Output, ToolError> {
    let channels: Vec<ChannelSummary> = cx.relay.list_channels()?;
    let mut text = format!("{} channel(s)", channels.len());
    for c in &channels {
        let _ = write!(text, "\n{}: {} messages, last #{}", c.channel, c.count, c.last_id);
        if let Some(at) = &c.last_at {
            let _ = write!(text, " at {at}");
        }
    }
    let structured = json!({ "channels": channels });
    Ok(Output { structured, text })
}

// ---- shared shapes ----

/// A page of messages: `{channel, messages, next_since_id, has_more[, timed_out]}`.
pub(crate) fn page(
    name: &ChannelName,
    since_id: u64,
    found: &[Arc<Posted>],
    has_more: bool,
    timed_out: Option<bool>,
) -> Result<Output, ToolError> {
    let next = found.last().map_or(since_id, |p| p.id());
    let messages: Vec<Value> = found.iter().map(|p| p.value()).collect();
    let mut structured = json!({
        "channel": name,
        "messages": messages,
        "next_since_id": next,
        "has_more": has_more,
    });
    let mut text = String::new();
    if let Some(t) = timed_out {
        structured["timed_out"] = Value::Bool(t);
        if t {
            let _ = write!(
                text,
                "[] No new messages on {name} after #{since_id}. To keep waiting: \
                 wait_for_message(channel=\"{name}\", since_id={since_id})."
            );
            return Ok(Output { structured, text });
        }
    }
    let _ = write!(text, "{} message(s) on {name}", found.len());
    if found.is_empty() {
        let _ = write!(text, " after #{since_id}.");
    }
    for p in found {
        let m = &p.message;
        let _ = write!(text, "\n#{} {} [{}", m.id, m.sender, m.kind);
        if let Some(s) = &m.status {
            let _ = write!(text, ", {s}");
        }
        text.push(']');
        if let Some(r) = &m.recipient {
            let _ = write!(text, " to {r}");
        }
        if let Some(r) = m.reply_to {
            let _ = write!(text, " re #{r}");
        }
        text.push_str(": ");
        if m.body.len() > TEXT_BODY_MAX {
            let mut cut = TEXT_BODY_MAX;
            while !m.body.is_char_boundary(cut) {
                cut -= 1;
            }
            let _ = write!(
                text,
                "{}… (truncated; the structured content has it all)",
                &m.body[..cut]
            );
        } else {
            text.push_str(&m.body);
        }
    }
    if !found.is_empty() {
        let more = if has_more {
            " More are waiting: call get_messages at once."
        } else {
            ""
        };
        let _ = write!(text, "\nnext since_id: {next}.{more}");
    }
    Ok(Output { structured, text })
}

pub(crate) fn message_schema() -> Value {
    let mut props = serde_json::Map::new();
    for (k, t) in [
        ("id", "integer"),
        ("channel", "string"),
        ("sender", "string"),
        ("type", "string"),
        ("body", "string"),
        ("created_at", "string"),
        ("reply_count", "integer"),
    ] {
        props.insert(k.into(), json!({ "type": t }));
    }
    props.insert("reply_to".into(), json!({ "type": ["integer", "null"] }));
    json!({ "type": "object", "properties": props })
}

fn page_schema(wait: bool) -> Value {
    let mut s = json!({
        "type": "object",
        "properties": {
            "channel": { "type": "string" },
            "messages": { "type": "array", "items": { "$ref": "#/$defs/message" } },
            "next_since_id": { "type": "integer", "description": "pass as since_id next time" },
            "has_more": { "type": "boolean" }
        },
        "required": ["channel", "messages", "next_since_id", "has_more"],
        "$defs": { "message": message_schema() }
    });
    if wait {
        s["properties"]["timed_out"] = json!({ "type": "boolean" });
        if let Some(req) = s["required"].as_array_mut() {
            req.push(json!("timed_out"));
        }
    }
    s
}

pub(crate) fn channels_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "channels": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "channel": { "type": "string" },
                        "count": { "type": "integer" },
                        "last_id": { "type": "integer" },
                        "last_at": { "type": ["string", "null"] },
                        "created_at": { "type": ["string", "null"] }
                    },
                    "required": ["channel", "count", "last_id"]
                }
            }
        },
        "required": ["channels"]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_builds_and_is_small() {
        let tools = list();
        let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
        assert_eq!(
            names[..4],
            ["post_message", "get_messages", "wait_for_message", "list_channels"]
        );
        for t in [
            "register",
            "get_directives",
            "search_messages",
            "share_data",
            "check_messages",
            "ask_human",
        ] {
            assert!(names.contains(&t.to_string()), "{t} missing");
        }
        let size = serde_json::to_vec(&tools).unwrap().len();
        assert!(size < 12 * 1024, "tools/list is {size} bytes");
        for t in &tools {
            assert_eq!(t.input_schema.get("type"), Some(&json!("object")), "{}", t.name);
            assert!(t.output_schema.is_some(), "{}", t.name);
        }
    }
}
