//! The coordination tools over MCP: identity bound to the MCP session, waits that skip your
//! own messages, human Q&A, sessions, directives, threads, inbox, shared data and search —
//! the same actors as REST, checked against each other.

use crate::common;
use common::mcp::*;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_registers_once_and_keeps_its_identity() {
    let s = Server::start();
    let alice = Mcp::connect(&s).await;
    let other = Mcp::connect(&s).await;
    let r = alice
        .call_ok("register", json!({"instance_id": "alice", "description": "reviewer"}))
        .await;
    assert_eq!(
        (r["instance_id"].as_str(), r["status"].as_str()),
        (Some("alice"), Some("online"))
    );
    let err = other.call_err("register", json!({"instance_id": "alice"})).await;
    assert!(err.contains("in use"), "{err}");
    let err = alice
        .call_err(
            "post_message",
            json!({"channel": "dev", "sender": "bob", "body": "forged"}),
        )
        .await;
    assert!(err.contains("registered as \"alice\""), "{err}");
    let err = other
        .call_err(
            "post_message",
            json!({"channel": "dev", "sender": "alice", "body": "forged"}),
        )
        .await;
    assert!(err.contains("another session"), "{err}");
    alice
        .call_ok(
            "post_message",
            json!({"channel": "dev", "sender": "alice", "body": "real"}),
        )
        .await;
    let list = other.call_ok("list_instances", json!({})).await;
    assert_eq!(list["instances"][0]["instance_id"], "alice");
    let c = client();
    assert_eq!(messages(&c, &s, "dev", 0).await.len(), 1, "nothing forged was stored");
    let err = other
        .call_err("register", json!({"instance_id": "x", "kind": "robot"}))
        .await;
    assert!(err.contains("kind"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_registered_agents_converse_and_a_human_answers_a_question() {
    let s = Server::start();
    let a = Mcp::connect(&s).await;
    let b = Mcp::connect(&s).await;
    a.call_ok("register", json!({"instance_id": "builder"})).await;
    b.call_ok("register", json!({"instance_id": "reviewer"})).await;
    a.call_ok(
        "create_channel",
        json!({"name": "auth-dev", "description": "Auth rewrite"}),
    )
    .await;
    let found = b.call_ok("find_channel", json!({"query": "rewrite"})).await;
    assert_eq!(found["channels"][0]["channel"], "auth-dev");

    let req = a
        .call_ok(
            "post_message",
            json!({"channel": "auth-dev", "sender": "builder", "type": "request", "body": "review PR 7"}),
        )
        .await;
    // The builder's wait skips its own request and wakes on the reviewer's reply.
    let waiting = {
        let since = req["id"].as_u64().unwrap() - 1;
        let a2 = a.clone_session();
        tokio::spawn(async move {
            a2.call_ok(
                "wait_for_message",
                json!({"channel": "auth-dev", "since_id": since, "timeout_s": 20}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reply = b
        .call_ok("post_message", json!({"channel": "auth-dev", "sender": "reviewer", "type": "response", "body": "LGTM", "reply_to": req["id"]}))
        .await;
    let woke = waiting.await.unwrap();
    assert_eq!(woke["messages"], json!([reply]));
    assert_eq!(woke["outcome"], "messages");
    let thread = b
        .call_ok("get_replies", json!({"channel": "auth-dev", "message_id": req["id"]}))
        .await;
    assert_eq!(thread["messages"], json!([reply]));

    // The reviewer's inbox has the request, once.
    let inbox = b.call_ok("check_messages", json!({})).await;
    let bodies: Vec<_> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].clone())
        .collect();
    assert_eq!(bodies, [json!("review PR 7")]);
    assert_eq!(b.call_ok("check_messages", json!({})).await["messages"], json!([]));

    // ask_human blocks until a human answers over REST.
    let asking = {
        let a2 = a.clone_session();
        tokio::spawn(async move {
            a2.call_ok(
                "ask_human",
                json!({"channel": "auth-dev", "question": "ship it?", "timeout_s": 20}),
            )
            .await
        })
    };
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    let qid = loop {
        let d = b.call_ok("get_directives", json!({"channel": "auth-dev"})).await;
        if let Some(q) = d["open_questions"].as_array().and_then(|a| a.first()) {
            assert_eq!(q["recipient"], "any-human");
            break q["id"].clone();
        }
        assert!(Instant::now() < deadline, "the question never showed up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    post(
        &c,
        &s,
        "auth-dev",
        json!({"sender": "lead", "type": "ANSWER", "body": "yes", "reply_to": qid}),
    )
    .await;
    let answered = asking.await.unwrap();
    assert_eq!(
        (answered["answered"].as_bool(), answered["answer"]["body"].as_str()),
        (Some(true), Some("yes"))
    );
    // No --humans on this relay: nobody is vouched for as a person.
    assert_eq!(answered["answered_by"], json!({"id": "lead", "person": false}));
    assert_eq!(
        answered["question"]["status"], "answered",
        "the question as of its answer, consistent with answered: true"
    );
    let (_, q) = get_json(&c, &s.url(&format!("/api/channels/auth-dev/messages/{qid}"))).await;
    assert_eq!(q["status"], "answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_shared_data_and_search_over_mcp() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    m.call_ok("register", json!({"instance_id": "writer"})).await;
    let st = m
        .call_ok("start_session", json!({"channel": "pair", "max_turns": 2}))
        .await;
    assert_eq!(st["active"], true);
    for body in ["one", "two"] {
        m.call_ok(
            "post_message",
            json!({"channel": "pair", "sender": "writer", "body": body}),
        )
        .await;
    }
    // Ended at max_turns: crosstalk-mcp's answer for a channel without an active session.
    let st = m.call_ok("get_session", json!({"channel": "pair"})).await;
    assert_eq!(st["status"], "no_active_session", "{st}");
    m.call_ok("start_session", json!({"channel": "pair"})).await;
    let st = m.call_ok("end_session", json!({"channel": "pair"})).await;
    assert_eq!(
        (st["status"].as_str(), st["channel"].as_str()),
        (Some("ended"), Some("pair"))
    );
    let st = m.call_ok("end_session", json!({"channel": "pair"})).await;
    assert_eq!(st["status"], "no_active_session");

    let v = m
        .call_ok(
            "share_data",
            json!({"key": "plan", "content": "step 1", "description": "the plan"}),
        )
        .await;
    assert_eq!((v["version"].as_u64(), v["owner"].as_str()), (Some(1), Some("writer")));
    let other = Mcp::connect(&s).await;
    let err = other
        .call_err(
            "share_data",
            json!({"key": "plan", "content": "hijack", "owner": "intruder"}),
        )
        .await;
    assert!(err.contains("only its owner"), "{err}");
    assert_eq!(
        other.call_ok("get_shared_data", json!({"key": "plan"})).await["content"],
        "step 1"
    );
    assert_eq!(
        other.call_ok("list_shared_data", json!({})).await["entries"][0]["key"],
        "plan"
    );
    assert!(other
        .call_err("get_shared_data", json!({"key": "nope"}))
        .await
        .contains("no shared data"));
    m.call_ok("delete_shared_data", json!({"key": "plan"})).await;
    assert_eq!(other.call_ok("list_shared_data", json!({})).await["entries"], json!([]));

    m.call_ok(
        "post_message",
        json!({"channel": "notes", "sender": "writer", "body": "Flaky TEST in the auth module"}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let hits = other.call_ok("search_messages", json!({"query": "auth test"})).await;
        if hits["messages"].as_array().unwrap().len() == 1 {
            assert_eq!(hits["messages"][0]["channel"], "notes");
            break;
        }
        assert!(Instant::now() < deadline, "search never found the message");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = other.call_err("search_messages", json!({"query": "!"})).await;
    assert!(err.contains("searchable"), "{err}");
    let err = other
        .call_err("start_session", json!({"channel": "pair", "max_turns": 0}))
        .await;
    assert!(err.contains("max_turns"), "{err}");
    let err = other
        .call_err("get_replies", json!({"channel": "notes", "message_id": 424242}))
        .await;
    assert!(err.contains("no message"), "{err}");
    let err = other.call_err("check_messages", json!({})).await;
    assert!(err.contains("register"), "{err}");
}

/// `ask_human` says who answered and whether the relay knows them to be a person (a
/// participant named in `--humans`): an agent's answer is not passed off as a human's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_human_says_who_answered_and_whether_a_person_did() {
    let s = Server::start_with(&[
        "--token",
        "admin",
        "--participants",
        "asker:asker-tok,bot:bot-tok,dana:dana-tok",
        "--humans",
        "dana",
    ]);
    let asker = Mcp::connect_with(&s, client_with_token("asker-tok")).await;
    // bot is an agent that registered as kind human: the caller's own word, so it is not
    // vouched for. It answers over MCP, dana (one of --humans) over REST.
    let bot = Mcp::connect_with(&s, client_with_token("bot-tok")).await;
    bot.call_ok("register", json!({"instance_id": "bot", "kind": "human"}))
        .await;
    for (who, person, says) in [
        ("bot", false, "(not known to be a person)"),
        ("dana", true, "(a person)"),
    ] {
        let asking = {
            let a = asker.clone_session();
            tokio::spawn(async move {
                a.call(
                    "ask_human",
                    json!({"channel": "q", "question": "ship it?", "timeout_s": 20}),
                )
                .await
            })
        };
        let c = client_with_token("dana-tok");
        let deadline = Instant::now() + Duration::from_secs(10);
        let qid = loop {
            let (_, d) = get_json(&c, &s.url("/api/channels/q/directives")).await;
            if let Some(q) = d.as_array().and_then(|a| a.first()) {
                break q["id"].clone();
            }
            assert!(Instant::now() < deadline, "the question never showed up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let answer = json!({"channel": "q", "sender": who, "type": "ANSWER", "body": "yes", "reply_to": qid});
        if person {
            post(&c, &s, "q", answer).await;
        } else {
            bot.call_ok("post_message", answer).await;
        }
        let r = asking.await.unwrap();
        let got = &r["structuredContent"];
        assert_eq!(got["answered_by"], json!({"id": who, "person": person}), "{r}");
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(&format!("Answer from {who} {says}")), "{text}");
        let hint = got["hint"].as_str().unwrap();
        assert_eq!(hint.contains("not known to be a person"), !person, "{hint}");
    }
}
