//! Assembles the relay and the HTTP server, and owns shutdown. [`run`] is the binary's path:
//! open the store, bind, serve until SIGTERM or SIGINT. [`serve`] is the part a test calls
//! with its own relay, listener and shutdown future:
//!
//! ```ignore
//! let (relay, _) = Relay::start(store, RelayConfig::default())?;
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! actix_rt::spawn(serve(relay, config, listener, stop.cancelled_owned()));
//! ```
//!
//! On shutdown the relay's token is cancelled (streams and waits end), the server stops and
//! the store is flushed.

use crate::client::served::{self, Origin, PidRecord};
use crate::config::Config;
use crate::http::routes::resource;
use crate::http::{self, RestPolicy};
use crate::mcp::{self, McpSettings};
use crate::ops::{Ctx, Kept};
use crate::rest;
use crate::{error, guard, openapi, sse, telemetry};
use actix_web::http::Method;
use actix_web::{web, App, HttpServer};
use crosstalk_actors::nats::NatsCluster;
use crosstalk_actors::sled_store::SledStore;
use crosstalk_actors::{Embedded, Relay, RelayConfig};
use crosstalk_schema::Limits;
use std::future::Future;
use std::sync::Arc;

/// Slack on top of the largest body for the JSON around it.
const JSON_OVERHEAD: usize = 64 * 1024;
/// How long in-flight requests get to finish once shutdown starts.
const SHUTDOWN_GRACE_SECS: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the store at {path}: {source}")]
    Store {
        path: String,
        source: crosstalk_actors::RelayError,
    },
    #[error("cannot bind {addr}{}: {}", from_env(&[*.host_origin, *.port_origin]), bind_remedy(.source, *.host_origin))]
    Bind {
        addr: String,
        source: std::io::Error,
        /// Where the host and the port came from, named when the environment set them.
        host_origin: Origin,
        port_origin: Origin,
    },
    #[error("cannot use NATS at {urls}: {source}")]
    Nats {
        urls: String,
        source: crosstalk_actors::RelayError,
    },
    /// The data directory cannot be used; `why` says why and what to do.
    #[error("cannot use the data directory {path}: {why}")]
    DataDir { path: String, why: String },
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
    #[error("final flush failed: {0}")]
    Flush(crosstalk_actors::RelayError),
    #[error(
        "refusing to serve {host}{} without a token: anyone who can reach it could read, post and act as anyone. \
         Set --token (or --participants / --participants-file), bind 127.0.0.1{}, or pass --insecure-open if this \
         network is fully trusted", from_env(&[*.origin]), shell_set(*.origin)
    )]
    OpenBeyondLoopback { host: String, origin: Origin },
    #[error(
        "--oauth needs --token: the relay's own token is the admin's, which mints the invites people consent \
         with (`crosstalk invite`)"
    )]
    OAuthWithoutToken,
}

/// ` (from $HOST)`, ` (from $HOST and $PORT)`: the settings among `origins` that came from the
/// environment, which the person starting the relay may not know are set.
fn from_env(origins: &[Origin]) -> String {
    let vars: Vec<String> = origins
        .iter()
        .filter(|o| matches!(o, Origin::Env(_)))
        .map(Origin::to_string)
        .collect();
    match vars.as_slice() {
        [] => String::new(),
        vars => format!(" (from {})", vars.join(" and ")),
    }
}

/// The remedy for a host a shell set: zsh and some login shells set `$HOST` to the machine's
/// name, which `serve` reads as crosstalk-mcp's setting.
fn shell_set(origin: Origin) -> &'static str {
    match origin {
        Origin::Env("HOST") => {
            " (your shell may set $HOST to this machine's name: `unset HOST`, or set CROSSTALK_HOST=127.0.0.1)"
        }
        _ => "",
    }
}

/// A failed bind, and what to do about it.
fn bind_remedy(e: &std::io::Error, host_origin: Origin) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => "the address is in use: another relay may run there (`crosstalk status` \
            says), or another program; stop it, or choose another --port (--port 0 picks a free one)"
            .into(),
        std::io::ErrorKind::PermissionDenied => {
            "permission denied: ports below 1024 need privileges; choose --port 1024 or above".into()
        }
        std::io::ErrorKind::AddrNotAvailable => format!(
            "no interface of this machine has that address: check --host (127.0.0.1 for this machine only){}",
            shell_set(host_origin)
        ),
        _ if matches!(host_origin, Origin::Env("HOST")) => format!("{e}{}", shell_set(host_origin)),
        _ => e.to_string(),
    }
}

use crate::client::PID_FILE;

/// Data directories this process serves, each with its locked pid file: released when its
/// relay's [`serve`] returns.
static HELD: parking_lot::Mutex<Vec<(std::path::PathBuf, std::fs::File)>> = parking_lot::Mutex::new(Vec::new());

/// Makes sure `dir` can be this relay's alone: a directory (created if missing) that this
/// process may write, and no other relay is using. Every refusal names the directory, the
/// cause and the remedy.
pub fn claim_data_dir(dir: &std::path::Path) -> Result<(), ServeError> {
    use std::io::{ErrorKind, Read};
    let path = dir.display().to_string();
    let refuse = |why: String| ServeError::DataDir {
        path: path.clone(),
        why,
    };
    let io_why = |what: &str, e: &std::io::Error| match e.kind() {
        ErrorKind::PermissionDenied => format!(
            "{what}: permission denied: run the relay as a user who may write there, or choose another --data-dir"
        ),
        ErrorKind::ReadOnlyFilesystem => {
            format!("{what}: the file system is read-only: choose a --data-dir on a writable one")
        }
        ErrorKind::StorageFull => format!("{what}: the disk is full: free some space, or choose another --data-dir"),
        _ => format!("{what}: {e}"),
    };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(refuse(
                "it exists and is not a directory: give --data-dir a directory (a new path is created)".into(),
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| match e.kind() {
                // A path component that is a file.
                ErrorKind::AlreadyExists | ErrorKind::NotADirectory => {
                    refuse("part of the path exists and is not a directory: give --data-dir a directory path".into())
                }
                _ => refuse(io_why("cannot create it", &e)),
            })?;
        }
        Err(e) if e.kind() == ErrorKind::NotADirectory => {
            return Err(refuse(
                "part of the path exists and is not a directory: give --data-dir a directory path".into(),
            ))
        }
        Err(e) => return Err(refuse(io_why("cannot read it", &e))),
    }
    let pid_path = dir.join(PID_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&pid_path)
        .map_err(|e| refuse(io_why("cannot write in it", &e)))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let stop = |h: &PidRecord| {
                let at = h.url.as_deref().map(|u| format!(" at {u}")).unwrap_or_default();
                let dir = crate::client::shell_quote(&path);
                format!(
                    "another relay ({}){at} is using it: stop that one first (`crosstalk stop --data-dir {dir}`), \
                     or give this one another --data-dir",
                    h.who()
                )
            };
            return Err(refuse(match PidRecord::parse(&text) {
                Some(h) if h.reachable_here() => stop(&h),
                // Its pid means nothing here, and no signal from here reaches it.
                Some(h) => format!(
                    "another relay ({}) is using it: {}, or give this one another volume or --data-dir",
                    h.who(),
                    h.stop_elsewhere()
                ),
                None => "another relay is using it: stop that one first, or give this one another --data-dir".into(),
            }));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(refuse(io_why("cannot lock its pid file", &e))),
    }
    served::write_pid_file(&mut file, &PidRecord::here(None))
        .map_err(|e| refuse(io_why("cannot write its pid file", &e)))?;
    HELD.lock().push((dir.to_path_buf(), file));
    Ok(())
}

/// Adds the URL the relay answers at to the pid file of `dir`, if this process holds it, so
/// that `crosstalk status` asks the relay there, whatever port it was given.
fn record_url(dir: &std::path::Path, url: String) {
    let mut held = HELD.lock();
    if let Some((_, file)) = held.iter_mut().find(|(d, _)| d == dir) {
        if let Err(e) = served::write_pid_file(file, &PidRecord::here(Some(url))) {
            tracing::warn!(error = %e, dir = %dir.display(), "cannot record the address in the pid file");
        }
    }
}

/// Lets `dir` go: another relay may now use it.
fn release_data_dir(dir: &std::path::Path) {
    HELD.lock().retain(|(held, _)| held != dir);
}

/// The relay's settings from the configuration.
pub fn relay_config(config: &Config) -> RelayConfig {
    RelayConfig {
        limits: Limits {
            max_body: config.max_body_bytes,
            ..Limits::default()
        },
        durability: config.durability,
        presence_ttl: config.presence_ttl,
        release_grace: config.release_grace,
        retention: config.retention,
        channel_retention: config.channel_retention.clone(),
        retention_every: config.retention_every,
        max_shared_bytes: config.max_shared_bytes,
        max_channels: config.max_channels,
        max_channels_per_opener: config.max_channels_per_participant,
        max_answer_bytes: config.max_answer_bytes,
        idle_after: config.idle_after,
        max_open_channels: config.max_open_channels,
        cluster: Arc::new(Embedded),
        search_dir: Some(config.data_dir.join(SEARCH_INDEX_DIR)),
    }
}

/// The search index's directory inside the data directory: a cache of the log, rebuilt from
/// it when missing or damaged.
pub const SEARCH_INDEX_DIR: &str = "search-index";

/// Opens the store in the configured directory (and, on a cluster, connects to its shared
/// log) and starts the relay on it, reporting any damage it repaired.
pub async fn open(config: &Config) -> Result<Relay, ServeError> {
    claim_data_dir(&config.data_dir)?;
    let opened = open_claimed(config).await;
    if opened.is_err() {
        release_data_dir(&config.data_dir);
    }
    opened
}

async fn open_claimed(config: &Config) -> Result<Relay, ServeError> {
    let store_err = |source| ServeError::Store {
        path: config.data_dir.display().to_string(),
        source,
    };
    let store = SledStore::open(&config.data_dir).map_err(|e| store_err(e.into()))?;
    let mut relay_config = relay_config(config);
    if let Some(nats) = &config.nats {
        let cluster = NatsCluster::connect(nats).await.map_err(|source| ServeError::Nats {
            urls: nats.urls.join(","),
            source,
        })?;
        tracing::info!(stream = %nats.stream, urls = %nats.urls.join(","), "sharing channels through NATS JetStream");
        relay_config.cluster = Arc::new(cluster);
    }
    let joined = relay_config.cluster.claim_store(&store).map_err(store_err)?;
    if joined {
        tracing::info!("this data directory is already the cluster's copy: following the log from where it stopped");
    }
    let (relay, repairs) = Relay::start(Arc::new(store), relay_config).map_err(store_err)?;
    for r in &repairs.damaged {
        say(
            std::io::stderr(),
            format_args!(
                "crosstalk: store damage repaired in channel {}: dropped damaged records {:?}, serving up to id {}",
                r.channel, r.dropped, r.last_good
            ),
        );
    }
    if let Some(t) = repairs.truncated {
        say(
            std::io::stderr(),
            format_args!(
                "crosstalk: store damage: the store ends at id {} but ids up to {} were acknowledged; \
                 serving everything up to {} (new ids start above {})",
                t.store_last_id, t.acknowledged_last_id, t.store_last_id, t.acknowledged_last_id
            ),
        );
    }
    Ok(relay)
}

/// The binary's path: open, bind, serve until a signal.
pub async fn run(config: Config) -> Result<(), ServeError> {
    if config.oauth && !config.auth.admin() {
        return Err(ServeError::OAuthWithoutToken);
    }
    if !is_loopback(&config.host) && !config.auth.enabled() && !config.insecure_open {
        return Err(ServeError::OpenBeyondLoopback {
            host: config.host.clone(),
            origin: config.host_origin,
        });
    }
    // The port first: a busy port is reported before any actor or store is started.
    let addr = format!("{}:{}", config.host, config.port);
    let listener = std::net::TcpListener::bind(&addr).map_err(|source| ServeError::Bind {
        addr,
        source,
        host_origin: config.host_origin,
        port_origin: config.port_origin,
    })?;
    let relay = open(&config).await?;
    serve(relay, config, listener, wait_for_signal()).await
}

/// Serves the relay on `listener` until `shutdown` resolves, then ends streams and waits,
/// stops the server and flushes the store.
pub async fn serve(
    relay: Relay,
    config: Config,
    listener: std::net::TcpListener,
    shutdown: impl Future<Output = ()> + 'static,
) -> Result<(), ServeError> {
    // Before anything records: the recorder must be installed to count.
    telemetry::handle();
    telemetry::start_upkeep();
    let mut cx = Ctx::new(relay.clone());
    cx.max_held = config.max_waits_per_principal;
    cx.reservations_kept = Arc::new(Kept::new(config.max_reservations_per_participant));
    cx.shared_kept = Arc::new(Kept::asking_at_most_every(
        config.max_shared_keys_per_participant,
        crate::ops::SHARED_KEYS_ASKED_EVERY,
    ));
    cx.humans = Arc::new(config.humans.iter().cloned().collect());
    cx.oauth = config.oauth;
    if !is_loopback(&config.host) && !config.auth.enabled() {
        tracing::warn!(host = %config.host, "--insecure-open: listening beyond loopback WITHOUT A TOKEN; anyone who \
            can reach this port can read, post and act as anyone");
    }
    if !is_loopback(&config.host) && config.allowed_hosts.is_empty() {
        tracing::warn!(host = %config.host,
            "the relay answers only to Host localhost, 127.0.0.1 and ::1; set --allowed-hosts to the names clients use");
    }
    // Built once: every worker's scope shares its sessions.
    let mcp_settings = McpSettings {
        wait_cap: config.mcp_wait_cap,
        task_wait_cap: config.task_wait_cap,
        allowed_hosts: config.allowed_hosts.clone(),
        max_body_bytes: config.max_body_bytes,
        tools: config.tools,
    };
    // This node's name in records other nodes read (which node delivers a webhook, runs a
    // task): kept in the data directory, so a restart is the same node.
    let node = crate::webhooks::node_id(&config.data_dir);
    // One table for both faces: a principal's /mcp and /cc/mcp sessions count together.
    let owners = Arc::new(mcp::owner::Owners::new(
        config.max_sessions_per_principal,
        config.max_sessions_per_participant,
        &cx,
    ));
    // The authorization server, with the address clients know the relay by.
    let oauth = config.oauth.then(|| {
        let issuer = config.public_url.clone().unwrap_or_else(|| {
            let port = listener.local_addr().map_or(config.port, |a| a.port());
            let host = match config.host.as_str() {
                "0.0.0.0" | "::" | "[::]" => "127.0.0.1",
                h => h,
            };
            format!("http://{host}:{port}")
        });
        tracing::info!(issuer = %issuer, "OAuth: hosted clients connect with invites (crosstalk invite)");
        web::Data::new(crate::ops::oauth::OAuth::new(issuer, relay.records()))
    });
    // Both faces' tasks, resumed from their records before the first request, each only
    // while its owner's token is still valid.
    let standing = crate::auth::Standing::new(config.auth.clone(), oauth.as_ref().map(|o| o.get_ref().clone()));
    let tasks = mcp::tasks::Tasks::new(cx.clone(), node.clone(), mcp_settings.task_wait_cap, standing);
    if let Err(e) = tasks.start().await {
        tracing::warn!(error = %e, "cannot read the stored MCP tasks; those working are not resumed");
    }
    let mcp = mcp::service(
        cx.clone(),
        &mcp_settings,
        mcp::Face::Crosstalk,
        owners.clone(),
        tasks.clone(),
    );
    let cc_mcp = mcp::service(cx.clone(), &mcp_settings, mcp::Face::CrossClaude, owners.clone(), tasks);
    let limits = web::Data::new(crate::oauth::Limits::default());
    let cimd_ca = match &config.oauth_cimd_ca {
        Some(pem) => Some(
            reqwest::Certificate::from_pem(pem)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("--oauth-cimd-ca: {e}")))?,
        ),
        None => None,
    };
    let cimd = web::Data::new(crate::oauth::Cimd::new(cimd_ca, config.oauth_cimd_allow_private));
    let mut allowed_hosts = config.allowed_hosts.clone();
    if let Some(host) = config
        .public_url
        .as_deref()
        .and_then(|u| u.split_once("://"))
        .map(|(_, authority)| authority.to_owned())
    {
        // The public address is one the relay answers to.
        for h in [host.clone(), host.split(':').next().unwrap_or_default().to_owned()] {
            if !allowed_hosts.contains(&h) {
                allowed_hosts.push(h);
            }
        }
    }
    let webhooks = web::Data::new(crate::webhooks::Settings {
        hooks: crate::ops::webhooks::Webhooks::new(relay.records()),
        allow_private: config.webhooks_allow_private,
    });
    crate::webhooks::start(cx.clone(), webhooks.clone(), node);
    let data = web::Data::new(cx);
    let auth = web::Data::new(config.auth.clone());
    let policy = web::Data::new(RestPolicy::new(config.wait_cap));
    let max_body = config.max_body_bytes.max(config.max_shared_bytes) + JSON_OVERHEAD;
    let guard_policy = web::Data::new(guard::Policy {
        hosts: guard::allowed_hosts(&allowed_hosts),
        cors_origins: config.cors_origins.clone(),
        max_body,
        rate: config.rate_limit as f64,
        auth_failure_rate: config.auth_failure_rate as f64,
        max_url: config.max_url_bytes,
    });
    let limiter = web::Data::new(guard::RateLimiter::default());
    let owners = web::Data::from(owners);
    // What actix-http answers by itself (a head it cannot parse, or too large) is JSON too.
    actix_http::h1::set_error_answer(crate::error::dispatcher_error);
    let server = HttpServer::new(move || {
        let oauth_routes = |cfg: &mut web::ServiceConfig| match &oauth {
            Some(o) => {
                cfg.app_data(o.clone()).app_data(limits.clone()).app_data(cimd.clone());
                crate::oauth::routes(cfg);
            }
            None => crate::oauth::routes_off(cfg),
        };
        App::new()
            .configure(oauth_routes)
            .app_data(webhooks.clone())
            .configure(crate::webhooks::routes)
            .app_data(data.clone())
            .app_data(auth.clone())
            .app_data(policy.clone())
            .app_data(guard_policy.clone())
            .app_data(limiter.clone())
            .app_data(owners.clone())
            .app_data(web::QueryConfig::default().error_handler(crate::error::query_error))
            // Host/Origin, CORS, the token, the body deadline, browser headers: one layer.
            .wrap(actix_web::middleware::from_fn(guard::guard))
            .service(
                web::scope(mcp::MCP_PATH)
                    .wrap(actix_web::middleware::from_fn(mcp::compat::notifications))
                    .wrap(actix_web::middleware::from_fn(mcp::owner::bind))
                    .wrap(actix_web::middleware::from_fn(error::json_errors))
                    .service(mcp.clone().scope()),
            )
            .service(
                web::scope(crate::cc::MCP_PATH)
                    .wrap(actix_web::middleware::from_fn(mcp::compat::notifications))
                    .wrap(actix_web::middleware::from_fn(mcp::owner::bind))
                    .wrap(actix_web::middleware::from_fn(error::json_errors))
                    .service(cc_mcp.clone().scope()),
            )
            // The operation table first: actix tries routes in order, the hot ones lead.
            .configure(rest::routes)
            .configure(crate::cc::routes)
            .configure(crate::ui::routes)
            .service(resource(http::STREAM_PATH, &[Method::GET]).route(web::get().to(sse::stream)))
            .service(resource(http::HEALTH_PATH, &[Method::GET]).route(web::get().to(http::healthz)))
            .service(resource(http::OPENAPI_PATH, &[Method::GET]).route(web::get().to(openapi::serve)))
            .service(resource(crate::cc::OPENAPI_PATH, &[Method::GET]).route(web::get().to(openapi::serve_cc)))
            .service(resource(telemetry::METRICS_PATH, &[Method::GET]).route(web::get().to(telemetry::serve)))
            .default_service(web::route().to(error::not_found))
    })
    .workers(config.workers)
    // Every accepted socket: an answer written in two parts (an event stream's headers and
    // priming event, then the result) must not wait 40 ms for the client's delayed ACK.
    .tcp_nodelay(true)
    .disable_signals()
    // A client that closes its socket is gone: drop its wait or stream at once, so a
    // long-poll or SSE handler never outlives its client.
    .h1_allow_half_closed(false)
    .shutdown_timeout(SHUTDOWN_GRACE_SECS)
    .listen(listener)?;
    for a in server.addrs() {
        // Scripts and tests read this line to find the port when it was 0.
        say(std::io::stdout(), format_args!("crosstalk listening on http://{a}"));
        tracing::info!(addr = %a, data_dir = %config.data_dir.display(), durability = ?config.durability, "listening");
    }
    if let Some(a) = server.addrs().first() {
        record_url(&config.data_dir, served::local_url(*a));
    }
    let server = server.run();
    let handle = server.handle();
    let token = relay.shutdown_token();
    actix_web::rt::spawn(async move {
        shutdown.await;
        // The shutdown first, the log line after: nothing written may hold it up.
        token.cancel();
        let stopped = handle.stop(true);
        tracing::info!("shutting down");
        stopped.await;
    });
    let served = server.await;
    let flushed = relay.shutdown();
    relay.wind_down().await;
    release_data_dir(&config.data_dir);
    served?;
    flushed.map_err(ServeError::Flush)?;
    tracing::info!("store flushed; bye");
    Ok(())
}

/// What `crosstalk mcp` offers its host before it reaches the relay: what a relay of this
/// version offers on the endpoint the tool set names.
pub fn bridge_catalog(set: crate::bridge::ToolSet) -> crate::bridge::Catalog {
    use crate::bridge::ToolSet;
    use crate::mcp::tools::ToolChoice;
    let (face, choice) = match set {
        ToolSet::Crosstalk => (mcp::Face::Crosstalk, ToolChoice::Full),
        ToolSet::Core => (mcp::Face::Crosstalk, ToolChoice::Core),
        ToolSet::CrossClaude => (mcp::Face::CrossClaude, ToolChoice::Full),
    };
    // Before it reaches its relay, the bridge can only say what the defaults are.
    let (tools, prompts, templates) = mcp::offered(face, choice, mcp::tools::Settings::default());
    crate::bridge::Catalog {
        info: mcp::info(face),
        tools,
        prompts,
        templates,
    }
}

/// Writes a line for the person who started the relay, if anyone still reads `out`: a closed
/// pipe (`crosstalk serve | head -3`) or a full disk is not a reason to stop serving, and
/// `println!` would panic on it.
fn say(mut out: impl std::io::Write, line: std::fmt::Arguments) {
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
