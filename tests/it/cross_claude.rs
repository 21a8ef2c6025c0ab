//! The cross-claude face at `/cc`: cross-claude-mcp's REST routes and shapes field by field,
//! its auth forms, its 15 MCP tools and prompt, its bugs not copied, and one conversation
//! between a crosstalk-mcp agent (`/mcp`), a cross-claude agent (`/cc/mcp`) and a ChatGPT-style
//! REST client (`/cc/api`) on the same channel.

use crate::common;

use common::mcp::Mcp;
use common::{client, client_with_token, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const TOKEN: &str = "cc-s3cret";

async fn get(http: &reqwest::Client, s: &Server, path: &str) -> (u16, Value) {
    let r = http.get(s.url(path)).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn post(http: &reqwest::Client, s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = http.post(s.url(path)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
    k.sort();
    k
}

#[tokio::test]
async fn rest_routes_answer_cross_claudes_shapes() {
    let s = Server::start_with(&["--token", TOKEN]);
    let http = client_with_token(TOKEN);

    let (st, reg) = post(
        &http,
        &s,
        "/cc/api/register",
        json!({"instance_id": "gpt-1", "description": "a GPT"}),
    )
    .await;
    assert_eq!(st, 200, "{reg}");
    assert_eq!(reg["ok"], true);
    assert_eq!(reg["instance_id"], "gpt-1");

    // `channel` defaults to general, `message_type` to message.
    let (st, sent) = post(
        &http,
        &s,
        "/cc/api/messages",
        json!({"sender": "gpt-1", "content": "hello"}),
    )
    .await;
    assert_eq!(st, 200, "{sent}");
    assert_eq!(keys(&sent), ["channel", "id", "message_type", "ok"]);
    assert_eq!(
        (sent["ok"].clone(), sent["channel"].clone()),
        (json!(true), json!("general"))
    );
    assert_eq!(sent["message_type"], "message");
    let first = sent["id"].as_u64().unwrap();

    let mut ids = vec![first];
    for (i, ty) in ["request", "status", "response", "done"].iter().enumerate() {
        let body = json!({"channel": "general", "sender": "gpt-1", "content": format!("m{i}"), "message_type": ty,
            "in_reply_to": first});
        let (st, sent) = post(&http, &s, "/cc/api/messages", body).await;
        assert_eq!(st, 200, "{sent}");
        assert_eq!(sent["message_type"], *ty);
        ids.push(sent["id"].as_u64().unwrap());
    }

    // Without after_id: the newest `limit`, in id order.
    let (st, page) = get(&http, &s, "/cc/api/messages/general?limit=2").await;
    assert_eq!(st, 200, "{page}");
    assert_eq!(keys(&page), ["last_id", "messages"]);
    let got: Vec<u64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_u64().unwrap())
        .collect();
    assert_eq!(got, ids[3..], "{page}");
    assert_eq!(page["last_id"], ids[4]);
    let m = &page["messages"][1];
    for field in [
        "id",
        "channel",
        "sender",
        "content",
        "message_type",
        "in_reply_to",
        "created_at",
    ] {
        assert!(m.get(field).is_some(), "message lacks {field}: {m}");
    }
    assert_eq!(
        (m["content"].clone(), m["in_reply_to"].clone()),
        (json!("m3"), json!(first))
    );
    // Timestamps carry their zone.
    let at = m["created_at"].as_str().unwrap();
    assert!(at.ends_with('Z') || at.ends_with("+00:00"), "{at}");

    // With after_id: what follows it, oldest first.
    let (_, page) = get(&http, &s, &format!("/cc/api/messages/general?after_id={}", ids[2])).await;
    let got: Vec<u64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_u64().unwrap())
        .collect();
    assert_eq!(got, ids[3..]);
    // Nothing after it: last_id is null, as cross-claude answers.
    let (_, page) = get(&http, &s, &format!("/cc/api/messages/general?after_id={}", ids[4])).await;
    assert_eq!(page, json!({"messages": [], "last_id": null}));

    let (st, thread) = get(&http, &s, &format!("/cc/api/messages/general/{first}/replies")).await;
    assert_eq!(st, 200, "{thread}");
    assert_eq!(keys(&thread), ["parent", "replies"]);
    assert_eq!(thread["parent"]["id"], first);
    assert_eq!(thread["parent"]["reply_count"], 4);
    assert_eq!(thread["replies"].as_array().unwrap().len(), 4);

    let (st, created) = post(
        &http,
        &s,
        "/cc/api/channels",
        json!({"name": "auth-review", "description": "login tests"}),
    )
    .await;
    assert_eq!(st, 200, "{created}");
    assert_eq!(created, json!({"ok": true, "channel": "auth-review"}));
    let (_, list) = get(&http, &s, "/cc/api/channels").await;
    let general = list["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "general")
        .unwrap_or_else(|| panic!("{list}"))
        .clone();
    assert_eq!(general["message_count"], 5, "{general}");
    assert_eq!(general["active_senders"], "gpt-1", "{general}");
    assert!(general["last_message_at"].is_string(), "{general}");
    // Channels with messages first, then the empty ones.
    assert_eq!(list["channels"][0]["name"], "general", "{list}");
    let (_, found) = get(&http, &s, "/cc/api/channels/search?q=login").await;
    assert_eq!(found["channels"][0]["name"], "auth-review", "{found}");
    assert_eq!(found["channels"][0]["description"], "login tests", "{found}");
    assert_eq!(found["channels"][0]["message_count"], 0, "{found}");
    let (_, inst) = get(&http, &s, "/cc/api/instances").await;
    assert_eq!(inst["instances"][0]["instance_id"], "gpt-1", "{inst}");
    let (_, hits) = get(&http, &s, "/cc/api/search?q=m3&limit=5").await;
    assert_eq!(hits["messages"][0]["content"], "m3", "{hits}");

    let (st, shared) = post(
        &http,
        &s,
        "/cc/api/data",
        json!({"key": "q1-report", "content": "big table", "sender": "gpt-1", "description": "Q1"}),
    )
    .await;
    assert_eq!(st, 200, "{shared}");
    assert_eq!(
        (
            shared["ok"].clone(),
            shared["key"].clone(),
            shared["size_bytes"].clone()
        ),
        (json!(true), json!("q1-report"), json!(9)),
        "{shared}"
    );
    let (st, entry) = get(&http, &s, "/cc/api/data/q1-report").await;
    assert_eq!(st, 200);
    assert_eq!(entry["content"], "big table");
    assert_eq!(entry["created_by"], "gpt-1", "{entry}");
    assert_eq!(entry["description"], "Q1", "{entry}");
    assert!(entry["created_at"].is_string(), "{entry}");
    let (_, all) = get(&http, &s, "/cc/api/data").await;
    assert_eq!(all["items"][0]["key"], "q1-report", "{all}");
    assert_eq!(all["items"][0]["created_by"], "gpt-1", "{all}");
    assert_eq!(all["items"][0]["size_bytes"], 9, "{all}");
    let (st, missing) = get(&http, &s, "/cc/api/data/nope").await;
    assert_eq!(st, 404);
    assert!(missing["error"].is_string(), "{missing}");

    // JSON errors, never HTML, on a body that is not JSON.
    let r = http
        .post(s.url("/cc/api/messages"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"].is_string(), "{e}");

    // The document a ChatGPT action imports.
    let (st, doc) = get(&http, &s, "/cc/openapi.json").await;
    assert_eq!(st, 200);
    assert_eq!(doc["paths"]["/cc/api/messages"]["post"]["operationId"], "sendMessage");
}

#[tokio::test]
async fn their_auth_forms_work_on_cc_only() {
    let s = Server::start_with(&["--token", TOKEN]);
    let anon = client();
    let (st, _) = get(&anon, &s, "/cc/health").await;
    assert_eq!(st, 200, "/cc/health needs no token");
    assert_eq!(get(&anon, &s, "/cc/api/channels").await.0, 401);
    assert_eq!(
        get(&anon, &s, &format!("/cc/api/channels?api_key={TOKEN}")).await.0,
        200
    );
    assert_eq!(get(&anon, &s, "/cc/api/channels?api_key=wrong").await.0, 401);
    // Not on crosstalk's own routes.
    assert_eq!(get(&anon, &s, &format!("/api/channels?api_key={TOKEN}")).await.0, 401);
    // The Claude.ai connector URL form on /cc/mcp.
    let url = format!("/cc/mcp?api_key={TOKEN}");
    let m = Mcp::connect_at(&s, &url, client()).await;
    let tools = m.ok("tools/list", json!({})).await;
    assert_eq!(tools["tools"].as_array().unwrap().len(), 15);
}

#[tokio::test]
async fn the_sender_is_checked_against_the_registered_identity() {
    let s = Server::start_with(&["--token", TOKEN]);
    let http = client_with_token(TOKEN);
    let claude = Mcp::connect_at(&s, "/cc/mcp", client_with_token(TOKEN)).await;
    claude.call_ok("register", json!({"instance_id": "claude-dev"})).await;
    let (st, _) = post(&http, &s, "/cc/api/register", json!({"instance_id": "gpt-1"})).await;
    assert_eq!(st, 200);
    // The REST client cannot post as the MCP session's identity, nor the session as the REST one.
    let (st, e) = post(
        &http,
        &s,
        "/cc/api/messages",
        json!({"sender": "claude-dev", "content": "spoofed"}),
    )
    .await;
    assert_eq!(st, 403, "{e}");
    let err = claude
        .call_err("send_message", json!({"sender": "gpt-1", "content": "spoofed"}))
        .await;
    assert!(err.contains("gpt-1"), "{err}");
    // Each as itself is fine; the session's sender defaults to its registration.
    let sent = claude.call_ok("send_message", json!({"content": "mine"})).await;
    assert_eq!(sent["channel"], "general");
    let (_, page) = get(&http, &s, "/cc/api/messages/general").await;
    assert_eq!(page["messages"][0]["sender"], "claude-dev");
    assert_eq!(
        page["messages"].as_array().unwrap().len(),
        1,
        "a spoofed message was stored: {page}"
    );
}

#[tokio::test]
async fn one_relay_both_worlds_on_one_channel() {
    let s = Server::start_with(&["--token", TOKEN]);
    let http = client_with_token(TOKEN);
    // A crosstalk-mcp agent on /mcp, a cross-claude agent on /cc/mcp, a GPT on /cc/api.
    let ct = Mcp::connect_at(&s, "/mcp", client_with_token(TOKEN)).await;
    let cc = Mcp::connect_at(&s, "/cc/mcp", client_with_token(TOKEN)).await;
    ct.call_ok("register", json!({"instance_id": "builder"})).await;
    cc.call_ok("register", json!({"instance_id": "reviewer"})).await;
    post(&http, &s, "/cc/api/register", json!({"instance_id": "gpt"})).await;

    let asked = ct
        .call_ok(
            "post_message",
            json!({"channel": "auth", "body": "please review auth.py", "type": "request"}),
        )
        .await;
    let asked_id = asked["id"].as_u64().unwrap();
    // check_messages without after_id shows the newest, however often it is asked; with
    // after_id and instance_id, what is new for the instance.
    let first = cc.call_ok("check_messages", json!({"channel": "auth"})).await;
    assert_eq!(first["messages"][0]["content"], "please review auth.py", "{first}");
    assert_eq!(first["last_id"], asked_id);
    let again = cc.call_ok("check_messages", json!({"channel": "auth"})).await;
    assert_eq!(again["messages"], first["messages"], "{again}");
    let new = cc
        .call_ok(
            "check_messages",
            json!({"channel": "auth", "after_id": asked_id, "instance_id": "reviewer"}),
        )
        .await;
    assert_eq!(new["messages"], json!([]), "re-delivered: {new}");

    // The cross-claude agent waits (woken by the REST post, not by its own).
    let waiter = cc.clone_session();
    let wait = tokio::spawn(async move {
        waiter
            .call_ok(
                "wait_for_reply",
                json!({"channel": "auth", "after_id": asked_id, "max_wait_minutes": 0.5}),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (st, gpt) = post(&http, &s, "/cc/api/messages",
        json!({"channel": "auth", "sender": "gpt", "content": "tests attached", "message_type": "response", "in_reply_to": asked_id})).await;
    assert_eq!(st, 200, "{gpt}");
    let woke = wait.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(woke["outcome"], "messages", "{woke}");
    assert_eq!(woke["messages"][0]["content"], "tests attached");
    assert_eq!(woke["messages"][0]["sender"], "gpt");
    assert_eq!(woke["last_id"], gpt["id"]);

    // done ends a wait exactly as crosstalk's does.
    cc.call_ok(
        "send_message",
        json!({"channel": "auth", "content": "lgtm", "message_type": "done"}),
    )
    .await;
    let ended = ct
        .call_ok(
            "wait_for_message",
            json!({"channel": "auth", "since_id": gpt["id"], "timeout_s": 5}),
        )
        .await;
    assert_eq!(ended["outcome"], "done", "{ended}");

    // Everyone sees the same ordered channel, in their own shapes.
    let (_, ours) = get(&http, &s, "/api/channels/auth/messages").await;
    let (_, theirs) = get(&http, &s, "/cc/api/messages/auth").await;
    let a: Vec<&Value> = ours.as_array().unwrap().iter().map(|m| &m["id"]).collect();
    let b: Vec<&Value> = theirs["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["id"])
        .collect();
    assert_eq!(a, b);
    assert_eq!(a.len(), 3);
    assert_eq!(theirs["messages"][2]["message_type"], "done");

    // The prompt, in cross-claude's name.
    let p = cc
        .ok(
            "prompts/get",
            json!({"name": "cross-claude-protocol", "arguments": {"name": "reviewer"}}),
        )
        .await;
    let text = p["messages"][0]["content"]["text"].as_str().unwrap();
    assert!(
        text.contains("wait_for_reply") && text.contains("parked") && text.contains("done"),
        "{text}"
    );
}

/// Who has `channel`'s message `id` in their inbox, read or not yet (crosstalk's "read by").
async fn inbox_of(s: &Server, channel: &str, id: &Value) -> Vec<String> {
    let (_, r) = get(&client(), s, &format!("/api/channels/{channel}/messages/{id}/readers")).await;
    let mut who: Vec<String> = ["read_by", "not_yet"]
        .iter()
        .flat_map(|k| r[*k].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    who.sort();
    who
}

/// cross-claude's subscribe registers interest; crosstalk's also joins the channel to the
/// instance's inbox (crosstalk's own tools read it), and unsubscribe leaves it.
#[tokio::test]
async fn subscribe_joins_the_inbox_and_unsubscribe_leaves_it() {
    let s = Server::start();
    let cc = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    cc.call_ok("register", json!({"instance_id": "worker"})).await;
    let other = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    other
        .call_ok(
            "send_message",
            json!({"channel": "jobs", "sender": "boss", "content": "old"}),
        )
        .await;
    let r = cc.call("subscribe", json!({"channel": "jobs"})).await;
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("Subscribed \"worker\" to #jobs (interest registered;") && text.contains("IMPORTANT"),
        "{r}"
    );
    let new = other
        .call_ok(
            "send_message",
            json!({"channel": "jobs", "sender": "boss", "content": "new"}),
        )
        .await;
    assert!(inbox_of(&s, "jobs", &new["id"]).await.contains(&"worker".to_owned()));
    cc.call_ok("unsubscribe", json!({"channel": "jobs"})).await;
    let later = other
        .call_ok(
            "send_message",
            json!({"channel": "jobs", "sender": "boss", "content": "later"}),
        )
        .await;
    assert!(!inbox_of(&s, "jobs", &later["id"]).await.contains(&"worker".to_owned()));
}

#[tokio::test]
async fn subscribing_to_new_channels_counts_against_max_channels() {
    // Four: `general`, which the cross-claude face creates, and three more.
    let s = Server::start_with(&["--max-channels", "4"]);
    let cc = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    cc.call_ok("register", json!({"instance_id": "worker"})).await;
    for n in 0..3 {
        cc.call_ok("subscribe", json!({"channel": format!("made-up-{n}")}))
            .await;
    }
    let r = cc.call("subscribe", json!({"channel": "made-up-3"})).await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        r["content"][0]["text"].as_str().unwrap().contains("--max-channels"),
        "{r}"
    );
    // The channels it made are real: a post to one is in the subscriber's inbox.
    let boss = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    let hi = boss
        .call_ok(
            "send_message",
            json!({"channel": "made-up-1", "sender": "boss", "content": "hi"}),
        )
        .await;
    assert!(inbox_of(&s, "made-up-1", &hi["id"])
        .await
        .contains(&"worker".to_owned()));
}

#[tokio::test]
async fn find_channel_answers_every_match_or_at_most_limit() {
    let s = Server::start();
    let http = client();
    for (name, about) in [
        ("login-a", "sign-in"),
        ("login-b", "sign-in"),
        ("login-c", "sign-in"),
        ("billing", "invoices"),
    ] {
        let (st, created) = post(
            &http,
            &s,
            "/cc/api/channels",
            json!({"name": name, "description": about}),
        )
        .await;
        assert_eq!(st, 200, "{created}");
    }
    let names = |found: &Value| -> Vec<String> {
        let mut n: Vec<String> = found["channels"]
            .as_array()
            .unwrap_or_else(|| panic!("no channels: {found}"))
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect();
        n.sort();
        n
    };
    // Without a limit, every match, as cross-claude-mcp answers.
    let (st, found) = get(&http, &s, "/cc/api/channels/search?q=login").await;
    assert_eq!(st, 200, "{found}");
    assert_eq!(names(&found), ["login-a", "login-b", "login-c"]);
    // With one, at most that many of them.
    let (st, found) = get(&http, &s, "/cc/api/channels/search?q=login&limit=2").await;
    assert_eq!(st, 200, "{found}");
    let two = names(&found);
    assert_eq!(two.len(), 2, "{found}");
    assert!(two.iter().all(|n| n.starts_with("login-")), "{found}");
    let (_, found) = get(&http, &s, "/cc/api/channels/search?q=login&limit=10").await;
    assert_eq!(names(&found).len(), 3, "{found}");
    // A limit out of range is refused as on every listing.
    for bad in ["0", "10001", "many"] {
        let (st, e) = get(&http, &s, &format!("/cc/api/channels/search?q=login&limit={bad}")).await;
        assert_eq!(st, 400, "limit={bad}: {e}");
        assert_eq!(e["code"], "invalid_input", "{e}");
        assert!(e["error"].as_str().unwrap().contains("limit"), "{e}");
    }
}

/// The points where `/cc` differed from cross-claude-mcp when its own suites were run against
/// it, each as that server answers (its `rest-api.mjs`, `tools.mjs` and `db.mjs`).
#[tokio::test]
async fn rest_parity_with_cross_claude() {
    let s = Server::start();
    let http = client();

    // `general` exists on a fresh relay, with cross-claude's description and no messages.
    let (st, list) = get(&http, &s, "/cc/api/channels").await;
    assert_eq!(st, 200, "{list}");
    let general = &list["channels"][0];
    assert_eq!(general["name"], "general", "{list}");
    assert_eq!(
        general["description"], "Default channel for cross-instance communication",
        "{general}"
    );
    assert_eq!(general["message_count"], 0, "{general}");
    assert!(general["last_message_at"].is_null(), "{general}");
    assert_eq!(
        get(&http, &s, "/cc/api/messages/general").await.1,
        json!({"messages": [], "last_id": null})
    );

    // An unknown message_type is refused, naming the valid ones; nothing is stored.
    let (st, e) = post(
        &http,
        &s,
        "/cc/api/messages",
        json!({"sender": "a", "content": "x", "message_type": "chatter"}),
    )
    .await;
    assert_eq!(st, 400, "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("message_type must be one of: message, request, response, status, handoff, done"),
        "{e}"
    );
    assert_eq!(
        get(&http, &s, "/cc/api/messages/general").await.1["messages"],
        json!([])
    );

    // Channel names are normalized as cross-claude does; one that normalizes to nothing is refused.
    let (st, created) = post(&http, &s, "/cc/api/channels", json!({"name": "Release Plan"})).await;
    assert_eq!((st, created), (200, json!({"ok": true, "channel": "release-plan"})));
    let (st, sent) = post(
        &http,
        &s,
        "/cc/api/messages",
        json!({"channel": "Release  Plan!", "sender": "a", "content": "go"}),
    )
    .await;
    assert_eq!(st, 200, "{sent}");
    assert_eq!(sent["channel"], "release-plan");
    let (st, e) = post(&http, &s, "/cc/api/channels", json!({"name": "!!!"})).await;
    assert_eq!(st, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("Invalid channel name"), "{e}");

    // instance_id with after_id leaves out the reader's own messages; without after_id they stay.
    let mut ids = Vec::new();
    for (who, text) in [("alice", "a1"), ("bob", "b1"), ("alice", "a2"), ("bob", "b2")] {
        let (st, sent) = post(
            &http,
            &s,
            "/cc/api/messages",
            json!({"channel": "pair", "sender": who, "content": text}),
        )
        .await;
        assert_eq!(st, 200, "{sent}");
        ids.push(sent["id"].as_u64().unwrap());
    }
    let contents = |page: &Value| -> Vec<String> {
        page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, page) = get(&http, &s, "/cc/api/messages/pair?after_id=0&instance_id=alice").await;
    assert_eq!(contents(&page), ["b1", "b2"], "{page}");
    assert_eq!(page["last_id"], ids[3]);
    let (_, page) = get(
        &http,
        &s,
        &format!("/cc/api/messages/pair?after_id={}&instance_id=bob", ids[1]),
    )
    .await;
    assert_eq!(contents(&page), ["a2"], "{page}");
    assert_eq!(page["last_id"], ids[2]);
    let (_, page) = get(
        &http,
        &s,
        &format!("/cc/api/messages/pair?after_id={}&instance_id=alice", ids[2]),
    )
    .await;
    assert_eq!(contents(&page), ["b2"], "{page}");
    let (_, page) = get(
        &http,
        &s,
        &format!("/cc/api/messages/pair?after_id={}&instance_id=bob", ids[2]),
    )
    .await;
    assert_eq!(page, json!({"messages": [], "last_id": null}));
    let (_, page) = get(&http, &s, "/cc/api/messages/pair?instance_id=alice").await;
    assert_eq!(contents(&page), ["a1", "b1", "a2", "b2"], "{page}");
    // …and a query naming no reader gets everything.
    let (_, page) = get(&http, &s, "/cc/api/messages/pair?after_id=0").await;
    assert_eq!(contents(&page).len(), 4, "{page}");

    // `active_senders` names who posted, as cross-claude's GROUP_CONCAT does.
    let (_, list) = get(&http, &s, "/cc/api/channels").await;
    let pair = list["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "pair")
        .unwrap()
        .clone();
    assert_eq!(pair["active_senders"], "alice,bob", "{pair}");
    assert_eq!(pair["message_count"], 4, "{pair}");

    // Searches need q, as cross-claude's routes say (an empty one in its words).
    for path in ["/cc/api/search", "/cc/api/channels/search"] {
        let (st, e) = get(&http, &s, path).await;
        assert_eq!(st, 400, "{path}: {e}");
        assert!(e["error"].as_str().unwrap().contains("`q`"), "{e}");
        let (st, e) = get(&http, &s, &format!("{path}?q=")).await;
        assert_eq!(st, 400, "{path}: {e}");
        assert!(
            e["error"].as_str().unwrap().contains("q (query) parameter is required"),
            "{e}"
        );
    }
    // A shared entry that is not there: 404 naming the key.
    let (st, e) = get(&http, &s, "/cc/api/data/nope").await;
    assert_eq!(st, 404, "{e}");
    assert!(e["error"].as_str().unwrap().contains("nope"), "{e}");
}

#[tokio::test]
async fn tool_parity_with_cross_claude() {
    let s = Server::start();
    let m = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    let text = |r: &Value| r["content"][0]["text"].as_str().unwrap_or_default().to_owned();

    // One session registers two instances and speaks as either (no participant token binds it).
    m.call_ok("register", json!({"instance_id": "planner"})).await;
    m.call_ok("register", json!({"instance_id": "coder"})).await;
    let r = m
        .call(
            "send_message",
            json!({"sender": "planner", "content": "plan it", "message_type": "request"}),
        )
        .await;
    assert_eq!(r["isError"], false, "{r}");
    let first = r["structuredContent"]["id"].as_u64().unwrap();
    assert!(
        text(&r).starts_with(&format!("Message #{first} sent to #general as \"planner\" [request]")),
        "{r}"
    );
    let r = m
        .call(
            "send_message",
            json!({"sender": "coder", "content": "on it", "message_type": "response", "in_reply_to": first}),
        )
        .await;
    assert_eq!(r["isError"], false, "{r}");
    let reply = r["structuredContent"]["id"].as_u64().unwrap();
    // Another session cannot speak as either of them while they are live.
    let other = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    let err = other
        .call_err("send_message", json!({"sender": "coder", "content": "spoof"}))
        .await;
    assert!(err.contains("coder"), "{err}");
    // An unknown message_type is a tool error naming the valid ones.
    let err = m
        .call_err(
            "send_message",
            json!({"sender": "planner", "content": "x", "message_type": "note"}),
        )
        .await;
    assert!(
        err.contains("message, request, response, status, handoff, done"),
        "{err}"
    );

    // check_messages with instance_id leaves out the reader's own messages.
    let r = m
        .call(
            "check_messages",
            json!({"channel": "general", "instance_id": "planner", "after_id": 0}),
        )
        .await;
    let got = &r["structuredContent"]["messages"];
    assert_eq!(got.as_array().unwrap().len(), 1, "{r}");
    assert_eq!(got[0]["sender"], "coder", "{r}");
    assert!(text(&r).contains(&format!("Last message ID: {reply}")), "{r}");

    // A reply already waiting is returned at once, in cross-claude's form.
    let started = Instant::now();
    let r = m
        .call(
            "wait_for_reply",
            json!({"channel": "general", "instance_id": "planner", "after_id": first, "max_wait_minutes": 1}),
        )
        .await;
    assert!(started.elapsed() < Duration::from_secs(5), "{r}");
    assert_eq!(r["structuredContent"]["outcome"], "messages", "{r}");
    let t = text(&r);
    assert!(t.starts_with("1 new message(s) in #general:"), "{t}");
    assert!(t.contains(&format!("#{reply} [response] coder (")), "{t}");
    assert!(t.contains(&format!("(reply to #{first})")), "{t}");
    assert!(t.contains(&format!("Last message ID: {reply}")), "{t}");

    // list_instances shows every registered instance, offline ones too.
    let gone = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    gone.call_ok("register", json!({"instance_id": "retired"})).await;
    let r = gone
        .http
        .delete(&gone.url)
        .header("Mcp-Session-Id", gone.session.clone().unwrap())
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = m.call("list_instances", json!({})).await;
    let t = text(&r);
    assert!(t.starts_with("Registered instances:"), "{t}");
    for who in ["planner", "coder", "retired"] {
        assert!(t.contains(&format!("{who} [")), "{who} missing: {t}");
    }
    assert!(t.contains("retired [offline]"), "{t}");

    // list_channels in cross-claude's form, general among them.
    let r = m.call("list_channels", json!({})).await;
    assert!(text(&r).starts_with("Channels:\n#general - Default channel"), "{r}");
    assert!(text(&r).contains("[participants: coder,planner]"), "{r}");
    // find_channel takes `query`.
    let r = m.call("find_channel", json!({"query": "default"})).await;
    assert_eq!(r["structuredContent"]["channels"][0]["name"], "general", "{r}");
    // share_data takes cross-claude's `sender`.
    let r = m
        .call(
            "share_data",
            json!({"key": "plan", "content": "steps", "sender": "planner"}),
        )
        .await;
    assert_eq!(r["structuredContent"]["size_bytes"], 5, "{r}");
    assert!(text(&r).starts_with("Shared data stored as \"plan\""), "{r}");
    let r = m.call("get_shared_data", json!({"key": "plan"})).await;
    assert!(text(&r).contains("(by planner,"), "{r}");
    // get_replies with the message id alone, as cross-claude's tool takes it.
    let r = m.call("get_replies", json!({"message_id": first})).await;
    assert_eq!(r["isError"], false, "{r}");
    assert!(
        text(&r).starts_with(&format!("Original #{first} from planner: plan it")),
        "{r}"
    );
}

/// An MCP client of the cross-claude tools, over HTTP (`/cc/mcp`) or stdio (`crosstalk mcp
/// --tools cross-claude`): a tool call's whole result.
pub(crate) trait CcClient {
    async fn tool(&mut self, name: &str, args: Value) -> Value;
}

impl CcClient for Mcp {
    async fn tool(&mut self, name: &str, args: Value) -> Value {
        self.call(name, args).await
    }
}

/// What a cross-claude-mcp client reads: the text of a successful call.
async fn said(c: &mut impl CcClient, name: &str, args: Value) -> String {
    let r = c.tool(name, args.clone()).await;
    assert_eq!(r["isError"], false, "{name}({args}): {r}");
    r["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

/// `send_message`: its text, and the id the text names.
async fn sent(c: &mut impl CcClient, args: Value) -> (String, u64) {
    let t = said(c, "send_message", args).await;
    let id = t
        .strip_prefix("Message #")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no id in {t:?}"));
    (t, id)
}

/// A message block's head line as cross-claude writes it, up to its timestamp.
fn head(id: u64, kind: &str, sender: &str) -> String {
    format!("#{id} [{kind}] {sender} (")
}

/// Whether the relays the tests start are nodes of a cluster, where ids come from the shared
/// log's positions (unique and increasing, not 1, 2, 3).
fn on_a_cluster() -> bool {
    std::env::var_os("CROSSTALK_TEST_NATS").is_some()
}

/// A cross-claude-mcp user's session on a fresh relay, asserting on the text lines its
/// clients parse, exactly as cross-claude-mcp writes them (its tools.mjs): ids from 1 (on a
/// relay of its own), `Message #N sent to`, `Last message ID: N`, `(reply to #N)`, `[N
/// replies]`, `Registered instances:`, and which calls move a read position.
pub(crate) async fn a_cross_claude_users_session(alice: &mut impl CcClient, bob: &mut impl CcClient) {
    let t = said(
        alice,
        "register",
        json!({"instance_id": "alice", "description": "writes the plan"}),
    )
    .await;
    assert!(t.starts_with("Registered as \"alice\"."), "{t}");
    assert!(t.contains("\n\nNo active channels yet."), "{t}");
    assert!(t.contains("\n\nNo other instances online."), "{t}");
    assert!(
        t.ends_with("Do NOT default to 'general' if a more specific channel exists."),
        "{t}"
    );
    let t = said(bob, "register", json!({"instance_id": "bob"})).await;
    assert!(t.contains("\n\nOnline instances:\n  alice - writes the plan"), "{t}");

    // Creating a channel takes no id: the first message is #1.
    let t = said(
        alice,
        "create_channel",
        json!({"name": "release-plan", "description": "the 2.0 release"}),
    )
    .await;
    assert_eq!(t, "Channel #release-plan created. Purpose: the 2.0 release");
    // Creating it again leaves its description as it is.
    said(alice, "create_channel", json!({"name": "release-plan"})).await;
    let (t, first) = sent(alice, json!({"sender": "alice", "content": "first"})).await;
    assert_eq!(t, format!("Message #{first} sent to #general as \"alice\" [message]"));
    let (t, reply) = sent(
        bob,
        json!({"sender": "bob", "content": "reply", "message_type": "response", "in_reply_to": first}),
    )
    .await;
    assert_eq!(
        t,
        format!(
            "Message #{reply} sent to #general as \"bob\" [response]\n\n\u{1f4a1} If this is your final reply, send a \
             follow-up \"done\" message so the other instance stops polling."
        )
    );
    let (t, plan) = sent(
        alice,
        json!({"channel": "release-plan", "sender": "alice", "content": "plan", "message_type": "request"}),
    )
    .await;
    assert_eq!(
        t,
        format!("Message #{plan} sent to #release-plan as \"alice\" [request]")
    );
    if !on_a_cluster() {
        assert_eq!((first, reply, plan), (1, 2, 3), "only messages take ids, from 1");
    }
    let t = said(alice, "list_channels", json!({})).await;
    assert!(t.contains("#release-plan - the 2.0 release (1 msgs, last: "), "{t}");

    // Without after_id: the newest `limit` (default 20), oldest first, own included, and no
    // read position changes it.
    let newest = said(bob, "check_messages", json!({"channel": "general", "limit": 1})).await;
    assert!(
        newest.starts_with(&format!(
            "1 message(s) in #general:\n\n{}",
            head(reply, "response", "bob")
        )),
        "{newest}"
    );
    assert!(
        newest.contains(&format!(
            " (reply to #{first}):\nreply\n\n---\nLast message ID: {reply} (use as after_id to poll for new \
             messages)\nReminder: "
        )),
        "{newest}"
    );
    assert_eq!(
        said(bob, "check_messages", json!({"channel": "general", "limit": 1})).await,
        newest
    );
    let t = said(alice, "check_messages", json!({})).await;
    assert!(
        t.starts_with(&format!(
            "2 message(s) in #general:\n\n{}",
            head(first, "message", "alice")
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!(") [1 replies]:\nfirst\n\n---\n\n#{reply} [response] bob (")),
        "{t}"
    );
    assert!(t.contains(&format!("Last message ID: {reply} ")), "{t}");
    // With after_id: everything after it, own included.
    let t = said(alice, "check_messages", json!({"after_id": 0})).await;
    assert!(t.starts_with("2 message(s) in #general:"), "{t}");
    // With after_id and instance_id: the others' messages after it, and the read position
    // moves to the last one shown.
    let t = said(alice, "check_messages", json!({"after_id": 0, "instance_id": "alice"})).await;
    assert!(
        t.starts_with(&format!(
            "1 message(s) in #general:\n\n{}",
            head(reply, "response", "bob")
        )),
        "{t}"
    );
    assert!(t.contains(&format!("Last message ID: {reply} ")), "{t}");
    let t = said(
        alice,
        "check_messages",
        json!({"after_id": reply, "instance_id": "alice"}),
    )
    .await;
    assert_eq!(t, "No new messages in #general.");
    let t = said(alice, "check_messages", json!({"channel": "empty-one"})).await;
    assert_eq!(t, "No messages in #empty-one.");
    // A message that crossed alice's own send (lower id than hers) is still hers to see when
    // she polls from her own send's id: the read starts no later than what she was shown.
    let (_, crossing) = sent(bob, json!({"sender": "bob", "content": "crossing"})).await;
    let (_, mine) = sent(alice, json!({"sender": "alice", "content": "mine"})).await;
    let t = said(
        alice,
        "check_messages",
        json!({"after_id": mine, "instance_id": "alice"}),
    )
    .await;
    assert!(
        t.starts_with(&format!(
            "1 message(s) in #general:\n\n{}",
            head(crossing, "message", "bob")
        )),
        "{t}"
    );
    assert!(t.contains(&format!("Last message ID: {crossing} ")), "{t}");

    // get_replies: the thread, no notes on the replies.
    let t = said(alice, "get_replies", json!({"message_id": first})).await;
    assert!(
        t.starts_with(&format!(
            "Original #{first} from alice: first\n\n1 replies:\n\n{}",
            head(reply, "response", "bob")
        )),
        "{t}"
    );
    assert!(t.ends_with("):\nreply"), "{t}");
    // search_messages, in cross-claude's form.
    let t = said(alice, "search_messages", json!({"query": "crossing"})).await;
    assert!(
        t.starts_with(&format!(
            "1 result(s) for \"crossing\":\n\n#{crossing} [#general] bob ("
        )),
        "{t}"
    );
    // wait_for_reply with cross-claude's own arguments, on messages already there: at once.
    let started = Instant::now();
    let t = said(
        alice,
        "wait_for_reply",
        json!({"channel": "general", "after_id": first, "instance_id": "alice", "timeout_seconds": 5,
               "poll_interval_seconds": 1, "persistent": false}),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(3), "{t}");
    assert!(
        t.starts_with(&format!(
            "2 new message(s) in #general:\n\n{}",
            head(reply, "response", "bob")
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            " (reply to #{first}):\nreply\n\n---\n\n#{crossing} [message] bob ("
        )),
        "{t}"
    );
    assert!(t.ends_with(&format!("\n\n---\nLast message ID: {crossing}")), "{t}");
    // Nothing new: a non-persistent wait ends after its timeout_seconds.
    let t = said(
        alice,
        "wait_for_reply",
        json!({"channel": "general", "after_id": mine, "instance_id": "alice", "timeout_seconds": 1, "persistent": false}),
    )
    .await;
    assert!(t.starts_with("No new messages in #general after waiting 1s."), "{t}");
    // A message just before a done is handed with it, not dropped.
    sent(bob, json!({"sender": "bob", "content": "last words"})).await;
    let (_, bye) = sent(bob, json!({"sender": "bob", "content": "bye", "message_type": "done"})).await;
    let t = said(
        alice,
        "wait_for_reply",
        json!({"channel": "general", "after_id": mine, "instance_id": "alice", "max_wait_minutes": 1}),
    )
    .await;
    assert!(t.starts_with("2 new message(s) in #general:"), "{t}");
    assert!(
        t.contains(&format!(":\nlast words\n\n---\n\n#{bye} [done] bob (")),
        "{t}"
    );
    assert!(
        t.ends_with(&format!(
            "Last message ID: {bye}\n\nThe other instance signaled DONE -- no further replies expected."
        )),
        "{t}"
    );

    let t = said(alice, "list_instances", json!({})).await;
    assert!(t.starts_with("Registered instances:\n"), "{t}");
    assert!(
        t.contains("alice [online] - last seen: ") && t.contains("bob [online] - last seen: "),
        "{t}"
    );
    let t = said(alice, "find_channel", json!({"query": "release"})).await;
    assert!(
        t.starts_with("1 channel(s) matching \"release\":\n#release-plan - the 2.0 release (1 msgs, last: "),
        "{t}"
    );
    assert!(!t.contains("participants"), "{t}");
    // A new channel whose name is near an existing one's is made, with a note naming it.
    let t = said(alice, "create_channel", json!({"name": "release-plans"})).await;
    assert_eq!(
        t,
        "Channel #release-plans created.\nNote: similar channels exist: #release-plan"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_claude_users_session_reads_as_on_cross_claude() {
    let s = Server::start();
    let mut alice = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    let mut bob = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    a_cross_claude_users_session(&mut alice, &mut bob).await;
    // REST reads move no read position: alice's is still where her last read left it.
    let (_, page) = get(&client(), &s, "/cc/api/messages/general?after_id=0&instance_id=alice").await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 4, "{page}");
    let (_, page) = get(&client(), &s, "/cc/api/messages/general").await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 6, "the newest 20: {page}");
}
