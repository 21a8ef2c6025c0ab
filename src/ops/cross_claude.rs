//! cross-claude-mcp's operations, which the `/cc` REST routes and the `/cc/mcp` tools both
//! run: cross-claude's arguments (`content`, `message_type`, `in_reply_to`, `after_id`, …) and
//! answer shapes, and the rules that are cross-claude's own — a read without `after_id`
//! starts at the reader's cursor ([`start`]), `subscribe` and `unsubscribe` join and leave a
//! channel's share of the inbox, `get_messages` without `after_id` is the newest `limit`.
//! Everything else is the operation it calls: who may post, what a wait returns, how ids
//! are ordered.

use super::channels::{self, CreateRequest, FindRequest, FoundChannels, SearchRequest};
use super::identity::{self, InboxRequest, RegisterRequest};
use super::messages::{self, MessageRef, PostRequest, RoleArg, WaitRequest};
use super::{Caller, Ctx, Limit, OpError, Operation};
use crosstalk_actors::{ChannelInfo, Posted, WaitOutcome};
use crosstalk_schema::{ChannelName, InstanceId, InstanceKind, NewMessage};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The channel cross-claude uses when none is named.
pub const DEFAULT_CHANNEL: &str = "general";

fn general() -> ChannelName {
    ChannelName::parse(DEFAULT_CHANNEL).expect("the default channel's name is valid")
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
            message_type: m.kind.clone(),
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

/// Where a read without `after_id` starts: after what the reader has read (its cursor), or,
/// for an anonymous reader, `anonymous()`.
async fn start(
    cx: &Ctx,
    name: &ChannelName,
    after_id: Option<u64>,
    reader: Option<&str>,
    anonymous: impl FnOnce() -> Result<u64, OpError>,
) -> Result<u64, OpError> {
    match (after_id, reader) {
        (Some(a), _) => Ok(a),
        (None, Some(who)) => Ok(cx.relay.cursor(who, name).await?),
        (None, None) => anonymous(),
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
}

pub struct Register;

impl Operation for Register {
    const NAME: &'static str = "register";
    const DESCRIPTION: &'static str = "Register on the bus as instance_id (call first). Nobody else can use the \
        name while you are active.";
    const READ_ONLY: bool = false;
    type Request = CcRegisterRequest;
    type Response = CcRegistered;

    async fn run(cx: &Ctx, caller: Caller, r: CcRegisterRequest) -> Result<CcRegistered, OpError> {
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
        Ok(CcRegistered {
            ok: true,
            instance_id: done.instance.instance_id.clone(),
            session: done.session,
        })
    }
}

// ---- send_message

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendRequest {
    /// Channel (default general; created on first message).
    #[serde(default = "general")]
    pub channel: ChannelName,
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
        let posted = messages::Post::run(
            cx,
            caller,
            PostRequest {
                channel: r.channel,
                message: NewMessage {
                    sender: r.sender,
                    kind: r.message_type,
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
            message_type: m.kind.clone(),
        })
    }
}

// ---- getMessages / check_messages

#[derive(Debug, Deserialize, JsonSchema)]
pub struct MessagesRequest {
    #[serde(default = "general")]
    pub channel: ChannelName,
    /// Messages with id > after_id, oldest first; without it, the newest `limit`.
    pub after_id: Option<u64>,
    /// Your instance_id: your read position moves on.
    pub instance_id: Option<String>,
    pub limit: Option<Limit>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CcPage {
    pub messages: Vec<CcMessage>,
    /// The largest id returned (pass it as after_id next time); 0 when there is none.
    pub last_id: u64,
}

pub struct GetMessages;

impl Operation for GetMessages {
    const NAME: &'static str = "get_messages";
    const DESCRIPTION: &'static str = "A channel's messages after after_id, or the newest limit.";
    const READ_ONLY: bool = true;
    type Request = MessagesRequest;
    type Response = CcPage;

    async fn run(cx: &Ctx, caller: Caller, r: MessagesRequest) -> Result<CcPage, OpError> {
        let name = r.channel;
        let limit = caller.limit(r.limit);
        let reader = caller.reader(cx, r.instance_id.as_deref())?;
        let found = match r.after_id {
            Some(after) => cx.relay.read(&name, after, limit, reader.as_deref()).await?,
            None => cx.relay.newest(&name, limit, reader.as_deref()).await?,
        };
        Ok(CcPage {
            last_id: found.last().map_or(r.after_id.unwrap_or(0), |p| p.id()),
            messages: cc(&found),
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CheckRequest {
    /// A channel; without one, what is new for you on every channel you joined.
    pub channel: Option<ChannelName>,
    /// Your instance_id (default: the one you registered).
    pub instance_id: Option<String>,
    /// Messages with id > after_id; without it, those you have not read yet.
    pub after_id: Option<u64>,
    pub limit: Option<Limit>,
}

pub struct CheckMessages;

impl Operation for CheckMessages {
    const NAME: &'static str = "check_messages";
    const DESCRIPTION: &'static str = "What is new for you: on one channel (since after_id, or since you last \
        read it), or on every channel you joined. Never returns a message twice.";
    const READ_ONLY: bool = false;
    type Request = CheckRequest;
    type Response = CcPage;

    async fn run(cx: &Ctx, caller: Caller, r: CheckRequest) -> Result<CcPage, OpError> {
        let Some(ch) = r.channel else {
            let inbox = identity::Inbox::run(
                cx,
                caller,
                InboxRequest {
                    instance_id: r.instance_id,
                    limit: r.limit,
                },
            )
            .await?;
            return Ok(CcPage {
                last_id: inbox.messages.iter().map(|p| p.id()).max().unwrap_or(0),
                messages: cc(&inbox.messages),
            });
        };
        let name = ch;
        let limit = caller.limit(r.limit);
        let reader = caller.reader(cx, r.instance_id.as_deref())?;
        // Anonymous: from the start.
        let after = start(cx, &name, r.after_id, reader.as_deref(), || Ok(0)).await?;
        let found = cx.relay.read(&name, after, limit, reader.as_deref()).await?;
        Ok(CcPage {
            last_id: found.last().map_or(after, |p| p.id()),
            messages: cc(&found),
        })
    }
}

// ---- wait_for_reply

#[derive(Debug, Deserialize, JsonSchema)]
pub struct WaitForReplyRequest {
    #[serde(default = "general")]
    pub channel: ChannelName,
    /// Your instance_id (default: the one you registered); your own messages do not wake you.
    pub instance_id: Option<String>,
    /// Wait for messages with id > after_id (default: what you have not read yet).
    pub after_id: Option<u64>,
    /// active (default) or parked (a worker that never holds up the conversation).
    #[serde(default)]
    pub role: RoleArg,
    /// Accepted for compatibility: every wait already lasts up to max_wait_minutes (capped at
    /// what a tool call survives; progress notifications keep it alive).
    #[serde(default)]
    #[allow(dead_code)]
    pub persistent: bool,
    /// Longest wait, in minutes.
    #[schemars(range(min = 0.0))]
    pub max_wait_minutes: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Reply {
    pub messages: Vec<CcMessage>,
    pub last_id: u64,
    /// messages, timeout, superseded, speak_first, done, shutting_down.
    pub outcome: WaitOutcome,
    pub hint: &'static str,
}

pub struct WaitForReply;

impl Operation for WaitForReply {
    const NAME: &'static str = "wait_for_reply";
    const DESCRIPTION: &'static str = "Block until someone else posts on the channel (after after_id, or after \
        what you have read), or until max_wait_minutes (capped). One wait per channel: a new one replaces it.";
    const READ_ONLY: bool = true;
    type Request = WaitForReplyRequest;
    type Response = Reply;

    async fn run(cx: &Ctx, caller: Caller, r: WaitForReplyRequest) -> Result<Reply, OpError> {
        let reader = caller.reader(cx, r.instance_id.as_deref())?;
        // Anonymous: from now on.
        let after = start(cx, &r.channel, r.after_id, reader.as_deref(), || {
            Ok(cx.relay.channel_last_id(&r.channel)?)
        })
        .await?;
        let waited = messages::Wait::run(
            cx,
            caller,
            WaitRequest {
                channel: r.channel,
                since_id: after,
                limit: None,
                // The face caps it to what a tool call survives.
                timeout_s: r.max_wait_minutes.map(|m| m * 60.0).or(Some(f64::MAX)),
                instance_id: reader,
                role: r.role,
                exclude_self: None,
            },
        )
        .await?;
        Ok(Reply {
            last_id: waited.next_since_id,
            messages: cc(&waited.messages),
            outcome: waited.outcome,
            hint: waited.hint,
        })
    }
}

// ---- get_replies

#[derive(Debug, Serialize, JsonSchema)]
pub struct Thread {
    pub parent: CcMessage,
    pub replies: Vec<CcMessage>,
}

pub struct GetReplies;

impl Operation for GetReplies {
    const NAME: &'static str = "get_replies";
    const DESCRIPTION: &'static str = "A message and its replies, oldest first.";
    const READ_ONLY: bool = true;
    type Request = MessageRef;
    type Response = Thread;

    async fn run(cx: &Ctx, caller: Caller, r: MessageRef) -> Result<Thread, OpError> {
        let parent = messages::existing(cx, &r.channel, r.message_id).await?;
        let replies = messages::Replies::run(cx, caller, r).await?;
        Ok(Thread {
            parent: CcMessage::from(&parent),
            replies: cc(&replies.messages),
        })
    }
}

// ---- channels

#[derive(Debug, Serialize, JsonSchema)]
pub struct Created {
    pub ok: bool,
    pub channel: ChannelInfo,
}

pub struct CreateChannel;

impl Operation for CreateChannel {
    const NAME: &'static str = "create_channel";
    const DESCRIPTION: &'static str = "Create a channel (or set its description). Check list_channels first.";
    const READ_ONLY: bool = false;
    type Request = CreateRequest;
    type Response = Created;

    async fn run(cx: &Ctx, caller: Caller, r: CreateRequest) -> Result<Created, OpError> {
        Ok(Created {
            ok: true,
            channel: channels::CreateChannel::run(cx, caller, r).await?,
        })
    }
}

// `list_channels`, `find_channel`, `list_instances` and the shared-data tools are the
// operations themselves: their answers are cross-claude's shapes already (`{channels}`,
// `{instances}`, an entry).

/// REST's `?q=` (and `limit`) for the two searches.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Query {
    /// Words to look for (case-insensitive).
    #[serde(alias = "query")]
    pub q: String,
    pub limit: Option<Limit>,
}

pub struct FindChannelByQ;

impl Operation for FindChannelByQ {
    const NAME: &'static str = "find_channel";
    const DESCRIPTION: &'static str = "Channels whose name or description contains q.";
    const READ_ONLY: bool = true;
    type Request = Query;
    type Response = FoundChannels;

    async fn run(cx: &Ctx, caller: Caller, r: Query) -> Result<FoundChannels, OpError> {
        // Every match, as cross-claude answers, unless the caller names a `limit`.
        let limit = Limit::or(r.limit, usize::MAX);
        let mut found = channels::FindChannel::run(cx, caller, FindRequest { query: r.q }).await?;
        found.channels.truncate(limit);
        Ok(found)
    }
}

pub struct SearchByQ;

impl Operation for SearchByQ {
    const NAME: &'static str = "search_messages";
    const DESCRIPTION: &'static str = "Messages containing every word of q, newest first.";
    const READ_ONLY: bool = true;
    type Request = Query;
    type Response = Found;

    async fn run(cx: &Ctx, caller: Caller, r: Query) -> Result<Found, OpError> {
        SearchMessages::run(
            cx,
            caller,
            SearchRequest {
                query: r.q,
                channel: None,
                sender: None,
                kind: None,
                limit: r.limit,
            },
        )
        .await
    }
}

// ---- search

#[derive(Debug, Serialize, JsonSchema)]
pub struct Found {
    pub messages: Vec<CcMessage>,
}

pub struct SearchMessages;

impl Operation for SearchMessages {
    const NAME: &'static str = "search_messages";
    const DESCRIPTION: &'static str = "Messages containing every word of query, newest first.";
    const READ_ONLY: bool = true;
    type Request = SearchRequest;
    type Response = Found;

    async fn run(cx: &Ctx, caller: Caller, r: SearchRequest) -> Result<Found, OpError> {
        let found = channels::Search::run(cx, caller, r).await?;
        Ok(Found {
            messages: cc(&found.messages),
        })
    }
}

// ---- subscribe / unsubscribe

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SubscribeRequest {
    pub channel: ChannelName,
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
    let name = r.channel;
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
    const DESCRIPTION: &'static str = "Join a channel: check_messages without a channel then includes what is \
        posted there from now on.";
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
    const DESCRIPTION: &'static str = "Leave a channel: check_messages without a channel no longer includes it.";
    const READ_ONLY: bool = false;
    type Request = SubscribeRequest;
    type Response = Subscription;

    async fn run(cx: &Ctx, caller: Caller, r: SubscribeRequest) -> Result<Subscription, OpError> {
        membership(cx, caller, r, false).await
    }
}
