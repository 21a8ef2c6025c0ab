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
    match args.tools {
        ToolSet::CrossClaude => a.extend(["--tools".into(), "cross-claude".into()]),
        ToolSet::Core => a.extend(["--tools".into(), "core".into()]),
        ToolSet::Crosstalk => {}
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

/// How Claude Code turns live push on: channels are a research preview (Claude Code 2.1.80 or
/// later, signed in with claude.ai), enabled per launch for a server from its MCP settings.
pub const CLAUDE_CODE_CHANNELS: &str = "claude --dangerously-load-development-channels server:crosstalk";

/// The snippet for `host`, ready to paste (with lines saying where, and how to push live).
pub fn snippet(host: Host, args: &McpArgs) -> String {
    let command = std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(str::to_owned))
        .unwrap_or_else(|| "crosstalk".into());
    let env = environment(args);
    let server = json!({ "command": command, "args": arguments(args), "env": env });
    let pretty = |v: serde_json::Value| serde_json::to_string_pretty(&v).unwrap_or_default();
    let listen = if args.listen.is_empty() {
        "add `--listen CHANNEL` to the arguments to push a channel's new messages into the session"
    } else {
        "the `--listen` channels' new messages are pushed into the session"
    };
    match host {
        Host::ClaudeCode => {
            let env_flags: String = env
                .iter()
                .map(|(k, v)| format!(" -e {k}={}", v.as_str().unwrap_or("")))
                .collect();
            format!(
                "# Claude Code: run this once (or put the JSON below in the project's .mcp.json)\n\
                 claude mcp add crosstalk{env_flags} -- {command} {}\n\n{}\n\n\
                 # Live push: {listen}, and start Claude Code with channels enabled (research preview,\n\
                 # Claude Code 2.1.80 or later, signed in with claude.ai):\n\
                 #   {CLAUDE_CODE_CHANNELS}\n\
                 # Without it, messages arrive when the agent calls check_messages or wait_for_message.\n",
                arguments(args).join(" "),
                pretty(json!({ "mcpServers": { "crosstalk": server } }))
            )
        }
        Host::ClaudeDesktop => format!(
            "// Claude Desktop: merge into claude_desktop_config.json\n// (macOS: ~/Library/Application Support/Claude/, \
             Windows: %APPDATA%\\Claude\\, Linux: ~/.config/Claude/)\n{}\n",
            pretty(json!({ "mcpServers": { "crosstalk": server } }))
        ),
        Host::Cursor => format!(
            "// Cursor: merge into ~/.cursor/mcp.json (or the project's .cursor/mcp.json)\n{}\n",
            pretty(json!({ "mcpServers": { "crosstalk": server } }))
        ),
        Host::VsCode => {
            let mut server = server;
            server["type"] = "stdio".into();
            format!(
                "// VS Code (GitHub Copilot agent mode): merge into the workspace's .vscode/mcp.json\n\
                 // (or run `MCP: Open User Configuration` for every workspace)\n{}\n",
                pretty(json!({ "servers": { "crosstalk": server } }))
            )
        }
        Host::Codex => {
            let toml_str = |s: &str| serde_json::Value::from(s).to_string();
            let args_list: Vec<String> = arguments(args).iter().map(|a| toml_str(a)).collect();
            let mut out = format!(
                "# Codex: add to ~/.codex/config.toml\n[mcp_servers.crosstalk]\ncommand = {}\nargs = [{}]\n",
                toml_str(&command),
                args_list.join(", ")
            );
            if !env.is_empty() {
                let pairs: Vec<String> = env
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", toml_str(v.as_str().unwrap_or(""))))
                    .collect();
                out.push_str(&format!("env = {{ {} }}\n", pairs.join(", ")));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: McpArgs,
    }

    fn args(argv: &[&str]) -> McpArgs {
        Wrap::parse_from(std::iter::once("x").chain(argv.iter().copied())).args
    }

    #[test]
    fn every_host_gets_a_snippet_with_the_arguments() {
        let a = args(&["--relay", "https://relay.example:8765", "--listen", "dev"]);
        for host in [
            Host::ClaudeCode,
            Host::ClaudeDesktop,
            Host::Cursor,
            Host::VsCode,
            Host::Codex,
        ] {
            let s = snippet(host, &a);
            assert!(
                s.contains("\"--listen\"") || s.contains("--listen dev"),
                "{host:?}: {s}"
            );
            assert!(s.contains("https://relay.example:8765"), "{host:?}: {s}");
        }
        let code = snippet(Host::ClaudeCode, &a);
        assert!(code.contains(CLAUDE_CODE_CHANNELS), "{code}");
        let codex = snippet(Host::Codex, &a);
        assert!(codex.contains("[mcp_servers.crosstalk]"), "{codex}");
        assert!(codex.contains("args = [\"mcp\", \"--listen\", \"dev\"]"), "{codex}");
        assert!(
            codex.contains("env = { CROSSTALK_URL = \"https://relay.example:8765\""),
            "{codex}"
        );
        let vscode = snippet(Host::VsCode, &a);
        let json_part = &vscode[vscode.find('{').unwrap()..];
        let v: serde_json::Value = serde_json::from_str(json_part).unwrap();
        assert_eq!(v["servers"]["crosstalk"]["type"], "stdio");
    }
}
