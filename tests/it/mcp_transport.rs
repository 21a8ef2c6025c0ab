//! The MCP transport: both protocol generations (a 2025-11-25 session with its GET stream
//! and DELETE; 2026-07-28 stateless requests with `server/discover`), the Host/Origin
//! defence against DNS rebinding and its allow-list, and a quick exit on SIGTERM with MCP
//! sessions open.

use crate::common;
use common::mcp::*;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test]
async fn a_session_lives_from_initialize_to_delete() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    assert_eq!(m.ok("ping", Value::Null).await, json!({}));
    let delete = |sid: String| {
        m.http
            .delete(&m.url)
            .header("Mcp-Session-Id", sid)
            .header("MCP-Protocol-Version", LEGACY)
            .send()
    };
    let sid = m.session.clone().unwrap();
    // 204: the Python SDK accepts 200 and 204 and warns on anything else.
    assert_eq!(delete(sid.clone()).await.unwrap().status(), 204);
    // The session is gone: the spec's 404 tells the client to initialize again.
    let a = m.request("tools/list", Value::Null).await;
    assert_eq!(a.status, 404, "{:?}", a.message);
    // Deleting it again, or a session that never was, is 404.
    for sid in [sid, "no-such-session".to_owned()] {
        assert_eq!(delete(sid.clone()).await.unwrap().status(), 404, "DELETE of {sid}");
    }
    // A request without a session that is not initialize is refused.
    let bare = Mcp::unconnected(&s, LEGACY);
    assert!(bare.request("tools/list", Value::Null).await.status >= 400);
}

#[tokio::test]
async fn stateless_2026_clients_discover_and_call_tools_without_a_session() {
    let s = Server::start();
    let m = Mcp::stateless(&s);
    let d = m.ok("server/discover", Value::Null).await;
    let versions: Vec<_> = d["supportedVersions"].as_array().expect("supportedVersions").clone();
    assert!(
        versions.contains(&json!(MODERN)) && versions.contains(&json!(LEGACY)),
        "{d}"
    );
    assert_eq!(
        d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "crosstalk",
        "{d}"
    );
    assert!(d["capabilities"]["tools"].is_object(), "{d}");
    let posted = m
        .call_ok(
            "post_message",
            json!({"channel": "dev", "sender": "new", "body": "hello"}),
        )
        .await;
    let page = m.call_ok("get_messages", json!({"channel": "dev"})).await;
    assert_eq!(page["messages"], json!([posted]));
    assert!(m
        .call_err("get_messages", json!({"channel": "dev", "limit": 0}))
        .await
        .contains("limit"));
    let tools = m.ok("tools/list", Value::Null).await;
    assert_eq!(tools["tools"].as_array().unwrap().len(), 22);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_client_registers_and_acts_as_its_identity() {
    // A 2026-07-28 client has no session: what it registers is bound to its token's
    // stateless session, so its next requests (to any node) act as it, and nobody else can.
    let s = Server::start();
    let c = client();
    let m = Mcp::stateless(&s);
    m.call_ok("register", json!({"instance_id": "alice"})).await;
    let posted = m
        .call_ok(
            "post_message",
            json!({"channel": "dev", "sender": "alice", "body": "hi"}),
        )
        .await;
    assert_eq!(posted["sender"], "alice");
    let again = Mcp::stateless(&s);
    again
        .call_ok(
            "post_message",
            json!({"channel": "dev", "sender": "alice", "body": "again"}),
        )
        .await;
    // A 2025-11-25 session and a REST client are someone else while alice is live.
    let session = Mcp::connect(&s).await;
    assert!(session
        .call_err("register", json!({"instance_id": "alice"}))
        .await
        .contains("alice"));
    let (status, e) = request(
        &c,
        "POST",
        &s.url("/api/channels/dev/messages"),
        Some(json!({"sender": "alice", "body": "not me"})),
        None,
    )
    .await;
    assert_eq!(status, 403, "{e}");
}

async fn status_with(s: &Server, host: Option<&str>, origin: Option<&str>) -> u16 {
    let m = Mcp::unconnected(s, LEGACY);
    let mut req = m.post_raw(&m.request_body(
        1,
        "initialize",
        json!({"protocolVersion": LEGACY,
        "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    ));
    if let Some(h) = host {
        req = req.header("Host", h);
    }
    if let Some(o) = origin {
        req = req.header("Origin", o);
    }
    req.send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn foreign_hosts_and_origins_are_refused() {
    let s = Server::start();
    let port = s.base.rsplit(':').next().unwrap().to_owned();
    assert_eq!(status_with(&s, None, None).await, 200);
    assert_eq!(status_with(&s, Some(&format!("localhost:{port}")), None).await, 200);
    assert_eq!(
        status_with(
            &s,
            Some(&format!("localhost:{port}")),
            Some(&format!("http://localhost:{port}"))
        )
        .await,
        200
    );
    // DNS rebinding: the browser sends the attacker's name.
    assert_eq!(status_with(&s, Some(&format!("evil.example:{port}")), None).await, 403);
    // A page elsewhere posting to the loopback relay.
    assert_eq!(status_with(&s, None, Some("http://evil.example")).await, 403);
    // Every route refuses a foreign Host, but for /healthz: load balancers probe it by
    // address, and it tells nothing.
    let r = client()
        .get(s.url("/api/channels"))
        .header("Host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = client()
        .get(s.url("/healthz"))
        .header("Host", "10.1.2.3:8765")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn the_allow_list_admits_named_hosts_and_keeps_loopback() {
    let s = Server::start_with(&["--allowed-hosts", "relay.example.com, other.example:8765"]);
    assert_eq!(status_with(&s, Some("relay.example.com"), None).await, 200);
    assert_eq!(
        status_with(&s, Some("relay.example.com:1234"), Some("https://relay.example.com")).await,
        200
    );
    assert_eq!(status_with(&s, Some("other.example:8765"), None).await, 200);
    assert_eq!(status_with(&s, Some("other.example:9999"), None).await, 403);
    assert_eq!(status_with(&s, Some("evil.example"), None).await, 403);
    assert_eq!(status_with(&s, None, None).await, 200, "loopback still works");
}

#[test]
fn an_empty_allow_list_is_refused_at_startup() {
    for (flag, env) in [(Some(""), None), (Some(" , "), None), (None, Some(""))] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_crosstalk"));
        cmd.args(["serve", "--port", "0", "--data-dir"]).arg(dir.path());
        if let Some(f) = flag {
            cmd.args(["--allowed-hosts", f]);
        }
        if let Some(e) = env {
            cmd.env("CROSSTALK_ALLOWED_HOSTS", e);
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "started with flag {flag:?} env {env:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("allowed hosts is empty"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_mcp_sessions_quickly() {
    let mut s = Server::process(&[]);
    let m = Mcp::connect(&s).await;
    let mut stream = m.listen().await;
    let m2 = Mcp::connect(&s).await;
    let waiter = tokio::spawn(async move {
        m2.request(
            "tools/call",
            json!({"name": "wait_for_message", "arguments": {"channel": "dev", "timeout_s": 50}}),
        )
        .await
    });
    let stateless = Mcp::stateless(&s);
    let listen = stateless.post_raw(&stateless.request_body(
        9,
        "subscriptions/listen",
        json!({"notifications": {"resourceSubscriptions": ["crosstalk://channels/dev"]}}),
    ));
    let listener = tokio::spawn(async move { listen.send().await?.text().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (took, clean) = s.terminate();
    assert!(clean, "exit status is success");
    // The relay gives in-flight requests 1 s; held ones (actix's default) would keep it 30 s.
    assert!(took < Duration::from_secs(5), "SIGTERM to exit took {took:?}");
    // Every stream ended with the process.
    while stream.next(Duration::from_secs(2)).await.is_some() {}
    let _ = tokio::time::timeout(Duration::from_secs(2), waiter).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), listener).await;
}

#[tokio::test]
async fn transport_errors_are_json_like_every_other_error() {
    let s = Server::start();
    let c = client();
    let url = s.url("/mcp");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let cases = [
        // An unknown session, a refused Host (DNS rebinding), a body that is not JSON.
        ("mcp-session-id", "no-such-session", "application/json", 404),
        ("host", "evil.example", "application/json", 403),
        ("x-none", "", "text/plain", 415),
    ];
    for (header, value, content_type, want) in cases {
        let r = c
            .post(&url)
            .header(header, value)
            .header("content-type", content_type)
            .header("accept", "application/json, text/event-stream")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "{header}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with("application/json"), "{header}: {ct}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()) && v["code"].is_string(),
            "{header}: {v}"
        );
    }
}

#[tokio::test]
async fn session_calls_on_a_reused_connection_do_not_stall() {
    // Nagle on the server's socket held the second write of every streamed answer until the
    // client's delayed ACK: a deterministic ~40 ms added to every call on a kept-alive
    // connection. The fastest of twenty sequential calls on one connection catches it without
    // being a timing test of the machine's speed (under load some calls are slow; with Nagle,
    // none is fast).
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    let mut took = Vec::new();
    for _ in 0..20 {
        let t = std::time::Instant::now();
        assert_eq!(m.ok("ping", Value::Null).await, json!({}));
        took.push(t.elapsed());
    }
    took.sort();
    assert!(
        took[0] < Duration::from_millis(35),
        "the fastest took {:?}: {took:?}",
        took[0]
    );
}

/// A relay without OAuth answers the OAuth discovery paths 404 with or without a token, as
/// the MCP authorization spec expects, so a client such as mcp-remote does not try to
/// register itself after a 401.
#[tokio::test]
async fn oauth_discovery_paths_say_there_is_no_oauth() {
    let s = Server::start_with(&["--token", "t0ken"]);
    let http = common::client();
    for (method, path) in [
        ("GET", "/.well-known/oauth-protected-resource"),
        ("GET", "/.well-known/oauth-protected-resource/mcp"),
        ("GET", "/.well-known/oauth-authorization-server"),
        ("GET", "/.well-known/openid-configuration"),
        ("POST", "/register"),
    ] {
        let r = http
            .request(method.parse().unwrap(), s.url(path))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
        let body: Value = r.json().await.unwrap();
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    // Everything else still needs the token.
    assert_eq!(http.get(s.url("/api/channels")).send().await.unwrap().status(), 401);
}

/// SEP-2243 requires `Mcp-Method` on requests; a notification without it (the TypeScript SDK
/// 2.x sends none on notifications) is accepted, while a request without it is still refused.
#[tokio::test]
async fn modern_notifications_need_no_mcp_method_header() {
    let s = Server::start();
    let http = common::client();
    let send = |body: Value| {
        http.post(s.url("/mcp"))
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", MODERN)
            .json(&body)
            .send()
    };
    let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "closed"}});
    let r = send(note).await.unwrap();
    assert!(
        r.status().is_success(),
        "a notification without Mcp-Method: {}",
        r.status()
    );
    let m = Mcp::stateless(&s);
    let request = m.request_body(1, "tools/list", Value::Null);
    let r = send(request).await.unwrap();
    assert_eq!(r.status(), 400, "a request without Mcp-Method must still be refused");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32020, "{body}");
}

/// The next event that carries a JSON-RPC message (priming events carry none).
async fn next_json(sse: &mut SseReader) -> Option<(String, Value)> {
    while let Some(e) = sse.next(Duration::from_secs(10)).await {
        if let Ok(v) = serde_json::from_str::<Value>(&e.data) {
            return Some((e.id.unwrap_or_default(), v));
        }
    }
    None
}

/// A GET stream opened with `Last-Event-ID`.
async fn resume(m: &Mcp, last_event_id: &str) -> reqwest::Response {
    m.http
        .get(&m.url)
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", m.session.as_deref().unwrap())
        .header("MCP-Protocol-Version", LEGACY)
        .header("Last-Event-ID", last_event_id)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
}

/// A tool call whose POST stream is cut before its answer: the client resumes with the last
/// event id it saw and gets the answer (it was lost before), exactly once.
#[tokio::test]
async fn a_cut_tool_stream_resumes_with_its_answer() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    let body = m.request_body(
        41,
        "tools/call",
        json!({"name": "wait_for_message",
        "arguments": {"channel": "cut", "since_id": 0, "timeout_s": 10}}),
    );
    let r = m.post_raw(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut first = SseReader::from_response(r);
    let primed = first.next(Duration::from_secs(5)).await.expect("a priming event");
    let last_seen = primed.id.expect("the priming event has an id");
    drop(first); // the connection is cut mid-call
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A post wakes the wait while the client is away: its answer has nowhere to go yet.
    let posted: Value = common::client()
        .post(s.url("/api/channels/cut/messages"))
        .json(&json!({"sender": "a", "body": "after the cut"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The wait ends.
    common::until_waits(&common::client(), &s.url(""), 0).await;
    // The client comes back within the grace, with the last event id it saw.
    let mut resumed = SseReader::from_response(resume(&m, &last_seen).await);
    let (id, answer) = next_json(&mut resumed).await.expect("the answer on the resumed stream");
    assert_eq!(answer["id"], 41, "{answer}");
    let got = &answer["result"]["structuredContent"]["messages"][0];
    assert_eq!(got["id"], posted["id"], "{answer}");
    assert!(!id.is_empty() && id != last_seen);
    // Resuming after the answer replays nothing.
    let mut again = SseReader::from_response(resume(&m, &id).await);
    assert!(
        again.next(Duration::from_millis(500)).await.is_none(),
        "the answer was replayed twice"
    );
}

/// Event ids on the standalone stream are unique (the priming event and the first
/// notification were both `0`), and a resume replays only what followed.
#[tokio::test]
async fn standalone_stream_event_ids_are_unique_and_resume_replays_only_what_followed() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    let mut sse = m.listen().await;
    m.ok("resources/subscribe", json!({"uri": "crosstalk://channels/ids"}))
        .await;
    let post = |body: &'static str| {
        let url = s.url("/api/channels/ids/messages");
        async move {
            common::client()
                .post(url)
                .json(&json!({"sender": "a", "body": body}))
                .send()
                .await
                .unwrap();
        }
    };
    post("one").await;
    let (first_id, note) = next_json(&mut sse).await.expect("a notification");
    assert_eq!(note["method"], "notifications/resources/updated", "{note}");
    // The priming event carries no id, or one of its own: never the notification's.
    assert_ne!(first_id, "0", "the notification shares the priming event's id 0");
    drop(sse);
    post("two").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Resume after the first notification: the second comes, the first does not.
    let mut resumed = SseReader::from_response(resume(&m, &first_id).await);
    let (second_id, _) = next_json(&mut resumed).await.expect("what followed");
    assert_ne!(second_id, first_id);
    assert!(second_id.parse::<u64>().unwrap() > first_id.parse::<u64>().unwrap());
    // And the stream goes on live after the replay.
    post("three").await;
    let (third_id, _) = next_json(&mut resumed).await.expect("live after the replay");
    assert!(third_id.parse::<u64>().unwrap() > second_id.parse::<u64>().unwrap());
}

/// A DELETE that ends a session answers 204 with no body at all: rmcp's empty chunked body,
/// once kept under the rewritten status, reached the wire as a stray `0\r\n\r\n` that the next
/// answer on the same connection started with (httpx: "illegal status line"). Read off the raw
/// socket: the DELETE, then a second request on the same connection.
#[tokio::test]
async fn a_session_deleted_on_a_kept_connection_leaves_nothing_behind_on_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = Server::start();
    for path in ["/mcp", "/cc/mcp"] {
        let m = Mcp::connect_at(&s, path, client()).await;
        let sid = m.session.clone().expect("a session");
        let addr = s.url("").trim_start_matches("http://").trim_end_matches('/').to_owned();
        let mut sock = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!("DELETE {path} HTTP/1.1\r\nHost: {addr}\r\nmcp-session-id: {sid}\r\n\r\n");
        sock.write_all(head.as_bytes()).await.unwrap();
        sock.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        // Both answers: read until the second one's JSON body has closed.
        while !String::from_utf8_lossy(&got).contains("\"status\"") || !got.ends_with(b"}") {
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, sock.read(&mut buf))
                .await
                .expect("both answers within 10 s")
                .unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 204 No Content\r\n"), "{path}: {text}");
        let (first, rest) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            !first.to_ascii_lowercase().contains("transfer-encoding"),
            "{path}: {first}"
        );
        assert!(
            rest.starts_with("HTTP/1.1 200 OK\r\n"),
            "{path}: the 204 left bytes on the connection: {rest:?}"
        );
    }
}

/// JSON-RPC's own errors where rmcp would answer otherwise: a body that is not JSON is a parse
/// error (-32700, HTTP 400, not 415), a known method whose params do not read is -32602 (not
/// -32601 "method not found"), and a tool choice that is neither core nor full is refused on
/// every request, `initialize` included, as docs/mcp.md says.
#[tokio::test]
async fn json_rpc_mistakes_get_json_rpc_errors() {
    let s = Server::start();
    let c = client();
    let post = |url: String, body: String, headers: Vec<(&'static str, String)>| {
        let c = c.clone();
        async move {
            let mut r = c
                .post(url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream");
            for (k, v) in headers {
                r = r.header(k, v);
            }
            let r = r.body(body).send().await.unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            // An answer may come as one SSE event.
            let json = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .rfind(|d| !d.trim().is_empty())
                .unwrap_or(&text)
                .to_owned();
            (status, serde_json::from_str::<Value>(&json).unwrap_or(Value::Null))
        }
    };
    for bad in [
        r#"{"jsonrpc":"2.0","id":1,"#,
        "not json",
        "{\"jsonrpc\":\"2.0\",\"id\":1}}",
    ] {
        let (st, v) = post(s.url("/mcp"), bad.into(), vec![]).await;
        assert_eq!((st, v["error"]["code"].as_i64()), (400, Some(-32700)), "{bad}: {v}");
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
    }
    let m = Mcp::connect(&s).await;
    let sid = m.session.clone().unwrap();
    let session = || {
        vec![
            ("mcp-session-id", sid.clone()),
            ("mcp-protocol-version", "2025-11-25".to_owned()),
        ]
    };
    let cases = [
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "list_channels", "arguments": [1, 2]}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "list_channels", "arguments": "x"}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"arguments": {}}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "logging/setLevel", "params": {"level": "loud"}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "logging/setLevel", "params": {}}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": 5}}),
    ];
    for case in cases {
        let (st, v) = post(s.url("/mcp"), case.to_string(), session()).await;
        assert_eq!(
            (st, v["error"]["code"].as_i64(), v["id"].as_i64()),
            (200, Some(-32602), Some(7)),
            "{case}: {v}"
        );
    }
    // The same calls done right still work, and an unknown method is still -32601.
    let (_, v) = post(
        s.url("/mcp"),
        json!({"jsonrpc": "2.0", "id": 8, "method": "logging/setLevel", "params": {"level": "info"}}).to_string(),
        session(),
    )
    .await;
    assert_eq!(v["result"], json!({}), "{v}");
    let (_, v) = post(
        s.url("/mcp"),
        json!({"jsonrpc": "2.0", "id": 9, "method": "no/such", "params": {}}).to_string(),
        session(),
    )
    .await;
    assert_eq!(v["error"]["code"], -32601, "{v}");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    for (url, headers) in [
        (s.url("/mcp?tools=bogus"), vec![]),
        (s.url("/mcp"), vec![("x-crosstalk-tools", "everything".to_owned())]),
    ] {
        let (st, v) = post(url.clone(), init.to_string(), headers).await;
        assert_eq!((st, v["error"]["code"].as_i64()), (400, Some(-32602)), "{url}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("core or full"), "{v}");
    }
    let (st, _) = post(s.url("/mcp?tools=core"), init.to_string(), vec![]).await;
    assert_eq!(st, 200);
}

/// A 2026-07-28 client names itself once: after `register`, its calls that name nobody act
/// as the name its token's sessionless calls registered (the README's loop, unchanged). When
/// that token's sessionless calls registered several names, a call that names none is told
/// to name one, with the names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_client_acts_as_what_it_registered_without_naming_it() {
    let s = Server::start_with(&["--token", "adm", "--participants", "coder:coder-tok"]);
    let m = Mcp::stateless_url_with(s.url("/mcp"), client_with_token("coder-tok"));
    let reg = m.call_ok("register", json!({"instance_id": "coder"})).await;
    assert!(reg["next"].as_str().unwrap().contains("sender=coder"), "{reg}");
    let posted = m.call_ok("post_message", json!({"channel": "dev", "body": "hi"})).await;
    assert_eq!(posted["sender"], "coder");
    let waited = m
        .call_ok(
            "wait_for_message",
            json!({"channel": "dev", "since_id": 0, "timeout_s": 0.2}),
        )
        .await;
    assert_eq!(
        waited["messages"],
        json!([]),
        "its own message does not wake it: {waited}"
    );
    // The shared token's sessionless calls: one name is the default, two are ambiguous.
    let admin = Mcp::stateless_url_with(s.url("/mcp"), client_with_token("adm"));
    admin.call_ok("register", json!({"instance_id": "w1"})).await;
    let p = admin
        .call_ok("post_message", json!({"channel": "dev", "body": "one"}))
        .await;
    assert_eq!(p["sender"], "w1");
    admin.call_ok("register", json!({"instance_id": "w2"})).await;
    let r = admin
        .call("post_message", json!({"channel": "dev", "body": "who?"}))
        .await;
    assert_eq!(r["isError"], true, "{r}");
    let why = r["structuredContent"]["error"].as_str().unwrap();
    assert!(
        why.contains("w1") && why.contains("w2") && why.contains("sender="),
        "{why}"
    );
    let p = admin
        .call_ok("post_message", json!({"channel": "dev", "sender": "w2", "body": "two"}))
        .await;
    assert_eq!(p["sender"], "w2");
}

/// On a relay without tokens nothing tells two 2026-07-28 clients apart: the first to
/// register goes without naming itself; once a second has, a call that names nobody is told
/// why (the relay has no tokens) and to name itself, and a call that names itself works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_clients_on_a_relay_without_tokens_share_one_default() {
    let s = Server::start();
    let a = Mcp::stateless(&s);
    a.call_ok("register", json!({"instance_id": "solo"})).await;
    let p = a
        .call_ok("post_message", json!({"channel": "dev", "body": "one"}))
        .await;
    assert_eq!(p["sender"], "solo");
    let b = Mcp::stateless(&s);
    b.call_ok("register", json!({"instance_id": "second"})).await;
    let why = a
        .call_err("post_message", json!({"channel": "dev", "body": "who?"}))
        .await;
    assert!(
        why.contains("no tokens") && why.contains("solo") && why.contains("second"),
        "{why}"
    );
    let p = a
        .call_ok(
            "post_message",
            json!({"channel": "dev", "sender": "solo", "body": "me"}),
        )
        .await;
    assert_eq!(p["sender"], "solo");
}

/// A host that restarts (a new MCP session, the old one never closed: Claude Code sends no
/// DELETE) takes its name back at once when its token proves it is the same client — a
/// participant's token — and the session it left behind can no longer act as it. The shared
/// token is everyone's, so there a live name stays its session's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_host_takes_its_name_back_at_once() {
    let s = Server::start_with(&["--token", "adm", "--participants", "coder:coder-tok"]);
    let old = Mcp::connect_with(&s, client_with_token("coder-tok")).await;
    old.call_ok("register", json!({"instance_id": "coder"})).await;
    old.call_ok("post_message", json!({"channel": "dev", "body": "before"}))
        .await;
    let new = Mcp::connect_with(&s, client_with_token("coder-tok")).await;
    new.call_ok("register", json!({"instance_id": "coder"})).await;
    let p = new
        .call_ok("post_message", json!({"channel": "dev", "body": "after"}))
        .await;
    assert_eq!(p["sender"], "coder");
    let gone = old
        .call_err("post_message", json!({"channel": "dev", "body": "stale"}))
        .await;
    assert!(gone.contains("another session"), "{gone}");
    // The shared token: another session's live name is not taken.
    let a = Mcp::connect_with(&s, client_with_token("adm")).await;
    a.call_ok("register", json!({"instance_id": "w1"})).await;
    let b = Mcp::connect_with(&s, client_with_token("adm")).await;
    let refused = b.call_err("register", json!({"instance_id": "w1"})).await;
    assert!(refused.contains("in use"), "{refused}");
}

/// On a relay without tokens nothing proves a restarted host is the one that left its name
/// behind, so docs/mcp.md tells such a host to send the same `X-Crosstalk-Session` on every
/// run: its new MCP session is then the same session to the relay, and takes its name back
/// at once, while a client without it is still refused the live name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenless_host_with_a_stable_session_header_takes_its_name_back() {
    let s = Server::start();
    let with_header = || {
        common::builder()
            .default_headers(
                [("x-crosstalk-session".parse().unwrap(), "host-7-secret".parse().unwrap())]
                    .into_iter()
                    .collect(),
            )
            .build()
            .unwrap()
    };
    let first = Mcp::connect_with(&s, with_header()).await;
    first.call_ok("register", json!({"instance_id": "h1"})).await;
    let again = Mcp::connect_with(&s, with_header()).await;
    again.call_ok("register", json!({"instance_id": "h1"})).await;
    let p = again
        .call_ok("post_message", json!({"channel": "dev", "body": "back"}))
        .await;
    assert_eq!(p["sender"], "h1");
    let stranger = Mcp::connect(&s).await;
    let refused = stranger.call_err("register", json!({"instance_id": "h1"})).await;
    assert!(refused.contains("in use"), "{refused}");
}
