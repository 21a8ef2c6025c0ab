//! The two MCP ends of the bridge: a client session to the relay (streamable HTTP) and a
//! server on stdio that offers the relay's tools, prompts and resources as they are, plus the
//! live-push tools, and forwards the relay's notifications to the host.

use super::live::Live;
use super::watch::Watched;
use super::ToolSet;
use crate::client::{tls, Failure};
use parking_lot::Mutex;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    GetPromptRequestParams, GetPromptResponse, Implementation, InitializeResult, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ResourceUpdatedNotificationParam, SubscribeRequestParams, Tool,
    UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ErrorData as McpError, Peer, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// The relay's side: forwards what the relay notifies to the host, once there is one.
#[derive(Clone)]
pub struct Upstream {
    host: watch::Receiver<Option<Peer<RoleServer>>>,
}

impl Upstream {
    fn host(&self) -> Option<Peer<RoleServer>> {
        self.host.borrow().clone()
    }
}

impl ClientHandler for Upstream {
    async fn on_resource_updated(&self, params: ResourceUpdatedNotificationParam, _: NotificationContext<RoleClient>) {
        if let Some(h) = self.host() {
            let _ = h.notify_resource_updated(params).await;
        }
    }

    #[allow(deprecated)] // logging is how 2025-11-25 hosts see the relay's progress lines
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        if let Some(h) = self.host() {
            let _ = h.notify_logging_message(params).await;
        }
    }

    fn get_info(&self) -> ClientConfig {
        let mut c = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("crosstalk-mcp-bridge", env!("CARGO_PKG_VERSION")),
        );
        // A stateful session: the identity the agent registers is bound to it, and closing
        // it signs the identity off.
        c.protocol_version = ProtocolVersion::V_2025_11_25;
        c
    }
}

pub struct Connected {
    service: RunningService<RoleClient, Upstream>,
    host: watch::Sender<Option<Peer<RoleServer>>>,
    /// `initialize` requests sent so far: more than one means the session was re-created.
    inits: Arc<AtomicU64>,
}

/// Opens the session to the relay's `/mcp` (or `/cc/mcp`).
pub async fn connect(url: &str, tools: ToolSet, token: Option<&str>) -> Result<Connected, Failure> {
    tls();
    let endpoint = format!("{}{}", url.trim_end_matches('/'), tools.path());
    let mut config = StreamableHttpClientTransportConfig::with_uri(endpoint.clone());
    if let Some(t) = token {
        config = config.auth_header(t);
    }
    let http = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()?;
    let (http, inits) = Watched::new(http);
    let transport = StreamableHttpClientTransport::with_client(http, config);
    let (host, rx) = watch::channel(None);
    let service = Upstream { host: rx }
        .serve(transport)
        .await
        .map_err(|e| Failure(format!("cannot open an MCP session at {endpoint}: {e}"), 2))?;
    Ok(Connected { service, host, inits })
}

/// The host's side.
struct Bridge {
    relay: Peer<RoleClient>,
    info: InitializeResult,
    live: Arc<Live>,
    host: watch::Sender<Option<Peer<RoleServer>>>,
    inits: Arc<AtomicU64>,
    /// The session the identity was last claimed for (by `inits` count).
    claimed_in: AtomicU64,
    /// The agent's last successful `register`, to claim the identity again in a new session.
    registered: Mutex<Option<CallToolRequestParams>>,
}

impl Bridge {
    /// After the relay lost the session (a restart) and rmcp opened a new one, the identity
    /// the agent registered is bound to nothing: register it again for the new session, so it
    /// stays protected and closing the bridge still signs it off.
    async fn reclaim(&self) {
        let now = self.inits.load(Ordering::SeqCst);
        if self.claimed_in.swap(now, Ordering::SeqCst) == now {
            return;
        }
        let Some(register) = self.registered.lock().clone() else {
            return;
        };
        match self.relay.call_tool(register).await {
            Ok(r) if r.is_error != Some(true) => tracing::info!("registered again in the relay's new session"),
            Ok(r) => tracing::warn!(answer = ?r.content, "registering again in the relay's new session was refused"),
            Err(e) => tracing::warn!(error = %e, "registering again in the relay's new session failed"),
        }
    }
}

fn failed(e: ServiceError) -> McpError {
    match e {
        ServiceError::McpError(e) => e,
        other => McpError::internal_error(format!("the relay did not answer: {other}"), None),
    }
}

fn schema(v: Value) -> Arc<serde_json::Map<String, Value>> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

/// The tools only the bridge has.
fn own_tools() -> Vec<Tool> {
    let channel = json!({"type": "object", "properties": {"channel": {"type": "string", "description": "The channel."}}, "required": ["channel"]});
    vec![
        Tool::new(
            "listen_live",
            "Push every new message on a channel (but your own) into this session as it arrives, \
             instead of polling. Stays on until stop_listening.",
            schema(channel.clone()),
        ),
        Tool::new("stop_listening", "Stop pushing a channel's messages.", schema(channel)),
        Tool::new(
            "delivery_status",
            "Which channels are pushed live, which are poll-only, and whether each stream is connected now.",
            schema(json!({"type": "object", "properties": {}})),
        ),
    ]
}

fn answer(v: Value, is_error: bool) -> CallToolResponse {
    let text = vec![ContentBlock::text(v.to_string())];
    let mut r = if is_error {
        CallToolResult::error(text)
    } else {
        CallToolResult::success(text)
    };
    if v.is_object() {
        r.structured_content = Some(v);
    }
    CallToolResponse::from(r)
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> InitializeResult {
        let mut info = self.info.clone();
        let experimental = info.capabilities.experimental.get_or_insert_with(Default::default);
        experimental.insert("claude/channel".into(), Default::default());
        info
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.host.send_replace(Some(context.peer.clone()));
        self.live.attach(context.peer);
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut list = self.relay.list_tools(request).await.map_err(failed)?;
        if list.next_cursor.is_none() {
            list.tools.extend(own_tools());
        }
        Ok(list)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.clone().unwrap_or_default();
        let channel = args.get("channel").and_then(Value::as_str).map(str::to_owned);
        match (request.name.as_ref(), channel) {
            ("listen_live", Some(ch)) => Ok(match self.live.listen(&ch).await {
                Ok(v) => answer(v, false),
                Err(why) => answer(json!({"error": why}), true),
            }),
            ("stop_listening", Some(ch)) => Ok(answer(self.live.stop(&ch), false)),
            ("listen_live" | "stop_listening", None) => Ok(answer(json!({"error": "channel is required"}), true)),
            ("delivery_status", _) => Ok(answer(self.live.status(), false)),
            (name, channel) => {
                let name = name.to_owned();
                if let Some(ch) = channel {
                    self.live.used(&ch);
                }
                if name != "register" {
                    self.reclaim().await;
                }
                let register = (name == "register").then(|| request.clone());
                let result = self.relay.call_tool(request).await.map_err(failed)?;
                if let (Some(request), false) = (register, result.is_error == Some(true)) {
                    if let Some(who) = args.get("instance_id").and_then(Value::as_str) {
                        self.live.set_identity(who);
                    }
                    self.claimed_in
                        .store(self.inits.load(Ordering::SeqCst), Ordering::SeqCst);
                    *self.registered.lock() = Some(request);
                }
                Ok(CallToolResponse::from(result))
            }
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        self.relay.list_prompts(request).await.map_err(failed)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        self.relay.get_prompt(request).await.map(Into::into).map_err(failed)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.relay.list_resources(request).await.map_err(failed)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        self.relay.list_resource_templates(request).await.map_err(failed)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.relay.read_resource(request).await.map(Into::into).map_err(failed)
    }

    #[allow(deprecated)] // 2025-11-25 hosts subscribe; the relay pushes, we forward
    async fn subscribe(&self, request: SubscribeRequestParams, _: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.relay.subscribe(request).await.map(|_| ()).map_err(failed)
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.relay.unsubscribe(request).await.map(|_| ()).map_err(failed)
    }
}

/// Serves the host on stdio until it closes stdin or a signal comes, then closes the relay
/// session (which signs this session's identities off at once).
pub async fn serve(upstream: Connected, live: Arc<Live>) -> Result<(), Failure> {
    let Connected { service, host, inits } = upstream;
    let peer = service
        .peer_info()
        .ok_or_else(|| Failure("the relay did not initialize the MCP session".into(), 2))?;
    // The host sees the relay's own capabilities, name and instructions.
    let mut info = InitializeResult::new(peer.capabilities.clone()).with_server_info(
        peer.server_info
            .clone()
            .unwrap_or_else(|| Implementation::new("crosstalk", env!("CARGO_PKG_VERSION"))),
    );
    info.instructions = peer.instructions.clone();
    let bridge = Bridge {
        relay: service.peer().clone(),
        info,
        live,
        host,
        claimed_in: AtomicU64::new(inits.load(Ordering::SeqCst)),
        inits,
        registered: Mutex::new(None),
    };
    let server = bridge
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Failure(format!("the host did not initialize: {e}"), 2))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = server.cancellation_token();
    tokio::select! {
        r = server.waiting() => { r.map_err(|e| Failure(e.to_string(), 2))?; }
        _ = term.recv() => stop.cancel(),
        _ = tokio::signal::ctrl_c() => stop.cancel(),
    }
    // Closing the client deletes the relay session: the identity goes offline now.
    let _ = service.cancel().await;
    Ok(())
}
