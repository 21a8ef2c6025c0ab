//! Workloads 7 and 8 on one store: fill it with `plan.startup_messages` messages, stop the
//! server cleanly, weigh the data directory (bytes on disk per message against the bytes
//! posted), then time restarts from spawn to the first successful health probe.
//!
//! crosstalk is filled over HTTP with `--durability relaxed` and many concurrent posts (the
//! records are the same as durable ones; only the acknowledgement differs), then restarted
//! with the default durability. crosstalk-mcp would need hours at its POST rate, so its SQLite
//! file is filled directly with the same rows (schema created by the server itself first).

use super::{body_text, message_json, Done, Plan, Record, BODY_BYTES};
use crate::client::{first_id, Conn};
use crate::target::{disk_usage, Kind, Launcher};
use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Channels the store is spread over.
const CHANNELS: u64 = 8;
/// Concurrent posting connections while filling crosstalk.
const FILL_CONNECTIONS: usize = 64;
/// Distinct senders (and bodies) in the filled store.
const SENDERS: usize = 64;
/// Bound on filling, whatever the count.
const FILL_BUDGET: Duration = Duration::from_secs(600);

fn channel(i: u64) -> String {
    format!("bench-start-{}", i % CHANNELS)
}

/// Fills a running crosstalk with `n` posts over HTTP from `connections` connections;
/// returns posts per second. `post(c)` makes connection `c`'s posts: for the `i`-th post of
/// the run, its path and JSON body.
pub async fn fill_over_http<F>(
    addr: std::net::SocketAddr,
    n: u64,
    connections: usize,
    post: impl Fn(usize) -> F,
) -> anyhow::Result<f64>
where
    F: FnMut(u64) -> (String, bytes::Bytes) + Send + 'static,
{
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + FILL_BUDGET;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..connections {
        let next = next.clone();
        let mut make = post(c);
        tasks.spawn(async move {
            let mut conn = Conn::connect(addr).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(());
                }
                if Instant::now() > deadline {
                    bail!("filling took longer than {FILL_BUDGET:?}");
                }
                let (path, body) = make(i);
                let r = conn.post_json(&path, body).await?;
                if !r.status.is_success() || first_id(&r.body).is_none() {
                    bail!("fill post answered {}", r.status);
                }
            }
        });
    }
    while let Some(j) = tasks.join_next().await {
        j??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The rows crosstalk-mcp's own POST would write, inserted in one SQLite transaction.
const SQLITE_FILL: &str = r#"
import datetime, json, sqlite3, sys
spec = json.load(sys.stdin)
c = sqlite3.connect(spec["db"])
now = datetime.datetime.now(datetime.timezone.utc).isoformat()
k = len(spec["bodies"])
rows = ((f"bench-start-{i % spec['channels']}", f"bench-{i % k:02}", "note", spec["bodies"][i % k], now)
        for i in range(spec["n"]))
c.executemany("INSERT INTO messages(channel,sender,type,body,created_at) VALUES(?,?,?,?,?)", rows)
c.commit()
c.close()
"#;

async fn fill_sqlite(python: &Path, db: &Path, n: u64) -> anyhow::Result<f64> {
    let spec = serde_json::json!({
        "db": db,
        "n": n,
        "channels": CHANNELS,
        "bodies": (0..SENDERS).map(body_text).collect::<Vec<_>>(),
    });
    let started = Instant::now();
    let mut child = tokio::process::Command::new(python)
        .args(["-c", SQLITE_FILL])
        .stdin(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawn {}", python.display()))?;
    let mut stdin = child.stdin.take().context("python stdin")?;
    stdin.write_all(spec.to_string().as_bytes()).await?;
    drop(stdin);
    let status = tokio::time::timeout(FILL_BUDGET, child.wait())
        .await
        .context("filling SQLite timed out")??;
    if !status.success() {
        bail!("filling SQLite failed: {status}");
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Messages the server reports across the filled channels.
async fn stored_count(addr: std::net::SocketAddr) -> anyhow::Result<u64> {
    let r = Conn::connect(addr).await?.get("/api/channels").await?;
    let list: serde_json::Value = serde_json::from_slice(&r.body)?;
    Ok(list
        .as_array()
        .context("/api/channels is not an array")?
        .iter()
        .filter(|c| c["channel"].as_str().is_some_and(|n| n.starts_with("bench-start-")))
        .filter_map(|c| c["count"].as_u64())
        .sum())
}

pub async fn startup_and_disk(
    plan: &Plan,
    launcher: &Launcher,
    python: Option<&PathBuf>,
    dir: &Path,
    rec: &mut Record,
) -> anyhow::Result<Done> {
    let n = plan.startup_messages;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let fill_rate = match launcher.kind {
        Kind::Crosstalk => {
            let (server, _) = launcher.start(dir, &["--durability", "relaxed"], "fill").await?;
            let rate = fill_over_http(server.addr, n, FILL_CONNECTIONS, |c| {
                let body = message_json(c);
                move |i| (format!("/api/channels/{}/messages", channel(i)), body.clone())
            })
            .await?;
            server.stop().await?;
            rec.note(format!(
                "store filled over HTTP (relaxed durability) at {rate:.0} posts/s"
            ));
            rate
        }
        Kind::Peer => {
            let Some(python) = python else {
                return Ok(Done::Skipped("no Python to fill crosstalk-mcp's SQLite file".into()));
            };
            // Let the server create its schema, then fill the file it made.
            let (server, _) = launcher.start(dir, &[], "schema").await?;
            stored_count(server.addr).await?;
            server.stop().await?;
            let rate = fill_sqlite(python, &dir.join("relay.db"), n).await?;
            rec.note(format!(
                "SQLite filled directly at {rate:.0} rows/s (its HTTP POST is far too slow for this)"
            ));
            rate
        }
    };
    rec.set("fill_per_s", fill_rate);
    let disk = disk_usage(dir)?;
    let payload = message_json(0).len();
    let per_msg = disk as f64 / n as f64;
    rec.set("disk_bytes_per_msg", per_msg);
    rec.set("disk_vs_payload", per_msg / payload as f64);
    rec.set("disk_vs_body", per_msg / BODY_BYTES as f64);
    rec.note(format!(
        "disk: {:.1} MiB for {n} messages = {per_msg:.0} B/message; payload = the posted JSON, {payload} B ({BODY_BYTES} B body)",
        disk as f64 / 1048576.0
    ));
    let mut times = Vec::new();
    for r in 0..plan.startup_restarts {
        let (server, ready) = launcher.start(dir, &[], &format!("restart-{r}")).await?;
        times.push(ready.as_secs_f64());
        if r == 0 {
            let count = stored_count(server.addr).await?;
            if count != n {
                bail!("after restart the server reports {count} stored messages, expected {n}");
            }
        }
        server.stop().await?;
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    rec.set("startup_s", median);
    rec.note(format!(
        "start-up with {n} stored messages: median {median:.3} s of {} restarts (all: {:?}); page cache warm",
        times.len(),
        times.iter().map(|t| format!("{t:.3}")).collect::<Vec<_>>()
    ));
    std::fs::remove_dir_all(dir)?;
    Ok(Done::Ran)
}
