//! Messages: post, read, wait, one message, its replies, and asking a human.

use super::{fields, Caller, Ctx, Gauge, Limit, OpError, Operation, Principal};
use crosstalk_actors::{Posted, Role, WaitOptions, WaitOutcome};
use crosstalk_schema::message::{ANY_HUMAN, VERDICTS};
use crosstalk_schema::{ChannelName, Meaning, NewMessage};
use futures_util::future::Either;
use futures_util::FutureExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A wait's timeout when the caller names none (crosstalk-mcp's default).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// How long `ask` blocks for an answer when the caller names no `timeout_s` (capped by the
/// face: an MCP host gives up on a tool call after about a minute).
pub const DEFAULT_ASK_WAIT: Duration = Duration::from_secs(50);

/// Messages, oldest first.
pub type Messages = Vec<Arc<Posted>>;

// ---- post_message

/// A post: the channel and the message. Read by hand (the schema is derived) so that an error
/// in the message names its field: serde's `flatten` would lose the path.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PostRequest {
    /// Channel name (created on first post).
    pub channel: ChannelName,
    #[serde(flatten)]
    pub message: NewMessage,
}

impl<'de> Deserialize<'de> for PostRequest {
    /// In one pass over the fields: the message from all of them but `channel`, whose value is
    /// read apart ([`fields::Without`]). An error in the message is named by its field by
    /// whoever reads the request with `serde_path_to_error`, as every face does.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = PostRequest;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a post: an object with the channel and the message's fields")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, map: M) -> Result<PostRequest, M::Error> {
                use serde::de::Error;
                let mut channel = None;
                let message = NewMessage::deserialize(serde::de::value::MapAccessDeserializer::new(fields::Without {
                    inner: map,
                    name: "channel",
                    taken: &mut channel,
                }))?;
                let channel = match channel {
                    Some(serde_json::Value::String(c)) => ChannelName::parse(&c).map_err(M::Error::custom)?,
                    Some(other) => return Err(M::Error::custom(format!("channel: expected a string, got {other}"))),
                    None => return Err(M::Error::missing_field("channel")),
                };
                Ok(PostRequest { channel, message })
            }
        }
        d.deserialize_map(Fields)
    }
}

pub struct Post;

impl Operation for Post {
    const NAME: &'static str = "post_message";
    const DESCRIPTION: &'static str = "Post a message (a new channel is created); returns it once durable. Then \
        wait_for_message(since_id=its id). Post type done when finished.";
    const READ_ONLY: bool = false;
    type Request = PostRequest;
    type Response = Arc<Posted>;

    async fn run(cx: &Ctx, caller: Caller, r: PostRequest) -> Result<Arc<Posted>, OpError> {
        let mut message = r.message;
        message.sender = caller.identity(cx, Some(message.sender.as_str()).filter(|s| !s.trim().is_empty()))?;
        // `kind` was parsed where the request was read: this check and the store see one type.
        if let (true, Some(parent)) = (
            message.kind.as_ref().is_some_and(|k| k.is(Meaning::Answer)),
            message.reply_to,
        ) {
            if let Some(asked) = cx.relay.message(&r.channel, parent).await? {
                if asked.message.kind.is(Meaning::Permission) {
                    message.body = decide(cx, &caller, &r.channel, &asked, &message)?;
                }
            }
        }
        Ok(cx.relay.post(&r.channel, message).await?)
    }
}

/// The verdict an ANSWER to a PERMISSION gives (`allow` or `deny`), once it is checked that a
/// human gives it and that the request is still open. Never through MCP (an agent's face);
/// otherwise a human is the relay's own token, a participant named in `--humans`, or — on a
/// relay without tokens — whoever answers (the console, `crosstalk answer`, REST) as an
/// identity not registered as an agent. The first verdict wins; a later one is refused.
fn decide(
    cx: &Ctx,
    caller: &Caller,
    channel: &ChannelName,
    asked: &Posted,
    answer: &NewMessage,
) -> Result<String, OpError> {
    let verdict = answer.body.trim().to_ascii_lowercase();
    if !VERDICTS.contains(&verdict.as_str()) {
        return Err(OpError::invalid(format!(
            "a PERMISSION is answered allow or deny, not {:?}",
            answer.body.chars().take(40).collect::<String>()
        )));
    }
    let agent = |why: &str| {
        OpError::forbidden(format!(
            "only a human decides a PERMISSION ({why}); answer it in the console or with `crosstalk answer {channel} {} allow|deny`",
            asked.id()
        ))
    };
    // An MCP tool call is an agent's, whatever token its host holds.
    if caller.policy.agents {
        return Err(agent("an MCP tool call is an agent's"));
    }
    match &caller.principal {
        Principal::Shared => {}
        Principal::Participant(id) if cx.humans.contains(id) => {}
        Principal::Participant(id) => return Err(agent(&format!("{id} is not one of --humans"))),
        Principal::Connector(_) => return Err(agent("an OAuth connection is an agent's host")),
        Principal::Anyone => {
            let registered_agent = cx
                .relay
                .list_instances()
                .iter()
                .any(|i| i.instance_id == answer.sender && i.kind == crosstalk_schema::InstanceKind::Agent);
            if registered_agent {
                return Err(agent(&format!("{} is registered as an agent", answer.sender)));
            }
        }
    }
    if !cx
        .relay
        .channel_state(channel)?
        .open_questions
        .contains_key(&asked.id())
    {
        return Err(OpError::new(
            super::ErrorKind::Conflict,
            format!("PERMISSION #{} is already decided; the first answer stands", asked.id()),
        ));
    }
    Ok(verdict)
}

// ---- get_messages

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReadRequest {
    pub channel: ChannelName,
    /// Messages with id > since_id.
    #[serde(default)]
    pub since_id: u64,
    pub limit: Option<Limit>,
    /// Your identity: your read cursor moves on.
    pub instance_id: Option<String>,
    /// Page back: the messages before this id.
    pub before_id: Option<u64>,
}

/// A page of a channel's messages.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Page {
    pub channel: ChannelName,
    pub messages: Messages,
    /// Pass as since_id next time.
    pub next_since_id: u64,
    /// More messages follow: read again at once.
    pub has_more: bool,
}

pub struct Read;

impl Operation for Read {
    const NAME: &'static str = "get_messages";
    const DESCRIPTION: &'static str = "A channel's messages with id > since_id, oldest first, without waiting. \
        Pass next_since_id as since_id next time to never read one twice; has_more: call again at once.";
    const READ_ONLY: bool = true;
    type Request = ReadRequest;
    type Response = Page;

    async fn run(cx: &Ctx, caller: Caller, r: ReadRequest) -> Result<Page, OpError> {
        let name = r.channel;
        let limit = caller.limit(r.limit);
        if let Some(before) = r.before_id {
            // One more than asked tells whether older ones remain.
            let (mut messages, cut) = cx.relay.older(&name, before, limit + 1).await?;
            let has_more = cut || messages.len() > limit;
            if messages.len() > limit {
                messages.remove(0);
            }
            return Ok(Page {
                next_since_id: messages.last().map_or(r.since_id, |p| p.id()),
                channel: name,
                messages,
                has_more,
            });
        }
        let reader = caller.reader(cx, r.instance_id.as_deref())?;
        // One more than asked tells whether more follow without a second read.
        let (mut messages, cut) = cx
            .relay
            .read_page(&name, r.since_id, limit + 1, reader.as_deref())
            .await?;
        let has_more = cut || messages.len() > limit;
        messages.truncate(limit);
        Ok(Page {
            next_since_id: messages.last().map_or(r.since_id, |p| p.id()),
            channel: name,
            messages,
            has_more,
        })
    }
}

// ---- wait_for_message

/// How a waiting party takes part in mutual-wait detection.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RoleArg {
    /// A normal party: when every active party waits, one is told to speak first.
    #[default]
    #[serde(alias = "ACTIVE", alias = "Active")]
    Active,
    /// A background worker: hears everything, never holds up a conversation.
    #[serde(alias = "PARKED", alias = "Parked")]
    Parked,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct WaitRequest {
    pub channel: ChannelName,
    /// The largest id you have seen.
    #[serde(default)]
    pub since_id: u64,
    pub limit: Option<Limit>,
    /// Default 30.
    #[schemars(range(min = 0))]
    pub timeout_s: Option<f64>,
    /// Your identity (default: the one you registered); your own messages do not wake you.
    pub instance_id: Option<String>,
    /// active (default), or parked: a worker that never holds up a conversation.
    #[serde(default)]
    pub role: RoleArg,
    /// Skip your own messages (default: true).
    pub exclude_self: Option<bool>,
}

// `M`: a message as the relay holds it; as a client reads it, `crosstalk_schema::Message`.
/// What a wait returns.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "Waited")]
pub struct Waited<M = Arc<Posted>> {
    pub channel: ChannelName,
    pub messages: Vec<M>,
    /// Pass as since_id next time.
    pub next_since_id: u64,
    pub has_more: bool,
    /// Nothing arrived in time.
    pub timed_out: bool,
    /// Why the wait returned: messages, timeout, superseded, speak_first, done, shutting_down.
    pub outcome: WaitOutcome,
    /// What to do next.
    pub hint: Cow<'static, str>,
    /// The wait had an identity (crosstalk-mcp's anonymous long-poll answers a bare list).
    #[serde(skip)]
    pub identified: bool,
}

pub struct Wait;

impl Operation for Wait {
    const NAME: &'static str = "wait_for_message";
    const DESCRIPTION: &'static str = "Block until a channel has messages with id > since_id (the largest id you \
        have seen), oldest first; none after timeout_s. Then wait again with next_since_id.";
    const READ_ONLY: bool = true;
    const WAITS: bool = true;
    type Request = WaitRequest;
    type Response = Waited;

    fn run(cx: &Ctx, caller: Caller, r: WaitRequest) -> impl Future<Output = Result<Waited, OpError>> + Send + '_ {
        // Every check runs before the wait's future is built, and that future keeps only what
        // the answer needs: a wait is parked for minutes, thousands at a time (docs/benchmarks.md,
        // "10,000 waiters: where the memory goes").
        let parked = (|| {
            let name = r.channel;
            let limit = caller.limit(r.limit);
            let timeout = caller.timeout(r.timeout_s, DEFAULT_WAIT)?;
            let instance = caller.reader(cx, r.instance_id.as_deref())?;
            let held = cx.hold(&caller.principal)?;
            let waiting = Gauge::enter(&cx.waits);
            let opts = WaitOptions {
                since_id: r.since_id,
                limit: limit + 1,
                timeout,
                exclude_self: instance.is_some() && r.exclude_self.unwrap_or(true),
                role: match r.role {
                    RoleArg::Active => Role::Active,
                    RoleArg::Parked => Role::Parked,
                },
                instance,
            };
            Ok::<_, OpError>((name, limit, opts, held, waiting))
        })();
        let (name, limit, opts, held, waiting) = match parked {
            Ok(parked) => parked,
            Err(e) => return Either::Left(std::future::ready(Err(e))),
        };
        let identified = opts.instance.is_some();
        Either::Right(cx.relay.wait(name.clone(), opts).map(move |w| {
            // This wait counts against its principal and in `/healthz` until it ends.
            drop((held, waiting));
            let mut w = w?;
            let has_more = w.cut || w.messages.len() > limit;
            w.messages.truncate(limit);
            let next_since_id = match (has_more, w.messages.last()) {
                (true, Some(last)) => last.id(),
                _ => w.next_since_id,
            };
            Ok(Waited {
                channel: name,
                timed_out: w.messages.is_empty(),
                messages: w.messages,
                next_since_id,
                has_more,
                hint: Cow::Borrowed(w.outcome.hint()),
                outcome: w.outcome,
                identified,
            })
        }))
    }
}

// ---- one message, replies

#[derive(Debug, Deserialize, JsonSchema)]
pub struct MessageRef {
    pub channel: ChannelName,
    #[serde(alias = "id")]
    pub message_id: u64,
    pub limit: Option<Limit>,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub struct MessageId {
    pub channel: ChannelName,
    #[serde(alias = "id")]
    pub message_id: u64,
}

pub struct GetMessage;

impl Operation for GetMessage {
    const NAME: &'static str = "get_message";
    const DESCRIPTION: &'static str = "One message by id, with its reply count and status.";
    const READ_ONLY: bool = true;
    type Request = MessageId;
    type Response = Arc<Posted>;

    async fn run(cx: &Ctx, _: Caller, r: MessageId) -> Result<Arc<Posted>, OpError> {
        existing(cx, &r.channel, r.message_id).await
    }
}

/// Message `id` of `channel`, or a 404 naming both.
pub async fn existing(cx: &Ctx, channel: &ChannelName, id: u64) -> Result<Arc<Posted>, OpError> {
    cx.relay
        .message(channel, id)
        .await?
        .ok_or_else(|| OpError::not_found(format!("no message {id} in channel {channel}")))
}

/// Who has read a message: everyone on its channel, each under `read_by` or `not_yet`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Readers {
    pub channel: ChannelName,
    pub message_id: u64,
    /// Its sender, and those whose read position is at or past it.
    pub read_by: Vec<String>,
    /// Everyone else on the channel: its recipient until it reads it, whoever posted there
    /// or is present without having read this far.
    pub not_yet: Vec<String>,
    /// Of those, the identities `crosstalk wake` runs turns for, with what each does now
    /// (`listening (wakes on messages)`, `working`, `paused by …`); a turn that handled the
    /// message counts as reading it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub woken: std::collections::BTreeMap<String, String>,
}

/// Messages whose senders count as on the channel for [`GetReaders`] (the newest ones):
/// enough for a working channel, bounded for a long one.
pub const READERS_SCAN: usize = 1000;

pub struct GetReaders;

impl Operation for GetReaders {
    const NAME: &'static str = "get_readers";
    const DESCRIPTION: &'static str = "Who on the channel has read a message, and who not yet.";
    const READ_ONLY: bool = true;
    type Request = MessageId;
    type Response = Readers;

    async fn run(cx: &Ctx, _: Caller, r: MessageId) -> Result<Readers, OpError> {
        let name = r.channel;
        let m = existing(cx, &name, r.message_id).await?;
        // Everyone on the channel: a read position there (read as themselves, joined), posted
        // among its newest messages, present, or the one it is for.
        let cursors: std::collections::HashMap<String, u64> = cx.relay.readers(&name).await?.into_iter().collect();
        let mut on: std::collections::BTreeSet<String> = cursors.keys().cloned().collect();
        let (recent, _) = cx.relay.older(&name, u64::MAX, READERS_SCAN).await?;
        on.extend(recent.iter().map(|p| p.message.sender.clone()));
        on.extend(cx.relay.presence(&name).await?.into_iter().map(|p| p.id));
        on.extend(m.message.recipient.iter().cloned());
        on.insert(m.message.sender.clone());
        on.retain(|who| !who.is_empty());
        let woken = super::wake::woken(cx).await?;
        let handled = |who: &str| {
            woken
                .iter()
                .find(|w| w.identity == who)
                .and_then(|w| w.handled.get(name.as_str()))
                .is_some_and(|upto| *upto >= r.message_id)
        };
        let (read_by, not_yet) = on.iter().cloned().partition(|who| {
            *who == m.message.sender || cursors.get(who).is_some_and(|upto| *upto >= r.message_id) || handled(who)
        });
        let woken = woken
            .into_iter()
            .filter(|w| on.contains(&w.identity))
            .map(|w| (w.identity, w.state))
            .collect();
        Ok(Readers {
            channel: name,
            message_id: r.message_id,
            read_by,
            not_yet,
            woken,
        })
    }
}

/// Messages, without paging.
#[derive(Debug, Serialize, JsonSchema)]
pub struct MessageList {
    pub messages: Messages,
}

pub struct Replies;

impl Operation for Replies {
    const NAME: &'static str = "get_replies";
    const DESCRIPTION: &'static str = "The replies to a message (its thread), oldest first.";
    const READ_ONLY: bool = true;
    type Request = MessageRef;
    type Response = MessageList;

    async fn run(cx: &Ctx, caller: Caller, r: MessageRef) -> Result<MessageList, OpError> {
        let limit = caller.limit(r.limit);
        Ok(MessageList {
            messages: cx.relay.replies(&r.channel, r.message_id, limit).await?,
        })
    }
}

// ---- ask_human

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AskRequest {
    pub channel: ChannelName,
    #[serde(alias = "body")]
    pub question: String,
    /// Who asks (default: you).
    pub sender: Option<String>,
    /// A human's id, or any-human (default).
    pub recipient: Option<String>,
    /// Seconds to wait (capped by the relay).
    #[schemars(range(min = 0))]
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Asked {
    /// The QUESTION, with its status as of the answer.
    pub question: Arc<Posted>,
    pub answered: bool,
    pub answer: Option<Arc<Posted>>,
    /// Who answered, and whether they are known to be a person.
    pub answered_by: Option<Answerer>,
    pub hint: String,
}

/// Who answered a question. Anyone may ANSWER a QUESTION (only a PERMISSION is decided by
/// humans alone), so an ask says who did and whether the relay knows them to be a person.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Answerer {
    pub id: String,
    /// A participant the operator named in `--humans`. False for everyone else: an agent, or
    /// anyone the relay cannot vouch for (a registration's kind `human` is the caller's own
    /// word, so it does not count).
    pub person: bool,
}

impl Answerer {
    fn of(cx: &Ctx, id: &str) -> Answerer {
        Answerer {
            id: id.to_owned(),
            person: cx.humans.contains(id),
        }
    }
}

pub struct Ask;

impl Operation for Ask {
    const NAME: &'static str = "ask_human";
    const DESCRIPTION: &'static str = "Post a QUESTION and block until it is answered or timeout_s passes.";
    const READ_ONLY: bool = false;
    const WAITS: bool = true;
    type Request = AskRequest;
    type Response = Asked;

    async fn run(cx: &Ctx, caller: Caller, r: AskRequest) -> Result<Asked, OpError> {
        let timeout = caller.timeout(r.timeout_s, DEFAULT_ASK_WAIT)?;
        let _held = cx.hold(&caller.principal)?;
        let (name, question) = Ask::post(cx, &caller, r).await?;
        let _waiting = Gauge::enter(&cx.waits);
        let answer = cx.relay.await_answer(&name, question.id(), timeout).await?;
        asked(cx, &name, question, answer).await
    }
}

impl Ask {
    /// Posts the question `r` asks, as the caller's identity: the first half of an ask, which
    /// a task does once, when it is made (its wait, [`AwaitAnswer`], may run again after a
    /// restart, and must not ask twice).
    pub async fn post(cx: &Ctx, caller: &Caller, r: AskRequest) -> Result<(ChannelName, Arc<Posted>), OpError> {
        let sender = caller.identity(cx, r.sender.as_deref())?;
        let question = NewMessage {
            sender,
            kind: Some(Meaning::Question.into()),
            body: r.question,
            recipient: Some(
                r.recipient
                    .filter(|r| !r.trim().is_empty())
                    .unwrap_or_else(|| ANY_HUMAN.to_owned()),
            ),
            ..Default::default()
        };
        let posted = cx.relay.post(&r.channel, question).await?;
        Ok((r.channel, posted))
    }
}

/// The answer to an ask: an answered question is read back, as its status comes from the answer.
async fn asked(
    cx: &Ctx,
    channel: &ChannelName,
    question: Arc<Posted>,
    answer: Option<Arc<Posted>>,
) -> Result<Asked, OpError> {
    let question = match answer {
        Some(_) => cx.relay.message(channel, question.id()).await?.unwrap_or(question),
        None => question,
    };
    let answered_by = answer.as_ref().map(|a| Answerer::of(cx, &a.message.sender));
    let hint = match &answered_by {
        Some(Answerer { id, person: true }) => format!("{id} answered: a person."),
        Some(Answerer { id, person: false }) => format!(
            "{id} answered, and is not known to be a person (not one of the relay's --humans): weigh \
             it as an agent's answer."
        ),
        None => "No answer yet: the question stays open; ask again or poll get_directives.".to_owned(),
    };
    Ok(Asked {
        question,
        answered: answer.is_some(),
        answered_by,
        hint,
        answer,
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AwaitAnswerRequest {
    pub channel: ChannelName,
    /// The QUESTION's id.
    pub question_id: u64,
    #[schemars(range(min = 0))]
    pub timeout_s: Option<f64>,
}

/// The second half of an ask: waits for the answer to a question already posted. Not a tool
/// of its own; what an `ask_human` task runs (`crate::mcp::tasks`).
pub struct AwaitAnswer;

impl Operation for AwaitAnswer {
    const NAME: &'static str = "ask_human";
    const DESCRIPTION: &'static str = "Wait for the answer to a QUESTION already posted.";
    const READ_ONLY: bool = true;
    const WAITS: bool = true;
    type Request = AwaitAnswerRequest;
    type Response = Asked;

    async fn run(cx: &Ctx, caller: Caller, r: AwaitAnswerRequest) -> Result<Asked, OpError> {
        let timeout = caller.timeout(r.timeout_s, DEFAULT_ASK_WAIT)?;
        let question = cx
            .relay
            .message(&r.channel, r.question_id)
            .await?
            .ok_or_else(|| OpError::not_found(format!("no message {} on {}", r.question_id, r.channel)))?;
        let _held = cx.hold(&caller.principal)?;
        let _waiting = Gauge::enter(&cx.waits);
        let answer = cx.relay.await_answer(&r.channel, r.question_id, timeout).await?;
        asked(cx, &r.channel, question, answer).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read<T: serde::de::DeserializeOwned>(body: &str, params: &[(&str, String)]) -> Result<T, String> {
        let mut de = serde_json::Deserializer::from_slice(body.as_bytes());
        serde_path_to_error::deserialize(fields::WithParams { inner: &mut de, params }).map_err(|e| {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner())
        })
    }

    #[test]
    fn a_post_is_read_in_one_pass_with_its_channel_apart() {
        let channel = [("channel", "dev".to_owned())];
        let post: PostRequest = read(r#"{"sender": "ann", "body": "hi", "channel": "elsewhere"}"#, &channel).unwrap();
        assert_eq!((post.channel.as_str(), post.message.body.as_str()), ("dev", "hi"));
        // From MCP arguments, the channel is a field like the others, anywhere.
        let args = serde_json::json!({"body": "hi", "channel": "ops", "sender": "ann", "type": " ANSWER"});
        let post: PostRequest = serde_json::from_value(args).unwrap();
        assert_eq!(post.channel.as_str(), "ops");
        assert_eq!(
            post.message.kind.map(|k| k.as_str().to_owned()).as_deref(),
            Some("ANSWER")
        );
        let refused = |body: &str| read::<PostRequest>(body, &[]).unwrap_err();
        assert!(refused(r#"{"body": "hi"}"#).starts_with(".: missing field `channel`"));
        assert!(refused(r#"{"body": "hi", "channel": 7}"#).contains("channel: expected a string, got 7"));
        assert!(refused(r#"{"body": "hi", "channel": "bad name"}"#).contains("channel"));
        assert!(refused(r#"{"channel": "dev"}"#).contains("missing field `body`"));
        let err = refused(r#"{"channel": "dev", "body": "x", "reply_to": "one"}"#);
        assert!(err.starts_with("reply_to: invalid type"), "{err}");
        let err = refused(r#"{"channel": "dev", "body": "x", "type": "ANSW\u0415R"}"#);
        assert!(err.starts_with("type: ") && err.contains("looks like ANSWER"), "{err}");
    }
}
