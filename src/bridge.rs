//! `crosstalk mcp`: an MCP server on stdin/stdout for hosts that spawn local servers. It is a
//! client of a relay: every tool, prompt and resource is the relay's own (`/mcp`, or `/cc/mcp`
//! with `--tools cross-claude`), forwarded over one streamable-HTTP session, so many stdio
//! children on one machine or many share one relay. It adds what only a local process can do:
//! live push of new messages into the session (`listen_live`, [`live`]), presence that follows
//! the process (its session is closed, and its identities signed off, when stdin closes or a
//! signal comes), and, with no relay named, a shared local relay it starts if none runs
//! ([`local`]). No rule lives here.

mod live;
mod local;
mod proxy;
mod setup;
mod watch;

use crate::client::{Failure, RelayArgs, RelayClient};
use clap::{Args, ValueEnum};
use rmcp::model::{InitializeResult, Prompt, ResourceTemplate, Tool};
use std::path::PathBuf;

/// Most bytes of JSON the bridge's `tools/list` may take with `--tools core` (the relay's core
/// tools and the bridge's own three, outside a turn of `crosstalk wake`): what a host with a
/// lean list puts in every turn.
pub const CORE_TOOLS_LIST_BUDGET: usize = 5_500;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ToolSet {
    /// crosstalk's tools, as `/mcp` offers them.
    Crosstalk,
    /// crosstalk's core tools only (post, read, wait, ask), as `/mcp?tools=core` lists them.
    Core,
    /// cross-claude-mcp's tools, names, arguments and prompt, as `/cc/mcp` offers them.
    CrossClaude,
}

impl ToolSet {
    fn path(self) -> &'static str {
        match self {
            ToolSet::Crosstalk => "/mcp",
            ToolSet::Core => "/mcp?tools=core",
            ToolSet::CrossClaude => "/cc/mcp",
        }
    }
}

/// What the relay offers on a tool set's endpoint, as a relay of this binary's version offers
/// it: the bridge gives it to the host at once, before it has reached the relay (or while it
/// cannot), and replaces it with the relay's own once a session is open. It comes from the
/// composition (`server::bridge_catalog`), which knows the relay's tool table; the bridge
/// itself is a client of a relay and knows no face.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    /// The relay's description: capabilities, name, instructions.
    pub info: InitializeResult,
    pub tools: Vec<Tool>,
    pub prompts: Vec<Prompt>,
    pub templates: Vec<ResourceTemplate>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Host {
    ClaudeCode,
    ClaudeDesktop,
    Cursor,
    Codex,
    #[value(name = "vscode")]
    VsCode,
}

/// `crosstalk mcp`: serve MCP on stdio, backed by a relay.
///
/// Examples:
///   crosstalk mcp                                  (local mode: the shared relay on this machine)
///   crosstalk mcp --relay https://relay.example:8765 --token $TOKEN --listen dev
///   crosstalk mcp --tools cross-claude             (cross-claude-mcp's tools, same names)
///   crosstalk mcp --tools core                     (post, read, wait, ask: the lean list)
///   crosstalk mcp --print-config claude-code
#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub relay: RelayArgs,
    /// Which tools to offer.
    #[arg(long, value_enum, default_value = "crosstalk")]
    pub tools: ToolSet,
    /// Push each new message of CHANNEL into the session from launch (repeatable).
    #[arg(long = "listen", value_name = "CHANNEL")]
    pub listen: Vec<String>,
    /// Print the configuration snippet for a host, and exit.
    #[arg(long, value_enum, value_name = "HOST")]
    pub print_config: Option<Host>,
    /// Local mode: where the shared local relay listens [env: CROSSTALK_LOCAL_ADDR]
    /// [default: 127.0.0.1:8765]
    #[arg(long)]
    pub local_addr: Option<String>,
    /// Local mode: the local relay's data directory [env: CROSSTALK_LOCAL_DATA]
    /// [default: $XDG_DATA_HOME/crosstalk, else ~/.local/share/crosstalk]
    #[arg(long)]
    pub local_data: Option<PathBuf>,
}

/// Where the relay is: its URL and token, and in local mode the shared relay to start there
/// if nothing answers.
#[derive(Clone)]
struct Target {
    url: String,
    token: Option<String>,
    /// Local mode: the address and data directory of the shared local relay.
    local: Option<(String, PathBuf)>,
}

/// Flag or environment, else the config file, else local mode.
fn target(args: &McpArgs) -> Result<Target, Failure> {
    let file = setup::ConfigFile::read()?;
    let token = args.relay.given_token().or(file.token);
    if let Some(url) = args.relay.given_url().or(file.relay) {
        return Ok(Target {
            url,
            token,
            local: None,
        });
    }
    let addr = args
        .local_addr
        .clone()
        .or_else(|| std::env::var("CROSSTALK_LOCAL_ADDR").ok())
        .unwrap_or_else(|| "127.0.0.1:8765".into());
    let data = args
        .local_data
        .clone()
        .or_else(|| std::env::var_os("CROSSTALK_LOCAL_DATA").map(PathBuf::from))
        .map_or_else(local::data_dir, Ok)?;
    Ok(Target {
        url: format!("http://{addr}"),
        token,
        local: Some((addr, data)),
    })
}

/// Runs `crosstalk mcp` until the host closes stdin or a signal comes. The host is served at
/// once, with `catalog(args.tools)` until the relay gives its own lists; the relay session is
/// opened (and, when it fails, opened again) in the background, and tools called meanwhile
/// answer why the relay is not there and how to fix it.
pub async fn run(args: McpArgs, catalog: impl FnOnce(ToolSet) -> Catalog) -> Result<(), Failure> {
    if let Some(host) = args.print_config {
        print!("{}", setup::snippet(host, &args));
        return Ok(());
    }
    crate::client::tls();
    let target = target(&args)?;
    let rest = std::sync::Arc::new(RelayClient::at(&target.url, target.token.clone())?);
    let live = live::Live::new(rest.clone());
    let link = proxy::Link::start(
        target,
        args.tools,
        catalog(args.tools),
        rest,
        live.clone(),
        args.listen.clone(),
    );
    proxy::serve(link, live).await
}
