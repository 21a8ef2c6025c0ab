//! The coordination tools: identity, sessions, human Q&A, threads, inbox, shared data, channel
//! finding and search. Each calls the same [`crosstalk_actors::Relay`] operation as REST.
//! Descriptions and schemas are kept short: `tools/list` is part of every agent's context.

use super::tools::{act_as, capped_timeout, channel, limit, route, Cx, NoArgs, Output, Route, ToolError};
use crate::rest::coord::session_value;
use crate::rest::messages_value;
use crosstalk_actors::search::Query;
use crosstalk_actors::Posted;
use crosstalk_schema::{InstanceKind, NewMessage};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// `ask_human` wait when the caller names no `timeout_s`.
const DEFAULT_ASK_SECS: f64 = 50.0;

/// `{"type":"object","properties":{name: {"type": t}}}`: a compact output schema.
fn obj(fields: &[(&str, &str)]) -> Value {
    let props: serde_json::Map<String, Value> = fields
        .iter()
        .map(|(k, t)| (k.to_string(), json!({ "type": t })))
        .collect();
    json!({ "type": "object", "properties": props })
}

fn listing(found: &[Arc<Posted>], what: &str) -> Result<Output, ToolError> {
    let mut text = format!("{} {what}", found.len());
    for p in found {
        let m = &p.message;
        text.push_str(&format!(
            "\n#{} {} {} [{}]: {}",
            m.id, m.channel, m.sender, m.kind, m.body
        ));
    }
    Ok(Output {
        structured: json!({ "messages": messages_value(found) }),
        text,
    })
}

fn identity(cx: &Cx, given: Option<&str>) -> Result<String, ToolError> {
    let who = match given.map(str::trim).filter(|g| !g.is_empty()) {
        Some(g) => g.to_owned(),
        None => cx
            .bound
            .lock()
            .clone()
            .ok_or_else(|| ToolError("call register first (or pass instance_id)".into()))?,
    };
    act_as(cx, &who)
}

pub(crate) fn routes() -> Vec<Route> {
    vec![
        route("register", "Register this session as instance_id (agent or human). The session keeps it; nobody else can use it while you are active.",
            obj(&[("instance_id", "string"), ("kind", "string"), ("status", "string"), ("session", "string")]), false, register),
        route("list_instances", "Registered agents and humans with online/offline status.",
            obj(&[("instances", "array")]), true, list_instances),
        route("check_messages", "What is new for you (registered) on every channel you joined: messages from others to you or everyone. Each is returned once.",
            obj(&[("messages", "array")]), false, check_messages),
        route("create_channel", "Create a channel with a description (or update it).",
            obj(&[("channel", "string"), ("description", "string")]), false, create_channel),
        route("find_channel", "Find channels whose name or description contains query.",
            obj(&[("channels", "array")]), true, find_channel),
        route("get_replies", "The thread under a message: messages whose reply_to is message_id.",
            obj(&[("messages", "array")]), true, get_replies),
        route("search_messages", "Messages containing every word of query, newest first; filter by channel, sender, type.",
            obj(&[("messages", "array")]), true, search_messages),
        route("start_session", "Start a session on a channel: turns are counted; it ends at max_turns or when two participants post done.",
            obj(&[("session_id", "string"), ("active", "boolean"), ("turns", "integer")]), false, start_session),
        route("end_session", "End the channel's session now (it also ends by itself at max_turns or on two dones).",
            obj(&[("session_id", "string"), ("active", "boolean")]), false, end_session),
        route("get_session", "The channel's session: id, active, turns, max_turns, end_reason.",
            obj(&[("session_id", "string"), ("active", "boolean"), ("turns", "integer")]), true, get_session),
        route("get_directives", "INTERRUPT and DIRECTIVE messages after since_id and open QUESTIONs, for recipient (or everyone). Check it between steps.",
            obj(&[("directives", "array"), ("open_questions", "array"), ("next_since_id", "integer")]), true, get_directives),
        route("ask_human", "Post a QUESTION and block until an ANSWER replies to it (or timeout_s passes; then poll get_directives).",
            obj(&[("question", "object"), ("answered", "boolean"), ("answer", "object")]), false, ask_human),
        route("share_data", "Publish content under key (drafts, specs, diffs; up to 1 MiB). Only the owner can change it; versions are kept.",
            obj(&[("key", "string"), ("version", "integer"), ("owner", "string")]), false, share_data),
        route("get_shared_data", "Read shared data by key (the current or a given version).",
            obj(&[("key", "string"), ("content", "string"), ("version", "integer"), ("owner", "string")]), true, get_shared_data),
        route("list_shared_data", "Shared data keys with owner, description, size, version.",
            obj(&[("entries", "array")]), true, list_shared_data),
        route("delete_shared_data", "Delete your shared data key (earlier versions stay readable).",
            obj(&[("key", "string"), ("version", "integer")]), false, delete_shared_data),
    ]
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterArgs {
    pub instance_id: String,
    #[serde(default)]
    pub description: Option<String>,
    /// agent (default) or human.
    #[serde(default)]
    pub kind: Option<String>,
}

async fn register(cx: Cx, a: RegisterArgs) -> Result<Output, ToolError> {
    let who = act_as(&cx, &a.instance_id)?;
    let kind = InstanceKind::parse(a.kind.as_deref())?;
    let r = cx.relay.register(&who, a.description, kind, cx.session.clone()).await?;
    *cx.bound.lock() = Some(r.instance.instance_id.clone());
    let text = format!(
        "Registered as {}. Post with sender={0}; waits skip your own messages.",
        r.instance.instance_id
    );
    Ok(Output {
        structured: serde_json::to_value(&r).unwrap_or_default(),
        text,
    })
}

async fn list_instances(cx: Cx, _: NoArgs) -> Result<Output, ToolError> {
    let list = cx.relay.list_instances().await?;
    let text = list
        .iter()
        .map(|i| format!("{} ({:?}, {})", i.instance_id, i.kind, i.status))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(Output {
        structured: json!({ "instances": list }),
        text: if text.is_empty() { "no instances".into() } else { text },
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxArgs {
    #[serde(default)]
    pub instance_id: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
}

async fn check_messages(cx: Cx, a: InboxArgs) -> Result<Output, ToolError> {
    let who = identity(&cx, a.instance_id.as_deref())?;
    cx.relay.authorize(&who, cx.session.as_deref()).await?;
    let found = cx.relay.inbox(&who, limit(a.limit)?).await?;
    listing(&found, "new message(s)")
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

async fn create_channel(cx: Cx, a: CreateArgs) -> Result<Output, ToolError> {
    let name = channel(&a.name)?;
    let info = cx.relay.create_channel(&name, &a.description).await?;
    Ok(Output {
        text: format!("Channel {name} is ready."),
        structured: serde_json::to_value(&info).unwrap_or_default(),
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindArgs {
    pub query: String,
}

async fn find_channel(cx: Cx, a: FindArgs) -> Result<Output, ToolError> {
    let found = cx.relay.find_channels(&a.query).await?;
    let text = found
        .iter()
        .map(|c| format!("{}: {}", c.summary.channel, c.description.as_deref().unwrap_or("")))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(Output {
        structured: json!({ "channels": found }),
        text: if text.is_empty() {
            "no channel matches".into()
        } else {
            text
        },
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RepliesArgs {
    pub channel: String,
    pub message_id: u64,
}

async fn get_replies(cx: Cx, a: RepliesArgs) -> Result<Output, ToolError> {
    let found = cx.relay.replies(&channel(&a.channel)?, a.message_id, 1000).await?;
    listing(&found, "reply(ies)")
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    pub query: String,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub sender: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
}

async fn search_messages(cx: Cx, a: SearchArgs) -> Result<Output, ToolError> {
    let found = cx
        .relay
        .search(Query {
            text: a.query,
            channel: a.channel.as_deref().map(channel).transpose()?,
            sender: a.sender,
            kind: a.kind,
            limit: limit(a.limit.or(Some(20)))?,
        })
        .await?;
    listing(&found, "match(es)")
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartArgs {
    pub channel: String,
    #[serde(default)]
    pub max_turns: Option<u32>,
}

fn session_out(name: &crosstalk_schema::ChannelName, st: &crosstalk_schema::ChannelState) -> Output {
    let v = session_value(name, st);
    Output {
        text: format!(
            "session on {name}: {}",
            if v["active"] == true { "active" } else { "not active" }
        ),
        structured: v,
    }
}

async fn start_session(cx: Cx, a: StartArgs) -> Result<Output, ToolError> {
    if a.max_turns == Some(0) {
        return Err(ToolError("max_turns must be at least 1".into()));
    }
    let name = channel(&a.channel)?;
    let st = cx.relay.start_session(&name, a.max_turns).await?;
    Ok(session_out(&name, &st))
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelArgs {
    pub channel: String,
}

async fn end_session(cx: Cx, a: ChannelArgs) -> Result<Output, ToolError> {
    let name = channel(&a.channel)?;
    let st = cx.relay.end_session(&name).await?;
    Ok(session_out(&name, &st))
}

async fn get_session(cx: Cx, a: ChannelArgs) -> Result<Output, ToolError> {
    let name = channel(&a.channel)?;
    let st = cx.relay.channel_state(&name).await?;
    Ok(session_out(&name, &st))
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DirectivesArgs {
    pub channel: String,
    #[serde(default)]
    pub recipient: Option<String>,
    #[serde(default)]
    pub since_id: u64,
}

async fn get_directives(cx: Cx, a: DirectivesArgs) -> Result<Output, ToolError> {
    let name = channel(&a.channel)?;
    let recipient = a.recipient.as_deref().map(str::trim).filter(|r| !r.is_empty());
    let d = cx.relay.directives(&name, recipient, a.since_id).await?;
    let text = format!(
        "{} directive(s), {} open question(s); next since_id {}",
        d.directives.len(),
        d.open_questions.len(),
        d.next_since_id
    );
    Ok(Output {
        structured: json!({
            "directives": messages_value(&d.directives),
            "open_questions": messages_value(&d.open_questions),
            "next_since_id": d.next_since_id,
        }),
        text,
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskArgs {
    pub channel: String,
    pub question: String,
    /// Defaults to your registered id.
    #[serde(default)]
    pub sender: Option<String>,
    /// A human's id, or any-human (default).
    #[serde(default)]
    pub recipient: Option<String>,
    #[serde(default)]
    pub timeout_s: Option<f64>,
}

async fn ask_human(cx: Cx, a: AskArgs) -> Result<Output, ToolError> {
    let name = channel(&a.channel)?;
    let sender = identity(&cx, a.sender.as_deref())?;
    let timeout = capped_timeout(a.timeout_s.unwrap_or(DEFAULT_ASK_SECS), cx.wait_cap)?;
    let question = NewMessage {
        sender,
        body: a.question,
        recipient: Some(
            a.recipient
                .unwrap_or_else(|| crosstalk_schema::message::ANY_HUMAN.into()),
        ),
        ..Default::default()
    };
    let asking = cx.relay.ask(&name, question, cx.session.as_deref(), timeout);
    let (q, answer) = tokio::select! {
        r = asking => r?,
        _ = cx.cancel.cancelled() => return Err(ToolError("cancelled".into())),
    };
    let text = match &answer {
        Some(ans) => format!("Answer from {}: {}", ans.message.sender, ans.message.body),
        None => format!(
            "No answer yet to question #{} (it stays open); check get_directives or ask again later.",
            q.id()
        ),
    };
    Ok(Output {
        structured: json!({
            "question": q.value(),
            "answered": answer.is_some(),
            "answer": answer.as_ref().map(|a| a.value()),
        }),
        text,
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareArgs {
    pub key: String,
    pub content: String,
    #[serde(default)]
    pub description: Option<String>,
    /// Defaults to your registered id.
    #[serde(default)]
    pub owner: Option<String>,
}

async fn share_data(cx: Cx, a: ShareArgs) -> Result<Output, ToolError> {
    let owner = identity(&cx, a.owner.as_deref())?;
    let s = cx
        .relay
        .share_data(&owner, &a.key, a.content, a.description, cx.session.as_deref())
        .await?;
    Ok(Output {
        text: format!("Shared {} (version {}, {} bytes).", s.key, s.version, s.size),
        structured: serde_json::to_value(&s).unwrap_or_default(),
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetDataArgs {
    pub key: String,
    #[serde(default)]
    pub version: Option<u64>,
}

async fn get_shared_data(cx: Cx, a: GetDataArgs) -> Result<Output, ToolError> {
    let d = cx.relay.get_shared_data(&a.key, a.version).await?;
    Ok(Output {
        structured: json!({
            "key": d.key, "owner": d.owner, "description": d.description, "content": d.content,
            "version": d.version, "updated_at": d.updated_at.to_rfc3339(),
        }),
        text: d.content,
    })
}

async fn list_shared_data(cx: Cx, _: NoArgs) -> Result<Output, ToolError> {
    let entries = cx.relay.list_shared_data().await?;
    let text = entries
        .iter()
        .map(|e| format!("{} (v{}, {} bytes, by {})", e.key, e.version, e.size, e.owner))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(Output {
        structured: json!({ "entries": entries }),
        text: if text.is_empty() { "no shared data".into() } else { text },
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteDataArgs {
    pub key: String,
    #[serde(default)]
    pub owner: Option<String>,
}

async fn delete_shared_data(cx: Cx, a: DeleteDataArgs) -> Result<Output, ToolError> {
    let owner = identity(&cx, a.owner.as_deref())?;
    let s = cx
        .relay
        .delete_shared_data(&owner, &a.key, cx.session.as_deref())
        .await?;
    Ok(Output {
        text: format!("Deleted {}.", s.key),
        structured: serde_json::to_value(&s).unwrap_or_default(),
    })
}
