//! Coordination: identity, waits with roles, threads, human Q&A, sessions, idempotency,
//! shared data, channel finding, search, inbox and retention — over REST, against a real relay.

use crate::common;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn until<F: Fn(&Value) -> bool>(c: &reqwest::Client, url: &str, ok: F) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = get_json(c, url).await;
        if ok(&v) || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_are_bound_to_the_session_that_registered_them() {
    let s = Server::start();
    let c = client();
    let (status, reg) = request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "builder", "description": "builds", "kind": "agent"})),
        None,
    )
    .await;
    assert_eq!(status, 201, "{reg}");
    let token = reg["session"].as_str().unwrap().to_owned();
    assert_eq!(reg["status"], "online");
    // Someone else cannot take the live id over.
    let (status, err) = request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "builder"})),
        None,
    )
    .await;
    assert_eq!(status, 409, "{err}");
    // The owner can re-register (update its description).
    let (status, _) = request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "builder", "description": "v2"})),
        Some(&token),
    )
    .await;
    assert_eq!(status, 201);
    // Posting as it needs its session; other names are free.
    let url = s.url("/api/channels/dev/messages");
    let (status, err) = request(&c, "POST", &url, Some(msg("builder", "forged")), None).await;
    assert_eq!(status, 403, "{err}");
    let (status, _) = request(&c, "POST", &url, Some(msg("builder", "real")), Some(&token)).await;
    assert_eq!(status, 200);
    let (status, _) = request(&c, "POST", &url, Some(msg("visitor", "hello")), None).await;
    assert_eq!(status, 200);
    let (_, list) = get_json(&c, &s.url("/api/instances")).await;
    let me = list
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instance_id"] == "builder")
        .unwrap();
    assert_eq!(
        (me["description"].as_str(), me["status"].as_str()),
        (Some("v2"), Some("online"))
    );
    let (status, _) = request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "x", "kind": "robot"})),
        None,
    )
    .await;
    assert_eq!(status, 400);
    let bodies: Vec<_> = messages(&c, &s, "dev", 0)
        .await
        .iter()
        .map(|m| m["body"].clone())
        .collect();
    assert_eq!(
        bodies,
        [json!("real"), json!("hello")],
        "the forged post stored nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_skips_the_callers_own_messages_and_a_newer_wait_supersedes_it() {
    let s = Server::start();
    let c = client();
    let wait_url = |who: &str, since: u64, t: u64| {
        s.url(&format!(
            "/api/channels/dev/wait?since_id={since}&timeout_s={t}&instance_id={who}"
        ))
    };
    let first = {
        let (c, url) = (c.clone(), wait_url("alice", 0, 20));
        tokio::spawn(async move { get_json(&c, &url).await.1 })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mine = post(&c, &s, "dev", msg("alice", "my own words")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!first.is_finished(), "alice's own post does not wake alice");
    let theirs = post(&c, &s, "dev", msg("bob", "a reply")).await;
    let woke = first.await.unwrap();
    assert_eq!(woke["outcome"], "messages");
    assert_eq!(woke["messages"], json!([theirs]));
    assert_eq!(woke["next_since_id"], theirs["id"]);
    assert!(woke["hint"].as_str().unwrap().contains("next_since_id"));
    assert!(mine["id"].as_u64() < theirs["id"].as_u64());

    // One wait per identity and channel: the older returns at once, superseded.
    let since = theirs["id"].as_u64().unwrap();
    let old = {
        let (c, url) = (c.clone(), wait_url("alice", since, 20));
        tokio::spawn(async move { get_json(&c, &url).await.1 })
    };
    until_waits(&c, &s.url(""), 1).await;
    let newer = {
        let (c, url) = (c.clone(), wait_url("alice", since, 2));
        tokio::spawn(async move { get_json(&c, &url).await.1 })
    };
    let old = tokio::time::timeout(Duration::from_secs(5), old)
        .await
        .expect("superseded promptly")
        .unwrap();
    assert_eq!(old["outcome"], "superseded");
    assert_eq!(newer.await.unwrap()["outcome"], "timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_active_party_waits_one_is_released_to_speak_first() {
    let s = Server::start_with(&["--release-grace-ms", "400"]);
    let c = client();
    for who in ["bob", "alice", "worker"] {
        post(&c, &s, "pair", msg(who, "here")).await;
    }
    let since = messages(&c, &s, "pair", 0).await.last().unwrap()["id"]
        .as_u64()
        .unwrap();
    let wait = |who: &str, role: &str| {
        let c = c.clone();
        let url = s.url(&format!(
            "/api/channels/pair/wait?since_id={since}&timeout_s=15&instance_id={who}&role={role}"
        ));
        tokio::spawn(async move { get_json(&c, &url).await.1 })
    };
    // The parked worker never counts as a party, so it cannot block the release.
    let worker = wait("worker", "parked");
    let bob = wait("bob", "active");
    let alice = wait("alice", "active");
    let start = Instant::now();
    let released = tokio::time::timeout(Duration::from_secs(8), alice)
        .await
        .expect("alice released")
        .unwrap();
    assert_eq!(released["outcome"], "speak_first", "{released}");
    assert!(released["hint"].as_str().unwrap().contains("go first"));
    assert!(
        start.elapsed() >= Duration::from_millis(350),
        "only after the grace period"
    );
    assert!(
        !bob.is_finished(),
        "only one is released (deterministically the smallest id)"
    );
    let spoken = post(&c, &s, "pair", msg("alice", "I'll start")).await;
    let bob = bob.await.unwrap();
    assert_eq!(bob["messages"][0]["id"], spoken["id"]);
    assert_eq!(
        worker.await.unwrap()["messages"][0]["id"],
        spoken["id"],
        "parked workers hear everything"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_done_from_the_peer_returns_at_once() {
    let s = Server::start();
    let c = client();
    let mine = post(&c, &s, "dev", msg("alice", "finished?")).await;
    post(
        &c,
        &s,
        "dev",
        json!({"sender": "bob", "type": "done", "body": "all done"}),
    )
    .await;
    let start = Instant::now();
    let url = s.url(&format!(
        "/api/channels/dev/wait?since_id={}&timeout_s=20&instance_id=alice",
        mine["id"]
    ));
    let (_, v) = get_json(&c, &url).await;
    assert_eq!(v["outcome"], "done");
    assert_eq!(v["messages"][0]["type"], "done");
    assert!(start.elapsed() < Duration::from_secs(5));
    // Having seen the done (since_id at it), waiting again waits for something new: a done
    // is reported once, like any message, never re-delivered.
    let again = s.url(&format!(
        "/api/channels/dev/wait?since_id={}&timeout_s=0.3&instance_id=alice",
        v["next_since_id"]
    ));
    let (_, v) = get_json(&c, &again).await;
    assert_eq!((v["outcome"].as_str(), &v["messages"]), (Some("timeout"), &json!([])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_questions_directives_and_ask() {
    let s = Server::start();
    let c = client();
    let url = s.url("/api/channels/ops/messages");
    let (status, err) = request(
        &c,
        "POST",
        &url,
        Some(json!({"sender": "a", "body": "x", "reply_to": 999999})),
        None,
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert!(err["error"].as_str().unwrap().contains("reply_to"));
    let q = post(
        &c,
        &s,
        "ops",
        json!({"sender": "agent", "type": "QUESTION", "body": "deploy?", "recipient": "any-human"}),
    )
    .await;
    assert_eq!(q["status"], "open");
    post(
        &c,
        &s,
        "ops",
        json!({"sender": "lead", "type": "DIRECTIVE", "body": "use blue/green", "recipient": "agent"}),
    )
    .await;
    post(
        &c,
        &s,
        "ops",
        json!({"sender": "lead", "type": "interrupt", "body": "stop", "recipient": "other"}),
    )
    .await;
    // crosstalk-mcp's shape: one list, oldest first — the open question (to any-human, so for
    // everyone) and the directive addressed to this recipient; not the one to `other`.
    let (_, d) = get_json(&c, &s.url("/api/channels/ops/directives?recipient=agent")).await;
    let bodies: Vec<_> = d.as_array().unwrap().iter().map(|m| m["body"].clone()).collect();
    assert_eq!(bodies, vec![json!("deploy?"), json!("use blue/green")], "{d}");
    // Without a recipient: broadcasts only (crosstalk-mcp's rule).
    let (_, everyone) = get_json(&c, &s.url("/api/channels/ops/directives")).await;
    assert_eq!(everyone.as_array().unwrap().len(), 1, "{everyone}");
    assert_eq!(everyone[0]["id"], q["id"]);
    // since_id applies to open questions too.
    let (_, later) = get_json(
        &c,
        &s.url(&format!(
            "/api/channels/ops/directives?recipient=agent&since_id={}",
            q["id"]
        )),
    )
    .await;
    assert_eq!(later.as_array().unwrap().len(), 1, "{later}");
    assert_eq!(later[0]["body"], "use blue/green");

    let a = post(
        &c,
        &s,
        "ops",
        json!({"sender": "human", "type": "ANSWER", "body": "yes", "reply_to": q["id"]}),
    )
    .await;
    let (_, qq) = get_json(&c, &s.url(&format!("/api/channels/ops/messages/{}", q["id"]))).await;
    assert_eq!(
        (qq["status"].as_str(), qq["reply_count"].as_u64()),
        (Some("answered"), Some(1))
    );
    let (_, replies) = get_json(&c, &s.url(&format!("/api/channels/ops/messages/{}/replies", q["id"]))).await;
    assert_eq!(replies, json!([a]));
    let (_, d) = get_json(&c, &s.url("/api/channels/ops/directives?recipient=agent")).await;
    assert!(
        d.as_array().unwrap().iter().all(|m| m["id"] != q["id"]),
        "an answered question is no longer open: {d}"
    );

    // Ask and block until a human answers.
    let asking = {
        let c = c.clone();
        let url = s.url("/api/channels/ops/ask");
        tokio::spawn(async move {
            request(
                &c,
                "POST",
                &url,
                Some(json!({"sender": "agent", "body": "rollback?", "timeout_s": 20})),
                None,
            )
            .await
        })
    };
    let q2 = until(&c, &s.url("/api/channels/ops/directives"), |v| {
        v.as_array().is_some_and(|a| !a.is_empty())
    })
    .await;
    let q2id = q2[0]["id"].clone();
    assert_eq!(q2[0]["type"], "QUESTION");
    post(
        &c,
        &s,
        "ops",
        json!({"sender": "human", "type": "answer", "body": "no", "reply_to": q2id}),
    )
    .await;
    let (status, answered) = asking.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        (answered["answered"].as_bool(), answered["answer"]["body"].as_str()),
        (Some(true), Some("no"))
    );
    let (_, timed_out) = request(
        &c,
        "POST",
        &s.url("/api/channels/ops/ask"),
        Some(json!({"sender": "agent", "body": "anyone?", "timeout_s": 0.3})),
        None,
    )
    .await;
    assert_eq!(timed_out["answered"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_count_turns_end_by_rule_and_survive_a_restart() {
    let mut s = Server::process(&[]);
    let c = client();
    let sess = s.url("/api/channels/pair/session");
    let (status, st) = request(&c, "POST", &sess, Some(json!({"max_turns": 3})), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        (st["status"].as_str(), st["turn_count"].as_u64()),
        (Some("active"), Some(0))
    );
    let sid = st["session_id"].clone();
    let m = post(&c, &s, "pair", msg("a", "1")).await;
    assert_eq!(m["session_id"], sid, "a message joins the active session");
    post(&c, &s, "pair", msg("b", "2")).await;
    post(&c, &s, "pair", msg("a", "3")).await;
    // Ended at max_turns: crosstalk-mcp's 404 {"status": "no_active_session"}.
    let (status, st) = get_json(&c, &sess).await;
    assert_eq!(
        (status, st["status"].as_str()),
        (404, Some("no_active_session")),
        "{st}"
    );

    let (_, st) = request(&c, "POST", &sess, None, None).await;
    assert_eq!(st["status"], "active");
    post(&c, &s, "pair", json!({"sender": "a", "type": "DONE", "body": "done"})).await;
    let (_, mid) = get_json(&c, &sess).await;
    assert_eq!(mid["status"], "active", "one done is not enough");
    post(
        &c,
        &s,
        "pair",
        json!({"sender": "b", "type": "done", "body": "done too"}),
    )
    .await;
    let (status, st) = get_json(&c, &sess).await;
    assert_eq!(
        (status, st["status"].as_str()),
        (404, Some("no_active_session")),
        "two dones end it"
    );

    let (_, st) = request(&c, "POST", &sess, Some(json!({"max_turns": 10})), None).await;
    post(&c, &s, "pair", msg("a", "in progress")).await;
    let q = post(&c, &s, "pair", json!({"sender": "a", "type": "question", "body": "?"})).await;
    post(
        &c,
        &s,
        "pair",
        json!({"sender": "h", "type": "answer", "body": "!", "reply_to": q["id"]}),
    )
    .await;
    s.terminate();
    let dir = s.take_dir().unwrap();
    let s = Server::start_in(dir.path(), &[]);
    let sess = s.url("/api/channels/pair/session");
    let (_, after) = get_json(&c, &sess).await;
    assert_eq!(after["session_id"], st["session_id"]);
    assert_eq!(
        (after["status"].as_str(), after["turn_count"].as_u64()),
        (Some("active"), Some(3))
    );
    // Bad input is a 400 that changes nothing: the session stays as it was.
    for bad in [
        "{bad",
        r#"{"max_turns":"x"}"#,
        "-1",
        "4294967296",
        "[1]",
        r#"{"max_turns":0}"#,
        r#"{"max_turns":4294967296}"#,
    ] {
        let r = c
            .post(&sess)
            .header("content-type", "application/json")
            .body(bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    let (_, same) = get_json(&c, &sess).await;
    assert_eq!(
        (&same["session_id"], same["turn_count"].as_u64()),
        (&st["session_id"], Some(3)),
        "a refused start changes nothing"
    );
    let (_, qq) = get_json(&c, &s.url(&format!("/api/channels/pair/messages/{}", q["id"]))).await;
    assert_eq!(
        (qq["status"].as_str(), qq["reply_count"].as_u64()),
        (Some("answered"), Some(1)),
        "overlays survive a restart"
    );
    let (status, ended) = request(&c, "DELETE", &sess, None, None).await;
    assert_eq!(
        (status, ended["status"].as_str(), &ended["session_id"]),
        (200, Some("ended"), &st["session_id"])
    );
    let (status, none) = request(&c, "DELETE", &sess, None, None).await;
    assert_eq!(
        (status, none["status"].as_str(), none["channel"].as_str()),
        (200, Some("no_active_session"), Some("pair"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_idempotency_key_returns_the_original() {
    let s = Server::start();
    let c = client();
    let body = json!({"sender": "a", "body": "once", "idempotency_key": "k-1"});
    let (first, second) = tokio::join!(post(&c, &s, "dev", body.clone()), post(&c, &s, "dev", body.clone()));
    assert_eq!(first, second);
    let third = post(&c, &s, "dev", body).await;
    assert_eq!(third, first);
    assert_eq!(messages(&c, &s, "dev", 0).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_data_belongs_to_its_owner_and_keeps_versions() {
    let s = Server::start();
    let c = client();
    let data = s.url("/api/data");
    let (status, v1) = request(
        &c,
        "POST",
        &data,
        Some(json!({"key": "spec", "content": "draft 1", "description": "the spec", "owner": "alice"})),
        None,
    )
    .await;
    assert_eq!((status, v1["version"].as_u64()), (201, Some(1)));
    let (status, _) = request(
        &c,
        "POST",
        &data,
        Some(json!({"key": "spec", "content": "mine now", "owner": "bob"})),
        None,
    )
    .await;
    assert_eq!(status, 403, "another identity cannot overwrite");
    let (_, v2) = request(
        &c,
        "POST",
        &data,
        Some(json!({"key": "spec", "content": "draft 2", "owner": "alice"})),
        None,
    )
    .await;
    assert_eq!(v2["version"], 2);
    assert_eq!(
        v2["description"], "the spec",
        "a version without a description keeps it"
    );
    let (_, cur) = get_json(&c, &s.url("/api/data/spec")).await;
    assert_eq!(
        (cur["content"].as_str(), cur["owner"].as_str()),
        (Some("draft 2"), Some("alice"))
    );
    let (_, old) = get_json(&c, &s.url("/api/data/spec?version=1")).await;
    assert_eq!(old["content"], "draft 1");
    let (_, list) = get_json(&c, &data).await;
    assert_eq!(list[0]["size"], 7);
    let big = "x".repeat(1024 * 1024 + 1);
    let (status, _) = request(
        &c,
        "POST",
        &data,
        Some(json!({"key": "big", "content": big, "owner": "alice"})),
        None,
    )
    .await;
    assert!(status == 400 || status == 413, "{status}");
    let (status, _) = request(&c, "DELETE", &s.url("/api/data/spec?owner=bob"), None, None).await;
    assert_eq!(status, 403);
    let (status, _) = request(&c, "DELETE", &s.url("/api/data/spec?owner=alice"), None, None).await;
    assert_eq!(status, 200);
    let (status, _) = get_json(&c, &s.url("/api/data/spec")).await;
    assert_eq!(status, 404);
    let (_, still) = get_json(&c, &s.url("/api/data/spec?version=2")).await;
    assert_eq!(still["content"], "draft 2", "earlier versions stay readable");
}

/// The channel list says, for each channel, how many questions and permission prompts wait
/// for an answer and which session runs there, so a person sees them without opening each
/// channel; from the open channel's state and, after a restart, the stored one. MCP's text
/// form says the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_list_counts_open_questions_and_names_the_running_session() {
    let mut s = Server::process(&[]);
    let c = client();
    let row = |list: &Value, name: &str| {
        let rows = list.as_array().unwrap_or_else(|| panic!("{list}"));
        rows.iter()
            .find(|r| r["channel"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{list}"))
    };
    let q = post(
        &c,
        &s,
        "ops",
        json!({"sender": "agent", "type": "QUESTION", "body": "deploy?", "recipient": "any-human"}),
    )
    .await;
    post(
        &c,
        &s,
        "ops",
        json!({"sender": "host", "type": "permission", "body": "Allow Bash?", "recipient": "any-human"}),
    )
    .await;
    post(&c, &s, "calm", msg("a", "nothing to ask")).await;
    let (_, list) = get_json(&c, &s.url("/api/channels")).await;
    assert_eq!(row(&list, "ops")["open_questions"], 2, "{list}");
    assert_eq!(row(&list, "calm")["open_questions"], 0, "{list}");
    assert!(
        row(&list, "ops").get("active_session").is_none(),
        "no session, no field: {list}"
    );
    let text = common::mcp::Mcp::connect(&s)
        .await
        .call("list_channels", json!({}))
        .await;
    let text = text["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(
        text.contains("ops: 2 messages") && text.contains(", 2 open question(s)"),
        "{text}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("calm:") && l.contains("open question")),
        "{text}"
    );

    let (_, started) = request(&c, "POST", &s.url("/api/channels/ops/session"), Some(json!({})), None).await;
    post(
        &c,
        &s,
        "ops",
        json!({"sender": "lead", "type": "ANSWER", "body": "yes", "reply_to": q["id"]}),
    )
    .await;
    let (_, list) = get_json(&c, &s.url("/api/channels")).await;
    let ops = row(&list, "ops");
    assert_eq!(
        (&ops["open_questions"], &ops["active_session"]),
        (&json!(1), &started["session_id"]),
        "{list}"
    );

    // From what was stored, after a restart.
    let (_, clean) = s.terminate();
    assert!(clean);
    let dir = s.take_dir().unwrap();
    let s = Server::start_in(dir.path(), &[]);
    let (_, list) = get_json(&c, &s.url("/api/channels")).await;
    let ops = row(&list, "ops");
    assert_eq!(
        (&ops["open_questions"], &ops["active_session"]),
        (&json!(1), &started["session_id"]),
        "{list}"
    );
    request(&c, "DELETE", &s.url("/api/channels/ops/session"), None, None).await;
    let (_, list) = get_json(&c, &s.url("/api/channels")).await;
    assert!(
        row(&list, "ops").get("active_session").is_none(),
        "the session ended: {list}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_are_created_found_and_searched() {
    let s = Server::start();
    let c = client();
    let (status, ch) = request(
        &c,
        "POST",
        &s.url("/api/channels"),
        Some(json!({"name": "Auth-Dev", "description": "Login and OAuth work"})),
        None,
    )
    .await;
    assert_eq!(
        (status, ch["channel"].as_str(), ch["description"].as_str()),
        (201, Some("auth-dev"), Some("Login and OAuth work"))
    );
    // Creating a channel (or a session) is not a message: the summary says so.
    let (_, listed) = get_json(&c, &s.url("/api/channels")).await;
    assert_eq!(
        (
            listed[0]["channel"].as_str(),
            listed[0]["count"].as_u64(),
            listed[0]["last_id"].as_u64()
        ),
        (Some("auth-dev"), Some(0), Some(0)),
        "{listed}"
    );
    let first = post(&c, &s, "misc", msg("a", "unrelated")).await;
    request(&c, "POST", &s.url("/api/channels/misc/session"), None, None).await;
    let (_, listed) = get_json(&c, &s.url("/api/channels")).await;
    let misc = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel"] == "misc")
        .unwrap();
    assert_eq!(
        (&misc["last_id"], &misc["last_at"]),
        (&first["id"], &first["created_at"]),
        "last_id and last_at are the last message's: {misc}"
    );
    // Pages: `limit`, then `after` the last one seen; together they are the whole list.
    for name in ["p1", "p2", "p3"] {
        post(&c, &s, name, msg("a", "x")).await;
    }
    let (_, all) = get_json(&c, &s.url("/api/channels")).await;
    let mut paged = Vec::new();
    let mut url = s.url("/api/channels?limit=2");
    loop {
        let (status, page) = get_json(&c, &url).await;
        assert_eq!(status, 200, "{page}");
        let page = page.as_array().unwrap().clone();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        url = s.url(&format!(
            "/api/channels?limit=2&after={}",
            last["channel"].as_str().unwrap()
        ));
        paged.extend(page);
    }
    assert_eq!(json!(paged), all);
    let (status, _) = get_json(&c, &s.url("/api/channels?after=nope")).await;
    assert_eq!(status, 404);
    let (_, found) = get_json(&c, &s.url("/api/channels/search?q=oauth")).await;
    assert_eq!(found.as_array().unwrap().len(), 1);
    assert_eq!(found[0]["channel"], "auth-dev");
    let (_, found) = get_json(&c, &s.url("/api/channels/search?q=MISC")).await;
    assert_eq!(found[0]["channel"], "misc");

    let old = post(&c, &s, "auth-dev", msg("alice", "The token refresh bug is back")).await;
    post(&c, &s, "misc", msg("bob", "lunch?")).await;
    let new = post(
        &c,
        &s,
        "misc",
        json!({"sender": "bob", "type": "status", "body": "fixed the TOKEN refresh path"}),
    )
    .await;
    let hits = until(&c, &s.url("/api/search?q=token%20Refresh"), |v| {
        v.as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    let mut found = ids(hits.as_array().unwrap());
    found.sort_unstable();
    assert_eq!(found, [old["id"].as_u64().unwrap(), new["id"].as_u64().unwrap()]);
    let (_, by_sender) = get_json(&c, &s.url("/api/search?q=token&sender=alice")).await;
    assert_eq!(ids(by_sender.as_array().unwrap()), [old["id"].as_u64().unwrap()]);
    let (_, by_type) = get_json(&c, &s.url("/api/search?q=token&type=STATUS&channel=misc")).await;
    assert_eq!(ids(by_type.as_array().unwrap()), [new["id"].as_u64().unwrap()]);
    let (_, none) = get_json(&c, &s.url("/api/search?q=token%20lunch")).await;
    assert_eq!(none, json!([]));
    let (status, _) = get_json(&c, &s.url("/api/search?q=%21%21")).await;
    assert_eq!(status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_hands_out_each_message_once() {
    let s = Server::start();
    let c = client();
    let (_, reg) = request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "me"})),
        None,
    )
    .await;
    let token = reg["session"].as_str().unwrap().to_owned();
    let inbox_url = s.url("/api/inbox?instance_id=me");
    let inbox = || request(&c, "GET", &inbox_url, None, Some(&token));
    let (one, two) = (s.url("/api/channels/one/messages"), s.url("/api/channels/two/messages"));
    assert_eq!(
        request(&c, "POST", &one, Some(msg("me", "joining")), Some(&token))
            .await
            .0,
        200
    );
    assert_eq!(
        request(&c, "POST", &two, Some(msg("me", "joining too")), Some(&token))
            .await
            .0,
        200
    );
    let a = post(&c, &s, "one", msg("bob", "for everyone")).await;
    post(
        &c,
        &s,
        "one",
        json!({"sender": "bob", "body": "for carol", "recipient": "carol"}),
    )
    .await;
    let b = post(
        &c,
        &s,
        "two",
        json!({"sender": "eve", "body": "for me", "recipient": "me"}),
    )
    .await;
    post(&c, &s, "three", msg("bob", "a channel I never joined")).await;
    let (status, got) = inbox().await;
    assert_eq!(status, 200);
    assert_eq!(got, json!([a, b]));
    assert_eq!(inbox().await.1, json!([]), "never twice");
    let c2 = post(&c, &s, "one", msg("bob", "later")).await;
    assert_eq!(inbox().await.1, json!([c2]));
    let (status, _) = get_json(&c, &s.url("/api/inbox?instance_id=me")).await;
    assert_eq!(status, 403, "someone else's inbox needs its session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_removes_old_messages_and_replies_to_them_keep_working() {
    let s = Server::start_with(&["--retention-channels", "logs=5/", "--retention-interval-secs", "1"]);
    let c = client();
    let first = post(&c, &s, "logs", msg("a", "the first")).await;
    let mut last = Vec::new();
    for i in 0..7 {
        last.push(post(&c, &s, "logs", msg("a", &format!("m{i}"))).await);
    }
    let reply = post(
        &c,
        &s,
        "logs",
        json!({"sender": "b", "body": "re: first", "reply_to": first["id"]}),
    )
    .await;
    last.push(reply.clone());
    post(&c, &s, "other", msg("a", "untouched")).await;
    let list = until(&c, &s.url("/api/channels"), |v| {
        v.as_array()
            .unwrap()
            .iter()
            .any(|r| r["channel"] == "logs" && r["count"] == 5)
    })
    .await;
    let logs = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["channel"] == "logs")
        .unwrap()
        .clone();
    assert_eq!(logs["count"], 5, "{list}");
    let kept = messages(&c, &s, "logs", 0).await;
    assert_eq!(kept, last[3..].to_vec(), "the newest five remain, in order");
    let (status, _) = get_json(&c, &s.url(&format!("/api/channels/logs/messages/{}", first["id"]))).await;
    assert_eq!(status, 404, "the parent expired");
    let (status, replies) = get_json(
        &c,
        &s.url(&format!("/api/channels/logs/messages/{}/replies", first["id"])),
    )
    .await;
    assert_eq!(
        (status, replies),
        (200, json!([reply])),
        "its reply is still there and still found as a reply"
    );
    assert_eq!(
        messages(&c, &s, "other", 0).await.len(),
        1,
        "other channels keep everything"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_reader_with_an_identity_moves_its_cursor_and_needs_its_session() {
    let s = Server::start();
    let c = client();
    let (_, reg) = request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "watcher"})),
        None,
    )
    .await;
    let token = reg["session"].as_str().unwrap().to_owned();
    let r = c
        .get(s.url("/api/channels/dev/stream?participant_id=watcher"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        403,
        "a bound identity cannot be streamed as without its session"
    );
    post(&c, &s, "dev", msg("bob", "seen on the stream")).await;
    let url = s.url(&format!(
        "/api/channels/dev/stream?participant_id=watcher&session={token}"
    ));
    let mut sse = SseReader::open(&c, &url, None).await;
    assert_eq!(
        sse.next_message(Duration::from_secs(5)).await.unwrap()["body"],
        "seen on the stream"
    );
    let later = post(&c, &s, "dev", msg("bob", "after the stream")).await;
    assert_eq!(sse.next_message(Duration::from_secs(5)).await.unwrap(), later);
    drop(sse);
    let inbox = until(&c, &s.url("/api/inbox?instance_id=watcher"), |_| true).await;
    assert_eq!(
        inbox["error"].as_str().map(|_| ()),
        Some(()),
        "the inbox also needs the session: {inbox}"
    );
    let (status, inbox) = request(&c, "GET", &s.url("/api/inbox?instance_id=watcher"), None, Some(&token)).await;
    assert_eq!((status, inbox), (200, json!([])), "what the stream delivered is read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_retention_and_presence_expiry_follow_their_settings() {
    let s = Server::start_with(&[
        "--retention-max-age-secs",
        "1",
        "--retention-interval-secs",
        "1",
        "--presence-ttl-secs",
        "1",
    ]);
    let c = client();
    post(&c, &s, "dev", msg("old-timer", "soon gone")).await;
    let (_, p) = get_json(&c, &s.url("/api/channels/dev/presence")).await;
    assert_eq!(p[0]["id"], "old-timer");
    assert_eq!(p[0]["display_name"], "old-timer");
    let gone = until(&c, &s.url("/api/channels/dev/presence"), |v| v == &json!([])).await;
    assert_eq!(gone, json!([]), "a silent participant expires after the TTL");
    let expired = until(&c, &s.url("/api/channels/dev/messages"), |v| v == &json!([])).await;
    assert_eq!(expired, json!([]), "messages older than the max age are removed");
    let fresh = post(&c, &s, "dev", msg("new", "still here")).await;
    assert_eq!(messages(&c, &s, "dev", 0).await, vec![fresh]);
}

/// A shared-data key may hold any character: one with `/`, `%`, `+` or a space is stored, read
/// and deleted over REST with the key percent-encoded in the path (as `encodeURIComponent`
/// and every HTTP library's path escaping write it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_data_keys_with_slashes_and_escapes_round_trip_over_rest() {
    let s = Server::start();
    let c = client();
    for key in ["docs/spec.md", "a/b/c", "100% sure", "x+y", "%2F", "é/ü"] {
        let (status, _) = request(
            &c,
            "POST",
            &s.url("/api/data"),
            Some(json!({"key": key, "content": format!("content of {key}"), "owner": "alice"})),
            None,
        )
        .await;
        assert_eq!(status, 201, "{key}");
        let path: String = form_urlencoded::byte_serialize(key.as_bytes())
            .collect::<String>()
            .replace('+', "%20");
        let (status, got) = get_json(&c, &s.url(&format!("/api/data/{path}"))).await;
        assert_eq!((status, got["key"].as_str()), (200, Some(key)), "{key}: {got}");
        assert_eq!(got["content"], format!("content of {key}"));
        let (status, _) = request(
            &c,
            "DELETE",
            &s.url(&format!("/api/data/{path}?owner=alice")),
            None,
            None,
        )
        .await;
        assert_eq!(status, 200, "{key}");
        let (status, _) = get_json(&c, &s.url(&format!("/api/data/{path}"))).await;
        assert_eq!(status, 404, "{key}");
    }
}

/// The delivery state of a message names everyone on its channel: the case it exists for is a
/// DIRECTIVE whose recipient posted there but has not read since — it must say "not yet", not
/// give an all-clear. The sender is never "not yet" for its own message.
#[tokio::test]
async fn delivery_state_names_the_unread_recipient_and_never_the_sender() {
    let s = Server::start();
    let c = client();
    let readers = |id: u64| {
        let (c, url) = (c.clone(), s.url(&format!("/api/channels/ops/messages/{id}/readers")));
        async move {
            let (status, v) = get_json(&c, &url).await;
            assert_eq!(status, 200, "{v}");
            let names = |k: &str| -> Vec<String> {
                v[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap().to_owned())
                    .collect()
            };
            (names("read_by"), names("not_yet"))
        }
    };
    post(&c, &s, "ops", msg("worker-1", "starting the migration")).await;
    let d = post(
        &c,
        &s,
        "ops",
        json!({"sender": "boss", "type": "DIRECTIVE", "body": "stop the migration", "recipient": "worker-1"}),
    )
    .await;
    let id = d["id"].as_u64().unwrap();
    assert_eq!(
        readers(id).await,
        (vec!["boss".to_owned()], vec!["worker-1".to_owned()])
    );

    // Someone watching the channel from after it (present through its stream) has not read
    // it either; a stream that delivers it counts as reading it.
    let _watching = SseReader::open(
        &c,
        &s.url(&format!(
            "/api/channels/ops/stream?since_id={id}&participant_id=auditor"
        )),
        None,
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let (mut read_by, mut not_yet) = readers(id).await;
    while !not_yet.contains(&"auditor".to_owned()) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        (read_by, not_yet) = readers(id).await;
    }
    assert_eq!(not_yet, ["auditor", "worker-1"], "{read_by:?}");

    // The recipient reads as itself: now it has.
    let (status, _) = get_json(&c, &s.url("/api/channels/ops/messages?since_id=0&instance_id=worker-1")).await;
    assert_eq!(status, 200);
    let (read_by, not_yet) = readers(id).await;
    assert_eq!(read_by, ["boss", "worker-1"]);
    assert_eq!(not_yet, ["auditor"]);
}

/// Unread per identity: messages from others after its read position, per channel it has
/// read; reading moves it; its own messages never count.
#[tokio::test]
async fn unread_counts_follow_an_identitys_read_position() {
    let s = Server::start();
    let c = client();
    let unread = |who: &str| {
        let (c, url) = (c.clone(), s.url(&format!("/api/unread?instance_id={who}")));
        async move {
            let (status, v) = get_json(&c, &url).await;
            assert_eq!(status, 200, "{v}");
            v["unread"].clone()
        }
    };
    post(&c, &s, "ops", msg("alice", "one")).await;
    assert_eq!(
        unread("dana").await,
        json!({}),
        "no read position yet: nothing to count from"
    );
    let (status, _) = get_json(&c, &s.url("/api/channels/ops/messages?since_id=0&instance_id=dana")).await;
    assert_eq!(status, 200);
    assert_eq!(unread("dana").await, json!({"ops": 0}));
    post(&c, &s, "ops", msg("alice", "two")).await;
    post(&c, &s, "ops", msg("dana", "mine")).await;
    post(&c, &s, "ops", msg("bob", "three")).await;
    assert_eq!(
        unread("dana").await,
        json!({"ops": 2}),
        "dana's own message does not count"
    );
    get_json(&c, &s.url("/api/channels/ops/messages?since_id=0&instance_id=dana")).await;
    assert_eq!(unread("dana").await, json!({"ops": 0}));
}
