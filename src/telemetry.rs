//! `GET /metrics`: the relay's metrics in Prometheus text format, behind the token like every
//! route but `/healthz`. Counters and histograms are recorded where things happen (through
//! the `metrics` facade: operations by face here in `ops::call`, refusals in the guard,
//! commit rounds and flushes on the store thread, wakes in waits and streams); gauges of
//! state (channel actors, waits, streams, store size, index lag) are read at scrape time.

use crate::ops::Ctx;
use actix_web::{web, HttpResponse};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::Duration;

pub const METRICS_PATH: &str = "/metrics";

/// How often histograms are folded in when nobody scrapes (bounds their memory).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Buckets of the latency histograms, in seconds: 50 µs to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// Buckets of the writes a commit round makes durable with one flush, and of the events one
/// message of a cluster's log carries.
const ROUND_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// The process's recorder, installed on first use. One per process: the metrics facade has
/// one global recorder, so relays served in one test process share it.
pub fn handle() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let built = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full("crosstalk_commit_round_writes".into()), ROUND_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full("crosstalk_cluster_append_events".into()), ROUND_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full("crosstalk_cluster_append_channels".into()), ROUND_BUCKETS)
                })
                .and_then(|b| b.install_recorder());
            match built {
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics are off: a recorder is already installed");
                    None
                }
            }
        })
        .as_ref()
}

/// Starts folding histograms in periodically; call once the actix system runs.
pub fn start_upkeep() {
    if let Some(h) = handle() {
        actix_web::rt::spawn(async move {
            let mut every = tokio::time::interval(UPKEEP_EVERY);
            loop {
                every.tick().await;
                h.run_upkeep();
            }
        });
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "crosstalk_operations_total",
        "Operations run, by face (rest, cc-rest, mcp, cc-mcp), operation and outcome (ok or the error code)"
    );
    describe_counter!(
        "crosstalk_rejected_total",
        "Requests refused before any operation ran, by reason (host, origin, unauthorized, rate_limited, too_large, timeout, invalid_input)"
    );
    describe_counter!(
        "crosstalk_flush_failures_total",
        "Store flushes that failed (nothing of their round was acknowledged)"
    );
    describe_histogram!(
        "crosstalk_commit_round_writes",
        "Writes made durable by one flush (group commit)"
    );
    describe_histogram!(
        "crosstalk_flush_seconds",
        Unit::Seconds,
        "Time of one store flush (or fsync)"
    );
    describe_histogram!(
        "crosstalk_wake_seconds",
        Unit::Seconds,
        "From a batch becoming visible to a woken reader (wait or sse) having it"
    );
    describe_gauge!("crosstalk_channel_actors", "Channel actors in memory (idle ones stop)");
    describe_gauge!("crosstalk_open_waits", "Long-poll and MCP waits pending");
    describe_gauge!("crosstalk_open_streams", "SSE streams open");
    describe_gauge!("crosstalk_mcp_sessions", "MCP sessions open (both faces)");
    describe_gauge!(
        "crosstalk_mcp_sessions_initializing",
        "MCP sessions open that have not finished their handshake"
    );
    describe_gauge!("crosstalk_store_bytes", Unit::Bytes, "Size of the store on disk");
    describe_gauge!(
        "crosstalk_search_index_lag_seconds",
        Unit::Seconds,
        "Time since the search index last held every committed message (it works when the relay is quiet)"
    );
    describe_gauge!(
        "crosstalk_search_channels_behind",
        "Channels with messages the search index lacks, at its last pass"
    );
    describe_gauge!(
        "crosstalk_heap_allocated_bytes",
        Unit::Bytes,
        "Bytes the process has allocated and not freed (jemalloc's stats.allocated)"
    );
    describe_gauge!(
        "crosstalk_heap_resident_bytes",
        Unit::Bytes,
        "Bytes of the allocator's pages in memory, in use or not yet returned to the system (jemalloc's stats.resident)"
    );
    describe_gauge!(
        "crosstalk_cluster_folded_through",
        "A cluster node: the shared log's sequence up to which its store durably holds the fold (a restart follows the log from the next one)"
    );
    describe_histogram!(
        "crosstalk_cluster_append_gather_seconds",
        Unit::Seconds,
        "A cluster node: how long an event waited for the node's message already on its way to the log before its own went"
    );
    describe_histogram!(
        "crosstalk_cluster_append_events",
        "A cluster node: events one message it appended to the log carried"
    );
    describe_histogram!(
        "crosstalk_cluster_append_channels",
        "A cluster node: channels whose events one message it appended to the log carried (more than one: a message of several channels)"
    );
    describe_counter!(
        "crosstalk_cluster_several_removed_total",
        "A cluster node: messages of several channels it removed from the log once retention had cut each of their channels past them"
    );
    describe_histogram!(
        "crosstalk_cluster_append_seconds",
        Unit::Seconds,
        "A cluster node: one message of the log, from its publish to JetStream's acknowledgement"
    );
    describe_histogram!(
        "crosstalk_cluster_fold_wait_seconds",
        Unit::Seconds,
        "A cluster node: from the acknowledgement of a proposal's message to this node's fold reaching it (0 when the fold was there first)"
    );
    describe_histogram!(
        "crosstalk_cluster_commit_wait_seconds",
        Unit::Seconds,
        "A cluster node: a post stored as a new message, from the fold's verdict to this node's store holding it durably"
    );
    describe_gauge!(
        "crosstalk_cluster_appends_waiting",
        "A cluster node: events waiting for their channel's message on its way to the log before theirs can go"
    );
    describe_gauge!(
        "crosstalk_store_healthy",
        "1 when the store answers and its last write succeeded"
    );
}

/// The scrape.
pub async fn serve(cx: web::Data<Ctx>) -> HttpResponse {
    let Some(h) = handle() else {
        return actix_web::ResponseError::error_response(&crate::error::ApiError::new(
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "metrics are off in this process",
        ));
    };
    let relay = &cx.relay;
    metrics::gauge!("crosstalk_channel_actors").set(relay.open_channels() as f64);
    metrics::gauge!("crosstalk_open_waits").set(cx.waits.load(Ordering::Relaxed) as f64);
    metrics::gauge!("crosstalk_open_streams").set(cx.streams.load(Ordering::Relaxed) as f64);
    metrics::gauge!("crosstalk_mcp_sessions").set(cx.mcp_sessions.load(Ordering::Relaxed) as f64);
    metrics::gauge!("crosstalk_mcp_sessions_initializing").set(cx.mcp_initializing.load(Ordering::Relaxed) as f64);
    if let Some(bytes) = relay.store_bytes() {
        metrics::gauge!("crosstalk_store_bytes").set(bytes as f64);
    }
    metrics::gauge!("crosstalk_search_index_lag_seconds").set(relay.search_index_lag().as_secs_f64());
    metrics::gauge!("crosstalk_store_healthy").set(if relay.store_health().is_ok() { 1.0 } else { 0.0 });
    if let Some((allocated, resident)) = heap() {
        metrics::gauge!("crosstalk_heap_allocated_bytes").set(allocated as f64);
        metrics::gauge!("crosstalk_heap_resident_bytes").set(resident as f64);
    }
    h.run_upkeep();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(h.render())
}

/// jemalloc's own count of the heap: what is allocated, and what its pages hold in memory
/// (the difference is freed memory not yet returned). `None` if jemalloc does not answer.
fn heap() -> Option<(usize, usize)> {
    use tikv_jemalloc_ctl::{epoch, stats};
    // The statistics are a snapshot, refreshed by advancing the epoch.
    epoch::advance().ok()?;
    Some((stats::allocated::read().ok()?, stats::resident::read().ok()?))
}
