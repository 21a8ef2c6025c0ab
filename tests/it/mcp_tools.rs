//! The MCP tools over a real 2025-11-25 session: each tool's happy path, its bad arguments
//! (tool errors, never protocol errors or crashes), the wait's wake-up, timeout, cap,
//! cancellation and disconnect, and the size of `tools/list`.

use crate::common;
use common::mcp::*;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The core set, in its order.
const CORE: [&str; 5] = [
    "post_message",
    "get_messages",
    "wait_for_message",
    "register",
    "ask_human",
];

fn names_and_size(list: &Value) -> (Vec<String>, usize) {
    let names = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    (names, serde_json::to_vec(list).unwrap().len())
}

#[tokio::test]
async fn a_lean_tool_list_by_query_header_or_flag() {
    let s = Server::start();
    // By the URL's query, for a 2025-11-25 session and a 2026-07-28 client.
    let m = Mcp::connect_at(&s, "/mcp?tools=core", client()).await;
    let (names, size) = names_and_size(&m.ok("tools/list", Value::Null).await);
    println!("core tools/list: {size} bytes of JSON");
    assert_eq!(names, CORE);
    assert!(size <= 5_000, "{size} bytes");
    // The others are not listed, but stay callable by name.
    let found = m.call_ok("list_channels", json!({})).await;
    assert!(found["channels"].is_array(), "{found}");
    let mut modern = Mcp::stateless(&s);
    modern.url = s.url("/mcp?tools=core");
    assert_eq!(names_and_size(&modern.ok("tools/list", Value::Null).await).0, CORE);
    // By the header.
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-crosstalk-tools", "core".parse().unwrap());
    let http = reqwest::Client::builder().default_headers(headers).build().unwrap();
    let m = Mcp::connect_with(&s, http).await;
    assert_eq!(names_and_size(&m.ok("tools/list", Value::Null).await).0, CORE);
    // A request's choice beats the server's; a bad one is a clear error.
    let m = Mcp::connect_at(&s, "/mcp?tools=full", client()).await;
    let full = names_and_size(&m.ok("tools/list", Value::Null).await).0;
    assert!(
        full.len() > CORE.len() && full.contains(&"reserve".to_owned()),
        "{full:?}"
    );
    // A choice that is neither is refused from the start: the session is never made.
    let m = Mcp::unconnected_at(&s, "/mcp?tools=most", client());
    let a = m
        .request(
            "initialize",
            json!({"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        )
        .await;
    assert_eq!(
        (a.status, &a.message["error"]["code"]),
        (400, &json!(-32602)),
        "{:?}",
        a.message
    );
    assert!(a.message["error"]["message"].as_str().unwrap().contains("core or full"));
    // cross-claude's face keeps its own set whatever is asked.
    let cc = Mcp::connect_at(&s, "/cc/mcp?tools=core", client()).await;
    assert!(names_and_size(&cc.ok("tools/list", Value::Null).await)
        .0
        .contains(&"send_message".to_owned()));

    // By the server's flag (and the query still chooses).
    let lean = Server::start_with(&["--tools", "core"]);
    let m = Mcp::connect(&lean).await;
    assert_eq!(names_and_size(&m.ok("tools/list", Value::Null).await).0, CORE);
    let m = Mcp::connect_at(&lean, "/mcp?tools=full", client()).await;
    assert_eq!(names_and_size(&m.ok("tools/list", Value::Null).await).0.len(), 22);
}

#[tokio::test]
async fn tools_list_is_small_and_complete() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    let list = m.ok("tools/list", Value::Null).await;
    let size = serde_json::to_vec(&list).unwrap().len();
    println!("tools/list: {size} bytes of JSON");
    // Output schemas keep only their fields' names (typed, the list was far over budget).
    let budget = crosstalk::mcp::tools::TOOLS_LIST_BUDGET;
    assert!(
        size <= budget,
        "tools/list is {size} bytes, over its budget of {budget}"
    );
    let tools = list["tools"].as_array().unwrap();
    let names: Vec<_> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "post_message",
            "get_messages",
            "wait_for_message",
            "list_channels",
            "register",
            "list_instances",
            "check_messages",
            "create_channel",
            "find_channel",
            "get_replies",
            "get_readers",
            "search_messages",
            "start_session",
            "end_session",
            "get_session",
            "get_directives",
            "ask_human",
            "share_data",
            "get_shared_data",
            "list_shared_data",
            "delete_shared_data",
            "reserve"
        ]
    );
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert_eq!(t["outputSchema"]["type"], "object", "{t}");
        assert!(t["description"].as_str().unwrap().len() > 40, "{t}");
    }
    let post = &tools[0]["inputSchema"];
    let mut args: Vec<_> = post["properties"].as_object().unwrap().keys().cloned().collect();
    args.sort();
    assert_eq!(
        args,
        [
            "body",
            "channel",
            "idempotency_key",
            "recipient",
            "reply_to",
            "sender",
            "session_id",
            "side",
            "status",
            "type"
        ]
    );
}

#[tokio::test]
async fn post_get_and_list_share_the_rest_relay() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    let c = client();
    let posted = m
        .call_ok(
            "post_message",
            json!({"channel": "Dev", "sender": "alice", "type": "question", "body": "ready?",
                   "recipient": "bob", "session_id": "t1", "status": "open", "side": "x"}),
        )
        .await;
    assert_eq!(posted["channel"], "dev");
    assert_eq!(
        posted["type"], "question",
        "a type is kept as written, as crosstalk-mcp keeps it"
    );
    assert_eq!(posted["recipient"], "bob");
    let id = posted["id"].as_u64().unwrap();
    // The same message through REST, field for field.
    assert_eq!(messages(&c, &s, "dev", 0).await, vec![posted.clone()]);
    // And a REST post shows up through MCP.
    let rest = post(&c, &s, "dev", msg("bob", "yes")).await;
    let page = m.call_ok("get_messages", json!({"channel": "dev"})).await;
    assert_eq!(page["messages"], json!([posted, rest]));
    assert_eq!(page["next_since_id"], rest["id"]);
    assert_eq!(page["has_more"], false);
    let page = m
        .call_ok("get_messages", json!({"channel": "dev", "since_id": id, "limit": 5}))
        .await;
    assert_eq!(page["messages"], json!([rest]));
    let page = m.call_ok("get_messages", json!({"channel": "dev", "limit": 1})).await;
    assert_eq!(page["has_more"], true);
    assert_eq!(page["next_since_id"], id);
    let empty = m.call_ok("get_messages", json!({"channel": "nobody-here"})).await;
    assert_eq!(empty["messages"], json!([]));

    post(&c, &s, "other", msg("carol", "x")).await;
    let list = m.call_ok("list_channels", json!({})).await;
    let names: Vec<_> = list["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["channel"].clone())
        .collect();
    assert_eq!(names, [json!("other"), json!("dev")], "most recently active first");
    assert_eq!(list["channels"][1]["count"], 2);
}

#[tokio::test]
async fn bad_arguments_are_tool_errors() {
    let s = Server::start_with(&["--max-body-bytes", "100"]);
    let m = Mcp::connect(&s).await;
    let cases = [
        ("post_message", json!({"sender": "a", "body": "b"}), "channel"),
        ("post_message", json!({"channel": "dev", "body": "b"}), "sender"),
        ("post_message", json!({"channel": "dev", "sender": "a"}), "body"),
        (
            "post_message",
            json!({"channel": "dev", "sender": " ", "body": "b"}),
            "sender",
        ),
        (
            "post_message",
            json!({"channel": "dev", "sender": "a", "body": ""}),
            "body",
        ),
        (
            "post_message",
            json!({"channel": "a/b", "sender": "a", "body": "b"}),
            "channel",
        ),
        (
            "post_message",
            json!({"channel": "dev", "sender": "a", "body": "x".repeat(101)}),
            "body",
        ),
        (
            "post_message",
            json!({"channel": "dev", "sender": "a", "body": "b", "reply_to": -1}),
            "reply_to",
        ),
        (
            "post_message",
            json!({"channel": "dev", "sender": "a", "body": "b", "chanel": "x"}),
            "chanel",
        ),
        ("get_messages", json!({"channel": "dev", "since_id": "x"}), "since_id"),
        ("get_messages", json!({"channel": "dev", "limit": 0}), "limit"),
        ("get_messages", json!({"channel": "dev", "limit": 100000}), "limit"),
        ("get_messages", json!({}), "channel"),
        (
            "wait_for_message",
            json!({"channel": "dev", "timeout_s": -1}),
            "timeout_s",
        ),
        (
            "wait_for_message",
            json!({"channel": "dev", "timeout_s": "soon"}),
            "timeout_s",
        ),
        ("wait_for_message", json!({"channel": ""}), "channel"),
        ("list_channels", json!({"channel": "dev"}), "channel"),
    ];
    for (tool, args, mentions) in cases {
        let text = m.call_err(tool, args.clone()).await;
        assert!(
            text.contains(mentions),
            "{tool}({args}): {text:?} does not mention {mentions}"
        );
    }
    // Nothing was stored by any of them, and the server is still serving.
    assert_eq!(m.call_ok("list_channels", json!({})).await["channels"], json!([]));
    // An unknown tool is a protocol error that names the real ones.
    let a = m.request("tools/call", json!({"name": "nope", "arguments": {}})).await;
    assert_eq!(a.message["error"]["code"], -32602, "{:?}", a.message);
    assert!(a.message["error"]["message"]
        .as_str()
        .unwrap()
        .contains("wait_for_message"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_wakes_on_a_reply_and_says_how_to_continue() {
    let s = Server::start();
    let a = Mcp::connect(&s).await;
    let b = Mcp::connect(&s).await;
    let q = a
        .call_ok("post_message", json!({"channel": "dev", "sender": "a", "body": "ping"}))
        .await;
    let since = q["id"].as_u64().unwrap();
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let r = a
            .call(
                "wait_for_message",
                json!({"channel": "dev", "since_id": since, "timeout_s": 20}),
            )
            .await;
        (r, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reply = b
        .call_ok(
            "post_message",
            json!({"channel": "dev", "sender": "b", "type": "answer", "body": "pong", "reply_to": since}),
        )
        .await;
    let (r, waited) = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(5),
        "woke on the post, not the timeout: {waited:?}"
    );
    assert_eq!(r["structuredContent"]["messages"], json!([reply]));
    assert_eq!(r["structuredContent"]["timed_out"], false);
    assert_eq!(r["structuredContent"]["next_since_id"], reply["id"]);
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("pong") && text.contains(&format!("next since_id: {}", reply["id"])),
        "{text}"
    );
}

#[tokio::test]
async fn wait_times_out_with_an_empty_list_and_a_hint() {
    let s = Server::start_with(&["--mcp-wait-cap-secs", "1"]);
    let m = Mcp::connect(&s).await;
    let started = Instant::now();
    // Asks for 300 s: the cap (1 s) wins.
    let r = m
        .call(
            "wait_for_message",
            json!({"channel": "quiet", "since_id": 7, "timeout_s": 300}),
        )
        .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(r["isError"], false);
    assert_eq!(r["structuredContent"]["messages"], json!([]));
    assert_eq!(r["structuredContent"]["timed_out"], true);
    assert_eq!(r["structuredContent"]["next_since_id"], 7);
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("[]") && text.contains("since_id=7"), "{text}");
    // An absurd timeout is capped too, never a crash (a Duration of 1e300 s does not exist).
    for (tool, args) in [
        ("wait_for_message", json!({"channel": "quiet", "timeout_s": 1e300})),
        (
            "ask_human",
            json!({"channel": "quiet", "sender": "a", "question": "?", "timeout_s": 1e300}),
        ),
    ] {
        let started = Instant::now();
        let r = m.call(tool, args).await;
        assert_eq!(r["isError"], false, "{tool}: {r}");
        assert!(started.elapsed() < Duration::from_secs(10), "{tool} was capped");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_ends_at_once() {
    let s = Server::start();
    let c = client();
    let m = std::sync::Arc::new(Mcp::connect(&s).await);
    let id = m.next_id();
    let body = m.request_body(
        id,
        "tools/call",
        json!({"name": "wait_for_message",
        "arguments": {"channel": "dev", "timeout_s": 50}}),
    );
    let req = m.post_raw(&body);
    // Keeps reading the answer stream, so only the cancellation can end the wait.
    let pending = tokio::spawn(async move { req.send().await?.text().await });
    until_waits(&c, &s.url(""), 1).await;
    let r = m
        .post_raw(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "test"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let started = Instant::now();
    until_waits(&c, &s.url(""), 0).await;
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    pending.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_soon_after_its_client_disconnects() {
    let s = Server::start();
    let c = client();
    let m = Mcp::connect(&s).await;
    let body = m.request_body(
        m.next_id(),
        "tools/call",
        json!({"name": "wait_for_message",
        "arguments": {"channel": "dev", "timeout_s": 50}}),
    );
    let req = m.post_raw(&body);
    let pending = tokio::spawn(async move { req.send().await?.text().await });
    until_waits(&c, &s.url(""), 1).await;
    // The client process "dies": its connection closes without a word.
    pending.abort();
    drop(m);
    let started = Instant::now();
    until_waits(&c, &s.url(""), 0).await;
    assert!(started.elapsed() < Duration::from_secs(9), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_resumed_with_last_event_id_still_gets_its_answer() {
    let s = Server::start();
    let c = client();
    let m = Mcp::connect(&s).await;
    let id = m.next_id();
    let body = m.request_body(
        id,
        "tools/call",
        json!({"name": "wait_for_message",
        "arguments": {"channel": "dev", "timeout_s": 30}}),
    );
    let r = m.post_raw(&body).send().await.unwrap();
    let mut first = SseReader::from_response(r);
    let priming = first.next(Duration::from_secs(5)).await.expect("a priming event");
    let event_id = priming.id.expect("the priming event carries an event id");
    // The network drops; the client reconnects with Last-Event-ID inside the grace period.
    drop(first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = m
        .http
        .get(&m.url)
        .header("Accept", "text/event-stream")
        .header("Mcp-Session-Id", m.session.as_deref().unwrap())
        .header("MCP-Protocol-Version", LEGACY)
        .header("Last-Event-ID", &event_id)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut resumed = SseReader::from_response(r);
    // Past the grace period: the resumed call must still be alive.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let posted = post(&c, &s, "dev", msg("b", "late but there")).await;
    loop {
        let n = next_notification(&mut resumed, Duration::from_secs(10))
            .await
            .expect("the answer on the resumed stream");
        if n["id"] == json!(id) {
            assert_eq!(n["result"]["structuredContent"]["messages"], json!([posted]), "{n}");
            break;
        }
    }
}

/// A tool's text says what this relay does: share_data's size cap follows --max-shared-bytes.
#[tokio::test]
async fn tool_texts_follow_the_relays_settings() {
    let describe = |list: &Value| {
        list["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "share_data")
            .map(|t| t["description"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    assert!(describe(&m.ok("tools/list", Value::Null).await).contains("up to 1 MiB"));
    let small = Server::start_with(&["--max-shared-bytes", "524288"]);
    let m = Mcp::connect(&small).await;
    let text = describe(&m.ok("tools/list", Value::Null).await);
    assert!(text.contains("up to 512 KiB") && !text.contains('{'), "{text}");
}
