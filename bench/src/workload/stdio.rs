//! `crosstalk mcp` children, as a host spawns them (crosstalk only, a server of its own):
//! one child listening to a channel, and the time from just before a REST post is sent until
//! the child has written the `notifications/claude/channel` line for it on its stdout; then a
//! fleet of children on one channel, one post at a time, until every child has written it.

use super::{message_json, Done, Plan, Record};
use crate::client::{first_id, Conn};
use crate::stats::summarize;
use crate::target::{Launcher, Server};
use anyhow::{bail, Context as _};
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// A line a child wrote: which child, the id of the message it pushes (`None`: its answer to
/// `initialize`, so its listener is set up), when it was read.
type Seen = (usize, Option<u64>, Instant);

struct Children {
    procs: Vec<Child>,
    seen: mpsc::UnboundedReceiver<Seen>,
}

impl Children {
    /// Spawns `n` children listening to `channel`, each initialized as a host does.
    async fn spawn(program: &Path, server: &Server, channel: &str, n: usize) -> anyhow::Result<Children> {
        let (tx, seen) = mpsc::unbounded_channel();
        let mut procs = Vec::with_capacity(n);
        let url = format!("http://{}", server.addr);
        for i in 0..n {
            let mut child = Command::new(program)
                .args(["mcp", "--relay", &url, "--listen", channel])
                .env("RUST_LOG", "error")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context("spawn crosstalk mcp")?;
            let mut stdin = child.stdin.take().context("stdin")?;
            let stdout = child.stdout.take().context("stdout")?;
            stdin
                .write_all(
                    concat!(
                        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#,
                        "\n",
                        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                        "\n"
                    )
                    .as_bytes(),
                )
                .await?;
            let tx = tx.clone();
            tokio::spawn(async move {
                let _keep_open = stdin;
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let at = Instant::now();
                    let Ok(v) = serde_json::from_str::<Value>(&line) else {
                        continue;
                    };
                    let seen = if v["id"] == 1 {
                        None
                    } else if v["method"] == "notifications/claude/channel" {
                        match v["params"]["meta"]["message_id"].as_str().and_then(|s| s.parse().ok()) {
                            Some(id) => Some(id),
                            None => continue,
                        }
                    } else {
                        continue;
                    };
                    if tx.send((i, seen, at)).is_err() {
                        return;
                    }
                }
            });
            procs.push(child);
        }
        Ok(Children { procs, seen })
    }

    /// Waits until every child has written message `id` (`None`: answered `initialize`);
    /// returns when each did.
    async fn all_have(&mut self, id: Option<u64>, budget: Duration) -> anyhow::Result<Vec<Instant>> {
        let mut got: Vec<Option<Instant>> = vec![None; self.procs.len()];
        let deadline = tokio::time::Instant::now() + budget;
        while got.iter().any(Option::is_none) {
            match tokio::time::timeout_at(deadline, self.seen.recv()).await {
                Ok(Some((i, seen_id, at))) if seen_id == id => got[i] = got[i].or(Some(at)),
                Ok(Some(_)) => {}
                Ok(None) => bail!("the children's stdout closed"),
                Err(_) => bail!(
                    "{} of {} children did not write {id:?} within {budget:?}",
                    got.iter().filter(|g| g.is_none()).count(),
                    got.len()
                ),
            }
        }
        Ok(got.into_iter().flatten().collect())
    }
}

/// Posts once and returns the id and when it was sent.
async fn post(conn: &mut Conn, channel: &str) -> anyhow::Result<(u64, Instant)> {
    let sent = Instant::now();
    let r = conn
        .post_json(&format!("/api/channels/{channel}/messages"), message_json(1))
        .await?;
    if !r.status.is_success() {
        bail!("post answered {}", r.status);
    }
    Ok((first_id(&r.body).context("post names no id")?, sent))
}

pub async fn stdio(plan: &Plan, launcher: &Launcher, dir: &Path, rec: &mut Record) -> anyhow::Result<Done> {
    let (server, _) = launcher.start(dir, &[], "stdio").await?;
    let mut conn = Conn::connect(server.addr).await?;

    // One child: post → its notification line.
    let mut one = Children::spawn(&launcher.program, &server, "bench-stdio", 1).await?;
    one.all_have(None, plan.connect_budget).await?;
    // The first post proves the child's stream is open; it is not timed.
    let (id, _) = post(&mut conn, "bench-stdio").await?;
    one.all_have(Some(id), plan.connect_budget).await?;
    let mut samples = Vec::new();
    let deadline = Instant::now() + plan.wake_budget;
    while samples.len() < plan.wake_rounds && Instant::now() < deadline {
        let (id, sent) = post(&mut conn, "bench-stdio").await?;
        let at = one.all_have(Some(id), plan.delivery_budget).await?;
        samples.push(at[0] - sent);
    }
    let s = summarize(&samples);
    rec.set("stdio_push_p50_ms", s.p50_ms);
    rec.set("stdio_push_p99_ms", s.p99_ms);
    rec.note(format!("stdio push: {} rounds, max {:.2} ms", s.count, s.max_ms));
    drop(one);

    // A fleet of children on one channel.
    let n = if plan.smoke { 5 } else { 100 };
    let mut fleet = Children::spawn(&launcher.program, &server, "bench-stdio-fleet", n).await?;
    fleet.all_have(None, plan.connect_budget).await?;
    let (id, _) = post(&mut conn, "bench-stdio-fleet").await?;
    fleet.all_have(Some(id), plan.connect_budget).await?;
    let mut all = Vec::new();
    for _ in 0..plan.fanout_rounds {
        let (id, sent) = post(&mut conn, "bench-stdio-fleet").await?;
        for at in fleet.all_have(Some(id), plan.delivery_budget).await? {
            all.push(at - sent);
        }
    }
    let f = summarize(&all);
    rec.set("stdio_fleet_p50_ms", f.p50_ms);
    rec.set("stdio_fleet_p99_ms", f.p99_ms);
    rec.note(format!(
        "stdio fleet: {n} children, {} posts, {} notifications, max {:.2} ms",
        plan.fanout_rounds, f.count, f.max_ms
    ));
    drop(fleet);
    server.stop().await?;
    Ok(Done::Ran)
}
