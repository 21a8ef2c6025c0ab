//! Tool arguments, fuzzed: every tool `tools/list` offers gets a few hundred argument objects
//! built from its own input schema with values of every JSON type (and unknown names, and
//! huge and odd strings). Each call must come back as a tool result or a JSON-RPC error —
//! never a transport failure, never a crash — and the relay must keep serving afterwards.

use crate::common;
use common::mcp::Mcp;
use common::*;
use serde_json::{json, Map, Value};

/// A random JSON value of any type (nested at most twice).
fn value(rng: &mut Rng, depth: u32) -> Value {
    match rng.next() % if depth > 1 { 8 } else { 10 } {
        0 => Value::Null,
        1 => json!(rng.next().is_multiple_of(2)),
        2 => json!(rng.next() as i64),
        3 => json!(-((rng.next() % 1000) as i64)),
        4 => json!((rng.next() % 10_000) as f64 / 7.0),
        5 => json!(rng
            .pick(&["", " ", "dev", "DEV", "a/b", "../..", "\u{0}", "💥", "active", "parked", "human"])
            .to_string()),
        6 => json!("x".repeat((rng.next() % 70_000) as usize)),
        7 => json!(f64::MAX),
        8 => Value::Array((0..rng.next() % 3).map(|_| value(rng, depth + 1)).collect()),
        _ => {
            let mut o = Map::new();
            o.insert("k".into(), value(rng, depth + 1));
            Value::Object(o)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_argument_makes_a_tool_fail_badly() {
    let s = Server::start_with(&["--mcp-wait-cap-secs", "0"]);
    let m = Mcp::connect(&s).await;
    let tools = m.ok("tools/list", Value::Null).await["tools"]
        .as_array()
        .unwrap()
        .clone();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut calls = 0;
    for tool in &tools {
        let name = tool["name"].as_str().unwrap();
        let props: Vec<String> = tool["inputSchema"]["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        for _ in 0..25 {
            let mut args = Map::new();
            for p in &props {
                if !rng.next().is_multiple_of(3) {
                    args.insert(p.clone(), value(&mut rng, 0));
                }
            }
            if rng.next().is_multiple_of(5) {
                args.insert("not_an_argument".into(), value(&mut rng, 0));
            }
            // Waits and asks are capped at 0 s by the flag above: every call returns at once.
            let a = m
                .request(
                    "tools/call",
                    json!({"name": name, "arguments": Value::Object(args.clone())}),
                )
                .await;
            assert_eq!(a.status, 200, "{name} {args:?}: HTTP {}", a.status);
            let ok = a.message.get("result").is_some_and(Value::is_object) || a.message.get("error").is_some();
            assert!(ok, "{name} {args:?}: {}", a.message);
            calls += 1;
        }
    }
    assert!(calls >= 20 * 25);
    let (status, health) = get_json(&client(), &s.url("/healthz")).await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")), "{health}");
}
