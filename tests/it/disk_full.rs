//! A full disk never costs an acknowledged message and never acknowledges a lost one: the
//! relay runs with its file size limited (`ulimit -f`, as a full disk stops writes), posts
//! continue past the limit, then the relay is killed and restarted without the limit. Every
//! post answered 200 is there with its body; every post refused (a JSON 503 with
//! `Retry-After`) is not.
//!
//! Then the same on a real full filesystem (a tmpfs of a few MiB; mounting it needs root, as
//! the test command has in CI): a relay process fills it, space is given back, and writes
//! resume by themselves within seconds, with nothing lost, nothing refused turning up, and a
//! few log lines rather than one per refused write.

use crate::common;
use common::tmpfs::{fill, Tmpfs};
use common::*;
use serde_json::json;
use std::collections::BTreeSet;

/// The file size limit: small enough that a few hundred 2 KB posts reach it.
const LIMIT: u64 = 2 * 1024 * 1024;
const POSTS: usize = 400;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_never_acknowledges_a_lost_write() {
    let tmp = tempfile::tempdir().unwrap();
    let c = client();
    let mut acknowledged = BTreeSet::new();
    let mut refused = BTreeSet::new();
    {
        let mut s = Server::start_file_limited(tmp.path(), LIMIT, &[]);
        let url = s.url("/api/channels/full/messages");
        for i in 0..POSTS {
            let body = format!("{i:04} {}", "x".repeat(2048));
            post_and_sort(&c, &url, body, &mut acknowledged, &mut refused).await;
        }
        assert!(
            !refused.is_empty(),
            "the limit was never reached: the test tests nothing"
        );
        assert!(!acknowledged.is_empty());
        // While the disk refuses writes, health says so, with the reason: right after a
        // refused post (the relay tries its store again a second later, and a store that
        // takes writes again is healthy again).
        let mut i = POSTS;
        while post_and_sort(
            &c,
            &url,
            format!("{i:04} {}", "x".repeat(2048)),
            &mut acknowledged,
            &mut refused,
        )
        .await
        {
            i += 1;
            assert!(i < 2 * POSTS, "no post refused any more");
        }
        let (status, health) = get_json(&c, &s.url("/healthz")).await;
        assert_eq!(
            (status, health["status"].as_str()),
            (503, Some("unhealthy")),
            "{health}"
        );
        assert!(health["reason"].as_str().is_some_and(|r| !r.is_empty()), "{health}");
        s.kill();
    }
    let s = Server::start_in(tmp.path(), &[]);
    let stored: BTreeSet<String> = bodies(&c, &s).await;
    let lost: Vec<_> = acknowledged.difference(&stored).map(|b| &b[..4]).collect();
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    let ghosts: Vec<_> = stored.intersection(&refused).map(|b| &b[..4]).collect();
    assert!(ghosts.is_empty(), "refused but stored: {ghosts:?}");
}

/// The bodies of channel `full` as the relay serves them.
async fn bodies(c: &reqwest::Client, s: &Server) -> BTreeSet<String> {
    messages(c, s, "full", 0)
        .await
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect()
}

/// Posts `body` and files it under acknowledged (200, with the body) or refused (a JSON 5xx;
/// a 503 says when to retry; or no answer at all).
async fn post_and_sort(
    c: &reqwest::Client,
    url: &str,
    body: String,
    acknowledged: &mut BTreeSet<String>,
    refused: &mut BTreeSet<String>,
) -> bool {
    let r = c
        .post(url)
        .json(&json!({"sender": "writer", "body": body}))
        .send()
        .await;
    let Ok(r) = r else {
        // The relay may have stopped taking connections: everything after is refused.
        refused.insert(body);
        return false;
    };
    let status = r.status().as_u16();
    let retry_after = r.headers().get("retry-after").is_some();
    let v: serde_json::Value = r.json().await.unwrap_or(json!(null));
    match status {
        200 => {
            assert_eq!(v["body"], body.as_str());
            acknowledged.insert(body);
            true
        }
        s if s >= 500 => {
            assert!(v["error"].is_string(), "a refused write is a JSON error: {v}");
            if s == 503 {
                assert!(retry_after, "a 503 says when to retry");
            }
            refused.insert(body);
            false
        }
        other => panic!("post {}: unexpected {other}: {v}", &body[..4]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_filesystem_heals_by_itself_and_logs_little() {
    let Some(fs) = Tmpfs::mount("16m") else { return };
    let dir = fs.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let c = client();
    let mut acknowledged = BTreeSet::new();
    let mut refused = BTreeSet::new();
    let mut s = Server::start_logging_in(&dir, &[]);
    let url = s.url("/api/channels/full/messages");
    assert!(post_and_sort(&c, &url, "before".into(), &mut acknowledged, &mut refused).await);

    let filler = fs.path().join("filler");
    fill(&filler);
    let mut i = 0;
    while refused.len() < 200 && i < 5000 {
        let body = format!("{i:04} {}", "x".repeat(1024));
        post_and_sort(&c, &url, body, &mut acknowledged, &mut refused).await;
        i += 1;
    }
    assert!(refused.len() >= 200, "the full filesystem never refused a write");
    let (status, health) = get_json(&c, &s.url("/healthz")).await;
    assert_eq!(
        (status, health["status"].as_str()),
        (503, Some("unhealthy")),
        "{health}"
    );
    // Still full a few seconds on, after the relay has tried its store again: still refused.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert!(!post_and_sort(&c, &url, "still full".into(), &mut acknowledged, &mut refused).await);

    std::fs::remove_file(&filler).unwrap();
    let freed = std::time::Instant::now();
    while !post_and_sort(&c, &url, "after".into(), &mut acknowledged, &mut refused).await {
        assert!(
            freed.elapsed() < std::time::Duration::from_secs(20),
            "writes did not resume 20 s after space returned; the relay says:\n{}",
            s.stderr()
        );
        refused.remove("after");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "writes resumed {:.1} s after space returned",
        freed.elapsed().as_secs_f64()
    );
    let (status, health) = get_json(&c, &s.url("/healthz")).await;
    assert_eq!(status, 200, "{health}");
    let served: BTreeSet<String> = bodies(&c, &s).await;
    assert_eq!(served, acknowledged, "the relay serves exactly what it acknowledged");

    // Hundreds of refused writes, a few lines: each place that logs a repeated error does so
    // at most once a second, saying how many it left out.
    let log = s.stderr();
    let loud: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("WARN"))
        .collect();
    eprintln!(
        "{} warning and error lines for {} refused writes",
        loud.len(),
        refused.len()
    );
    let mut per_second = std::collections::BTreeMap::new();
    for line in &loud {
        // `2026-12-02T08:04:45.812835Z ERROR target: message field=…`: the second and the message.
        let second = line.get(..19).unwrap_or(line);
        let message = line
            .split(": ")
            .nth(1)
            .unwrap_or(line)
            .split(" error=")
            .next()
            .unwrap_or(line);
        *per_second.entry((second, message)).or_insert(0) += 1;
    }
    let repeated: Vec<_> = per_second.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "lines repeated within a second: {repeated:?}\n{log}"
    );
    assert!(
        loud.len() < refused.len() / 2,
        "{} lines for {} refused writes:\n{log}",
        loud.len(),
        refused.len()
    );
    assert!(log.contains("left_out"), "the lines say how many were left out:\n{log}");

    s.kill();
    let s = Server::start_in(&dir, &[]);
    let stored: BTreeSet<String> = bodies(&c, &s).await;
    assert_eq!(stored, acknowledged, "a restart reads exactly what was acknowledged");
    assert!(stored.is_disjoint(&refused), "a refused write turned up");
}
