//! Command line and environment. Every setting has a flag and a `CROSSTALK_*` variable;
//! crosstalk-mcp's `HOST`, `PORT` and `RELAY_DB` are honoured too, below our own names.

use crate::client::served::{self, Origin};
use clap::{Parser, Subcommand, ValueEnum};
use crosstalk_actors::{Durability, Retention};
use crosstalk_schema::ChannelName;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

pub mod settings;

#[derive(Debug, Parser)]
#[command(
    name = "crosstalk",
    version,
    about = "A durable, ordered relay for AI coding agents and the humans overseeing them"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay (bare `crosstalk` prints this help instead).
    Serve(Box<ServeArgs>),
    /// An MCP server on stdin/stdout backed by a relay (local mode with none named).
    Mcp(Box<crate::bridge::McpArgs>),
    #[command(flatten)]
    Client(crate::cli::ClientCommand),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// Acknowledge a write only after it is flushed to disk (survives a process crash).
    Flush,
    /// Also fdatasync before acknowledging (survives a power loss); slower.
    Fsync,
    /// Acknowledge at once; the store flushes every 500 ms. A crash can lose acknowledged writes.
    Relaxed,
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// Address to bind
    #[arg(long, help_heading = "Network")]
    pub host: Option<String>,
    /// Port to bind; 0 picks a free one
    #[arg(long, help_heading = "Network")]
    pub port: Option<u16>,
    /// Host names (or host:port) the relay answers to besides loopback, comma-separated;
    /// a defence against DNS rebinding
    #[arg(long, help_heading = "Network")]
    pub allowed_hosts: Option<String>,
    /// Browser origins (`https://app.example.com`) allowed to call the relay cross-site,
    /// comma-separated; none by default
    #[arg(long, help_heading = "Network")]
    pub cors_origins: Option<String>,
    /// HTTP worker threads
    #[arg(long, help_heading = "Network")]
    pub workers: Option<usize>,
    /// Shared bearer token required on every route but /healthz
    #[arg(long, help_heading = "Access")]
    pub token: Option<String>,
    /// Per-participant tokens, `id:token,…`: each acts only as its id
    #[arg(long, help_heading = "Access")]
    pub participants: Option<String>,
    /// A file of participant tokens, one `id:token` per line (`#` comments), so tokens need not
    /// be in the environment or the process list
    #[arg(long, help_heading = "Access")]
    pub participants_file: Option<PathBuf>,
    /// Serve beyond loopback without a token. Anyone who can reach the port can then read,
    /// post and act as anyone: only for a network you fully trust.
    #[arg(long, help_heading = "Access")]
    pub insecure_open: bool,
    /// Participants that are people, comma-separated: they (and the --token holder) decide an
    /// agent host's permission prompts
    #[arg(long, help_heading = "Access")]
    pub humans: Option<String>,
    /// Be an OAuth 2.1 authorization server, so hosted clients (Claude.ai, ChatGPT, Claude
    /// Desktop connectors) connect with single-use invites (`crosstalk invite`); needs --token,
    /// the admin's
    #[arg(long, help_heading = "Access")]
    pub oauth: bool,
    /// The address clients reach the relay at, `https://relay.example.com` (an origin, no
    /// path): OAuth's issuer and resource
    #[arg(long, help_heading = "Access")]
    pub public_url: Option<String>,
    /// Let webhooks deliver to loopback and private addresses (a receiver on this machine or
    /// network); refused by default
    #[arg(long, help_heading = "Access")]
    pub webhooks_allow_private: bool,
    /// Tests: a CA certificate (PEM) to trust when fetching a client's metadata document.
    #[arg(long, hide = true)]
    pub oauth_cimd_ca: Option<PathBuf>,
    /// Tests: fetch metadata documents from loopback and private addresses too.
    #[arg(long, hide = true)]
    pub oauth_cimd_allow_private: bool,
    /// Largest message body accepted, in bytes
    #[arg(long, help_heading = "Limits")]
    pub max_body_bytes: Option<usize>,
    /// Largest shared data content, in bytes
    #[arg(long, help_heading = "Limits")]
    pub max_shared_bytes: Option<usize>,
    /// Most channels the relay holds; creating one more is refused
    #[arg(long, help_heading = "Limits")]
    pub max_channels: Option<usize>,
    /// Most channels a token of one client (a participant's, an OAuth connection's) may bring
    /// into being, counted from the relay's start; more is refused (429)
    #[arg(long, help_heading = "Limits")]
    pub max_channels_per_participant: Option<usize>,
    /// Most live path reservations a token of one client may hold, across all projects
    #[arg(long, help_heading = "Limits")]
    pub max_reservations_per_participant: Option<usize>,
    /// Most shared data keys a token of one client may keep
    #[arg(long, help_heading = "Limits")]
    pub max_shared_keys_per_participant: Option<usize>,
    /// Most bytes of messages one read answers with (at least one message); a longer page is
    /// cut there and says more follow
    #[arg(long, help_heading = "Limits")]
    pub max_answer_bytes: Option<usize>,
    /// Most waits and streams one token (or, without tokens, everyone) may hold open at once
    #[arg(long, help_heading = "Limits")]
    pub max_waits_per_principal: Option<usize>,
    /// Longest URL (path and query) read, in bytes; a longer one is refused (414)
    #[arg(long, help_heading = "Limits")]
    pub max_url_bytes: Option<usize>,
    /// Most MCP sessions one token (or, without tokens, everyone) may hold open, on /mcp and
    /// /cc/mcp together; an `initialize` beyond it is refused (429)
    #[arg(long, help_heading = "Limits")]
    pub max_sessions_per_principal: Option<usize>,
    /// Most MCP sessions a token of one client (a participant's, an OAuth connection's) may hold
    /// open; the lower of this and --max-sessions-per-principal applies to it
    #[arg(long, help_heading = "Limits")]
    pub max_sessions_per_participant: Option<usize>,
    /// Requests a second each token may make, bursts up to one second's worth; 0 for no limit
    #[arg(long, help_heading = "Limits")]
    pub rate_limit: Option<u32>,
    /// Failed authentications a second one client address may make (a wrong or missing token),
    /// bursts up to one second's worth; beyond it, 429 instead of 401; 0 for no limit
    #[arg(long, help_heading = "Limits")]
    pub auth_failure_rate: Option<u32>,
    /// Longest long-poll wait a client may ask for, in seconds
    #[arg(long, help_heading = "Limits")]
    pub wait_cap_secs: Option<u64>,
    /// Longest MCP `wait_for_message`, in seconds; keep it under your MCP host's tool-call
    /// timeout
    #[arg(long, help_heading = "Limits")]
    pub mcp_wait_cap_secs: Option<u64>,
    /// Longest wait of an MCP call the client runs as a task (`wait_for_message`,
    /// `ask_human`, `wait_for_reply`), in seconds
    #[arg(long, help_heading = "Limits")]
    pub task_wait_cap_secs: Option<u64>,
    /// Which tools `/mcp` lists: full, or core (post, read, wait, ask: a third of the bytes
    /// in every agent turn); a client can choose with `/mcp?tools=` or the
    /// `X-Crosstalk-Tools` header
    #[arg(long, value_enum, help_heading = "MCP")]
    pub tools: Option<crate::mcp::tools::ToolChoice>,
    /// Directory of the store
    #[arg(long, help_heading = "Storage")]
    pub data_dir: Option<PathBuf>,
    /// When a write is acknowledged
    #[arg(long, help_heading = "Storage", value_enum)]
    pub durability: Option<DurabilityArg>,
    /// Seconds without a heartbeat before a participant is offline
    #[arg(long, help_heading = "Presence")]
    pub presence_ttl_secs: Option<u64>,
    /// When every active party on a channel waits, milliseconds before one is told to speak
    /// first
    #[arg(long, help_heading = "Presence")]
    pub release_grace_ms: Option<u64>,
    /// Seconds a channel nobody uses (no wait, stream or write in flight) stays in memory
    /// before its actor stops; it reopens from the store on the next use. 0 keeps every channel
    /// open
    #[arg(long, help_heading = "Presence")]
    pub idle_after_secs: Option<u64>,
    /// With more channels than this in memory, the longest-unused of those unused for a second
    /// leave it before --idle-after-secs (channels with a wait, stream or write stay)
    #[arg(long, help_heading = "Presence")]
    pub max_open_channels: Option<usize>,
    /// Remove messages older than this many seconds
    #[arg(long, help_heading = "Retention")]
    pub retention_max_age_secs: Option<u64>,
    /// Keep at most this many messages per channel
    #[arg(long, help_heading = "Retention")]
    pub retention_max_count: Option<u64>,
    /// Per-channel retention, `NAME=MAX_COUNT/MAX_AGE_SECS` (either may be empty), comma-separated
    #[arg(long, help_heading = "Retention")]
    pub retention_channels: Option<String>,
    /// Seconds between retention passes
    #[arg(long, help_heading = "Retention")]
    pub retention_interval_secs: Option<u64>,
    /// Share channels with other relay nodes through NATS JetStream: `nats://host:4222[,…]`.
    /// Each node keeps its own copy in --data-dir
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub store: Option<String>,
    /// Copies of the JetStream stream: 3 on a three-server cluster
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_replicas: Option<usize>,
    /// Milliseconds a loaded node's next log message waits to fill, 0 to 20; 0 sends each at
    /// once
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_linger_ms: Option<u64>,
    /// Name of the JetStream stream holding the channels
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_stream: Option<String>,
    /// NATS credentials file (.creds)
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_creds: Option<PathBuf>,
    /// NATS user, with --nats-password
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_user: Option<String>,
    /// NATS password
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_password: Option<String>,
    /// NATS token
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_token: Option<String>,
    /// CA certificate (PEM) to trust for NATS' TLS
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_tls_ca: Option<PathBuf>,
    /// Client certificate and key (PEM), `CERT,KEY`, for servers that verify clients
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_tls_cert: Option<String>,
    /// Refuse to talk to NATS without TLS
    #[arg(long, help_heading = "Cluster (NATS JetStream)")]
    pub nats_tls_required: bool,
}

/// The resolved configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: String,
    /// Where the host came from: a refusal caused by a `$HOST` the shell set says so.
    pub host_origin: Origin,
    pub port: u16,
    /// Where the port came from.
    pub port_origin: Origin,
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// The shared log, when channels are shared with other nodes through NATS.
    pub nats: Option<crosstalk_actors::nats::NatsConfig>,
    pub wait_cap: Duration,
    pub presence_ttl: Duration,
    pub workers: usize,
    pub max_body_bytes: usize,
    pub release_grace: Duration,
    pub retention: Retention,
    pub channel_retention: HashMap<ChannelName, Retention>,
    pub retention_every: Duration,
    pub max_shared_bytes: usize,
    pub auth: crate::auth::Auth,
    /// Longest MCP `wait_for_message`.
    pub mcp_wait_cap: Duration,
    /// Longest wait of an MCP call run as a task.
    pub task_wait_cap: Duration,
    /// The tools `/mcp` lists unless a request chooses.
    pub tools: crate::mcp::tools::ToolChoice,
    /// Hosts the relay answers to in addition to loopback (never empty when set: an empty
    /// list would switch the DNS-rebinding check off).
    pub allowed_hosts: Vec<String>,
    /// Origins allowed cross-site (CORS), exactly as browsers send them.
    pub cors_origins: Vec<String>,
    /// Serving beyond loopback without a token was asked for explicitly.
    pub insecure_open: bool,
    /// Participant identities that are people (`--humans`).
    pub humans: Vec<String>,
    /// Be an OAuth authorization server (`--oauth`).
    pub oauth: bool,
    /// The origin clients reach the relay at (`--public-url`), if given.
    pub public_url: Option<String>,
    /// Webhooks may deliver to private addresses.
    pub webhooks_allow_private: bool,
    /// An extra CA (PEM) for metadata-document fetches (tests).
    pub oauth_cimd_ca: Option<Vec<u8>>,
    /// Metadata documents may be fetched from private addresses (tests).
    pub oauth_cimd_allow_private: bool,
    /// Most waits and streams one principal may hold open.
    pub max_waits_per_principal: usize,
    /// Most MCP sessions one principal may hold open.
    pub max_sessions_per_principal: usize,
    /// Most MCP sessions a token of one client may hold open.
    pub max_sessions_per_participant: usize,
    /// Longest URL read, in bytes.
    pub max_url_bytes: usize,
    /// Most channels the relay holds.
    pub max_channels: usize,
    /// Most channels, live reservations and shared data keys a token of one client may make.
    pub max_channels_per_participant: usize,
    pub max_reservations_per_participant: usize,
    pub max_shared_keys_per_participant: usize,
    /// Most bytes of messages' JSON one read answers with.
    pub max_answer_bytes: usize,
    /// How long an unused channel actor lives (`None`: forever).
    pub idle_after: Option<Duration>,
    /// Open channel actors above which the longest-unused leave early.
    pub max_open_channels: usize,
    /// Requests a second per token (0: unlimited).
    pub rate_limit: u32,
    /// Failed authentications a second per client address (0: unlimited).
    pub auth_failure_rate: u32,
}

fn truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}

/// `--public-url`: an origin (`scheme://host[:port]`, no path), https unless loopback, in the
/// one spelling OAuth clients compare byte for byte — lowercase, no default port, no slash.
pub fn public_url(raw: &str) -> Result<String, String> {
    let bad = |why: &str| format!("--public-url {raw:?}: {why}");
    let u: http::Uri = raw.trim().parse().map_err(|_| bad("not a URL"))?;
    let scheme = u
        .scheme_str()
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| bad("name the scheme, https://"))?;
    let host = u
        .host()
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| bad("name the host"))?;
    if u.path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return Err(bad(
            "an origin only, without a path or query (serve the relay at the root of its host)",
        ));
    }
    let loopback = matches!(host.as_str(), "localhost" | "127.0.0.1" | "[::1]");
    match scheme.as_str() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(bad(
                "OAuth clients need https:// beyond loopback (put the relay behind a TLS proxy)",
            ))
        }
        _ => return Err(bad("http:// or https:// only")),
    }
    let port = match (scheme.as_str(), u.port_u16()) {
        ("https", Some(443)) | ("http", Some(80)) | (_, None) => String::new(),
        (_, Some(p)) => format!(":{p}"),
    };
    Ok(format!("{scheme}://{host}{port}"))
}

/// The `--store` and `--nats-*` settings; `None` for the default (sled, this relay alone).
fn nats_config(args: &ServeArgs) -> Result<Option<crosstalk_actors::nats::NatsConfig>, String> {
    let store: Option<String> = pick(args.store.clone(), settings::env("store"))?;
    let Some(store) = store.filter(|s| !s.trim().is_empty() && s.trim() != "sled") else {
        return Ok(None);
    };
    if !store.trim_start().starts_with("nats://") && !store.trim_start().starts_with("tls://") {
        return Err(format!(
            "--store {store:?} is neither `sled` nor a list of nats:// URLs"
        ));
    }
    let mut c = crosstalk_actors::nats::NatsConfig::from_urls(&store)?;
    c.replicas =
        pick(args.nats_replicas, settings::env("nats-replicas"))?.unwrap_or(crosstalk_actors::nats::DEFAULT_REPLICAS);
    if !(1..=5).contains(&c.replicas) {
        return Err("--nats-replicas must be 1 to 5".into());
    }
    if let Some(ms) = pick(args.nats_linger_ms, settings::env("nats-linger-ms"))? {
        if ms > 20 {
            return Err(format!(
                "--nats-linger-ms {ms}: at most 20 (every post of a loaded node may wait this long)"
            ));
        }
        c.linger = std::time::Duration::from_millis(ms);
    }
    if let Some(stream) = pick::<String>(args.nats_stream.clone(), settings::env("nats-stream"))? {
        if stream.is_empty() || stream.contains(|ch: char| ch.is_whitespace() || ".*>".contains(ch)) {
            return Err(format!(
                "--nats-stream {stream:?}: a stream name has no spaces, dots, * or >"
            ));
        }
        c.stream = stream;
    }
    c.creds = pick(args.nats_creds.clone(), settings::env("nats-creds"))?;
    let user: Option<String> = pick(args.nats_user.clone(), settings::env("nats-user"))?;
    let password: Option<String> = pick(args.nats_password.clone(), settings::env("nats-password"))?;
    c.user = match (user, password) {
        (Some(u), Some(p)) => Some((u, p)),
        (None, None) => None,
        _ => return Err("--nats-user and --nats-password go together".into()),
    };
    c.token = pick(args.nats_token.clone(), settings::env("nats-token"))?;
    c.tls_ca = pick(args.nats_tls_ca.clone(), settings::env("nats-tls-ca"))?;
    c.tls_cert = match pick::<String>(args.nats_tls_cert.clone(), settings::env("nats-tls-cert"))? {
        None => None,
        Some(pair) => match pair.split_once(',') {
            Some((cert, key)) => Some((cert.trim().into(), key.trim().into())),
            None => return Err("--nats-tls-cert is CERT,KEY".into()),
        },
    };
    c.tls_required = args.nats_tls_required;
    Ok(Some(c))
}

/// Parses `NAME=MAX_COUNT/MAX_AGE_SECS,…`.
fn channel_retention(raw: &str) -> Result<HashMap<ChannelName, Retention>, String> {
    let mut out = HashMap::new();
    for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || format!("retention {item:?} is not NAME=MAX_COUNT/MAX_AGE_SECS");
        let (name, spec) = item.split_once('=').ok_or_else(bad)?;
        let name = ChannelName::parse(name).map_err(|e| e.to_string())?;
        let (count, age) = spec.split_once('/').unwrap_or((spec, ""));
        let num = |s: &str| -> Result<Option<u64>, String> {
            match s.trim() {
                "" => Ok(None),
                n => n.parse().map(Some).map_err(|_| bad()),
            }
        };
        out.insert(
            name,
            Retention {
                max_count: num(count)?,
                max_age: num(age)?.map(Duration::from_secs),
            },
        );
    }
    Ok(out)
}

/// Default of `--wait-cap-secs`: the longest long-poll a client may ask for.
pub const DEFAULT_WAIT_CAP_SECS: u64 = 300;
/// Default cap on an MCP `wait_for_message`: under the 60 s after which some MCP hosts give
/// up on a tool call.
pub const DEFAULT_MCP_WAIT_CAP_SECS: u64 = 55;
/// Default of `--task-wait-cap-secs`: a day, time for a person to answer.
pub const DEFAULT_TASK_WAIT_CAP_SECS: u64 = 86_400;

/// Parses `--allowed-hosts`: comma-separated host names or `host:port` authorities. Refuses a
/// list with no host in it, so a blank setting can never switch the Host check off.
pub fn parse_allowed_hosts(raw: &str) -> Result<Vec<String>, String> {
    let hosts: Vec<String> = raw
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect();
    if hosts.is_empty() {
        return Err(
            "allowed hosts is empty: list at least one host name, or leave the setting unset for loopback only".into(),
        );
    }
    for h in &hosts {
        if h == "*" || h.contains('/') || h.contains(char::is_whitespace) || h.contains('@') {
            return Err(format!(
                "allowed host {h:?} is not a host name or host:port (wildcards are not supported)"
            ));
        }
    }
    Ok(hosts)
}

/// Participant tokens from the setting and from the file, as one `id:token,…` list.
fn participants(inline: Option<String>, file: Option<PathBuf>) -> Result<Option<String>, String> {
    let mut all: Vec<String> = inline.into_iter().collect();
    if let Some(path) = file {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read the participants file {}: {e}", path.display()))?;
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            if line.contains(',') {
                return Err(format!(
                    "participants file {}: one id:token per line, no commas",
                    path.display()
                ));
            }
            all.push(line.to_owned());
        }
    }
    Ok((!all.is_empty()).then(|| all.join(",")))
}

/// Parses `--cors-origins`: exact origins, never a wildcard.
pub fn parse_cors_origins(raw: &str) -> Result<Vec<String>, String> {
    let origins: Vec<String> = raw
        .split(',')
        .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
        .filter(|o| !o.is_empty())
        .collect();
    for o in &origins {
        let ok =
            (o.starts_with("http://") || o.starts_with("https://")) && !o.contains('*') && o.matches('/').count() == 2;
        if !ok {
            return Err(format!(
                "CORS origin {o:?} is not an origin like https://app.example.com (wildcards are not allowed)"
            ));
        }
    }
    Ok(origins)
}

/// First set of: the flag (named `flag_name`), then each environment variable in order, else
/// `default`; with where the value came from.
fn pick_from<T: std::str::FromStr>(
    flag: Option<T>,
    flag_name: &'static str,
    vars: &[&'static str],
    default: T,
) -> Result<(T, Origin), String> {
    if let Some(v) = flag {
        return Ok((v, Origin::Flag(flag_name)));
    }
    match crate::client::served::env_setting(vars) {
        None => Ok((default, Origin::Default)),
        Some((var, raw)) => raw
            .parse()
            .map(|v| (v, Origin::Env(var)))
            .map_err(|_| format!("{var}={raw:?} is not a valid value")),
    }
}

/// First set of: the flag, then each environment variable in order.
fn pick<T: std::str::FromStr>(flag: Option<T>, vars: &[&str]) -> Result<Option<T>, String> {
    if flag.is_some() {
        return Ok(flag);
    }
    for var in vars {
        if let Ok(raw) = std::env::var(var) {
            if raw.trim().is_empty() {
                continue;
            }
            return raw
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("{var}={raw:?} is not a valid value"));
        }
    }
    Ok(None)
}

impl Config {
    pub fn resolve(args: ServeArgs) -> Result<Config, String> {
        let durability = match pick::<String>(args.durability.map(|d| format!("{d:?}")), settings::env("durability"))? {
            None => Durability::Flush,
            Some(s) => match s.to_ascii_lowercase().as_str() {
                "flush" => Durability::Flush,
                "fsync" => Durability::Fsync,
                "relaxed" => Durability::Relaxed,
                other => return Err(format!("durability {other:?} is not one of: flush, fsync, relaxed")),
            },
        };
        let default_workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
        let workers = pick(args.workers, settings::env("workers"))?.unwrap_or(default_workers);
        if workers == 0 {
            return Err("workers must be at least 1".into());
        }
        let nats = nats_config(&args)?;
        let (host, host_origin) = pick_from(args.host, "--host", settings::env("host"), served::DEFAULT_HOST.into())?;
        let (port, port_origin) = pick_from(args.port, "--port", settings::env("port"), served::DEFAULT_PORT)?;
        Ok(Config {
            host,
            host_origin,
            port,
            port_origin,
            data_dir: served::data_dir(args.data_dir).0,
            durability,
            nats,
            wait_cap: Duration::from_secs(
                pick(args.wait_cap_secs, settings::env("wait-cap-secs"))?.unwrap_or(DEFAULT_WAIT_CAP_SECS),
            ),
            presence_ttl: Duration::from_secs(
                pick(args.presence_ttl_secs, settings::env("presence-ttl-secs"))?
                    .unwrap_or(crosstalk_actors::relay::DEFAULT_PRESENCE_TTL.as_secs())
                    .max(1),
            ),
            workers,
            max_body_bytes: pick(args.max_body_bytes, settings::env("max-body-bytes"))?
                .unwrap_or(crosstalk_schema::DEFAULT_MAX_BODY_BYTES),
            release_grace: Duration::from_millis(
                pick(args.release_grace_ms, settings::env("release-grace-ms"))?
                    .unwrap_or(crosstalk_actors::relay::DEFAULT_RELEASE_GRACE.as_millis() as u64),
            ),
            retention: Retention {
                max_age: pick(args.retention_max_age_secs, settings::env("retention-max-age-secs"))?
                    .map(Duration::from_secs),
                max_count: pick(args.retention_max_count, settings::env("retention-max-count"))?,
            },
            channel_retention: channel_retention(
                &pick(args.retention_channels, settings::env("retention-channels"))?.unwrap_or_default(),
            )?,
            retention_every: Duration::from_secs(
                pick(args.retention_interval_secs, settings::env("retention-interval-secs"))?
                    .unwrap_or(crosstalk_actors::relay::DEFAULT_RETENTION_EVERY.as_secs())
                    .max(1),
            ),
            max_shared_bytes: pick(args.max_shared_bytes, settings::env("max-shared-bytes"))?
                .unwrap_or(crosstalk_actors::relay::DEFAULT_MAX_SHARED_BYTES),
            auth: crate::auth::Auth::new(
                pick(args.token, settings::env("token"))?,
                participants(
                    pick::<String>(args.participants, settings::env("participants"))?,
                    pick(args.participants_file, settings::env("participants-file"))?,
                )?
                .as_deref(),
            )?,
            cors_origins: pick::<String>(args.cors_origins, settings::env("cors-origins"))?
                .map(|raw| parse_cors_origins(&raw))
                .transpose()?
                .unwrap_or_default(),
            insecure_open: args.insecure_open,
            humans: pick::<String>(args.humans, settings::env("humans"))?
                .map(|raw| {
                    raw.split(',')
                        .map(str::trim)
                        .filter(|h| !h.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            oauth: args.oauth || pick::<String>(None, settings::env("oauth"))?.is_some_and(|v| truthy(&v)),
            public_url: pick::<String>(args.public_url, settings::env("public-url"))?
                .map(|u| public_url(&u))
                .transpose()?,
            oauth_cimd_ca: args
                .oauth_cimd_ca
                .map(|p| std::fs::read(&p).map_err(|e| format!("--oauth-cimd-ca {}: {e}", p.display())))
                .transpose()?,
            oauth_cimd_allow_private: args.oauth_cimd_allow_private,
            webhooks_allow_private: args.webhooks_allow_private
                || pick::<String>(None, settings::env("webhooks-allow-private"))?.is_some_and(|v| truthy(&v)),
            rate_limit: pick(args.rate_limit, settings::env("rate-limit"))?.unwrap_or(crate::guard::DEFAULT_RATE),
            auth_failure_rate: pick(args.auth_failure_rate, settings::env("auth-failure-rate"))?
                .unwrap_or(crate::guard::DEFAULT_AUTH_FAILURE_RATE),
            max_channels: pick(args.max_channels, settings::env("max-channels"))?
                .unwrap_or(crosstalk_actors::relay::DEFAULT_MAX_CHANNELS)
                .max(1),
            max_channels_per_participant: pick(
                args.max_channels_per_participant,
                settings::env("max-channels-per-participant"),
            )?
            .unwrap_or(crosstalk_actors::relay::DEFAULT_MAX_CHANNELS_PER_OPENER)
            .max(1),
            max_reservations_per_participant: pick(
                args.max_reservations_per_participant,
                settings::env("max-reservations-per-participant"),
            )?
            .unwrap_or(crate::ops::DEFAULT_MAX_RESERVATIONS)
            .max(1),
            max_shared_keys_per_participant: pick(
                args.max_shared_keys_per_participant,
                settings::env("max-shared-keys-per-participant"),
            )?
            .unwrap_or(crate::ops::DEFAULT_MAX_SHARED_KEYS)
            .max(1),
            max_answer_bytes: pick(args.max_answer_bytes, settings::env("max-answer-bytes"))?
                .unwrap_or(crosstalk_actors::relay::DEFAULT_MAX_ANSWER_BYTES)
                .max(1),
            idle_after: match pick(args.idle_after_secs, settings::env("idle-after-secs"))? {
                Some(0) => None,
                Some(secs) => Some(Duration::from_secs(secs)),
                None => Some(crosstalk_actors::relay::DEFAULT_IDLE_AFTER),
            },
            max_open_channels: pick(args.max_open_channels, settings::env("max-open-channels"))?
                .unwrap_or(crosstalk_actors::relay::DEFAULT_MAX_OPEN_CHANNELS)
                .max(1),
            max_waits_per_principal: pick(args.max_waits_per_principal, settings::env("max-waits-per-principal"))?
                .unwrap_or(crate::ops::DEFAULT_MAX_HELD)
                .max(1),
            max_url_bytes: pick(args.max_url_bytes, settings::env("max-url-bytes"))?
                .unwrap_or(crate::guard::DEFAULT_MAX_URL_BYTES)
                .max(1),
            max_sessions_per_principal: pick(
                args.max_sessions_per_principal,
                settings::env("max-sessions-per-principal"),
            )?
            .unwrap_or(crate::mcp::owner::DEFAULT_MAX_SESSIONS)
            .max(1),
            max_sessions_per_participant: pick(
                args.max_sessions_per_participant,
                settings::env("max-sessions-per-participant"),
            )?
            .unwrap_or(crate::mcp::owner::DEFAULT_MAX_SESSIONS_PER_PARTICIPANT)
            .max(1),
            mcp_wait_cap: Duration::from_secs(
                pick(args.mcp_wait_cap_secs, settings::env("mcp-wait-cap-secs"))?.unwrap_or(DEFAULT_MCP_WAIT_CAP_SECS),
            ),
            task_wait_cap: Duration::from_secs(
                pick(args.task_wait_cap_secs, settings::env("task-wait-cap-secs"))?
                    .unwrap_or(DEFAULT_TASK_WAIT_CAP_SECS),
            ),
            tools: pick(args.tools, settings::env("tools"))?.unwrap_or_default(),
            allowed_hosts: match args.allowed_hosts {
                Some(flag) => parse_allowed_hosts(&flag)?,
                None => match std::env::var(settings::env("allowed-hosts")[0]) {
                    // Set but blank is refused like an empty flag, not read as "unset".
                    Ok(raw) => parse_allowed_hosts(&raw).map_err(|e| format!("CROSSTALK_ALLOWED_HOSTS: {e}"))?,
                    Err(_) => Vec::new(),
                },
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> ServeArgs {
        match Cli::try_parse_from(["crosstalk", "serve"].iter().chain(args))
            .unwrap()
            .command
        {
            Some(Command::Serve(a)) => *a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nats_linger_is_two_ms_unless_set_and_at_most_twenty() {
        let store = ["--store", "nats://127.0.0.1:4222"];
        let linger = |extra: &[&str]| {
            let args: Vec<&str> = store.iter().chain(extra).copied().collect();
            nats_config(&serve(&args)).map(|c| c.unwrap().linger)
        };
        assert_eq!(linger(&[]), Ok(std::time::Duration::from_millis(2)));
        assert_eq!(linger(&["--nats-linger-ms", "0"]), Ok(std::time::Duration::ZERO));
        assert_eq!(
            linger(&["--nats-linger-ms", "20"]),
            Ok(std::time::Duration::from_millis(20))
        );
        let err = linger(&["--nats-linger-ms", "21"]).unwrap_err();
        assert!(err.contains("at most 20"), "{err}");
    }

    #[test]
    fn public_url_is_one_canonical_origin() {
        assert_eq!(
            public_url("HTTPS://Relay.Example.com:443/").unwrap(),
            "https://relay.example.com"
        );
        assert_eq!(
            public_url("https://relay.example.com:8443").unwrap(),
            "https://relay.example.com:8443"
        );
        assert_eq!(public_url("http://127.0.0.1:8765").unwrap(), "http://127.0.0.1:8765");
        for bad in [
            "http://relay.example.com",
            "https://relay.example.com/relay",
            "relay.example.com",
            "ftp://x.example",
        ] {
            assert!(public_url(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn allowed_hosts_are_never_silently_empty() {
        assert_eq!(
            parse_allowed_hosts(" Relay.example.com, relay.example.com:8765 ").unwrap(),
            vec!["relay.example.com", "relay.example.com:8765"]
        );
        for bad in ["", " ", ",", " , ,", "*", "a b", "http://x"] {
            assert!(parse_allowed_hosts(bad).is_err(), "{bad:?} accepted");
        }
    }
}
