//! The authorization matrix: every route the relay documents (its own `/openapi.json`, so a
//! route added later is covered without touching this test) × {no token, a wrong token, the
//! shared token, a participant token}, plus the identity rules for a participant acting as
//! itself or as someone else, over REST, SSE and MCP.

use crate::common;
use common::mcp::Mcp;
use common::*;
use serde_json::{json, Value};

fn with_token(token: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        headers.insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    builder().default_headers(headers).build().unwrap()
}

/// A request for a documented route: path parameters filled in, a JSON body for POST.
fn request(c: &reqwest::Client, base: &str, method: &str, path: &str) -> reqwest::RequestBuilder {
    let path = path
        .replace("{channel}", "matrix")
        .replace("{message_id}", "1")
        .replace("{key}", "spec");
    // A wait answers at once, so the matrix takes seconds, not minutes.
    let query = if path.ends_with("/wait") { "?timeout_s=0" } else { "" };
    let url = format!("{base}{path}{query}");
    match method {
        "get" => c.get(url),
        "delete" => c.delete(url),
        _ => c.post(url).json(&json!({})),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_by_every_kind_of_token() {
    // Every route is tried with no token and a wrong one, faster than the failed-authentication
    // limit allows (its own test is in security.rs): unlimited here, so each answer is the 401.
    let s = Server::start_with(&[
        "--token",
        "shared-9x",
        "--participants",
        "alice:tok-alice,bob:tok-bob",
        "--auth-failure-rate",
        "0",
    ]);
    let (_, doc) = get_json(&with_token(Some("shared-9x")), &s.url("/openapi.json")).await;
    let paths = doc["paths"].as_object().expect("paths").clone();
    let mut checked = 0;
    for (path, item) in &paths {
        for method in item.as_object().unwrap().keys() {
            for (who, token) in [
                ("none", None),
                ("wrong", Some("nope")),
                ("shared", Some("shared-9x")),
                ("participant", Some("tok-alice")),
            ] {
                let mut req = request(&with_token(token), &s.base, method, path);
                if path.ends_with("/stream") {
                    req = req.timeout(std::time::Duration::from_secs(5));
                }
                let status = match req.send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(e) => panic!("{method} {path} as {who}: {e}"),
                };
                let open = path == "/healthz";
                match who {
                    "none" | "wrong" if !open => {
                        assert_eq!(status, 401, "{method} {path} without a valid token")
                    }
                    _ => assert_ne!(status, 401, "{method} {path} as {who}"),
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 4 * 25, "only {checked} checks: is the document complete?");

    // Identity: a participant acts as itself, never as another, on every face.
    let alice = with_token(Some("tok-alice"));
    let post = |c: &reqwest::Client, sender: &str| {
        c.post(s.url("/api/channels/matrix/messages"))
            .json(&json!({"sender": sender, "body": "x"}))
            .send()
    };
    assert_eq!(post(&alice, "alice").await.unwrap().status(), 200);
    assert_eq!(post(&alice, "bob").await.unwrap().status(), 403);
    assert_eq!(post(&with_token(Some("shared-9x")), "bob").await.unwrap().status(), 200);
    for (path, want) in [
        ("/api/channels/matrix/stream?participant_id=alice", 200),
        ("/api/channels/matrix/stream?participant_id=bob", 403),
        ("/api/channels/matrix/messages?instance_id=bob", 403),
        ("/api/channels/matrix/wait?instance_id=bob&timeout_s=0", 403),
        ("/api/inbox?instance_id=bob", 403),
    ] {
        let r = alice
            .get(s.url(path))
            .timeout(std::time::Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "{path}");
    }
    let r = alice.delete(s.url("/api/data/spec?owner=bob")).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let m = Mcp::connect_with(&s, with_token(Some("tok-bob"))).await;
    let err = m
        .call_err(
            "post_message",
            json!({"channel": "matrix", "sender": "alice", "body": "forged"}),
        )
        .await;
    assert!(err.contains("bob"), "{err}");
    let posted: Value = m
        .call_ok("post_message", json!({"channel": "matrix", "body": "as myself"}))
        .await;
    assert_eq!(posted["sender"], "bob");
}
