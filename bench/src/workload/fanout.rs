//! Workloads 4 and 5, both on a fleet of SSE subscribers, each on its own connection:
//! fan-out (one post reaches every subscriber: delivery latency) and idle memory (the
//! server's RSS growth per idle subscriber).

use super::{message_json, Done, Plan, Record};
use crate::client::{first_id, Conn, SseReader};
use crate::stats::summarize;
use crate::target::{Kind, Server};
use anyhow::{bail, Context as _};
use hyper::Method;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::task::JoinSet;

pub const FANOUT_CHANNEL: &str = "bench-fanout";
pub const IDLE_CHANNEL: &str = "bench-idle";
/// Subscribers connecting at once; more would overflow the server's accept backlog.
const CONNECTING_AT_ONCE: usize = 64;
/// Time the server gets to settle before RSS is read.
const SETTLE: Duration = Duration::from_secs(2);

/// Open SSE subscribers. Dropping the fleet closes every connection.
struct Fleet {
    _tasks: JoinSet<()>,
    ready: usize,
    /// (message id, arrival) for every `message` event any subscriber read.
    events: mpsc::UnboundedReceiver<(u64, Instant)>,
    failed: usize,
    first_failure: Option<String>,
}

async fn open_fleet(addr: SocketAddr, channel: &str, since_id: u64, n: usize, budget: Duration) -> Fleet {
    let ready = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let first_failure = Arc::new(Mutex::new(None::<String>));
    let changed = Arc::new(Notify::new());
    let gate = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let (tx, events) = mpsc::unbounded_channel();
    let path = Arc::new(format!("/api/channels/{channel}/stream?since_id={since_id}"));
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let (ready, failed, first_failure, changed, gate, tx, path) = (
            ready.clone(),
            failed.clone(),
            first_failure.clone(),
            changed.clone(),
            gate.clone(),
            tx.clone(),
            path.clone(),
        );
        tasks.spawn(async move {
            let mut permit = Some(gate.acquire_owned().await);
            let run = async {
                let mut conn = Conn::connect(addr).await?;
                let res = conn.send(Method::GET, &path, &[], Default::default()).await?;
                let mut reader = SseReader::new(res)?;
                while let Some(ev) = reader.next().await? {
                    match ev.event.as_str() {
                        "ready" => {
                            permit = None;
                            ready.fetch_add(1, Ordering::Relaxed);
                            changed.notify_one();
                        }
                        "message" => {
                            let at = Instant::now();
                            let id = first_id(ev.data.as_bytes()).context("message event names no id")?;
                            let _ = tx.send((id, at));
                        }
                        _ => {}
                    }
                }
                drop(conn);
                anyhow::Ok(())
            };
            if let Err(e) = run.await {
                failed.fetch_add(1, Ordering::Relaxed);
                first_failure.lock().unwrap().get_or_insert_with(|| format!("{e:#}"));
            }
            drop(permit);
            changed.notify_one();
        });
    }
    let deadline = Instant::now() + budget;
    while ready.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed) < n && Instant::now() < deadline {
        let _ = tokio::time::timeout(Duration::from_millis(100), changed.notified()).await;
    }
    let first_failure = first_failure.lock().unwrap().take();
    Fleet {
        _tasks: tasks,
        ready: ready.load(Ordering::Relaxed),
        events,
        failed: failed.load(Ordering::Relaxed),
        first_failure,
    }
}

/// Posts one message and returns its id.
async fn post_one(conn: &mut Conn, channel: &str) -> anyhow::Result<u64> {
    let r = conn
        .post_json(&format!("/api/channels/{channel}/messages"), message_json(2))
        .await?;
    if !r.status.is_success() {
        bail!("post answered {}", r.status);
    }
    first_id(&r.body).context("post answer names no id")
}

pub async fn fanout(plan: &Plan, server: &Server, rec: &mut Record) -> anyhow::Result<Done> {
    let mut poster = Conn::connect(server.addr).await?;
    let since = post_one(&mut poster, FANOUT_CHANNEL).await?;
    let n = plan.fanout_subscribers;
    let mut fleet = open_fleet(server.addr, FANOUT_CHANNEL, since, n, plan.connect_budget).await;
    if fleet.ready < n {
        let msg = format!(
            "fan-out: only {} of {n} subscribers got `ready` within {:?} ({} failed: {})",
            fleet.ready,
            plan.connect_budget,
            fleet.failed,
            fleet.first_failure.as_deref().unwrap_or("-")
        );
        if server.kind == Kind::Crosstalk || fleet.ready == 0 {
            bail!(msg);
        }
        rec.note(msg);
    }
    rec.set("fanout_subscribers", fleet.ready as f64);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut samples = Vec::new();
    let mut lost = 0usize;
    for _ in 0..plan.fanout_rounds {
        let sent = Instant::now();
        let id = post_one(&mut poster, FANOUT_CHANNEL).await?;
        let deadline = sent + plan.delivery_budget;
        let mut got = 0;
        while got < fleet.ready {
            match tokio::time::timeout_at(deadline.into(), fleet.events.recv()).await {
                Ok(Some((eid, at))) if eid == id => {
                    got += 1;
                    samples.push(at - sent);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        lost += fleet.ready - got;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if samples.is_empty() {
        bail!("fan-out: no post reached any subscriber");
    }
    let s = summarize(&samples);
    rec.set("fanout_p50_ms", s.p50_ms);
    rec.set("fanout_p99_ms", s.p99_ms);
    rec.set("fanout_lost", lost as f64);
    rec.note(format!(
        "fan-out: {} posts x {} subscribers, {} deliveries, {lost} not delivered within {:?}, max {:.1} ms",
        plan.fanout_rounds, fleet.ready, s.count, plan.delivery_budget, s.max_ms
    ));
    if lost > 0 && server.kind == Kind::Crosstalk {
        bail!("fan-out: {lost} deliveries missing");
    }
    Ok(Done::Ran)
}

/// Open SSE streams and pending waits, from crosstalk's `/healthz`.
async fn open_streams(addr: SocketAddr) -> anyhow::Result<u64> {
    let r = crate::client::get_once(addr, "/healthz").await?;
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    v["streams"].as_u64().context("/healthz names no stream count")
}

pub async fn idle(plan: &Plan, server: &Server, rec: &mut Record, max_subscribers: usize) -> anyhow::Result<Done> {
    let n = plan.idle_subscribers.min(max_subscribers);
    if n < plan.idle_subscribers {
        rec.note(format!("idle memory: capped at {n} subscribers by the open-file limit"));
    }
    let mut poster = Conn::connect(server.addr).await?;
    let since = post_one(&mut poster, IDLE_CHANNEL).await?;
    tokio::time::sleep(SETTLE).await;
    let before = server.rss_kib()?;
    let fleet = open_fleet(server.addr, IDLE_CHANNEL, since, n, plan.connect_budget).await;
    if fleet.ready == 0 || (fleet.ready < n && server.kind == Kind::Crosstalk) {
        bail!(
            "idle memory: only {} of {n} subscribers got `ready` ({} failed: {})",
            fleet.ready,
            fleet.failed,
            fleet.first_failure.as_deref().unwrap_or("-")
        );
    }
    tokio::time::sleep(SETTLE).await;
    let after = server.rss_kib()?;
    if server.kind == Kind::Crosstalk {
        let open = open_streams(server.addr).await?;
        if open < fleet.ready as u64 {
            bail!(
                "idle memory: /healthz counts {open} streams, {} subscribers are connected",
                fleet.ready
            );
        }
    }
    let per = (after as f64 - before as f64) / fleet.ready as f64;
    rec.set("idle_subscribers", fleet.ready as f64);
    rec.set("idle_kib_per_sub", per);
    rec.set("idle_kb_per_sub", per * 1.024);
    rec.set("idle_rss_before_mib", before as f64 / 1024.0);
    rec.set("idle_rss_after_mib", after as f64 / 1024.0);
    rec.note(format!(
        "idle memory: RSS {:.1} MiB -> {:.1} MiB with {} idle SSE subscribers",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        fleet.ready
    ));
    drop(fleet);
    if server.kind == Kind::Crosstalk {
        // Streams must end with their clients; wait (bounded) to see it.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let open = open_streams(server.addr).await?;
            if open == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!("{open} SSE streams still open 10 s after their clients closed");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(Done::Ran)
}
