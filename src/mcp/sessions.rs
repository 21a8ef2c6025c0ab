//! [`DisconnectAware`]: rmcp's in-memory session manager over our event store
//! ([`super::events::ResumeLog`]: relay-wide event ids, resumes that replay what followed and
//! keep following), plus one rule. In a 2025-11-25 session a tool call's answer travels on the
//! POST's own event stream, and rmcp keeps the call running when that stream drops, in case
//! the client resumes it with `Last-Event-ID`. A client that does not come back within
//! [`RESUME_GRACE`] is gone: its call is cancelled as if it had sent
//! `notifications/cancelled`, so a `wait_for_message` never outlives its client by more than
//! the grace. And when a session is closed (`DELETE /mcp`: the client, or the `crosstalk mcp`
//! bridge behind it, is going away), the identities bound to it sign off at once.
//!
//! Every session rmcp opens and ends is told to [`Owners`] (who opened it, how many each
//! principal holds); one that has not finished its handshake within [`INIT_GRACE`] is closed.
//!
//! Sessions are 2025-11-25's (and older), so this is also where that generation's tasks are
//! served, which rmcp 3.11 does not know: `tasks/get`, `tasks/result`, `tasks/list` and
//! `tasks/cancel` are answered here from [`Tasks`], and three answers rmcp makes are reshaped
//! on their way out — `initialize` declares `capabilities.tasks`, `tools/list` marks the
//! blocking tools `execution.taskSupport: "optional"`, and a task made by `tools/call` is
//! answered as `{task: {...}}` (see [`super::tasks`]).

use super::events::ResumeLog;
use super::owner::{Owners, INIT_GRACE};
use super::tasks::{self, Tasks};
use super::Face;
use crate::ops::Principal;
use futures_util::{Stream, StreamExt};
use parking_lot::Mutex;
use rmcp::model::GetExtensions;
use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientJsonRpcMessage, ClientNotification, ClientRequest,
    CustomResult, ErrorData, JsonRpcError, JsonRpcResponse, JsonRpcVersion2_0, RequestId, ServerJsonRpcMessage,
    ServerResult,
};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long a dropped request stream may take to resume before its call is cancelled:
/// rmcp's reconnect hint (3 s) plus slack.
pub const RESUME_GRACE: Duration = Duration::from_secs(5);

pub struct DisconnectAware {
    inner: Arc<LocalSessionManager>,
    relay: crosstalk_actors::Relay,
    /// When each session last resumed a stream: a resume after a drop keeps the call alive.
    resumed: Arc<Mutex<HashMap<SessionId, Instant>>>,
    owners: Arc<Owners>,
    tasks: Arc<Tasks>,
    face: Face,
}

impl DisconnectAware {
    /// rmcp's session manager over [`ResumeLog`]: relay-wide event ids, and resumes that
    /// replay what followed and keep following.
    pub fn new(relay: crosstalk_actors::Relay, owners: Arc<Owners>, tasks: Arc<Tasks>, face: Face) -> Self {
        DisconnectAware {
            inner: Arc::new(LocalSessionManager::default().with_event_store(Arc::new(ResumeLog::default()))),
            relay,
            resumed: Default::default(),
            owners,
            tasks,
            face,
        }
    }
}

/// A response stream, whatever made it.
type Answers = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync>>;

/// A 2025-11-25 task request, answered here.
enum TaskRequest {
    Get(String),
    Cancel(String),
    Result(String),
    /// A page of the caller's tasks, after the cursor's task if there is one.
    List(Option<String>),
}

/// Tasks one `tasks/list` page holds.
const TASKS_PAGE: usize = 100;

/// Which of rmcp's answers to reshape for 2025-11-25's tasks.
#[derive(Clone, Copy)]
enum Reshape {
    Tools(Face),
    CreatedTask,
}

fn task_request(request: &ClientRequest) -> Option<TaskRequest> {
    let id_of = |params: &Option<Value>| {
        params
            .as_ref()
            .and_then(|p| p.get("taskId"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_default()
    };
    match request {
        ClientRequest::GetTaskRequest(r) => Some(TaskRequest::Get(r.params.task_id.clone())),
        ClientRequest::CancelTaskRequest(r) => Some(TaskRequest::Cancel(r.params.task_id.clone())),
        ClientRequest::CustomRequest(r) if r.method == "tasks/result" => Some(TaskRequest::Result(id_of(&r.params))),
        ClientRequest::CustomRequest(r) if r.method == "tasks/list" => Some(TaskRequest::List(
            r.params
                .as_ref()
                .and_then(|p| p.get("cursor"))
                .filter(|c| !c.is_null())
                .map(|c| c.as_str().unwrap_or_default().to_owned()),
        )),
        _ => None,
    }
}

fn answer(id: RequestId, result: Result<Value, ErrorData>) -> ServerSseMessage {
    let message = match result {
        Ok(v) => ServerJsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: JsonRpcVersion2_0,
            id,
            result: ServerResult::CustomResult(CustomResult(v)),
        }),
        Err(error) => ServerJsonRpcMessage::Error(JsonRpcError {
            jsonrpc: JsonRpcVersion2_0,
            id: Some(id),
            error,
        }),
    };
    ServerSseMessage::from_message(message)
}

/// Answers a 2025-11-25 task request.
async fn serve_task_request(tasks: Arc<Tasks>, principal: Principal, request: TaskRequest) -> Result<Value, ErrorData> {
    use super::task_error;
    match request {
        TaskRequest::Get(id) => Ok(tasks::v1::task(&tasks.get(&principal, &id).await.map_err(task_error)?)),
        TaskRequest::Cancel(id) => Ok(tasks::v1::task(
            &tasks.cancel(&principal, &id).await.map_err(task_error)?,
        )),
        TaskRequest::Result(id) => tasks::v1::result(&tasks.finished(&principal, &id).await.map_err(task_error)?),
        TaskRequest::List(cursor) => {
            let all = tasks.list(&principal).await.map_err(task_error)?;
            let from = match cursor.as_deref() {
                None => 0,
                Some(c) => page_start(&all, c).ok_or_else(|| {
                    ErrorData::invalid_params(format!("tasks/list: {c:?} is not a cursor this relay gave"), None)
                })?,
            };
            let page = &all[from..all.len().min(from + TASKS_PAGE)];
            let mut answer = json!({ "tasks": page.iter().map(tasks::v1::task).collect::<Vec<_>>() });
            if let (Some(last), true) = (page.last(), from + page.len() < all.len()) {
                answer["nextCursor"] = json!(format!("{}:{}", last.created_ms, last.id));
            }
            Ok(answer)
        }
    }
}

/// Where the page after `cursor` starts in `all` (newest first: by creation, then id, each
/// descending). The cursor names the last task of the page before (`<created ms>:<id>`), so a
/// task made or forgotten between two pages neither repeats one nor skips one, as an offset
/// did. A bare number is an earlier release's offset; anything else is no cursor (`None`).
fn page_start(all: &[crosstalk_schema::task::TaskRecord], cursor: &str) -> Option<usize> {
    if let Ok(offset) = cursor.parse::<usize>() {
        return Some(offset.min(all.len()));
    }
    let (created, id) = cursor.split_once(':')?;
    let after = (created.parse::<i64>().ok()?, id);
    Some(
        all.iter()
            .position(|r| (r.created_ms, r.id.as_str()) < after)
            .unwrap_or(all.len()),
    )
}

/// rmcp's answer, reshaped for 2025-11-25's tasks (see the module's doc).
fn reshape(how: Reshape, m: ServerSseMessage) -> ServerSseMessage {
    let Some(ServerJsonRpcMessage::Response(r)) = m.message.as_deref() else {
        return m;
    };
    let shaped = match (how, &r.result) {
        (Reshape::CreatedTask, ServerResult::CreateTaskResult(created)) => {
            serde_json::to_value(created).ok().map(|v| tasks::v1::created(&v))
        }
        (Reshape::Tools(face), ServerResult::ListToolsResult(list)) => serde_json::to_value(list).ok().map(|mut v| {
            for tool in v.get_mut("tools").and_then(Value::as_array_mut).into_iter().flatten() {
                let task = tool
                    .get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| tasks::runs_as_task(face, n));
                if task {
                    tool["execution"] = json!({ "taskSupport": "optional" });
                }
            }
            v
        }),
        _ => None,
    };
    match shaped {
        Some(v) => {
            let mut shaped = ServerSseMessage::from_message(ServerJsonRpcMessage::Response(JsonRpcResponse {
                jsonrpc: JsonRpcVersion2_0,
                id: r.id.clone(),
                result: ServerResult::CustomResult(CustomResult(v)),
            }));
            shaped.event_id = m.event_id.clone();
            shaped.retry = m.retry;
            shaped
        }
        None => m,
    }
}

/// The 2025-11-25 tasks capability: `tools/call` may be a task, and tasks can be listed and
/// cancelled.
fn with_tasks_capability(answer: ServerJsonRpcMessage) -> ServerJsonRpcMessage {
    let ServerJsonRpcMessage::Response(r) = &answer else {
        return answer;
    };
    let ServerResult::InitializeResult(init) = &r.result else {
        return answer;
    };
    let Ok(mut v) = serde_json::to_value(init) else {
        return answer;
    };
    v["capabilities"]["tasks"] = json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } });
    ServerJsonRpcMessage::Response(JsonRpcResponse {
        jsonrpc: JsonRpcVersion2_0,
        id: r.id.clone(),
        result: ServerResult::CustomResult(CustomResult(v)),
    })
}

impl SessionManager for DisconnectAware {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.owners.opened(id, opener(&message));
        let answer = self
            .inner
            .initialize_session(id, message)
            .await
            .map(with_tasks_capability);
        // The session may have ended already: `close_session` takes it out of rmcp's map
        // before it tells `owners`, so this cannot miss it.
        if !self.inner.has_session(id).await.unwrap_or(false) {
            self.owners.closed(id);
        } else {
            let (inner, owners, id) = (self.inner.clone(), self.owners.clone(), id.clone());
            tokio::spawn(async move {
                tokio::time::sleep(INIT_GRACE).await;
                if owners.initializing(&id) {
                    tracing::debug!("an MCP session did not finish its handshake in time; closing it");
                    // Ends its worker; rmcp then calls `close_session` (sign-off, owners).
                    let _ = inner.close_session(&id).await;
                    owners.closed(&id);
                }
            });
        }
        answer
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.resumed.lock().remove(id);
        // Identities bound to the session are bound to it as its opener's (`Principal::session`).
        if let Some(opener) = self.owners.owner(id) {
            self.relay.sign_off(&opener.session(id));
        }
        let closed = self.inner.close_session(id).await;
        // After rmcp's map lets go of it: see `initialize_session`.
        self.owners.closed(id);
        closed
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let request_id = match &message {
            ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        let mut how = None;
        if let ClientJsonRpcMessage::Request(r) = &message {
            if let Some(asked) = task_request(&r.request) {
                // Answered here, on a task of its own: `tasks/result` may wait for hours, and
                // ends when the client goes away.
                let principal = super::principal_in(r.request.extensions());
                let (tasks, rid) = (self.tasks.clone(), r.id.clone());
                let (tx, rx) = tokio::sync::oneshot::channel();
                tokio::spawn(async move {
                    let mut tx = tx;
                    tokio::select! {
                        a = serve_task_request(tasks, principal, asked) => { let _ = tx.send(answer(rid, a)); }
                        _ = tx.closed() => {}
                    }
                });
                self.owners.initialized(id);
                let answers: Answers =
                    Box::pin(futures_util::stream::once(rx).filter_map(|a| std::future::ready(a.ok())));
                return Ok(Watched {
                    inner: answers,
                    pending: None,
                });
            }
            how = match &r.request {
                ClientRequest::ListToolsRequest(_) => Some(Reshape::Tools(self.face)),
                ClientRequest::CallToolRequest(c) if c.params.task.is_some() => Some(Reshape::CreatedTask),
                _ => None,
            };
        }
        let stream = self.inner.create_stream(id, message).await?;
        // A request in a session: it is in use, whether or not the client sent
        // `notifications/initialized` (rmcp does not insist).
        self.owners.initialized(id);
        let inner: Answers = match how {
            Some(how) => Box::pin(stream.map(move |m| reshape(how, m))),
            None => Box::pin(stream),
        };
        Ok(Watched {
            inner,
            pending: request_id.map(|request_id| Pending {
                request_id,
                session: id.clone(),
                manager: self.inner.clone(),
                resumed: self.resumed.clone(),
            }),
        })
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        let handshake_done = matches!(&message, ClientJsonRpcMessage::Notification(n)
            if matches!(n.notification, ClientNotification::InitializedNotification(_)));
        self.inner.accept_message(id, message).await?;
        if handshake_done {
            self.owners.initialized(id);
        }
        Ok(())
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.resumed.lock().insert(id.clone(), Instant::now());
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

/// Who sent an `initialize`: the guard's principal, carried by the transport's request hook.
fn opener(message: &ClientJsonRpcMessage) -> Principal {
    match message {
        ClientJsonRpcMessage::Request(r) => super::principal_in(r.request.extensions()),
        _ => Principal::Anyone,
    }
}

/// A request's response stream that notices being dropped before its answer was sent.
struct Watched {
    inner: Answers,
    /// Present until the answer has gone out (or the stream ended).
    pending: Option<Pending>,
}

struct Pending {
    request_id: RequestId,
    session: SessionId,
    manager: Arc<LocalSessionManager>,
    resumed: Arc<Mutex<HashMap<SessionId, Instant>>>,
}

impl Stream for Watched {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = self.inner.as_mut().poll_next(cx);
        match &next {
            Poll::Ready(None) => self.pending = None,
            Poll::Ready(Some(m)) => {
                let answered = m
                    .message
                    .as_deref()
                    .is_some_and(|m| matches!(m, ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)));
                if answered {
                    self.pending = None;
                }
            }
            Poll::Pending => {}
        }
        next
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let Some(p) = self.pending.take() else { return };
        let dropped_at = Instant::now();
        // Drop runs on the actix worker that served the stream; the runtime is there.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            tokio::time::sleep(RESUME_GRACE).await;
            let resumed = p.resumed.lock().get(&p.session).is_some_and(|at| *at >= dropped_at);
            if resumed {
                return;
            }
            tracing::debug!(session = %p.session, request = %p.request_id, "client gone; cancelling its call");
            let cancel = ClientJsonRpcMessage::notification(ClientNotification::CancelledNotification(
                CancelledNotification::new(CancelledNotificationParam::new(
                    Some(p.request_id),
                    Some("the client disconnected".into()),
                )),
            ));
            // The session may be gone already, which ends the call anyway.
            let _ = p.manager.accept_message(&p.session, cancel).await;
        });
    }
}
