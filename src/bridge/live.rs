//! Live push: each new message on a listened channel, but the session's own, is delivered
//! into the session as it arrives, as `notifications/claude/channel` (Claude Code's channel
//! notifications, declared with the `experimental: {"claude/channel": {}}` capability). It
//! comes from the relay's SSE stream, resumed with `Last-Event-ID` after a drop or a relay
//! restart, so nothing is lost or pushed twice; `delivery_status` says what is pushed, what is
//! poll-only, and whether each stream is connected now.

use crate::client::{Followed, RelayClient};
use crosstalk_schema::{ChannelName, Meaning, Message, NewMessage};
use parking_lot::Mutex;
use rmcp::model::{CustomNotification, ServerNotification};
use rmcp::{Peer, RoleServer};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// The notification method Claude Code reads channel events from.
pub const CHANNEL_NOTIFICATION: &str = "notifications/claude/channel";
/// Permission relay (Claude Code's channels reference): the capability a server declares,
/// the host's prompt, and the verdict sent back.
pub const PERMISSION_CAPABILITY: &str = "claude/channel/permission";
pub const PERMISSION_REQUEST: &str = "notifications/claude/channel/permission_request";
pub const PERMISSION_VERDICT: &str = "notifications/claude/channel/permission";

#[derive(Debug, Default, Clone, Serialize)]
struct Stream {
    channel: String,
    /// The SSE stream is open now.
    connected: bool,
    /// The newest message id seen on it.
    last_id: u64,
    /// Messages pushed into the session.
    delivered: u64,
    /// Why it stopped, if it did (a refusal, or no relay at the first attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

struct Listener {
    task: tokio::task::AbortHandle,
    stream: Arc<Mutex<Stream>>,
}

pub struct Live {
    rest: Arc<RelayClient>,
    /// The host, once it has initialized: pushes wait for it.
    peer: watch::Sender<Option<Peer<RoleServer>>>,
    /// The identity this session registered: its own messages are not pushed back to it.
    me: Mutex<Option<String>>,
    listeners: Mutex<BTreeMap<String, Listener>>,
    /// Channels the session used through tools: poll-only unless listened.
    used: Mutex<BTreeSet<String>>,
    outbox: mpsc::UnboundedSender<CustomNotification>,
    /// Permission prompts posted and not yet decided: the PERMISSION message's id → the host's
    /// request id.
    permissions: Mutex<BTreeMap<u64, String>>,
}

/// Prompts awaiting a verdict the bridge remembers; past it the oldest is forgotten (its
/// verdict then stays on the relay, and the host's own prompt decides).
const MAX_PENDING_PERMISSIONS: usize = 256;

/// The longest a prompt's fields are copied into the PERMISSION message.
const PREVIEW_CHARS: usize = 2000;
/// How long `permission_prompt` waits for a person's verdict before it denies.
pub const PERMISSION_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

impl Live {
    pub fn new(rest: Arc<RelayClient>) -> Arc<Live> {
        let (outbox, mut rx) = mpsc::unbounded_channel::<CustomNotification>();
        let (peer, mut host) = watch::channel(None::<Peer<RoleServer>>);
        tokio::spawn(async move {
            while let Some(n) = rx.recv().await {
                let peer = match host.wait_for(Option::is_some).await {
                    Ok(guard) => guard.clone(),
                    Err(_) => return,
                };
                let Some(p) = peer else { continue };
                if let Err(e) = p.send_notification(ServerNotification::CustomNotification(n)).await {
                    tracing::warn!(error = %e, "the host did not take a pushed message");
                }
            }
        });
        Arc::new(Live {
            rest,
            peer,
            me: Mutex::new(None),
            listeners: Mutex::new(BTreeMap::new()),
            used: Mutex::new(BTreeSet::new()),
            outbox,
            permissions: Mutex::new(BTreeMap::new()),
        })
    }

    /// The host has initialized: pushes can flow.
    pub fn attach(&self, peer: Peer<RoleServer>) {
        self.peer.send_replace(Some(peer));
    }

    pub fn set_identity(&self, who: &str) {
        *self.me.lock() = Some(who.to_owned());
    }

    pub fn used(&self, channel: &str) {
        if let Ok(name) = crosstalk_schema::ChannelName::parse(channel) {
            self.used.lock().insert(name.to_string());
        }
    }

    /// Starts pushing `channel`'s new messages (from its newest now). Idempotent. A name
    /// the relay would refuse is refused here, with the relay's own rule.
    pub async fn listen(self: &Arc<Self>, channel: &str) -> Result<Value, String> {
        let name = crosstalk_schema::ChannelName::parse(channel).map_err(|e| e.to_string())?;
        let channel = name.as_str();
        if let Some(l) = self.listeners.lock().get(channel) {
            if l.stream.lock().error.is_none() {
                return Ok(json!({"channel": channel, "listening": true, "already": true}));
            }
        }
        let since = self.rest.newest(&name).await.map_err(|f| f.0)?;
        let stream = Arc::new(Mutex::new(Stream {
            channel: channel.to_owned(),
            last_id: since,
            ..Stream::default()
        }));
        let (me, name, s) = (self.clone(), name.clone(), stream.clone());
        let task = tokio::spawn(async move {
            let result = me
                .rest
                .follow(&name, since, |event| match event {
                    Followed::Connected => s.lock().connected = true,
                    Followed::Dropped => s.lock().connected = false,
                    Followed::Message(m) => me.arrived(name.as_str(), &s, *m),
                })
                .await;
            let mut st = s.lock();
            st.connected = false;
            st.error = Some(result.err().map_or_else(|| "stopped".to_owned(), |f| f.0));
        });
        let old = self.listeners.lock().insert(
            channel.to_owned(),
            Listener {
                task: task.abort_handle(),
                stream,
            },
        );
        if let Some(old) = old {
            old.task.abort();
        }
        Ok(json!({"channel": channel, "listening": true, "since_id": since}))
    }

    /// Stops pushing `channel`; says whether it was pushed.
    pub fn stop(&self, channel: &str) -> Value {
        let channel =
            crosstalk_schema::ChannelName::parse(channel).map_or_else(|_| channel.to_owned(), |n| n.to_string());
        let was = self.listeners.lock().remove(&channel);
        if let Some(l) = &was {
            l.task.abort();
        }
        json!({"channel": channel, "listening": false, "was_listening": was.is_some()})
    }

    /// Claude Code's `--permission-prompt-tool` (a headless turn cannot ask its terminal): a
    /// PERMISSION to the humans on the turn's channel (`CROSSTALK_CHANNELS`' first, as
    /// `crosstalk wake` sets it; else the first listened channel; else `permissions`), as this
    /// session's identity (else `CROSSTALK_AS`, else `claude-code`); then the humans' verdict, in
    /// the shape Claude Code reads: `{"behavior":"allow","updatedInput":…}` or
    /// `{"behavior":"deny","message":…}`. Only a human's ANSWER decides it (the relay refuses
    /// anyone else's); no verdict within [`PERMISSION_WAIT`] is a deny.
    pub async fn permission_prompt(&self, args: &serde_json::Map<String, Value>) -> Value {
        let deny = |why: String| json!({"behavior": "deny", "message": why});
        let tool = args
            .get("tool_name")
            .and_then(Value::as_str)
            .unwrap_or("a tool")
            .to_owned();
        let input = args.get("input").cloned().unwrap_or_else(|| json!({}));
        let listened = self.listeners.lock().keys().next().cloned();
        let channel = std::env::var("CROSSTALK_CHANNELS")
            .ok()
            .and_then(|c| c.split(',').map(str::trim).find(|c| !c.is_empty()).map(str::to_owned))
            .or(listened)
            .unwrap_or_else(|| "permissions".to_owned());
        let Ok(channel) = ChannelName::parse(&channel) else {
            return deny(format!(
                "no channel to ask the humans on ({channel:?} is not a channel name)"
            ));
        };
        let sender = self
            .me
            .lock()
            .clone()
            .or_else(|| std::env::var("CROSSTALK_AS").ok().filter(|s| !s.trim().is_empty()))
            .unwrap_or_else(|| "claude-code".to_owned());
        let mut preview = input.to_string();
        if preview.chars().count() > PREVIEW_CHARS {
            preview = preview.chars().take(PREVIEW_CHARS).collect::<String>() + "…";
        }
        let mut body = format!("Allow {tool}? {preview}");
        if let Some(id) = args.get("tool_use_id").and_then(Value::as_str) {
            body.push_str(&format!("\n(tool use {id})"));
        }
        let asking = NewMessage {
            sender,
            kind: Some(Meaning::Permission.into()),
            body,
            recipient: Some(crosstalk_schema::message::ANY_HUMAN.to_owned()),
            ..NewMessage::default()
        };
        let asked = match self.rest.post(&channel, asking).await {
            Ok(m) => m,
            Err(f) => {
                return deny(format!(
                    "the permission request could not be posted to the relay: {}",
                    f.0
                ))
            }
        };
        tracing::info!(channel = %channel, message = asked.id, tool = %tool, "permission prompt asked of the humans");
        let deadline = tokio::time::Instant::now() + PERMISSION_WAIT;
        let mut since = asked.id;
        while tokio::time::Instant::now() < deadline {
            let left = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .as_secs_f64();
            let request = crate::ops::messages::WaitRequest {
                channel: channel.clone(),
                since_id: since,
                limit: None,
                timeout_s: Some(left.min(60.0)),
                instance_id: None,
                role: Default::default(),
                exclude_self: None,
            };
            let messages = match self.rest.call(crate::api::WAIT, &request).await {
                Ok(a) => a.messages(),
                Err(f) => {
                    tracing::warn!(error = %f.0, "waiting for a permission verdict failed; trying again");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    continue;
                }
            };
            for m in messages {
                since = since.max(m.id);
                if m.kind.is(Meaning::Answer) && m.reply_to == Some(asked.id) {
                    return match m.body.trim().to_ascii_lowercase().as_str() {
                        "allow" => json!({"behavior": "allow", "updatedInput": input}),
                        _ => deny(format!("{} denied it on the relay (#{} on {channel})", m.sender, m.id)),
                    };
                }
            }
        }
        deny(format!(
            "no person answered within {} minutes (#{} on {channel} stays open)",
            PERMISSION_WAIT.as_secs() / 60,
            asked.id
        ))
    }

    /// The host asks whether its agent may use a tool: a PERMISSION message on the listened
    /// channel (the first, if several), for a human to decide. Without a listened channel the
    /// host's own prompt is the only one.
    pub async fn permission_request(&self, params: Option<Value>) {
        let p = params.unwrap_or(Value::Null);
        let field = |k: &str| {
            p[k].as_str()
                .map(|v| v.chars().take(PREVIEW_CHARS).collect::<String>())
                .unwrap_or_default()
        };
        let request_id = field("request_id");
        if request_id.is_empty() {
            tracing::warn!("a permission request without request_id was ignored");
            return;
        }
        let listened = self.listeners.lock().keys().next().cloned();
        let Some(channel) = listened.and_then(|c| ChannelName::parse(&c).ok()) else {
            tracing::warn!(request = %request_id, "a permission prompt arrived, but no channel is listened: only the host decides it");
            return;
        };
        let (tool, description, preview) = (field("tool_name"), field("description"), field("input_preview"));
        let mut body = format!("Allow {tool}? {description}");
        if !preview.is_empty() {
            body.push_str(&format!("\n{preview}"));
        }
        body.push_str(&format!("\n(request {request_id})"));
        // As the identity this session registered; else as its participant token's (the relay
        // fills the sender in), else as claude-code.
        let me = self.me.lock().clone();
        let mut message = NewMessage {
            sender: me.clone().unwrap_or_default(),
            kind: Some(Meaning::Permission.into()),
            body,
            recipient: Some(crosstalk_schema::message::ANY_HUMAN.to_owned()),
            ..NewMessage::default()
        };
        let mut posted = self.rest.post(&channel, message.clone()).await;
        if posted.is_err() && me.is_none() {
            message.sender = "claude-code".into();
            posted = self.rest.post(&channel, message).await;
        }
        if let Err(e) = &posted {
            tracing::warn!(request = %request_id, error = %e.0, "the permission prompt could not be posted");
        }
        if let Ok(id) = posted.map(|m| m.id) {
            tracing::info!(request = %request_id, channel = %channel, message = id, "permission prompt relayed");
            let mut pending = self.permissions.lock();
            pending.insert(id, request_id);
            while pending.len() > MAX_PENDING_PERMISSIONS {
                pending.pop_first();
            }
        }
    }

    fn arrived(&self, channel: &str, stream: &Mutex<Stream>, m: Message) {
        // A human's verdict on a prompt this session relayed goes back to the host, once.
        if m.kind.is(Meaning::Answer) {
            if let Some(request_id) = m.reply_to.and_then(|q| self.permissions.lock().remove(&q)) {
                let behavior = m.body.trim().to_ascii_lowercase();
                if crosstalk_schema::message::VERDICTS.contains(&behavior.as_str()) {
                    let params = json!({"request_id": request_id, "behavior": behavior});
                    let _ = self
                        .outbox
                        .send(CustomNotification::new(PERMISSION_VERDICT, Some(params)));
                }
            }
        }
        let mut st = stream.lock();
        st.last_id = st.last_id.max(m.id);
        if self.me.lock().as_deref() == Some(m.sender.as_str()) {
            return;
        }
        let mut meta = serde_json::Map::new();
        meta.insert("channel".into(), channel.into());
        meta.insert("sender".into(), m.sender.into());
        meta.insert("message_id".into(), m.id.to_string().into());
        meta.insert("type".into(), m.kind.as_str().into());
        if let Some(to) = m.recipient {
            meta.insert("recipient".into(), to.into());
        }
        if let Some(parent) = m.reply_to {
            meta.insert("reply_to".into(), parent.to_string().into());
        }
        let params = json!({"content": m.body, "meta": meta});
        if self
            .outbox
            .send(CustomNotification::new(CHANNEL_NOTIFICATION, Some(params)))
            .is_ok()
        {
            st.delivered += 1;
        }
    }

    /// What is pushed and what is not, and whether each stream is connected now.
    /// [`Live::status`], and what `crosstalk wake` does for this session's identity, if it runs
    /// its turns: `wake` is its state (`listening (wakes on messages)`, `working`, `paused by
    /// …`), or null.
    pub async fn status_and_wake(&self) -> Value {
        let mut status = self.status();
        let me = self.me.lock().clone();
        let mut wake = Value::Null;
        if let Some(me) = me {
            let all = crate::ops::wake::WakeListRequest {};
            let list = self.rest.call(crate::api::WAKE_LIST, &all);
            if let Ok(Ok(list)) = tokio::time::timeout(std::time::Duration::from_secs(2), list).await {
                if let Some(w) = list.woken.into_iter().find(|w| w.identity == me) {
                    wake = json!({"state": w.state, "held_by": w.held_by, "paused": w.paused});
                }
            }
        }
        status["wake"] = wake;
        status
    }

    pub fn status(&self) -> Value {
        let pushed: Vec<Stream> = self
            .listeners
            .lock()
            .values()
            .map(|l| l.stream.lock().clone())
            .collect();
        let poll_only: Vec<String> = self
            .used
            .lock()
            .iter()
            .filter(|c| !pushed.iter().any(|p| &p.channel == *c))
            .cloned()
            .collect();
        json!({
            "push": CHANNEL_NOTIFICATION,
            "host_attached": self.peer.borrow().is_some(),
            "identity": *self.me.lock(),
            "all_connected": pushed.iter().all(|p| p.connected),
            "pushed": pushed,
            "poll_only": poll_only,
            "note": format!(
                "Pushed channels arrive as notifications/claude/channel. Claude Code shows them only when \
                 started with channels enabled (research preview, 2.1.80 or later, signed in with claude.ai): \
                 `{}`; otherwise, and for poll-only channels, call check_messages or wait_for_message.",
                super::setup::CLAUDE_CODE_CHANNELS
            ),
        })
    }
}
