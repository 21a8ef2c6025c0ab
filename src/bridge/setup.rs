//! Setting up: the optional config file, and the snippet each host needs to spawn us.

use super::{Host, McpArgs, ToolSet};
use crate::client::Failure;
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;

/// `crosstalk/config.json` in the user's config directory (`$XDG_CONFIG_HOME`, else
/// `~/.config` on Linux; the platform's own elsewhere):
/// `{"relay": "https://…", "token": "…"}`, both optional; flags and environment win.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub relay: Option<String>,
    pub token: Option<String>,
}

impl ConfigFile {
    pub fn path() -> Option<PathBuf> {
        Some(dirs::config_dir()?.join("crosstalk").join("config.json"))
    }

    /// The file's settings; none if there is no file; a failure if it cannot be read.
    pub fn read() -> Result<ConfigFile, Failure> {
        let Some(path) = Self::path() else {
            return Ok(ConfigFile::default());
        };
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Failure(format!("bad config file {}: {e}", path.display()), 2)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
            Err(e) => Err(Failure(format!("cannot read {}: {e}", path.display()), 2)),
        }
    }
}

/// The arguments a host passes to `crosstalk`.
fn arguments(args: &McpArgs) -> Vec<String> {
    let mut a = vec!["mcp".to_owned()];
    if args.tools == ToolSet::CrossClaude {
        a.extend(["--tools".into(), "cross-claude".into()]);
    }
    for ch in &args.listen {
        a.extend(["--listen".into(), ch.clone()]);
    }
    a
}

/// The environment: the relay and a token placeholder if a relay is named (none in local mode).
fn environment(args: &McpArgs) -> serde_json::Map<String, serde_json::Value> {
    let mut env = serde_json::Map::new();
    if let Some(url) = args.relay.given_url() {
        env.insert("CROSSTALK_URL".into(), url.into());
        env.insert("CROSSTALK_TOKEN".into(), "<your token>".into());
    }
    env
}

/// The snippet for `host`, ready to paste (with a line saying where).
pub fn snippet(host: Host, args: &McpArgs) -> String {
    let command = std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(str::to_owned))
        .unwrap_or_else(|| "crosstalk".into());
    let server = json!({ "command": command, "args": arguments(args), "env": environment(args) });
    let config = json!({ "mcpServers": { "crosstalk": server } });
    let pretty = serde_json::to_string_pretty(&config).unwrap_or_default();
    match host {
        Host::ClaudeCode => {
            let env: String = environment(args)
                .iter()
                .map(|(k, v)| format!(" -e {k}={}", v.as_str().unwrap_or("")))
                .collect();
            format!(
                "# Claude Code: run this once (or put the JSON below in the project's .mcp.json)\n\
                 claude mcp add crosstalk{env} -- {command} {}\n\n{pretty}\n",
                arguments(args).join(" ")
            )
        }
        Host::ClaudeDesktop => format!(
            "// Claude Desktop: merge into claude_desktop_config.json\n// (macOS: ~/Library/Application Support/Claude/, \
             Windows: %APPDATA%\\Claude\\, Linux: ~/.config/Claude/)\n{pretty}\n"
        ),
        Host::Cursor => format!("// Cursor: merge into ~/.cursor/mcp.json (or the project's .cursor/mcp.json)\n{pretty}\n"),
    }
}
