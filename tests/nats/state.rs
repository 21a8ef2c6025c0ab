//! What the nodes share beside the log: shared data, identities and their bindings, the inbox,
//! presence, and waiting parties released as on one relay.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_data_is_one_store_across_nodes() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let (a, b) = (node(&nats), node(&nats));
    let c = client();
    let share = |n: &Server, owner: &str, content: &str| {
        let (c, url) = (c.clone(), n.url("/api/data"));
        let body = json!({"key": "spec v1 ü", "content": content, "owner": owner, "description": "the spec"});
        async move { request(&c, "POST", &url, Some(body), None).await }
    };
    let (status, v1) = share(&a, "alice", "draft 1").await;
    assert_eq!((status, v1["version"].as_u64()), (201, Some(1)), "{v1}");
    // Published on A, read on B at once: no fold to wait for.
    let key = "spec%20v1%20%C3%BC";
    let (status, got) = request(&c, "GET", &b.url(&format!("/api/data/{key}")), None, None).await;
    assert_eq!((status, got["content"].as_str()), (200, Some("draft 1")), "{got}");
    // Its owner's rule holds on the other node.
    let (status, err) = share(&b, "bob", "mine now").await;
    assert_eq!(status, 403, "{err}");
    let (status, v2) = share(&b, "alice", "draft 2").await;
    assert_eq!((status, v2["version"].as_u64()), (201, Some(2)), "{v2}");
    // Eight writers at once, four on each node: all land, as versions 3 to 10, none lost.
    let writes = (0..8).map(|i| {
        let node = if i % 2 == 0 { &a } else { &b };
        share(node, "alice", if i % 2 == 0 { "draft from A" } else { "draft from B" })
    });
    let results = futures_util::future::join_all(writes).await;
    let mut versions: Vec<u64> = results
        .iter()
        .map(|(status, v)| {
            assert_eq!(*status, 201, "{v}");
            v["version"].as_u64().unwrap()
        })
        .collect();
    versions.sort_unstable();
    assert_eq!(versions, (3..=10).collect::<Vec<_>>());
    for v in 1..=10u64 {
        let (status, old) = request(&c, "GET", &a.url(&format!("/api/data/{key}?version={v}")), None, None).await;
        assert_eq!((status, old["version"].as_u64()), (200, Some(v)), "{old}");
    }
    let (_, list) = request(&c, "GET", &b.url("/api/data"), None, None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["version"], 10, "{list}");
    let (status, _) = request(
        &c,
        "DELETE",
        &a.url(&format!("/api/data/{key}?owner=alice")),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = request(&c, "GET", &b.url(&format!("/api/data/{key}")), None, None).await;
    assert_eq!(status, 404);
    let (status, old) = request(&c, "GET", &b.url(&format!("/api/data/{key}?version=2")), None, None).await;
    assert_eq!((status, old["content"].as_str()), (200, Some("draft 2")), "{old}");
}

/// Registers an identity on `node`: its session token.
async fn register(c: &reqwest::Client, node: &Server, body: Value) -> String {
    let (status, reg) = request(c, "POST", &node.url("/api/register"), Some(body), None).await;
    assert_eq!(status, 201, "{reg}");
    reg["session"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_registered_on_one_node_is_bound_on_every_node() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let (a, b) = (node(&nats), node(&nats));
    let c = client();
    let token = register(&c, &a, json!({"instance_id": "builder", "kind": "agent"})).await;

    // Node B learns the binding: it lists the identity online and refuses it to others.
    let deadline = Instant::now() + T;
    loop {
        let (_, list) = request(&c, "GET", &b.url("/api/instances"), None, None).await;
        let found = list
            .as_array()
            .and_then(|l| l.iter().find(|i| i["instance_id"] == "builder").cloned());
        if found.as_ref().is_some_and(|i| i["status"] == "online") {
            break;
        }
        assert!(Instant::now() < deadline, "node B never listed builder online: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, err) = request(
        &c,
        "POST",
        &b.url("/api/register"),
        Some(json!({"instance_id": "builder", "kind": "agent"})),
        None,
    )
    .await;
    assert_eq!(status, 409, "a live id cannot be taken over on another node: {err}");
    let post_as = json!({"sender": "builder", "body": "built"});
    let (status, err) = request(
        &c,
        "POST",
        &b.url("/api/channels/ci/messages"),
        Some(post_as.clone()),
        None,
    )
    .await;
    assert_eq!(status, 403, "acting as a bound identity without its session: {err}");
    let (status, ok) = request(
        &c,
        "POST",
        &b.url("/api/channels/ci/messages"),
        Some(post_as),
        Some(&token),
    )
    .await;
    assert_eq!(status, 200, "its session works on any node: {ok}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_is_the_clusters_whichever_node_serves_it() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let (a, b) = (node(&nats), node(&nats));
    let c = client();
    let token = register(&c, &a, json!({"instance_id": "me"})).await;
    // Joining (posting) on A; news arrives through B.
    let (status, _) = request(
        &c,
        "POST",
        &a.url("/api/channels/news/messages"),
        Some(msg("me", "joining")),
        Some(&token),
    )
    .await;
    assert_eq!(status, 200);
    let first = post(&c, &b, "news", msg("bob", "one")).await;
    let second = post(&c, &b, "news", msg("bob", "two")).await;
    until_count(&c, &a, "news", 3).await;
    until_count(&c, &b, "news", 3).await;

    // Waits until `node` counts "me" among the readers of message `id` (its mirror of the
    // cluster's cursors has the move), failing after a while.
    let read_by_me = |node: &Server, id: Value| {
        let (c, url) = (
            c.clone(),
            node.url(&format!("/api/channels/news/messages/{id}/readers")),
        );
        async move {
            let deadline = Instant::now() + T;
            loop {
                let (_, r) = request(&c, "GET", &url, None, None).await;
                if r["read_by"].as_array().is_some_and(|l| l.contains(&json!("me"))) {
                    return;
                }
                assert!(Instant::now() < deadline, "the move never reached this node: {r}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    // The inbox on A hands both out; B learns the move and has nothing more to give.
    let (status, got) = request(&c, "GET", &a.url("/api/inbox?instance_id=me"), None, Some(&token)).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got, json!([first, second]));
    // At once on B (each node's inbox claims its range in the cluster's cursor, not in its
    // mirror of it): nothing more to give.
    let (status, again) = request(&c, "GET", &b.url("/api/inbox?instance_id=me"), None, Some(&token)).await;
    assert_eq!((status, again), (200, json!([])), "node B handed out again what A did");
    read_by_me(&b, second["id"].clone()).await;

    // Something new, read on B: handed out once, and not again on A.
    let third = post(&c, &a, "news", msg("bob", "three")).await;
    until_count(&c, &b, "news", 4).await;
    let (_, got) = request(&c, "GET", &b.url("/api/inbox?instance_id=me"), None, Some(&token)).await;
    assert_eq!(got, json!([third]));
    read_by_me(&a, third["id"].clone()).await;
    let (_, again) = request(&c, "GET", &a.url("/api/inbox?instance_id=me"), None, Some(&token)).await;
    assert_eq!(again, json!([]), "node A handed out again what B did");

    // Both nodes' inboxes called at once, over and over, while forty more arrive on both:
    // every one handed out exactly once.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drain = |node: &Server| {
        let (c, url, token, done) = (
            c.clone(),
            node.url("/api/inbox?instance_id=me&limit=3"),
            token.clone(),
            done.clone(),
        );
        tokio::spawn(async move {
            let (mut got, mut empty_after_done) = (Vec::new(), 0);
            let deadline = Instant::now() + Duration::from_secs(30);
            while empty_after_done < 3 && Instant::now() < deadline {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let (status, page) = request(&c, "GET", &url, None, Some(&token)).await;
                assert_eq!(status, 200, "{page}");
                let page = page.as_array().unwrap().clone();
                if page.is_empty() && finished {
                    empty_after_done += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                got.extend(ids(&page));
            }
            got
        })
    };
    let (on_a, on_b) = (drain(&a), drain(&b));
    let mut posted = Vec::new();
    for i in 0..40 {
        let node = if i % 2 == 0 { &a } else { &b };
        posted.push(
            post(&c, node, "news", msg("bob", &format!("n{i}"))).await["id"]
                .as_u64()
                .unwrap(),
        );
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (on_a, on_b) = (on_a.await.unwrap(), on_b.await.unwrap());
    let mut all: Vec<u64> = on_a.iter().chain(&on_b).copied().collect();
    all.sort_unstable();
    let handed = all.len();
    all.dedup();
    assert_eq!(handed, all.len(), "handed out twice: A {on_a:?}, B {on_b:?}");
    assert_eq!(all, posted, "A {on_a:?}, B {on_b:?}");
    assert!(
        !on_a.is_empty() && !on_b.is_empty(),
        "one node handed out everything: A {on_a:?}, B {on_b:?}"
    );
}

/// The presence event after `reader`'s next ones, skipping messages; `None` if none comes.
async fn next_presence(reader: &mut SseReader) -> Option<Value> {
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        let e = reader.next(T).await?;
        if e.event == "presence" {
            return serde_json::from_str(&e.data).ok();
        }
    }
    None
}

async fn present(c: &reqwest::Client, node: &Server, channel: &str) -> Vec<String> {
    let (status, p) = get_json(c, &node.url(&format!("/api/channels/{channel}/presence"))).await;
    assert_eq!(status, 200, "{p}");
    p.as_array()
        .unwrap()
        .iter()
        .map(|p| p["participant_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_is_on_a_channel_is_the_clusters() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    // A TTL of 6 s: refreshes go out every third of it, and a loaded machine must not make
    // one late enough to drop a participant who is still heard.
    let args = ["--store", &nats.url(), "--presence-ttl-secs", "6"];
    let (mut a, b) = (Server::process(&args), Server::start_with(&args));
    let c = client();
    let mut watcher = SseReader::open(&c, &b.url("/api/channels/room/stream"), None).await;
    assert_eq!(watcher.next(T).await.unwrap().event, "ready");

    // A person streaming on A joins, for B's readers too, and leaves when the stream closes.
    let url = a.url("/api/channels/room/stream?participant_id=carol&kind=human");
    let carol = SseReader::open(&c, &url, None).await;
    let joined = next_presence(&mut watcher).await.expect("B's reader told of carol");
    assert_eq!(
        (
            joined["event"].as_str(),
            joined["participant"]["participant_id"].as_str()
        ),
        (Some("joined"), Some("carol"))
    );
    assert_eq!(joined["participant"]["kind"], "human");
    assert_eq!(present(&c, &b, "room").await, ["carol"]);
    drop(carol);
    let left = next_presence(&mut watcher).await.expect("B's reader told carol left");
    assert_eq!(
        (left["event"].as_str(), left["participant_id"].as_str()),
        (Some("left"), Some("carol"))
    );
    assert!(present(&c, &b, "room").await.is_empty());

    // One participant heard on both nodes is listed once.
    post(&c, &a, "room", msg("erin", "from A")).await;
    post(&c, &b, "room", msg("erin", "from B")).await;
    let deadline = Instant::now() + T;
    while present(&c, &a, "room").await != ["erin"] {
        assert!(
            Instant::now() < deadline,
            "A never listed erin once: {:?}",
            present(&c, &a, "room").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(present(&c, &b, "room").await, ["erin"]);
    // Heard on A for longer than the TTL (6 s), gone quiet on B: B keeps listing her from A's
    // refreshes.
    for _ in 0..15 {
        post(&c, &a, "room", msg("erin", "still here")).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            present(&c, &b, "room").await,
            ["erin"],
            "B dropped erin while A heard her"
        );
    }

    // A poster on a node that dies is dropped by the others once the TTL is past.
    post(&c, &a, "room", msg("dave", "then A dies")).await;
    let deadline = Instant::now() + T;
    while !present(&c, &b, "room").await.contains(&"dave".to_owned()) {
        assert!(Instant::now() < deadline, "B never listed dave");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.kill();
    let killed = Instant::now();
    loop {
        let on_b = present(&c, &b, "room").await;
        if !on_b.contains(&"dave".to_owned()) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "dave still listed on B: {on_b:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parties_waiting_on_different_nodes_are_released_as_on_one() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    let args = ["--store", &nats.url(), "--release-grace-ms", "400"];
    let (a, b) = (Server::process(&args), Server::start_with(&args));
    let c = client();
    for who in ["bob", "alice"] {
        post(&c, &a, "pair", msg(who, "here")).await;
    }
    let mut since = until_count(&c, &b, "pair", 2).await[1]["id"].as_u64().unwrap();
    let wait = |node: &Server, who: &str, since: u64| {
        let (c, url) = (
            c.clone(),
            node.url(&format!(
                "/api/channels/pair/wait?since_id={since}&timeout_s=15&instance_id={who}&role=active"
            )),
        );
        tokio::spawn(async move { get_json(&c, &url).await.1 })
    };
    // Each way round: the smallest id (alice) is released, by the node holding her wait.
    for (alice_on, bob_on) in [(&b, &a), (&a, &b)] {
        let bob = wait(bob_on, "bob", since);
        let alice = wait(alice_on, "alice", since);
        let start = Instant::now();
        let released = tokio::time::timeout(Duration::from_secs(10), alice)
            .await
            .expect("alice never released: each node saw only its own waiter")
            .unwrap();
        assert_eq!(released["outcome"], "speak_first", "{released}");
        assert!(
            start.elapsed() >= Duration::from_millis(350),
            "only after the grace period"
        );
        assert!(!bob.is_finished(), "only one is released");
        let spoken = post(&c, alice_on, "pair", msg("alice", "I'll start")).await;
        let bob = bob.await.unwrap();
        assert_eq!(bob["messages"][0]["id"], spoken["id"], "{bob}");
        since = spoken["id"].as_u64().unwrap();
    }
}
