//! Channels: list, create, find, who is on one, one at a glance, and message search across
//! them.

use super::messages::Messages;
use super::{Caller, Ctx, Limit, OpError, Operation};
use crosstalk_actors::search::Query;
use crosstalk_actors::{ChannelInfo, Participant};
use crosstalk_schema::{ChannelName, ChannelSummary, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Search results when the caller names no `limit`.
pub const DEFAULT_SEARCH_LIMIT: usize = 20;

/// No arguments.
#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct NoArgs {}

#[derive(Debug, Default, Serialize, Deserialize, JsonSchema)]
pub struct ListRequest {
    /// Page size (default: all).
    pub limit: Option<Limit>,
    /// Start after this channel.
    pub after: Option<ChannelName>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ChannelList {
    /// Most recently active first.
    pub channels: Vec<ChannelSummary>,
}

pub struct ListChannels;

impl Operation for ListChannels {
    const NAME: &'static str = "list_channels";
    const DESCRIPTION: &'static str = "Channels, most recently active first, with message count and last id; page \
        with limit and after.";
    const READ_ONLY: bool = true;
    type Request = ListRequest;
    type Response = ChannelList;

    async fn run(cx: &Ctx, _: Caller, r: ListRequest) -> Result<ChannelList, OpError> {
        let mut channels = cx.relay.list_channels()?;
        if let Some(after) = r.after {
            match channels.iter().position(|(name, _)| *name == after) {
                Some(at) => {
                    channels.drain(..=at);
                }
                None => return Err(OpError::not_found(format!("no channel {after} to page after"))),
            }
        }
        channels.truncate(Limit::or(r.limit, usize::MAX));
        // The page's rows only read their channels' state.
        let channels = channels
            .iter()
            .map(|(name, meta)| cx.relay.described(name, meta).map(|(row, _)| row))
            .collect::<Result<_, _>>()?;
        Ok(ChannelList { channels })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateRequest {
    #[serde(alias = "channel")]
    pub name: ChannelName,
    /// What the channel is for.
    #[serde(default)]
    pub description: String,
}

pub struct CreateChannel;

impl Operation for CreateChannel {
    const NAME: &'static str = "create_channel";
    const DESCRIPTION: &'static str = "Create a channel with a description (or update its description).";
    const READ_ONLY: bool = false;
    type Request = CreateRequest;
    type Response = ChannelInfo;

    async fn run(cx: &Ctx, _: Caller, r: CreateRequest) -> Result<ChannelInfo, OpError> {
        Ok(cx.relay.create_channel(&r.name, &r.description).await?)
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FindRequest {
    /// Text in channel names or descriptions.
    #[serde(alias = "q")]
    pub query: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FoundChannels {
    pub channels: Vec<ChannelInfo>,
}

pub struct FindChannel;

impl Operation for FindChannel {
    const NAME: &'static str = "find_channel";
    const DESCRIPTION: &'static str = "Find channels whose name or description contains query.";
    const READ_ONLY: bool = true;
    type Request = FindRequest;
    type Response = FoundChannels;

    async fn run(cx: &Ctx, _: Caller, r: FindRequest) -> Result<FoundChannels, OpError> {
        Ok(FoundChannels {
            channels: cx.relay.find_channels(Some(&r.query))?,
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ChannelRequest {
    pub channel: ChannelName,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Present {
    pub channel: ChannelName,
    pub participants: Vec<Participant>,
}

pub struct Presence;

impl Operation for Presence {
    const NAME: &'static str = "get_presence";
    const DESCRIPTION: &'static str = "Who is on a channel: streaming, waiting or posted recently.";
    const READ_ONLY: bool = true;
    type Request = ChannelRequest;
    type Response = Present;

    async fn run(cx: &Ctx, _: Caller, r: ChannelRequest) -> Result<Present, OpError> {
        Ok(Present {
            participants: cx.relay.presence(&r.channel).await?,
            channel: r.channel,
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct GlanceRequest {
    pub channel: ChannelName,
    /// How many of the newest messages (default: the face's page size).
    pub limit: Option<Limit>,
}

/// A channel at a glance: its newest messages and who is on it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Glance {
    pub channel: ChannelName,
    /// The newest message's id; 0 when there is none.
    pub last_id: u64,
    /// The newest `limit`, oldest first.
    pub messages: Messages,
    pub participants: Vec<Participant>,
}

/// What MCP's channel resource (`crosstalk://channels/{name}`) reads. Like every read it
/// neither creates nor starts an unknown channel (that reads as empty), and it moves no read
/// cursor: a resource is looked at, not consumed.
pub struct GlanceAt;

impl Operation for GlanceAt {
    const NAME: &'static str = "read_channel";
    const DESCRIPTION: &'static str = "A channel's newest messages, oldest first, and who is on it; moves no \
        read cursor.";
    const READ_ONLY: bool = true;
    type Request = GlanceRequest;
    type Response = Glance;

    async fn run(cx: &Ctx, caller: Caller, r: GlanceRequest) -> Result<Glance, OpError> {
        let messages = cx.relay.newest(&r.channel, caller.limit(r.limit), None).await?;
        Ok(Glance {
            last_id: messages.last().map_or(0, |p| p.id()),
            participants: cx.relay.presence(&r.channel).await?,
            channel: r.channel,
            messages,
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SearchRequest {
    /// Words (a prefix matches), "a phrase", a OR b, -excluded.
    #[serde(alias = "q")]
    pub query: String,
    pub channel: Option<ChannelName>,
    pub sender: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Posted at or after (RFC 3339).
    #[serde(default)]
    pub since: Option<String>,
    /// Posted before (RFC 3339).
    #[serde(default)]
    pub until: Option<String>,
    /// Default 20.
    pub limit: Option<Limit>,
}

/// Search results: the messages, best first, and for each its score and marked passage.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SearchResults {
    pub messages: Messages,
    pub hits: Vec<SearchHit>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SearchHit {
    pub id: u64,
    pub channel: String,
    /// BM25; higher is better.
    pub score: f32,
    /// The best passage, the matched words in **bold**.
    pub snippet: String,
}

/// An RFC 3339 time as microseconds since the epoch.
fn micros(field: &'static str, t: Option<&str>) -> Result<Option<i64>, OpError> {
    match t.map(str::trim).filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) => Timestamp::parse_rfc3339(t).map(|t| Some(t.0)).ok_or_else(|| {
            OpError::invalid(format!(
                "{field} must be an RFC 3339 time, such as 2026-12-01T09:00:00Z"
            ))
        }),
    }
}

pub struct Search;

impl Operation for Search {
    const NAME: &'static str = "search_messages";
    const DESCRIPTION: &'static str = "Full-text search, best matches first: words (prefixes match), \"phrases\", OR, \
        -word; filter by channel, sender, type, since, until.";
    const READ_ONLY: bool = true;
    type Request = SearchRequest;
    type Response = SearchResults;

    async fn run(cx: &Ctx, _: Caller, r: SearchRequest) -> Result<SearchResults, OpError> {
        let hits = cx
            .relay
            .search(Query {
                text: r.query,
                channel: r.channel,
                sender: r.sender,
                kind: r.kind,
                since: micros("since", r.since.as_deref())?,
                until: micros("until", r.until.as_deref())?,
                limit: Limit::or(r.limit, DEFAULT_SEARCH_LIMIT),
            })
            .await?;
        Ok(SearchResults {
            hits: hits
                .iter()
                .map(|h| SearchHit {
                    id: h.message.id(),
                    channel: h.message.message.channel.clone(),
                    score: h.score,
                    snippet: h.snippet.clone(),
                })
                .collect(),
            messages: hits.into_iter().map(|h| h.message).collect(),
        })
    }
}
