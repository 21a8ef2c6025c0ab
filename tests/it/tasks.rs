//! MCP tasks: `wait_for_message`, `ask_human` and `wait_for_reply` run as tasks, for
//! 2025-11-25 clients (`params.task`, `tasks/get|result|list|cancel`,
//! `notifications/tasks/status`) and 2026-07-28 ones (the tasks extension: `tasks/get` with
//! the result inline, `tasks/cancel`, `notifications/tasks` on `subscriptions/listen`). The
//! waits outlive the tool-call cap, and a relay restart. Raw JSON-RPC on purpose: the wire
//! shapes are what the SDK clients in `scripts/mcp-interop` rely on.

use crate::common;
use common::mcp::{next_notification, read_answer, Mcp};
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A 2026-07-28 request that declares the tasks extension.
async fn modern(m: &Mcp, method: &str, params: Value) -> Value {
    let id = m.next_id();
    let mut body = m.request_body(id, method, params);
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let a = read_answer(m.post_raw(&body).send().await.unwrap(), id).await;
    assert_eq!(a.status, 200, "{method}: {:?}", a.message);
    a.message
}

/// The tools `tools/list` marks as runnable as tasks (2025-11-25's `execution.taskSupport`).
async fn task_tools(m: &Mcp) -> Vec<String> {
    let tools = m.ok("tools/list", json!({})).await;
    tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["execution"]["taskSupport"] == "optional")
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Polls `tasks/get` (2025-11-25) until the task is no longer working.
async fn settled_v1(m: &Mcp, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = m.ok("tasks/get", json!({"taskId": id})).await;
        if t["status"] != "working" {
            return t;
        }
        assert!(Instant::now() < deadline, "task {id} still working");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn settled_v2(m: &Mcp, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = modern(m, "tasks/get", json!({"taskId": id})).await["result"].clone();
        if t["status"] != "working" {
            return t;
        }
        assert!(Instant::now() < deadline, "task {id} still working");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_task_waits_past_the_tool_call_cap_and_is_told() {
    // Tool calls end after 1 s here; the task waits 4.
    let s = Server::start_with(&["--mcp-wait-cap-secs", "1"]);
    let m = Mcp::connect(&s).await;
    // The capability a 2025-11-25 client checks, and the tools it may run as tasks.
    let init = Mcp::unconnected(&s, common::mcp::LEGACY)
        .request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {"tasks": {}},
                   "clientInfo": {"name": "t", "version": "0"}}),
        )
        .await;
    assert_eq!(
        init.message["result"]["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
    );
    assert_eq!(task_tools(&m).await, ["wait_for_message", "ask_human"]);

    let mut stream = m.listen().await;
    let created = m
        .ok(
            "tools/call",
            json!({"name": "wait_for_message", "arguments": {"channel": "t", "timeout_s": 4}, "task": {"ttl": 60000}}),
        )
        .await;
    let task = &created["task"];
    assert_eq!(task["status"], "working", "{created}");
    assert_eq!(task["pollInterval"], 1000);
    assert!(task["ttl"].as_u64().unwrap() >= 60_000, "{task}");
    let id = task["taskId"].as_str().unwrap().to_owned();

    // Past the tool-call cap the task still waits.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(m.ok("tasks/get", json!({"taskId": id})).await["status"], "working");
    post(&client(), &s, "t", msg("bob", "late but here")).await;
    let done = settled_v1(&m, &id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let result = m.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(
        result["structuredContent"]["messages"][0]["body"], "late but here",
        "{result}"
    );
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(id)
    );
    // The session was told.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = next_notification(&mut stream, Duration::from_secs(5))
            .await
            .expect("a notification");
        if n["method"] == "notifications/tasks/status" {
            assert_eq!(
                (n["params"]["taskId"].as_str(), n["params"]["status"].as_str()),
                (Some(&*id), Some("completed"))
            );
            break;
        }
        assert!(Instant::now() < deadline, "no notifications/tasks/status");
    }
    let listed = m.ok("tasks/list", json!({})).await;
    assert_eq!(listed["tasks"][0]["taskId"], json!(id));

    // A wait nobody answers ends at its own time, as a result, not an error.
    let created = m
        .ok(
            "tools/call",
            json!({"name": "wait_for_message", "arguments": {"channel": "quiet", "timeout_s": 1.5}, "task": {}}),
        )
        .await;
    let quiet = created["task"]["taskId"].as_str().unwrap().to_owned();
    let done = settled_v1(&m, &quiet).await;
    assert_eq!(done["status"], "completed");
    let result = m.ok("tasks/result", json!({"taskId": quiet})).await;
    assert_eq!(result["structuredContent"]["timed_out"], true, "{result}");

    // Mistakes: an unknown task, a finished one cancelled, a tool that is not a wait, bad
    // arguments (a tool error at once, no task).
    let unknown = m.request("tasks/get", json!({"taskId": "nope"})).await;
    assert_eq!(unknown.message["error"]["code"], -32602);
    // An id no store could hold as a key is unknown too, not the store's trouble.
    for odd in ["", "a b", "x.>", "*", "a..b", ".", "é", &"k".repeat(5000)] {
        let odd_get = m.request("tasks/get", json!({"taskId": odd})).await;
        assert_eq!(
            odd_get.message["error"]["code"], -32602,
            "{odd:?}: {:?}",
            odd_get.message
        );
        let odd_cancel = m.request("tasks/cancel", json!({"taskId": odd})).await;
        assert_eq!(
            odd_cancel.message["error"]["code"], -32602,
            "{odd:?}: {:?}",
            odd_cancel.message
        );
    }
    let again = m.request("tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(again.message["error"]["code"], -32602, "{:?}", again.message);
    let not_a_wait = m
        .request(
            "tools/call",
            json!({"name": "list_channels", "arguments": {}, "task": {}}),
        )
        .await;
    assert_eq!(not_a_wait.message["error"]["code"], -32601, "{:?}", not_a_wait.message);
    let bad = m
        .ok(
            "tools/call",
            json!({"name": "wait_for_message", "arguments": {"chanel": "t"}, "task": {}}),
        )
        .await;
    assert_eq!(bad["isError"], true, "{bad}");
    assert!(
        bad["content"][0]["text"].as_str().unwrap().contains("unknown argument"),
        "{bad}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_ask_is_posted_once_answered_and_a_cancel_ends_a_wait() {
    let s = Server::start_with(&["--mcp-wait-cap-secs", "1"]);
    let m = Mcp::connect(&s).await;
    m.call_ok("register", json!({"instance_id": "asker"})).await;
    let created = m
        .ok(
            "tools/call",
            json!({"name": "ask_human", "arguments": {"channel": "q", "question": "ship it?", "timeout_s": 30}, "task": {}}),
        )
        .await;
    let id = created["task"]["taskId"].as_str().unwrap().to_owned();
    // The question is on the channel once, from the session's identity.
    let c = client();
    let posted = messages(&c, &s, "q", 0).await;
    assert_eq!(posted.len(), 1, "{posted:?}");
    assert_eq!(
        (posted[0]["type"].as_str(), posted[0]["sender"].as_str()),
        (Some("QUESTION"), Some("asker"))
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let qid = posted[0]["id"].clone();
    post(
        &c,
        &s,
        "q",
        json!({"sender": "lead", "type": "ANSWER", "body": "yes", "reply_to": qid}),
    )
    .await;
    assert_eq!(settled_v1(&m, &id).await["status"], "completed");
    let result = m.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(
        (
            result["structuredContent"]["answered"].as_bool(),
            result["structuredContent"]["answer"]["body"].as_str()
        ),
        (Some(true), Some("yes")),
        "{result}"
    );
    assert_eq!(messages(&c, &s, "q", 0).await.len(), 2, "asked once, answered once");

    // Cancel: the wait ends, the task says cancelled, its result is an error.
    let created = m
        .ok(
            "tools/call",
            json!({"name": "wait_for_message", "arguments": {"channel": "c", "timeout_s": 30}, "task": {}}),
        )
        .await;
    let waiting = created["task"]["taskId"].as_str().unwrap().to_owned();
    let cancelled = m.ok("tasks/cancel", json!({"taskId": waiting})).await;
    assert_eq!(cancelled["status"], "cancelled");
    let result = m.request("tasks/result", json!({"taskId": waiting})).await;
    assert!(
        result.message["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cancelled"),
        "{:?}",
        result.message
    );
    // The cancelled wait let go of the identity's wait slot: a new wait is not superseding it.
    // (The wait ends when its task next runs, a moment after the cancel is answered.)
    until_waits(&c, &s.url(""), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_its_owners_alone() {
    let s = Server::start_with(&[
        "--participants",
        "alice:tok-alice,bob:tok-bob",
        "--mcp-wait-cap-secs",
        "1",
    ]);
    let alice = Mcp::connect_with(&s, client_with_token("tok-alice")).await;
    let bob = Mcp::connect_with(&s, client_with_token("tok-bob")).await;
    let created = alice
        .ok(
            "tools/call",
            json!({"name": "wait_for_message", "arguments": {"channel": "p", "timeout_s": 5}, "task": {}}),
        )
        .await;
    let id = created["task"]["taskId"].as_str().unwrap().to_owned();
    for method in ["tasks/get", "tasks/cancel", "tasks/result"] {
        let a = bob.request(method, json!({"taskId": id})).await;
        assert_eq!(a.message["error"]["code"], -32602, "{method}: {:?}", a.message);
    }
    assert_eq!(bob.ok("tasks/list", json!({})).await["tasks"], json!([]));
    assert_eq!(alice.ok("tasks/get", json!({"taskId": id})).await["status"], "working");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_client_gets_tasks_and_hears_of_them_on_listen() {
    let s = Server::start_with(&["--mcp-wait-cap-secs", "1"]);
    let m = Mcp::stateless(&s);
    let created = modern(
        &m,
        "tools/call",
        json!({"name": "wait_for_message", "arguments": {"channel": "m", "timeout_s": 5}}),
    )
    .await;
    let task = &created["result"];
    assert_eq!(
        (task["resultType"].as_str(), task["status"].as_str()),
        (Some("task"), Some("working")),
        "{created}"
    );
    assert_eq!(task["pollIntervalMs"], 1000);
    let id = task["taskId"].as_str().unwrap().to_owned();

    // subscriptions/listen naming the task.
    let listen_id = m.next_id();
    let mut body = m.request_body(
        listen_id,
        "subscriptions/listen",
        json!({"notifications": {"taskIds": [id]}}),
    );
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let r = m.post_raw(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = SseReader::from_response(r);
    let ack = next_notification(&mut stream, Duration::from_secs(5)).await.unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([id]), "{ack}");

    // A listen follows at most 100 tasks: the acknowledgement names the ones it accepted.
    let many: Vec<String> = (0..101).map(|i| format!("t{i}")).collect();
    let mut body = m.request_body(
        m.next_id(),
        "subscriptions/listen",
        json!({"notifications": {"taskIds": many}}),
    );
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let mut capped = SseReader::from_response(m.post_raw(&body).send().await.unwrap());
    let ack = next_notification(&mut capped, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        ack["params"]["notifications"]["taskIds"].as_array().unwrap().len(),
        100,
        "{ack}"
    );
    drop(capped);

    tokio::time::sleep(Duration::from_millis(1500)).await;
    post(&client(), &s, "m", msg("bob", "for the task")).await;
    let told = next_notification(&mut stream, Duration::from_secs(10))
        .await
        .expect("notifications/tasks");
    assert_eq!(told["method"], "notifications/tasks", "{told}");
    assert_eq!(told["params"]["status"], "completed");
    assert_eq!(
        told["params"]["result"]["structuredContent"]["messages"][0]["body"],
        "for the task"
    );

    let got = settled_v2(&m, &id).await;
    assert_eq!(
        got["result"]["structuredContent"]["messages"][0]["body"], "for the task",
        "{got}"
    );
    assert_eq!(got["result"]["isError"], false);

    // Cancel, and the answers to a finished or unknown task.
    let created = modern(
        &m,
        "tools/call",
        json!({"name": "ask_human", "arguments": {"channel": "m", "sender": "bot", "question": "ok?"}}),
    )
    .await;
    let ask = created["result"]["taskId"].as_str().unwrap().to_owned();
    assert_eq!(
        modern(&m, "tasks/cancel", json!({"taskId": ask})).await["result"]["resultType"],
        "complete"
    );
    assert_eq!(settled_v2(&m, &ask).await["status"], "cancelled");
    assert_eq!(
        modern(&m, "tasks/cancel", json!({"taskId": ask})).await["error"]["code"],
        -32602
    );
    let update = modern(&m, "tasks/update", json!({"taskId": ask, "inputResponses": {}})).await;
    assert_eq!(update["error"]["code"], -32602);

    // A call that does not block is answered as before; so is a client without tasks.
    let posted = modern(
        &m,
        "tools/call",
        json!({"name": "post_message", "arguments": {"channel": "m", "sender": "bot", "body": "x"}}),
    )
    .await;
    assert_eq!(posted["result"]["resultType"], "complete", "{posted}");
    // After the newest message (on a cluster ids are not small consecutive numbers).
    let newest = posted["result"]["structuredContent"]["id"]
        .as_u64()
        .expect("the posted id");
    let plain = m
        .call(
            "wait_for_message",
            json!({"channel": "m", "since_id": newest, "timeout_s": 5}),
        )
        .await;
    assert_eq!(
        plain["structuredContent"]["timed_out"], true,
        "capped at 1 s, as before: {plain}"
    );
    let no_tasks = m.request("tasks/get", json!({"taskId": id})).await;
    assert_eq!(no_tasks.message["error"]["code"], -32021, "{:?}", no_tasks.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_claude_wait_for_reply_runs_as_a_task() {
    let s = Server::start_with(&["--mcp-wait-cap-secs", "1"]);
    let m = Mcp::connect_at(&s, "/cc/mcp", client()).await;
    m.call_ok("register", json!({"instance_id": "waiter"})).await;
    assert_eq!(task_tools(&m).await, ["wait_for_reply"]);
    let created = m
        .ok(
            "tools/call",
            json!({"name": "wait_for_reply", "arguments": {"channel": "general", "max_wait_minutes": 0.1}, "task": {}}),
        )
        .await;
    let id = created["task"]["taskId"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    post(&client(), &s, "general", msg("other", "a reply")).await;
    assert_eq!(settled_v1(&m, &id).await["status"], "completed");
    let result = m.ok("tasks/result", json!({"taskId": id})).await;
    assert_eq!(
        result["structuredContent"]["messages"][0]["content"], "a reply",
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_survive_a_restart_and_an_ask_is_not_asked_twice() {
    let mut s = Server::process(&["--mcp-wait-cap-secs", "1"]);
    let m = Mcp::stateless(&s);
    let wait = modern(
        &m,
        "tools/call",
        json!({"name": "wait_for_message", "arguments": {"channel": "r", "timeout_s": 60}}),
    )
    .await["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let ask = modern(
        &m,
        "tools/call",
        json!({"name": "ask_human", "arguments": {"channel": "asks", "sender": "bot", "question": "still there?", "timeout_s": 60}}),
    )
    .await["result"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, clean) = s.terminate();
    assert!(clean);
    let dir = s.take_dir().unwrap();
    let s2 = Server::start_in(dir.path(), &["--mcp-wait-cap-secs", "1"]);
    let m2 = Mcp::stateless(&s2);
    for id in [&wait, &ask] {
        let t = modern(&m2, "tasks/get", json!({"taskId": id})).await;
        assert_eq!(t["result"]["status"], "working", "{t}");
    }
    let c = client();
    let before = messages(&c, &s2, "asks", 0).await;
    assert_eq!(before.len(), 1, "the question, once: {before:?}");
    let qid = before[0]["id"].clone();
    post(
        &c,
        &s2,
        "asks",
        json!({"sender": "lead", "type": "ANSWER", "body": "yes", "reply_to": qid}),
    )
    .await;
    let asked = settled_v2(&m2, &ask).await;
    assert_eq!(asked["result"]["structuredContent"]["answer"]["body"], "yes", "{asked}");
    assert_eq!(messages(&c, &s2, "asks", 0).await.len(), 2, "asked once, answered once");
    post(&c, &s2, "r", msg("bob", "after the restart")).await;
    let waited = settled_v2(&m2, &wait).await;
    assert_eq!(
        waited["result"]["structuredContent"]["messages"][0]["body"], "after the restart",
        "{waited}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_task_list_comes_in_pages() {
    let s = Server::start();
    let m = Mcp::connect(&s).await;
    for _ in 0..101 {
        m.ok(
            "tools/call",
            json!({"name": "wait_for_message", "arguments": {"channel": "pages", "since_id": 0, "timeout_s": 0}, "task": {}}),
        )
        .await;
    }
    let first = m.ok("tasks/list", json!({})).await;
    let ids = |page: &Value| -> Vec<String> {
        page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["taskId"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&first).len(), 100);
    let cursor = first["nextCursor"].as_str().unwrap().to_owned();
    // A task made between two pages is on neither: the next page is the one task left, not
    // the last of the first page again (an offset cursor shifted by the new task).
    m.ok(
        "tools/call",
        json!({"name": "wait_for_message", "arguments": {"channel": "pages", "since_id": 0, "timeout_s": 0}, "task": {}}),
    )
    .await;
    let rest = m.ok("tasks/list", json!({"cursor": cursor})).await;
    assert_eq!(ids(&rest).len(), 1, "{rest}");
    assert!(!ids(&first).contains(&ids(&rest)[0]), "a task listed twice: {rest}");
    assert!(rest.get("nextCursor").is_none(), "{rest}");
    // A cursor the relay did not give is refused, not read as the first page.
    for bad in [json!("nope"), json!(""), json!("x:y"), json!(7)] {
        let refused = m.request("tasks/list", json!({"cursor": bad})).await;
        assert_eq!(refused.message["error"]["code"], -32602, "{bad}: {:?}", refused.message);
    }
}

/// A stateless client of `s` with `token`.
fn with_token(s: &Server, token: &str) -> Mcp {
    let mut m = Mcp::stateless(s);
    m.http = client_with_token(token);
    m
}

/// A task that waits two minutes for a message on a quiet channel.
async fn long_wait(m: &Mcp) -> String {
    let made = modern(
        m,
        "tools/call",
        json!({"name": "wait_for_message", "arguments": {"channel": "quiet", "timeout_s": 120}}),
    )
    .await;
    made["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{made}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_made_through_a_revoked_oauth_connection_fails_within_seconds() {
    const ADMIN: &str = "admin-s3cret";
    let s = Server::start_with(&["--oauth", "--token", ADMIN]);
    let flow = common::oauth::Flow::new(&s, ADMIN).await;
    let first = flow.connect(&s, "w7").await;
    let grant = flow.grants(&s).await["w7"].clone();
    let id = long_wait(&with_token(&s, &first.access)).await;
    // Another connection acting as the same identity may read the task; the first ends.
    let second = flow.connect(&s, "w7").await;
    let reader = with_token(&s, &second.access);
    assert_eq!(
        modern(&reader, "tasks/get", json!({"taskId": id})).await["result"]["status"],
        "working"
    );
    assert_eq!(flow.revoke(&s, &grant).await, 204);
    let revoked = Instant::now();
    let t = settled_v2(&reader, &id).await;
    assert!(
        revoked.elapsed() < common::oauth::ENDS_WITHIN,
        "{:?}",
        revoked.elapsed()
    );
    assert_eq!(t["status"], "failed", "{t}");
    assert!(t["statusMessage"].as_str().unwrap().contains("no longer valid"), "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_participant_token_a_restart_dropped_is_not_resumed() {
    let mut s = Server::process(&["--participants", "alice:token-1"]);
    let id = long_wait(&with_token(&s, "token-1")).await;
    let (took, clean) = s.terminate();
    assert!(
        clean,
        "the first relay's exit after SIGTERM was not clean ({took:?}); it said:\n{}",
        s.stderr()
    );
    let dir = s.take_dir().unwrap();
    // Restarted without alice: her task does not wait on for her.
    let mut s = Server::start_in(dir.path(), &["--participants", "bob:token-2"]);
    // Serving (its signal handler in place) before it is stopped.
    assert_eq!(get_json(&client(), &s.url("/healthz")).await.0, 200);
    let (took, clean) = s.terminate();
    assert!(
        clean,
        "the restarted relay's exit after SIGTERM was not clean ({took:?}); it said:\n{}",
        s.stderr()
    );
    // Alice back with a new token: the task ended when her old one went.
    let s = Server::start_in(dir.path(), &["--participants", "alice:token-3"]);
    let t = modern(&with_token(&s, "token-3"), "tasks/get", json!({"taskId": id})).await;
    assert_eq!(t["result"]["status"], "failed", "{t}");
    assert!(
        t["result"]["statusMessage"]
            .as_str()
            .unwrap()
            .contains("no longer valid"),
        "{t}"
    );
    drop(s);
    drop(dir);
}
