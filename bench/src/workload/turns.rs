//! `crosstalk wake` turns (crosstalk only, a server of its own): one `crosstalk wake` process
//! for an identity, its command a trivial one that writes the time it started; a REST post of a
//! DIRECTIVE to the identity; the time from just before the POST is sent until the command
//! started, up to the plan's wake rounds. Each round waits until the turn has ended, so no
//! message queues behind a running turn.

use super::{Done, Plan, Record};
use crate::client::{first_id, Conn};
use crate::stats::summarize;
use crate::target::Launcher;
use anyhow::{bail, Context as _};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::process::Command;

/// Seconds since the epoch now.
fn epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The start times the command wrote so far.
fn starts(file: &Path) -> Vec<f64> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Waits until the command has written `n` start times; the newest.
async fn until_started(file: &Path, n: usize, budget: Duration) -> anyhow::Result<f64> {
    let deadline = Instant::now() + budget;
    loop {
        let s = starts(file);
        if s.len() >= n {
            return Ok(s[n - 1]);
        }
        if Instant::now() > deadline {
            bail!(
                "the turn's command did not start within {budget:?} ({} turns so far)",
                s.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub async fn turns(plan: &Plan, launcher: &Launcher, dir: &Path, rec: &mut Record) -> anyhow::Result<Done> {
    let (server, _) = launcher.start(dir, &[], "turns").await?;
    let mut conn = Conn::connect(server.addr).await?;
    let file = dir.join("turn-starts");
    let logs = dir.join("wake-logs");
    let mut wake = Command::new(&launcher.program)
        .args([
            "wake",
            "--relay",
            &format!("http://{}", server.addr),
            "--as",
            "bench-agent",
            "--log-dir",
        ])
        .arg(&logs)
        .args(["--max-turns-per-hour", "0", "--loop-guard", "0", "--", "/bin/sh", "-c"])
        .arg(format!("date +%s.%N >> '{}'", file.display()))
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("spawn crosstalk wake")?;
    let directive = serde_json::json!({
        "sender": "bench", "type": "DIRECTIVE", "recipient": "bench-agent", "body": "go"
    })
    .to_string();
    let directive = bytes::Bytes::from(directive);
    // The first turn proves wake holds the identity; it is not timed. Posted until wake has
    // taken its lease (a post before that is not for it yet: it starts from the newest).
    let deadline = Instant::now() + plan.connect_budget;
    loop {
        let r = conn
            .post_json("/api/channels/bench-turns/messages", directive.clone())
            .await?;
        first_id(&r.body).context("post names no id")?;
        if until_started(&file, 1, Duration::from_millis(500)).await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("crosstalk wake never ran a turn");
        }
    }
    // Once the first turn has ended (and any posted before the lease taken), rounds start.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut seen = starts(&file).len();
    let mut samples = Vec::new();
    let end = Instant::now() + plan.wake_budget;
    while samples.len() < plan.wake_rounds && Instant::now() < end {
        let sent = epoch();
        let r = conn
            .post_json("/api/channels/bench-turns/messages", directive.clone())
            .await?;
        if !r.status.is_success() {
            bail!("post answered {}", r.status);
        }
        let started = until_started(&file, seen + 1, plan.delivery_budget).await?;
        seen += 1;
        samples.push(Duration::from_secs_f64((started - sent).max(0.0)));
        // The turn ends and is recorded before the next post, which would otherwise wait
        // behind it (messages that arrive during a turn go into the next).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = wake.start_kill();
    let _ = wake.wait().await;
    let s = summarize(&samples);
    rec.set("turn_start_p50_ms", s.p50_ms);
    rec.set("turn_start_p99_ms", s.p99_ms);
    rec.note(format!("wake turns: {} rounds, max {:.2} ms", s.count, s.max_ms));
    server.stop().await?;
    Ok(Done::Ran)
}
