//! cross-claude-mcp's operations, which the `/cc` REST routes and the `/cc/mcp` tools both
//! run: cross-claude's arguments (`content`, `message_type`, `in_reply_to`, `after_id`, …),
//! defaults and answer shapes, and the rules that are cross-claude's own:
//! - a read without `after_id` is the channel's newest `limit` (20), whoever asks;
//! - a read with `after_id` is everything after it (bounded by `--max-answer-bytes`), and with
//!   `instance_id` too, without the instance's own messages and from no later than what it was
//!   last shown ([`floor`]), so a message that crossed its own send is not skipped;
//! - only what is shown to a named instance moves its read position, and only on the MCP
//!   tools (`check_messages`, `wait_for_reply`); REST reads move nothing.
//!
//! Everything else is the operation it calls: who may post, what a wait returns, how ids
//! are ordered.

use super::channels::{self, NoArgs, SearchRequest};
use super::identity::{self, RegisterRequest};
use super::messages::{self, PostRequest, RoleArg, WaitRequest};
use super::{Caller, Ctx, Limit, OpError, Operation};
use crosstalk_actors::{InstanceView, Posted, SharedSummary, WaitOutcome};
use crosstalk_schema::{ChannelName, InstanceId, InstanceKind, MessageType, NewMessage};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize};
use std::borrow::Cow;
use std::sync::Arc;

/// The channel cross-claude uses when none is named, and which exists from the start.
pub const DEFAULT_CHANNEL: &str = "general";
/// `general`'s description where the relay creates it.
pub const DEFAULT_CHANNEL_DESCRIPTION: &str = "Default channel for cross-instance communication";
/// cross-claude's message types; it refuses any other.
pub const MESSAGE_TYPES: [&str; 6] = ["message", "request", "response", "status", "handoff", "done"];
/// Channels whose recent senders `list_channels` names (`active_senders`); the rest say null,
/// so a listing of many channels does not open every one of them.
pub const SENDERS_OF_CHANNELS: usize = 200;
/// Messages per channel whose senders `active_senders` names.
pub const SENDERS_OF_MESSAGES: usize = 100;
/// How many of a channel's newest messages a read without `after_id` shows.
pub const NEWEST_DEFAULT: usize = 20;
/// What cross-claude's `check_messages` says after every list of messages.
pub const REMINDER: &str = "Reminder: unless this session was launched channels-enabled (cc-listen / \
    --channels), you only see messages when you poll. If this collaboration is ongoing, either block in \
    wait_for_reply now or tell the user you'll check again next time they prompt you — do not claim to be \
    \"listening\".";

/// A channel name as cross-claude takes it: a name crosstalk accepts is kept as it is (so a
/// channel made on `/api` is reachable from `/cc`); any other is normalized as cross-claude
/// does — lowercase, spaces and underscores become hyphens, other characters are dropped —
/// and refused if nothing is left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CcChannel(pub ChannelName);

impl CcChannel {
    pub fn parse(raw: &str) -> Result<CcChannel, OpError> {
        if let Ok(name) = ChannelName::parse(raw) {
            return Ok(CcChannel(name));
        }
        let mut out = String::new();
        for c in raw.trim().to_lowercase().chars() {
            let c = if c.is_whitespace() || c == '_' { '-' } else { c };
            if (c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') && !(c == '-' && out.ends_with('-')) {
                out.push(c);
            }
        }
        let out = out.trim_matches('-');
        ChannelName::parse(out).map(CcChannel).map_err(|_| {
            OpError::invalid(format!(
                "Invalid channel name {:?}. Use lowercase letters, numbers, and hyphens.",
                raw.chars().take(80).collect::<String>()
            ))
        })
    }
}

impl<'de> Deserialize<'de> for CcChannel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        CcChannel::parse(&raw).map_err(|e| serde::de::Error::custom(e.message))
    }
}

impl JsonSchema for CcChannel {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "CcChannel".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "minLength": 1 })
    }
}

fn general() -> CcChannel {
    CcChannel(ChannelName::parse(DEFAULT_CHANNEL).expect("the default channel's name is valid"))
}

/// Makes `general` exist, as it does on a fresh cross-claude server: the first time the
/// cross-claude face is used (crosstalk's own faces do not see it until then). Creating it
/// takes no message id. Once it exists, this is one look at its summary.
pub async fn ensure_general(cx: &Ctx) -> Result<(), OpError> {
    let name = general().0;
    if !cx.relay.channel_exists(&name)? {
        cx.relay.create_channel(&name, DEFAULT_CHANNEL_DESCRIPTION).await?;
    }
    Ok(())
}

/// A message in cross-claude's field names (plus crosstalk's reply count and status).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CcMessage {
    pub id: u64,
    pub channel: String,
    pub sender: String,
    pub content: String,
    /// message, request, response, status, handoff, done (or any of crosstalk's types).
    pub message_type: String,
    pub in_reply_to: Option<u64>,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub reply_count: u64,
    pub recipient: Option<String>,
    pub status: Option<String>,
}

impl From<&Arc<Posted>> for CcMessage {
    fn from(p: &Arc<Posted>) -> Self {
        let m = &p.message;
        CcMessage {
            id: m.id,
            channel: m.channel.clone(),
            sender: m.sender.clone(),
            content: m.body.clone(),
            message_type: m.kind.to_string(),
            in_reply_to: m.reply_to,
            created_at: m.created_at.clone(),
            reply_count: m.reply_count,
            recipient: m.recipient.clone(),
            status: m.status.clone(),
        }
    }
}

fn cc(messages: &[Arc<Posted>]) -> Vec<CcMessage> {
    messages.iter().map(CcMessage::from).collect()
}

/// Where a read for `who` after `after_id` starts: no later than what `who` was last shown on
/// the channel (its read position), as cross-claude takes the lower of the two. A client that
/// polls from its own send's id would otherwise never see a message that crossed it and took
/// a lower id. A read position of 0 is none (the client's `after_id` is trusted then).
async fn floor(cx: &Ctx, name: &ChannelName, after_id: u64, who: &str) -> Result<u64, OpError> {
    let shown = cx.relay.cursor(who, name).await?;
    Ok(if shown == 0 { after_id } else { after_id.min(shown) })
}

/// Every message with id > `after`, oldest first, without `skip`'s own: cross-claude's read
/// without a limit, bounded here by `--max-answer-bytes` and [`Limit::MAX`] messages (the
/// answer's last id is where the next read goes on). Moves no read position.
async fn everything_after(
    cx: &Ctx,
    name: &ChannelName,
    after: u64,
    skip: Option<&str>,
) -> Result<Vec<Arc<Posted>>, OpError> {
    let (page, _) = cx.relay.read_page(name, after, Limit::MAX, None).await?;
    Ok(page
        .into_iter()
        .filter(|p| Some(p.message.sender.as_str()) != skip)
        .collect())
}

/// The instance a call names, checked: a name live in another session is not this caller's.
fn named(cx: &Ctx, caller: &Caller, instance_id: Option<&str>) -> Result<Option<String>, OpError> {
    match instance_id.map(str::trim).filter(|w| !w.is_empty()) {
        Some(w) => caller.act_as(cx, w).map(Some),
        None => Ok(None),
    }
}

// ---- register

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CcRegisterRequest {
    /// Your name on the bus, e.g. "builder".
    pub instance_id: InstanceId,
    /// What you are working on.
    pub description: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CcRegistered {
    pub ok: bool,
    pub instance_id: String,
    /// crosstalk: the session the identity is bound to (`X-Crosstalk-Session`).
    pub session: String,
    /// The channels with messages, for the tool's text.
    #[serde(skip)]
    pub active: Vec<CcChannelRow>,
    /// The other instances online, with their descriptions, for the tool's text.
    #[serde(skip)]
    pub online: Vec<(String, Option<String>)>,
}

pub struct CcRegister;

impl Operation for CcRegister {
    const NAME: &'static str = "register";
    const DESCRIPTION: &'static str = "Register on the bus as instance_id (call first). Nobody else can use the \
        name while you are active.";
    const READ_ONLY: bool = false;
    type Request = CcRegisterRequest;
    type Response = CcRegistered;

    async fn run(cx: &Ctx, caller: Caller, r: CcRegisterRequest) -> Result<CcRegistered, OpError> {
        ensure_general(cx).await?;
        let done = identity::Register::run(
            cx,
            caller,
            RegisterRequest {
                instance_id: r.instance_id,
                description: r.description,
                kind: InstanceKind::Agent,
            },
        )
        .await?;
        let me = done.registered.instance.instance_id.clone();
        // The summary names no senders: no channel's messages are read to register.
        let active = rows(cx, None, Senders::Left)
            .await?
            .into_iter()
            .filter(|c| c.message_count > 0)
            .collect();
        let online = cx
            .relay
            .list_instances()
            .into_iter()
            .filter(|i| i.status == "online" && i.instance_id != me)
            .map(|i| (i.instance_id, i.description))
            .collect();
        Ok(CcRegistered {
            ok: true,
            instance_id: me,
            session: done.registered.session,
            active,
            online,
        })
    }
}

// ---- send_message

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendRequest {
    /// Channel (default general; created on first message).
    #[serde(default = "general")]
    pub channel: CcChannel,
    /// Your instance_id (default: the one you registered).
    #[serde(default)]
    pub sender: String,
    pub content: String,
    /// message (default), request, response, status, handoff, done.
    pub message_type: Option<String>,
    /// Id of the message this replies to.
    pub in_reply_to: Option<u64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Sent {
    pub ok: bool,
    pub id: u64,
    pub channel: String,
    pub message_type: String,
    /// Who it was sent as (for the tool's text; cross-claude's REST answer leaves it out).
    #[serde(skip)]
    pub sender: String,
}

pub struct SendMessage;

impl Operation for SendMessage {
    const NAME: &'static str = "send_message";
    const DESCRIPTION: &'static str = "Send a message to a channel (default general). Then wait_for_reply. Send \
        message_type done when finished.";
    const READ_ONLY: bool = false;
    type Request = SendRequest;
    type Response = Sent;

    async fn run(cx: &Ctx, caller: Caller, r: SendRequest) -> Result<Sent, OpError> {
        ensure_general(cx).await?;
        if let Some(t) = r.message_type.as_deref().filter(|t| !MESSAGE_TYPES.contains(t)) {
            return Err(OpError::invalid(format!(
                "message_type must be one of: {} (got {:?})",
                MESSAGE_TYPES.join(", "),
                t.chars().take(40).collect::<String>()
            )));
        }
        let posted = messages::Post::run(
            cx,
            caller,
            PostRequest {
                channel: r.channel.0,
                message: NewMessage {
                    sender: r.sender,
                    kind: match r.message_type.as_deref() {
                        Some(t) => MessageType::parse(t)?,
                        None => None,
                    },
                    body: r.content,
                    reply_to: r.in_reply_to,
                    ..NewMessage::default()
                },
            },
        )
        .await?;
        let m = &posted.message;
        Ok(Sent {
            ok: true,
            id: m.id,
            channel: m.channel.clone(),
            message_type: m.kind.to_string(),
            sender: m.sender.clone(),
        })
    }
}

// ---- getMessages / check_messages

#[derive(Debug, Deserialize, JsonSchema)]
pub struct MessagesRequest {
    #[serde(default = "general")]
    pub channel: CcChannel,
    /// Every message with id > after_id, oldest first; without it, the newest `limit`.
    pub after_id: Option<u64>,
    /// Your instance_id: with after_id, your own messages are left out. Moves no read
    /// position.
    pub instance_id: Option<String>,
    /// Without after_id: how many of the newest (default 20).
    pub limit: Option<Limit>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CcPage {
    pub messages: Vec<CcMessage>,
    /// The id of the last message returned (pass it as after_id next time); null when none.
    pub last_id: Option<u64>,
    /// The channel read, for the tool's text.
    #[serde(skip)]
    pub channel: Option<String>,
    /// It was a read of what is new (after an id), for the tool's text.
    #[serde(skip)]
    pub since: bool,
}

impl CcPage {
    fn new(messages: &[Arc<Posted>], channel: Option<&ChannelName>, since: bool) -> CcPage {
        CcPage {
            last_id: messages.last().map(|p| p.id()),
            messages: cc(messages),
            channel: channel.map(ToString::to_string),
            since,
        }
    }
}

pub struct GetMessages;

impl Operation for GetMessages {
    const NAME: &'static str = "get_messages";
    const DESCRIPTION: &'static str = "A channel's messages after after_id, or the newest limit (default 20). \
        Moves no read position.";
    const READ_ONLY: bool = true;
    type Request = MessagesRequest;
    type Response = CcPage;

    async fn run(cx: &Ctx, _: Caller, r: MessagesRequest) -> Result<CcPage, OpError> {
        ensure_general(cx).await?;
        let name = r.channel.0;
        let found = match r.after_id {
            // As cross-claude: an instance named with after_id does not get its own messages.
            Some(after) => {
                let skip = r.instance_id.as_deref().map(str::trim).filter(|w| !w.is_empty());
                everything_after(cx, &name, after, skip).await?
            }
            None => cx.relay.newest(&name, Limit::or(r.limit, NEWEST_DEFAULT), None).await?,
        };
        Ok(CcPage::new(&found, Some(&name), r.after_id.is_some()))
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CheckRequest {
    /// Channel to check (default general); call list_channels first if unsure.
    #[serde(default = "general")]
    pub channel: CcChannel,
    /// Only messages after this id (for polling): every one of them, oldest first.
    pub after_id: Option<u64>,
    /// Without after_id: how many of the newest to show (default 20).
    pub limit: Option<Limit>,
    /// Your instance_id: with after_id, your own messages are left out, and nothing after what
    /// you were last shown is skipped; what is shown to you moves your read position.
    pub instance_id: Option<String>,
}

pub struct CheckMessages;

impl Operation for CheckMessages {
    const NAME: &'static str = "check_messages";
    const DESCRIPTION: &'static str = "Check for new messages in a channel (default general). Use after_id to \
        only get messages newer than a specific message; without it, the newest limit. If you're unsure which \
        channel to check, call list_channels first.";
    const READ_ONLY: bool = false;
    type Request = CheckRequest;
    type Response = CcPage;

    async fn run(cx: &Ctx, caller: Caller, r: CheckRequest) -> Result<CcPage, OpError> {
        ensure_general(cx).await?;
        let name = r.channel.0;
        let who = named(cx, &caller, r.instance_id.as_deref())?;
        let found = match (r.after_id, who.as_deref()) {
            (Some(after), Some(me)) => {
                let from = floor(cx, &name, after, me).await?;
                everything_after(cx, &name, from, Some(me)).await?
            }
            (Some(after), None) => everything_after(cx, &name, after, None).await?,
            // The newest, whoever asks and whatever they have read.
            (None, _) => cx.relay.newest(&name, Limit::or(r.limit, NEWEST_DEFAULT), None).await?,
        };
        // Only what is shown moves the read position, and only that far.
        if let (Some(me), Some(last)) = (who.as_deref(), found.last()) {
            cx.relay.mark_read(me, &name, last.id());
        }
        Ok(CcPage::new(&found, Some(&name), r.after_id.is_some()))
    }
}

// ---- wait_for_reply

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitForReplyRequest {
    #[serde(default = "general")]
    pub channel: CcChannel,
    /// Your instance_id (default: the one you registered); your own messages do not wake you.
    pub instance_id: Option<String>,
    /// Wait for messages with id > after_id (default: what you have not read yet), from no
    /// later than what you were last shown. One already there is returned at once.
    pub after_id: Option<u64>,
    /// One wait's length in seconds when persistent is false (default 90).
    #[schemars(range(min = 0.0))]
    pub timeout_seconds: Option<f64>,
    /// Accepted for compatibility: crosstalk wakes a wait the moment a message is stored, it
    /// does not poll.
    #[allow(dead_code)]
    #[schemars(range(min = 0.0))]
    pub poll_interval_seconds: Option<f64>,
    /// active (default) or parked (a worker that never holds up the conversation).
    #[serde(default)]
    pub role: RoleArg,
    /// Keep waiting up to max_wait_minutes (default true); false: one wait of timeout_seconds.
    #[serde(default = "persistent")]
    pub persistent: bool,
    /// Longest wait, in minutes (capped at what a tool call survives; progress notifications
    /// keep it alive).
    #[schemars(range(min = 0.0))]
    pub max_wait_minutes: Option<f64>,
}

fn persistent() -> bool {
    true
}

/// A non-persistent wait's length when `timeout_seconds` is not given.
const WAIT_DEFAULT_S: f64 = 90.0;

#[derive(Debug, Serialize, JsonSchema)]
pub struct Reply {
    pub messages: Vec<CcMessage>,
    pub last_id: u64,
    /// messages, timeout, superseded, speak_first, done, shutting_down.
    pub outcome: WaitOutcome,
    pub hint: std::borrow::Cow<'static, str>,
    /// The channel waited on and for how long, for the tool's text.
    #[serde(skip)]
    pub channel: String,
    #[serde(skip)]
    pub waited_s: u64,
    #[serde(skip)]
    pub instance_id: Option<String>,
    /// It was a persistent wait (that ran to its ceiling, if it timed out).
    #[serde(skip)]
    pub persistent: bool,
}

pub struct WaitForReply;

impl Operation for WaitForReply {
    const NAME: &'static str = "wait_for_reply";
    const DESCRIPTION: &'static str = "Block until someone else posts on the channel (after after_id, or after \
        what you have read), or until max_wait_minutes (capped). One wait per channel: a new one replaces it.";
    const READ_ONLY: bool = true;
    const WAITS: bool = true;
    type Request = WaitForReplyRequest;
    type Response = Reply;

    async fn run(cx: &Ctx, caller: Caller, r: WaitForReplyRequest) -> Result<Reply, OpError> {
        let (reader, after) = WaitForReply::start(cx, &caller, &r).await?;
        let name = r.channel.0;
        let started = std::time::Instant::now();
        // The face caps either to what a tool call survives.
        let timeout_s = if r.persistent {
            r.max_wait_minutes.map_or(f64::MAX, |m| m * 60.0)
        } else {
            r.timeout_seconds.unwrap_or(WAIT_DEFAULT_S)
        };
        let waited = messages::Wait::run(
            cx,
            caller,
            WaitRequest {
                channel: name.clone(),
                since_id: after,
                // Every message there is, as cross-claude hands them (bounded by bytes).
                limit: Some(Limit::new(Limit::MAX)?),
                timeout_s: Some(timeout_s),
                instance_id: reader.clone(),
                role: r.role,
                exclude_self: None,
            },
        )
        .await?;
        Ok(Reply {
            // The last message shown, as cross-claude says it; where the wait looked up to
            // when it shows none.
            last_id: waited.messages.last().map_or(waited.next_since_id, |p| p.id()),
            messages: cc(&waited.messages),
            outcome: waited.outcome,
            hint: waited.hint,
            channel: name.to_string(),
            waited_s: started.elapsed().as_secs(),
            instance_id: reader,
            persistent: r.persistent,
        })
    }
}

impl WaitForReply {
    /// Who waits and from which id: what the call leaves to the session (the identity it
    /// registered as, what that identity has read) made explicit, as a task pins it when it
    /// is made so that running the wait again later starts from the same place.
    pub async fn start(cx: &Ctx, caller: &Caller, r: &WaitForReplyRequest) -> Result<(Option<String>, u64), OpError> {
        ensure_general(cx).await?;
        let name = &r.channel.0;
        let reader = caller.reader(cx, r.instance_id.as_deref())?;
        let after = match (r.after_id, reader.as_deref()) {
            (Some(after), Some(me)) => floor(cx, name, after, me).await?,
            (Some(after), None) => after,
            (None, Some(me)) => cx.relay.cursor(me, name).await?,
            // Anonymous: from now on.
            (None, None) => cx.relay.channel_last_id(name)?,
        };
        Ok((reader, after))
    }
}

// ---- get_replies

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RepliesRequest {
    /// The message's channel (optional: ids are unique across channels).
    pub channel: Option<CcChannel>,
    #[serde(alias = "id")]
    pub message_id: u64,
    /// Page size.
    pub limit: Option<Limit>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Thread {
    pub parent: CcMessage,
    pub replies: Vec<CcMessage>,
}

/// Channels looked through for a message named by id alone.
const FIND_MESSAGE_CHANNELS: usize = 1000;

pub struct GetReplies;

impl Operation for GetReplies {
    const NAME: &'static str = "get_replies";
    const DESCRIPTION: &'static str = "A message and its replies, oldest first.";
    const READ_ONLY: bool = true;
    type Request = RepliesRequest;
    type Response = Thread;

    async fn run(cx: &Ctx, caller: Caller, r: RepliesRequest) -> Result<Thread, OpError> {
        let id = r.message_id;
        // The channel named, if it holds the message; else anywhere (ids are unique across
        // channels), as cross-claude looks for it.
        let here = match &r.channel {
            Some(ch) => cx.relay.message(&ch.0, id).await?,
            None => None,
        };
        let parent = match here {
            Some(p) => p,
            None => {
                // Ids are unique across channels: the channel is one whose ids reach this far.
                let mut found = None;
                for (name, _) in cx
                    .relay
                    .list_channels()?
                    .iter()
                    .filter(|(_, meta)| meta.last_message_id >= id)
                    .take(FIND_MESSAGE_CHANNELS)
                {
                    if let Some(p) = cx.relay.message(name, id).await? {
                        found = Some(p);
                        break;
                    }
                }
                found.ok_or_else(|| OpError::not_found(format!("Message #{id} not found.")))?
            }
        };
        let channel = ChannelName::parse(&parent.message.channel).map_err(|e| OpError::invalid(e.to_string()))?;
        let replies = messages::Replies::run(
            cx,
            caller,
            messages::MessageRef {
                channel,
                message_id: id,
                // Every reply, as cross-claude answers, unless a page size is named.
                limit: Some(r.limit.unwrap_or(Limit::new(Limit::MAX)?)),
            },
        )
        .await?;
        Ok(Thread {
            parent: CcMessage::from(&parent),
            replies: cc(&replies.messages),
        })
    }
}

// ---- channels

/// A channel as cross-claude lists it, with crosstalk's `last_id` besides.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CcChannelRow {
    pub name: String,
    pub description: Option<String>,
    pub created_at: Option<String>,
    pub message_count: u64,
    pub last_message_at: Option<String>,
    /// Who posted among the channel's newest 100 messages, comma-separated (null beyond the
    /// 200 most recently active channels).
    pub active_senders: Option<String>,
    /// crosstalk: the id of the channel's newest event.
    pub last_id: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CcChannels {
    pub channels: Vec<CcChannelRow>,
    /// The query, for find_channel's text.
    #[serde(skip)]
    pub query: Option<String>,
    /// Every channel's name, for find_channel's text when nothing matches.
    #[serde(skip)]
    pub all: Vec<String>,
}

/// Whether a listing names each channel's recent senders (a read of up to
/// [`SENDERS_OF_MESSAGES`] messages per channel) or leaves them out, as `register`'s summary
/// does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Senders {
    Named,
    Left,
}

/// Channels as cross-claude answers them (crosstalk's listing, `Relay::find_channels`, with
/// each channel's recent senders if asked): most recently active first, then by name.
async fn rows(cx: &Ctx, query: Option<&str>, senders: Senders) -> Result<Vec<CcChannelRow>, OpError> {
    let mut out = Vec::new();
    for info in cx.relay.find_channels(query)? {
        let summary = info.summary;
        let description = info.description.filter(|d| !d.is_empty());
        let active_senders = if senders == Senders::Named && summary.count > 0 && out.len() < SENDERS_OF_CHANNELS {
            let name = ChannelName::parse(&summary.channel)?;
            let mut senders: Vec<String> = cx
                .relay
                .older(&name, u64::MAX, SENDERS_OF_MESSAGES)
                .await?
                .0
                .iter()
                .map(|p| p.message.sender.clone())
                .collect();
            senders.sort();
            senders.dedup();
            Some(senders.join(","))
        } else {
            None
        };
        out.push(CcChannelRow {
            name: summary.channel,
            description,
            created_at: summary.created_at,
            message_count: summary.count,
            last_message_at: summary.last_at.filter(|_| summary.count > 0),
            active_senders,
            last_id: summary.last_id,
        });
    }
    // Channels with messages first, newest activity first; the rest by name.
    out.sort_by(|a, b| {
        b.last_message_at
            .is_some()
            .cmp(&a.last_message_at.is_some())
            .then_with(|| b.last_id.cmp(&a.last_id).then_with(|| a.name.cmp(&b.name)))
    });
    Ok(out)
}

pub struct ListChannels;

impl Operation for ListChannels {
    const NAME: &'static str = "list_channels";
    const DESCRIPTION: &'static str = "Every channel with its message count, last activity and participants. Call \
        before your first send_message.";
    const READ_ONLY: bool = true;
    type Request = NoArgs;
    type Response = CcChannels;

    async fn run(cx: &Ctx, _: Caller, _: NoArgs) -> Result<CcChannels, OpError> {
        ensure_general(cx).await?;
        Ok(CcChannels {
            channels: rows(cx, None, Senders::Named).await?,
            query: None,
            all: Vec::new(),
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CcCreateRequest {
    /// Channel name (lowercase, hyphens).
    #[serde(alias = "channel")]
    pub name: CcChannel,
    /// What the channel is for.
    #[serde(default)]
    pub description: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Created {
    pub ok: bool,
    /// The channel's name, normalized.
    pub channel: String,
    #[serde(skip)]
    pub description: Option<String>,
    /// Other channels with a similar name, for the tool's text.
    #[serde(skip)]
    pub similar: Vec<String>,
}

/// Channels whose name looks like `name` (one contains the other, or at most two edits
/// apart), as cross-claude warns of them.
fn similar_channels(cx: &Ctx, name: &ChannelName) -> Result<Vec<String>, OpError> {
    let name = name.as_str();
    let mut out: Vec<String> = cx
        .relay
        .list_channels()?
        .into_iter()
        .map(|(c, _)| c.to_string())
        .filter(|c| c != name && (c.contains(name) || name.contains(c.as_str()) || edits(c, name) <= 2))
        .collect();
    out.sort();
    Ok(out)
}

/// Levenshtein distance.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

pub struct CreateChannel;

impl Operation for CreateChannel {
    const NAME: &'static str = "create_channel";
    const DESCRIPTION: &'static str = "Create a channel; one that exists keeps its description. Check \
        list_channels first.";
    const READ_ONLY: bool = false;
    type Request = CcCreateRequest;
    type Response = Created;

    async fn run(cx: &Ctx, caller: Caller, r: CcCreateRequest) -> Result<Created, OpError> {
        let description = r.description.filter(|d| !d.is_empty());
        let name = r.name.0;
        let mut similar = similar_channels(cx, &name)?;
        // As cross-claude's INSERT OR IGNORE: an existing channel is left as it is.
        if !cx.relay.channel_exists(&name)? {
            channels::CreateChannel::run(
                cx,
                caller,
                channels::CreateRequest {
                    name: name.clone(),
                    description: description.clone().unwrap_or_default(),
                },
            )
            .await?;
        }
        similar.retain(|c| c != name.as_str());
        Ok(Created {
            ok: true,
            channel: name.to_string(),
            description,
            similar,
        })
    }
}

/// The tools' `query` (and `limit`) for the two searches.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Query {
    /// Words to look for (case-insensitive).
    #[serde(alias = "q")]
    pub query: String,
    pub limit: Option<Limit>,
}

/// REST's `?q=` (and `limit`) for the two searches.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct QueryQ {
    /// Words to look for (case-insensitive).
    #[serde(alias = "query")]
    pub q: String,
    pub limit: Option<Limit>,
}

impl From<QueryQ> for Query {
    fn from(r: QueryQ) -> Query {
        Query {
            query: r.q,
            limit: r.limit,
        }
    }
}

/// cross-claude's answer to a search without words.
fn needed(query: &str) -> Result<(), OpError> {
    if query.trim().is_empty() {
        return Err(OpError::invalid("q (query) parameter is required"));
    }
    Ok(())
}

pub struct FindChannelByQ;

impl Operation for FindChannelByQ {
    const NAME: &'static str = "find_channel";
    const DESCRIPTION: &'static str = "Channels whose name or description contains q.";
    const READ_ONLY: bool = true;
    type Request = QueryQ;
    type Response = CcChannels;

    async fn run(cx: &Ctx, caller: Caller, r: QueryQ) -> Result<CcChannels, OpError> {
        FindChannel::run(cx, caller, r.into()).await
    }
}

pub struct SearchByQ;

impl Operation for SearchByQ {
    const NAME: &'static str = "search_messages";
    const DESCRIPTION: &'static str = "Messages containing every word of q (of the best matches, the newest first; \
        default 10).";
    const READ_ONLY: bool = true;
    type Request = QueryQ;
    type Response = Found;

    async fn run(cx: &Ctx, caller: Caller, r: QueryQ) -> Result<Found, OpError> {
        SearchMessages::run(cx, caller, r.into()).await
    }
}

pub struct FindChannel;

impl Operation for FindChannel {
    const NAME: &'static str = "find_channel";
    const DESCRIPTION: &'static str = "Channels whose name or description contains query.";
    const READ_ONLY: bool = true;
    type Request = Query;
    type Response = CcChannels;

    async fn run(cx: &Ctx, _: Caller, r: Query) -> Result<CcChannels, OpError> {
        ensure_general(cx).await?;
        needed(&r.query)?;
        // Every match, as cross-claude answers, unless the caller names a `limit`.
        let mut channels = rows(cx, Some(&r.query), Senders::Named).await?;
        channels.truncate(Limit::or(r.limit, usize::MAX));
        let all = if channels.is_empty() {
            let mut all: Vec<String> = cx
                .relay
                .list_channels()?
                .into_iter()
                .map(|(c, _)| c.to_string())
                .collect();
            all.sort();
            all
        } else {
            Vec::new()
        };
        Ok(CcChannels {
            channels,
            query: Some(r.query),
            all,
        })
    }
}

// ---- instances

#[derive(Debug, Serialize, JsonSchema)]
pub struct CcInstances {
    /// Most recently seen first.
    pub instances: Vec<InstanceView>,
}

pub struct ListInstances;

impl Operation for ListInstances {
    const NAME: &'static str = "list_instances";
    const DESCRIPTION: &'static str = "Every registered instance, online or offline, most recently seen first.";
    const READ_ONLY: bool = true;
    type Request = NoArgs;
    type Response = CcInstances;

    async fn run(cx: &Ctx, _: Caller, _: NoArgs) -> Result<CcInstances, OpError> {
        let mut instances = cx.relay.list_instances();
        instances.sort_by(|a, b| {
            b.last_seen
                .cmp(&a.last_seen)
                .then_with(|| a.instance_id.cmp(&b.instance_id))
        });
        Ok(CcInstances { instances })
    }
}

// ---- search

#[derive(Debug, Serialize, JsonSchema)]
pub struct Found {
    pub messages: Vec<CcMessage>,
    #[serde(skip)]
    pub query: String,
}

pub struct SearchMessages;

impl Operation for SearchMessages {
    const NAME: &'static str = "search_messages";
    const DESCRIPTION: &'static str = "Messages containing every word of query (of the best matches, the newest \
        first; default 10).";
    const READ_ONLY: bool = true;
    type Request = Query;
    type Response = Found;

    async fn run(cx: &Ctx, caller: Caller, r: Query) -> Result<Found, OpError> {
        needed(&r.query)?;
        let found = channels::Search::run(
            cx,
            caller,
            SearchRequest {
                query: r.query.clone(),
                channel: None,
                sender: None,
                kind: None,
                since: None,
                until: None,
                // The best matches, of which the newest are shown, as cross-claude orders them.
                limit: Some(Limit::new((Limit::or(r.limit, 10) * 10).min(Limit::MAX))?),
            },
        )
        .await?;
        let mut messages = found.messages;
        messages.sort_by_key(|p| std::cmp::Reverse(p.id()));
        messages.truncate(Limit::or(r.limit, 10));
        Ok(Found {
            messages: cc(&messages),
            query: r.query,
        })
    }
}

// ---- shared data

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CcShareRequest {
    pub key: String,
    pub content: String,
    /// Your instance_id (the owner; default: the one you registered).
    #[serde(alias = "owner", alias = "instance_id")]
    pub sender: Option<String>,
    pub description: Option<String>,
}

/// What `share_data` answers: cross-claude's `ok`, `key`, `size_bytes`, with crosstalk's
/// version and owner besides.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CcShared {
    pub ok: bool,
    pub key: String,
    pub size_bytes: usize,
    pub owner: String,
    pub version: u64,
}

pub struct ShareData;

impl Operation for ShareData {
    const NAME: &'static str = "share_data";
    const DESCRIPTION: &'static str = "Store large content (over ~500 chars) under a key for the others; send \
        the key in a message.";
    const READ_ONLY: bool = false;
    type Request = CcShareRequest;
    type Response = CcShared;

    async fn run(cx: &Ctx, caller: Caller, r: CcShareRequest) -> Result<CcShared, OpError> {
        let owner = caller.identity(cx, r.sender.as_deref())?;
        let s: SharedSummary =
            super::shared::share(cx, &caller.principal, &owner, &r.key, r.content, r.description).await?;
        Ok(CcShared {
            ok: true,
            key: s.key,
            size_bytes: s.size,
            owner: s.owner,
            version: s.version,
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CcKey {
    pub key: String,
}

/// A shared entry in cross-claude's fields (`created_by`, `created_at`), with crosstalk's
/// version besides.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CcEntry {
    pub key: String,
    pub content: String,
    pub created_by: String,
    pub description: Option<String>,
    pub created_at: String,
    pub version: u64,
}

pub struct GetSharedData;

impl Operation for GetSharedData {
    const NAME: &'static str = "get_shared_data";
    const DESCRIPTION: &'static str = "Read what another instance stored with share_data.";
    const READ_ONLY: bool = true;
    type Request = CcKey;
    type Response = CcEntry;

    async fn run(cx: &Ctx, _: Caller, r: CcKey) -> Result<CcEntry, OpError> {
        let d = cx.relay.get_shared_data(&r.key, None).await.map_err(|e| {
            let e = OpError::from(e);
            if e.kind == super::ErrorKind::NotFound {
                OpError::not_found(format!("No shared data for key {:?}", r.key))
            } else {
                e
            }
        })?;
        Ok(CcEntry {
            key: d.key,
            content: d.content,
            created_by: d.owner,
            description: d.description,
            created_at: d.updated_at.to_rfc3339(),
            version: d.version,
        })
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CcItem {
    pub key: String,
    pub created_by: String,
    pub description: Option<String>,
    pub size_bytes: usize,
    pub created_at: String,
    pub version: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CcItems {
    /// Newest first.
    pub items: Vec<CcItem>,
}

pub struct ListSharedData;

impl Operation for ListSharedData {
    const NAME: &'static str = "list_shared_data";
    const DESCRIPTION: &'static str = "Every shared key with its owner, description and size.";
    const READ_ONLY: bool = true;
    type Request = NoArgs;
    type Response = CcItems;

    async fn run(cx: &Ctx, _: Caller, _: NoArgs) -> Result<CcItems, OpError> {
        let mut items: Vec<CcItem> = cx
            .relay
            .list_shared_data()
            .await?
            .into_iter()
            .filter(|s| !s.deleted)
            .map(|s| CcItem {
                key: s.key,
                created_by: s.owner,
                description: s.description,
                size_bytes: s.size,
                created_at: s.updated_at,
                version: s.version,
            })
            .collect();
        items.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| a.key.cmp(&b.key)));
        Ok(CcItems { items })
    }
}

// ---- subscribe / unsubscribe

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SubscribeRequest {
    pub channel: CcChannel,
    /// Your instance_id (default: the one you registered).
    pub instance_id: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Subscription {
    pub ok: bool,
    pub channel: String,
    pub instance_id: String,
    pub subscribed: bool,
}

/// Joins (`subscribe`) or leaves (`unsubscribe`) a channel's share of the caller's inbox.
async fn membership(cx: &Ctx, caller: Caller, r: SubscribeRequest, join: bool) -> Result<Subscription, OpError> {
    let name = r.channel.0;
    let who = caller.identity(cx, r.instance_id.as_deref())?;
    if join {
        cx.relay.join(&who, &name).await?;
    } else {
        cx.relay.leave_channel(&who, &name).await?;
    }
    Ok(Subscription {
        ok: true,
        channel: name.to_string(),
        instance_id: who,
        subscribed: join,
    })
}

pub struct Subscribe;

impl Operation for Subscribe {
    const NAME: &'static str = "subscribe";
    const DESCRIPTION: &'static str = "Register interest in a channel (crosstalk: it joins your inbox). Live \
        delivery needs a session launched with crosstalk mcp's listen_live; otherwise poll.";
    const READ_ONLY: bool = false;
    type Request = SubscribeRequest;
    type Response = Subscription;

    async fn run(cx: &Ctx, caller: Caller, r: SubscribeRequest) -> Result<Subscription, OpError> {
        membership(cx, caller, r, true).await
    }
}

pub struct Unsubscribe;

impl Operation for Unsubscribe {
    const NAME: &'static str = "unsubscribe";
    const DESCRIPTION: &'static str = "Drop interest in a channel (crosstalk: it leaves your inbox).";
    const READ_ONLY: bool = false;
    type Request = SubscribeRequest;
    type Response = Subscription;

    async fn run(cx: &Ctx, caller: Caller, r: SubscribeRequest) -> Result<Subscription, OpError> {
        membership(cx, caller, r, false).await
    }
}
