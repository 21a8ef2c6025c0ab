//! Token access control: a shared token, per-participant tokens bound to one identity,
//! `?token=` only for EventSource streams, `/healthz` open.

use crate::common;
use common::*;
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_every_route_and_bind_participants_to_their_identity() {
    let s = Server::start_with(&["--token", "s3cret", "--participants", "alice:tok-alice,bob:tok-bob"]);
    let c = client();
    let url = s.url("/api/channels/dev/messages");

    let r = c.get(s.url("/api/channels")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "unauthorized");
    let r = c.get(s.url("/api/channels")).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = c.post(&url).json(&msg("mallory", "sneak")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        c.get(s.url("/healthz")).send().await.unwrap().status(),
        200,
        "health stays open"
    );

    // The shared token may act as anyone.
    let r = c
        .post(&url)
        .bearer_auth("s3cret")
        .json(&msg("ops", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A participant token acts only as its own identity.
    let r = c
        .post(&url)
        .bearer_auth("tok-alice")
        .json(&msg("alice", "me"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(&url)
        .bearer_auth("tok-alice")
        .json(&msg("bob", "not me"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let wait = s.url("/api/channels/dev/wait?timeout_s=0&instance_id=bob");
    assert_eq!(
        c.get(&wait).bearer_auth("tok-alice").send().await.unwrap().status(),
        403
    );
    assert_eq!(c.get(&wait).bearer_auth("tok-bob").send().await.unwrap().status(), 200);

    // ?token= works for EventSource streams, and nowhere else.
    let r = c
        .get(s.url("/api/channels/dev/messages?token=s3cret"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let stream = s.url("/api/channels/dev/stream?token=tok-bob&participant_id=bob");
    let mut sse = SseReader::open(&c, &stream, None).await;
    assert_eq!(sse.next(Duration::from_secs(5)).await.unwrap().event, "ready");
    assert_eq!(sse.next_message(Duration::from_secs(5)).await.unwrap()["body"], "hi");
    let r = c
        .get(s.url("/api/channels/dev/stream?token=tok-bob&participant_id=alice"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    let r = c
        .get(s.url("/api/channels/dev/messages"))
        .bearer_auth("tok-bob")
        .send()
        .await
        .unwrap();
    let stored: serde_json::Value = r.json().await.unwrap();
    let bodies: Vec<_> = stored.as_array().unwrap().iter().map(|m| m["body"].clone()).collect();
    assert_eq!(bodies, [json!("hi"), json!("me")], "refused requests stored nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_token_acts_only_as_itself_over_mcp_too() {
    use common::mcp::Mcp;
    let s = Server::start_with(&["--participants", "alice:tok-alice"]);
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", "Bearer tok-alice".parse().unwrap());
    let http = builder().default_headers(headers).build().unwrap();
    let m = Mcp::connect_with(&s, http).await;
    let err = m
        .call_err(
            "post_message",
            json!({"channel": "dev", "sender": "bob", "body": "forged"}),
        )
        .await;
    assert!(err.contains("belongs to \"alice\""), "{err}");
    m.call_ok(
        "post_message",
        json!({"channel": "dev", "sender": "alice", "body": "mine"}),
    )
    .await;
    let r = client()
        .post(s.url("/mcp"))
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no token, no MCP");
}
