//! Workloads 1 and 2: durable POST throughput, then tail reads of the channel it filled.

use super::{closed_loop, message_json, Done, LoadResult, Plan, Record};
use crate::client::{first_id, Conn, RawRequest};
use crate::stats::summarize;
use crate::target::{Kind, Server};
use hyper::{Method, StatusCode};
use std::sync::Arc;

pub const CHANNEL: &str = "bench-post";
/// How far behind the newest message a tail read starts: each read returns this many.
pub const TAIL_BEHIND: u64 = 10;

/// Both answer a stored post with 200.
fn created_status(_: Kind) -> StatusCode {
    StatusCode::OK
}

/// A post's p99 that a rate must keep to count as sustained (the target's).
pub const SUSTAINED_P99_MS: f64 = 3.0;

/// Posts from `plan.connections` connections for the run's duration, then from each of
/// `plan.sweep_connections`; every post is acknowledged only once durable (crosstalk's
/// default `--durability flush`; SQLite's commit). Returns the largest id acknowledged.
///
/// Each connection sends its next post when the last is answered, so with few connections
/// the rate is connections ÷ one post's latency and a server that batches its writes sits
/// partly idle; with more the server is the limit, and past it more connections only add
/// waiting. crosstalk's sustained rate is the best of the runs whose p99 stays within
/// [`SUSTAINED_P99_MS`] (if none does, the run with the lowest p99, which then misses its
/// target); crosstalk-mcp's is the best of all its runs, whatever their p99 (none keeps it).
pub async fn post(plan: &Plan, server: &Server, rec: &mut Record) -> anyhow::Result<u64> {
    let mut newest = 0;
    let mut runs = Vec::new();
    for connections in plan.post_connections() {
        let res = post_load(plan, server, CHANNEL, connections).await?;
        res.check("durable POST")?;
        let lat = summarize(&res.latencies);
        rec.note(format!(
            "POST: {} acknowledged in {:.1} s on {connections} connections, p99 {:.2} ms",
            res.ok, res.seconds, lat.p99_ms
        ));
        rec.set(&format!("post_{connections}c_per_s"), res.rate());
        rec.set(&format!("post_{connections}c_p99_ms"), lat.p99_ms);
        if connections == plan.connections {
            rec.set("post_per_s", res.rate());
            rec.set("post_p50_ms", lat.p50_ms);
            rec.set("post_p99_ms", lat.p99_ms);
        }
        newest = newest.max(res.max_id);
        runs.push((connections, res.rate(), lat.p99_ms));
    }
    let sustained = match server.kind {
        Kind::Crosstalk => sustained(&runs, SUSTAINED_P99_MS),
        Kind::Peer => runs.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)),
    };
    if let Some((connections, rate, p99)) = sustained {
        rec.set("post_cap_per_s", rate);
        rec.set("post_cap_p99_ms", p99);
        if server.kind == Kind::Crosstalk {
            rec.set("post_cap_conns", connections as f64);
        }
    }
    if server.kind == Kind::Crosstalk {
        spread(plan, server, rec).await?;
    }
    Ok(newest)
}

/// Channels the last POST run of crosstalk spreads its load over.
const SPREAD_CHANNELS: usize = 16;

/// The sweep's most connections again, spread evenly over [`SPREAD_CHANNELS`] channels (at
/// least one connection each): what a fan-out of agents on channels of their own gets, where
/// each channel's batch carries a few posts rather than dozens (docs/benchmarks.md, "A load
/// spread over channels").
async fn spread(plan: &Plan, server: &Server, rec: &mut Record) -> anyhow::Result<()> {
    // The row's label says the sweep's most connections; a plan of fewer than one a channel
    // (the smoke's) still gives each channel one.
    let each = (plan.most_connections() / SPREAD_CHANNELS).max(1);
    let names: Vec<String> = (0..SPREAD_CHANNELS).map(|k| format!("bench-spread-{k}")).collect();
    let runs = futures_util::future::join_all(names.iter().map(|c| post_load(plan, server, c, each))).await;
    let (mut rate, mut latencies) = (0.0, Vec::new());
    for run in runs {
        let run = run?;
        run.check("durable POST over channels")?;
        rate += run.rate();
        latencies.extend(run.latencies);
    }
    let lat = summarize(&latencies);
    rec.set("post_spread_per_s", rate);
    rec.set("post_spread_p99_ms", lat.p99_ms);
    rec.note(format!(
        "POST: {} connections over {SPREAD_CHANNELS} channels ({each} each): {rate:.0}/s, p50 {:.2} ms, p99 {:.2} ms",
        each * SPREAD_CHANNELS,
        lat.p50_ms,
        lat.p99_ms
    ));
    Ok(())
}

/// Of `runs` (connections, rate, p99 ms), the best rate whose p99 stays within `p99_ms`; if
/// none does, the run with the lowest p99 (which then misses its target).
pub fn sustained(runs: &[(usize, f64, f64)], p99_ms: f64) -> Option<(usize, f64, f64)> {
    runs.iter()
        .filter(|r| r.2 <= p99_ms)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .or_else(|| runs.iter().min_by(|a, b| a.2.total_cmp(&b.2)))
        .copied()
}

/// The closed POST loop of [`post`] on `channel`, from `connections` connections.
pub async fn post_load(plan: &Plan, server: &Server, channel: &str, connections: usize) -> anyhow::Result<LoadResult> {
    let path = format!("/api/channels/{channel}/messages");
    let (addr, want) = (server.addr, created_status(server.kind));
    closed_loop(
        addr,
        connections,
        plan.warmup,
        plan.duration,
        Arc::new(move |c| RawRequest::new(&Method::POST, &path, addr, &message_json(c))),
        Arc::new(move |status: StatusCode, body: &[u8]| {
            if status != want {
                return Err(format!("POST answered {status} ({})", String::from_utf8_lossy(body)));
            }
            first_id(body)
                .map(Some)
                .ok_or_else(|| "POST answer names no id".to_owned())
        }),
    )
    .await
}

/// `GET …/messages?since_id=<newest − 10>` from `plan.connections` connections: every read
/// returns the channel's ten newest messages.
pub async fn tail(plan: &Plan, server: &Server, rec: &mut Record, last_id: u64) -> anyhow::Result<Done> {
    if last_id <= TAIL_BEHIND {
        anyhow::bail!("tail reads need the POST workload to have stored messages first");
    }
    let path = format!("/api/channels/{CHANNEL}/messages?since_id={}", last_id - TAIL_BEHIND);
    // Check the shape once, fully: ten messages, the newest last.
    let first = Conn::connect(server.addr).await?.get(&path).await?;
    let parsed: serde_json::Value = serde_json::from_slice(&first.body)?;
    let ids: Vec<u64> = parsed
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["id"].as_u64()).collect())
        .unwrap_or_default();
    if first.status != StatusCode::OK || ids.len() as u64 != TAIL_BEHIND || ids.last() != Some(&last_id) {
        anyhow::bail!(
            "tail read answered {} with ids {ids:?}; expected the 10 up to {last_id}",
            first.status
        );
    }
    let addr = server.addr;
    let res = closed_loop(
        addr,
        plan.connections,
        plan.warmup,
        plan.duration,
        Arc::new(move |_| RawRequest::new(&Method::GET, &path, addr, &[])),
        Arc::new(|status: StatusCode, body: &[u8]| {
            if status == StatusCode::OK && body.starts_with(b"[{") {
                Ok(None)
            } else {
                Err(format!("tail read answered {status}"))
            }
        }),
    )
    .await?;
    res.check("tail read")?;
    let lat = summarize(&res.latencies);
    rec.set("tail_per_s", res.rate());
    rec.set("tail_p99_ms", lat.p99_ms);
    Ok(Done::Ran)
}
