//! MCP tasks: `wait_for_message`, `ask_human` and cross-claude's `wait_for_reply` as tasks the
//! client polls or is told about, so a wait outlives the host's limit on one tool call
//! (Claude.ai's 300 s, many hosts' 60 s) and the relay's restarts.
//!
//! Both generations of MCP tasks are served from one core:
//! - **2025-11-25** (experimental tasks): the client adds `task: {ttl}` to `tools/call` and
//!   polls `tasks/get`, then fetches `tasks/result`; `tasks/list` and `tasks/cancel`; the relay
//!   sends `notifications/tasks/status` on the session when a task ends. These requests are
//!   answered in the session manager ([`super::sessions`]), which also shapes the answers
//!   that generation expects ([`v1`]).
//! - **2026-07-28** (the tasks extension, SEP-2663): a client that declares
//!   `io.modelcontextprotocol/tasks` gets a task back from `tools/call` and polls `tasks/get`,
//!   whose answer carries the result; `tasks/cancel`; `notifications/tasks` on a
//!   `subscriptions/listen` stream that names the task (`notifications.taskIds`).
//!
//! A task is a record ([`TaskRecord`], through `ops::tasks`), made when the call comes in with
//! what the call left to the session pinned into it (the identity, where a wait starts, the
//! question already posted). A runner on the node that made it waits with what is left of the
//! task's time, up to `--task-wait-cap-secs`; when the wait ends it settles the record
//! (compare-and-set: a cancel or another runner that came first wins). After a restart the
//! node resumes its working tasks from their records; a task whose runner is gone (its node
//! stopped) is finished by the node a `tasks/get` reaches once its time is up.

use super::tools::{self, Cx};
use super::Face;
use crate::auth::Standing;
use crate::ops::oauth::RECHECK;
use crate::ops::tasks::{now_ms, Read, TaskStore, MAX_TASKS_PER_PRINCIPAL};
use crate::ops::{Ctx, ErrorKind, OpError, Principal};
use crosstalk_schema::task::{TaskRecord, TaskState};
use crosstalk_schema::Timestamp;
use parking_lot::Mutex;
use rmcp::model::{
    CallToolResult, CustomNotification, DetailedTask, JsonObject, Notification, ServerNotification, Task, TaskPayload,
    TaskStatus, TaskStatusNotificationParams,
};
use rmcp::service::SubscriptionSink;
use rmcp::{ErrorData as McpError, Peer, RoleServer};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// How often a client should poll `tasks/get`: an answer reaches a polling client within it.
pub const POLL_INTERVAL_MS: u64 = 1_000;
/// How long a finished task is kept when the client names no `ttl`.
pub const KEEP_DEFAULT: Duration = Duration::from_secs(3600);
/// Least and most a finished task is kept, whatever the client asks.
pub const KEEP_MIN: Duration = Duration::from_secs(60);
pub const KEEP_MAX: Duration = Duration::from_secs(86_400);
/// How long past its time a working task waits for its own runner before another node (or
/// this one) finishes it.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(10);
/// How often forgotten tasks are swept, and a listener looks at tasks other nodes run.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);
pub const LISTEN_RECHECK: Duration = Duration::from_secs(2);
/// How often a runner looks at its task's record, for a cancel made on another node.
pub const RECORD_RECHECK: Duration = Duration::from_secs(5);
/// Why a task ended that its owner's credential no longer holds for.
pub const NO_LONGER_HELD: &str =
    "the token that made this task is no longer valid (its OAuth connection was revoked, or it is no longer configured)";
/// Tasks one `subscriptions/listen` stream may follow.
pub const MAX_LISTENED: usize = 100;
/// `_meta` key that names a result's task (2025-11-25).
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// Whether `tool` runs as a task on `face`: the calls that block.
pub fn runs_as_task(face: Face, tool: &str) -> bool {
    matches!(
        (face, tool),
        (Face::Crosstalk, "wait_for_message" | "ask_human") | (Face::CrossClaude, "wait_for_reply")
    )
}

/// The name of the argument that sets a task tool's wait, and its unit in seconds.
fn timeout_argument(tool: &str) -> (&'static str, f64) {
    match tool {
        "wait_for_reply" => ("max_wait_minutes", 60.0),
        _ => ("timeout_s", 1.0),
    }
}

pub struct Tasks {
    ctx: Ctx,
    store: TaskStore,
    /// Whether a task's owner still holds the credential it was made with.
    standing: Standing,
    node: String,
    /// Longest a task waits (`--task-wait-cap-secs`).
    cap: Duration,
    /// This node's runners, by task id: cancelling one ends its wait.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// Tasks this node settled, for listeners.
    changes: broadcast::Sender<TaskRecord>,
}

impl Tasks {
    pub fn new(ctx: Ctx, node: String, cap: Duration, standing: Standing) -> Arc<Self> {
        Arc::new(Tasks {
            store: TaskStore::new(ctx.relay.records()),
            standing,
            ctx,
            node,
            cap,
            running: Default::default(),
            changes: broadcast::channel(256).0,
        })
    }

    /// Resumes this node's working tasks from their records, but for those whose owner's
    /// credential no longer holds (a participant token a restart no longer configures, a
    /// revoked OAuth connection), which fail; and sweeps expired ones every minute until the
    /// relay stops.
    pub async fn start(self: &Arc<Self>) -> Result<(), OpError> {
        let node = self.node.clone();
        let working = self
            .store
            .load_only(|r| r.state == TaskState::Working && r.node == node)
            .await?;
        let (mut resumed, mut ended) = (0, 0);
        for record in working {
            if self.held(&record).await {
                self.spawn(record, None);
                resumed += 1;
            } else {
                self.unheld(&record.id).await;
                ended += 1;
            }
        }
        if resumed > 0 || ended > 0 {
            tracing::info!(
                resumed,
                ended,
                "resumed MCP tasks; ended those whose token is no longer valid"
            );
        }
        let this = Arc::downgrade(self);
        let stop = self.ctx.relay.shutdown_token();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stop.cancelled() => return,
                }
                let Some(this) = this.upgrade() else { return };
                match this.store.sweep(now_ms()).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(forgotten = n, "expired MCP tasks forgotten"),
                    Err(e) => tracing::warn!(error = %e, "sweeping MCP tasks failed"),
                }
            }
        });
        Ok(())
    }

    /// Whether `record`'s owner still holds the credential it was made with.
    async fn held(&self, record: &TaskRecord) -> bool {
        self.standing
            .holds(&Principal::from_key(&record.owner), record.grant.as_deref())
            .await
    }

    /// Fails working task `id`: its owner's credential no longer holds.
    async fn unheld(&self, id: &str) {
        let message = Some(NO_LONGER_HELD.to_owned());
        let error = Some(json!({ "code": -32603, "message": NO_LONGER_HELD }).to_string());
        if let Some(settled) = self.settle(id, TaskState::Failed, error, message).await {
            self.told(&settled, None).await;
        }
    }

    /// Makes a task of a call to `tool`: checks the arguments, pins what the session would
    /// have supplied, stores the record and starts its runner. A refusal is the tool error
    /// the call would have answered, returned at once instead of a task. `grant`: the OAuth
    /// grant of the call's token, if it was one; the task ends with it.
    pub async fn create(
        self: &Arc<Self>,
        cx: &Cx,
        tool: &str,
        mut args: JsonObject,
        keep_ms: Option<u64>,
        v1_peer: Option<Peer<RoleServer>>,
        grant: Option<String>,
    ) -> Result<TaskRecord, CallToolResult> {
        let refused = |e: OpError| tools::error_result(&e);
        tools::check(cx.face, tool, &args).map_err(refused)?;
        if !self
            .store
            .has_room(cx.principal.key())
            .await
            .map_err(|e| refused(e.into()))?
        {
            return Err(refused(OpError::new(
                ErrorKind::LimitReached,
                format!("this token already holds {MAX_TASKS_PER_PRINCIPAL} tasks; finished ones are forgotten after their ttl"),
            )));
        }
        let caller = cx.caller();
        let (key, unit) = timeout_argument(tool);
        let asked = args
            .get(key)
            .and_then(Value::as_f64)
            .filter(|t| t.is_finite() && *t >= 0.0);
        let wait = asked
            .map(|t| Duration::from_secs_f64((t * unit).min(self.cap.as_secs_f64())))
            .unwrap_or(self.cap);
        let mut bound = caller.bound.clone();
        match tool {
            "wait_for_message" => {
                let given = args.get("instance_id").and_then(Value::as_str);
                if let Some(who) = caller.reader(&self.ctx, given).map_err(refused)? {
                    args.insert("instance_id".into(), json!(who));
                    bound = Some(who);
                }
            }
            "wait_for_reply" => {
                let r: crate::ops::cross_claude::WaitForReplyRequest =
                    serde_json::from_value(Value::Object(args.clone()))
                        .map_err(|e| refused(OpError::invalid(e.to_string())))?;
                let (reader, after) = crate::ops::cross_claude::WaitForReply::start(&self.ctx, &caller, &r)
                    .await
                    .map_err(refused)?;
                if let Some(who) = reader {
                    args.insert("instance_id".into(), json!(who));
                    bound = Some(who);
                }
                args.insert("after_id".into(), json!(after));
            }
            "ask_human" => {
                let r: crate::ops::messages::AskRequest = serde_json::from_value(Value::Object(args.clone()))
                    .map_err(|e| refused(OpError::invalid(e.to_string())))?;
                let (channel, question) = crate::ops::messages::Ask::post(&self.ctx, &caller, r)
                    .await
                    .map_err(refused)?;
                bound = Some(question.message.sender.clone());
                args = json!({ "channel": channel, "question_id": question.id() })
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
            }
            _ => return Err(refused(OpError::invalid(format!("{tool} does not run as a task")))),
        }
        let now = now_ms();
        let keep = keep_ms
            .map(Duration::from_millis)
            .unwrap_or(KEEP_DEFAULT)
            .clamp(KEEP_MIN, KEEP_MAX);
        let record = TaskRecord {
            id: TaskStore::new_id(cx.principal.key()),
            owner: cx.principal.key().to_owned(),
            face: cx.face.label().to_owned(),
            tool: tool.to_owned(),
            run: Value::Object(args).to_string(),
            bound,
            state: TaskState::Working,
            message: Some(format!("{tool} is waiting")),
            result: None,
            created_ms: now,
            updated_ms: now,
            deadline_ms: now + wait.as_millis() as i64,
            ttl_ms: (wait + keep).as_millis() as i64,
            node: self.node.clone(),
            grant,
        };
        self.store.create(&record).await.map_err(refused)?;
        self.spawn(record.clone(), v1_peer);
        Ok(record)
    }

    /// Starts the runner of a working task: waits what is left of its time, then settles it.
    fn spawn(self: &Arc<Self>, record: TaskRecord, v1_peer: Option<Peer<RoleServer>>) {
        let stop = CancellationToken::new();
        {
            let mut running = self.running.lock();
            if running.contains_key(&record.id) {
                return;
            }
            running.insert(record.id.clone(), stop.clone());
        }
        let this = self.clone();
        tokio::spawn(async move {
            // A cancel that reached another node changes only the record: looking at it now
            // and then ends this wait too, and frees its slot. And the wait acts for its
            // owner only while the owner's credential holds (a revoked OAuth connection).
            let unheld = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let watching = tokio::spawn({
                let (this, stop, unheld) = (this.clone(), stop.clone(), unheld.clone());
                let record = record.clone();
                async move {
                    // Only an OAuth credential can end while the relay runs (configured tokens
                    // are checked at start): other tasks look at their record alone, as often
                    // as before.
                    let oauth = record.grant.is_some() || Principal::from_key(&record.owner).grant_id().is_some();
                    let (every, record_every) = if oauth {
                        (RECHECK, (RECORD_RECHECK.as_secs() / RECHECK.as_secs()).max(1) as u32)
                    } else {
                        (RECORD_RECHECK, 1)
                    };
                    let mut ticks = 0u32;
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(every) => {}
                        }
                        if oauth && !this.held(&record).await {
                            unheld.store(true, std::sync::atomic::Ordering::Relaxed);
                            stop.cancel();
                            return;
                        }
                        ticks += 1;
                        if !ticks.is_multiple_of(record_every) {
                            continue;
                        }
                        if let Ok(Some(r)) = this.store.get(&record.id).await {
                            if r.record.state.is_final() {
                                stop.cancel();
                                return;
                            }
                        }
                    }
                }
            });
            let answer = this.run(&record, stop.clone()).await;
            watching.abort();
            this.running.lock().remove(&record.id);
            if unheld.load(std::sync::atomic::Ordering::Relaxed) {
                tracing::info!(task = %record.id, "an MCP task's token is no longer valid; the task ends");
                this.unheld(&record.id).await;
                return;
            }
            let shutting_down = this.ctx.relay.shutdown_token().is_cancelled();
            if stop.is_cancelled() || shutting_down {
                // Cancelled (the record says so already), or the relay is stopping: the
                // record stays working, and the wait resumes when the relay is back.
                return;
            }
            let (state, result, message) = match answer {
                Ok(result) => (
                    TaskState::Completed,
                    serde_json::to_string(&result).ok(),
                    Some(if result.is_error == Some(true) {
                        format!("{} answered with an error", record.tool)
                    } else {
                        format!("{} finished", record.tool)
                    }),
                ),
                Err(e) => (
                    TaskState::Failed,
                    Some(json!({ "code": -32603, "message": e.message }).to_string()),
                    Some(e.message.clone()),
                ),
            };
            if let Some(settled) = this.settle(&record.id, state, result, message).await {
                this.told(&settled, v1_peer.as_ref()).await;
            }
        });
    }

    /// Runs a task's wait with its pinned arguments and what is left of its time.
    async fn run(&self, record: &TaskRecord, stop: CancellationToken) -> Result<CallToolResult, OpError> {
        let face = Face::from_label(&record.face);
        let mut args: JsonObject = serde_json::from_str(&record.run)
            .map_err(|e| OpError::new(ErrorKind::Storage, format!("the task's arguments are damaged: {e}")))?;
        let left = Duration::from_millis((record.deadline_ms - now_ms()).max(0) as u64);
        let (key, unit) = timeout_argument(&record.tool);
        args.insert(key.into(), json!(left.as_secs_f64() / unit));
        // The wait acts as the identity the task pinned, from that identity's session now:
        // the task was authorised when it was made, and the session that made it may have
        // been replaced since (a reconnect, a restart).
        let session = record.bound.as_deref().and_then(|who| self.ctx.relay.session_of(who));
        let cx = Cx {
            ctx: self.ctx.clone(),
            session,
            principal: Principal::from_key(&record.owner),
            bound: Arc::new(Mutex::new(record.bound.clone())),
            wait_cap: self.cap.max(left),
            cancel: stop,
            peer: None,
            progress: None,
            log_level: Arc::new(Mutex::new(rmcp::model::LoggingLevel::Warning)),
            face,
        };
        tools::run_task(face, cx, &record.tool, args).await
    }

    /// Settles a working task; the record as settled, or `None` if it was no longer working
    /// (a cancel or another runner came first) or could not be written.
    async fn settle(
        &self,
        id: &str,
        state: TaskState,
        result: Option<String>,
        message: Option<String>,
    ) -> Option<TaskRecord> {
        for _ in 0..8 {
            let current = match self.store.get(id).await {
                Ok(Some(c)) => c,
                Ok(None) => return None,
                Err(e) => {
                    tracing::warn!(task = id, error = %e, "cannot read a task to settle it");
                    return None;
                }
            };
            if current.record.state.is_final() {
                return None;
            }
            let next = current.record.settled(state, result.clone(), message.clone(), now_ms());
            match self.store.settle(&current, &next).await {
                Ok(true) => return Some(next),
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(task = id, error = %e, "cannot settle a task; it stays working");
                    return None;
                }
            }
        }
        None
    }

    /// Tells listeners on this node, and a 2025-11-25 session, that a task changed.
    async fn told(&self, record: &TaskRecord, v1_peer: Option<&Peer<RoleServer>>) {
        let _ = self.changes.send(record.clone());
        if let Some(peer) = v1_peer {
            let status = CustomNotification::new("notifications/tasks/status", Some(v1::task(record)));
            let _ = peer
                .send_notification(ServerNotification::CustomNotification(status))
                .await;
        }
    }

    /// `principal`'s task `id`. A working task past its time whose runner is gone (its
    /// node stopped) is finished here: what is left of its wait is nothing, so it answers at once.
    pub async fn get(self: &Arc<Self>, principal: &Principal, id: &str) -> Result<TaskRecord, OpError> {
        let read = self.store.owned(principal, id).await?;
        self.adopt_orphan(&read);
        Ok(read.record)
    }

    fn adopt_orphan(self: &Arc<Self>, read: &Read) {
        let r = &read.record;
        let overdue = now_ms() > r.deadline_ms + ORPHAN_GRACE.as_millis() as i64;
        if r.state == TaskState::Working && overdue && !self.running.lock().contains_key(&r.id) {
            tracing::debug!(task = %r.id, node = %r.node, "a task past its time has no runner; finishing it here");
            self.spawn(r.clone(), None);
        }
    }

    /// Cancels `principal`'s working task `id` and ends its wait if this node runs it.
    pub async fn cancel(&self, principal: &Principal, id: &str) -> Result<TaskRecord, OpError> {
        let cancelled = self.store.cancel(principal, id).await?;
        if let Some(stop) = self.running.lock().remove(id) {
            stop.cancel();
        }
        self.told(&cancelled, None).await;
        Ok(cancelled)
    }

    /// `principal`'s task `id` once it is final: what 2025-11-25's `tasks/result` waits for.
    pub async fn finished(self: &Arc<Self>, principal: &Principal, id: &str) -> Result<TaskRecord, OpError> {
        let _held = self.ctx.hold(principal)?;
        let mut changes = self.changes.subscribe();
        let stop = self.ctx.relay.shutdown_token();
        loop {
            let record = self.get(principal, id).await?;
            if record.state.is_final() {
                return Ok(record);
            }
            tokio::select! {
                _ = changes.recv() => {}
                _ = tokio::time::sleep(LISTEN_RECHECK) => {}
                _ = stop.cancelled() => return Err(OpError::new(ErrorKind::ShuttingDown, "the relay is shutting down; ask again once it is back")),
            }
        }
    }

    /// `principal`'s tasks, newest first.
    pub async fn list(&self, principal: &Principal) -> Result<Vec<TaskRecord>, OpError> {
        Ok(self.store.list_owned(principal).await?)
    }

    /// Sends `notifications/tasks` on a 2026-07-28 listen stream for the tasks it names
    /// (those of `principal`'s) as they change, until `stop`. Tasks already final when the
    /// stream opens are told at once, so an answer that came before the listen is not missed.
    pub async fn watch(
        self: &Arc<Self>,
        principal: Principal,
        ids: Vec<String>,
        sink: SubscriptionSink,
        stop: CancellationToken,
    ) {
        if ids.is_empty() {
            return;
        }
        let mut changes = self.changes.subscribe();
        let mut told: HashMap<String, TaskState> = HashMap::new();
        let mut recheck = tokio::time::interval(LISTEN_RECHECK);
        loop {
            let mut seen = Vec::new();
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = changes.recv() => match changed {
                    Ok(r) => seen.push(r),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                // Tasks other nodes run, and changes missed while lagging.
                _ = recheck.tick() => {
                    for id in &ids {
                        if told.get(id).is_some_and(|s| s.is_final()) {
                            continue;
                        }
                        if let Ok(r) = self.get(&principal, id).await {
                            seen.push(r);
                        }
                    }
                }
            }
            for r in seen {
                if r.owner != principal.key() || !ids.contains(&r.id) {
                    continue;
                }
                let before = told.insert(r.id.clone(), r.state);
                // A working task is told only when it changes, not on every look.
                if before == Some(r.state) || (before.is_none() && r.state == TaskState::Working) {
                    continue;
                }
                let note = Notification::new(TaskStatusNotificationParams::new(v2::detailed(&r)));
                if sink
                    .send(ServerNotification::TaskStatusNotification(note))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

fn rfc3339(ms: i64) -> String {
    Timestamp::from_millis(ms).to_rfc3339()
}

/// An error as JSON-RPC's `error` object, for a failed task.
fn error_object(record: &TaskRecord) -> JsonObject {
    record
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str::<Value>(r).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_else(|| {
            json!({ "code": -32603, "message": record.message.clone().unwrap_or_default() })
                .as_object()
                .cloned()
                .unwrap_or_default()
        })
}

/// The stored tool result of a completed task.
fn result_object(record: &TaskRecord) -> JsonObject {
    record
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str::<Value>(r).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

/// The 2026-07-28 shapes (rmcp's types).
pub mod v2 {
    use super::*;

    pub fn task(r: &TaskRecord) -> Task {
        let status = match r.state {
            TaskState::Working => TaskStatus::Working,
            TaskState::Completed => TaskStatus::Completed,
            TaskState::Failed => TaskStatus::Failed,
            TaskState::Cancelled => TaskStatus::Cancelled,
        };
        let mut t = Task::new(r.id.clone(), status, rfc3339(r.created_ms), rfc3339(r.updated_ms))
            .with_ttl_ms(r.ttl_ms.max(0) as u64);
        if r.state == TaskState::Working {
            t = t.with_poll_interval_ms(POLL_INTERVAL_MS);
        }
        if let Some(m) = &r.message {
            t = t.with_status_message(m.clone());
        }
        t
    }

    pub fn detailed(r: &TaskRecord) -> DetailedTask {
        let payload = match r.state {
            TaskState::Working => TaskPayload::Working,
            TaskState::Completed => TaskPayload::Completed {
                result: result_object(r),
            },
            TaskState::Failed => TaskPayload::Failed { error: error_object(r) },
            TaskState::Cancelled => TaskPayload::Cancelled,
        };
        DetailedTask::new(task(r), payload)
    }
}

/// The 2025-11-25 shapes, as JSON (rmcp 3.11 has no types for them).
pub mod v1 {
    use super::*;

    /// A `Task`: what `tasks/get` and `tasks/cancel` answer and `notifications/tasks/status`
    /// carries.
    pub fn task(r: &TaskRecord) -> Value {
        let mut t = json!({
            "taskId": r.id,
            "status": r.state.as_str(),
            "createdAt": rfc3339(r.created_ms),
            "lastUpdatedAt": rfc3339(r.updated_ms),
            "ttl": r.ttl_ms,
        });
        if r.state == TaskState::Working {
            t["pollInterval"] = json!(POLL_INTERVAL_MS);
        }
        if let Some(m) = &r.message {
            t["statusMessage"] = json!(m);
        }
        t
    }

    /// A 2026-07-28 task answer to `tools/call` (`resultType: "task"`, the task's fields
    /// inline) as 2025-11-25's `CreateTaskResult` (`{task: {...}}`).
    pub fn created(v2: &Value) -> Value {
        let mut t = v2.clone();
        let mut meta = Value::Null;
        if let Some(o) = t.as_object_mut() {
            o.remove("resultType");
            meta = o.remove("_meta").unwrap_or(Value::Null);
            if let Some(ttl) = o.remove("ttlMs") {
                o.insert("ttl".into(), ttl);
            }
            if let Some(p) = o.remove("pollIntervalMs") {
                o.insert("pollInterval".into(), p);
            }
        }
        let mut answer = json!({ "task": t });
        if !meta.is_null() {
            answer["_meta"] = meta;
        }
        answer
    }

    /// What `tasks/result` answers for a final task: the tool's result with its task named
    /// in `_meta`, or the error the task ended with.
    pub fn result(r: &TaskRecord) -> Result<Value, McpError> {
        match r.state {
            TaskState::Completed => {
                let mut result = result_object(r);
                // 2026-07-28's discriminator, which this generation does not have.
                result.remove("resultType");
                let meta = result.entry("_meta").or_insert_with(|| json!({}));
                if let Some(m) = meta.as_object_mut() {
                    m.insert(RELATED_TASK.into(), json!({ "taskId": r.id }));
                }
                Ok(Value::Object(result))
            }
            TaskState::Failed => {
                let e = error_object(r);
                let message = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the task failed")
                    .to_owned();
                Err(McpError::internal_error(message, None))
            }
            TaskState::Cancelled => Err(McpError::invalid_request(format!("task {} was cancelled", r.id), None)),
            TaskState::Working => Err(McpError::internal_error("the task is still working", None)),
        }
    }
}
