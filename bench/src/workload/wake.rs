//! Workload 3: wake latency. A client long-polls `…/wait?since_id=<newest>`; another posts;
//! the figure is the time from just before the POST is sent to the waiter having read its
//! answer. It includes the post's durable commit, as a user would see it.

use super::{message_json, Done, Plan, Record};
use crate::client::{first_id, Conn};
use crate::stats::summarize;
use crate::target::Server;
use anyhow::{bail, Context as _};
use std::time::{Duration, Instant};

pub const CHANNEL: &str = "bench-wake";
/// Time given to the waiter's request to reach the server and park before the post is sent.
const PARK: Duration = Duration::from_millis(20);

pub async fn wake(plan: &Plan, server: &Server, rec: &mut Record) -> anyhow::Result<Done> {
    let post_path = format!("/api/channels/{CHANNEL}/messages");
    let mut poster = Conn::connect(server.addr).await?;
    let mut waiter = Some(Conn::connect(server.addr).await?);
    let first = poster.post_json(&post_path, message_json(0)).await?;
    let mut last = first_id(&first.body).context("first wake post names no id")?;
    let deadline = Instant::now() + plan.wake_budget;
    let mut samples = Vec::new();
    // Where the tail comes from: the relay's own histograms over the same rounds.
    let before = crate::scrape::scrape(server.addr).await;
    while samples.len() < plan.wake_rounds && Instant::now() < deadline {
        let mut w = waiter.take().context("waiter connection")?;
        let path = format!("/api/channels/{CHANNEL}/wait?since_id={last}&timeout_s=10");
        let parked = tokio::spawn(async move {
            let r = w.get(&path).await;
            (r, Instant::now(), w)
        });
        tokio::time::sleep(PARK).await;
        let sent = Instant::now();
        let posted = poster.post_json(&post_path, message_json(1)).await?;
        if !posted.status.is_success() {
            bail!("wake post answered {}", posted.status);
        }
        let id = first_id(&posted.body).context("wake post names no id")?;
        let (answer, woke, w) = parked.await?;
        waiter = Some(w);
        let answer = answer?;
        if !answer.status.is_success() || first_id(&answer.body) != Some(id) {
            bail!(
                "waiter answered {} {:?}; expected message {id}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
        }
        if woke < sent {
            bail!("waiter returned before the post was sent");
        }
        samples.push(woke - sent);
        last = id;
    }
    if samples.is_empty() {
        bail!("no wake round finished within {:?}", plan.wake_budget);
    }
    let s = summarize(&samples);
    rec.set("wake_p50_ms", s.p50_ms);
    rec.set("wake_p99_ms", s.p99_ms);
    rec.note(format!("wake: {} rounds, max {:.2} ms", s.count, s.max_ms));
    if let (Some(before), Some(after)) = (before, crate::scrape::scrape(server.addr).await) {
        let bound = |name: &str, labels: &str| crate::scrape::p99_text(&before, &after, name, labels);
        // Over the same rounds: the slowest flush among the posts, and the time from a batch
        // becoming visible to the waiter having it, as the relay itself measured them.
        rec.note(format!(
            "wake, where the time goes (the relay's /metrics over the same rounds, p99 by histogram bucket): \
             store flush {}, visible → woken waiter {}; client-observed p99 {:.2} ms. What the two do not \
             cover is the HTTP round trips and thread scheduling on a 2-core machine shared with the load \
             generator",
            bound("crosstalk_flush_seconds", ""),
            bound("crosstalk_wake_seconds", "reader=\"wait\""),
            s.p99_ms
        ));
    }
    Ok(Done::Ran)
}
