//! The two MCP ends of the bridge: a client session to the relay (streamable HTTP) and a
//! server on stdio that offers the relay's tools, prompts and resources as they are, plus the
//! live-push tools, and forwards the relay's notifications to the host.
//!
//! The host's lists never wait for the relay: until a session is open the host is offered the
//! [`Catalog`] of this binary's relay, and once one is, the relay's own lists, fetched when it
//! opens. A host hears `list_changed` only when what it was offered differs from what the
//! relay gives. A 2025-11-25 host hears it on its session; a 2026-07-28 host, which has none,
//! on the `subscriptions/listen` streams it opens, which carry its resource updates too.

use super::live::Live;
use super::watch::Watched;
use super::{Catalog, Target, ToolSet};
use crate::client::{tls, Failure, RelayClient};
use parking_lot::Mutex;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    CustomNotification, GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation, InitializeResult,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResourceUpdatedNotificationParam, ResultType, SubscribeRequestParams, SubscriptionFilter, Tool, ToolAnnotations,
    UnsubscribeRequestParams,
};
use rmcp::service::{
    NotificationContext, RequestContext, RunningService, ServiceError, SubscriptionContext, SubscriptionSink,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ErrorData as McpError, Peer, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Where the host hears what changed: a 2025-11-25 host on its session, once it has
/// initialized; a 2026-07-28 host, which has no session, on each `subscriptions/listen` it
/// holds open (each stream carries only what it was accepted for).
#[derive(Default)]
struct Hosts {
    session: Mutex<Option<Peer<RoleServer>>>,
    listens: Mutex<Vec<SubscriptionSink>>,
}

/// A list the host may be told has changed.
#[derive(Debug, Clone, Copy)]
enum Changed {
    Tools,
    Prompts,
    Resources,
}

impl Hosts {
    fn session(&self) -> Option<Peer<RoleServer>> {
        self.session.lock().clone()
    }

    fn listens(&self) -> Vec<SubscriptionSink> {
        self.listens.lock().clone()
    }

    async fn changed(&self, what: Changed) {
        tracing::debug!(?what, "the host's list changed");
        if let Some(h) = self.session() {
            let _ = match what {
                Changed::Tools => h.notify_tool_list_changed().await,
                Changed::Prompts => h.notify_prompt_list_changed().await,
                Changed::Resources => h.notify_resource_list_changed().await,
            };
        }
        // A stream not accepted for this kind refuses it by itself.
        for sink in self.listens() {
            let _ = match what {
                Changed::Tools => sink.notify_tool_list_changed().await,
                Changed::Prompts => sink.notify_prompt_list_changed().await,
                Changed::Resources => sink.notify_resource_list_changed().await,
            };
        }
    }

    async fn updated(&self, params: ResourceUpdatedNotificationParam) {
        for sink in self.listens() {
            let _ = sink.notify_resource_updated(params.uri.clone()).await;
        }
        if let Some(h) = self.session() {
            let _ = h.notify_resource_updated(params).await;
        }
    }
}

/// The relay's side: forwards what the relay notifies to the host.
#[derive(Clone)]
pub struct Upstream {
    hosts: Arc<Hosts>,
}

impl ClientHandler for Upstream {
    async fn on_resource_updated(&self, params: ResourceUpdatedNotificationParam, _: NotificationContext<RoleClient>) {
        self.hosts.updated(params).await;
    }

    #[allow(deprecated)] // logging is how 2025-11-25 hosts see the relay's progress lines
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        if let Some(h) = self.hosts.session() {
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

/// The relay session as the bridge sees it now.
#[derive(Clone)]
enum State {
    /// Not connected, yet or again: why the last attempt failed, once one has.
    Down(Option<String>),
    Up(Box<Session>),
}

/// One open session to the relay.
#[derive(Clone)]
struct Session {
    peer: Peer<RoleClient>,
    /// Counts the sessions opened so far, this one included.
    generation: u64,
    /// `initialize` requests sent in it: more than one means rmcp re-created the relay's
    /// session (a relay restart).
    inits: Arc<AtomicU64>,
}

impl Session {
    /// Which relay session this is: a new connection, or a re-created session in one.
    fn epoch(&self) -> (u64, u64) {
        (self.generation, self.inits.load(Ordering::SeqCst))
    }
}

/// Keeps a session to the relay open from the background: opens it, opens it again when it
/// ends, and says meanwhile why there is none. The host is served whatever its state.
pub struct Link {
    endpoint: String,
    url: String,
    state: watch::Receiver<State>,
    /// What the host is offered now: this binary's catalog until a relay session gives the
    /// relay's own.
    offered: Mutex<Catalog>,
    /// The host was answered `resources/list` without the relay (an empty list): once a session
    /// is open, it is told the list changed.
    resources_guessed: AtomicBool,
    /// Resources the host subscribed to (by `resources/subscribe` or in a
    /// `subscriptions/listen`), each with how many subscriptions hold it: every new relay
    /// session subscribes them again.
    subscribed: Mutex<BTreeMap<String, usize>>,
    /// Resources the host's own session subscribed to with `resources/subscribe`: one holder
    /// however often it asks, so one `resources/unsubscribe` ends it.
    host_subscribed: Mutex<BTreeSet<String>>,
    /// Where relay notifications and list changes go.
    hosts: Arc<Hosts>,
    /// Ends the background task (closing the session first).
    stop: tokio_util::sync::CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// How long a call, a prompt or a read waits for a session before it answers why there is
/// none.
const FIRST_ATTEMPT: Duration = Duration::from_secs(3);
/// How long the host's `initialize` waits for the first attempt, so that a relay that answers
/// at once (a local one) gives the host its own name and instructions rather than the
/// catalog's. Hosts give a server about two seconds to list its tools.
const HOST_WAIT: Duration = Duration::from_millis(500);
/// How long a signal leaves the relay session to close (a `DELETE`, which signs the session's
/// identities off at once; a few milliseconds to a relay nearby). Hosts escalate SIGINT to
/// SIGTERM after 100 ms, and then to SIGKILL.
const SIGNAL_GRACE: Duration = Duration::from_millis(80);
/// How long a host that closed stdin leaves the relay session to close: it waits for the
/// process, and a relay far away may take a round trip or two.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Most resource URIs one `subscriptions/listen` may name.
const MAX_LISTENED: usize = 100;
/// Back-off between attempts.
const RETRY_MIN: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);

impl Link {
    /// Starts keeping a session to `target` open; pushes the `listen` channels once the first
    /// session is there.
    pub fn start(
        target: Target,
        tools: ToolSet,
        catalog: Catalog,
        rest: Arc<RelayClient>,
        live: Arc<Live>,
        listen: Vec<String>,
    ) -> Arc<Link> {
        let endpoint = format!("{}{}", target.url.trim_end_matches('/'), tools.path());
        let (state_tx, state) = watch::channel(State::Down(None));
        let link = Arc::new(Link {
            endpoint,
            url: target.url.clone(),
            state,
            offered: Mutex::new(catalog),
            resources_guessed: AtomicBool::new(false),
            subscribed: Mutex::new(BTreeMap::new()),
            host_subscribed: Mutex::new(BTreeSet::new()),
            hosts: Arc::default(),
            stop: tokio_util::sync::CancellationToken::new(),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(link.clone().maintain(target, rest, live, listen, state_tx));
        *link.task.lock() = Some(task);
        link
    }

    async fn maintain(
        self: Arc<Self>,
        target: Target,
        rest: Arc<RelayClient>,
        live: Arc<Live>,
        mut listen: Vec<String>,
        state: watch::Sender<State>,
    ) {
        let mut backoff = RETRY_MIN;
        let mut generation = 0;
        loop {
            let opened = match &target.local {
                Some((addr, data)) => super::local::ensure(addr, data).await.map(|_| ()),
                None => Ok(()),
            };
            let opened = match opened {
                Ok(()) => self.open(target.token.as_deref()).await,
                Err(f) => Err(format!("{} (this bridge keeps trying)", f.0)),
            };
            match opened {
                Ok((mut service, inits)) => {
                    backoff = RETRY_MIN;
                    generation += 1;
                    let Some(peer_info) = service.peer_info() else {
                        state.send_replace(State::Down(Some("the relay did not initialize the MCP session".into())));
                        let _ = service.close_with_timeout(Duration::from_secs(1)).await;
                        tokio::time::sleep(RETRY_MAX).await;
                        continue;
                    };
                    let mut info = InitializeResult::new(peer_info.capabilities.clone()).with_server_info(
                        peer_info
                            .server_info
                            .clone()
                            .unwrap_or_else(|| Implementation::new("crosstalk", env!("CARGO_PKG_VERSION"))),
                    );
                    info.instructions = peer_info.instructions.clone();
                    let peer = service.peer().clone();
                    // The relay's lists first, then the session is up, and only then is the host
                    // told what changed and are its subscriptions taken again: a host that lists
                    // again at the notice, or subscribes meanwhile, finds the session there.
                    let changed = self.adopt(&peer, info).await;
                    state.send_replace(State::Up(Box::new(Session {
                        peer: peer.clone(),
                        generation,
                        inits,
                    })));
                    self.subscribe_again(&peer).await;
                    for what in changed {
                        self.hosts.changed(what).await;
                    }
                    tracing::info!(endpoint = %self.endpoint, "connected to the relay");
                    for channel in std::mem::take(&mut listen) {
                        if let Err(why) = live.listen(&channel).await {
                            tracing::warn!(%channel, %why, "cannot push the channel");
                        }
                    }
                    // Until the session ends by itself, or the bridge stops.
                    let cancel = service.cancellation_token();
                    let ended = service.waiting();
                    tokio::pin!(ended);
                    tokio::select! {
                        _ = &mut ended => {}
                        _ = self.stop.cancelled() => {
                            // Closing the client deletes the relay session: the identity goes
                            // offline now.
                            cancel.cancel();
                            let _ = tokio::time::timeout(Duration::from_secs(2), ended).await;
                            return;
                        }
                    }
                    state.send_replace(State::Down(Some(format!(
                        "the MCP session to {} ended (this bridge is opening a new one)",
                        self.endpoint
                    ))));
                }
                Err(why) => {
                    let (why, refused) = match &target.local {
                        Some(_) => (why, false),
                        None => diagnose(&rest, &self.url, why).await,
                    };
                    // A refused token is not mended by trying again soon (and the relay limits
                    // failed authentications): try at the slowest pace.
                    if refused {
                        backoff = RETRY_MAX;
                    }
                    // Said once per reason, not once per attempt.
                    let again = matches!(&*state.borrow(), State::Down(Some(last)) if *last == why);
                    if again {
                        tracing::debug!("{why}");
                    } else {
                        tracing::warn!("{why}");
                    }
                    state.send_replace(State::Down(Some(why)));
                    tokio::select! {
                        _ = self.stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Opens a session to the relay's `/mcp` (or `/cc/mcp`).
    async fn open(
        &self,
        token: Option<&str>,
    ) -> Result<(RunningService<RoleClient, Upstream>, Arc<AtomicU64>), String> {
        tls();
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.endpoint.clone());
        if let Some(t) = token {
            config = config.auth_header(t);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| e.to_string())?;
        let (http, inits) = Watched::new(http);
        let transport = StreamableHttpClientTransport::with_client(http, config);
        let upstream = Upstream {
            hosts: self.hosts.clone(),
        };
        let service = upstream
            .serve(transport)
            .await
            .map_err(|e| format!("cannot open an MCP session at {}: {e}", self.endpoint))?;
        Ok((service, inits))
    }

    /// A new relay session: the relay's description and lists replace what the host was
    /// offered (a list the relay would not give is kept); answers each list that differs from
    /// what the host was offered, to tell it of once the session is up.
    async fn adopt(&self, peer: &Peer<RoleClient>, info: InitializeResult) -> Vec<Changed> {
        let mut fresh = self.offered.lock().clone();
        fresh.info = info;
        let kept = |what: &str, e: ServiceError| tracing::debug!(error = %e, "the relay did not list its {what}");
        match peer.list_all_tools().await {
            Ok(tools) => fresh.tools = tools,
            Err(e) => kept("tools", e),
        }
        match peer.list_all_prompts().await {
            Ok(prompts) => fresh.prompts = prompts,
            Err(e) => kept("prompts", e),
        }
        match peer.list_all_resource_templates().await {
            Ok(templates) => fresh.templates = templates,
            Err(e) => kept("resource templates", e),
        }
        let was = std::mem::replace(&mut *self.offered.lock(), fresh.clone());
        let mut changed = Vec::new();
        if was.tools != fresh.tools {
            changed.push(Changed::Tools);
        }
        if was.prompts != fresh.prompts {
            changed.push(Changed::Prompts);
        }
        if self.resources_guessed.swap(false, Ordering::SeqCst) || was.templates != fresh.templates {
            changed.push(Changed::Resources);
        }
        changed
    }

    /// What the host is offered now.
    fn offered(&self) -> Catalog {
        self.offered.lock().clone()
    }

    /// The host subscribes to `uri`: the relay is asked to notify its changes, unless another
    /// subscription of the host's already holds it. With no session open, the next one
    /// subscribes it.
    #[allow(deprecated)] // the relay session is 2025-11-25's, where resources/subscribe is how
    async fn subscribe(&self, uri: &str) -> Result<(), McpError> {
        let first = {
            let mut subscribed = self.subscribed.lock();
            let held = subscribed.entry(uri.to_owned()).or_insert(0);
            *held += 1;
            *held == 1
        };
        let State::Up(session) = self.now() else { return Ok(()) };
        if !first {
            return Ok(());
        }
        let asked = session.peer.subscribe(SubscribeRequestParams::new(uri)).await;
        if let Err(e) = asked {
            self.unsubscribe_here(uri);
            return Err(match e {
                ServiceError::McpError(e) => e,
                other => McpError::internal_error(format!("the relay did not take the subscription: {other}"), None),
            });
        }
        Ok(())
    }

    /// One subscription of the host's to `uri` ends: the last one ends the relay's.
    #[allow(deprecated)] // the relay session is 2025-11-25's, where resources/subscribe is how
    async fn unsubscribe(&self, uri: &str) {
        if !self.unsubscribe_here(uri) {
            return;
        }
        if let State::Up(session) = self.now() {
            let _ = session.peer.unsubscribe(UnsubscribeRequestParams::new(uri)).await;
        }
    }

    /// Counts one subscription to `uri` off; whether it was the last.
    fn unsubscribe_here(&self, uri: &str) -> bool {
        let mut subscribed = self.subscribed.lock();
        match subscribed.get_mut(uri) {
            Some(held) if *held > 1 => {
                *held -= 1;
                false
            }
            Some(_) => {
                subscribed.remove(uri);
                true
            }
            None => false,
        }
    }

    /// The host's session subscribes to `uri` (2025-11-25's `resources/subscribe`); again is
    /// the same subscription.
    async fn host_subscribe(&self, uri: &str) -> Result<(), McpError> {
        if !self.host_subscribed.lock().insert(uri.to_owned()) {
            return Ok(());
        }
        let subscribed = self.subscribe(uri).await;
        if subscribed.is_err() {
            self.host_subscribed.lock().remove(uri);
        }
        subscribed
    }

    /// The host's session unsubscribes from `uri`, if it had subscribed.
    async fn host_unsubscribe(&self, uri: &str) {
        if self.host_subscribed.lock().remove(uri) {
            self.unsubscribe(uri).await;
        }
    }

    /// A new relay session knows none of the host's subscriptions: ask for each again.
    #[allow(deprecated)] // the relay session is 2025-11-25's, where resources/subscribe is how
    async fn subscribe_again(&self, peer: &Peer<RoleClient>) {
        let uris: Vec<String> = self.subscribed.lock().keys().cloned().collect();
        for uri in uris {
            if let Err(e) = peer.subscribe(SubscribeRequestParams::new(uri.clone())).await {
                tracing::warn!(%uri, error = %e, "the relay's new session did not take a subscription");
            }
        }
    }

    fn now(&self) -> State {
        self.state.borrow().clone()
    }

    /// The open session, waiting at most `within` for one; else why there is none.
    async fn session(&self, within: Duration) -> Result<Session, String> {
        let mut state = self.state.clone();
        let up = tokio::time::timeout(within, state.wait_for(|s| matches!(s, State::Up(_)))).await;
        match up.ok().and_then(Result::ok).map(|s| s.clone()) {
            Some(State::Up(s)) => Ok(*s),
            _ => Err(self.why_down()),
        }
    }

    /// Why there is no session, with what to do about it.
    fn why_down(&self) -> String {
        match self.now() {
            State::Up(_) => "the relay session is open".into(),
            State::Down(Some(why)) => why,
            State::Down(None) => format!(
                "still connecting to the relay at {} (this bridge keeps trying)",
                self.url
            ),
        }
    }

    /// The first attempt's outcome, or `within`, whichever comes first.
    async fn first_attempt(&self, within: Duration) {
        let mut state = self.state.clone();
        let _ = tokio::time::timeout(within, state.wait_for(|s| !matches!(s, State::Down(None)))).await;
    }

    /// Closes the relay session (signing its identities off) and ends the background task,
    /// giving up on them after `within`.
    async fn close(&self, within: Duration) {
        self.stop.cancel();
        let task = self.task.lock().take();
        if let Some(t) = task {
            if tokio::time::timeout(within, t).await.is_err() {
                tracing::warn!(
                    "the relay session did not close within {within:?}: its identities go offline when the \
                     relay's presence expires"
                );
            }
        }
    }
}

fn wrong_token(url: &str) -> String {
    format!(
        "the relay at {url} refused the token (401 Unauthorized). Set --token (CROSSTALK_TOKEN) in this MCP \
         server's configuration to the relay's --token or your participant token, then restart the MCP server"
    )
}

/// Why the relay could not be used, in words that say what to do: it does not answer, or it
/// refused the token, or (the REST face answering) the MCP session failed for `mcp_error`;
/// and whether it refused the token.
async fn diagnose(rest: &RelayClient, url: &str, mcp_error: String) -> (String, bool) {
    let probe = match rest.request(crate::api::LIST_CHANNELS, &Default::default()) {
        Ok(probe) => probe,
        Err(f) => return (f.0, false),
    };
    let refused = |why: String| (why, true);
    match rest.auth(probe).send().await {
        Err(e) => (
            format!(
                "the relay at {url} is not reachable ({}). Start it with `crosstalk serve`, or point --relay \
             (CROSSTALK_URL) at the right address; this bridge keeps trying and connects by itself once it answers",
                crate::client::root(&e)
            ),
            false,
        ),
        Ok(r) if r.status() == reqwest::StatusCode::UNAUTHORIZED => refused(wrong_token(url)),
        // Failed authentications beyond the relay's --auth-failure-rate: still a wrong token.
        Ok(r) if r.status() == reqwest::StatusCode::TOO_MANY_REQUESTS => {
            let body: Value = r.json().await.unwrap_or_default();
            if body["code"] == crate::guard::AUTH_RATE_LIMITED {
                refused(wrong_token(url))
            } else {
                (mcp_error, false)
            }
        }
        Ok(r) if r.status() == reqwest::StatusCode::FORBIDDEN => refused(format!(
            "the relay at {url} refused this token access (403 Forbidden): ask its operator for a token that may \
             use it"
        )),
        Ok(_) => (mcp_error, false),
    }
}

/// The host's side.
struct Bridge {
    link: Arc<Link>,
    live: Arc<Live>,
    /// The relay session the identity was last claimed in.
    claimed_in: Mutex<Option<(u64, u64)>>,
    /// The agent's successful `register`s, one per name (on the cross-claude face a session
    /// may hold several), the latest last: to claim them again in a new session.
    registered: Mutex<Vec<CallToolRequestParams>>,
}

impl Bridge {
    /// After the relay lost the session (a restart) and rmcp opened a new one, or the bridge
    /// opened a new connection, the identity the agent registered is bound to nothing:
    /// register it again for the new session, so it stays protected and closing the bridge
    /// still signs it off.
    async fn reclaim(&self, session: &Session) {
        let now = session.epoch();
        if self.claimed_in.lock().replace(now) == Some(now) {
            return;
        }
        let registered = self.registered.lock().clone();
        for register in registered {
            match session.peer.call_tool(register).await {
                Ok(r) if r.is_error != Some(true) => tracing::info!("registered again in the relay's new session"),
                Ok(r) => {
                    tracing::warn!(answer = ?r.content, "registering again in the relay's new session was refused")
                }
                Err(e) => tracing::warn!(error = %e, "registering again in the relay's new session failed"),
            }
        }
    }

    /// A request the relay must answer failed: say why, with what to do.
    fn failed(&self, e: ServiceError) -> McpError {
        match e {
            ServiceError::McpError(e) => e,
            other => {
                tracing::debug!(error = %other, "a request to the relay failed");
                McpError::internal_error(self.unavailable(), None)
            }
        }
    }

    /// Forwards a request to the relay's session (waiting up to [`FIRST_ATTEMPT`] for one).
    async fn forward<T, F: std::future::Future<Output = Result<T, ServiceError>>>(
        &self,
        call: impl FnOnce(Peer<RoleClient>) -> F,
    ) -> Result<T, McpError> {
        let session = self
            .link
            .session(FIRST_ATTEMPT)
            .await
            .map_err(|why| McpError::internal_error(why, None))?;
        call(session.peer).await.map_err(|e| self.failed(e))
    }

    /// Why the relay cannot answer now.
    fn unavailable(&self) -> String {
        match self.link.now() {
            State::Up(_) => format!(
                "the relay at {} did not answer (it may be restarting); this bridge keeps trying and \
                 reconnects by itself",
                self.link.url
            ),
            State::Down(_) => self.link.why_down(),
        }
    }
}

/// The tool Claude Code's `--permission-prompt-tool` names (`mcp__crosstalk__permission_prompt`).
pub const PERMISSION_TOOL: &str = "permission_prompt";

fn schema(v: Value) -> Arc<serde_json::Map<String, Value>> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

/// The tools only the bridge has. Each acts on this session's delivery only, never beyond the
/// relay, and says so, so that a host with an approval policy (Codex runs only tools that say
/// they reach nothing outside) runs them without asking a person; `permission_prompt` asks the
/// relay's humans.
fn own_tools() -> Vec<Tool> {
    let mut tools = session_tools();
    // Only in a turn `crosstalk wake` runs (it sets CROSSTALK_CHANNELS): every byte of the
    // list is in every turn's context, and only a headless turn needs it.
    if std::env::var_os("CROSSTALK_CHANNELS").is_some() {
        tools.push(permission_tool());
    }
    tools
}

/// `permission_prompt`, for Claude Code's `--permission-prompt-tool`.
fn permission_tool() -> Tool {
    Tool::new(
        PERMISSION_TOOL,
        "For claude --permission-prompt-tool mcp__crosstalk__permission_prompt: asks the humans on the \
             relay whether a tool may run, waits for their allow or deny, and answers in Claude Code's shape.",
        schema(json!({"type": "object", "properties": {
                "tool_name": {"type": "string"},
                "input": {"type": "object"},
                "tool_use_id": {"type": "string"}
            }, "required": ["tool_name", "input"]})),
    )
    .with_annotations(
        ToolAnnotations::new()
            .read_only(false)
            .destructive(false)
            .idempotent(false)
            .open_world(false),
    )
}

/// The tools every session of the bridge has.
fn session_tools() -> Vec<Tool> {
    let channel = json!({"type": "object", "properties": {"channel": {"type": "string", "description": "The channel."}}, "required": ["channel"]});
    // Turning a push on or off changes what this session is sent, nothing else; twice is once.
    let switch = ToolAnnotations::new()
        .read_only(false)
        .destructive(false)
        .idempotent(true)
        .open_world(false);
    vec![
        Tool::new(
            "listen_live",
            "Push every new message on a channel (but your own) into this session as it arrives, \
             instead of polling. Stays on until stop_listening.",
            schema(channel.clone()),
        )
        .with_annotations(switch.clone()),
        Tool::new("stop_listening", "Stop pushing a channel's messages.", schema(channel)).with_annotations(switch),
        Tool::new(
            "delivery_status",
            "Which channels are pushed live, which are poll-only, whether each stream is connected now, and whether \
             crosstalk wake runs this identity's turns.",
            schema(json!({"type": "object", "properties": {}})),
        )
        .with_annotations(
            ToolAnnotations::new()
                .read_only(true)
                .destructive(false)
                .idempotent(true)
                .open_world(false),
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

/// A result as the revision the host speaks requires it. 2026-07-28 requires `resultType` on
/// every result, but the relay answers the bridge in a 2025-11-25 session, where results have
/// none: the bridge marks what it forwards `complete` (which is all the relay answers it), and
/// rmcp takes the mark off again for a host on an older revision.
trait Complete {
    fn complete(self) -> Self;
}

macro_rules! complete {
    ($($t:ty),*) => {$(
        impl Complete for $t {
            fn complete(mut self) -> Self {
                self.result_type.get_or_insert(ResultType::COMPLETE);
                self
            }
        }
    )*};
}

complete!(
    ListToolsResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    CallToolResult,
    GetPromptResult,
    ReadResourceResult
);

/// An answer that may be complete or something else (input required, a task): only a
/// complete one is marked.
macro_rules! complete_response {
    ($($t:ident),*) => {$(
        impl Complete for $t {
            fn complete(self) -> Self {
                match self {
                    $t::Complete(r) => $t::Complete(r.complete()),
                    other => other,
                }
            }
        }
    )*};
}

complete_response!(CallToolResponse, GetPromptResponse, ReadResourceResponse);

impl ServerHandler for Bridge {
    #[allow(deprecated)] // logging: what relays declare, and how 2025-11-25 hosts see progress lines
    fn get_info(&self) -> InitializeResult {
        // The relay's, or before one is reached what this binary's relay says.
        let mut info = self.link.offered().info;
        let caps = &mut info.capabilities;
        // The bridge forwards calls, not tasks: it serves no tasks/* of either revision.
        if let Some(extensions) = caps.extensions.as_mut() {
            extensions.remove(rmcp::model::TASKS_EXTENSION_ID);
        }
        // The relay's lists can differ from what the host was offered (a relay of another
        // version, reached later).
        caps.tools.get_or_insert_with(Default::default).list_changed = Some(true);
        caps.prompts.get_or_insert_with(Default::default).list_changed = Some(true);
        caps.resources.get_or_insert_with(Default::default).list_changed = Some(true);
        let experimental = caps.experimental.get_or_insert_with(Default::default);
        experimental.insert("claude/channel".into(), Default::default());
        // The host may relay its permission prompts here: a human decides them on the relay.
        experimental.insert(super::live::PERMISSION_CAPABILITY.into(), Default::default());
        info
    }

    async fn on_custom_notification(&self, notification: CustomNotification, _: NotificationContext<RoleServer>) {
        if notification.method == super::live::PERMISSION_REQUEST {
            let live = self.live.clone();
            tokio::spawn(async move { live.permission_request(notification.params).await });
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        *self.link.hosts.session.lock() = Some(context.peer.clone());
        self.live.attach(context.peer);
    }

    /// A 2026-07-28 host hears of list changes and resource updates on `subscriptions/listen`:
    /// every list change, and the resources of the relay's resource templates (its channels).
    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let templates = self.link.offered().templates;
        // A channel's resource: a template's prefix, then a channel name as the relay reads
        // one (a URI the relay would refuse is not accepted, to be left unanswered).
        let ours = |uri: &str| {
            templates.iter().any(|t| {
                let prefix = t.uri_template.split('{').next().unwrap_or_default();
                !prefix.is_empty()
                    && uri
                        .strip_prefix(prefix)
                        .is_some_and(|name| crosstalk_schema::ChannelName::parse(name).is_ok())
            })
        };
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|u| ours(u))
            .take(MAX_LISTENED)
            .cloned()
            .collect();
        // rmcp keeps of this only what the host asked for.
        Some(
            SubscriptionFilter::builder()
                .tools_list_changed()
                .prompts_list_changed()
                .resources_list_changed()
                .resource_subscriptions(uris)
                .build(),
        )
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let sink = context.sink().clone();
        let uris = context.accepted().resource_subscriptions.clone().unwrap_or_default();
        self.link.hosts.listens.lock().push(sink.clone());
        let mut held = Vec::new();
        for uri in uris {
            match self.link.subscribe(&uri).await {
                Ok(()) => held.push(uri),
                Err(e) => tracing::warn!(%uri, error = %e.message, "the relay did not take a subscription"),
            }
        }
        tokio::select! {
            _ = context.cancelled() => {}
            _ = self.link.stop.cancelled() => {}
        }
        self.link.hosts.listens.lock().retain(|s| s.id() != sink.id());
        for uri in held {
            self.link.unsubscribe(&uri).await;
        }
        Ok(())
    }

    /// At once, whether the relay is there or not: the relay's tools (or, before it is
    /// reached, this binary's relay's), then the bridge's own.
    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = self.link.offered().tools;
        tools.extend(own_tools());
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.clone().unwrap_or_default();
        let channel = args.get("channel").and_then(Value::as_str).map(str::to_owned);
        match (request.name.as_ref(), channel) {
            // Pushes go into the host's session; a 2026-07-28 host has none to push into.
            ("listen_live", Some(ch)) if self.link.hosts.session().is_none() => Ok(answer(
                json!({
                    "error": "this host has no session to push into (it speaks MCP 2026-07-28): nothing can be \
                              pushed to it",
                    "instead": format!(
                        "wait_for_message(channel={ch:?}, since_id=<the largest id you have seen>) blocks until \
                         the next message"
                    ),
                }),
                true,
            )),
            ("listen_live", Some(ch)) => Ok(match self.live.listen(&ch).await {
                Ok(v) => answer(v, false),
                Err(why) => answer(json!({"error": why}), true),
            }),
            ("stop_listening", Some(ch)) => Ok(answer(self.live.stop(&ch), false)),
            ("listen_live" | "stop_listening", None) => Ok(answer(json!({"error": "channel is required"}), true)),
            ("delivery_status", _) => Ok(answer(self.live.status_and_wake().await, false)),
            // Claude Code reads the verdict from one text block, the JSON it expects, and nothing
            // else: with structured content beside it, it refuses the answer.
            (PERMISSION_TOOL, _) => {
                let verdict = self.live.permission_prompt(&args).await;
                let r = CallToolResult::success(vec![ContentBlock::text(verdict.to_string())]);
                Ok(CallToolResponse::from(r))
            }
            (name, channel) => {
                let name = name.to_owned();
                if let Some(ch) = channel {
                    self.live.used(&ch);
                }
                let session = match self.link.session(FIRST_ATTEMPT).await {
                    Ok(s) => s,
                    Err(why) => return Ok(answer(json!({"error": why}), true)),
                };
                if name != "register" {
                    self.reclaim(&session).await;
                }
                let register = (name == "register").then(|| request.clone());
                let result = match session.peer.call_tool(request).await {
                    Ok(r) => r,
                    Err(ServiceError::McpError(e)) => return Err(e),
                    Err(e) => {
                        tracing::debug!(error = %e, "a tool call to the relay failed");
                        return Ok(answer(json!({"error": self.unavailable()}), true));
                    }
                };
                if let (Some(request), false) = (register, result.is_error == Some(true)) {
                    if let Some(who) = args.get("instance_id").and_then(Value::as_str) {
                        self.live.set_identity(who);
                    }
                    *self.claimed_in.lock() = Some(session.epoch());
                    let name = |r: &CallToolRequestParams| {
                        r.arguments
                            .as_ref()
                            .and_then(|a| a.get("instance_id"))
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    };
                    let mut registered = self.registered.lock();
                    let this = name(&request);
                    registered.retain(|r| name(r) != this);
                    registered.push(request);
                }
                Ok(CallToolResponse::from(result).complete())
            }
        }
    }

    async fn list_prompts(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Ok(ListPromptsResult::with_all_items(self.link.offered().prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        self.forward(|p| async move { p.get_prompt(request).await.map(Into::into) })
            .await
            .map(Complete::complete)
    }

    /// The relay's resources (the channels) when a session is open; else, at once, none, and
    /// the host is told the list changed once a session is.
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let State::Up(session) = self.link.now() else {
            self.link.resources_guessed.store(true, Ordering::SeqCst);
            return Ok(ListResourcesResult::default());
        };
        session
            .peer
            .list_resources(request)
            .await
            .map(Complete::complete)
            .map_err(|e| self.failed(e))
    }

    async fn list_resource_templates(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(
            self.link.offered().templates,
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.forward(|p| async move { p.read_resource(request).await.map(Into::into) })
            .await
            .map(Complete::complete)
    }

    /// 2025-11-25 hosts subscribe; the relay pushes, the bridge forwards. With no relay
    /// session within [`FIRST_ATTEMPT`], the next session subscribes.
    #[allow(deprecated)]
    async fn subscribe(&self, request: SubscribeRequestParams, _: RequestContext<RoleServer>) -> Result<(), McpError> {
        let _ = self.link.session(FIRST_ATTEMPT).await;
        self.link.host_subscribe(&request.uri).await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.link.host_unsubscribe(&request.uri).await;
        Ok(())
    }
}

/// Serves the host on stdio until it closes stdin or a signal comes, then closes the relay
/// session (which signs this session's identities off at once).
pub async fn serve(link: Arc<Link>, live: Arc<Live>) -> Result<(), Failure> {
    // A relay that answers at once gives the host its own name and instructions; one that
    // does not, does not hold the host up.
    link.first_attempt(HOST_WAIT).await;
    let bridge = Bridge {
        link: link.clone(),
        live,
        claimed_in: Mutex::new(None),
        registered: Mutex::new(Vec::new()),
    };
    let server = bridge
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Failure(format!("the host did not initialize: {e}"), 2))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = server.cancellation_token();
    let (ended, grace) = tokio::select! {
        r = server.waiting() => (r.map(|_| ()).map_err(|e| Failure(e.to_string(), 2)), CLOSE_GRACE),
        _ = term.recv() => { stop.cancel(); (Ok(()), SIGNAL_GRACE) },
        _ = tokio::signal::ctrl_c() => { stop.cancel(); (Ok(()), SIGNAL_GRACE) },
    };
    link.close(grace).await;
    ended
}
