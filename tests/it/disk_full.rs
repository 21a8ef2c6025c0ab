//! A full disk never costs an acknowledged message and never acknowledges a lost one: the
//! relay runs with its file size limited (`ulimit -f`, as a full disk stops writes), posts
//! continue past the limit, then the relay is killed and restarted without the limit. Every
//! post answered 200 is there with its body; every post refused (a JSON 503 with
//! `Retry-After`) is not.

use crate::common;
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
            let r = c
                .post(&url)
                .json(&json!({"sender": "writer", "body": body}))
                .send()
                .await;
            let Ok(r) = r else {
                // The relay may have stopped taking connections: everything after is refused.
                refused.insert(body);
                continue;
            };
            let status = r.status().as_u16();
            let retry_after = r.headers().get("retry-after").is_some();
            let v: serde_json::Value = r.json().await.unwrap_or(json!(null));
            match status {
                200 => {
                    assert_eq!(v["body"], body.as_str());
                    acknowledged.insert(body);
                }
                s if s >= 500 => {
                    assert!(v["error"].is_string(), "a refused write is a JSON error: {v}");
                    if s == 503 {
                        assert!(retry_after, "a 503 says when to retry");
                    }
                    refused.insert(body);
                }
                other => panic!("post {i}: unexpected {other}: {v}"),
            }
        }
        assert!(
            !refused.is_empty(),
            "the limit was never reached: the test tests nothing"
        );
        assert!(!acknowledged.is_empty());
        // While the disk refuses writes, health says so, with the reason.
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
    let stored: BTreeSet<String> = messages(&c, &s, "full", 0)
        .await
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect();
    let lost: Vec<_> = acknowledged.difference(&stored).map(|b| &b[..4]).collect();
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    let ghosts: Vec<_> = stored.intersection(&refused).map(|b| &b[..4]).collect();
    assert!(ghosts.is_empty(), "refused but stored: {ghosts:?}");
}
