//! Workload 13: two relay nodes on a three-server NATS JetStream cluster on this machine
//! (`scripts/nats-cluster`: `sync_interval: always`; the relays with `--nats-replicas 3`),
//! crosstalk only. A post on node A wakes a long-poll waiter and an SSE subscriber on node B:
//! time from just before the POST is sent until each has the message. Then durable POST from
//! the usual connections, half to each node, on one channel; then the largest load again spread
//! over several channels (`--cluster-channels`); then the same split over three
//! and over five relay nodes (more started on the same servers); then on node A alone, the
//! others stopped, from the sweep's largest connection count. Last, with the relays stopped, a
//! bare JetStream publisher on the same three servers (the same client library, a stream of
//! three replicas, one relay event's size a message, 16 and then 256 publishes in flight): what this
//! box's JetStream takes, the reference for the relay's cluster POST; and the servers' CPU a post
//! with 64 posts in flight, one a message and then 16 a message.

use super::post::post_load;
use super::{message_json, Done, Plan, Record};
use crate::client::{first_id, Conn, SseReader};
use crate::stats::summarize;
use crate::target::{Launcher, Server};
use anyhow::{bail, Context as _};
use hyper::Method;
use std::path::Path;
use std::time::{Duration, Instant};

const CHANNEL: &str = "bench-cluster";
/// Time given to the waiter's request to reach node B and park before the post is sent.
const PARK: Duration = Duration::from_millis(20);
/// A cluster POST rate counts as sustained while its p99 stays within this (the target's).
pub const SUSTAINED_P99_MS: f64 = 10.0;

pub async fn cluster(plan: &Plan, launcher: &Launcher, dir: &Path, rec: &mut Record) -> anyhow::Result<Done> {
    let Some(nats) = crosstalk_testkit::nats::server() else {
        return Ok(Done::Skipped(
            "no nats-server: set NATS_SERVER, or run scripts/test once (it installs one)".into(),
        ));
    };
    std::fs::create_dir_all(dir)?;
    // The three servers, as the tests start them (`crosstalk-testkit`).
    let cluster = crosstalk_testkit::nats::Cluster::start(&nats);
    let urls = cluster.urls();
    let args = ["--store", urls.as_str(), "--nats-replicas", "3"];
    let (a, _) = launcher.start(&dir.join("node-a"), &args, "cluster-a").await?;
    let (b, _) = launcher.start(&dir.join("node-b"), &args, "cluster-b").await?;
    let servers = cluster.pids();
    let mut result = measure(plan, &a, &b, &servers, rec).await;
    if result.is_ok() {
        result = own_channels(plan, &[("node A", &a), ("node B", &b)], &servers, rec).await;
    }
    // The same POST load spread over three and then five relay nodes on the same servers.
    let mut nodes = vec![a, b];
    for (count, key) in [(3, "cluster3_post_per_s"), (5, "cluster5_post_per_s")] {
        if result.is_err() {
            break;
        }
        // A joining node folds the whole log first (the steps before wrote hundreds of
        // thousands of posts): the launcher waits for its `/healthz` to say 200, which a node
        // says once it holds what the log held when it connected, so posts never wait behind
        // the catch-up.
        while nodes.len() < count {
            let name = format!("node-{}", nodes.len());
            let (n, _) = launcher
                .start(&dir.join(&name), &args, &format!("cluster-{name}"))
                .await?;
            nodes.push(n);
        }
        let all: Vec<&Server> = nodes.iter().collect();
        if count == 3 {
            let names = ["node A", "node B", "node C"];
            let named: Vec<(&str, &Server)> = names.into_iter().zip(all.iter().copied()).collect();
            result = own_channels(plan, &named, &servers, rec).await;
            if result.is_err() {
                break;
            }
        }
        result = spread_posts(plan, &all, plan.connections).await.map(|(rate, _, s)| {
            rec.set(key, rate);
            rec.note(format!(
                "cluster: durable POST over {count} relay nodes ({} connections each, one channel): {rate:.0}/s, p50 {:.2} ms, p99 {:.2} ms",
                (plan.connections / count).max(1),
                s.p50_ms,
                s.p99_ms
            ));
            Done::Ran
        });
    }
    // Every node is stopped, and a failure to stop is reported with whatever failed before it
    // (a failed step above must not be hidden by the stop that follows it). Node A last: the
    // load once more on it alone, from the sweep's largest connection count. The same servers
    // and the same path for a post (published, followed back, folded, committed), but one node
    // folding each post where the steps before had every node fold it: what the relay's own
    // work on a node costs, beside what each further node's copy adds. Last, so the steps before
    // it run as they did without it.
    let mut failures = Vec::new();
    let a = nodes.remove(0);
    for n in nodes {
        if let Err(e) = n.stop().await {
            failures.push(format!("{e:#}"));
        }
    }
    if result.is_ok() && failures.is_empty() {
        let most = plan.most_connections();
        let budget = Budget::start(&servers, &[("node A", &a)]).await;
        let alone = spread_posts(plan, &[&a], most).await;
        if let Ok((rate, _, _)) = &alone {
            budget
                .end(
                    *rate,
                    "cluster1",
                    &format!("node A alone on the servers from {most} connections"),
                    rec,
                )
                .await;
        }
        if alone.is_ok() {
            if let Err(e) = own_channels(plan, &[("node A", &a)], &servers, rec).await {
                failures.push(format!("{e:#}"));
            }
        }
        result = alone.map(|(rate, _, s)| {
            rec.set("cluster1_post_per_s", rate);
            rec.note(format!(
                "cluster: durable POST on node A alone on the servers, the others stopped ({most} connections, one channel): {rate:.0}/s, p50 {:.2} ms, p99 {:.2} ms",
                s.p50_ms, s.p99_ms
            ));
            Done::Ran
        });
    }
    if let Err(e) = a.stop().await {
        failures.push(format!("{e:#}"));
    }
    if !failures.is_empty() {
        if let Err(before) = &result {
            failures.insert(0, format!("the workload failed: {before:#}"));
        }
        bail!("{}", failures.join("; then "));
    }
    if result.is_ok() {
        bare_publisher(plan, &urls, &servers, rec)
            .await
            .context("the bare JetStream publisher")?;
    }
    drop(cluster);
    result
}

/// Durable POST from `connections` connections split evenly over `nodes`, on one channel: the
/// rate over all of them, each node's, and the posts' latencies.
async fn spread_posts(
    plan: &Plan,
    nodes: &[&Server],
    connections: usize,
) -> anyhow::Result<(f64, Vec<f64>, crate::stats::Summary)> {
    spread_over_channels(plan, nodes, connections, 1).await
}

/// `connections` split evenly over `nodes` and, on each node, over `channels` channels (the
/// bench's channel when one, else `bench-0`… on every node alike): the total rate, each
/// node's, and every post's latency.
async fn spread_over_channels(
    plan: &Plan,
    nodes: &[&Server],
    connections: usize,
    channels: usize,
) -> anyhow::Result<(f64, Vec<f64>, crate::stats::Summary)> {
    let channels = channels.max(1);
    let each = (connections / nodes.len() / channels).max(1);
    let names: Vec<String> = match channels {
        1 => vec![CHANNEL.to_owned()],
        n => (0..n).map(|k| format!("bench-{k}")).collect(),
    };
    let loads = nodes.iter().map(|n| {
        let names = &names;
        async move {
            let results = futures_util::future::join_all(names.iter().map(|c| post_load(plan, n, c, each))).await;
            let (mut rate, mut latencies) = (0.0, Vec::new());
            for r in results {
                let r = r?;
                if r.errors > 0 {
                    bail!(
                        "{} cluster posts failed over {} nodes: {}",
                        r.errors,
                        nodes.len(),
                        r.first_error.as_deref().unwrap_or("-")
                    );
                }
                rate += r.rate();
                latencies.extend(r.latencies);
            }
            anyhow::Ok((rate, latencies))
        }
    });
    let mut rates = Vec::new();
    let mut latencies = Vec::new();
    for r in futures_util::future::join_all(loads).await {
        let (rate, l) = r?;
        rates.push(rate);
        latencies.extend(l);
    }
    Ok((rates.iter().sum(), rates, summarize(&latencies)))
}

/// Nodes whose clients use channels of their own: the run's connection count on each of
/// `nodes` at once, each node's on its own channel (`own-0`, `own-1`, …), with the CPU a post
/// over the step. Recorded as `cluster_own<N>_post_per_s` for `N` nodes, the nodes running
/// being exactly these: does a node more add throughput when clients keep to their own node's
/// channels? Every node still folds every post.
async fn own_channels(
    plan: &Plan,
    nodes: &[(&str, &Server)],
    servers: &[u32],
    rec: &mut Record,
) -> anyhow::Result<Done> {
    let count = nodes.len();
    let budget = Budget::start(servers, nodes).await;
    let loads = nodes
        .iter()
        .enumerate()
        .map(|(i, (_, n))| async move { (i, post_load(plan, n, &format!("own-{i}"), plan.connections).await) });
    let (mut rates, mut latencies) = (vec![0.0; count], Vec::new());
    for (i, r) in futures_util::future::join_all(loads).await {
        let r = r?;
        if r.errors > 0 {
            bail!(
                "{} posts failed on {count} nodes with channels of their own: {}",
                r.errors,
                r.first_error.as_deref().unwrap_or("-")
            );
        }
        rates[i] = r.rate();
        latencies.extend(r.latencies);
    }
    let rate: f64 = rates.iter().sum();
    let step = match count {
        1 => format!(
            "one node alone, {} connections on a channel of its own",
            plan.connections
        ),
        n => format!(
            "{n} nodes, each with {} connections on a channel of its own",
            plan.connections
        ),
    };
    budget.end(rate, &format!("cluster_own{count}"), &step, rec).await;
    let s = summarize(&latencies);
    rec.set(&format!("cluster_own{count}_post_per_s"), rate);
    let each: Vec<String> = nodes
        .iter()
        .zip(&rates)
        .map(|((name, _), r)| format!("{name} {r:.0}/s"))
        .collect();
    rec.note(format!(
        "cluster: durable POST on {step}: {rate:.0}/s ({}), p50 {:.2} ms, p99 {:.2} ms",
        each.join(", "),
        s.p50_ms,
        s.p99_ms
    ));
    Ok(Done::Ran)
}

/// Publishes `size`-byte messages to a stream of three replicas on `urls` from `flight`
/// tasks, each publishing and awaiting its acknowledgement in a loop, for the run's duration:
/// publishes per second, each publish's time to its acknowledgement, and how many publishes
/// were acknowledged in all, the warm-up's included.
async fn bare_run(
    js: &async_nats::jetstream::Context,
    plan: &Plan,
    size: usize,
    flight: usize,
) -> anyhow::Result<(f64, crate::stats::Summary, usize)> {
    let payload = bytes::Bytes::from(vec![b'x'; size]);
    let acknowledged = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let warm = start + plan.warmup;
    let end = warm + plan.duration;
    let mut tasks = Vec::new();
    for t in 0..flight {
        let (js, payload, acknowledged) = (js.clone(), payload.clone(), acknowledged.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let ack = js.publish(format!("benchbare.{}", t % 16), payload.clone()).await?;
                ack.await?;
                acknowledged.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if sent >= warm {
                    latencies.push(sent.elapsed());
                }
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let rate = latencies.len() as f64 / plan.duration.as_secs_f64();
    Ok((
        rate,
        summarize(&latencies),
        acknowledged.load(std::sync::atomic::Ordering::Relaxed),
    ))
}

/// Events in flight in [`bare_server_cpu`]'s two runs.
const BARE_EVENTS_IN_FLIGHT: usize = 64;
/// Events a message in its second run.
const BARE_EVENTS_A_MESSAGE: usize = 16;

/// What the three servers spend a post when posts go one a message, and when they go
/// [`BARE_EVENTS_A_MESSAGE`] a message, with [`BARE_EVENTS_IN_FLIGHT`] posts in flight either
/// way (64 or 4 publishes): whether fuller messages, several channels' events in one, would
/// cut the servers' cost, beside what the servers already save by handling concurrent
/// publishes together (docs/scaling.md, "What a server's round costs").
async fn bare_server_cpu(
    js: &async_nats::jetstream::Context,
    plan: &Plan,
    size: usize,
    servers: &[u32],
    rec: &mut Record,
) -> anyhow::Result<()> {
    let watch = crate::cpu::Watch::new().group("servers", servers.to_vec());
    let mut seen = Vec::new();
    for events in [1, BARE_EVENTS_A_MESSAGE] {
        let before = watch.sample();
        let (rate, _, acknowledged) = bare_run(js, plan, size * events, BARE_EVENTS_IN_FLIGHT / events).await?;
        let after = watch.sample();
        let Some(usage) = watch.usage(&before, &after) else {
            rec.note("cluster: the bare publisher's CPU a post: not taken (a server's /proc could not be read)");
            return Ok(());
        };
        let posts = (acknowledged * events).max(1) as f64;
        let us = usage.cores("servers").unwrap_or(0.0) * usage.wall / posts * 1e6;
        rec.set(&format!("cluster_bare_{events}ev_cpu_us"), us);
        rec.set(&format!("cluster_bare_{events}ev_posts_per_s"), rate * events as f64);
        seen.push(format!(
            "{events} a message: {us:.1} µs ({:.0} posts/s)",
            rate * events as f64
        ));
    }
    rec.note(format!(
        "cluster: the three servers' CPU a post from the bare publisher, {BARE_EVENTS_IN_FLIGHT} events of {size} B in flight either way: {}",
        seen.join("; ")
    ));
    Ok(())
}

/// Waits (bounded) until a publish to `subject` is acknowledged. A stream just made answers on
/// the server it was made on at once, but the other servers learn its subjects a moment later:
/// on a loaded machine (the test command's smoke, beside other suites) the first publishes
/// through another server found no stream ("no stream found for given subject").
async fn stream_takes_publishes(js: &async_nats::jetstream::Context, subject: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let acked = match js
            .publish(subject.to_owned(), bytes::Bytes::from_static(b"probe"))
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(anyhow::Error::from),
            Err(e) => Err(e.into()),
        };
        match acked {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e.context("the new stream never took a publish")),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

async fn bare_publisher(plan: &Plan, urls: &str, pids: &[u32], rec: &mut Record) -> anyhow::Result<()> {
    let servers = urls
        .split(',')
        .map(|u| u.parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()?;
    let client = async_nats::connect(servers).await?;
    let js = async_nats::jetstream::new(client);
    // One relay event as the log carries it: the stream's first message holds one event (the
    // first post, made alone). A relay message may hold several events; the bare publisher
    // publishes one event's worth a message.
    let mut relay = js.get_stream("CROSSTALK").await?;
    let first = relay.info().await?.state.first_sequence;
    let size = relay.get_raw_message(first).await?.payload.len().max(1);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "BENCHBARE".into(),
        subjects: vec!["benchbare.>".into()],
        num_replicas: 3,
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    })
    .await?;
    stream_takes_publishes(&js, "benchbare.probe").await?;
    let mut best: Option<(usize, f64, crate::stats::Summary)> = None;
    let mut seen = Vec::new();
    for flight in [16, 256] {
        let (rate, s, _) = bare_run(&js, plan, size, flight).await?;
        seen.push(format!("{flight} in flight {rate:.0}/s (p99 {:.2} ms)", s.p99_ms));
        if best.as_ref().is_none_or(|b| rate > b.1) {
            best = Some((flight, rate, s));
        }
    }
    let (flight, rate, s) = best.context("no run")?;
    bare_server_cpu(&js, plan, size, pids, rec).await?;
    rec.set("cluster_bare_per_s", rate);
    rec.set("cluster_bare_p99_ms", s.p99_ms);
    if let Some(relay) = rec.values.get("cluster_cap_per_s").copied() {
        rec.set("cluster_cap_share_pct", 100.0 * relay / rate);
    }
    rec.note(format!(
        "cluster: a bare JetStream publisher on the same three servers with the relays stopped (R3, {size} B payloads, one relay event as its log carries it): {}; best {rate:.0}/s with {flight} in flight, p50 {:.2} ms, p99 {:.2} ms",
        seen.join(", "),
        s.p50_ms,
        s.p99_ms
    ));
    Ok(())
}

async fn measure(plan: &Plan, a: &Server, b: &Server, servers: &[u32], rec: &mut Record) -> anyhow::Result<Done> {
    let post_path = format!("/api/channels/{CHANNEL}/messages");
    let mut poster = Conn::connect(a.addr).await?;
    let first = poster.post_json(&post_path, message_json(0)).await?;
    let mut last = first_id(&first.body).context("first post names no id")?;
    // An SSE subscriber on B, past `ready`.
    let mut sse_conn = Conn::connect(b.addr).await?;
    let res = sse_conn
        .send(
            Method::GET,
            &format!("/api/channels/{CHANNEL}/stream?since_id={last}"),
            &[],
            Default::default(),
        )
        .await?;
    let mut sse = SseReader::new(res)?;
    loop {
        match sse.next().await? {
            Some(ev) if ev.event == "ready" => break,
            Some(_) => {}
            None => bail!("node B's stream ended before `ready`"),
        }
    }
    let mut waiter = Some(Conn::connect(b.addr).await?);
    let (mut long_poll, mut streamed) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + plan.wake_budget;
    while long_poll.len() < plan.wake_rounds && Instant::now() < deadline {
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
            bail!("post on node A answered {}", posted.status);
        }
        let id = first_id(&posted.body).context("post names no id")?;
        // The stream's message event for it.
        let streamed_at = loop {
            match tokio::time::timeout(Duration::from_secs(10), sse.next()).await {
                Ok(Ok(Some(ev))) if ev.event == "message" => {
                    if first_id(ev.data.as_bytes()) == Some(id) {
                        break Instant::now();
                    }
                }
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => bail!("node B's stream ended"),
                Ok(Err(e)) => return Err(e),
                Err(_) => bail!("node B's stream did not deliver message {id} within 10 s"),
            }
        };
        let (answer, woke, w) = parked.await?;
        waiter = Some(w);
        let answer = answer?;
        if !answer.status.is_success() || first_id(&answer.body) != Some(id) {
            bail!(
                "the waiter on node B answered {} {:?}; expected message {id}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            );
        }
        long_poll.push(woke.saturating_duration_since(sent));
        streamed.push(streamed_at.saturating_duration_since(sent));
        last = id;
    }
    if long_poll.is_empty() {
        bail!("no cluster wake round finished within {:?}", plan.wake_budget);
    }
    let (lp, st) = (summarize(&long_poll), summarize(&streamed));
    rec.set("cluster_wake_p50_ms", lp.p50_ms);
    rec.set("cluster_wake_p99_ms", lp.p99_ms);
    rec.set("cluster_sse_p99_ms", st.p99_ms);

    // Durable POST, half the connections to each node: from the usual connections, then
    // from each of the sweep's, as workload 1 does on one node.
    let mut runs = Vec::new();
    let most = plan.most_connections();
    let mut budgeted = false;
    // The first run is the plan's own connections; the sweep may hold the same count again,
    // and the row's figures (`cluster_post_per_s`) and node A's breakdown are the first run's.
    // What a post costs each process is taken over the first run from the most connections,
    // where the box is busiest.
    for (run, connections) in plan.post_connections().enumerate() {
        let first = run == 0;
        let before = match first {
            true => crate::scrape::scrape(a.addr).await,
            false => None,
        };
        let budget = match !budgeted && connections == most {
            true => Some(Budget::start(servers, &[("node A", a), ("node B", b)]).await),
            false => None,
        };
        let (rate, each, all) = spread_posts(plan, &[a, b], connections).await?;
        if let Some(budget) = budget {
            budgeted = true;
            let step = format!("the two-node step from {connections} connections");
            budget.end(rate, "cluster", &step, rec).await;
        }
        if let (Some(before), Some(after)) = (before, crate::scrape::scrape(a.addr).await) {
            where_the_time_goes(&before, &after, connections, &all, rec)?;
        }
        rec.set(&format!("cluster_post_{connections}c_per_s"), rate);
        rec.set(&format!("cluster_post_{connections}c_p99_ms"), all.p99_ms);
        if first {
            rec.set("cluster_post_per_s", rate);
            rec.set("cluster_post_p99_ms", all.p99_ms);
        }
        rec.note(format!(
            "cluster: durable POST over both nodes from {connections} connections: {rate:.0}/s (A {:.0}/s, B {:.0}/s), p50 {:.2} ms, p99 {:.2} ms",
            each[0], each[1], all.p50_ms, all.p99_ms
        ));
        runs.push((connections, rate, all.p99_ms));
    }
    // The largest of those loads again, spread over several channels: each node then has an
    // append of every channel on its way at once, which the servers replicate and write
    // together.
    for &channels in &plan.cluster_channels {
        // At least one connection for each channel on each node.
        let channels = channels.min((most / 2).max(1));
        let most = (most / 2 / channels).max(1) * 2 * channels;
        // What a post costs each process here, and how many posts a message of the log
        // carries when each channel's posts gather apart (docs/scaling.md).
        let budget = Budget::start(servers, &[("node A", a), ("node B", b)]).await;
        let (rate, each, all) = spread_over_channels(plan, &[a, b], most, channels).await?;
        let step = format!("the two-node step from {most} connections over {channels} channels");
        budget.end(rate, &format!("cluster_{channels}ch"), &step, rec).await;
        rec.set(&format!("cluster_post_{channels}ch_per_s"), rate);
        rec.set(&format!("cluster_post_{channels}ch_p99_ms"), all.p99_ms);
        rec.note(format!(
            "cluster: durable POST over both nodes from {most} connections spread over {channels} channels: {rate:.0}/s (A {:.0}/s, B {:.0}/s), p50 {:.2} ms, p99 {:.2} ms",
            each[0], each[1], all.p50_ms, all.p99_ms
        ));
    }
    if let Some((connections, rate, p99)) = super::post::sustained(&runs, SUSTAINED_P99_MS) {
        rec.set("cluster_cap_per_s", rate);
        rec.set("cluster_cap_p99_ms", p99);
        rec.set("cluster_cap_conns", connections as f64);
    }
    rec.note(format!(
        "cluster: wake on node B from a post on node A, {} rounds: long-poll p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; \
         SSE p50 {:.2} ms, p99 {:.2} ms",
        lp.count, lp.p50_ms, lp.p99_ms, lp.max_ms, st.p50_ms, st.p99_ms,
    ));
    Ok(Done::Ran)
}

/// Where a post's time went on node A over one step, from its `/metrics` before and after it:
/// the four steps a post waits for on a cluster, as the node measured them (mean, and the p99's
/// histogram bucket), beside the client's own figures.
fn where_the_time_goes(
    before: &str,
    after: &str,
    connections: usize,
    client: &crate::stats::Summary,
    rec: &mut Record,
) -> anyhow::Result<()> {
    use crate::scrape::{mean_between, p99_text};
    let step = |name: &str| match mean_between(before, after, name) {
        Some((mean, _)) => format!("mean {:.2} ms, p99 {}", mean * 1e3, p99_text(before, after, name, "")),
        None => "not recorded".to_owned(),
    };
    // The step posted to node A, so its append metrics must have moved: a node that stopped
    // recording them (or renamed them) fails the run, the smoke one included.
    let Some((per_message, messages)) = mean_between(before, after, "crosstalk_cluster_append_events") else {
        anyhow::bail!("node A's /metrics recorded no append over the {connections}-connection step");
    };
    rec.set("cluster_events_per_message", per_message);
    rec.note(format!(
        "cluster, where a post's time goes (node A's /metrics over the {connections}-connection step): waiting for the \
         node's message already on its way {}; its message's publish → JetStream's acknowledgement {} ({messages:.0} messages of {per_message:.1} events on average); \
         acknowledgement → the node's fold reaching it {}; fold → durable in the node's store {}; the client saw p50 \
         {:.2} ms, p99 {:.2} ms. The rest is HTTP and the hops between the node's threads",
        step("crosstalk_cluster_append_gather_seconds"),
        step("crosstalk_cluster_append_seconds"),
        step("crosstalk_cluster_fold_wait_seconds"),
        step("crosstalk_cluster_commit_wait_seconds"),
        client.p50_ms,
        client.p99_ms
    ));
    Ok(())
}

/// What a post costs each process on the shared cores over one step: the relay nodes that take
/// its posts, the three NATS servers and this load generator, from their CPU time in /proc
/// around the step, and how many posts a message of the log carried, from the nodes' /metrics.
/// The CPU is read over the whole step, its warm-up included, and divided by the rate of its
/// measured seconds: the load is the same closed loop throughout.
struct Budget<'a> {
    nodes: Vec<(&'a str, &'a Server)>,
    watch: crate::cpu::Watch,
    before: crate::cpu::Sample,
    metrics: Vec<Option<String>>,
}

impl<'a> Budget<'a> {
    async fn start(servers: &[u32], nodes: &[(&'a str, &'a Server)]) -> Budget<'a> {
        let mut watch = crate::cpu::Watch::new().group("servers", servers.to_vec());
        for (name, node) in nodes {
            watch = watch.group(name, node.pid().into_iter().collect());
        }
        watch = watch.group("load generator", vec![std::process::id()]);
        let mut metrics = Vec::new();
        for (_, node) in nodes {
            metrics.push(crate::scrape::scrape(node.addr).await);
        }
        let before = watch.sample();
        Budget {
            nodes: nodes.to_vec(),
            watch,
            before,
            metrics,
        }
    }

    /// Records the step's figures under `prefix` (`<prefix>_cpu_servers_us`, …) and a note;
    /// says in the note why not when a process or the metrics could not be read.
    async fn end(self, rate: f64, prefix: &str, step: &str, rec: &mut Record) {
        let after = self.watch.sample();
        let usage = self.watch.usage(&self.before, &after);
        let (mut events, mut messages) = (0.0, 0.0);
        for ((_, node), before) in self.nodes.iter().zip(&self.metrics) {
            let after = crate::scrape::scrape(node.addr).await;
            if let (Some(before), Some(after)) = (before, after) {
                if let Some((mean, n)) = crate::scrape::mean_between(before, &after, "crosstalk_cluster_append_events")
                {
                    events += mean * n;
                    messages += n;
                }
            }
        }
        let (Some(usage), true) = (usage, rate > 0.0) else {
            rec.note(format!(
                "cluster, CPU a post over {step}: not taken (a process's pid or /proc could not be read, or nothing was posted)"
            ));
            return;
        };
        let us = |cores: f64| cores / rate * 1e6;
        let servers = usage.cores("servers").unwrap_or(0.0);
        let mut nodes = 0.0;
        let mut each = Vec::new();
        for (name, _) in &self.nodes {
            let cores = usage.cores(name).unwrap_or(0.0);
            nodes += cores;
            each.push(format!("{name} {:.0} µs ({cores:.2} cores)", us(cores)));
        }
        let load = usage.cores("load generator").unwrap_or(0.0);
        rec.set(&format!("{prefix}_cpu_servers_us"), us(servers));
        rec.set(&format!("{prefix}_cpu_nodes_us"), us(nodes));
        rec.set(&format!("{prefix}_cpu_load_us"), us(load));
        let idle = usage.idle_share.map(|s| {
            rec.set(&format!("{prefix}_cpu_idle_pct"), 100.0 * s);
            format!("; the box's cores {:.0}% idle", 100.0 * s)
        });
        let per_message = (messages > 0.0).then(|| {
            let posts = events / messages;
            let server_ms = us(servers) * posts / 1e3;
            rec.set(&format!("{prefix}_posts_per_message"), posts);
            rec.set(&format!("{prefix}_cpu_server_ms_per_message"), server_ms);
            format!("; {posts:.1} posts a log message, so the servers spent {server_ms:.2} ms of CPU a message")
        });
        rec.note(format!(
            "cluster, CPU a post over {step} ({rate:.0}/s; each process's user + system time from /proc over the step): \
             the three NATS servers {:.0} µs ({servers:.2} cores), {}, the load generator {:.0} µs ({load:.2} cores){}{}",
            us(servers),
            each.join(", "),
            us(load),
            idle.unwrap_or_default(),
            per_message.unwrap_or_default(),
        ));
    }
}
