//! Workload 6: MCP `tools/call post_message` throughput over streamable HTTP, one MCP session
//! per connection: `initialize` → `Mcp-Session-Id` → `notifications/initialized` → calls.
//! A server whose `/mcp` answers 404 has no MCP face yet: the workload is skipped, not failed.
//! Answers may come as `application/json` or as a `text/event-stream` holding the response.

use super::{body_text, Done, Plan, Record};
use crate::client::{Conn, Reply};
use crate::stats::summarize;
use crate::target::Server;
use anyhow::{bail, Context as _};
use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub const CHANNEL: &str = "bench-mcp";
const PATH: &str = "/mcp";
const PROTOCOL_VERSION: &str = "2025-03-26";
const ACCEPT: &str = "application/json, text/event-stream";

/// One initialized MCP session on its own connection.
pub struct Session {
    conn: Conn,
    /// `Mcp-Session-Id` from the server; a stateless server may send none.
    id: Option<String>,
    next_request: u64,
}

async fn send(conn: &mut Conn, session: Option<&str>, msg: &Value) -> anyhow::Result<Reply> {
    let mut headers = vec![("accept", ACCEPT)];
    if let Some(id) = session {
        headers.push(("mcp-session-id", id));
        headers.push(("mcp-protocol-version", PROTOCOL_VERSION));
    }
    conn.request(Method::POST, PATH, &headers, Bytes::from(msg.to_string()))
        .await
}

/// The JSON-RPC response in an answer, whichever of the two content types it came as.
fn response_of(reply: &Reply, want_id: u64) -> anyhow::Result<Value> {
    let is_sse = reply
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let candidates: Vec<Value> = if is_sse {
        let text = std::str::from_utf8(&reply.body)?;
        text.split("\n\n")
            .filter_map(|ev| {
                let data: Vec<&str> = ev
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:").map(|d| d.strip_prefix(' ').unwrap_or(d)))
                    .collect();
                (!data.is_empty()).then(|| serde_json::from_str(&data.join("\n")).ok())?
            })
            .collect()
    } else {
        vec![serde_json::from_slice(&reply.body).context("MCP answer is not JSON")?]
    };
    candidates
        .into_iter()
        .find(|m| m["id"].as_u64() == Some(want_id))
        .with_context(|| format!("no JSON-RPC response with id {want_id} in the answer"))
}

impl Session {
    /// `None` when the server has no `/mcp` (404).
    pub async fn open(addr: SocketAddr) -> anyhow::Result<Option<Session>> {
        let mut conn = Conn::connect(addr).await?;
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "crosstalk-bench", "version": env!("CARGO_PKG_VERSION")}
            }
        });
        let reply = send(&mut conn, None, &init).await?;
        if reply.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !reply.status.is_success() {
            bail!(
                "initialize answered {}: {}",
                reply.status,
                String::from_utf8_lossy(&reply.body)
            );
        }
        let id = reply
            .headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let res = response_of(&reply, 0)?;
        if res["result"]["protocolVersion"].as_str().is_none() {
            bail!("initialize result has no protocolVersion: {res}");
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let ack = send(&mut conn, id.as_deref(), &note).await?;
        if !ack.status.is_success() {
            bail!("notifications/initialized answered {}", ack.status);
        }
        Ok(Some(Session {
            conn,
            id,
            next_request: 1,
        }))
    }

    async fn post_message(&mut self, sender: usize) -> anyhow::Result<()> {
        self.call(
            "post_message",
            json!({
                "channel": CHANNEL,
                "sender": format!("bench-{sender:02}"),
                "type": "note",
                "body": body_text(sender),
            }),
        )
        .await
        .map(drop)
    }

    /// `tools/call`: the tool's `structuredContent`, or (for a server that answers in text
    /// only, as crosstalk-mcp does) its first text item parsed as JSON; an error if it failed.
    pub async fn call(&mut self, tool: &str, arguments: Value) -> anyhow::Result<Value> {
        let rid = self.next_request;
        self.next_request += 1;
        let call = json!({
            "jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}
        });
        let reply = send(&mut self.conn, self.id.as_deref(), &call).await?;
        if !reply.status.is_success() {
            bail!("tools/call answered {}", reply.status);
        }
        let res = response_of(&reply, rid)?;
        if res.get("error").is_some() || res["result"]["isError"].as_bool() == Some(true) {
            bail!("tools/call {tool} failed: {res}");
        }
        let result = &res["result"];
        if !result["structuredContent"].is_null() {
            return Ok(result["structuredContent"].clone());
        }
        // crosstalk-mcp answers a list as one JSON text item per element.
        let items: Vec<Value> = result["content"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter_map(|i| i["text"].as_str())
                    .filter_map(|t| serde_json::from_str(t).ok())
                    .collect()
            })
            .unwrap_or_default();
        Ok(match items.as_slice() {
            [one] if one.is_array() => one.clone(),
            _ => Value::Array(items),
        })
    }
}

pub async fn mcp_post(plan: &Plan, server: &Server, rec: &mut Record) -> anyhow::Result<Done> {
    let Some(probe) = Session::open(server.addr).await? else {
        return Ok(Done::Skipped("not available: /mcp answered 404".into()));
    };
    drop(probe);
    let start = Instant::now() + Duration::from_millis(50);
    let measure_from = start + plan.warmup;
    let end = measure_from + plan.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..plan.connections {
        let addr = server.addr;
        tasks.spawn(async move {
            let mut s = Session::open(addr).await?.context("/mcp vanished")?;
            tokio::time::sleep_until(start.into()).await;
            let mut lat = Vec::new();
            while Instant::now() < end {
                let sent = Instant::now();
                s.post_message(c).await?;
                let done = Instant::now();
                if done >= measure_from && done <= end {
                    lat.push(done - sent);
                }
            }
            anyhow::Ok(lat)
        });
    }
    let mut lat = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        lat.extend(joined??);
    }
    if lat.is_empty() {
        bail!("no MCP call completed in the measured window");
    }
    let s = summarize(&lat);
    rec.set("mcp_post_per_s", s.count as f64 / plan.duration.as_secs_f64());
    rec.set("mcp_post_p99_ms", s.p99_ms);
    Ok(Done::Ran)
}

/// MCP wake: a session blocks in `tools/call wait_for_message`; 20 ms later a REST client
/// posts; the time from just before the POST is sent until the tool's answer is read.
pub async fn mcp_wake(plan: &Plan, server: &Server, rec: &mut Record) -> anyhow::Result<Done> {
    let Some(mut session) = Session::open(server.addr).await? else {
        return Ok(Done::Skipped("not available: /mcp answered 404".into()));
    };
    let path = "/api/channels/bench-mcp-wake/messages";
    let mut poster = Conn::connect(server.addr).await?;
    let first = poster.post_json(path, super::message_json(0)).await?;
    let mut last = crate::client::first_id(&first.body).context("post names no id")?;
    let deadline = Instant::now() + plan.wake_budget;
    let mut samples = Vec::new();
    while samples.len() < plan.wake_rounds && Instant::now() < deadline {
        let args = json!({"channel": "bench-mcp-wake", "since_id": last, "timeout_s": 10});
        let parked = tokio::spawn(async move {
            let got = session.call("wait_for_message", args).await;
            (got, Instant::now(), session)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sent = Instant::now();
        let posted = poster.post_json(path, super::message_json(1)).await?;
        let post_took = sent.elapsed();
        let id = crate::client::first_id(&posted.body).context("post names no id")?;
        let (got, woke, s) = parked.await?;
        session = s;
        let got = got?;
        if got.as_array().is_some_and(Vec::is_empty) && post_took >= Duration::from_secs(9) {
            // Seen with crosstalk-mcp: its wait_for_message is a blocking call inside the
            // server's event loop, so nothing else is served until the wait times out.
            return Ok(Done::Skipped(format!(
                "not measurable: a POST sent while an MCP wait_for_message was blocked took {:.1} s, \
                 i.e. was served only after the wait timed out (the wait blocks the server)",
                post_took.as_secs_f64()
            )));
        }
        // crosstalk answers {messages: [...]}; crosstalk-mcp a bare list, as text.
        let first = got.get("messages").unwrap_or(&got)[0]["id"].as_u64();
        if first != Some(id) {
            bail!("wait_for_message answered {got}; expected message {id}");
        }
        samples.push(woke - sent);
        last = id;
    }
    if samples.is_empty() {
        bail!("no MCP wake round finished within {:?}", plan.wake_budget);
    }
    let s = summarize(&samples);
    rec.set("mcp_wake_p50_ms", s.p50_ms);
    rec.set("mcp_wake_p99_ms", s.p99_ms);
    rec.note(format!("MCP wake: {} rounds, max {:.2} ms", s.count, s.max_ms));
    Ok(Done::Ran)
}
