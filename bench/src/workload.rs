//! What every workload shares: the plan (counts and durations, full or smoke), the message
//! every workload posts, the record of figures, and the closed-loop request driver.
//!
//! Every loop here is bounded twice: by a deadline and by the plan's counts.

pub mod cluster;
pub mod fanout;
pub mod mcp;
pub mod post;
pub mod reference;
pub mod scale;
pub mod search;
pub mod startup;
pub mod stdio;
pub mod turns;
pub mod wake;

use crate::client::{RawConn, RawRequest};
use bytes::Bytes;
use hyper::StatusCode;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts and durations of one run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub smoke: bool,
    /// Measured part of each throughput workload.
    pub duration: Duration,
    /// Unmeasured lead-in of each throughput workload (connections warm, caches filled).
    pub warmup: Duration,
    /// Concurrent connections of the throughput workloads.
    pub connections: usize,
    /// More durable-POST runs, from this many connections each, after the one from
    /// `connections`: what a server sustains (with few connections a closed loop is bound by
    /// one post's latency, not by the server), and at what p99.
    pub sweep_connections: Vec<usize>,
    /// Post → wake round trips, at most.
    pub wake_rounds: usize,
    /// Wall-clock bound on the wake workload.
    pub wake_budget: Duration,
    pub fanout_subscribers: usize,
    /// Posts each reaching every fan-out subscriber.
    pub fanout_rounds: usize,
    pub idle_subscribers: usize,
    /// How long a fleet of subscribers may take to connect and see `ready`.
    pub connect_budget: Duration,
    /// How long one post may take to reach every subscriber before the rest count as lost.
    pub delivery_budget: Duration,
    /// Messages stored before the start-up is timed.
    pub startup_messages: u64,
    /// Timed restarts on the populated store; the median is reported.
    pub startup_restarts: usize,
    /// Channels the `channels` workload posts to once each.
    pub touch_channels: usize,
    /// The relay's `--idle-after-secs` (and presence TTL) in the `channels` workload.
    pub idle_after_secs: u64,
    /// Wall-clock bound on touching the channels.
    pub scale_budget: Duration,
    /// Channels of the `waiters` workload, and waiters parked on each.
    pub waiter_channels: usize,
    pub waiters_per_channel: usize,
    /// Messages of the `search` workload's store.
    pub search_messages: u64,
    /// After the cluster's one-channel POST runs, the same load from the largest connection
    /// count spread evenly over this many channels each: whether posts sharing fewer
    /// messages, with more appends on their way at once, carry more (on this box they carry
    /// less; docs/scaling.md).
    pub cluster_channels: Vec<usize>,
    /// Rounds of the `reference` workload: crosstalk, the minimal durable server and HTTP alone,
    /// alternated, each from 16 and from 64 connections for `duration`.
    pub reference_rounds: usize,
}

impl Plan {
    pub fn full() -> Plan {
        Plan {
            smoke: false,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            connections: 16,
            sweep_connections: vec![32, 48, 64],
            wake_rounds: 500,
            reference_rounds: 3,
            wake_budget: Duration::from_secs(30),
            fanout_subscribers: 1000,
            fanout_rounds: 10,
            idle_subscribers: 10_000,
            connect_budget: Duration::from_secs(120),
            delivery_budget: Duration::from_secs(10),
            startup_messages: 1_000_000,
            startup_restarts: 3,
            touch_channels: 100_000,
            idle_after_secs: 5,
            scale_budget: Duration::from_secs(300),
            waiter_channels: 1000,
            waiters_per_channel: 10,
            search_messages: 1_000_000,
            cluster_channels: vec![4, 16],
        }
    }

    /// About a second per workload, tiny counts: does every workload work at all?
    pub fn smoke() -> Plan {
        Plan {
            smoke: true,
            duration: Duration::from_millis(800),
            warmup: Duration::from_millis(200),
            connections: 4,
            sweep_connections: vec![8],
            wake_rounds: 10,
            reference_rounds: 1,
            wake_budget: Duration::from_secs(5),
            fanout_subscribers: 20,
            fanout_rounds: 2,
            idle_subscribers: 200,
            connect_budget: Duration::from_secs(20),
            delivery_budget: Duration::from_secs(5),
            startup_messages: 2_000,
            startup_restarts: 1,
            touch_channels: 2_000,
            idle_after_secs: 1,
            scale_budget: Duration::from_secs(60),
            waiter_channels: 20,
            waiters_per_channel: 10,
            search_messages: 2_000,
            cluster_channels: vec![2],
        }
    }

    /// The connection counts of the durable-POST runs, in order: `connections`, then the sweep.
    pub fn post_connections(&self) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(self.connections).chain(self.sweep_connections.iter().copied())
    }

    /// The largest of [`Plan::post_connections`].
    pub fn most_connections(&self) -> usize {
        self.post_connections().max().unwrap_or(self.connections)
    }
}

/// A message body of exactly this many bytes: the size the targets are stated for.
pub const BODY_BYTES: usize = 100;

/// The JSON every REST workload posts: `{sender, type, body}` with a 100-byte body.
pub fn message_json(sender: usize) -> Bytes {
    let body = body_text(sender);
    Bytes::from(format!(
        r#"{{"sender":"bench-{sender:02}","type":"note","body":"{body}"}}"#
    ))
}

/// 100 bytes of plain text, different per sender so nothing can deduplicate it.
pub fn body_text(sender: usize) -> String {
    let mut s = format!("load test message from bench-{sender:02}: ");
    let filler = "the quick brown fox jumps over the lazy dog ";
    while s.len() < BODY_BYTES {
        s.push_str(filler);
    }
    s.truncate(BODY_BYTES);
    s
}

/// Figures and notes of one system, keyed by metric.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Record {
    pub values: BTreeMap<String, f64>,
    pub notes: Vec<String>,
    /// Workload → `ok`, `skipped: why` or `failed: why`.
    pub workloads: BTreeMap<String, String>,
}

impl Record {
    pub fn set(&mut self, key: &str, value: f64) {
        self.values.insert(key.to_owned(), value);
    }

    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }
}

/// A workload that ran, or one that does not apply to this server.
pub enum Done {
    Ran,
    Skipped(String),
}

/// Result of a closed-loop run.
pub struct LoadResult {
    /// Good answers completed inside the measured window.
    pub ok: u64,
    /// Bad answers or transport errors anywhere in the run.
    pub errors: u64,
    pub first_error: Option<String>,
    pub seconds: f64,
    pub latencies: Vec<Duration>,
    /// Largest message id any answer named.
    pub max_id: u64,
}

impl LoadResult {
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.seconds
    }

    /// A run "works" if it had good answers and no bad ones.
    pub fn check(&self, what: &str) -> anyhow::Result<()> {
        if self.ok == 0 || self.errors > 0 {
            anyhow::bail!(
                "{what}: {} good, {} failed answers; first failure: {}",
                self.ok,
                self.errors,
                self.first_error.as_deref().unwrap_or("none")
            );
        }
        Ok(())
    }
}

/// Accepts an answer, given its status and body (with the message id it names, if any), or
/// says what is wrong with it.
pub type Validate = Arc<dyn Fn(StatusCode, &[u8]) -> Result<Option<u64>, String> + Send + Sync>;

/// `connections` tasks, each on its own connection, each sending its request (`make(c)` for
/// connection `c`, built once as bytes) again as soon as the previous answer is read, for
/// `warmup + duration`. Counts answers that `validate` accepts and that complete inside the
/// measured window. Requests go through [`RawConn`], the load generator's cheapest client, so
/// that it takes as little of the shared box from the server under test as it can.
pub async fn closed_loop(
    addr: SocketAddr,
    connections: usize,
    warmup: Duration,
    duration: Duration,
    make: Arc<dyn Fn(usize) -> RawRequest + Send + Sync>,
    validate: Validate,
) -> anyhow::Result<LoadResult> {
    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..connections {
        let make = make.clone();
        let validate = validate.clone();
        tasks.spawn(async move {
            let mut conn = RawConn::connect(addr).await?;
            tokio::time::sleep_until(start.into()).await;
            let request = make(c);
            let mut out = LoadResult {
                ok: 0,
                errors: 0,
                first_error: None,
                seconds: 0.0,
                latencies: Vec::new(),
                max_id: 0,
            };
            while Instant::now() < end {
                let sent = Instant::now();
                let verdict = match conn.request(&request).await {
                    Ok((status, body)) => validate(status, &body),
                    Err(e) => {
                        let _ = conn.reconnect().await;
                        Err(format!("transport: {e:#}"))
                    }
                };
                let done = Instant::now();
                match verdict {
                    Ok(id) => {
                        out.max_id = out.max_id.max(id.unwrap_or(0));
                        if done >= measure_from && done <= end {
                            out.ok += 1;
                            out.latencies.push(done - sent);
                        }
                    }
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert(e);
                        // A failing server must not turn into a busy loop.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            Ok::<_, anyhow::Error>(out)
        });
    }
    let mut total = LoadResult {
        ok: 0,
        errors: 0,
        first_error: None,
        seconds: duration.as_secs_f64(),
        latencies: Vec::new(),
        max_id: 0,
    };
    while let Some(joined) = tasks.join_next().await {
        let part = joined??;
        total.ok += part.ok;
        total.errors += part.errors;
        total.max_id = total.max_id.max(part.max_id);
        if total.first_error.is_none() {
            total.first_error = part.first_error;
        }
        total.latencies.extend(part.latencies);
    }
    Ok(total)
}
