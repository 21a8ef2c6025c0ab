//! Channels as MCP resources (list, read, templates), push on commit to subscribers of both
//! protocol generations, and the `crosstalk-protocol` prompt.

use crate::common;
use common::mcp::*;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test]
async fn channels_are_listed_and_read_as_resources() {
    let s = Server::start();
    let c = client();
    let m = Mcp::connect(&s).await;
    assert_eq!(m.ok("resources/list", Value::Null).await["resources"], json!([]));
    let mut posted = Vec::new();
    for i in 0..60 {
        posted.push(post(&c, &s, "dev", msg("a", &format!("m{i}"))).await);
        // Interleave another channel so ids have gaps.
        post(&c, &s, "ops", msg("b", "x")).await;
    }
    let list = m.ok("resources/list", Value::Null).await;
    let uris: Vec<_> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].clone())
        .collect();
    assert_eq!(
        uris,
        [json!("crosstalk://channels/ops"), json!("crosstalk://channels/dev")]
    );
    let read = m.ok("resources/read", json!({"uri": "crosstalk://channels/dev"})).await;
    let contents = &read["contents"][0];
    assert_eq!(contents["uri"], "crosstalk://channels/dev");
    assert_eq!(contents["mimeType"], "application/json");
    let body: Value = serde_json::from_str(contents["text"].as_str().unwrap()).unwrap();
    assert_eq!(body["messages"], json!(posted[10..]), "the newest 50, oldest first");
    assert_eq!(body["last_id"], posted[59]["id"]);
    let who: Vec<_> = body["participants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["participant_id"].clone(), p["activity"].clone()))
        .collect();
    assert!(
        who.contains(&(json!(posted[59]["sender"].clone()), json!("posted"))),
        "presence is part of the channel resource: {who:?}"
    );
    // A valid channel with nothing in it reads as empty; a bad URI is not found.
    let empty = m
        .ok("resources/read", json!({"uri": "crosstalk://channels/later"}))
        .await;
    assert!(empty["contents"][0]["text"]
        .as_str()
        .unwrap()
        .contains("\"messages\":[]"));
    let bad = m
        .request("resources/read", json!({"uri": "crosstalk://channels/a b"}))
        .await;
    assert_eq!(bad.message["error"]["code"], -32002, "{:?}", bad.message);
    let templates = m.ok("resources/templates/list", Value::Null).await;
    assert_eq!(
        templates["resourceTemplates"][0]["uriTemplate"],
        "crosstalk://channels/{name}"
    );
    // Listing and reading are operations, run and counted like every face's.
    let metrics = c.get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for op in ["list_channels", "read_channel"] {
        let line = format!("crosstalk_operations_total{{face=\"mcp\",operation=\"{op}\",outcome=\"ok\"}}");
        assert!(metrics.contains(&line), "{line} missing from /metrics");
    }
}

/// A channel's resource says how many messages it holds, in words that read right for one
/// (it said "1 messages"), as `list_channels`' text does.
#[tokio::test]
async fn a_channel_resource_counts_its_messages_in_words() {
    let s = Server::start();
    let c = client();
    let m = Mcp::connect(&s).await;
    let one = post(&c, &s, "solo", msg("a", "only")).await;
    post(&c, &s, "pair", msg("a", "first")).await;
    let two = post(&c, &s, "pair", msg("a", "second")).await;
    let list = m.ok("resources/list", Value::Null).await;
    let described = |name: &str| {
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["description"].clone())
    };
    assert_eq!(
        described("solo"),
        Some(json!(format!("1 message, last id {}", one["id"])))
    );
    assert_eq!(
        described("pair"),
        Some(json!(format!("2 messages, last id {}", two["id"])))
    );
    let channels = m.call("list_channels", json!({})).await;
    let text = channels["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("solo: 1 message, last"), "{text}");
    assert!(text.contains("pair: 2 messages, last"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_are_told_when_a_channel_changes() {
    let s = Server::start();
    let c = client();
    let m = Mcp::connect(&s).await;
    let mut stream = m.listen().await;
    m.ok("resources/subscribe", json!({"uri": "crosstalk://channels/dev"}))
        .await;
    post(&c, &s, "other", msg("a", "not this one")).await;
    post(&c, &s, "dev", msg("a", "this one")).await;
    let n = next_notification(&mut stream, Duration::from_secs(5))
        .await
        .expect("a notification");
    assert_eq!(n["method"], "notifications/resources/updated", "{n}");
    assert_eq!(n["params"]["uri"], "crosstalk://channels/dev");
    // After unsubscribing, posts are silent.
    m.ok("resources/unsubscribe", json!({"uri": "crosstalk://channels/dev"}))
        .await;
    post(&c, &s, "dev", msg("a", "quiet")).await;
    assert!(next_notification(&mut stream, Duration::from_millis(800))
        .await
        .is_none());
    let bad = m.request("resources/subscribe", json!({"uri": "nope://x"})).await;
    assert_eq!(bad.message["error"]["code"], -32002, "{:?}", bad.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_listener_is_told_when_a_channel_changes() {
    let s = Server::start();
    let c = client();
    let m = Mcp::stateless(&s);
    let r = m
        .post_raw(&m.request_body(
            5,
            "subscriptions/listen",
            json!({"notifications": {"resourceSubscriptions": ["crosstalk://channels/dev", "bogus://x"]}}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = SseReader::from_response(r);
    let ack = next_notification(&mut stream, Duration::from_secs(5))
        .await
        .expect("acknowledged");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!(["crosstalk://channels/dev"])
    );
    post(&c, &s, "dev", msg("a", "hello")).await;
    let n = next_notification(&mut stream, Duration::from_secs(5))
        .await
        .expect("a notification");
    assert_eq!(n["method"], "notifications/resources/updated", "{n}");
    assert_eq!(n["params"]["uri"], "crosstalk://channels/dev");
}

#[tokio::test]
async fn the_protocol_prompt_teaches_the_conversation() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    let list = m.ok("prompts/list", Value::Null).await;
    assert_eq!(list["prompts"][0]["name"], "crosstalk-protocol");
    let p = m
        .ok(
            "prompts/get",
            json!({"name": "crosstalk-protocol", "arguments": {"channel": "dev", "name": "alice"}}),
        )
        .await;
    let text = p["messages"][0]["content"]["text"].as_str().unwrap();
    for needle in [
        "wait_for_message(channel=\"dev\"",
        "sender=\"alice\"",
        "since_id",
        "done",
    ] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    let unknown = m.request("prompts/get", json!({"name": "nope"})).await;
    assert_eq!(unknown.message["error"]["code"], -32602);
}
