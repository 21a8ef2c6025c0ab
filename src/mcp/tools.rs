//! The MCP tools: the operation table as tools. A tool is an [`Operation`] (its name,
//! description, request and response: the input and output schemas are derived from those
//! types) plus a text rendering for hosts that show only text ([`super::render`]).
//!
//! What the face adds is transport: arguments are checked against the input schema
//! (misspelt names are refused), a blocking call reports progress while it waits and ends
//! when the client cancels it, and a refusal is a tool error (`isError: true` with a message
//! the model can act on), never a JSON-RPC error and never a panic.
#![allow(deprecated)] // `LoggingLevel`: MCP logging is deprecated by SEP-2577; 2025-11-25 clients still use it

use super::render::Render;
use super::schema::{argument_names, compact, inline_defs, shallow};
use super::Face;
use crate::ops::channels;
use crate::ops::identity::{self, Register};
use crate::ops::messages::{self};
use crate::ops::sessions;
use crate::ops::shared;
use crate::ops::{Caller, Ctx, ErrorKind, FacePolicy, OpError, Operation, Principal};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use rmcp::handler::server::common::{schema_for_input, schema_for_output};
use rmcp::model::{
    CallToolResult, ContentBlock, JsonObject, LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam,
    ProgressToken, Tool, ToolAnnotations,
};
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Messages a listing returns when the caller names no `limit`: a model pays for every
/// message it reads, so pages are small.
pub const MCP_DEFAULT_LIMIT: usize = 100;
/// How often a pending call reports progress, when the client asked for progress: hosts
/// that reset their tool-call timeout on progress then never give up on a long wait.
pub const WAIT_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// What a tool call may use besides its arguments: the client, the request's cancellation,
/// who the caller is.
#[derive(Clone)]
pub struct Cx {
    pub ctx: Ctx,
    /// The session an identity registered from this client is bound to.
    pub session: Option<String>,
    /// Who the client's token is.
    pub principal: Principal,
    /// The identity this MCP session registered as.
    pub bound: Arc<Mutex<Option<String>>>,
    /// Longest blocking call.
    pub wait_cap: Duration,
    pub cancel: CancellationToken,
    /// The client, for progress and log notifications; none for a task's wait, which runs
    /// apart from any request.
    pub peer: Option<Peer<RoleServer>>,
    /// Set when the client asked for progress notifications on this call.
    pub progress: Option<ProgressToken>,
    /// The session's `logging/setLevel`.
    pub log_level: Arc<Mutex<LoggingLevel>>,
    /// Which MCP face the call came in on.
    pub face: Face,
}

/// The MCP faces' policy: small pages, and blocking calls capped at `wait_cap`.
pub fn policy(wait_cap: Duration) -> FacePolicy {
    FacePolicy {
        agents: true,
        default_limit: MCP_DEFAULT_LIMIT,
        wait_cap,
    }
}

impl Cx {
    pub fn caller(&self) -> Caller {
        Caller {
            principal: self.principal.clone(),
            session: self.session.clone(),
            bound: self.bound.lock().clone(),
            bound_only: self.face == Face::Crosstalk,
            policy: policy(self.wait_cap),
        }
    }
}

type Call = Arc<dyn Fn(Cx, JsonObject) -> BoxFuture<'static, CallToolResult> + Send + Sync>;
type Check = Arc<dyn Fn(&JsonObject) -> Result<(), OpError> + Send + Sync>;

pub(crate) struct Route {
    tool: Tool,
    call: Call,
    /// Whether arguments would be accepted, without running anything.
    check: Check,
}

/// A tool for operation `O`.
fn tool<O>() -> Route
where
    O: Operation,
    O::Response: Render,
{
    tool_then::<O>(|_, _| {})
}

/// A tool for operation `O` that also does `then` with a successful answer (transport
/// state: the identity bound to this MCP session).
fn tool_then<O>(then: fn(&Cx, &O::Response)) -> Route
where
    O: Operation,
    O::Response: Render,
{
    let name = O::NAME;
    let mut input =
        Value::Object((*schema_for_input::<O::Request>().unwrap_or_else(|e| panic!("tool {name}: {e}"))).clone());
    inline_defs(&mut input);
    compact(&mut input, true);
    let mut output = shallow(&Value::Object((*schema_for_output::<O::Response>()).clone()));
    compact(&mut output, false);
    let (Value::Object(input), Value::Object(output)) = (input, output) else {
        unreachable!("schemas are objects")
    };
    let accepted = Arc::new(argument_names(&input));
    // Told truthfully, so that hosts with approval policies (Codex runs only read-only or
    // closed-world tools without asking) run them: every tool acts on the relay alone. Only
    // what differs from MCP's defaults (not read-only, destructive, not idempotent, open
    // world) is written: every byte of tools/list is in every turn's context.
    let mut annotations = ToolAnnotations::new();
    annotations.open_world_hint = Some(false);
    annotations.read_only_hint = O::READ_ONLY.then_some(true);
    annotations.destructive_hint = (!O::READ_ONLY && !O::DESTRUCTIVE).then_some(false);
    annotations.idempotent_hint = O::IDEMPOTENT.then_some(true);
    let tool = Tool::new_with_raw(name, Some(O::DESCRIPTION.into()), Arc::new(input))
        .with_raw_output_schema(Arc::new(output))
        .with_annotations(annotations);
    let check: Check = {
        let accepted = accepted.clone();
        Arc::new(move |args| unknown_argument::<O>(&accepted, args).and_then(|()| parse::<O>(args.clone()).map(drop)))
    };
    let call: Call = Arc::new(move |cx, args| {
        let accepted = accepted.clone();
        Box::pin(async move {
            match run::<O>(&cx, &accepted, args).await {
                Ok(answer) => {
                    then(&cx, &answer);
                    let text = answer.text();
                    let mut r = CallToolResult::structured(serde_json::to_value(&answer).unwrap_or(Value::Null));
                    r.content = vec![ContentBlock::text(text)];
                    r
                }
                // crosstalk-mcp answers "no session" as a result, not an error.
                Err(e) if e.kind == ErrorKind::NoActiveSession => {
                    let mut r = CallToolResult::structured(json!({ "status": e.kind.code(), "error": e.message }));
                    r.content = vec![ContentBlock::text(format!("no_active_session: {}", e.message))];
                    r
                }
                Err(e) => {
                    tracing::debug!(tool = name, error = %e, "tool call refused");
                    error_result(&e)
                }
            }
        })
    });
    Route { tool, call, check }
}

/// The one place an operation's error becomes a tool error: the words in the text, and the
/// same in the structured result (hosts such as Claude Code and Codex give their model only
/// that), with the error's code.
pub fn error_result(e: &OpError) -> CallToolResult {
    let text = match e.kind {
        ErrorKind::Invalid => format!("refused: {}", e.message),
        _ => e.message.clone(),
    };
    let mut r = CallToolResult::error(vec![ContentBlock::text(text.clone())]);
    r.structured_content = Some(json!({"error": text, "code": e.kind.code()}));
    r
}

/// Checks the arguments, runs the operation, reports progress while it blocks, and gives up
/// when the client cancels.
async fn run<O: Operation>(cx: &Cx, accepted: &BTreeSet<String>, args: JsonObject) -> Result<O::Response, OpError> {
    let request = arguments::<O>(cx, accepted, args)
        .await
        .inspect_err(|e| crate::ops::counted(cx.face.label(), O::NAME, e.kind.code()))?;
    // Pinned where it is made: `tokio::pin!` on a named future would keep a second,
    // moved-from slot of its size in this future for as long as the call runs.
    let mut running = std::pin::pin!(crate::ops::call::<O>(cx.face.label(), &cx.ctx, cx.caller(), request));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + WAIT_PROGRESS_EVERY, WAIT_PROGRESS_EVERY);
    let started = std::time::Instant::now();
    loop {
        tokio::select! {
            answer = running.as_mut() => return answer,
            _ = cx.cancel.cancelled() => {
                tracing::debug!(tool = O::NAME, "tool call cancelled by its client");
                return Err(OpError::invalid("cancelled"));
            }
            _ = ticks.tick() => {
                if let Some(token) = &cx.progress {
                    let mut p = ProgressNotificationParam::new(token.clone(), started.elapsed().as_secs_f64());
                    p.total = Some(cx.wait_cap.as_secs_f64());
                    p.message = Some(format!("{} is waiting", O::NAME));
                    // Boxed: sending a notification is a large future, and inline it would
                    // be part of every parked call's size.
                    if let Some(peer) = &cx.peer {
                        let _ = Box::pin(peer.notify_progress(p)).await;
                    }
                }
            }
        }
    }
}

/// The tool's arguments as the operation's request; unknown ones are refused.
async fn arguments<O: Operation>(
    cx: &Cx,
    accepted: &BTreeSet<String>,
    args: JsonObject,
) -> Result<O::Request, OpError> {
    unknown_argument::<O>(accepted, &args)?;
    if let Some(asked) = args.get("timeout_s").and_then(Value::as_f64) {
        if asked > cx.wait_cap.as_secs_f64() {
            // Boxed, as the progress notification in `run`: a rare, large future.
            Box::pin(warn_client(
                cx,
                format!(
                    "{}: timeout_s {asked} is above this relay's cap; waiting {} s",
                    O::NAME,
                    cx.wait_cap.as_secs_f64()
                ),
            ))
            .await;
        }
    }
    parse::<O>(args)
}

/// Refuses an argument the tool does not have (a misspelt name would otherwise be ignored).
fn unknown_argument<O: Operation>(accepted: &BTreeSet<String>, args: &JsonObject) -> Result<(), OpError> {
    match args.keys().find(|k| !accepted.contains(*k)) {
        None => Ok(()),
        Some(unknown) => {
            let known: Vec<&str> = accepted.iter().map(String::as_str).collect();
            Err(OpError::invalid(format!(
                "unknown argument {unknown:?} for {}; the arguments are: {}",
                O::NAME,
                known.join(", ")
            )))
        }
    }
}

/// The arguments as the operation's request, or what is wrong with them and where.
fn parse<O: Operation>(args: JsonObject) -> Result<O::Request, OpError> {
    serde_path_to_error::deserialize(Value::Object(args)).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        if path == "." {
            OpError::invalid(format!("invalid arguments for {}: {e}", O::NAME))
        } else {
            OpError::invalid(format!("invalid arguments for {}: {path}: {e}", O::NAME))
        }
    })
}

/// Sends a `notifications/message` at warning level if the client asked for warnings.
async fn warn_client(cx: &Cx, text: String) {
    let wanted = *cx.log_level.lock();
    if severity(wanted) > severity(LoggingLevel::Warning) {
        return;
    }
    let Some(peer) = &cx.peer else { return };
    let mut p = LoggingMessageNotificationParam::new(LoggingLevel::Warning, Value::String(text));
    p.logger = Some("crosstalk".into());
    let _ = peer.notify_logging_message(p).await;
}

/// RFC 5424 order of MCP log levels, lowest first.
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

/// The tool table, built once: crosstalk-mcp's tools first, then the coordination tools.
static ROUTES: LazyLock<Vec<Route>> = LazyLock::new(|| {
    vec![
        tool::<messages::Post>(),
        tool::<messages::Read>(),
        tool::<messages::Wait>(),
        tool::<channels::ListChannels>(),
        tool_then::<Register>(|cx, r| *cx.bound.lock() = Some(r.registered.instance.instance_id.clone())),
        tool::<identity::ListInstances>(),
        tool::<identity::Inbox>(),
        tool::<channels::CreateChannel>(),
        tool::<channels::FindChannel>(),
        tool::<messages::Replies>(),
        tool::<messages::GetReaders>(),
        tool::<channels::Search>(),
        tool::<sessions::StartSession>(),
        tool::<sessions::EndSession>(),
        tool::<sessions::GetSession>(),
        tool::<sessions::Directives>(),
        tool::<messages::Ask>(),
        tool::<shared::Share>(),
        tool::<shared::GetData>(),
        tool::<shared::ListData>(),
        tool::<shared::DeleteData>(),
        tool::<crate::ops::reservations::Reservations>(),
    ]
});

/// cross-claude-mcp's 15 tools, under its names and arguments (`/cc/mcp`).
static CC_ROUTES: LazyLock<Vec<Route>> = LazyLock::new(|| {
    use crate::ops::cross_claude as cc;
    vec![
        tool_then::<cc::CcRegister>(|cx, r| *cx.bound.lock() = Some(r.instance_id.clone())),
        tool::<cc::SendMessage>(),
        tool::<cc::CheckMessages>(),
        tool::<cc::WaitForReply>(),
        tool::<cc::GetReplies>(),
        tool::<cc::CreateChannel>(),
        tool::<cc::ListChannels>(),
        tool::<cc::FindChannel>(),
        tool::<cc::ListInstances>(),
        tool::<cc::SearchMessages>(),
        tool::<cc::ShareData>(),
        tool::<cc::GetSharedData>(),
        tool::<cc::ListSharedData>(),
        tool::<cc::Subscribe>(),
        tool::<cc::Unsubscribe>(),
    ]
});

/// What an `ask_human` task runs once its question is posted: the wait for the answer.
static AWAIT_ANSWER: LazyLock<Route> = LazyLock::new(tool::<messages::AwaitAnswer>);

fn routes(face: Face) -> &'static [Route] {
    match face {
        Face::Crosstalk => &ROUTES,
        Face::CrossClaude => &CC_ROUTES,
    }
}

/// Most bytes of JSON a `tools/list` answer may take on `/mcp` (every host puts the list in its
/// model's context, every turn): a new tool must be worth its bytes. Tests hold the list to it.
pub const TOOLS_LIST_BUDGET: usize = 13_000;
/// The same for cross-claude's list on `/cc/mcp`.
pub const CC_TOOLS_LIST_BUDGET: usize = 13 * 1024;
/// Most tools `/mcp` may list.
pub const TOOLS_BUDGET: usize = 22;

/// What a tool's description says of this relay's settings: written in the description as
/// `{max_shared}`, filled in when the tools are listed, so the text says what the relay does.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub max_shared_bytes: usize,
}

impl Default for Settings {
    /// The defaults' (the bridge's list before it reaches its relay).
    fn default() -> Self {
        Settings {
            max_shared_bytes: crosstalk_actors::relay::DEFAULT_MAX_SHARED_BYTES,
        }
    }
}

/// `bytes` as people read a size: `1 MiB`, `512 KiB`, `1000 bytes`.
pub fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

fn described(mut tool: Tool, settings: Settings) -> Tool {
    if let Some(d) = tool.description.as_deref().filter(|d| d.contains('{')) {
        tool.description = Some(d.replace("{max_shared}", &size(settings.max_shared_bytes)).into());
    }
    tool
}

/// Every tool's definition, for `tools/list`.
pub fn list(face: Face, settings: Settings) -> Vec<Tool> {
    routes(face)
        .iter()
        .map(|r| described(r.tool.clone(), settings))
        .collect()
}

/// Which of crosstalk's tools `tools/list` offers on `/mcp`: all of them, or the handful an
/// agent needs to post, read, wait and ask ([`CORE`]), a third of the bytes in every turn's
/// context. The others stay callable by name. `/cc/mcp` always offers cross-claude's set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ToolChoice {
    #[default]
    Full,
    Core,
}

impl ToolChoice {
    /// Its name, as `--tools` and `?tools=` take it.
    pub fn name(self) -> &'static str {
        match self {
            ToolChoice::Full => "full",
            ToolChoice::Core => "core",
        }
    }
}

/// The core tools, in `tools/list` order.
pub const CORE: &[&str] = &[
    "post_message",
    "get_messages",
    "wait_for_message",
    "register",
    "ask_human",
];

impl std::str::FromStr for ToolChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(ToolChoice::Full),
            "core" => Ok(ToolChoice::Core),
            other => Err(format!("tools must be core or full, not {other:?}")),
        }
    }
}

/// The tool set a request chooses: the `tools=` of its query string, else its
/// `X-Crosstalk-Tools` header (blank counts as none); `None` when it does not choose.
pub fn choice(query: &str, header: Option<&str>) -> Option<Result<ToolChoice, String>> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == "tools")
        .map(|(_, v)| v)
        .or(header.map(str::trim).filter(|h| !h.is_empty()))
        .map(str::parse)
}

/// The tools a face offers under a choice.
pub fn offered(face: Face, choice: ToolChoice, settings: Settings) -> Vec<Tool> {
    match (face, choice) {
        (Face::Crosstalk, ToolChoice::Core) => routes(face)
            .iter()
            .filter(|r| CORE.contains(&&*r.tool.name))
            .map(|r| described(r.tool.clone(), settings))
            .collect(),
        _ => list(face, settings),
    }
}

pub fn get(face: Face, name: &str, settings: Settings) -> Option<Tool> {
    routes(face)
        .iter()
        .find(|r| r.tool.name == name)
        .map(|r| described(r.tool.clone(), settings))
}

fn route(face: Face, name: &str) -> Option<&'static Route> {
    routes(face).iter().find(|r| r.tool.name == name)
}

/// Whether `args` would be accepted by tool `name`: what a task checks before it is made,
/// so a call with bad arguments is refused at once instead of becoming a failed task.
pub fn check(face: Face, name: &str, args: &JsonObject) -> Result<(), OpError> {
    match route(face, name) {
        Some(r) => (r.check)(args),
        None => Err(OpError::invalid(format!("unknown tool {name:?}"))),
    }
}

/// Runs what a task of tool `name` waits for, with the arguments its record pinned: the
/// tool itself, or for `ask_human` (whose question was posted when the task was made) the
/// wait for the answer.
pub async fn run_task(face: Face, cx: Cx, name: &str, args: JsonObject) -> Result<CallToolResult, OpError> {
    let route = match (face, name) {
        (Face::Crosstalk, "ask_human") => &*AWAIT_ANSWER,
        _ => route(face, name).ok_or_else(|| OpError::invalid(format!("unknown tool {name:?}")))?,
    };
    Ok((route.call)(cx, args).await)
}

/// Runs a tool. An unknown name is a protocol error (the spec's `-32602`); anything a tool
/// refuses is an `isError` result.
pub async fn call(face: Face, cx: Cx, name: &str, args: JsonObject) -> Result<CallToolResult, McpError> {
    let table = routes(face);
    let Some(route) = table.iter().find(|r| r.tool.name == name) else {
        let names: Vec<_> = table.iter().map(|r| r.tool.name.as_ref()).collect();
        return Err(McpError::invalid_params(
            format!("unknown tool {name:?}; the tools are: {}", names.join(", ")),
            None,
        ));
    };
    let started = std::time::Instant::now();
    let result = (route.call)(cx, args).await;
    tracing::debug!(tool = name, ms = started.elapsed().as_millis() as u64, "tool call");
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cross_claude_table_has_its_fifteen_tools_and_is_small() {
        let tools = list(Face::CrossClaude, Settings::default());
        let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "register",
                "send_message",
                "check_messages",
                "wait_for_reply",
                "get_replies",
                "create_channel",
                "list_channels",
                "find_channel",
                "list_instances",
                "search_messages",
                "share_data",
                "get_shared_data",
                "list_shared_data",
                "subscribe",
                "unsubscribe"
            ]
        );
        let size = serde_json::to_vec(&tools).unwrap().len();
        assert!(size <= CC_TOOLS_LIST_BUDGET, "tools/list is {size} bytes");
        let send = tools.iter().find(|t| t.name == "send_message").unwrap();
        for arg in ["channel", "sender", "content", "message_type", "in_reply_to"] {
            assert!(
                send.input_schema["properties"].get(arg).is_some(),
                "send_message lacks {arg}"
            );
        }
    }

    #[test]
    fn the_table_builds_and_is_small() {
        let tools = list(Face::Crosstalk, Settings::default());
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
            "reserve",
        ] {
            assert!(names.contains(&t.to_string()), "{t} missing");
        }
        // The answer wraps the list in `{"tools": …}`: the list alone is held to the budget too.
        let size = serde_json::to_vec(&tools).unwrap().len();
        assert!(size <= TOOLS_LIST_BUDGET, "tools/list is {size} bytes");
        assert!(tools.len() <= TOOLS_BUDGET, "{} tools", tools.len());
        for t in &tools {
            assert_eq!(t.input_schema.get("type"), Some(&json!("object")), "{}", t.name);
            assert!(t.output_schema.is_some(), "{}", t.name);
        }
    }
}
