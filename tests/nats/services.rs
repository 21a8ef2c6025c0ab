//! The relay's services across nodes: OAuth, webhooks, MCP tasks and reservations.

use super::*;
use common::oauth::form;

/// Two nodes of `nats`, each an OAuth authorization server with `admin` as its token.
fn oauth_nodes(nats: &Nats, admin: &str, extra: &[&str]) -> (Server, Server) {
    let urls = nats.urls();
    let mut args = vec!["--store", &urls, "--nats-replicas", "3", "--oauth", "--token", admin];
    args.extend_from_slice(extra);
    (Server::process(&args), Server::process(&args))
}

/// POSTs a form; the status, the redirect's query (if any) and the JSON answer (if any).
async fn post_form(
    c: &reqwest::Client,
    url: &str,
    origin: Option<&str>,
    pairs: &[(&str, &str)],
) -> (u16, std::collections::HashMap<String, String>, Value) {
    let mut r = c.post(url);
    if let Some(o) = origin {
        r = r.header("origin", o);
    }
    let r = r
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(pairs))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let query = r
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .and_then(|l| l.split_once('?'))
        .map(|(_, q)| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    (status, query, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_is_one_authorization_server_across_nodes() {
    const ADMIN: &str = "admin-token";
    const REDIRECT: &str = "http://127.0.0.1:9/cb";
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let (a, b) = oauth_nodes(&nats, ADMIN, &[]);
    let plain = builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(T)
        .build()
        .unwrap();
    let admin = client_with_token(ADMIN);
    // An invite minted on A, a client registered on B.
    let (status, invite) = request(
        &admin,
        "POST",
        &a.url("/api/oauth/invites"),
        Some(json!({"as": "w1"})),
        None,
    )
    .await;
    assert_eq!(status, 201, "{invite}");
    let code = invite["code"].as_str().unwrap().to_owned();
    let (status, reg) = request(
        &plain,
        "POST",
        &b.url("/oauth/register"),
        Some(json!({"redirect_uris": [REDIRECT]})),
        None,
    )
    .await;
    assert_eq!(status, 201, "{reg}");
    let client_id = reg["client_id"].as_str().unwrap().to_owned();
    let verifier = "n".repeat(43);
    let challenge = crosstalk::ops::oauth::s256(&verifier);
    let consent = |node: &Server| {
        let (c, url, origin) = (plain.clone(), node.url("/oauth/authorize"), node.url(""));
        let (client_id, challenge, code) = (client_id.clone(), challenge.clone(), code.clone());
        async move {
            let pairs = [
                ("response_type", "code"),
                ("client_id", client_id.as_str()),
                ("redirect_uri", REDIRECT),
                ("code_challenge", challenge.as_str()),
                ("code_challenge_method", "S256"),
                ("invite_code", code.as_str()),
            ];
            post_form(&c, &url, Some(origin.trim_end_matches('/')), &pairs).await
        }
    };
    // The same invite typed on both nodes at once: one consent, not two.
    let (on_a, on_b) = tokio::join!(consent(&a), consent(&b));
    let mut statuses = [on_a.0, on_b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [303, 400], "{on_a:?} {on_b:?}");
    let won = if on_a.0 == 303 { on_a.1 } else { on_b.1 };
    // The code is exchanged on the other node than the one that may have issued it: both.
    let exchange = [
        ("grant_type", "authorization_code"),
        ("code", won["code"].as_str()),
        ("redirect_uri", REDIRECT),
        ("code_verifier", verifier.as_str()),
        ("client_id", client_id.as_str()),
    ];
    let (status, _, tokens) = post_form(&plain, &b.url("/oauth/token"), None, &exchange).await;
    assert_eq!(status, 200, "{tokens}");
    let access = tokens["access_token"].as_str().unwrap().to_owned();
    let as_token = client_with_token(&access);
    for node in [&a, &b] {
        let (status, e) = request(
            &as_token,
            "POST",
            &node.url("/api/channels/ops/messages"),
            Some(msg("w1", "hi")),
            None,
        )
        .await;
        assert_eq!(status, 200, "{e}");
    }
    // Refresh on A: the token B saw is refused on B at once.
    let refresh = [
        ("grant_type", "refresh_token"),
        ("refresh_token", tokens["refresh_token"].as_str().unwrap()),
        ("client_id", client_id.as_str()),
    ];
    let (status, _, next) = post_form(&plain, &a.url("/oauth/token"), None, &refresh).await;
    assert_eq!(status, 200, "{next}");
    let (status, _) = request(&as_token, "GET", &b.url("/api/channels"), None, None).await;
    assert_eq!(status, 401);
    // Revoked on B: the new token is refused on A.
    let (_, list) = request(&admin, "GET", &b.url("/api/oauth/clients"), None, None).await;
    let grant = list["clients"][0]["grant"].as_str().unwrap().to_owned();
    let (status, _) = request(
        &admin,
        "DELETE",
        &b.url(&format!("/api/oauth/clients/{grant}")),
        None,
        None,
    )
    .await;
    assert_eq!(status, 204);
    let next_token = client_with_token(next["access_token"].as_str().unwrap());
    let (status, _) = request(&next_token, "GET", &a.url("/api/channels"), None, None).await;
    assert_eq!(status, 401);
}

/// The OAuth races of `tests/it/oauth.rs`, split across two nodes: a client refreshing on A
/// while the admin revokes on B, one refresh token used on A, B and A at once, and one code
/// exchanged on A and B at once, 100 times each. The revocation or the reuse wins every time.
/// And a token's streams and waits on A end within seconds of its revocation on B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_revocations_and_reuse_win_every_race_across_nodes() {
    const ADMIN: &str = "admin-token";
    const RACES: usize = 100;
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    // Each race checks its tokens are refused: failed authentications, not limited here.
    let (a, b) = oauth_nodes(&nats, ADMIN, &["--auth-failure-rate", "0"]);
    oauth::revocation_races(&a, &b, ADMIN, RACES).await;
    oauth::reuse_races(&a, &b, ADMIN, RACES).await;
    oauth::code_races(&a, &b, ADMIN, RACES).await;
    oauth::revoked_streams_end(&a, &b, ADMIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_is_delivered_by_one_node_of_the_cluster() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let args = [
        "--store",
        &nats.urls(),
        "--nats-replicas",
        "3",
        "--webhooks-allow-private",
    ];
    let (a, b) = (Server::process(&args), Server::process(&args));
    // A receiver counting what it gets.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Read, Write};
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut len = 0usize;
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line.trim() != "" {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = tx.send(String::from_utf8_lossy(&body).into_owned());
        }
    });
    let c = client();
    let (status, hook) = request(
        &c,
        "POST",
        &a.url("/api/webhooks"),
        Some(json!({"channel": "alerts", "url": format!("http://127.0.0.1:{port}/"), "types": ["QUESTION"]})),
        None,
    )
    .await;
    assert_eq!(status, 201, "{hook}");
    // Both nodes see it.
    let (_, list) = request(&c, "GET", &b.url("/api/webhooks"), None, None).await;
    assert_eq!(list["webhooks"][0]["id"], hook["id"], "{list}");
    let mut posted = Vec::new();
    for i in 0..6 {
        let node = if i % 2 == 0 { &a } else { &b };
        let m = post(
            &c,
            node,
            "alerts",
            json!({"sender": "agent", "type": "QUESTION", "body": format!("q{i}")}),
        )
        .await;
        posted.push(m["id"].as_u64().unwrap());
    }
    let mut got = Vec::new();
    while got.len() < posted.len() {
        let body = tokio::task::block_in_place(|| rx.recv_timeout(T)).unwrap_or_else(|_| panic!("got only {got:?}"));
        let v: Value = serde_json::from_str(&body).unwrap();
        got.push(v["message"]["id"].as_u64().unwrap());
    }
    assert_eq!(got, posted, "each once, in order, from one node");
    // Nothing more comes: no second node delivered them too.
    assert!(tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(2))).is_err());
    // Deleted through the other node, it stops on whichever delivered it: each node's
    // supervisor sees the webhooks' version change (it lists them only then) and ends its task.
    let id = hook["id"].as_str().unwrap();
    let (status, _) = request(&c, "DELETE", &b.url(&format!("/api/webhooks/{id}")), None, None).await;
    assert_eq!(status, 204);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = post(
        &c,
        &a,
        "alerts",
        json!({"sender": "agent", "type": "QUESTION", "body": "gone"}),
    )
    .await;
    let late = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(3)));
    assert!(late.is_err(), "{after} was delivered by a deleted webhook: {late:?}");
}

/// A 2026-07-28 MCP request that declares the tasks extension.
async fn with_tasks(m: &common::mcp::Mcp, method: &str, params: Value) -> Value {
    let id = m.next_id();
    let mut body = m.request_body(id, method, params);
    body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let a = common::mcp::read_answer(m.post_raw(&body).send().await.unwrap(), id).await;
    assert_eq!(a.status, 200, "{method}: {:?}", a.message);
    a.message
}

async fn until_settled(m: &common::mcp::Mcp, id: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let t = with_tasks(m, "tasks/get", json!({"taskId": id})).await["result"].clone();
        if t["status"] != "working" || Instant::now() > deadline {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_task_is_the_clusters_and_outlives_its_node() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let (mut a, b) = (node(&nats), node(&nats));
    let (on_a, on_b) = (common::mcp::Mcp::stateless(&a), common::mcp::Mcp::stateless(&b));
    // Made on a, read on b: the record is in the cluster's bucket.
    let made = with_tasks(
        &on_a,
        "tools/call",
        json!({"name": "wait_for_message", "arguments": {"channel": "tq", "timeout_s": 60}}),
    )
    .await;
    let id = made["result"]["taskId"].as_str().unwrap().to_owned();
    let seen = with_tasks(&on_b, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(seen["result"]["status"], "working", "{seen}");
    // A post on b wakes a's runner; b reads the result it wrote.
    let c = client();
    post(&c, &b, "tq", msg("bob", "from the other node")).await;
    let done = until_settled(&on_b, &id, T).await;
    assert_eq!(
        done["result"]["structuredContent"]["messages"][0]["body"], "from the other node",
        "{done}"
    );

    // Cancelled on b, a task running on a ends its wait there too (a looks at the record).
    let made = with_tasks(
        &on_a,
        "tools/call",
        json!({"name": "wait_for_message", "arguments": {"channel": "tc", "timeout_s": 60}}),
    )
    .await;
    let cancelled = made["result"]["taskId"].as_str().unwrap().to_owned();
    // The task's wait parks once its runner starts, a moment after the call is answered.
    until_waits(&c, &a.url(""), 1).await;
    with_tasks(&on_b, "tasks/cancel", json!({"taskId": cancelled})).await;
    // a's wait does not outlive the cancel.
    until_waits(&c, &a.url(""), 0).await;
    let t = with_tasks(&on_a, "tasks/get", json!({"taskId": cancelled})).await;
    assert_eq!(t["result"]["status"], "cancelled", "{t}");

    // A task whose node dies: once its time is up, the node a client asks finishes it.
    let made = with_tasks(
        &on_a,
        "tools/call",
        json!({"name": "wait_for_message", "arguments": {"channel": "orphan", "timeout_s": 1}}),
    )
    .await;
    let orphan = made["result"]["taskId"].as_str().unwrap().to_owned();
    a.kill();
    let done = until_settled(&on_b, &orphan, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["timed_out"], true, "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_never_grant_overlapping_exclusive_reservations() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let (a, b) = (node(&nats), node(&nats));
    let c = client();
    // Twenty holders at once, half through each node, all after src/**: one wins.
    let mut racing = tokio::task::JoinSet::new();
    for i in 0..20 {
        let (c, url) = (
            c.clone(),
            if i % 2 == 0 {
                a.url("/api/reservations")
            } else {
                b.url("/api/reservations")
            },
        );
        racing.spawn(async move {
            let body =
                json!({"holder": format!("agent-{i}"), "paths": ["src/**", format!("docs/{i}.md")], "project": "race"});
            request(&c, "POST", &url, Some(body), None).await
        });
    }
    let mut granted = Vec::new();
    while let Some(r) = racing.join_next().await {
        let (status, v) = r.unwrap();
        assert_eq!(status, 200, "{v}");
        if v["granted"] == true {
            granted.push(v["reservation"]["holder"].clone());
        } else {
            assert_eq!(v["conflicts"][0]["paths"], json!(["src/**"]), "{v}");
        }
    }
    assert_eq!(granted.len(), 1, "exactly one of twenty: {granted:?}");
    for node in [&a, &b] {
        let (_, list) = get_json(&c, &node.url("/api/reservations?project=race")).await;
        assert_eq!(list["reservations"].as_array().unwrap().len(), 1, "{list}");
        assert_eq!(list["reservations"][0]["holder"], granted[0]);
    }
}
