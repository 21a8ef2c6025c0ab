//! Safe to expose: an MCP session belongs to the principal that opened it; every route
//! refuses cross-site requests and DNS rebinding; JSON routes want JSON; browser headers;
//! slow bodies are cut off; open mode only on loopback; tokens from a file; CORS only by
//! explicit allow-list; and no token or session id ever reaches the logs.

use crate::common;
use common::mcp::{Mcp, LEGACY};
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_belongs_to_the_principal_that_opened_it() {
    let s = Server::start_with(&["--participants", "alice:tok-alice,bob:tok-bob"]);
    let alice = Mcp::connect_with(&s, client_with_token("tok-alice")).await;
    alice.call_ok("register", json!({"instance_id": "alice"})).await;
    alice
        .call_ok("post_message", json!({"channel": "dev", "body": "mine"}))
        .await;
    // Bob presents Alice's session id with his own token: as if it did not exist.
    let mut bob = Mcp::unconnected(&s, LEGACY);
    bob.http = client_with_token("tok-bob");
    bob.session = alice.session.clone();
    let a = bob.request("tools/list", Value::Null).await;
    assert_eq!(a.status, 404, "{:?}", a.message);
    let a = bob
        .request(
            "tools/call",
            json!({"name": "get_messages", "arguments": {"channel": "dev"}}),
        )
        .await;
    assert_eq!(a.status, 404, "Bob cannot read as Alice: {:?}", a.message);
    let sid = alice.session.clone().unwrap();
    for method in ["GET", "DELETE"] {
        let r = bob
            .http
            .request(method.parse().unwrap(), &bob.url)
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", LEGACY)
            .header("accept", "application/json, text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method} of another's session");
    }
    // Alice's session is untouched.
    let page = alice.call_ok("get_messages", json!({"channel": "dev"})).await;
    assert_eq!(page["messages"][0]["body"], "mine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_and_dns_rebinding_are_refused_on_every_route() {
    let s = Server::start();
    let c = client();
    let url = s.url("/api/channels/dev/messages");
    let body = json!({"sender": "coordinator", "body": "hi"}).to_string();
    // What a web page can send without a preflight: text/plain, from its own origin.
    let r = c
        .post(&url)
        .header("origin", "http://evil.example")
        .header("content-type", "text/plain")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = c
        .post(s.url("/api/register"))
        .header("origin", "http://evil.example")
        .header("content-type", "text/plain")
        .body(json!({"instance_id": "coordinator"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "nobody can take a name cross-site");
    // Without an Origin, a body that is not declared JSON is still refused.
    let r = c
        .post(&url)
        .header("content-type", "text/plain")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "unsupported_media_type");
    // A rebinding page reaches the relay under its own name: refused, reads included.
    let port = s.base.rsplit(':').next().unwrap().to_owned();
    for path in ["/api/channels/dev/messages", "/api/channels", "/openapi.json", "/mcp"] {
        let r = c
            .get(s.url(path))
            .header("host", format!("evil.example:{port}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{path}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains("Host"), "{v}");
    }
    // Nothing was stored by any of it; the real coordinator can still register and post.
    assert_eq!(messages(&c, &s, "dev", 0).await, Vec::<Value>::new());
    let r = c
        .post(s.url("/api/register"))
        .json(&json!({"instance_id": "coordinator"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // A same-origin page (the relay's own) is fine, and answers carry the browser headers.
    let r = c
        .post(&url)
        .header("origin", s.base.clone())
        .json(&json!({"sender": "human", "body": "from the console"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert_eq!(r.headers()["cache-control"], "no-store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_only_for_the_origins_listed() {
    let s = Server::start_with(&["--cors-origins", "https://app.example.com"]);
    let c = client();
    let url = s.url("/api/channels");
    let r = c
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "https://app.example.com")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], "https://app.example.com");
    let r = c
        .get(&url)
        .header("origin", "https://app.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "https://app.example.com");
    let r = c
        .get(&url)
        .header("origin", "https://other.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_is_cut_off() {
    let s = Server::start();
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /api/channels/dev/messages HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"sender\""
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let start = Instant::now();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"timeout\""), "{answer}");
    assert!(start.elapsed() < Duration::from_secs(15), "{:?}", start.elapsed());
}

#[test]
fn open_mode_is_refused_beyond_loopback() {
    // Refused before anything is bound: the check is on the configuration.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0", "--data-dir"])
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--token") && err.contains("--insecure-open"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participant_tokens_from_a_file_and_no_secret_in_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("participants");
    std::fs::write(&file, "# team\nalice:tok-alice-9f3k2\n\nbob:tok-bob-7c1x8\n").unwrap();
    let s = Server::start_logging(&["--participants-file", file.to_str().unwrap()]);
    let alice = client_with_token("tok-alice-9f3k2");
    let r = alice
        .post(s.url("/api/channels/dev/messages"))
        .json(&json!({"body": "sender defaults to the token's identity"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["sender"], "alice");
    let r = alice
        .post(s.url("/api/channels/dev/messages"))
        .json(&json!({"sender": "bob", "body": "forged"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let m = Mcp::connect_with(&s, client_with_token("tok-bob-7c1x8")).await;
    m.call_ok("get_messages", json!({"channel": "dev"})).await;
    let sid = m.session.clone().unwrap();
    // EventSource cannot send headers: the stream takes the token in its URL, under
    // crosstalk's name and crosstalk-mcp's; no other route does.
    for q in ["token", "relay_token"] {
        let r = client()
            .get(s.url(&format!("/api/channels/dev/stream?{q}=tok-bob-7c1x8")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{q}");
    }
    let r = client()
        .get(s.url("/api/channels/dev/messages?token=tok-bob-7c1x8"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "a token in the URL of any other route is ignored");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let logs = s.stderr();
    assert!(logs.contains("listening"), "the default log level is on: {logs}");
    for secret in ["tok-alice-9f3k2", "tok-bob-7c1x8", sid.as_str()] {
        assert!(!logs.contains(secret), "{secret} is in the logs:\n{logs}");
    }
}

#[test]
fn a_busy_port_is_one_clear_line() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["serve", "--host", "127.0.0.1", "--port", &port, "--data-dir"])
        .arg(tempfile::tempdir().unwrap().path())
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot bind") && err.contains("in use"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_cannot_hold_every_wait_and_stream() {
    let s = Server::start_with(&[
        "--participants",
        "alice:tok-a,bob:tok-b",
        "--max-waits-per-principal",
        "2",
    ]);
    let alice = client_with_token("tok-a");
    // Two streams held open by alice; her third wait is refused, bob's is not.
    let _one = alice.get(s.url("/api/channels/a/stream")).send().await.unwrap();
    let _two = alice.get(s.url("/api/channels/b/stream")).send().await.unwrap();
    let r = alice
        .get(s.url("/api/channels/a/wait?timeout_s=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_some());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "limit_reached");
    let r = client_with_token("tok-b")
        .get(s.url("/api/channels/a/wait?timeout_s=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A stream that ends gives its place back.
    drop(_one);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = alice
            .get(s.url("/api/channels/a/wait?timeout_s=0"))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the place was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_number_of_channels_is_bounded() {
    let mut s = Server::process(&["--max-channels", "2"]);
    let c = client();
    post(&c, &s, "one", msg("a", "x")).await;
    post(&c, &s, "two", msg("a", "x")).await;
    let r = c
        .post(s.url("/api/channels/three/messages"))
        .json(&msg("a", "x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "limit_reached");
    // Existing channels keep working, and the count survives a restart.
    post(&c, &s, "one", msg("a", "more")).await;
    s.terminate();
    let dir = s.take_dir().unwrap();
    let s = Server::start_in(dir.path(), &["--max-channels", "2"]);
    let r = c
        .post(s.url("/api/channels/three/messages"))
        .json(&msg("a", "x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    post(&c, &s, "two", msg("a", "still fine")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_rate_limited_and_others_are_not() {
    let s = Server::start_with(&["--participants", "alice:tok-a,bob:tok-b", "--rate-limit", "20"]);
    let alice = client_with_token("tok-a");
    let mut limited = None;
    for i in 0..200 {
        let r = alice.get(s.url("/api/channels")).send().await.unwrap();
        if r.status() == 429 {
            limited = Some((
                i,
                r.headers().get("retry-after").is_some(),
                r.json::<Value>().await.unwrap(),
            ));
            break;
        }
    }
    let (at, retry_after, v) = limited.expect("never limited");
    assert!(at >= 15, "limited after only {at} requests");
    assert!(retry_after);
    assert_eq!(v["code"], "rate_limited");
    let r = client_with_token("tok-b")
        .get(s.url("/api/channels"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "another token has its own allowance");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = alice.get(s.url("/api/channels")).send().await.unwrap();
    assert_eq!(r.status(), 200, "the allowance refills");
}

/// A page of another site can make a browser send GETs with no `Origin` (`<img>`, a no-cors
/// fetch) but not without `Sec-Fetch-Site`: such requests change nothing — no read position
/// moves, no one appears in presence — while a person following a link to the console still
/// gets it, and an origin listed in --cors-origins still gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_site_can_change_nothing() {
    let s = Server::start_with(&["--cors-origins", "https://app.example.com"]);
    let c = client();
    post(&c, &s, "dev", msg("bob", "hello")).await;
    for site in ["cross-site", "same-site"] {
        for path in [
            "/api/channels/dev/messages?since_id=0&instance_id=ghost",
            "/api/channels/dev/wait?since_id=0&timeout_s=1&instance_id=ghost",
            "/api/inbox?instance_id=ghost",
            "/api/channels",
        ] {
            let r = c
                .get(s.url(path))
                .header("sec-fetch-site", site)
                .header("sec-fetch-mode", "no-cors")
                .header("sec-fetch-dest", "image")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 403, "{site} {path}");
            assert_eq!(r.headers()["x-content-type-options"], "nosniff");
            assert_eq!(r.headers()["cache-control"], "no-store");
            let v: Value = r.json().await.unwrap();
            assert!(v["error"].as_str().unwrap().contains("cross-site"), "{v}");
        }
    }
    let (_, present) = get_json(&c, &s.url("/api/channels/dev/presence")).await;
    assert!(!present.to_string().contains("ghost"), "{present}");
    // Following a link to the console is a navigation: allowed, for the console's pages only.
    let r = c
        .get(s.url("/ui"))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(s.url("/api/inbox?instance_id=ghost"))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a navigation to an API route is refused");
    // The relay's own page, and an origin it lists, are not refused.
    let r = c
        .get(s.url("/api/channels"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(s.url("/api/channels"))
        .header("sec-fetch-site", "cross-site")
        .header("origin", "https://app.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// The guard's own refusals carry the same browser headers as every other answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guards_own_refusals_carry_the_browser_headers() {
    let s = Server::start_with(&[
        "--token",
        "t0k",
        "--max-body-bytes",
        "1000",
        "--max-shared-bytes",
        "100000",
    ]);
    let c = client();
    let anonymous = c.get(s.url("/api/channels")).send().await.unwrap();
    let big = c
        .post(s.url("/api/channels/dev/messages"))
        .bearer_auth("t0k")
        .body(vec![b'x'; 200_000])
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    let host = c
        .get(s.url("/api/channels"))
        .bearer_auth("t0k")
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    for (r, status) in [(anonymous, 401), (big, 413), (host, 403)] {
        assert_eq!(r.status(), status);
        assert_eq!(r.headers()["x-content-type-options"], "nosniff", "{status}");
        assert_eq!(r.headers()["cache-control"], "no-store", "{status}");
    }
}

/// An MCP session's event stream (its GET) is held like any other stream: it counts against
/// --max-waits-per-principal and in /healthz's streams, and gives its place back when closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_event_streams_count_against_the_principals_streams() {
    let s = Server::start_with(&["--participants", "alice:tok-a", "--max-waits-per-principal", "2"]);
    let alice = client_with_token("tok-a");
    let mcp = Mcp::connect_with(&s, alice.clone()).await;
    let sid = mcp.session.clone().unwrap();
    let open = || {
        alice
            .get(s.url("/mcp"))
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", LEGACY)
            .send()
    };
    let first = open().await.unwrap();
    assert_eq!(first.status(), 200);
    let (_, health) = get_json(&client(), &s.url("/healthz")).await;
    assert_eq!(health["streams"], 1, "{health}");
    let _second = alice.get(s.url("/api/channels/a/stream")).send().await.unwrap();
    let third = open().await.unwrap();
    assert_eq!(third.status(), 429, "a third stream beyond the cap of 2");
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, health) = get_json(&client(), &s.url("/healthz")).await;
        if health["streams"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the closed stream still counts: {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wrong tokens are limited per client address (--auth-failure-rate): guessing at speed gets
/// 429 with Retry-After, while the right token still gets through from the same address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessing_tokens_is_slowed_to_the_failure_rate() {
    let s = Server::start_with(&["--token", "right-token", "--auth-failure-rate", "3"]);
    let wrong = client_with_token("guess");
    let mut statuses = Vec::new();
    let started = Instant::now();
    for _ in 0..20 {
        let r = wrong.get(s.url("/api/channels")).send().await.unwrap();
        let status = r.status().as_u16();
        if status == 429 {
            assert!(r.headers().get("retry-after").is_some());
            assert_eq!(r.headers()["cache-control"], "no-store");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["code"], "auth_rate_limited", "{v}");
        }
        statuses.push(status);
    }
    // A burst of 3, then 3 a second: however long the 20 guesses took on a loaded machine,
    // no more got through than the bucket held and refilled in that time.
    let refilled = (started.elapsed().as_secs_f64() * 3.0).ceil() as usize;
    let unauthorized = statuses.iter().filter(|s| **s == 401).count();
    assert!(statuses.starts_with(&[401, 401, 401]), "{statuses:?}");
    assert!(unauthorized <= 3 + refilled, "{statuses:?} in {:?}", started.elapsed());
    assert!(statuses.iter().all(|s| *s == 401 || *s == 429), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    let r = client_with_token("right-token")
        .get(s.url("/api/channels"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the right token is not held up");
    // A request with no token at all guesses nothing: it is answered 401, never 429 (every
    // OAuth client's first request has none).
    let s = Server::start_with(&["--token", "right-token", "--auth-failure-rate", "3"]);
    for _ in 0..10 {
        let r = client().get(s.url("/api/channels")).send().await.unwrap();
        assert_eq!(r.status(), 401);
    }
}

/// Whatever log level a user is likely to set, no MCP session id, token or message text reaches
/// the logs, though the MCP library logs them below `warn`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_session_id_or_message_text_in_the_logs_at_info_or_debug() {
    for level in ["info", "debug"] {
        let s = Server::start_with_env(&["--participants", "bob:tok-bob-7c1x8"], &[("RUST_LOG", level)]);
        let m = Mcp::connect_with(&s, client_with_token("tok-bob-7c1x8")).await;
        m.call_ok("register", json!({"instance_id": "bob"})).await;
        m.call_ok(
            "post_message",
            json!({"channel": "dev", "body": "the-secret-plan-4471"}),
        )
        .await;
        m.call_ok("get_messages", json!({"channel": "dev"})).await;
        let sid = m.session.clone().unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let logs = s.stderr();
        assert!(logs.contains("listening"), "{level}: the log is on: {logs}");
        for secret in [sid.as_str(), "the-secret-plan-4471", "tok-bob-7c1x8"] {
            assert!(!logs.contains(secret), "{level}: {secret} is in the logs:\n{logs}");
        }
    }
}

/// An `initialize` and what it answered: the status, the session id, and the error's JSON.
async fn initialize(s: &Server, http: &reqwest::Client, path: &str) -> (u16, Option<String>, Value) {
    let r = Mcp::unconnected_at(s, path, http.clone())
        .post_raw(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": {},
            "clientInfo": {"name": "crosstalk-tests", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let sid = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = if status == 200 {
        Value::Null
    } else {
        r.json().await.unwrap_or(Value::Null)
    };
    (status, sid, body)
}

/// One token holds at most --max-sessions-per-principal MCP sessions, on /mcp and /cc/mcp
/// together: the next `initialize` is a JSON 429 and makes no session; another token is not
/// held up; ending a session gives its place back; /healthz counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_are_bounded_per_principal() {
    let s = Server::start_with(&[
        "--participants",
        "alice:tok-a,bob:tok-b",
        "--max-sessions-per-principal",
        "2",
    ]);
    let alice = client_with_token("tok-a");
    let first = Mcp::connect_with(&s, alice.clone()).await;
    let _second = Mcp::connect_at(&s, "/cc/mcp", alice.clone()).await;
    let (_, health) = get_json(&client(), &s.url("/healthz")).await;
    assert_eq!(
        (health["sessions"].as_u64(), health["sessions_initializing"].as_u64()),
        (Some(2), Some(0)),
        "{health}"
    );
    for path in ["/mcp", "/cc/mcp"] {
        let (status, sid, body) = initialize(&s, &alice, path).await;
        assert_eq!(status, 429, "{path}: a third session beyond the cap of 2: {body}");
        assert!(sid.is_none(), "a refused initialize makes no session");
        assert_eq!(body["code"], "too_many_sessions", "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("--max-sessions-per-principal"),
            "{body}"
        );
    }
    // A 2026-07-28 request names its method in a header: it is counted by that.
    let r = alice
        .post(s.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-method", "initialize")
        .json(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LEGACY, "capabilities": {},
            "clientInfo": {"name": "crosstalk-tests", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429, "an initialize named in Mcp-Method beyond the cap");
    // A request that names another method is not an initialize, and is not held up.
    let r = alice
        .post(s.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-method", "tools/list")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 429, "a request that is not an initialize is not counted");
    // Another principal is not held up by alice's sessions.
    let bob = client_with_token("tok-b");
    let (status, _, _) = initialize(&s, &bob, "/mcp").await;
    assert_eq!(status, 200);
    // Ending a session gives its place back.
    let r = alice
        .delete(s.url("/mcp"))
        .header("mcp-session-id", first.session.clone().unwrap())
        .header("mcp-protocol-version", LEGACY)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let (status, sid, body) = initialize(&s, &alice, "/mcp").await;
    assert_eq!(status, 200, "{body}");
    assert!(sid.is_some());
}

/// A participant's token is one identity, and holds at most --max-sessions-per-participant MCP
/// sessions (64 by default, about 4.5 MB), well under the 1,024 the shared token may: one
/// participant cannot hold 70 MB of sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_token_holds_fewer_mcp_sessions_than_the_shared_token() {
    let s = Server::start_with(&["--token", "admin", "--participants", "alice:tok-a"]);
    let alice = client_with_token("tok-a");
    for i in 0..64 {
        let (status, _, body) = initialize(&s, &alice, "/mcp").await;
        assert_eq!(status, 200, "session {i}: {body}");
    }
    let (status, sid, body) = initialize(&s, &alice, "/cc/mcp").await;
    assert_eq!((status, sid), (429, None), "the 65th: {body}");
    assert_eq!(body["code"], "too_many_sessions", "{body}");
    let e = body["error"].as_str().unwrap();
    assert!(
        e.contains("alice holds 64") && e.contains("--max-sessions-per-participant"),
        "{body}"
    );
    let admin = client_with_token("admin");
    for i in 0..65 {
        let (status, _, body) = initialize(&s, &admin, "/mcp").await;
        assert_eq!(status, 200, "the shared token's session {i}: {body}");
    }
}

/// A session that never finishes its handshake (`notifications/initialized`, or any request)
/// is closed within seconds, and its place is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_never_finishes_its_handshake_is_closed_soon() {
    let s = Server::start_with(&["--participants", "alice:tok-a", "--max-sessions-per-principal", "1"]);
    let alice = client_with_token("tok-a");
    let (status, sid, _) = initialize(&s, &alice, "/mcp").await;
    assert_eq!(status, 200);
    let sid = sid.unwrap();
    let (_, health) = get_json(&client(), &s.url("/healthz")).await;
    assert_eq!(
        (health["sessions"].as_u64(), health["sessions_initializing"].as_u64()),
        (Some(1), Some(1)),
        "{health}"
    );
    let (status, _, _) = initialize(&s, &alice, "/mcp").await;
    assert_eq!(status, 429, "the half-open session holds the only place");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, health) = get_json(&client(), &s.url("/healthz")).await;
        if health["sessions"] == 0 {
            assert_eq!(health["sessions_initializing"], 0, "{health}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the half-open session was never closed: {health}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // It is gone for rmcp too, and the place is free.
    let r = alice
        .post(s.url("/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", LEGACY)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let (status, _, _) = initialize(&s, &alice, "/mcp").await;
    assert_eq!(status, 200);
    // A session that did finish its handshake stays.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, health) = get_json(&client(), &s.url("/healthz")).await;
    assert_eq!(health["sessions"], 1, "{health}");
}

/// A read answers at most --max-answer-bytes of messages (at least one): the page is cut
/// there, says more follow, and reading on from where it stopped gets every message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_answers_at_most_max_answer_bytes() {
    let s = Server::start_with(&["--max-answer-bytes", "300000"]);
    let c = client();
    let big = "x".repeat(100_000);
    for i in 0..10 {
        post(&c, &s, "big", json!({"sender": "a", "body": format!("{i} {big}")})).await;
    }
    // The bare list (crosstalk-mcp's shape) and the MCP page: cut at 300 KB, not at the limit.
    let r = c
        .get(s.url("/api/channels/big/messages?limit=1000"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let bytes = r.bytes().await.unwrap();
    let list: Vec<Value> = serde_json::from_slice(&bytes).unwrap();
    assert!(bytes.len() <= 300_000 + 1_000, "{} bytes", bytes.len());
    assert_eq!(list.len(), 2, "two 100 KB messages fit, a third does not");
    let mcp = Mcp::connect(&s).await;
    let mut since = 0;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let page = mcp
            .call_ok(
                "get_messages",
                json!({"channel": "big", "since_id": since, "limit": 1000}),
            )
            .await;
        for m in page["messages"].as_array().unwrap() {
            seen.push(m["body"].as_str().unwrap().split(' ').next().unwrap().to_owned());
        }
        since = page["next_since_id"].as_u64().unwrap();
        if page["has_more"] == false {
            break;
        }
        assert!(
            page["messages"].as_array().unwrap().len() <= 2,
            "{}",
            page["messages"].as_array().unwrap().len()
        );
    }
    assert_eq!(
        seen,
        (0..10).map(|i| i.to_string()).collect::<Vec<_>>(),
        "every message once, in order"
    );
    // One message larger than the cap still comes, alone.
    let s = Server::start_with(&["--max-answer-bytes", "1000"]);
    post(&c, &s, "big", json!({"sender": "a", "body": big.clone()})).await;
    post(&c, &s, "big", json!({"sender": "a", "body": big})).await;
    let page = mcp_page(&s).await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 1);
    assert_eq!(page["has_more"], true);
}

async fn mcp_page(s: &Server) -> Value {
    Mcp::connect(s)
        .await
        .call_ok("get_messages", json!({"channel": "big", "limit": 10}))
        .await
}

/// A session binds an identity for the token that made it only: another token that names the
/// session (cross-claude REST's per-token session, an MCP session id it learnt) does not act
/// as the identity bound there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_name_acts_only_for_the_token_that_made_it() {
    let s = Server::start_with(&["--token", "shared-secret", "--participants", "alice:tok-a,bob:tok-b"]);
    let alice = client_with_token("tok-a");
    let r = alice
        .post(s.url("/cc/api/register"))
        .json(&json!({"instance_id": "alice"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let bob = Mcp::connect_with(&s, client_with_token("tok-b")).await;
    bob.call_ok("register", json!({"instance_id": "bob"})).await;
    let bob_session = bob.session.clone().unwrap();
    let shared = client_with_token("shared-secret");
    for (who, session) in [
        ("alice", "cc-rest:alice".to_owned()),
        ("alice", "cc-rest".to_owned()),
        ("bob", bob_session.clone()),
    ] {
        let r = shared
            .post(s.url("/api/channels/dev/messages"))
            .header("x-crosstalk-session", &session)
            .json(&json!({"sender": who, "body": "impostor"}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            403,
            "the shared token acted as {who} through session {session:?}"
        );
    }
    // Their own sessions still act as them.
    let r = alice
        .post(s.url("/cc/api/messages"))
        .json(&json!({"channel": "dev", "sender": "alice", "content": "me"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    bob.call_ok("post_message", json!({"channel": "dev", "body": "me"}))
        .await;
    let bodies: Vec<String> = messages(&shared, &s, "dev", 0)
        .await
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bodies, ["me", "me"]);
}

/// The status and JSON of a request.
async fn answer(c: &reqwest::Client, method: &str, url: &str, body: Value) -> (u16, Value) {
    common::request(c, method, url, Some(body), None).await
}

/// One participant's token cannot take every one of --max-channels: it brings at most
/// --max-channels-per-participant into being, however it tries (a post, a creation, a
/// wait), and then another token's first post to a new channel still goes through. Its own
/// channels keep working; the shared token answers only to --max-channels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_cannot_take_every_channel() {
    let s = Server::start_with(&[
        "--token",
        "admin",
        "--participants",
        "alice:tok-a,bob:tok-b",
        "--max-channels",
        "8",
        "--max-channels-per-participant",
        "3",
    ]);
    let (alice, bob, admin) = (
        client_with_token("tok-a"),
        client_with_token("tok-b"),
        client_with_token("admin"),
    );
    let post_to = |ch: &str| s.url(&format!("/api/channels/{ch}/messages"));
    for ch in ["a1", "a2"] {
        let (status, v) = answer(&alice, "POST", &post_to(ch), msg("alice", "x")).await;
        assert_eq!(status, 200, "{ch}: {v}");
    }
    let (status, v) = answer(
        &alice,
        "POST",
        &s.url("/api/channels"),
        json!({"name": "a3", "description": "d"}),
    )
    .await;
    assert_eq!(status, 201, "a creation counts too: {v}");
    for (how, (status, v)) in [
        (
            "a post",
            answer(&alice, "POST", &post_to("a4"), msg("alice", "x")).await,
        ),
        (
            "a creation",
            answer(
                &alice,
                "POST",
                &s.url("/api/channels"),
                json!({"name": "a4", "description": "d"}),
            )
            .await,
        ),
        (
            "a wait",
            common::request(
                &alice,
                "GET",
                &s.url("/api/channels/a4/wait?since_id=0&timeout_s=0"),
                None,
                None,
            )
            .await,
        ),
    ] {
        assert_eq!((status, v["code"].as_str()), (429, Some("limit_reached")), "{how}: {v}");
        assert!(
            v["error"].as_str().unwrap().contains("--max-channels-per-participant"),
            "{v}"
        );
    }
    let (status, v) = answer(&alice, "POST", &post_to("a1"), msg("alice", "still mine")).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = answer(&bob, "POST", &post_to("b1"), msg("bob", "x")).await;
    assert_eq!(status, 200, "another token's first post to a new channel: {v}");
    for ch in ["s1", "s2", "s3", "s4"] {
        let (status, v) = answer(&admin, "POST", &post_to(ch), msg("admin", "x")).await;
        assert_eq!(status, 200, "the shared token, {ch}: {v}");
    }
}

/// One participant's token holds at most --max-reservations-per-participant live path
/// reservations across every project (one holder kept 2,000 across 20 projects); releasing
/// one, or one lapsing, gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_holds_a_bounded_number_of_reservations_across_projects() {
    let s = Server::start_with(&[
        "--participants",
        "alice:tok-a,bob:tok-b",
        "--max-reservations-per-participant",
        "3",
    ]);
    let (alice, bob) = (client_with_token("tok-a"), client_with_token("tok-b"));
    let url = s.url("/api/reservations");
    let mut ids = Vec::new();
    for p in ["p1", "p2", "p3"] {
        let (status, r) = answer(&alice, "POST", &url, json!({"paths": ["src/**"], "project": p})).await;
        assert_eq!((status, r["granted"].as_bool()), (200, Some(true)), "{r}");
        ids.push(r["id"].as_str().unwrap().to_owned());
    }
    let (status, e) = answer(&alice, "POST", &url, json!({"paths": ["src/**"], "project": "p4"})).await;
    assert_eq!((status, e["code"].as_str()), (429, Some("limit_reached")), "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("--max-reservations-per-participant"),
        "{e}"
    );
    let (status, r) = answer(&bob, "POST", &url, json!({"paths": ["src/**"], "project": "p4"})).await;
    assert_eq!(
        (status, r["granted"].as_bool()),
        (200, Some(true)),
        "another token: {r}"
    );
    let (status, _) = common::request(
        &alice,
        "DELETE",
        &s.url(&format!("/api/reservations/{}", ids[0])),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, r) = answer(&alice, "POST", &url, json!({"paths": ["docs/**"], "project": "p4"})).await;
    assert_eq!(
        (status, r["granted"].as_bool()),
        (200, Some(true)),
        "a released one's place: {r}"
    );
    // A reservation that lapses gives its place back too: this node's count still holds it,
    // so the limit reads the projects again before it refuses. (One released first, for the
    // short one's place.)
    let release = s.url(&format!("/api/reservations/{}", ids[1]));
    assert_eq!(common::request(&alice, "DELETE", &release, None, None).await.0, 200);
    let (status, r) = answer(
        &alice,
        "POST",
        &url,
        json!({"paths": ["tmp/**"], "project": "p5", "ttl_s": 1}),
    )
    .await;
    assert_eq!((status, r["granted"].as_bool()), (200, Some(true)), "{r}");
    let (status, e) = answer(&alice, "POST", &url, json!({"paths": ["x/**"], "project": "p6"})).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (429, Some("limit_reached")),
        "at the limit again: {e}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let (status, r) = answer(&alice, "POST", &url, json!({"paths": ["x/**"], "project": "p6"})).await;
    assert_eq!(
        (status, r["granted"].as_bool()),
        (200, Some(true)),
        "a lapsed one's place: {r}"
    );
}

/// One participant's token keeps at most --max-shared-keys-per-participant shared data keys
/// (300 keys of 100 KB were all accepted): a new version of a key it keeps is fine, and a key
/// deleted, by it or by anyone, gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_keeps_a_bounded_number_of_shared_keys() {
    let s = Server::start_with(&[
        "--token",
        "admin",
        "--participants",
        "alice:tok-a,bob:tok-b",
        "--max-shared-keys-per-participant",
        "3",
    ]);
    let (alice, bob, admin) = (
        client_with_token("tok-a"),
        client_with_token("tok-b"),
        client_with_token("admin"),
    );
    let url = s.url("/api/data");
    let share = |c: reqwest::Client, key: &str| {
        let (url, body) = (url.clone(), json!({"key": key, "content": "x".repeat(1000)}));
        async move { answer(&c, "POST", &url, body).await }
    };
    for k in ["k1", "k2", " k3 "] {
        let (status, v) = share(alice.clone(), k).await;
        assert_eq!(status, 201, "{k}: {v}");
    }
    for k in ["k4", "k3"] {
        let (status, e) = share(alice.clone(), k).await;
        if k == "k3" {
            assert_eq!(status, 201, "a new version of a key it keeps (however spelt): {e}");
            continue;
        }
        assert_eq!((status, e["code"].as_str()), (429, Some("limit_reached")), "{e}");
        assert!(
            e["error"]
                .as_str()
                .unwrap()
                .contains("--max-shared-keys-per-participant"),
            "{e}"
        );
    }
    let (status, v) = share(bob, "b1").await;
    assert_eq!(status, 201, "another token: {v}");
    let (status, _) = common::request(&alice, "DELETE", &s.url("/api/data/k1"), None, None).await;
    assert_eq!(status, 200);
    let (status, v) = share(alice.clone(), "k4").await;
    assert_eq!(status, 201, "its own deletion gives the place back: {v}");
    let (status, _) = common::request(&admin, "DELETE", &s.url("/api/data/k2?owner=alice"), None, None).await;
    assert_eq!(status, 200);
    let (status, v) = share(alice.clone(), "k5").await;
    assert_eq!(status, 201, "and so does a deletion by anyone: {v}");
    let (status, e) = share(alice, "k6").await;
    assert_eq!(status, 429, "{e}");
}
