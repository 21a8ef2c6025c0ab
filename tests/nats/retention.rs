//! Retention on a cluster: a cut logged once and judged by every node, and nodes that join
//! after the log dropped old events.

use super::*;

/// Waits until `node` holds exactly the messages `want` of `channel`; answers what it holds.
async fn until_ids(c: &reqwest::Client, node: &Server, channel: &str, want: &[u64]) -> Vec<u64> {
    let deadline = Instant::now() + T;
    loop {
        let got = ids(&messages(c, node, channel, 0).await);
        if got == want || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A node whose own policy keeps the newest three messages of `logs`, looking every second;
/// `logging`: at the default log level, to read what it logs.
fn keeping_three(url: &str, logging: bool) -> Server {
    keeping_three_of(url, &["logs"], logging)
}

/// A node whose own policy keeps the newest three messages of each of `channels`, looking
/// every second; `logging` as above.
fn keeping_three_of(url: &str, channels: &[&str], logging: bool) -> Server {
    let policy = channels.iter().map(|c| format!("{c}=3/")).collect::<Vec<_>>().join(",");
    let args = [
        "--store",
        url,
        "--retention-channels",
        &policy,
        "--retention-interval-secs",
        "1",
    ];
    if logging {
        Server::start_logging(&args)
    } else {
        Server::process(&args)
    }
}

/// The status a reply to `parent` on `logs` gets from `node`.
async fn reply_status(c: &reqwest::Client, node: &Server, parent: u64) -> u16 {
    let body = json!({"sender": "x", "body": "re", "reply_to": parent});
    let (status, _) = request(c, "POST", &node.url("/api/channels/logs/messages"), Some(body), None).await;
    status
}

/// Waits until `a` (a node keeping three, logging) holds `newest` of `logs` and has recorded its
/// cut, and so purged the stream.
async fn until_cut_recorded(c: &reqwest::Client, a: &Server, newest: &[u64]) {
    assert_eq!(until_ids(c, a, "logs", newest).await, newest);
    let deadline = Instant::now() + T;
    while !a.stderr().contains("the log no longer holds what it removed") {
        assert!(Instant::now() < deadline, "A never recorded its cut:\n{}", a.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A node B started now, after `a`'s cut left the log: it starts `logs` from the cut and holds
/// what `a` holds, field for field.
async fn joins_after_the_cut(c: &reqwest::Client, url: &str, a: &Server, newest: &[u64]) -> Server {
    let b = Server::start_logging(&["--store", url, "--retention-interval-secs", "1"]);
    assert_eq!(until_ids(c, &b, "logs", newest).await, newest, "B holds what A holds");
    assert!(
        b.stderr().contains("started the channel from the log's retention cut"),
        "B did not start from the cut, so the log still held everything:\n{}",
        b.stderr()
    );
    assert_eq!(
        messages(c, &b, "logs", 0).await,
        messages(c, a, "logs", 0).await,
        "the same messages, to the field"
    );
    // Ready for a balancer once its store holds what the log held when it connected (the
    // log's newest message then was past the purged ones).
    let deadline = Instant::now() + T;
    loop {
        let (status, health) = get_json(c, &b.url("/healthz")).await;
        if status == 200 {
            assert_eq!(health["status"], "ok", "{health}");
            break;
        }
        assert_eq!(health["status"], "catching_up", "{health}");
        assert!(Instant::now() < deadline, "B never said it was ready: {health}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_cut_is_logged_once_and_every_node_judges_by_it() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    let url = nats.url();
    let c = client();
    // Only A has a policy. B has none and looks at retention once a minute (the default), so
    // it still holds what the cut removed while the test runs; C has none and looks every
    // second.
    let a = keeping_three(&url, false);
    let b = Server::process(&["--store", &url]);
    let cn = Server::process(&["--store", &url, "--retention-interval-secs", "1"]);
    let mut posted = Vec::new();
    for i in 0..6 {
        let mut m = msg("w", &format!("m{i}"));
        m["idempotency_key"] = json!(format!("k-{i}"));
        posted.push(post(&c, &a, "logs", m).await["id"].as_u64().unwrap());
    }
    let newest = posted[3..].to_vec();
    assert_eq!(
        until_ids(&c, &a, "logs", &newest).await,
        newest,
        "A applies its own cut"
    );
    assert_eq!(
        until_ids(&c, &cn, "logs", &newest).await,
        newest,
        "C, with no policy of its own, applies the cut A logged"
    );
    assert_eq!(
        ids(&messages(&c, &b, "logs", 0).await),
        posted,
        "B has not looked yet: its copy still holds everything"
    );
    // B still holds the first message, but the log's cut says it is gone: a reply to it is
    // refused on B exactly as on the nodes that removed it.
    assert_eq!(
        reply_status(&c, &b, posted[0]).await,
        400,
        "a reply behind the cut, on a node still holding its parent"
    );
    // A reply to a kept message is taken, and reaches every node under one id.
    let reply = json!({"sender": "x", "body": "re", "reply_to": posted[5]});
    let kept = post(&c, &b, "logs", reply).await["id"].as_u64().unwrap();
    assert_eq!(
        reply_status(&c, &cn, posted[1]).await,
        400,
        "the same refusal where the parent is gone"
    );
    // The next cut keeps the newest three again, on A and C alike.
    let three = vec![posted[4], posted[5], kept];
    assert_eq!(until_ids(&c, &a, "logs", &three).await, three);
    assert_eq!(until_ids(&c, &cn, "logs", &three).await, three);
    // B folded the same events and refused the same replies: what it holds is what the
    // others hold, plus what it has not removed yet.
    let mut all = posted.clone();
    all.push(kept);
    let on_b = ids(&until_count(&c, &b, "logs", 1).await);
    assert!(on_b.ends_with(&three) && all.ends_with(&on_b), "{on_b:?}");
    // The idempotency key of a message behind the cut is forgotten on every node, even on B,
    // which may still hold the original: a retry that late is a new post. One of a kept
    // message still gets its original.
    let mut late = msg("w", "m0");
    late["idempotency_key"] = json!("k-0");
    let again = post(&c, &b, "logs", late).await["id"].as_u64().unwrap();
    assert!(again > kept, "a new post, not the original {}", posted[0]);
    let mut kept_retry = msg("w", "m5");
    kept_retry["idempotency_key"] = json!("k-5");
    assert_eq!(post(&c, &cn, "logs", kept_retry).await["id"].as_u64(), Some(posted[5]));
    let three = vec![posted[5], kept, again];
    assert_eq!(until_ids(&c, &a, "logs", &three).await, three);
    assert_eq!(until_ids(&c, &cn, "logs", &three).await, three);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joins_after_the_log_dropped_old_events_folds_the_same_channel() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    let url = nats.url();
    let c = client();
    let a = keeping_three(&url, true);
    // A session of eight turns, begun before what the cut removes: its count lives on only in
    // the state after the cut.
    let (status, session) = request(
        &c,
        "POST",
        &a.url("/api/channels/logs/session"),
        Some(json!({"max_turns": 8})),
        None,
    )
    .await;
    assert_eq!(status, 200, "{session}");
    let mut posted = Vec::new();
    for i in 0..5 {
        posted.push(
            post(&c, &a, "logs", msg("w", &format!("m{i}"))).await["id"]
                .as_u64()
                .unwrap(),
        );
    }
    // Kept, and posted before the cut: its parent goes, and a node folding it later must
    // take it as A did.
    let reply = json!({"sender": "x", "body": "re: m0", "reply_to": posted[0]});
    posted.push(post(&c, &a, "logs", reply).await["id"].as_u64().unwrap());
    let newest = posted[3..].to_vec();
    until_cut_recorded(&c, &a, &newest).await;

    // B joins now: the log starts after the cut.
    let b = joins_after_the_cut(&c, &url, &a, &newest).await;
    let (_, state_b) = get_json(&c, &b.url("/api/channels/logs/session")).await;
    assert_eq!(
        (&state_b["session_id"], state_b["turn_count"].as_u64()),
        (&session["session_id"], Some(6)),
        "B took the session's count from the cut: {state_b}"
    );
    // Behind the cut a parent is gone on B too.
    assert_eq!(reply_status(&c, &b, posted[1]).await, 400);
    // Two more turns, posted on B, end the session on both nodes at the same message.
    let seventh = post(&c, &b, "logs", msg("w", "m7")).await["id"].as_u64().unwrap();
    let eighth = post(&c, &b, "logs", msg("w", "m8")).await["id"].as_u64().unwrap();
    for n in [&a, &b] {
        let deadline = Instant::now() + T;
        loop {
            let (status, st) = get_json(&c, &n.url("/api/channels/logs/session")).await;
            if status == 404 {
                assert_eq!(st["status"], "no_active_session", "{st}");
                break;
            }
            assert!(Instant::now() < deadline, "the session did not end: {st}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let last = vec![posted[5], seventh, eighth];
    assert_eq!(until_ids(&c, &a, "logs", &last).await, last);
    assert_eq!(
        until_ids(&c, &b, "logs", &last).await,
        last,
        "B applies the next cut too"
    );
}

/// A retention cut that falls inside a message of several events (posts gathered while the
/// append before them was on its way): the purge keeps that message, since its newer events
/// are kept, and a node that joins later starts from the cut and skips the events of that
/// message up to it, so it holds what the others hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_inside_a_message_of_several_posts_is_kept_to_the_event_for_a_late_joiner() {
    use async_nats::jetstream;
    let _one = ONE_CLUSTER.lock().await;
    let c = client();
    // How the posts fall into messages is the box's timing; an attempt whose cut falls between
    // two messages does not test the point, and is made again on a fresh log.
    let mut attempt = 0;
    let (nats, url, a, js, posted) = loop {
        attempt += 1;
        let nats = single("");
        let url = nats.url();
        let a = keeping_three(&url, true);
        // The node made the stream as it started; nothing else is on it yet, so its first
        // sequence after the purge says which of this test's messages the purge kept.
        let js = jetstream::new(async_nats::connect(url.clone()).await.unwrap());
        // Hold the stream back: the first post's append waits for it, and the five after it
        // queue behind that append and go to the log as one message.
        let config = hold_the_stream(&js).await;
        let send = |body: Value| post_in_background(&c, &a, "logs", body);
        let first = send(msg("w", "m0"));
        until_an_append_is_held(&a).await;
        let rest: Vec<_> = (1..6).map(|i| send(msg("w", &format!("m{i}")))).collect();
        tokio::time::sleep(Duration::from_millis(800)).await;
        js.update_stream(&config).await.expect("give the subjects back");
        let mut posted = Vec::new();
        for r in std::iter::once(first).chain(rest) {
            posted.push(r.await.unwrap()["id"].as_u64().unwrap());
        }
        posted.sort_unstable();
        // The cut keeps the newest three, so it falls inside a message when the third and
        // fourth posts share one, and an older message goes whole.
        let inside = posted[2] >> 10 == posted[3] >> 10 && posted[0] >> 10 < posted[3] >> 10;
        if inside {
            break (nats, url, a, js, posted);
        }
        assert!(
            attempt < 4,
            "in {attempt} tries the posts never shared a message across the cut: {posted:?}"
        );
    };
    let _nats = nats;
    let together = posted[3] >> 10;
    // The cut keeps the newest three: it reaches inside that message.
    let newest = posted[3..].to_vec();
    until_cut_recorded(&c, &a, &newest).await;
    let info = stream_info(&js).await;
    assert!(
        info.state.first_sequence > posted[0] >> 10 && info.state.first_sequence <= together,
        "the purge removed the first message and kept the one the cut falls in: first {} of {posted:?}",
        info.state.first_sequence
    );

    let b = joins_after_the_cut(&c, &url, &a, &newest).await;
    // Behind the cut a parent is gone on B, though its message is still in the log.
    assert_eq!(reply_status(&c, &b, posted[2]).await, 400);
    assert_eq!(reply_status(&c, &b, posted[3]).await, 200, "a reply to a kept message");
}

/// Posts `queued` (channel, body) on `node` while its append of a first post to `first` is
/// held back, so they go to the log together after it: answers the stream sequence of the
/// message that holds them (of several channels when they name several).
async fn one_message(
    c: &reqwest::Client,
    js: &async_nats::jetstream::Context,
    node: &Server,
    first: &str,
    queued: &[(&str, &str)],
) -> u64 {
    let config = hold_the_stream(js).await;
    let held = stream::post_in_background(c, node, first, msg("w", "held"));
    until_an_append_is_held(node).await;
    let mut answers = Vec::new();
    for (n, (channel, body)) in queued.iter().enumerate() {
        answers.push(stream::post_in_background(c, node, channel, msg("w", body)));
        stream::until_metric(c, node, "crosstalk_cluster_appends_waiting", (n + 1) as f64).await;
    }
    js.update_stream(&config).await.expect("give the subjects back");
    held.await.unwrap();
    let mut seqs = std::collections::BTreeSet::new();
    for answer in answers {
        seqs.insert(answer.await.unwrap()["id"].as_u64().unwrap() >> 10);
    }
    assert_eq!(seqs.len(), 1, "one message: {seqs:?}");
    seqs.into_iter().next().unwrap()
}

/// A message holding several channels' events leaves the stream once every one of its
/// channels is cut past it, and not before; a node that joins afterwards folds what is left of
/// it (the events of the channel not cut yet, and not those behind another channel's cut) and
/// holds what the others hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_several_channels_leaves_the_log_once_each_is_cut_past_it() {
    use async_nats::jetstream;
    let _one = ONE_CLUSTER.lock().await;
    let nats = single("");
    let url = nats.url();
    let c = client();
    let a = keeping_three_of(&url, &["logs", "ops"], true);
    // C has no policy of its own and applies A's cuts: it holds the same messages, and
    // whichever of the two takes the last channel off one second finds it gone already.
    let cn = Server::start_logging(&["--store", &url, "--retention-interval-secs", "1"]);
    post(&c, &a, "logs", msg("w", "first")).await;
    let js = jetstream::new(async_nats::connect(url.as_str()).await.unwrap());
    // `logs` and `ops`, both of them cut later; then `logs` and `keep`, which is never cut.
    let both_cut = one_message(&c, &js, &a, "logs", &[("logs", "l1"), ("ops", "o1")]).await;
    let one_cut = one_message(&c, &js, &a, "logs", &[("logs", "l2"), ("keep", "k1")]).await;
    // A and C record the messages they hold with their fold's watermark (about every
    // second); the cuts below come after that.
    let deadline = Instant::now() + T;
    for node in [&a, &cn] {
        while common::sample(&stream::metrics_of(&c, node).await, "crosstalk_cluster_folded_through").unwrap_or(0.0)
            < one_cut as f64
        {
            assert!(
                Instant::now() < deadline,
                "a node never recorded its fold past {one_cut}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let log = js.get_stream("CROSSTALK").await.unwrap();
    for seq in [both_cut, one_cut] {
        assert!(log.get_raw_message(seq).await.is_ok(), "message {seq} is in the log");
    }
    // Enough on both channels for the policy to cut past both messages.
    let mut newest = std::collections::HashMap::new();
    for channel in ["logs", "ops"] {
        for i in 0..4 {
            let id = post(&c, &a, channel, msg("w", &format!("{channel} {i}"))).await["id"]
                .as_u64()
                .unwrap();
            newest.entry(channel).or_insert_with(Vec::new).push(id);
        }
    }
    for channel in ["logs", "ops"] {
        let want = newest[channel][1..].to_vec();
        assert_eq!(until_ids(&c, &a, channel, &want).await, want, "{channel} on A");
        assert_eq!(until_ids(&c, &cn, channel, &want).await, want, "{channel} on C");
    }
    let deadline = Instant::now() + T;
    while log.get_raw_message(both_cut).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the message of logs and ops stayed after both were cut past it:\n{}",
            a.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        log.get_raw_message(one_cut).await.is_ok(),
        "the message holding keep's event went while keep was not cut"
    );
    // Both nodes have released it by their next passes: one removed it, the other found it
    // gone, and neither failed to record its cut for that.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut removed = 0.0;
    for node in [&a, &cn] {
        let scrape = stream::metrics_of(&c, node).await;
        removed += common::sample(&scrape, "crosstalk_cluster_several_removed_total").unwrap_or(0.0);
        assert!(
            !node.stderr().contains("several channels' events"),
            "a node failed to release a message of several channels:\n{}",
            node.stderr()
        );
    }
    assert_eq!(removed, 1.0, "removed once, by one of the two nodes");

    // A node that joins now reads the message kept for `keep`, skips its `logs` event (behind
    // logs' cut) and holds what A holds on every channel.
    let b = Server::start_logging(&["--store", &url, "--retention-interval-secs", "1"]);
    for channel in ["logs", "ops", "keep"] {
        let on_a = messages(&c, &a, channel, 0).await;
        assert_eq!(
            until_ids(&c, &b, channel, &ids(&on_a)).await,
            ids(&on_a),
            "{channel} on B:\n{}",
            b.stderr()
        );
        assert_eq!(messages(&c, &b, channel, 0).await, on_a, "{channel}: the same messages");
    }
    assert_eq!(ids(&messages(&c, &b, "keep", 0).await).len(), 1);
}
