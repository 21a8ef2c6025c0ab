//! `GET /metrics`: Prometheus text behind the token, counting what the relay did by face,
//! and idle channel actors leaving memory (`--idle-after`) as its gauge shows.

use crate::common;

use common::mcp::Mcp;
use common::{client, request, sample, Server};
use serde_json::json;
use std::time::{Duration, Instant};

const TOKEN: &str = "m3trics";

async fn scrape(s: &Server) -> String {
    let r = client().get(s.url("/metrics")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    r.text().await.unwrap()
}

#[tokio::test]
async fn metrics_count_what_the_relay_did_and_need_the_token() {
    let s = Server::process(&["--token", TOKEN]);
    let http = client();
    let anonymous = http.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401, "metrics must need the token");

    for i in 0..3 {
        let r = http
            .post(s.url("/api/channels/m/messages"))
            .bearer_auth(TOKEN)
            .json(&json!({"sender": "a", "body": format!("hello {i}")}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let refused = http
        .post(s.url("/api/channels/m/messages"))
        .bearer_auth(TOKEN)
        .json(&json!({"sender": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    // A long-poll woken by a post: a wake latency sample.
    let waiter = {
        let http = http.clone();
        let url = s.url("/api/channels/w/wait?since_id=0&timeout=10");
        tokio::spawn(async move { http.get(url).bearer_auth(TOKEN).send().await.unwrap().status() })
    };
    // Parked before the post: a wait that arrives after it answers at once, with no sample.
    common::until_waits(&common::client_with_token(TOKEN), &s.url(""), 1).await;
    http.post(s.url("/api/channels/w/messages"))
        .bearer_auth(TOKEN)
        .json(&json!({"sender": "b", "body": "wake"}))
        .send()
        .await
        .unwrap();
    assert_eq!(waiter.await.unwrap(), 200);

    let mcp = Mcp::connect_with(&s, common::client_with_token(TOKEN)).await;
    mcp.call_ok(
        "post_message",
        json!({"channel": "m", "sender": "c", "body": "over mcp"}),
    )
    .await;
    // The cross-claude faces count under their own names.
    let cc = Mcp::connect_at(&s, "/cc/mcp", common::client_with_token(TOKEN)).await;
    cc.call_ok(
        "send_message",
        json!({"channel": "m", "sender": "d", "content": "over cc mcp"}),
    )
    .await;
    let r = http
        .post(s.url("/cc/api/messages"))
        .bearer_auth(TOKEN)
        .json(&json!({"channel": "m", "sender": "e", "content": "over cc rest"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let text = scrape(&s).await;
    let ok = |face: &str, op: &str| {
        sample(
            &text,
            &format!("crosstalk_operations_total{{face=\"{face}\",operation=\"{op}\",outcome=\"ok\"}}"),
        )
    };
    assert_eq!(ok("rest", "post_message"), Some(4.0), "{text}");
    assert_eq!(ok("mcp", "post_message"), Some(1.0), "{text}");
    assert_eq!(ok("cc-mcp", "send_message"), Some(1.0), "{text}");
    assert_eq!(ok("cc-rest", "send_message"), Some(1.0), "{text}");
    assert_eq!(ok("rest", "wait_for_message"), Some(1.0), "{text}");
    assert_eq!(
        sample(
            &text,
            "crosstalk_operations_total{face=\"rest\",operation=\"post_message\",outcome=\"invalid_input\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "crosstalk_rejected_total{reason=\"unauthorized\"}"),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(&text, "crosstalk_commit_round_writes_count").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    assert!(
        sample(&text, "crosstalk_flush_seconds_count").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "crosstalk_wake_seconds_count{reader=\"wait\"}"),
        Some(1.0),
        "{text}"
    );
    assert!(
        sample(&text, "crosstalk_channel_actors").unwrap_or(0.0) >= 2.0,
        "{text}"
    );
    assert!(sample(&text, "crosstalk_store_bytes").unwrap_or(0.0) > 0.0, "{text}");
    assert_eq!(sample(&text, "crosstalk_store_healthy"), Some(1.0), "{text}");
    assert!(sample(&text, "crosstalk_search_index_lag_seconds").is_some(), "{text}");
    // The allocator's own account: something is allocated, and its pages hold at least that.
    let allocated = sample(&text, "crosstalk_heap_allocated_bytes").unwrap_or(0.0);
    let resident = sample(&text, "crosstalk_heap_resident_bytes").unwrap_or(0.0);
    assert!(allocated > 1_000_000.0 && resident >= allocated, "{text}");
    assert!(text.contains("# HELP crosstalk_wake_seconds"), "{text}");
}

/// Threads of the relay process named `name` (Linux names them in `/proc`).
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc lists the relay's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == name)
        .count()
}

/// The allocator runs background threads that give freed pages back to the system, as
/// built in; `MALLOC_CONF` overrides the built-in settings.
#[tokio::test]
async fn the_allocator_purges_in_background_threads_unless_malloc_conf_says_otherwise() {
    let http = client();
    for (env, expect_threads) in [(None, true), (Some("background_thread:false"), false)] {
        let s = match env {
            None => Server::process(&[]),
            Some(conf) => Server::start_with_env(&[], &[("MALLOC_CONF", conf)]),
        };
        // Some traffic, so every arena the relay uses is in play.
        for i in 0..20 {
            let r = http
                .post(s.url(&format!("/api/channels/bg{i}/messages")))
                .json(&json!({"sender": "a", "body": "x"}))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
        let threads = threads_named(s.pid(), "jemalloc_bg_thd");
        assert_eq!(
            threads > 0,
            expect_threads,
            "MALLOC_CONF={env:?}: {threads} background threads"
        );
    }
}

#[tokio::test]
async fn idle_channel_actors_leave_memory_and_come_back_with_their_messages() {
    let s = Server::process(&["--token", TOKEN, "--idle-after-secs", "1", "--presence-ttl-secs", "1"]);
    let http = common::client_with_token(TOKEN);
    let t = Instant::now();
    for i in 0..20 {
        common::post(&http, &s, &format!("c{i}"), common::msg("a", &format!("body {i}"))).await;
    }
    let open = sample(&scrape(&s).await, "crosstalk_channel_actors").unwrap();
    // All 20 are open if posting them took less than the quiet period; on a loaded machine
    // (a fresh clone's first run) the first may have closed already, never the last.
    let least = if t.elapsed() < Duration::from_secs(1) {
        20.0
    } else {
        1.0
    };
    assert!(open >= least, "{open} channel actors open, expected at least {least}");
    actors_fall_to(&s, 0.0).await;
    let got = common::messages(&http, &s, "c7", 0).await;
    assert_eq!(got[0]["body"], "body 7", "{got:?}");
}

/// Waits (bounded) until at most `n` channel actors are open, by the relay's own gauge.
async fn actors_fall_to(s: &Server, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let open = sample(&scrape(s).await, "crosstalk_channel_actors").unwrap();
        if open <= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{open} channel actors still open (expected {n})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `--max-open-channels` reaches the relay: beyond it, channels unused for a second leave
/// memory long before the quiet period, down to seven eighths of the bound.
#[tokio::test]
async fn beyond_max_open_channels_unused_channels_leave_early() {
    let s = Server::process(&["--token", TOKEN, "--idle-after-secs", "600", "--max-open-channels", "8"]);
    let http = common::client_with_token(TOKEN);
    for i in 0..20 {
        common::post(&http, &s, &format!("c{i}"), common::msg("a", &format!("in c{i}"))).await;
    }
    assert!(sample(&scrape(&s).await, "crosstalk_channel_actors").unwrap() >= 20.0);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Opening one more channel beyond the bound starts the early close.
    common::post(&http, &s, "one-more", common::msg("a", "in one-more")).await;
    actors_fall_to(&s, 7.0).await;
    let got = common::messages(&http, &s, "c3", 0).await;
    assert_eq!(got[0]["body"], "in c3", "{got:?}");
}

/// A post by a registered sender is one store write: joining the channel by posting writes
/// its read cursor once, not again with every post (it did: a cursor at 0 was written anew
/// each time, doubling the writes of every registered poster, and on a cluster adding a
/// key-value write per post). Counted by the store thread's own histogram.
#[tokio::test]
async fn a_registered_senders_posts_cost_one_write_each() {
    let s = Server::process(&["--token", TOKEN]);
    let http = common::client_with_token(TOKEN);
    let (status, registered) = request(
        &http,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "alice"})),
        None,
    )
    .await;
    assert_eq!(status, 201, "{registered}");
    let session = registered["session"].as_str().unwrap();
    let writes = |text: &str| sample(text, "crosstalk_commit_round_writes_sum").unwrap_or(0.0);
    let before = writes(&scrape(&s).await);
    const POSTS: u32 = 100;
    let url = s.url("/api/channels/w/messages");
    for i in 0..POSTS {
        let body = json!({"sender": "alice", "body": format!("m{i}")});
        let (status, answer) = request(&http, "POST", &url, Some(body), Some(session)).await;
        assert_eq!(status, 200, "{answer}");
    }
    let after = writes(&scrape(&s).await);
    let per_post = (after - before) / f64::from(POSTS);
    // One write a post, plus the join's once (and a little room for other bookkeeping); the
    // defect made it two.
    assert!(per_post < 1.5, "{per_post} store writes a post ({before} -> {after})");
    assert!(
        per_post >= 1.0,
        "{per_post} store writes a post: the histogram does not count them"
    );
}
