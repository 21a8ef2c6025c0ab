//! Every bad input gets a JSON error with the right status, and nothing stored is harmed.

use crate::common;
use common::*;
use serde_json::Value;

async fn raw(c: &reqwest::Client, method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
    let mut req = c.request(method.parse().unwrap(), url);
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b.to_owned());
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let text = r.text().await.unwrap();
    assert_eq!(
        ct.as_deref(),
        Some("application/json"),
        "{method} {url}: not JSON: {text}"
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

#[tokio::test]
async fn bad_requests_get_clear_json_errors_and_change_nothing() {
    let s = Server::start_with(&["--max-body-bytes", "1000", "--max-shared-bytes", "100000"]);
    let c = client();
    let good = post(&c, &s, "dev", msg("alice", "keep me")).await;
    let post_url = s.url("/api/channels/dev/messages");
    let long = "y".repeat(1001);
    let too_long = format!(r#"{{"sender":"a","body":"{long}"}}"#);
    let huge = format!(r#"{{"sender":"a","body":"{}"}}"#, "z".repeat(200_000));
    let cases: Vec<(&str, String, Option<&str>, u16, &str)> = vec![
        ("POST", post_url.clone(), Some("{not json"), 400, "malformed JSON"),
        ("POST", post_url.clone(), Some(""), 400, ""),
        ("POST", post_url.clone(), Some("[1,2]"), 400, "invalid fields"),
        ("POST", post_url.clone(), Some(r#"{"body":"x"}"#), 400, "sender"),
        ("POST", post_url.clone(), Some(r#"{"sender":"a"}"#), 400, "body"),
        (
            "POST",
            post_url.clone(),
            Some(r#"{"sender":"","body":"x"}"#),
            400,
            "sender",
        ),
        (
            "POST",
            post_url.clone(),
            Some(r#"{"sender":"a","body":""}"#),
            400,
            "body",
        ),
        (
            "POST",
            post_url.clone(),
            Some(r#"{"sender":7,"body":"x"}"#),
            400,
            "invalid type",
        ),
        (
            "POST",
            post_url.clone(),
            Some(r#"{"sender":"a","body":"x","reply_to":"one"}"#),
            400,
            "invalid type",
        ),
        (
            "POST",
            post_url.clone(),
            Some(r#"{"sender":"a","body":"x","reply_to":-1}"#),
            400,
            "invalid",
        ),
        (
            "POST",
            post_url.clone(),
            Some(r#"{"sender":"a\nb","body":"x"}"#),
            400,
            "control",
        ),
        ("POST", post_url.clone(), Some(&too_long), 400, "too long"),
        ("POST", post_url.clone(), Some(&huge), 413, "larger than"),
        (
            "POST",
            s.url("/api/channels/bad%20name/messages"),
            Some(r#"{"sender":"a","body":"x"}"#),
            400,
            "channel",
        ),
        (
            "POST",
            s.url(&format!("/api/channels/{}/messages", "c".repeat(65))),
            Some(r#"{"sender":"a","body":"x"}"#),
            400,
            "64",
        ),
        (
            "GET",
            s.url("/api/channels/dev/messages?since_id=abc"),
            None,
            400,
            "query",
        ),
        (
            "GET",
            s.url("/api/channels/dev/messages?since_id=-1"),
            None,
            400,
            "query",
        ),
        ("GET", s.url("/api/channels/dev/messages?limit=0"), None, 400, "limit"),
        (
            "GET",
            s.url("/api/channels/dev/messages?limit=100001"),
            None,
            400,
            "limit",
        ),
        (
            "GET",
            s.url("/api/channels/dev/wait?timeout_s=soon"),
            None,
            400,
            "query",
        ),
        (
            "GET",
            s.url("/api/channels/dev/wait?timeout_s=-3"),
            None,
            400,
            "timeout_s",
        ),
        ("GET", s.url("/api/channels/dev/stream?since_id=x"), None, 400, "query"),
        ("GET", s.url("/api/channels/bad!/stream"), None, 400, "channel"),
        ("GET", s.url("/api/no/such/route"), None, 404, "no route"),
        ("DELETE", post_url.clone(), None, 405, "not allowed"),
        ("PUT", s.url("/api/channels"), None, 405, "not allowed"),
    ];
    for (method, url, body, want_status, want_text) in cases {
        let (status, v) = raw(&c, method, &url, body).await;
        assert_eq!(
            status,
            want_status,
            "{method} {url} {:?} -> {v}",
            body.map(|b| &b[..b.len().min(80)])
        );
        let err = v["error"].as_str().unwrap_or_else(|| panic!("no error field: {v}"));
        assert!(
            err.to_lowercase().contains(&want_text.to_lowercase()),
            "{method} {url}: error {err:?} should mention {want_text:?}"
        );
        assert!(v["code"].is_string());
    }
    // A bad Last-Event-ID header is refused the same way.
    let r = c
        .get(s.url("/api/channels/dev/stream"))
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // Nothing stored was touched, and the relay still works.
    assert_eq!(messages(&c, &s, "dev", 0).await, vec![good]);
    let (_, list) = get_json(&c, &s.url("/api/channels")).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    post(&c, &s, "dev", msg("alice", "still fine")).await;
    let (status, health) = get_json(&c, &s.url("/healthz")).await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
}

#[tokio::test]
async fn a_wrong_method_says_which_are_allowed() {
    let s = Server::start();
    let r = client()
        .delete(s.url("/api/channels/dev/messages"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, POST");
    let r = client().put(s.url("/healthz")).send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), r.headers()["allow"].to_str().unwrap()),
        (405, "GET")
    );
}

/// Sends `head` (a whole request head, as bytes on the wire) and reads the answer to its end:
/// the status, the headers (lowercase) and the body as JSON.
fn on_the_wire(s: &Server, head: &[u8]) -> (u16, String, Value) {
    use std::io::{Read, Write};
    let addr = s.base.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    conn.write_all(head).unwrap();
    let mut answer = Vec::new();
    // The relay closes the connection after such an answer; a reset after it is fine.
    let _ = conn.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (headers, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = headers.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (
        status,
        headers.to_lowercase(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// What actix-http answers by itself, before any middleware (vendor/actix-http), and the
/// guard's URL limit: every one a JSON error with its code, `nosniff` and `no-store`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_too_long_or_malformed_get_json_errors_too() {
    let s = Server::start();
    let get =
        |target: &str, extra: &str| format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n").into_bytes();
    let long = |n: usize| format!("/api/channels?x={}", "a".repeat(n));
    let many_headers: String = (0..120).map(|i| format!("X-H{i}: v\r\n")).collect();
    for (what, head, status, code) in [
        ("a 20 KB URL (the guard)", get(&long(20_000), ""), 414, "uri_too_long"),
        (
            "a 100 KB URL (actix-http)",
            get(&long(100_000), ""),
            414,
            "uri_too_long",
        ),
        ("120 headers", get("/healthz", &many_headers), 431, "too_large"),
        (
            "a request line that is not HTTP",
            b"HELLO\r\n\r\n".to_vec(),
            400,
            "invalid_input",
        ),
    ] {
        let (got, headers, body) = on_the_wire(&s, &head);
        assert_eq!(got, status, "{what}: {headers}\n{body}");
        assert!(headers.contains("content-type: application/json"), "{what}: {headers}");
        assert!(headers.contains("x-content-type-options: nosniff"), "{what}: {headers}");
        assert!(headers.contains("cache-control: no-store"), "{what}: {headers}");
        assert_eq!(body["code"], code, "{what}: {body}");
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{what}: {body}");
    }
    // A URL at the limit is served; the limit is --max-url-bytes.
    let (got, _, _) = on_the_wire(&s, &get(&long(15_000), "Connection: close\r\n"));
    assert_eq!(got, 200);
    let s = Server::start_with(&["--max-url-bytes", "1000"]);
    let (got, _, body) = on_the_wire(&s, &get(&long(2_000), ""));
    assert_eq!((got, body["code"].as_str()), (414, Some("uri_too_long")), "{body}");
    assert!(body["error"].as_str().unwrap().contains("--max-url-bytes"), "{body}");
}
