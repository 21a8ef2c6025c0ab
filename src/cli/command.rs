//! The client commands as the command line spells them.

use super::{channel_name, RelayArgs};
use clap::Subcommand;
use crosstalk_schema::ChannelName;
use std::time::Duration;

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
    /// Run an agent's turn whenever a message for it arrives: its command once per turn, the
    /// new messages in its prompt, one turn at a time, each message handed once (see
    /// docs/wake.md).  Example: crosstalk wake --as reviewer --listen dev -- claude -p -c "{prompt}"
    Wake {
        #[command(flatten)]
        relay: RelayArgs,
        /// The identity it runs turns for [env: CROSSTALK_AS]
        #[arg(long = "as", env = "CROSSTALK_AS", hide_env = true)]
        me: String,
        /// Also wake on every message (from someone else) on this channel; repeatable.
        #[arg(long, value_parser = channel_name)]
        listen: Vec<ChannelName>,
        /// A turn that runs longer is stopped and counts as failed.
        #[arg(long, default_value = "10m")]
        turn_timeout: Span,
        /// Times a failed turn is tried again (with backoff) before a person is asked.
        #[arg(long, default_value_t = 3)]
        retries: u32,
        /// Turns in a row that only agents' messages woke, per channel, before waking stops for
        /// it and a person is asked (0: no guard).
        #[arg(long, default_value_t = 6)]
        loop_guard: u32,
        /// Turns an hour, across every channel, before waking stops and a person is asked (0: no
        /// budget).
        #[arg(long, default_value_t = 30)]
        max_turns_per_hour: u32,
        /// Post the command's stdout as a message from the identity on the channel that woke it
        /// (for agents without crosstalk tools).
        #[arg(long)]
        post_output: bool,
        /// Where each identity's turn log goes [default: the local relay's folder, wake/]
        #[arg(long)]
        log_dir: Option<std::path::PathBuf>,
        /// On SIGTERM, how long a running turn has to finish before it is stopped.
        #[arg(long, default_value = "30s")]
        grace: Span,
        /// The agent's command; `{prompt}` in it is the prompt, else the prompt is its stdin.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

/// A span of time on the command line: a number of seconds (`90`, `0.5`) or a span with its
/// unit (`30s`, `5m`, `1h30m`, `7d`), whichever option takes it.
#[derive(Debug, Clone, Copy)]
pub struct Span(pub Duration);

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

impl ClientCommand {
    /// The relay the command talks to (`status` finds its own from this, `stop` needs none).
    pub(super) fn relay(&self) -> &RelayArgs {
        match self {
            ClientCommand::Send { relay, .. }
            | ClientCommand::Tail { relay, .. }
            | ClientCommand::Wait { relay, .. }
            | ClientCommand::Channels { relay, .. }
            | ClientCommand::Ask { relay, .. }
            | ClientCommand::Answer { relay, .. }
            | ClientCommand::Questions { relay, .. }
            | ClientCommand::Inbox { relay, .. }
            | ClientCommand::Wake { relay, .. }
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
