//! `crosstalk`: parse the command line, set up logging, run the relay.

use crosstalk::config::{Cli, Command, Config};
use tracing_subscriber::EnvFilter;

/// jemalloc. The relay allocates per request and per message on several threads, and frees on
/// threads other than the one that allocated: a channel's state is built on the actors'
/// thread, its batches freed on the store thread, sled's pages on sled's own threads.
/// jemalloc's arenas take memory back whichever thread frees it, and its background threads
/// return freed pages to the system about a second later (mimalloc, the allocator before,
/// returned a page only when the thread owning it next ran). What it changed is measured in
/// docs/benchmarks.md, "Measurements behind design choices".
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts (`MALLOC_CONF` in the environment overrides them):
/// background threads purge freed pages, dirty pages go back to the system after 1 s, and
/// nothing lingers as "muzzy" (lazily freed) pages that still count in RSS.
#[allow(non_upper_case_globals)]
#[export_name = "malloc_conf"]
pub static malloc_conf: &[u8; 60] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// Logging when `RUST_LOG` is unset: the MCP library logs session ids at `info`, and a
/// session id is a credential, so its logs start at `warn`. The NATS client logs every
/// connection event at `info`, including the close of start-up's own short-lived connection
/// ("event: closed"), which reads like a failure; the relay logs a lost connection itself.
/// sled is off: it logs each failed write of the store (thousands a second on a full disk),
/// which the store thread reports itself, with what it did about it, at most once a second.
const DEFAULT_LOG: &str = "info,rmcp=warn,rmcp_actix_web=warn,async_nats=warn,sled=off";

/// `crosstalk mcp`'s logging when `RUST_LOG` is unset: its own warnings and errors, not the
/// MCP library's. Its stderr is its host's log, where Claude Code files every line at
/// `[ERROR]`: a line there should mean something is wrong.
const BRIDGE_LOG: &str = "warn,rmcp=off";

/// Libraries that log credentials or message text below `warn` (the MCP library logs session
/// ids at `info` and messages at `debug`): kept at `warn` whatever `RUST_LOG` sets, unless
/// `RUST_LOG` names them itself.
const QUIET: [&str; 2] = ["rmcp", "rmcp_actix_web"];

/// Whether a `RUST_LOG` spec sets a level for `target` (or a module of it) itself:
/// `target=level`, `target::module=level`, `target[span]=level`.
fn names(spec: &str, target: &str) -> bool {
    spec.split(',').any(|d| {
        let named = d.split(['=', '[']).next().unwrap_or("").trim();
        d.contains('=') && (named == target || named.starts_with(&format!("{target}::")))
    })
}

/// `RUST_LOG` if set, else `default`, with [`QUIET`] kept at `warn`.
fn log_filter(default: &str) -> EnvFilter {
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => {
            let mut filter = EnvFilter::new(&spec);
            for target in QUIET {
                if !names(&spec, target) {
                    if let Ok(d) = format!("{target}=warn").parse() {
                        filter = filter.add_directive(d);
                    }
                }
            }
            filter
        }
        _ => EnvFilter::new(default),
    }
}

fn main() -> anyhow::Result<()> {
    // A file-size limit (or a quota) stops a write with EFBIG instead of killing the relay
    // with SIGXFSZ: the write is refused, nothing acknowledged is lost, and the relay stays up.
    // SAFETY: setting a signal's disposition to "ignore" before any thread starts.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    // The derived command line, with each setting's environment and default from its table.
    let cli = {
        use clap::FromArgMatches;
        Cli::from_arg_matches(&crosstalk::config::settings::command().get_matches()).unwrap_or_else(|e| e.exit())
    };
    // The bridge says itself why a relay is not there; the MCP library's own errors about each
    // failed attempt would only repeat it, with internal type names, in the host's log.
    let default_log = match cli.command {
        Some(Command::Mcp(_)) => BRIDGE_LOG,
        _ => DEFAULT_LOG,
    };
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(default_log))
        .with_writer(std::io::stderr)
        // A line that cannot be written is dropped. By default the library reports that with
        // `eprintln!`, which panics when stderr is a closed pipe (`crosstalk serve | head`):
        // the task that logged died, and with it, at the shutdown's first line, the shutdown.
        .log_internal_errors(false)
        // Colour codes only on a terminal: `crosstalk mcp`'s stderr goes to its host's log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = match cli.command {
        Some(Command::Serve(args)) => *args,
        // Bare `crosstalk` explains itself rather than start a server where the user stands.
        None => {
            let _ = crosstalk::config::settings::command().print_help();
            std::process::exit(2);
        }
        Some(Command::Mcp(args)) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            if let Err(crosstalk::client::Failure(why, code)) =
                rt.block_on(crosstalk::bridge::run(*args, crosstalk::server::bridge_catalog))
            {
                eprintln!("crosstalk mcp: {why}");
                std::process::exit(code);
            }
            // Pushes and the relay session are done. Nothing is left to wait for but stdin's
            // reader thread, blocked in a read that never ends: hosts give a server 100 ms
            // after SIGINT before they escalate.
            rt.shutdown_background();
            std::process::exit(0);
        }
        Some(Command::Client(cmd)) => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let code = match rt.block_on(crosstalk::cli::run(cmd)) {
                Ok(crosstalk::cli::Outcome::Done) => 0,
                Ok(crosstalk::cli::Outcome::TimedOut) => 1,
                Err(crosstalk::cli::Failure(why, code)) => {
                    eprintln!("crosstalk: {why}");
                    code
                }
            };
            std::process::exit(code);
        }
    };
    // A user's mistake is one line with its remedy, never a backtrace (whatever RUST_BACKTRACE says).
    let served = Config::resolve(args).map_err(|e| e.to_string()).and_then(|config| {
        actix_web::rt::System::new()
            .block_on(crosstalk::run(config))
            .map_err(|e| e.to_string())
    });
    if let Err(why) = served {
        eprintln!("crosstalk: {why}");
        std::process::exit(2);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn a_spec_names_a_target_only_by_its_own_directive() {
        assert!(names("info,rmcp=debug", "rmcp"));
        assert!(names("rmcp::transport=trace", "rmcp"));
        assert!(names("warn,rmcp_actix_web=debug", "rmcp_actix_web"));
        // Naming rmcp_actix_web does not name rmcp, nor does a bare level or another crate.
        assert!(!names("warn,rmcp_actix_web=debug", "rmcp"));
        assert!(!names("debug", "rmcp"));
        assert!(!names("crosstalk=debug,rmcpx=info", "rmcp"));
    }
}
