//! The shared log: two nodes holding one conversation, a node or a nats-server killed during
//! writes, writes without NATS, a restarted node, and every channel of the log on every node.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_hold_one_conversation() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let (mut a, b) = (node(&nats), node(&nats));
    let c = client();

    // A post on A is on B, with the same id.
    let hello = post(&c, &a, "pair", msg("alice", "hello from A")).await;
    let id = hello["id"].as_u64().unwrap();
    let on_b = until_count(&c, &b, "pair", 1).await;
    assert_eq!(on_b.len(), 1, "B never saw A's post");
    assert_eq!(
        (on_b[0]["id"].as_u64(), on_b[0]["body"].as_str()),
        (Some(id), Some("hello from A"))
    );

    // A waiter on B is woken by a post on A.
    let waiter = {
        let (c, url) = (
            c.clone(),
            b.url(&format!("/api/channels/pair/wait?since_id={id}&timeout_s=10")),
        );
        tokio::spawn(async move { request(&c, "GET", &url, None, None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = post(&c, &a, "pair", msg("alice", "are you there, B?")).await;
    let (status, woken) = tokio::time::timeout(T, waiter).await.unwrap().unwrap();
    assert_eq!(status, 200, "{woken}");
    assert_eq!(woken[0]["id"], second["id"], "{woken}");

    // B replies; A sees the reply under the same id, threaded.
    let reply = post(
        &c,
        &b,
        "pair",
        json!({"sender": "bob", "body": "here", "reply_to": second["id"]}),
    )
    .await;
    assert!(
        reply["id"].as_u64() > second["id"].as_u64(),
        "ids increase across nodes"
    );
    let on_a = until_count(&c, &a, "pair", 3).await;
    assert_eq!(on_a.last().unwrap()["id"], reply["id"]);
    assert_eq!(on_a.last().unwrap()["reply_to"], second["id"]);

    // A question asked on A, answered on B: both nodes show it answered.
    let q = post(
        &c,
        &a,
        "pair",
        json!({"sender": "alice", "type": "question", "body": "ship it?"}),
    )
    .await;
    until_count(&c, &b, "pair", 4).await;
    post(
        &c,
        &b,
        "pair",
        json!({"sender": "bob", "type": "answer", "body": "yes", "reply_to": q["id"]}),
    )
    .await;
    for n in [&a, &b] {
        until_count(&c, n, "pair", 5).await;
        let (_, m) = request(
            &c,
            "GET",
            &n.url(&format!("/api/channels/pair/messages/{}", q["id"])),
            None,
            None,
        )
        .await;
        assert_eq!(
            (m["status"].as_str(), m["reply_count"].as_u64()),
            (Some("answered"), Some(1)),
            "{m}"
        );
    }

    // Idempotency holds across nodes: the same key on B gives A's message.
    let keyed = json!({"sender": "alice", "body": "once", "idempotency_key": "k-1"});
    let first = post(&c, &a, "pair", keyed.clone()).await;
    let again = post(&c, &b, "pair", keyed).await;
    assert_eq!(first["id"], again["id"], "{first} {again}");

    // A reply to a message that does not exist is refused by the fold, with a clear error.
    let (status, err) = request(
        &c,
        "POST",
        &b.url("/api/channels/pair/messages"),
        Some(json!({"sender": "bob", "body": "?", "reply_to": 999_999})),
        None,
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert!(err["error"].as_str().unwrap().contains("reply_to"), "{err}");

    // A session started on A ends at max_turns on both nodes, whichever node took the turns.
    let (status, st) = request(
        &c,
        "POST",
        &a.url("/api/channels/duo/session"),
        Some(json!({"max_turns": 2})),
        None,
    )
    .await;
    assert_eq!(status, 200, "{st}");
    post(&c, &a, "duo", msg("alice", "turn 1")).await;
    post(&c, &b, "duo", msg("bob", "turn 2")).await;
    for n in [&a, &b] {
        until_count(&c, n, "duo", 2).await;
        let (status, s) = request(&c, "GET", &n.url("/api/channels/duo/session"), None, None).await;
        assert_eq!((status, s["status"].as_str()), (404, Some("no_active_session")), "{s}");
    }

    // Both nodes end up holding exactly the same log.
    let (la, lb) = (messages(&c, &a, "pair", 0).await, messages(&c, &b, "pair", 0).await);
    assert_eq!(la, lb);
    assert_eq!(la.len(), 6);

    // A node stops cleanly on SIGTERM (its NATS subscriptions end before its runtime does).
    let (_, clean) = a.terminate();
    assert!(clean, "node A did not exit cleanly:\n{}", a.stderr());
}

/// Reads `sse` into `seen` for at least a second and until each of the writers counted by
/// `counts` has `more` posts acknowledged beyond what it has now (at most `T`).
async fn read_while_writing(sse: &mut SseReader, seen: &mut Vec<Value>, counts: [&AtomicUsize; 2], more: usize) {
    let want = counts.map(|c| c.load(Ordering::SeqCst) + more);
    let (at_least, deadline) = (Instant::now() + Duration::from_secs(1), Instant::now() + T);
    let behind = || (0..2).any(|i| counts[i].load(Ordering::SeqCst) < want[i]);
    while Instant::now() < at_least || behind() {
        assert!(
            Instant::now() < deadline,
            "the writers stalled: {:?} acknowledged, waiting for {want:?}",
            counts.map(|c| c.load(Ordering::SeqCst))
        );
        if let Some(m) = sse.next_message(Duration::from_millis(100)).await {
            seen.push(m);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_and_a_nats_server_killed_during_writes_lose_nothing() {
    let _one = ONE_CLUSTER.lock().await;
    let mut nats = cluster();
    let a = node(&nats);
    let mut b = node(&nats);
    let c = client();
    post(&c, &a, "busy", msg("setup", "first")).await;
    until_count(&c, &b, "busy", 1).await;
    // A reader on B, to move to A when B dies.
    let mut sse = SseReader::open(&c, &b.url("/api/channels/busy/stream?since_id=0"), None).await;

    // Two writers, one per node, each remembering what was acknowledged. They write until told
    // to stop; the steps below go by how many posts each has had acknowledged, not by time (on
    // a loaded machine a fixed time may hold few posts).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = |node: String, who: &'static str, channel: &'static str, count: Arc<AtomicUsize>| {
        let (c, stop) = (c.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked: Vec<(u64, String)> = Vec::new();
            let until = Instant::now() + Duration::from_secs(60);
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                i += 1;
                let body = format!("{who}-{i}");
                let r = c
                    .post(format!("{node}/api/channels/{channel}/messages"))
                    .json(&json!({"sender": who, "body": body}))
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().is_success() => {
                        let v: Value = r.json().await.unwrap();
                        acked.push((v["id"].as_u64().unwrap(), body));
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    // Refused (its node is dead, or between NATS servers): not in a busy loop.
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
            acked
        })
    };
    let (count_a, count_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let wa = writer(a.base.clone(), "a", "busy", count_a.clone());
    let wb = writer(b.base.clone(), "b", "busy", count_b.clone());
    // A second writer on A, on a channel of its own: A's posts of both channels that wait for
    // its append go to the log as messages of several channels.
    let count_side = Arc::new(AtomicUsize::new(0));
    let ws = writer(a.base.clone(), "s", "side", count_side.clone());
    let mut seen_on_b: Vec<Value> = Vec::new();
    read_while_writing(&mut sse, &mut seen_on_b, [&count_a, &count_b], 5).await;
    // A NATS server dies: both nodes go on writing.
    nats.kill(3);
    read_while_writing(&mut sse, &mut seen_on_b, [&count_a, &count_b], 5).await;
    // Then B dies mid-write: A goes on.
    b.kill();
    let (after, deadline) = (count_a.load(Ordering::SeqCst) + 5, Instant::now() + T);
    while count_a.load(Ordering::SeqCst) < after {
        assert!(Instant::now() < deadline, "A stalled once B died");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let acked_a = wa.await.unwrap();
    let acked_b = wb.await.unwrap();
    let acked_side = ws.await.unwrap();
    assert!(
        acked_a.len() >= 15 && acked_b.len() >= 10,
        "{} {}",
        acked_a.len(),
        acked_b.len()
    );

    // The reader resumes on A where B left it, once A's log has settled: every acknowledged
    // post folded (B's reach A through the stream a moment after B answered them), and
    // nothing more arriving (a post B appended but died before answering may still come:
    // unacknowledged, it may be in the log or not, but once at most).
    let last = seen_on_b.last().map_or(0, |m| m["id"].as_u64().unwrap());
    // What B's reader saw came to B through the stream, so A folds it too, acknowledged or not.
    let newest_acked = acked_a
        .iter()
        .chain(&acked_b)
        .map(|(id, _)| *id)
        .max()
        .unwrap()
        .max(last);
    let deadline = Instant::now() + T;
    let log = loop {
        let before = messages(&c, &a, "busy", 0).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let log = messages(&c, &a, "busy", 0).await;
        let newest = log.last().and_then(|m| m["id"].as_u64());
        if log.len() == before.len() && newest >= Some(newest_acked) {
            break log;
        }
        assert!(
            Instant::now() < deadline,
            "node A's log did not settle at {newest_acked} or beyond: newest {newest:?}, {} vs {} messages, last seen on B {last}, acked a max {:?} b max {:?}\nA:\n{}",
            log.len(), before.len(),
            acked_a.iter().map(|(id, _)| *id).max(),
            acked_b.iter().map(|(id, _)| *id).max(),
            a.stderr()
        );
    };
    let newest = log.last().and_then(|m| m["id"].as_u64());
    let mut resumed = SseReader::open(&c, &a.url("/api/channels/busy/stream"), Some(last)).await;
    let mut read = seen_on_b.clone();
    while read.last().and_then(|m| m["id"].as_u64()) < newest {
        match resumed.next_message(T).await {
            Some(m) => read.push(m),
            None => break,
        }
    }
    let ids = |ms: &[Value]| ms.iter().map(|m| m["id"].as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!(ids(&read), ids(&log), "the reader holds exactly the log");

    // Every acknowledged post is in the log once, under the id it was acknowledged with.
    let mut bodies: Vec<&str> = log.iter().map(|m| m["body"].as_str().unwrap()).collect();
    let total = bodies.len();
    bodies.sort_unstable();
    bodies.dedup();
    assert_eq!(bodies.len(), total, "no message appears twice");
    for (id, body) in acked_a.iter().chain(&acked_b) {
        let m = log.iter().find(|m| m["id"].as_u64() == Some(*id));
        assert_eq!(
            m.map(|m| m["body"].as_str().unwrap()),
            Some(body.as_str()),
            "acknowledged {id} lost"
        );
    }
    assert!(ids(&log).windows(2).all(|w| w[0] < w[1]), "ids increase");

    // The same of the channel A's second writer posted to beside it, and some of its posts
    // shared a message of the log with the first writer's.
    assert!(acked_side.len() >= 10, "{}", acked_side.len());
    let side = messages(&c, &a, "side", 0).await;
    for (id, body) in &acked_side {
        let m = side
            .iter()
            .filter(|m| m["id"].as_u64() == Some(*id))
            .collect::<Vec<_>>();
        assert_eq!(m.len(), 1, "acknowledged {id} on side: {m:?}");
        assert_eq!(m[0]["body"].as_str(), Some(body.as_str()));
    }
    assert!(ids(&side).windows(2).all(|w| w[0] < w[1]), "ids increase on side");
    let busy_messages: std::collections::HashSet<u64> = ids(&log).iter().map(|id| id >> 10).collect();
    let shared = ids(&side)
        .iter()
        .filter(|id| busy_messages.contains(&(**id >> 10)))
        .count();
    assert!(shared > 0, "no message of the log held both channels");
}

/// Posts until the node acknowledges (its NATS connection may be moving to another server,
/// or the stream electing a leader), for at most `T` twice over. The body carries an
/// idempotency key, so an attempt that was appended but not answered is not posted twice.
async fn post_when_acknowledged(c: &reqwest::Client, node: &Server, channel: &str, body: Value) -> Value {
    assert!(body["idempotency_key"].is_string());
    let deadline = Instant::now() + 2 * T;
    loop {
        let r = c
            .post(node.url(&format!("/api/channels/{channel}/messages")))
            .json(&body)
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        if let Ok(r) = r {
            if r.status().is_success() {
                return r.json().await.unwrap();
            }
        }
        assert!(Instant::now() < deadline, "{channel}: no post acknowledged");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A node follows the log through one consumer, which lives on one of the three servers and
/// stays there until that server dies: killing each server in turn kills its host at least
/// once. Each time, a post acknowledged by the other node must reach this one within seconds
/// of the kill (the consumer's heartbeat is 1 s, two missed end it, and the node follows
/// again, each attempt to set up a consumer given 3 s; seen taking up to 10 s in all), where
/// the NATS client's ordered consumer (a 15 s heartbeat, missed twice) stalled for 30–60 s.
/// The other node's acknowledgement itself can take several seconds (it answers only once its
/// own fold has the post, and its consumer may have died too), so the bound is from the kill,
/// or a few seconds after that acknowledgement when it came later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_keeps_following_the_log_whichever_nats_server_dies() {
    const FROM_KILL: Duration = Duration::from_secs(25);
    const AFTER_ACK: Duration = Duration::from_secs(5);
    let _one = ONE_CLUSTER.lock().await;
    let mut nats = cluster();
    let a = Server::start_logging(&["--store", &nats.urls(), "--nats-replicas", "3"]);
    let b = node(&nats);
    let c = client();
    post(&c, &b, "follow", msg("b", "before")).await;
    assert_eq!(
        until_count(&c, &a, "follow", 1).await.len(),
        1,
        "A never folded B's first post"
    );
    for n in 1..=3 {
        nats.kill(n);
        let killed = Instant::now();
        let down = json!({"sender": "b", "body": format!("server {n} down"), "idempotency_key": format!("down-{n}")});
        let posted = post_when_acknowledged(&c, &b, "follow", down).await;
        let id = posted["id"].as_u64().unwrap();
        let acknowledged = killed.elapsed();
        let bound = FROM_KILL.max(acknowledged + AFTER_ACK);
        loop {
            let got = messages(&c, &a, "follow", 0).await;
            if got.iter().any(|m| m["id"].as_u64() == Some(id)) {
                eprintln!(
                    "server {n} down: B acknowledged {acknowledged:?} after the kill, A folded it {:?} after",
                    killed.elapsed()
                );
                break;
            }
            assert!(
                killed.elapsed() < bound,
                "with server {n} down, A had not folded B's post {id} {bound:?} after the kill (B \
                 acknowledged it after {acknowledged:?}); A's log:\n{}",
                a.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        nats.restart(n);
        // The restarted server catches up on the stream before the next one dies, so two of
        // three stay current.
        let back = json!({"sender": "a", "body": format!("server {n} back"), "idempotency_key": format!("back-{n}")});
        post_when_acknowledged(&c, &a, "follow", back).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Every post once, on both nodes, whatever was retried.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for node in [&a, &b] {
        assert_eq!(until_count(&c, node, "follow", 7).await.len(), 7);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_nats_writes_fail_fast_and_the_node_catches_up_when_it_returns() {
    let _one = ONE_CLUSTER.lock().await;
    let mut nats = cluster();
    let (a, b) = (node(&nats), node(&nats));
    let c = client();
    let first = post(&c, &a, "ops", msg("a", "before")).await;
    until_count(&c, &b, "ops", 1).await;

    for n in 1..=3 {
        nats.kill(n);
    }
    // The client notices the lost connection at once on loopback, and the node says so.
    let deadline = Instant::now() + T;
    loop {
        let (status, health) = request(&c, "GET", &a.url("/healthz"), None, None).await;
        if status == 503 && health["reason"].as_str().is_some_and(|r| r.contains("NATS")) {
            break;
        }
        assert!(Instant::now() < deadline, "the node never said NATS is gone: {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Once it knows, a write is refused fast instead of waiting for an acknowledgement.
    let started = Instant::now();
    let (status, err) = request(
        &c,
        "POST",
        &a.url("/api/channels/ops/messages"),
        Some(msg("a", "lost?")),
        None,
    )
    .await;
    assert_eq!(status, 503, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a write without NATS took {:?}",
        started.elapsed()
    );
    assert!(err["error"].as_str().unwrap().contains("NATS"), "{err}");
    let (status, health) = request(&c, "GET", &a.url("/healthz"), None, None).await;
    assert_eq!(status, 503, "{health}");
    assert!(health["reason"].as_str().unwrap().contains("NATS"), "{health}");
    // Reads go on from the node's own copy.
    assert_eq!(messages(&c, &b, "ops", 0).await.len(), 1);

    for n in 1..=3 {
        nats.restart(n);
    }
    // Both nodes reconnect by themselves; a post on A reaches B again. While they do, an
    // attempt can be appended and not answered: its retry carries the same idempotency key
    // (a retry without one was posted twice).
    let after = post_when_acknowledged(
        &c,
        &a,
        "ops",
        json!({"sender": "a", "body": "after", "idempotency_key": "after-the-outage"}),
    )
    .await;
    let (status, health) = request(&c, "GET", &a.url("/healthz"), None, None).await;
    assert_eq!(status, 200, "{health}");
    let on_b = until_count(&c, &b, "ops", 2).await;
    let ids: Vec<_> = on_b.iter().map(|m| m["id"].clone()).collect();
    assert_eq!(ids, vec![first["id"].clone(), after["id"].clone()], "{on_b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_follows_the_log_from_where_it_had_folded() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    let url = nats.url();
    let args = ["--store", url.as_str()];
    let c = client();
    let mut a = Server::process(&args);
    let b = Server::process(&args);
    let mut acked = Vec::new();
    for i in 0..50 {
        acked.push(
            post(&c, &a, &format!("ch{}", i % 5), msg("w", &format!("m{i}"))).await["id"]
                .as_u64()
                .unwrap(),
        );
    }
    // The watermark is recorded about every second, once what it covers is committed: wait
    // until A says it holds the fold past the 50 posts (`crosstalk_cluster_folded_through`).
    let deadline = Instant::now() + T;
    loop {
        let through = common::sample(&metrics_of(&c, &a).await, "crosstalk_cluster_folded_through").unwrap_or(0.0);
        if through >= 50.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A never recorded its fold past 50: {through}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, clean) = a.terminate();
    assert!(clean, "{}", a.stderr());
    let dir = a.take_dir().unwrap();
    // Posted while A is down: A folds them when it is back.
    for i in 50..60 {
        acked.push(
            post(&c, &b, &format!("ch{}", i % 5), msg("w", &format!("m{i}"))).await["id"]
                .as_u64()
                .unwrap(),
        );
    }
    let a = Server::start_logging_in(dir.path(), &args);
    for ch in 0..5 {
        let want: Vec<u64> = acked
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 5 == ch)
            .map(|(_, id)| *id)
            .collect();
        let got = ids(&until_count(&c, &a, &format!("ch{ch}"), want.len()).await);
        assert_eq!(got, want, "channel ch{ch} on A after its restart");
    }
    // It read the log from past what it had folded, not from the start.
    let log = a.stderr();
    let from = log
        .lines()
        .find_map(|l| l.split("following the shared log from=").nth(1))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no start position logged:\n{log}"));
    assert!(
        from > 50 && from <= acked[50],
        "followed from {from}; its last own post was {}",
        acked[49]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holds_every_channel_of_the_log_whatever_its_channel_limit() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    let a = Server::process(&["--store", &nats.url()]);
    let b = Server::process(&["--store", &nats.url(), "--max-channels", "1"]);
    let c = client();
    for ch in ["one", "two", "three"] {
        post(&c, &a, ch, msg("w", ch)).await;
    }
    // B folds all three (the limit was A's to enforce when it took the writes).
    for ch in ["one", "two", "three"] {
        let got = until_count(&c, &b, ch, 1).await;
        assert_eq!(got.len(), 1, "B never folded {ch}");
    }
    // A new channel through B itself is still refused by B's limit.
    let (status, err) = request(
        &c,
        "POST",
        &b.url("/api/channels/four/messages"),
        Some(msg("w", "four")),
        None,
    )
    .await;
    assert_eq!(status, 429, "{err}");
}
