//! A raw MCP client over reqwest: JSON-RPC on `POST /mcp`, answers read from the JSON body
//! or the event stream, the session id kept between calls. Raw on purpose: the tests check
//! the wire, not a client library's view of it.

use super::{Server, SseReader};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub const LEGACY: &str = "2025-11-25";
pub const MODERN: &str = "2026-07-28";

pub struct Mcp {
    pub http: reqwest::Client,
    pub url: String,
    pub session: Option<String>,
    pub version: &'static str,
    next_id: AtomicU64,
}

/// One JSON-RPC answer and the notifications that came before it on the same stream.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub message: Value,
    pub notifications: Vec<Value>,
}

impl Mcp {
    /// Another handle on the same MCP session (for concurrent calls); ids stay distinct.
    pub fn clone_session(&self) -> Mcp {
        Mcp {
            http: self.http.clone(),
            url: self.url.clone(),
            session: self.session.clone(),
            version: self.version,
            next_id: AtomicU64::new(self.next_id.load(std::sync::atomic::Ordering::Relaxed) + 1_000_000),
        }
    }

    /// A 2025-11-25 session: `initialize`, then `notifications/initialized`.
    pub async fn connect(s: &Server) -> Mcp {
        Self::connect_with(s, super::client()).await
    }

    /// Like [`connect`](Self::connect), with a client of the caller's (default headers, …).
    pub async fn connect_with(s: &Server, http: reqwest::Client) -> Mcp {
        Self::connect_at(s, "/mcp", http).await
    }

    /// A 2025-11-25 session on the MCP endpoint at `path` (`/mcp`, `/cc/mcp`).
    pub async fn connect_at(s: &Server, path: &str, http: reqwest::Client) -> Mcp {
        Self::connect_url(s.url(path), http).await
    }

    /// A 2025-11-25 session on the MCP endpoint at `url` (a relay behind a load balancer).
    pub async fn connect_url(url: String, http: reqwest::Client) -> Mcp {
        let mut m = Mcp {
            http,
            url,
            session: None,
            version: LEGACY,
            next_id: AtomicU64::new(1),
        };
        let r = m
            .post_raw(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": LEGACY, "capabilities": {},
                "clientInfo": {"name": "crosstalk-tests", "version": "0"}}}))
            .send()
            .await
            .expect("initialize");
        assert_eq!(r.status(), 200, "initialize");
        let sid = r
            .headers()
            .get("mcp-session-id")
            .expect("Mcp-Session-Id on initialize")
            .to_str()
            .unwrap()
            .to_owned();
        let a = read_answer(r, 0).await;
        assert_eq!(a.message["result"]["protocolVersion"], LEGACY, "{:?}", a.message);
        m.session = Some(sid);
        let r = m
            .post_raw(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        m
    }

    /// A 2026-07-28 client: no handshake, every request carries its own `_meta`.
    pub fn stateless(s: &Server) -> Mcp {
        Mcp::unconnected(s, MODERN)
    }

    /// No session yet, on the endpoint at `path` with the caller's client: to send the
    /// `initialize` itself.
    pub fn unconnected_at(s: &Server, path: &str, http: reqwest::Client) -> Mcp {
        Mcp {
            http,
            url: s.url(path),
            session: None,
            version: LEGACY,
            next_id: AtomicU64::new(1),
        }
    }

    /// A 2026-07-28 client of the MCP endpoint at `url` (a relay behind a load balancer).
    pub fn stateless_url(url: String) -> Mcp {
        Self::stateless_url_with(url, super::client())
    }

    /// Like [`stateless_url`](Self::stateless_url), with a client of the caller's (a token).
    pub fn stateless_url_with(url: String, http: reqwest::Client) -> Mcp {
        Mcp {
            http,
            url,
            session: None,
            version: MODERN,
            next_id: AtomicU64::new(1),
        }
    }

    pub fn unconnected(s: &Server, version: &'static str) -> Mcp {
        Mcp {
            http: super::client(),
            url: s.url("/mcp"),
            session: None,
            version,
            next_id: AtomicU64::new(1),
        }
    }

    pub fn post_raw(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .json(body);
        if let Some(sid) = &self.session {
            req = req
                .header("Mcp-Session-Id", sid)
                .header("MCP-Protocol-Version", self.version);
        }
        if self.version == MODERN {
            // SEP-2243: the method (and the tool, prompt or resource it names) in headers.
            req = req.header("MCP-Protocol-Version", MODERN);
            if let Some(method) = body["method"].as_str() {
                req = req.header("Mcp-Method", method);
                let p = &body["params"];
                if let Some(name) = p["name"].as_str().or(p["uri"].as_str()).or(p["taskId"].as_str()) {
                    req = req.header("Mcp-Name", name);
                }
            }
        }
        req
    }

    /// The JSON-RPC request body for `method`, with the per-request `_meta` a 2026-07-28
    /// client sends.
    pub fn request_body(&self, id: u64, method: &str, params: Value) -> Value {
        let mut params = if params.is_null() { json!({}) } else { params };
        if self.version == MODERN {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "crosstalk-tests", "version": "0"}
            });
        }
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a request and returns its answer, whatever the HTTP status.
    pub async fn request(&self, method: &str, params: Value) -> Answer {
        let id = self.next_id();
        let r = self
            .post_raw(&self.request_body(id, method, params))
            .send()
            .await
            .expect("post");
        read_answer(r, id).await
    }

    /// A request that must succeed: its `result`.
    pub async fn ok(&self, method: &str, params: Value) -> Value {
        let a = self.request(method, params).await;
        assert_eq!(a.status, 200, "{method}: {:?}", a.message);
        assert!(a.message.get("error").is_none(), "{method}: {}", a.message);
        a.message["result"].clone()
    }

    /// `tools/call`: the `CallToolResult`.
    pub async fn call(&self, tool: &str, args: Value) -> Value {
        self.ok("tools/call", json!({"name": tool, "arguments": args})).await
    }

    /// A tool call that must succeed: its structured content.
    pub async fn call_ok(&self, tool: &str, args: Value) -> Value {
        let r = self.call(tool, args.clone()).await;
        assert_eq!(r["isError"], false, "{tool}({args}) failed: {r}");
        assert!(r["content"][0]["text"].as_str().is_some_and(|t| !t.is_empty()), "{r}");
        r["structuredContent"].clone()
    }

    /// A tool call that must fail as a tool error: its text.
    pub async fn call_err(&self, tool: &str, args: Value) -> String {
        let r = self.call(tool, args.clone()).await;
        assert_eq!(r["isError"], true, "{tool}({args}) should fail: {r}");
        r["content"][0]["text"].as_str().expect("error text").to_owned()
    }

    /// Opens the session's GET stream for server notifications.
    pub async fn listen(&self) -> SseReader {
        let r = self
            .http
            .get(&self.url)
            .header("Accept", "text/event-stream")
            .header("Mcp-Session-Id", self.session.as_deref().expect("a session"))
            .header("MCP-Protocol-Version", self.version)
            .timeout(Duration::from_secs(600))
            .send()
            .await
            .expect("GET stream");
        assert_eq!(r.status(), 200);
        SseReader::from_response(r)
    }
}

/// Reads the answer to request `id` from a JSON body or an event stream.
pub async fn read_answer(r: reqwest::Response, id: u64) -> Answer {
    let status = r.status().as_u16();
    let is_sse = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_sse {
        let text = r.text().await.expect("body");
        let message = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "non_json_body": text }));
        return Answer {
            status,
            message,
            notifications: Vec::new(),
        };
    }
    let mut sse = SseReader::from_response(r);
    let mut notifications = Vec::new();
    loop {
        let ev = sse
            .next(Duration::from_secs(90))
            .await
            .unwrap_or_else(|| panic!("the stream ended without an answer to request {id}"));
        if ev.data.trim().is_empty() {
            continue; // a priming event
        }
        let v: Value = serde_json::from_str(&ev.data).expect("JSON-RPC message");
        if v.get("id") == Some(&json!(id)) && (v.get("result").is_some() || v.get("error").is_some()) {
            return Answer {
                status,
                message: v,
                notifications,
            };
        }
        notifications.push(v);
    }
}

/// The next JSON-RPC message on a notification stream, skipping priming events.
pub async fn next_notification(sse: &mut SseReader, timeout: Duration) -> Option<Value> {
    loop {
        let ev = sse.next(timeout).await?;
        if ev.data.trim().is_empty() {
            continue;
        }
        return Some(serde_json::from_str(&ev.data).expect("JSON-RPC message"));
    }
}
