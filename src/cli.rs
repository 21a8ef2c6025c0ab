//! The command line for people and scripts: `send`, `tail`, `wait`, `channels`, `ask`,
//! `answer`, each a client of a relay's REST API and SSE stream (the relay's own faces; no
//! rule lives here). The relay and token come from `--relay` / `--token` or `CROSSTALK_URL`
//! / `CROSSTALK_TOKEN`. A problem is one line on stderr and a non-zero exit: 2 for a usage,
//! connection or auth problem, 1 for "nothing came" (a `wait` or `ask` that timed out).

use anstream::println;
use anstyle::{AnsiColor, Style};
use serde_json::Value;
use std::io::Read;

mod admin;
mod command;
mod guard;
mod local;
mod wake;

pub use command::{ClientCommand, Span};

use crate::api;
use crate::api::Call;
pub use crate::client::{Failure, RelayArgs};
use crate::client::{Followed, RelayClient};
use crate::ops::channels::ListRequest;
use crate::ops::identity::InboxRequest;
use crate::ops::messages::{MessageId, RoleArg, WaitRequest};
use crate::ops::sessions::DirectivesRequest;
use crosstalk_schema::message::{ANY_HUMAN, STATUS_ANSWERED};
use crosstalk_schema::{ChannelName, Meaning, Message, MessageType, NewMessage};

/// How a client command ended.
pub enum Outcome {
    Done,
    /// Nothing came in time (exit status 1).
    TimedOut,
}

/// Longest single long-poll the relay allows by default; longer waits loop.
const WAIT_SLICE: f64 = 290.0;

fn me(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("USER").ok())
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "cli".into())
}

/// A channel name from the command line, by the relay's own rule.
fn channel_name(raw: &str) -> Result<ChannelName, String> {
    ChannelName::parse(raw).map_err(|e| e.to_string())
}

/// A message type from the command line, by the relay's own rule (`None`: the default).
fn message_type(raw: Option<&str>) -> Result<Option<MessageType>, Failure> {
    match raw {
        None => Ok(None),
        Some(t) => MessageType::parse(t).map_err(|e| Failure(e.to_string(), 2)),
    }
}

/// One long-poll on `channel` after `since`, for at most `slice` seconds, as `who` if given.
async fn wait_once(
    c: &RelayClient,
    channel: &ChannelName,
    since: u64,
    slice: f64,
    who: Option<&str>,
) -> Result<Vec<Message>, Failure> {
    let request = WaitRequest {
        channel: channel.clone(),
        since_id: since,
        limit: None,
        timeout_s: Some(slice),
        instance_id: who.map(str::to_owned),
        role: RoleArg::default(),
        exclude_self: None,
    };
    Ok(c.call(api::WAIT, &request).await?.messages())
}

/// A DELETE that must find what it names (`missing` says so when it does not).
async fn delete<C: Call<Read = ()>>(
    c: &RelayClient,
    route: C,
    request: &C::Request,
    missing: &str,
) -> Result<(), Failure> {
    let r = c
        .auth(c.request(route, request)?)
        .send()
        .await
        .map_err(|e| c.unreachable(&e))?;
    if r.status() == reqwest::StatusCode::NOT_FOUND {
        // The route itself may be missing (a relay without OAuth says so): then its answer.
        let body: Value = r.json().await.unwrap_or(Value::Null);
        return Err(match (body["code"].as_str(), body["error"].as_str()) {
            (Some(crate::error::OAUTH_OFF), Some(why)) => {
                Failure(format!("the relay answered 404 Not Found: {why}"), 2)
            }
            _ => Failure(missing.to_owned(), 2),
        });
    }
    c.answer(route, r).await
}

/// One message as a line for a person: `#id time sender [type] body`.
fn line(m: &Message) {
    let dim = Style::new().dimmed();
    let who = Style::new().bold().fg_color(Some(AnsiColor::Cyan.into()));
    let time = m.created_at.get(11..19).unwrap_or(&m.created_at);
    println!(
        "{dim}#{} {time}{dim:#} {who}{}{who:#} {dim}[{}]{dim:#} {}",
        m.id, m.sender, m.kind, m.body
    );
}

fn show(m: &Message, json: bool) {
    if json {
        println!("{}", Json(m));
    } else {
        line(m);
    }
}

/// A value as one line of JSON.
struct Json<'a, T>(&'a T);

impl<T: serde::Serialize> std::fmt::Display for Json<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&serde_json::to_string(self.0).map_err(|_| std::fmt::Error)?)
    }
}

/// Runs a client command.
pub async fn run(cmd: ClientCommand) -> Result<Outcome, Failure> {
    // `status` finds its relay its own way, and `stop` talks to none: neither reads --relay
    // (or CROSSTALK_URL) as the others do, so a value there meant for them cannot fail them.
    let relay = match cmd {
        ClientCommand::Status { relay, data_dir } => return local::status(&relay, data_dir).await,
        ClientCommand::Stop { data_dir } => return local::stop(data_dir).await,
        ref other => other.relay(),
    };
    let c = RelayClient::new(relay)?;
    match cmd {
        ClientCommand::Status { .. } | ClientCommand::Stop { .. } => unreachable!("answered above"),
        ClientCommand::Guard {
            relay,
            me,
            project,
            install,
            ..
        } => guard::guard_command(&c, relay, me, project, install).await,
        ClientCommand::Send {
            channel,
            body,
            kind,
            to,
            reply_to,
            sender,
            ..
        } => send(&c, channel, body, kind, to, reply_to, sender).await,
        ClientCommand::Invite { me, expires, note, .. } => admin::invite(&c, me, expires, note).await,
        ClientCommand::Clients {
            revoke,
            revoke_client,
            json,
            ..
        } => admin::clients(&c, revoke, revoke_client, json).await,
        ClientCommand::Webhooks {
            add,
            channel,
            types,
            format,
            remove,
            json,
            ..
        } => admin::webhooks(&c, add, channel, types, format, remove, json).await,
        ClientCommand::Channels { json, .. } => channels(&c, json).await,
        ClientCommand::Wait {
            channel,
            since,
            timeout,
            me: who,
            json,
            ..
        } => wait(&c, channel, since, timeout, who, json).await,
        ClientCommand::Ask {
            channel,
            question,
            timeout,
            sender,
            ..
        } => ask(&c, channel, question, timeout, sender).await,
        ClientCommand::Answer {
            channel,
            id,
            text,
            sender,
            ..
        } => answer(&c, channel, id, text, sender).await,
        ClientCommand::Questions {
            channel,
            recipient,
            json,
            ..
        } => questions(&c, channel, recipient, json).await,
        ClientCommand::Inbox {
            me: who, session, json, ..
        } => inbox(&c, who, session, json).await,
        ClientCommand::Tail {
            channel, since, json, ..
        } => tail(&c, &channel, since, json).await,
        ClientCommand::Wake {
            me,
            listen,
            turn_timeout,
            retries,
            loop_guard,
            max_turns_per_hour,
            post_output,
            log_dir,
            grace,
            command,
            ..
        } => {
            let settings = wake::Settings {
                me,
                listen,
                command,
                turn_timeout: turn_timeout.into(),
                retries,
                loop_guard,
                max_turns_per_hour,
                post_output,
                log_dir,
                grace: grace.into(),
            };
            wake::wake(c, settings).await
        }
    }
}

/// `crosstalk send`.
async fn send(
    c: &RelayClient,
    channel: ChannelName,
    body: Option<String>,
    kind: Option<String>,
    to: Option<String>,
    reply_to: Option<u64>,
    sender: Option<String>,
) -> Result<Outcome, Failure> {
    let kind = message_type(kind.as_deref())?;
    let body = match body.as_deref() {
        Some(b) if b != "-" => b.to_owned(),
        _ => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            s.trim_end_matches('\n').to_owned()
        }
    };
    let message = NewMessage {
        sender: me(sender),
        kind,
        body,
        recipient: to,
        reply_to,
        ..NewMessage::default()
    };
    println!("{}", c.post(&channel, message).await?.id);
    Ok(Outcome::Done)
}

/// `crosstalk channels`.
async fn channels(c: &RelayClient, json: bool) -> Result<Outcome, Failure> {
    for ch in c.call(api::LIST_CHANNELS, &ListRequest::default()).await? {
        if json {
            println!("{}", Json(&ch));
        } else {
            println!("{:<24} {:>8} messages, last #{}", ch.channel, ch.count, ch.last_id);
        }
    }
    Ok(Outcome::Done)
}

/// `crosstalk wait`.
async fn wait(
    c: &RelayClient,
    channel: ChannelName,
    since: Option<u64>,
    timeout: Span,
    who: Option<String>,
    json: bool,
) -> Result<Outcome, Failure> {
    let since = match since {
        Some(s) => s,
        None => c.newest(&channel).await?,
    };
    let deadline = tokio::time::Instant::now() + timeout.0;
    loop {
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .as_secs_f64();
        let messages = wait_once(c, &channel, since, left.min(WAIT_SLICE), who.as_deref()).await?;
        if !messages.is_empty() {
            for m in &messages {
                show(m, json);
            }
            return Ok(Outcome::Done);
        }
        if left <= WAIT_SLICE {
            eprintln!("crosstalk: nothing new on {channel} after #{since} within {timeout}");
            return Ok(Outcome::TimedOut);
        }
    }
}

/// `crosstalk ask`.
async fn ask(
    c: &RelayClient,
    channel: ChannelName,
    question: String,
    timeout: Span,
    sender: Option<String>,
) -> Result<Outcome, Failure> {
    // Post the question first, so the asker sees its id before blocking; then wait for
    // the ANSWER that replies to it.
    let asking = NewMessage {
        sender: me(sender),
        kind: Some(Meaning::Question.into()),
        body: question,
        recipient: Some(ANY_HUMAN.to_owned()),
        ..NewMessage::default()
    };
    let id = c.post(&channel, asking).await?.id;
    eprintln!(
        "asked question #{id} on {channel}; waiting up to {timeout} for an answer \
             (answer it with: crosstalk answer {channel} {id} \"…\")"
    );
    let deadline = tokio::time::Instant::now() + timeout.0;
    let mut since = id;
    loop {
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .as_secs_f64();
        let messages = wait_once(c, &channel, since, left.min(WAIT_SLICE), None).await?;
        for m in &messages {
            since = since.max(m.id);
            if m.kind.is(Meaning::Answer) && m.reply_to == Some(id) {
                println!("{}", m.body);
                return Ok(Outcome::Done);
            }
        }
        if messages.is_empty() && left <= WAIT_SLICE {
            eprintln!("crosstalk: no answer to #{id} on {channel} within {timeout}; the question stays open");
            return Ok(Outcome::TimedOut);
        }
    }
}

/// `crosstalk answer`.
async fn answer(
    c: &RelayClient,
    channel: ChannelName,
    id: u64,
    text: String,
    sender: Option<String>,
) -> Result<Outcome, Failure> {
    let asked = MessageId {
        channel: channel.clone(),
        message_id: id,
    };
    let Some(question) = c.call_found(api::GET_MESSAGE, &asked).await? else {
        return Err(Failure(format!("there is no message #{id} in {channel}"), 2));
    };
    let permission = question.kind.is(Meaning::Permission);
    if permission && !["allow", "deny"].contains(&text.trim().to_ascii_lowercase().as_str()) {
        return Err(Failure(
            format!("#{id} in {channel} asks for a permission: answer allow or deny"),
            2,
        ));
    }
    if !question.kind.asks() {
        return Err(Failure(
            format!(
                "#{id} in {channel} is a {}, not a question: reply to it with \
                     `crosstalk send {channel} \"…\" --reply-to {id}`",
                question.kind
            ),
            2,
        ));
    }
    if question.status.as_deref() == Some(STATUS_ANSWERED) {
        let what = if permission { "permission" } else { "question" };
        return Err(Failure(format!("{what} #{id} in {channel} is already answered"), 2));
    }
    let answering = NewMessage {
        sender: me(sender),
        kind: Some(Meaning::Answer.into()),
        body: text,
        reply_to: Some(id),
        ..NewMessage::default()
    };
    println!("{}", c.post(&channel, answering).await?.id);
    Ok(Outcome::Done)
}

/// `crosstalk questions`.
async fn questions(
    c: &RelayClient,
    channel: ChannelName,
    recipient: Option<String>,
    json: bool,
) -> Result<Outcome, Failure> {
    let request = DirectivesRequest {
        channel: channel.clone(),
        recipient,
        since_id: 0,
    };
    let open: Vec<Message> = c
        .call(api::DIRECTIVES, &request)
        .await?
        .into_iter()
        .filter(|m| m.kind.asks())
        .collect();
    if open.is_empty() && !json {
        eprintln!("no open questions on {channel}");
    }
    for m in &open {
        show(m, json);
    }
    Ok(Outcome::Done)
}

/// `crosstalk inbox`.
async fn inbox(c: &RelayClient, who: String, session: Option<String>, json: bool) -> Result<Outcome, Failure> {
    let request = InboxRequest {
        instance_id: Some(who.clone()),
        limit: None,
    };
    let messages = c
        .call_with(api::INBOX, &request, |req| match &session {
            Some(s) => req.header("X-Crosstalk-Session", s),
            None => req,
        })
        .await?;
    if messages.is_empty() && !json {
        eprintln!("nothing new for {who}");
    }
    for m in &messages {
        if json {
            println!("{}", Json(m));
        } else {
            print!("{:<16} ", m.channel);
            line(m);
        }
    }
    Ok(Outcome::Done)
}

/// Follows the channel's SSE stream, resuming after drops with `Last-Event-ID`, so nothing is
/// missed or shown twice. Ends only with the process (or a refusal).
async fn tail(c: &RelayClient, channel: &ChannelName, since: Option<u64>, json: bool) -> Result<Outcome, Failure> {
    let since = match since {
        Some(s) => s,
        None => {
            let newest = c.newest(channel).await?;
            eprintln!("following {channel} from #{newest}: new messages only (--since 0 shows the whole history)");
            newest
        }
    };
    c.follow(channel, since, |event| {
        if let Followed::Message(m) = event {
            show(&m, json);
        }
    })
    .await?;
    Ok(Outcome::Done)
}
