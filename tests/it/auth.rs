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

/// `whoami`'s `manages` is what the console shows panels for, so it must name exactly what the
/// routes then allow this token: `webhooks` where `GET /api/webhooks` answers, `connections`
/// where `GET /api/oauth/clients` does. A relay without `--oauth` serves no OAuth routes at
/// all, and says so to every token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_names_what_the_token_may_manage_as_the_routes_allow_it() {
    let tokens = ["--token", "s3cret", "--participants", "alice:tok-alice"];
    let relays = [
        ("no tokens", vec![], vec![None]),
        ("tokens", tokens.to_vec(), vec![Some("s3cret"), Some("tok-alice")]),
        (
            "--oauth",
            [&tokens[..], &["--oauth"]].concat(),
            vec![Some("s3cret"), Some("tok-alice")],
        ),
    ];
    for (relay, args, callers) in relays {
        let s = Server::start_with(&args);
        for token in callers {
            let c = match token {
                Some(t) => client_with_token(t),
                None => client(),
            };
            let (status, me) = get_json(&c, &s.url("/api/whoami")).await;
            assert_eq!(status, 200, "{me}");
            let mut allowed = Vec::new();
            for (what, path) in [("webhooks", "/api/webhooks"), ("connections", "/api/oauth/clients")] {
                if c.get(s.url(path)).send().await.unwrap().status() == 200 {
                    allowed.push(what);
                }
            }
            assert_eq!(me["manages"], json!(allowed), "{relay}, token {token:?}: {me}");
        }
        if relay == "--oauth" {
            let (_, admin) = get_json(&client_with_token("s3cret"), &s.url("/api/whoami")).await;
            assert_eq!(
                admin["manages"],
                json!(["webhooks", "connections"]),
                "the test sees both"
            );
        }
    }
}
