//! The command line for people and scripts: `send`, `tail`, `wait`, `channels`, `ask`,
//! `answer`, each a client of a relay's REST API and SSE stream (the relay's own faces; no
//! rule lives here). The relay and token come from `--relay` / `--token` or `CROSSTALK_URL`
//! / `CROSSTALK_TOKEN`. A problem is one line on stderr and a non-zero exit: 2 for a usage,
//! connection or auth problem, 1 for "nothing came" (a `wait` or `ask` that timed out).

use anstream::println;
use anstyle::{AnsiColor, Style};
use clap::Subcommand;
use serde_json::Value;
use std::io::Read;
use std::time::Duration;

use crate::api;
use crate::api::Call;
use crate::client::{served, shell_quote, Followed, RelayClient};
pub use crate::client::{Failure, RelayArgs};
use crate::ops::channels::{ListRequest, NoArgs};
use crate::ops::identity::InboxRequest;
use crate::ops::messages::{MessageId, RoleArg, WaitRequest};
use crate::ops::oauth::{ClientQuery, GrantId, InviteRequest};
use crate::ops::reservations::ListReservationsRequest;
use crate::ops::sessions::DirectivesRequest;
use crate::ops::webhooks::{NewWebhook, WebhookId};
use crosstalk_schema::message::{ANY_HUMAN, STATUS_ANSWERED};
use crosstalk_schema::{ChannelName, Meaning, Message, MessageType, NewMessage};

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Post a message; prints its id.  Example: crosstalk send dev "build is green" --as ci
    Send {
        #[command(flatten)]
        relay: RelayArgs,
        /// The channel to post in (created by the first post).
        #[arg(value_parser = channel_name)]
        channel: ChannelName,
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
        relay: RelayArgs,
        /// The channel to follow.
        #[arg(value_parser = channel_name)]
        channel: ChannelName,
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
        relay: RelayArgs,
        /// The channel to wait on.
        #[arg(value_parser = channel_name)]
        channel: ChannelName,
        /// Wait for messages after this id [default: the channel's newest]
        #[arg(long)]
        since: Option<u64>,
        /// How long to wait: seconds (60, 0.5) or a span (30s, 5m, 1h30m).
        #[arg(long, default_value = "300")]
        timeout: Span,
        /// Your identity: your own messages do not count.
        #[arg(long = "as")]
        me: Option<String>,
        /// One JSON message per line, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// List channels, most recently active first.  Example: crosstalk channels --json
    Channels {
        #[command(flatten)]
        relay: RelayArgs,
        /// One JSON object per line, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Ask the humans a question and block until one answers; prints the answer (exit 1 on
    /// timeout; at most the relay's --wait-cap-secs).  Example: crosstalk ask dev "ship it?"
    Ask {
        #[command(flatten)]
        relay: RelayArgs,
        /// The channel to ask in.
        #[arg(value_parser = channel_name)]
        channel: ChannelName,
        /// The question.
        question: String,
        /// How long to wait for the answer: seconds (300) or a span (30s, 5m, 2h).
        #[arg(long, default_value = "300")]
        timeout: Span,
        /// Who asks [default: $USER]
        #[arg(long = "as")]
        sender: Option<String>,
    },
    /// Is a relay up? Who serves the data directory, at which address, and its health.
    /// Example: crosstalk status
    Status {
        #[command(flatten)]
        relay: RelayArgs,
        /// The data directory to report on, as `crosstalk serve` reads it
        /// [env: CROSSTALK_DATA_DIR, RELAY_DB] [default: ~/.local/share/crosstalk/store]
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
    },
    /// Stop the relay serving a data directory, and wait until it has flushed and exited.
    /// Example: crosstalk stop
    Stop {
        /// Its data directory, as `crosstalk serve` reads it
        /// [env: CROSSTALK_DATA_DIR, RELAY_DB] [default: ~/.local/share/crosstalk/store]
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
    },
    /// Answer an open question by its id, or decide a permission prompt (allow or deny);
    /// refuses a plain message or one already answered.  Example: crosstalk answer dev 42 allow
    Answer {
        #[command(flatten)]
        relay: RelayArgs,
        /// The question's channel.
        #[arg(value_parser = channel_name)]
        channel: ChannelName,
        /// The question's id (`crosstalk questions CHANNEL` lists the open ones).
        id: u64,
        /// The answer; to a PERMISSION (an agent host's tool prompt), allow or deny.
        text: String,
        /// Who answers [default: $USER]
        #[arg(long = "as")]
        sender: Option<String>,
    },
    /// List a channel's open questions, oldest first.  Example: crosstalk questions dev
    Questions {
        #[command(flatten)]
        relay: RelayArgs,
        /// The channel.
        #[arg(value_parser = channel_name)]
        channel: ChannelName,
        /// Only those for this recipient (and for everyone).
        #[arg(long = "for")]
        recipient: Option<String>,
        /// One JSON message per line, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Mint a single-use invite for an OAuth connection (a relay started with --oauth; needs
    /// its --token); prints the code alone on the last line.  Example: crosstalk invite --as worker-7
    Invite {
        #[command(flatten)]
        relay: RelayArgs,
        /// The identity the connection acts as (a participant's rules); without it, anyone
        /// but the admin.
        #[arg(long = "as")]
        me: Option<String>,
        /// How long the code stays good: 30m, 2h, 7d, or seconds (at most 30d) [default: 24h]
        #[arg(long)]
        expires: Option<Span>,
        /// A note for `crosstalk clients`, e.g. who it is for.
        #[arg(long)]
        note: Option<String>,
    },
    /// OAuth connections to the relay: who consented with which invite; --revoke ends one.
    /// Example: crosstalk clients --revoke 3f2a9c1b7d0e
    Clients {
        #[command(flatten)]
        relay: RelayArgs,
        /// End this connection (its `grant`) and every token of it, at once.
        #[arg(long, value_name = "GRANT", conflicts_with = "revoke_client")]
        revoke: Option<String>,
        /// End every connection of this client id.
        #[arg(long, value_name = "CLIENT_ID")]
        revoke_client: Option<String>,
        /// One JSON object per line, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Outbound webhooks (needs the relay's --token): list them with their delivery state,
    /// add one, remove one.  Example: crosstalk webhooks --add https://hooks.slack.com/… --channel ops --types QUESTION,PERMISSION --format slack
    Webhooks {
        #[command(flatten)]
        relay: RelayArgs,
        /// Add a webhook to this URL (prints its signing secret once).
        #[arg(long, value_name = "URL", requires = "channel")]
        add: Option<String>,
        /// The channel the webhook follows.
        #[arg(long)]
        channel: Option<String>,
        /// Message types to send, comma-separated (QUESTION, PERMISSION, DIRECTIVE, …) [default: all]
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// json (signed, default) or slack (a Slack incoming webhook's text).
        #[arg(long)]
        format: Option<String>,
        /// Remove this webhook.
        #[arg(long, value_name = "ID", conflicts_with = "add")]
        remove: Option<String>,
        /// One JSON object per line, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Refuse a commit that touches paths another identity holds exclusively (path
    /// reservations): run in a git checkout, it reads the staged paths and exits 1 naming each
    /// holder; --install writes it as the repository's pre-commit hook.
    /// Example: crosstalk guard --as worker-1 --project crosstalk --install
    Guard {
        #[command(flatten)]
        relay: RelayArgs,
        /// Who is committing: its own reservations do not stop it [env: CROSSTALK_AS]
        #[arg(long = "as", env = "CROSSTALK_AS")]
        me: Option<String>,
        /// The project the reservations were made in (a repository's name or remote); without
        /// it, the reservations that name no project [env: CROSSTALK_PROJECT]
        #[arg(long, env = "CROSSTALK_PROJECT")]
        project: Option<String>,
        /// Write `crosstalk guard` with these settings as .git/hooks/pre-commit (not over a
        /// hook of someone else's).
        #[arg(long)]
        install: bool,
    },
    /// What is new for a registered identity on every channel it joined, from others; reading
    /// it moves that identity's read position.  Example: crosstalk inbox --as reviewer --session "$S"
    Inbox {
        #[command(flatten)]
        relay: RelayArgs,
        /// The identity.
        #[arg(long = "as")]
        me: String,
        /// The session token its `register` answered, while that session is live (an identity
        /// registered over MCP is bound to its MCP session instead) [env: CROSSTALK_SESSION]
        #[arg(long, env = "CROSSTALK_SESSION")]
        session: Option<String>,
        /// One JSON message per line, for scripts.
        #[arg(long)]
        json: bool,
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

/// A span of time on the command line: a number of seconds (`90`, `0.5`) or a span with its
/// unit (`30s`, `5m`, `1h30m`, `7d`), whichever option takes it.
#[derive(Debug, Clone, Copy)]
pub struct Span(Duration);

impl std::str::FromStr for Span {
    type Err = String;

    fn from_str(raw: &str) -> Result<Span, String> {
        let raw = raw.trim();
        let bad = || format!("{raw:?} is not a span of time: give seconds (90, 0.5) or a span (30s, 5m, 2h, 7d)");
        if let Ok(secs) = raw.parse::<f64>() {
            return Duration::try_from_secs_f64(secs).map(Span).map_err(|_| bad());
        }
        humantime::parse_duration(raw).map(Span).map_err(|_| bad())
    }
}

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

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

impl ClientCommand {
    /// The relay the command talks to (`status` finds its own from this, `stop` needs none).
    fn relay(&self) -> &RelayArgs {
        match self {
            ClientCommand::Send { relay, .. }
            | ClientCommand::Tail { relay, .. }
            | ClientCommand::Wait { relay, .. }
            | ClientCommand::Channels { relay, .. }
            | ClientCommand::Ask { relay, .. }
            | ClientCommand::Answer { relay, .. }
            | ClientCommand::Questions { relay, .. }
            | ClientCommand::Inbox { relay, .. }
            | ClientCommand::Invite { relay, .. }
            | ClientCommand::Clients { relay, .. }
            | ClientCommand::Webhooks { relay, .. }
            | ClientCommand::Guard { relay, .. }
            | ClientCommand::Status { relay, .. } => relay,
            ClientCommand::Stop { .. } => &NO_RELAY,
        }
    }
}

static NO_RELAY: RelayArgs = RelayArgs {
    relay: None,
    token: None,
};

/// The URL `crosstalk serve` would answer at with this environment ([`served::HOST_VARS`],
/// [`served::PORT_VARS`], else 127.0.0.1:8765), as a client on this machine reaches it.
fn serve_url() -> Result<String, Failure> {
    let host = served::env_setting(&served::HOST_VARS);
    let port = match served::env_setting(&served::PORT_VARS) {
        None => served::DEFAULT_PORT,
        Some((var, raw)) => raw.parse().map_err(|_| {
            Failure(
                format!("${var}={raw:?} is not a port: set it to 1-65535, or unset it"),
                2,
            )
        })?,
    };
    let host = host.map_or_else(|| served::DEFAULT_HOST.to_owned(), |(_, h)| h);
    Ok(match host.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
        Ok(ip) => served::local_url(std::net::SocketAddr::new(ip, port)),
        Err(_) => format!("http://{host}:{port}"),
    })
}

/// `crosstalk status`: who serves the data directory (as `serve` reads it) and where, and how
/// the relay there answers. It asks the relay named by `--relay`, else the one serving the
/// directory at the address it recorded, else where `serve` would listen.
async fn status(relay: &RelayArgs, data_dir: Option<std::path::PathBuf>) -> Result<Outcome, Failure> {
    let (dir, origin) = served::data_dir(data_dir);
    let holder = served::served_by(&dir)?;
    let recorded = holder
        .as_ref()
        .filter(|h| h.reachable_here())
        .and_then(|h| h.url.clone());
    let url = match (relay.given_url(), &recorded) {
        (Some(url), _) => url,
        (None, Some(url)) => url.clone(),
        (None, None) => serve_url()?,
    };
    let c = RelayClient::at(&url, relay.given_token())?;
    let d = dir.display();
    // `--data-dir X`, for advice, when the directory came from the command line.
    let same_dir = match origin {
        served::Origin::Flag(_) => format!(" --data-dir {}", shell_quote(&d.to_string())),
        _ => String::new(),
    };
    let local = match &holder {
        None => format!("no relay uses {d}"),
        Some(h) if !h.reachable_here() => format!("{d} is served by {}", h.who()),
        Some(h) => match &h.url {
            Some(at) => format!("pid {} serves {d} at {at}", h.pid),
            None => format!("pid {} serves {d}", h.pid),
        },
    };
    let answer = match c.http.get(c.url("/healthz")).send().await {
        Ok(r) => r,
        Err(e) => {
            let advice = match &holder {
                None => format!("Start one with `crosstalk serve{same_dir}`"),
                Some(h) if !h.reachable_here() => h.stop_elsewhere().replacen("stop it", "ask it", 1),
                Some(h) => match &h.url {
                    Some(at) if *at != c.base => format!("Ask it there: `crosstalk status --relay {at}`"),
                    _ => format!(
                        "It may still be starting, or be stuck: `crosstalk stop{same_dir}` stops it (pid {})",
                        h.pid
                    ),
                },
            };
            println!(
                "cannot reach a relay at {} ({}); {local}. {advice}",
                c.base,
                c.why_unreachable(&e)
            );
            return Ok(Outcome::TimedOut);
        }
    };
    let code = answer.status();
    let health: Value = answer.json().await.unwrap_or(Value::Null);
    let Some(state) = health["status"].as_str() else {
        println!(
            "something answers at {} but not as a crosstalk relay (GET /healthz: {code}): --relay takes a \
             relay's own address, such as {}; {local}",
            c.base,
            crate::client::DEFAULT_RELAY
        );
        return Ok(Outcome::TimedOut);
    };
    println!(
        "relay at {}: {state} (streams {}, waits {}); {local}",
        c.base, health["streams"], health["waits"]
    );
    if !code.is_success() {
        println!("  why: {}", health["reason"].as_str().unwrap_or("no reason given"));
        return Ok(Outcome::TimedOut);
    }
    Ok(Outcome::Done)
}

/// `crosstalk stop`: SIGTERM to the relay serving the data directory (as `serve` reads it),
/// then wait until it has let the directory go.
async fn stop(data_dir: Option<std::path::PathBuf>) -> Result<Outcome, Failure> {
    let (dir, origin) = served::data_dir(data_dir);
    let d = dir.display();
    let Some(holder) = served::served_by(&dir)? else {
        let hint = match origin {
            served::Origin::Default => {
                " (a relay started with --data-dir or CROSSTALK_DATA_DIR is stopped with the same setting)".to_owned()
            }
            o => format!(" (the directory {o} names)"),
        };
        eprintln!("crosstalk: no relay uses {d}{hint}");
        return Ok(Outcome::TimedOut);
    };
    if !holder.reachable_here() {
        return Err(Failure(
            format!(
                "{d} is served by {}, which a signal from here cannot reach: {}",
                holder.who(),
                holder.stop_elsewhere()
            ),
            2,
        ));
    }
    let pid = holder.pid;
    // SAFETY: kill(2) with a pid read from the pid file its holder locks, in this namespace.
    if unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Failure(format!("cannot stop pid {pid}: {e}"), 2));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while served::served_by(&dir)?.is_some() {
        if tokio::time::Instant::now() > deadline {
            return Err(Failure(
                format!(
                    "the relay (pid {pid}) still serves {} 15 s after SIGTERM; its log says what holds \
                     it up. `kill -KILL {pid}` stops it now: what it acknowledged is on disk already \
                     (unless it runs with --durability relaxed), and the next `crosstalk serve` on that \
                     directory starts from there",
                    dir.display()
                ),
                2,
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("stopped the relay (pid {pid}) using {d}");
    Ok(Outcome::Done)
}

/// The first line of a hook `crosstalk guard --install` wrote: how it knows its own.
const GUARD_HOOK_MARK: &str = "# written by crosstalk guard --install";

/// Runs `git` in the current directory; its stdout, or why it failed in one line (git's
/// first line of complaint, not the usage text some of its commands print after it).
fn git(args: &[&str]) -> Result<Vec<u8>, Failure> {
    let out = std::process::Command::new("git")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Failure(format!("cannot run git ({e}): crosstalk guard needs git on PATH"), 2))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let first = said
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("no reason given");
        return Err(Failure(format!("git {} failed: {first}", args.join(" ")), 2));
    }
    Ok(out.stdout)
}

/// Refuses to go on outside a git checkout, saying where to run instead.
fn in_checkout() -> Result<(), Failure> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Failure(format!("cannot run git ({e}): crosstalk guard needs git on PATH"), 2))?;
    if !out.status.success() {
        let here = std::env::current_dir().map_or_else(|_| "here".into(), |d| d.display().to_string());
        return Err(Failure(
            format!(
                "{here} is not in a git checkout: run crosstalk guard inside the repository whose commits it checks"
            ),
            2,
        ));
    }
    Ok(())
}

/// `crosstalk guard --install`: the hook runs this binary with the same settings (the token
/// stays in the environment, never in the file).
fn install_guard(relay: &RelayArgs, me: Option<&str>, project: Option<&str>) -> Result<Outcome, Failure> {
    in_checkout()?;
    let hooks = String::from_utf8_lossy(&git(&["rev-parse", "--git-path", "hooks"])?)
        .trim()
        .to_owned();
    let hook = std::path::Path::new(&hooks).join("pre-commit");
    if let Ok(existing) = std::fs::read_to_string(&hook) {
        if !existing.contains(GUARD_HOOK_MARK) {
            return Err(Failure(
                format!(
                    "{} exists and is not crosstalk's; add `crosstalk guard` to it yourself",
                    hook.display()
                ),
                2,
            ));
        }
    }
    let exe = std::env::current_exe().map_err(|e| Failure(format!("cannot find this program: {e}"), 2))?;
    let mut line = format!("exec {} guard", shell_quote(&exe.to_string_lossy()));
    if let Some(url) = &relay.relay {
        line.push_str(&format!(" --relay {}", shell_quote(url)));
    }
    if let Some(me) = me {
        line.push_str(&format!(" --as {}", shell_quote(me)));
    }
    if let Some(p) = project {
        line.push_str(&format!(" --project {}", shell_quote(p)));
    }
    let script = format!(
        "#!/bin/sh\n{GUARD_HOOK_MARK}: refuses a commit that touches paths another agent holds.\n\
         # Skip it once with git commit --no-verify.\n{line}\n"
    );
    std::fs::create_dir_all(&hooks).map_err(|e| Failure(format!("cannot create {hooks}: {e}"), 2))?;
    std::fs::write(&hook, script).map_err(|e| Failure(format!("cannot write {}: {e}", hook.display()), 2))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Failure(format!("cannot make {} executable: {e}", hook.display()), 2))?;
    }
    eprintln!("wrote {}", hook.display());
    Ok(Outcome::Done)
}

/// `crosstalk guard`: the staged paths against the exclusive reservations others hold. A path
/// no reservation pattern could spell ([`reservation::path`]) cannot be checked: it is refused
/// too, with why, whatever is reserved.
async fn guard(c: &RelayClient, me: &str, project: Option<&str>) -> Result<Outcome, Failure> {
    use crosstalk_schema::reservation;
    in_checkout()?;
    let staged = git(&["diff", "--cached", "--name-only", "--no-renames", "-z"])?;
    let mut paths: Vec<&str> = Vec::new();
    let mut unfit = 0;
    for raw in staged.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        match reservation::path(raw) {
            Ok(p) => paths.push(p),
            Err(why) => {
                unfit += 1;
                // Escaped: a control character in a name must not reach the terminal.
                eprintln!(
                    "{:?}: cannot be checked against reservations: {why}",
                    String::from_utf8_lossy(raw)
                );
            }
        }
    }
    if paths.is_empty() && unfit == 0 {
        return Ok(Outcome::Done);
    }
    let request = ListReservationsRequest {
        project: Some(project.unwrap_or("").to_owned()),
        holder: None,
    };
    let list = c.call(api::LIST_RESERVATIONS, &request).await?;
    let mut blocked = 0;
    for r in list.reservations.iter().filter(|r| r.holder != me && r.exclusive) {
        for path in &paths {
            let covering = r.paths.iter().find(|p| reservation::matches(p, path));
            if let Some(pattern) = covering {
                blocked += 1;
                let reason = Some(r.reason.as_str()).filter(|s| !s.is_empty());
                eprintln!(
                    "{path}: held by {} ({pattern}, exclusive, until {}): {}",
                    r.holder,
                    r.expires_at,
                    reason.unwrap_or("no reason given")
                );
            }
        }
    }
    let refused = match (blocked, unfit) {
        (0, 0) => return Ok(Outcome::Done),
        (b, 0) => format!("{b} staged path(s) are held by another agent; ask the holder"),
        (0, u) => format!("{u} staged path(s) cannot be checked against reservations; rename them"),
        (b, u) => format!(
            "{b} staged path(s) are held by another agent and {u} cannot be checked; ask the holder, rename them"
        ),
    };
    Err(Failure(format!("{refused}, or commit with --no-verify"), 1))
}

/// Runs a client command.
pub async fn run(cmd: ClientCommand) -> Result<Outcome, Failure> {
    // `status` finds its relay its own way, and `stop` talks to none: neither reads --relay
    // (or CROSSTALK_URL) as the others do, so a value there meant for them cannot fail them.
    let relay = match cmd {
        ClientCommand::Status { relay, data_dir } => return status(&relay, data_dir).await,
        ClientCommand::Stop { data_dir } => return stop(data_dir).await,
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
        } => guard_command(&c, relay, me, project, install).await,
        ClientCommand::Send {
            channel,
            body,
            kind,
            to,
            reply_to,
            sender,
            ..
        } => send(&c, channel, body, kind, to, reply_to, sender).await,
        ClientCommand::Invite { me, expires, note, .. } => invite(&c, me, expires, note).await,
        ClientCommand::Clients {
            revoke,
            revoke_client,
            json,
            ..
        } => clients(&c, revoke, revoke_client, json).await,
        ClientCommand::Webhooks {
            add,
            channel,
            types,
            format,
            remove,
            json,
            ..
        } => webhooks(&c, add, channel, types, format, remove, json).await,
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
    }
}

/// `crosstalk guard`, or with `--install` the hook that runs it before each commit.
async fn guard_command(
    c: &RelayClient,
    relay: RelayArgs,
    me: Option<String>,
    project: Option<String>,
    install: bool,
) -> Result<Outcome, Failure> {
    if install {
        return install_guard(&relay, me.as_deref(), project.as_deref());
    }
    let Some(me) = me.filter(|m| !m.trim().is_empty()) else {
        return Err(Failure("name who is committing: --as ID (or CROSSTALK_AS)".into(), 2));
    };
    guard(c, &me, project.as_deref()).await
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

/// `crosstalk invite`.
async fn invite(
    c: &RelayClient,
    me: Option<String>,
    expires: Option<Span>,
    note: Option<String>,
) -> Result<Outcome, Failure> {
    let request = InviteRequest {
        identity: me,
        // Whole seconds, rounded up: `0.5` is a second, not a refused zero.
        expires_in_s: expires.map(|d| d.0.as_secs() + u64::from(d.0.subsec_nanos() > 0)),
        note,
    };
    let invite = c.call(api::MINT_INVITE, &request).await?;
    eprintln!(
        "invite {} for {}, good once until {}; type it into the relay's consent page:",
        invite.invite_id,
        invite
            .identity
            .map_or("anyone (not the admin)".to_owned(), |a| format!("{a:?}")),
        invite.expires_at,
    );
    println!("{}", invite.code);
    Ok(Outcome::Done)
}

/// `crosstalk clients`.
async fn clients(
    c: &RelayClient,
    revoke: Option<String>,
    revoke_client: Option<String>,
    json: bool,
) -> Result<Outcome, Failure> {
    match (revoke, revoke_client) {
        (Some(g), _) => {
            let missing = format!("there is no connection {g:?} (see crosstalk clients)");
            delete(c, api::REVOKE_GRANT, &GrantId { grant: g.clone() }, &missing).await?;
            eprintln!("revoked {g}: its tokens are refused from now on");
        }
        (None, Some(id)) => {
            let query = ClientQuery { client_id: id.clone() };
            let r = c.call(api::REVOKE_CLIENT, &query).await?;
            eprintln!("revoked {} connection(s) of {id}", r.revoked);
        }
        (None, None) => {
            let all = c.call(api::LIST_CLIENTS, &NoArgs {}).await?.clients;
            if all.is_empty() && !json {
                eprintln!("no OAuth connections (mint an invite with crosstalk invite)");
            }
            for g in &all {
                if json {
                    println!("{}", Json(g));
                } else {
                    println!(
                        "{:<14} {:<28} as {:<16} via {:<24} since {}",
                        g.grant,
                        g.client_name,
                        g.identity.as_deref().unwrap_or("anyone"),
                        g.redirect_host,
                        g.created_at,
                    );
                }
            }
        }
    }
    Ok(Outcome::Done)
}

/// `crosstalk webhooks`.
async fn webhooks(
    c: &RelayClient,
    add: Option<String>,
    channel: Option<String>,
    types: Vec<String>,
    format: Option<String>,
    remove: Option<String>,
    json: bool,
) -> Result<Outcome, Failure> {
    if let Some(url) = add {
        let format = match format.as_deref() {
            None => None,
            Some(f) => Some(
                serde_json::from_value(Value::String(f.to_ascii_lowercase()))
                    .map_err(|_| Failure(format!("--format {f:?}: use json or slack"), 2))?,
            ),
        };
        let Some(channel) = channel else {
            return Err(Failure("name the channel to follow: --channel CH".into(), 2));
        };
        let hook = c
            .call(
                api::ADD_WEBHOOK,
                &NewWebhook {
                    channel,
                    url,
                    types,
                    format,
                },
            )
            .await?;
        eprintln!(
            "webhook {} follows {}; it signs each delivery with this secret (shown once):",
            hook.id, hook.channel
        );
        println!("{}", hook.secret.unwrap_or_default());
        return Ok(Outcome::Done);
    }
    if let Some(id) = remove {
        let missing = format!("there is no webhook {id:?} (see crosstalk webhooks)");
        delete(c, api::REMOVE_WEBHOOK, &WebhookId { id: id.clone() }, &missing).await?;
        eprintln!("removed webhook {id}");
        return Ok(Outcome::Done);
    }
    let all = c.call(api::LIST_WEBHOOKS, &NoArgs {}).await?.webhooks;
    if all.is_empty() && !json {
        eprintln!("no webhooks (add one with crosstalk webhooks --add URL --channel CH)");
    }
    for h in &all {
        if json {
            println!("{}", Json(h));
            continue;
        }
        let d = &h.delivery;
        let state = match &d.last_error {
            Some(e) => format!("FAILING ({} attempts): {e}", d.attempts),
            None => format!("ok, {} delivered", d.delivered),
        };
        println!(
            "{:<14} #{:<16} {:<8} {:<28} {} — {}",
            h.id,
            h.channel,
            h.format.as_str(),
            if h.types.is_empty() {
                "all types".to_owned()
            } else {
                h.types.join(",")
            },
            h.url,
            state
        );
    }
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
