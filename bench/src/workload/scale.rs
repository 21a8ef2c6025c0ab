//! Round-two workloads, crosstalk only, each on a server of its own started with the flags it
//! needs: durable POST with `--durability fsync`; 100,000 channels touched once (peak and
//! idle RSS, a live channel's POST latency meanwhile); 10,000 parked waiters woken by one
//! post per channel.

use super::mcp::Session;
use super::post::post_load;
use super::{message_json, Done, Plan, Record};
use crate::client::{first_id, Conn};
use crate::stats::summarize;
use crate::target::{Launcher, Server};
use anyhow::{bail, Context as _};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `--durability fsync`: every acknowledged post is also fdatasync'ed.
pub async fn fsync_post(plan: &Plan, launcher: &Launcher, dir: &Path, rec: &mut Record) -> anyhow::Result<Done> {
    let (server, _) = launcher.start(dir, &["--durability", "fsync"], "fsync").await?;
    let res = post_load(plan, &server, "bench-fsync", plan.connections).await?;
    res.check("fsync POST")?;
    let lat = summarize(&res.latencies);
    rec.set("fsync_post_per_s", res.rate());
    rec.set("fsync_post_p99_ms", lat.p99_ms);
    server.stop().await?;
    Ok(Done::Ran)
}

/// Samples the server's RSS every 50 ms and keeps the largest, until stopped.
struct PeakRss {
    peak_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl PeakRss {
    fn start(pid: u32) -> PeakRss {
        let peak_kib = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak_kib.clone(), stop.clone());
        tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                if let Ok(kib) = rss_kib(pid) {
                    p.fetch_max(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        PeakRss { peak_kib, stop }
    }

    fn peak_mib(&self) -> f64 {
        self.peak_kib.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

/// A gauge from `/metrics` (the bench runs the relay without a token).
async fn gauge(server: &Server, name: &str) -> anyhow::Result<f64> {
    let reply = Conn::connect(server.addr).await?.get("/metrics").await?;
    let text = String::from_utf8_lossy(&reply.body);
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no {name} in /metrics"))
}

/// The allocator's own account (`crosstalk_heap_*` in /metrics): "A MiB allocated of B MiB
/// resident", which tells live memory from freed memory not yet returned.
async fn heap_mib(server: &Server) -> anyhow::Result<String> {
    let allocated = gauge(server, "crosstalk_heap_allocated_bytes").await? / 1048576.0;
    let resident = gauge(server, "crosstalk_heap_resident_bytes").await? / 1048576.0;
    Ok(format!("{allocated:.0} MiB allocated of {resident:.0} MiB resident"))
}

/// Waits until the search index has every message (`crosstalk_search_channels_behind` is 0
/// and stays 0 on the next pass); returns how long that took.
async fn index_caught_up(server: &Server, budget: Duration) -> anyhow::Result<f64> {
    let from = Instant::now();
    let mut zeros = 0;
    while zeros < 2 {
        if from.elapsed() > budget {
            bail!("the search index did not catch up within {budget:?}");
        }
        match gauge(server, "crosstalk_search_channels_behind").await {
            Ok(v) if v < 0.5 => zeros += 1,
            _ => zeros = 0,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(from.elapsed().as_secs_f64())
}

/// One connection posting to a live channel until told to stop; each sample is (when it
/// finished, how long it took).
fn live_poster(
    server: &Server,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<(Instant, Duration)>>> {
    let addr = server.addr;
    tokio::spawn(async move {
        let mut conn = Conn::connect(addr).await?;
        let mut samples = Vec::new();
        // Bounded by the stop flag and by count (one post a millisecond at most, ~10 min).
        while !stop.load(Ordering::Relaxed) && samples.len() < 600_000 {
            let sent = Instant::now();
            let r = conn
                .post_json("/api/channels/bench-live/messages", message_json(0))
                .await?;
            if !r.status.is_success() {
                bail!("live post answered {}", r.status);
            }
            let done = Instant::now();
            samples.push((done, done - sent));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(samples)
    })
}

fn p99_between(samples: &[(Instant, Duration)], from: Instant, to: Instant) -> f64 {
    let window: Vec<Duration> = samples
        .iter()
        .filter(|(at, _)| *at >= from && *at <= to)
        .map(|(_, d)| *d)
        .collect();
    summarize(&window).p99_ms
}

/// 100,000 channels posted once each, from `plan.connections` connections, with a live
/// channel posting beside them; then the channels go idle and their actors stop.
pub async fn channels(plan: &Plan, launcher: &Launcher, dir: &Path, rec: &mut Record) -> anyhow::Result<Done> {
    let quiet = plan.idle_after_secs.to_string();
    // A poster counts as a party of its channel for the presence TTL (kept aside while the
    // channel is closed; it once kept the channel open): the run sets both to the same quiet
    // period, as every earlier run did. `--max-open-channels` is left at its default.
    let args = [
        "--idle-after-secs",
        &quiet,
        "--presence-ttl-secs",
        &quiet,
        "--max-channels",
        "1000000",
    ];
    let (server, _) = launcher.start(dir, &args, "channels").await?;
    let pid = server.pid()?;
    let rss_start = rss_kib(pid)? as f64 / 1024.0;
    let peak = PeakRss::start(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let live = live_poster(&server, stop.clone());
    let base_from = Instant::now();
    tokio::time::sleep(plan.warmup * 2).await;
    let touch_from = Instant::now();
    let deadline = touch_from + plan.scale_budget;
    let n = plan.touch_channels;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..plan.connections {
        let addr = server.addr;
        let conns = plan.connections;
        tasks.spawn(async move {
            let mut conn = Conn::connect(addr).await?;
            let mut done = 0usize;
            for i in (c..n).step_by(conns) {
                if Instant::now() > deadline {
                    bail!("touching {n} channels took longer than the budget");
                }
                let r = conn
                    .post_json(&format!("/api/channels/idle-{i}/messages"), message_json(c))
                    .await?;
                if !r.status.is_success() {
                    bail!("post to idle-{i} answered {}", r.status);
                }
                done += 1;
            }
            anyhow::Ok(done)
        });
    }
    let mut touched = 0;
    while let Some(j) = tasks.join_next().await {
        touched += j??;
    }
    let touch_to = Instant::now();
    let open_after_touch = gauge(&server, "crosstalk_channel_actors").await?;
    // Wait for every idle actor to stop (the live channel stays open).
    let close_deadline = Instant::now() + Duration::from_secs(plan.idle_after_secs * 4 + 30);
    let open = loop {
        let open = gauge(&server, "crosstalk_channel_actors").await?;
        if open <= 1.0 || Instant::now() > close_deadline {
            break open;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let closed_at = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let samples = live.await??;
    // Memory the allocator has given back shows a moment later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_closed = rss_kib(pid)? as f64 / 1024.0;
    let peak_mib = peak.peak_mib();
    drop(peak);
    if open > 1.0 {
        bail!(
            "{open} channel actors still open {:?} after the last touch",
            closed_at - touch_to
        );
    }
    // Nothing was lost when the actors stopped: a channel reopens with its message.
    let probe = Conn::connect(server.addr)
        .await?
        .get(&format!("/api/channels/idle-{}/messages", n / 2))
        .await?;
    if first_id(&probe.body).is_none() {
        bail!("a closed channel answered {} without its message", probe.status);
    }
    // Once the relay has no work left (the search index has every message), its memory is
    // compared with a fresh relay on the same store: what idle channels cost beyond the store.
    let settled = index_caught_up(&server, Duration::from_secs(120)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_idle = rss_kib(pid)? as f64 / 1024.0;
    let heap_idle = heap_mib(&server).await?;
    server.stop().await?;
    let (fresh, _) = launcher.start(dir, &args, "channels-restart").await?;
    index_caught_up(&fresh, Duration::from_secs(120)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_fresh = rss_kib(fresh.pid()?)? as f64 / 1024.0;
    let heap_fresh = heap_mib(&fresh).await?;
    fresh.stop().await?;
    rec.set("channels_touched", touched as f64);
    rec.set(
        "channels_touch_per_s",
        touched as f64 / (touch_to - touch_from).as_secs_f64(),
    );
    rec.set("channels_peak_rss_mb", peak_mib);
    rec.set("channels_idle_rss_mb", rss_idle);
    rec.set("channels_fresh_rss_mb", rss_fresh);
    rec.set(
        "channels_live_p99_base_ms",
        p99_between(&samples, base_from, touch_from),
    );
    rec.set(
        "channels_live_p99_touch_ms",
        p99_between(&samples, touch_from, touch_to),
    );
    rec.set(
        "channels_live_p99_closing_ms",
        p99_between(&samples, touch_to, closed_at),
    );
    rec.note(format!(
        "channels: {touched} channels touched in {:.1} s; RSS {rss_start:.0} MiB at start, peak {peak_mib:.0} MiB; \
         {open_after_touch} actors open after the touch, all idle ones closed {:.1} s after it (quiet period {} s); \
         RSS {rss_closed:.0} MiB 2 s later, {rss_idle:.0} MiB once the search index had caught up ({settled:.1} s, \
         heap {heap_idle}); a fresh relay on the same store: {rss_fresh:.0} MiB (heap {heap_fresh})",
        (touch_to - touch_from).as_secs_f64(),
        (closed_at - touch_to).as_secs_f64(),
        plan.idle_after_secs
    ));
    Ok(Done::Ran)
}

/// How one waiter waits.
#[derive(Clone, Copy)]
enum Via {
    LongPoll,
    Mcp,
}

/// 10,000 waiters (one in ten over MCP sessions) parked on 1,000 channels; one post to each
/// channel; every waiter's time from its channel's post being sent to its answer.
pub async fn waiters(plan: &Plan, launcher: &Launcher, dir: &Path, rec: &mut Record) -> anyhow::Result<Done> {
    let args = ["--max-waits-per-principal", "1000000", "--rate-limit", "0"];
    let (server, _) = launcher.start(dir, &args, "waiters").await?;
    let pid = server.pid()?;
    let (channels, per) = (plan.waiter_channels, plan.waiters_per_channel);
    let total = channels * per;
    // Each channel exists, with one message the waiters are past.
    let mut conn = Conn::connect(server.addr).await?;
    let mut last = vec![0u64; channels];
    for (c, last) in last.iter_mut().enumerate() {
        let r = conn
            .post_json(&format!("/api/channels/wait-{c}/messages"), message_json(0))
            .await?;
        *last = first_id(&r.body).context("post names no id")?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = rss_kib(pid)? as f64 / 1024.0;
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..channels).map(|_| AtomicU64::new(0)).collect());
    let epoch = Instant::now();
    let mut parked = tokio::task::JoinSet::new();
    for w in 0..total {
        let (c, addr, since) = (w % channels, server.addr, last[w % channels]);
        let via = if w % 10 == 9 { Via::Mcp } else { Via::LongPoll };
        let sent = sent.clone();
        parked.spawn(async move {
            let id = match via {
                Via::LongPoll => {
                    let mut conn = Conn::connect(addr).await?;
                    let r = conn
                        .get(&format!("/api/channels/wait-{c}/wait?since_id={since}&timeout_s=120"))
                        .await?;
                    first_id(&r.body)
                }
                Via::Mcp => {
                    let mut s = Session::open(addr).await?.context("no /mcp")?;
                    let got = s
                        .call(
                            "wait_for_message",
                            json!({"channel": format!("wait-{c}"), "since_id": since, "timeout_s": 50}),
                        )
                        .await?;
                    got["messages"][0]["id"].as_u64()
                }
            };
            let woke = epoch.elapsed().as_micros() as u64;
            let posted = sent[c].load(Ordering::Acquire);
            anyhow::Ok((id, posted, woke, matches!(via, Via::Mcp)))
        });
    }
    // Every waiter parked: /healthz counts pending waits.
    let park_deadline = Instant::now() + plan.connect_budget;
    let waiting = loop {
        let h = Conn::connect(server.addr).await?.get("/healthz").await?;
        let v: serde_json::Value = serde_json::from_slice(&h.body)?;
        let waiting = v["waits"].as_u64().unwrap_or(0) as usize;
        if waiting >= total || Instant::now() > park_deadline {
            break waiting;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if waiting < total {
        // Why the others did not park, if one of them has already ended with an error.
        let mut why = String::new();
        while let Some(ended) = parked.try_join_next() {
            match ended {
                Ok(Err(e)) => why = format!("; one waiter failed: {e:#}"),
                Err(e) => why = format!("; a waiter's task ended: {e}"),
                Ok(Ok(_)) => continue,
            }
            break;
        }
        bail!(
            "only {waiting} of {total} waiters parked within {:?}{why}",
            plan.connect_budget
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_parked = rss_kib(pid)? as f64 / 1024.0;
    // One post per channel, from `connections` connections at once.
    let mut posters = tokio::task::JoinSet::new();
    for p in 0..plan.connections {
        let (addr, sent, conns) = (server.addr, sent.clone(), plan.connections);
        posters.spawn(async move {
            let mut conn = Conn::connect(addr).await?;
            for c in (p..channels).step_by(conns) {
                sent[c].store(epoch.elapsed().as_micros() as u64, Ordering::Release);
                let r = conn
                    .post_json(&format!("/api/channels/wait-{c}/messages"), message_json(1))
                    .await?;
                if !r.status.is_success() {
                    bail!("post to wait-{c} answered {}", r.status);
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(j) = posters.join_next().await {
        j??;
    }
    let mut lat = Vec::new();
    let mut mcp_lat = Vec::new();
    let mut missing = 0;
    let collect_deadline = Instant::now() + plan.delivery_budget;
    while let Ok(Some(j)) = tokio::time::timeout_at(collect_deadline.into(), parked.join_next()).await {
        let (id, posted, woke, mcp) = j??;
        if id.is_none() || posted == 0 || woke < posted {
            missing += 1;
            continue;
        }
        let d = Duration::from_micros(woke - posted);
        lat.push(d);
        if mcp {
            mcp_lat.push(d);
        }
    }
    missing += parked.len();
    parked.abort_all();
    if lat.is_empty() || missing > 0 {
        bail!("{missing} of {total} waiters were not woken with their channel's message");
    }
    let s = summarize(&lat);
    let m = summarize(&mcp_lat);
    rec.set("waiters_p50_ms", s.p50_ms);
    rec.set("waiters_p99_ms", s.p99_ms);
    rec.set("waiters_rss_mb", rss_parked - rss_before);
    rec.note(format!(
        "waiters: {total} parked on {channels} channels ({} over MCP sessions), RSS {rss_before:.0} -> \
         {rss_parked:.0} MiB; all woken, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (MCP p99 {:.1} ms)",
        mcp_lat.len(),
        s.p50_ms,
        s.p99_ms,
        s.max_ms,
        m.p99_ms
    ));
    server.stop().await?;
    Ok(Done::Ran)
}
