//! The relay on this machine: `crosstalk status` and `crosstalk stop`.

use super::{Failure, Outcome, RelayArgs};
use crate::api;
use crate::client::{served, shell_quote, RelayClient};
use crate::ops::wake::WakeListRequest;
use anstream::println;
use serde_json::Value;
use std::time::Duration;

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
pub(super) async fn status(relay: &RelayArgs, data_dir: Option<std::path::PathBuf>) -> Result<Outcome, Failure> {
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
    let answer = match c.health().await {
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
    // Who crosstalk wake runs turns for, and what each does now (a token that may not list
    // them leaves this out).
    if let Ok(wake) = c.call(api::WAKE_LIST, &WakeListRequest {}).await {
        for w in wake.woken {
            println!(
                "  woken: {} {} (crosstalk wake, pid {})",
                w.identity,
                w.state,
                w.held_by.as_deref().unwrap_or("?")
            );
        }
    }
    Ok(Outcome::Done)
}

/// `crosstalk stop`: SIGTERM to the relay serving the data directory (as `serve` reads it),
/// then wait until it has let the directory go.
pub(super) async fn stop(data_dir: Option<std::path::PathBuf>) -> Result<Outcome, Failure> {
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
