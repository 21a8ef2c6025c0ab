//! The command line for people and scripts: `send`, `tail`, `wait`, `channels`, `ask`,
//! `answer`, each a client of a relay's REST API and SSE stream (the relay's own faces; no
//! rule lives here). The relay and token come from `--relay` / `--token` or `CROSSTALK_URL`
//! / `CROSSTALK_TOKEN`. A problem is one line on stderr and a non-zero exit: 2 for a usage,
//! connection or auth problem, 1 for "nothing came" (a `wait` or `ask` that timed out).

use anstream::println;
use anstyle::{AnsiColor, Style};
use clap::Subcommand;
use serde_json::{json, Value};
use std::io::Read;
use std::time::Duration;

use crate::client::{enc, Followed, RelayClient};
pub use crate::client::{Failure, Relay};

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Post a message; prints its id.  Example: crosstalk send dev "build is green" --as ci
    Send {
        #[command(flatten)]
        relay: Relay,
        channel: String,
        /// The body; `-` or none reads it from stdin.
        body: Option<String>,
        /// message (default), request, response, status, done, QUESTION, ANSWER, …
        #[arg(long = "type")]
        kind: Option<String>,
        /// The one participant it is for.
        #[arg(long)]
        to: Option<String>,
        /// Id of the message it replies to.
        #[arg(long)]
        reply_to: Option<u64>,
        /// Who posts [default: $USER]
        #[arg(long = "as")]
        sender: Option<String>,
    },
    /// Follow a channel live (resumes after drops).  Example: crosstalk tail dev --since 0
    Tail {
        #[command(flatten)]
        relay: Relay,
        channel: String,
        /// Start after this id [default: only new messages]
        #[arg(long)]
        since: Option<u64>,
        /// One JSON message per line, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Block for the next message from someone else; exit 0 with it, 1 on timeout.
    /// Example: crosstalk wait dev --as ci --timeout 60 && echo answered
    Wait {
        #[command(flatten)]
        relay: Relay,
        channel: String,
        /// Wait for messages after this id [default: the channel's newest]
        #[arg(long)]
        since: Option<u64>,
        /// Seconds [default: 300]
        #[arg(long, default_value_t = 300.0)]
        timeout: f64,
        /// Your identity: your own messages do not count.
        #[arg(long = "as")]
        me: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List channels, most recently active first.  Example: crosstalk channels --json
    Channels {
        #[command(flatten)]
        relay: Relay,
        #[arg(long)]
        json: bool,
    },
    /// Ask the humans a question and block until one answers; prints the answer (exit 1 on
    /// timeout; at most the relay's --wait-cap-secs).  Example: crosstalk ask dev "ship it?"
    Ask {
        #[command(flatten)]
        relay: Relay,
        channel: String,
        question: String,
        /// Seconds [default: 300]
        #[arg(long, default_value_t = 300.0)]
        timeout: f64,
        #[arg(long = "as")]
        sender: Option<String>,
    },
    /// Answer a question by its id.  Example: crosstalk answer dev 42 "yes, ship it"
    Answer {
        #[command(flatten)]
        relay: Relay,
        channel: String,
        id: u64,
        text: String,
        #[arg(long = "as")]
        sender: Option<String>,
    },
}

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

/// One message as a line for a person: `#id time sender [type] body`.
fn line(m: &Value) {
    let dim = Style::new().dimmed();
    let who = Style::new().bold().fg_color(Some(AnsiColor::Cyan.into()));
    let time = m["created_at"].as_str().unwrap_or("");
    let time = time.get(11..19).unwrap_or(time);
    println!(
        "{dim}#{} {time}{dim:#} {who}{}{who:#} {dim}[{}]{dim:#} {}",
        m["id"],
        m["sender"].as_str().unwrap_or("?"),
        m["type"].as_str().unwrap_or("message"),
        m["body"].as_str().unwrap_or("")
    );
}

fn show(m: &Value, json: bool) {
    if json {
        println!("{m}");
    } else {
        line(m);
    }
}

impl ClientCommand {
    fn relay(&self) -> &Relay {
        match self {
            ClientCommand::Send { relay, .. }
            | ClientCommand::Tail { relay, .. }
            | ClientCommand::Wait { relay, .. }
            | ClientCommand::Channels { relay, .. }
            | ClientCommand::Ask { relay, .. }
            | ClientCommand::Answer { relay, .. } => relay,
        }
    }
}

/// Runs a client command.
pub async fn run(cmd: ClientCommand) -> Result<Outcome, Failure> {
    let c = RelayClient::new(cmd.relay())?;
    match cmd {
        ClientCommand::Send {
            channel,
            body,
            kind,
            to,
            reply_to,
            sender,
            ..
        } => {
            let body = match body.as_deref() {
                Some(b) if b != "-" => b.to_owned(),
                _ => {
                    let mut s = String::new();
                    std::io::stdin().read_to_string(&mut s)?;
                    s.trim_end_matches('\n').to_owned()
                }
            };
            let posted = c
                .post(
                    &channel,
                    json!({"sender": me(sender), "type": kind, "body": body, "recipient": to, "reply_to": reply_to}),
                )
                .await?;
            println!("{}", posted["id"]);
            Ok(Outcome::Done)
        }
        ClientCommand::Channels { json, .. } => {
            let list = c.json(c.http.get(c.url("/api/channels"))).await?;
            for ch in list.as_array().into_iter().flatten() {
                if json {
                    println!("{ch}");
                } else {
                    println!(
                        "{:<24} {:>8} messages, last #{}",
                        ch["channel"].as_str().unwrap_or("?"),
                        ch["message_count"].as_u64().or(ch["count"].as_u64()).unwrap_or(0),
                        ch["last_id"]
                    );
                }
            }
            Ok(Outcome::Done)
        }
        ClientCommand::Wait {
            channel,
            since,
            timeout,
            me: who,
            json,
            ..
        } => {
            let since = match since {
                Some(s) => s,
                None => c.newest(&channel).await?,
            };
            let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
            loop {
                let left = deadline
                    .saturating_duration_since(tokio::time::Instant::now())
                    .as_secs_f64();
                let slice = left.min(WAIT_SLICE);
                let mut path = format!(
                    "/api/channels/{}/wait?since_id={since}&timeout_s={slice:.3}",
                    enc(&channel)
                );
                if let Some(w) = &who {
                    path.push_str(&format!("&instance_id={}", enc(w)));
                }
                let got = c.json(c.http.get(c.url(&path))).await?;
                // Anonymous waits answer a bare list, identified ones an object.
                let messages = got
                    .get("messages")
                    .unwrap_or(&got)
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if !messages.is_empty() {
                    for m in &messages {
                        show(m, json);
                    }
                    return Ok(Outcome::Done);
                }
                if left <= WAIT_SLICE {
                    return Ok(Outcome::TimedOut);
                }
            }
        }
        ClientCommand::Ask {
            channel,
            question,
            timeout,
            sender,
            ..
        } => {
            let path = format!("/api/channels/{}/ask", enc(&channel));
            let asked = c
                .json(
                    c.http
                        .post(c.url(&path))
                        .json(&json!({"question": question, "sender": me(sender), "timeout_s": timeout})),
                )
                .await?;
            match asked["answer"].as_object() {
                Some(a) => {
                    println!("{}", a.get("body").and_then(Value::as_str).unwrap_or(""));
                    Ok(Outcome::Done)
                }
                None => Ok(Outcome::TimedOut),
            }
        }
        ClientCommand::Answer {
            channel,
            id,
            text,
            sender,
            ..
        } => {
            let posted = c
                .post(
                    &channel,
                    json!({"sender": me(sender), "type": "ANSWER", "body": text, "reply_to": id}),
                )
                .await?;
            println!("{}", posted["id"]);
            Ok(Outcome::Done)
        }
        ClientCommand::Tail {
            channel, since, json, ..
        } => tail(&c, &channel, since, json).await,
    }
}

/// Follows the channel's SSE stream, resuming after drops with `Last-Event-ID`, so nothing is
/// missed or shown twice. Ends only with the process (or a refusal).
async fn tail(c: &RelayClient, channel: &str, since: Option<u64>, json: bool) -> Result<Outcome, Failure> {
    let since = match since {
        Some(s) => s,
        None => c.newest(channel).await?,
    };
    c.follow(channel, since, |event| {
        if let Followed::Message(m) = event {
            show(&m, json);
        }
    })
    .await?;
    Ok(Outcome::Done)
}
