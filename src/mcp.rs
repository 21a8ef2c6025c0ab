//! The MCP face at `/mcp`: rmcp's streamable HTTP transport (sessions for 2025-11-25 clients,
//! stateless requests for 2026-07-28 ones), the tools, the channel resources and the protocol
//! prompt. It translates MCP into calls on [`Relay`] and back; it holds no business rules.
//!
//! Codemap: [`tools`] (the tool table: one function per tool), [`resources`] (channels as
//! `crosstalk://channels/{name}`, and the watchers behind resource subscriptions), [`prompt`]
//! (`crosstalk-protocol`), [`sessions`] (the session manager that ends a tool call whose
//! client went away), [`tasks`] (blocking calls as MCP tasks, both generations).
#![allow(deprecated)] // `LoggingLevel`, `resources/subscribe`: still what 2025-11-25 clients use

pub mod compat;
pub mod events;
pub mod owner;
pub mod prompt;
pub mod render;
pub mod resources;
pub mod schema;
pub mod sessions;
pub mod tasks;
pub mod tools;

use crate::ops::oauth::Credential;
use crate::ops::{Caller, Ctx, Principal};
use parking_lot::Mutex;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CreateTaskResult, GetPromptRequestParams,
    GetPromptResponse, GetTaskParams, GetTaskResult, Implementation, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, LoggingLevel, PaginatedRequestParams, Prompt, ReadResourceRequestParams,
    ReadResourceResponse, ResourceTemplate, ServerCapabilities, ServerInfo, SetLevelRequestParams,
    SubscribeRequestParams, SubscriptionFilter, Tool, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use rmcp_actix_web::transport::StreamableHttpService;
use std::sync::Arc;
use std::time::Duration;

/// Where the MCP endpoint is mounted.
pub const MCP_PATH: &str = "/mcp";
/// Keep-alive comment interval on MCP event streams, so proxies keep idle streams open.
pub const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Largest MCP request body: a post's body plus its JSON-RPC envelope.
pub const MCP_BODY_OVERHEAD: usize = 64 * 1024;

/// What the MCP face needs from the configuration.
#[derive(Debug, Clone)]
pub struct McpSettings {
    /// Longest `wait_for_message`.
    pub wait_cap: Duration,
    /// Longest wait of a call run as a task.
    pub task_wait_cap: Duration,
    /// Hosts accepted besides loopback.
    pub allowed_hosts: Vec<String>,
    /// Largest message body the relay accepts.
    pub max_body_bytes: usize,
    /// The tools `/mcp` lists unless a request asks otherwise.
    pub tools: tools::ToolChoice,
}

/// Which tool set, prompt and instructions a service offers: crosstalk's (`/mcp`) or
/// cross-claude-mcp's (`/cc/mcp`). Both run the same operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Face {
    Crosstalk,
    CrossClaude,
}

impl Face {
    /// The face's name in the metrics (`crosstalk_operations_total{face}`).
    pub fn label(self) -> &'static str {
        match self {
            Face::Crosstalk => "mcp",
            Face::CrossClaude => "cc-mcp",
        }
    }

    /// The face whose [`Face::label`] this is (what a stored task names); crosstalk's for any
    /// other.
    pub fn from_label(label: &str) -> Face {
        if label == Face::CrossClaude.label() {
            Face::CrossClaude
        } else {
            Face::Crosstalk
        }
    }
}

/// The transport, built once and cloned into every worker: sessions live in its session
/// manager, which all clones share.
pub type McpService = StreamableHttpService<CrosstalkMcp, sessions::DisconnectAware>;

/// Builds the `/mcp` service. The relay's shutdown token is the transport's, so SIGTERM ends
/// every MCP session and stream along with the REST ones.
pub fn service(
    ctx: Ctx,
    settings: &McpSettings,
    face: Face,
    owners: Arc<owner::Owners>,
    tasks: Arc<tasks::Tasks>,
) -> McpService {
    let hosts = allowed_hosts(&settings.allowed_hosts);
    let origins = allowed_origins(&hosts);
    let shutdown = ctx.relay.shutdown_token();
    let wait_cap = settings.wait_cap;
    let choice = settings.tools;
    let sessions = sessions::DisconnectAware::new(ctx.relay.clone(), owners, tasks.clone(), face);
    StreamableHttpService::builder()
        .service_factory(Arc::new(move || {
            Ok(CrosstalkMcp::new(ctx.clone(), wait_cap, face, tasks.clone()).offering(choice))
        }))
        .session_manager(Arc::new(sessions))
        .stateful_mode(true)
        .sse_keep_alive(SSE_KEEP_ALIVE)
        .max_request_body_bytes(settings.max_body_bytes + MCP_BODY_OVERHEAD)
        .allowed_hosts(hosts)
        .allowed_origins(origins)
        .cancellation_token(shutdown)
        // The auth middleware's verdict travels to the tools, so a participant token acts
        // only as its identity over MCP too (the Authorization header itself is not passed).
        .on_request_fn(|req, ext| {
            let verdict = actix_web::HttpMessage::extensions(req);
            if let Some(p) = verdict.get::<Principal>() {
                ext.insert(p.clone());
            }
            // And the OAuth grant of its token, if it was one: a task made with it ends with it.
            if let Some(c) = verdict.get::<Credential>() {
                ext.insert(c.clone());
            }
        })
        .build()
}

/// The guard's list (loopback plus the configured hosts), given to rmcp too: never empty, as
/// rmcp reads an empty list as "accept any Host".
pub use crate::guard::allowed_hosts;

/// Browser origins accepted in `Origin`: the allowed hosts over http and https, any port
/// unless the host names one. Requests without `Origin` (every non-browser client) pass.
pub fn allowed_origins(hosts: &[String]) -> Vec<String> {
    let mut origins = Vec::new();
    for h in hosts {
        let authority = if h.contains(':') && !h.contains('[') && h.matches(':').count() > 1 {
            // A bare IPv6 address such as `::1`.
            format!("[{h}]:*")
        } else if h.contains(':') {
            h.clone()
        } else {
            format!("{h}:*")
        };
        for scheme in ["http", "https"] {
            origins.push(format!("{scheme}://{authority}"));
        }
    }
    origins
}

/// One MCP session's server (or one stateless request's): cheap, made by the factory.
#[derive(Clone)]
pub struct CrosstalkMcp {
    ctx: Ctx,
    face: Face,
    /// Longest `wait_for_message`.
    wait_cap: Duration,
    /// Channels this session subscribed to with `resources/subscribe`; dropping the last
    /// clone (the session ended) stops their watchers.
    subscriptions: Arc<resources::Subscriptions>,
    /// Lowest log level the client asked to receive (`logging/setLevel`).
    log_level: Arc<Mutex<LoggingLevel>>,
    /// The identity this MCP session registered as (`register`); it keeps it.
    bound: Arc<Mutex<Option<String>>>,
    /// A 2026-07-28 listen's channels and their watermarks when it was accepted (see
    /// `accepted_subscription_filter`), until `listen` takes them.
    listen_from: Arc<Mutex<std::collections::HashMap<String, u64>>>,
    /// The relay's MCP tasks (shared by every session and both faces).
    tasks: Arc<tasks::Tasks>,
    /// The tools listed when a request does not choose (`--tools`).
    tools: tools::ToolChoice,
}

impl CrosstalkMcp {
    /// What its tools' descriptions say of this relay's settings.
    fn settings(&self) -> tools::Settings {
        tools::Settings {
            max_shared_bytes: self.ctx.relay.max_shared_bytes(),
        }
    }

    /// The caller of a request other than a tool call (a resource read), as a tool call's
    /// ([`tools::Cx`]) is built: the same principal, session, bound identity and policy.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Caller {
        Caller {
            principal: principal(context),
            session: session(context),
            bound: self.bound.lock().clone(),
            bound_only: self.face == Face::Crosstalk,
            policy: tools::policy(self.wait_cap),
        }
    }

    pub fn new(ctx: Ctx, wait_cap: Duration, face: Face, tasks: Arc<tasks::Tasks>) -> Self {
        CrosstalkMcp {
            tasks,
            face,
            subscriptions: Arc::new(resources::Subscriptions::new(ctx.relay.shutdown_token())),
            ctx,
            wait_cap,
            log_level: Arc::new(Mutex::new(LoggingLevel::Info)),
            bound: Arc::new(Mutex::new(None)),
            listen_from: Default::default(),
            tools: tools::ToolChoice::Full,
        }
    }

    /// Lists `choice` when a request does not choose.
    pub fn offering(mut self, choice: tools::ToolChoice) -> Self {
        self.tools = choice;
        self
    }
}

/// The tool set a request asks for: `?tools=` on the URL, else the `X-Crosstalk-Tools`
/// header; `None` when it does not choose.
fn requested_tools(context: &RequestContext<RoleServer>) -> Option<Result<tools::ToolChoice, String>> {
    let parts = context.extensions.get::<http::request::Parts>()?;
    tools::choice(
        parts.uri.query().unwrap_or(""),
        header(context, TOOLS_HEADER).as_deref(),
    )
}

/// The header that chooses the tool set (as `?tools=` does).
pub const TOOLS_HEADER: &str = "x-crosstalk-tools";

/// A request header, from the HTTP request rmcp hands the handler.
fn header(context: &RequestContext<RoleServer>, name: &str) -> Option<String> {
    let parts = context.extensions.get::<http::request::Parts>()?;
    let v = parts.headers.get(name)?.to_str().ok()?.trim();
    (!v.is_empty()).then(|| v.to_owned())
}

/// The crosstalk session token if the client sends one, else the MCP session, else (a
/// 2026-07-28 client, which has no session) [`STATELESS`]; as the request's principal's: what
/// an identity registered here is bound to. A stateless client's identity is thus bound to
/// its token, shared by that token's stateless clients, and usable from any node.
fn session(context: &RequestContext<RoleServer>) -> Option<String> {
    let name = header(context, crate::http::SESSION_HEADER)
        .or_else(|| header(context, "mcp-session-id"))
        .unwrap_or_else(|| STATELESS.to_owned());
    Some(principal(context).session(&name))
}

/// The session of a token's stateless (2026-07-28) MCP requests.
pub const STATELESS: &str = "mcp-stateless";

/// Who the request's token is: the auth middleware's verdict, carried through rmcp.
fn principal(context: &RequestContext<RoleServer>) -> Principal {
    principal_in(&context.extensions)
}

/// The auth middleware's verdict among a request's extensions (the transport's request hook
/// puts it there), `Anyone` without one.
pub(crate) fn principal_in(extensions: &rmcp::model::Extensions) -> Principal {
    rmcp_actix_web::transport::on_request_extensions(extensions)
        .and_then(|e| e.get::<Principal>())
        .cloned()
        .unwrap_or(Principal::Anyone)
}

/// The OAuth grant of the request's token, if it was one.
fn grant(context: &RequestContext<RoleServer>) -> Option<String> {
    rmcp_actix_web::transport::on_request_extensions(&context.extensions)
        .and_then(|e| e.get::<Credential>())
        .map(|c| c.grant.clone())
}

/// A task request's refusal as JSON-RPC: an unknown (or not the caller's) task and a finished
/// one are the client's mistake (`-32602`).
pub(crate) fn task_error(e: crate::ops::OpError) -> McpError {
    use crate::ops::ErrorKind;
    match e.kind {
        ErrorKind::NotFound | ErrorKind::Conflict | ErrorKind::Invalid => McpError::invalid_params(e.message, None),
        _ => McpError::internal_error(e.message, None),
    }
}

/// What the server tells every client at connection time.
const INSTRUCTIONS: &str = "crosstalk relays messages between agents on durable, ordered channels. \
Post with post_message, then block on wait_for_message(channel, since_id=<last id you saw>) for the \
reply; keep the largest id you have seen and pass it as since_id every time. Post type \"done\" when \
you are finished. The prompt crosstalk-protocol explains the conversation protocol in full.";

/// What `/cc/mcp` tells every client: cross-claude-mcp's protocol in brief.
const CC_INSTRUCTIONS: &str = "A message bus between AI instances (cross-claude-mcp's tools, served by \
crosstalk). register first, list_channels and pick the most specific channel, send_message, then \
wait_for_reply(channel, after_id=<the id you sent>) or check_messages. Send message_type \"done\" when you \
are finished. The prompt cross-claude-protocol explains it in full.";

/// What a face says of itself when a client connects: its capabilities, name and instructions.
pub fn info(face: Face) -> ServerInfo {
    ServerInfo::new(
        ServerCapabilities::builder()
            .enable_logging()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tools()
            .enable_tasks()
            .build(),
    )
    .with_server_info(Implementation::new("crosstalk", env!("CARGO_PKG_VERSION")).with_title("crosstalk relay"))
    .with_instructions(match face {
        Face::Crosstalk => INSTRUCTIONS,
        Face::CrossClaude => CC_INSTRUCTIONS,
    })
}

/// What a face offers every client, whoever it is: the tools `tools/list` gives under
/// `choice`, the prompts and the resource templates (the resources themselves are the
/// caller's channels).
pub fn offered(
    face: Face,
    choice: tools::ToolChoice,
    settings: tools::Settings,
) -> (Vec<Tool>, Vec<Prompt>, Vec<ResourceTemplate>) {
    (
        tools::offered(face, choice, settings),
        vec![prompt::prompt(face)],
        vec![resources::template()],
    )
}

impl ServerHandler for CrosstalkMcp {
    fn get_info(&self) -> ServerInfo {
        info(self.face)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let choice = match requested_tools(&context) {
            None => self.tools,
            Some(Ok(choice)) => choice,
            Some(Err(e)) => return Err(McpError::invalid_params(e, None)),
        };
        Ok(ListToolsResult::with_all_items(tools::offered(
            self.face,
            choice,
            self.settings(),
        )))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools::get(self.face, name, self.settings())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let cx = tools::Cx {
            session: session(&context),
            principal: principal(&context),
            bound: self.bound.clone(),
            ctx: self.ctx.clone(),
            wait_cap: self.wait_cap,
            cancel: context.ct.clone(),
            peer: Some(context.peer.clone()),
            progress: context.meta.get_progress_token(),
            log_level: self.log_level.clone(),
            face: self.face,
        };
        // A task if the client asked for one: 2025-11-25 with `params.task`, 2026-07-28 by
        // declaring the tasks extension (then every blocking call is one).
        let v1 = request.task.is_some();
        let v2 = context.client_capabilities().is_some_and(|c| c.supports_tasks());
        if v1 || v2 {
            if tasks::runs_as_task(self.face, &request.name) {
                let keep = request
                    .task
                    .as_ref()
                    .and_then(|t| t.get("ttl"))
                    .and_then(|t| t.as_u64());
                let args = request.arguments.unwrap_or_default();
                let peer = v1.then(|| context.peer.clone());
                let made = self
                    .tasks
                    .create(&cx, &request.name, args, keep, peer, grant(&context))
                    .await;
                return Ok(match made {
                    Ok(task) => CallToolResponse::Task(CreateTaskResult::new(tasks::v2::task(&task))),
                    Err(refused) => CallToolResponse::from(refused),
                });
            }
            if v1 {
                // Its `execution.taskSupport` says so: only the blocking calls run as tasks.
                return Err(McpError::new(
                    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                    format!("{} does not run as a task; call it without `task`", request.name),
                    None,
                ));
            }
        }
        tools::call(self.face, cx, &request.name, request.arguments.unwrap_or_default())
            .await
            .map(CallToolResponse::from)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let task = self
            .tasks
            .get(&principal(&context), &request.task_id)
            .await
            .map_err(task_error)?;
        Ok(GetTaskResult::new(tasks::v2::detailed(&task)))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.tasks
            .cancel(&principal(&context), &request.task_id)
            .await
            .map(drop)
            .map_err(task_error)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // Ours never ask for input; the task must still be the caller's to be told so.
        self.tasks
            .get(&principal(&context), &request.task_id)
            .await
            .map_err(task_error)?;
        Err(McpError::invalid_params(
            format!("task {} asks for no input", request.task_id),
            None,
        ))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        resources::list(&self.ctx, self.caller(&context), self.face.label()).await
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![resources::template()]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        resources::read(&self.ctx, self.caller(&context), self.face.label(), &request.uri)
            .await
            .map(Into::into)
    }

    #[allow(deprecated)] // the 2025-11-25 way; 2026-07-28 clients use `listen` below
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let opener = principal(&context).opener();
        let subscribed = self.subscriptions.subscribe(&self.ctx.relay, request.uri, context.peer);
        crosstalk_actors::Relay::opening_as(opener, subscribed).await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.subscriptions.unsubscribe(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let mut accepted = resources::accepted_filter(requested);
        if let Some(ids) = &requested.task_ids {
            accepted.task_ids = Some(ids.iter().take(tasks::MAX_LISTENED).cloned().collect());
        }
        // rmcp acknowledges the listen before it calls `listen`: what is committed now is what
        // the client has been told it will hear about from, so a post in between is not missed.
        *self.listen_from.lock() = resources::watermarks(&self.ctx.relay, &accepted);
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let from = std::mem::take(&mut *self.listen_from.lock());
        let ids = context.accepted().task_ids.clone().unwrap_or_default();
        let stop = self.ctx.relay.shutdown_token().child_token();
        let watching = tokio::spawn({
            let (tasks, sink, stop) = (self.tasks.clone(), context.sink().clone(), stop.clone());
            let who = principal(context.request_context());
            async move { tasks.watch(who, ids, sink, stop).await }
        });
        let opener = principal(context.request_context()).opener();
        let listened =
            crosstalk_actors::Relay::opening_as(opener, resources::listen(&self.ctx.relay, context, from)).await;
        stop.cancel();
        let _ = watching.await;
        listened
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(vec![prompt::prompt(self.face)]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        prompt::get(self.face, &request.name, request.arguments.as_ref()).map(Into::into)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.log_level.lock() = request.level;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_origin_lists_always_hold_loopback() {
        let hosts = allowed_hosts(&[]);
        assert_eq!(hosts, vec!["localhost", "127.0.0.1", "::1"]);
        let hosts = allowed_hosts(&["relay.example.com".into(), "localhost".into()]);
        assert_eq!(hosts.len(), 4);
        let origins = allowed_origins(&hosts);
        assert!(origins.contains(&"http://[::1]:*".to_string()));
        assert!(origins.contains(&"https://relay.example.com:*".to_string()));
        let with_port = allowed_origins(&["relay.example.com:8765".into()]);
        assert_eq!(
            with_port,
            vec!["http://relay.example.com:8765", "https://relay.example.com:8765"]
        );
    }
}
