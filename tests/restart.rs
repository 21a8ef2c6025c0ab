//! Restarts: graceful shutdown is quick and loses nothing; a crash (SIGKILL) loses nothing
//! acknowledged; ids continue without reuse.

mod common;
use common::*;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_a_graceful_restart_and_ids_continue() {
    let mut s = Server::start();
    let c = client();
    let mut before = Vec::new();
    for ch in ["a", "b"] {
        for i in 0..20 {
            before.push(post(&c, &s, ch, msg("x", &format!("{ch}{i}"))).await);
        }
    }
    // An open stream and a pending wait must not hold the exit up.
    let mut sse = SseReader::open(&c, &s.url("/api/channels/a/stream"), None).await;
    assert_eq!(sse.next(Duration::from_secs(5)).await.unwrap().event, "ready");
    let c2 = c.clone();
    let wait_url = s.url("/api/channels/a/wait?since_id=999999&timeout_s=60");
    let waiter = tokio::spawn(async move { c2.get(wait_url).send().await.map(|r| r.status().as_u16()) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (took, clean) = s.terminate();
    assert!(clean, "exit status is success");
    assert!(took < Duration::from_secs(2), "SIGTERM to exit took {took:?}");
    let _ = waiter.await;

    let dir = s.take_dir().unwrap();
    let s2 = Server::start_in(dir.path(), &[]);
    let mut after_a = messages(&c, &s2, "a", 0).await;
    after_a.extend(messages(&c, &s2, "b", 0).await);
    assert_eq!(after_a, before, "every message is back, unchanged");
    let max = before.iter().map(|m| m["id"].as_u64().unwrap()).max().unwrap();
    let next = post(&c, &s2, "b", msg("x", "new")).await;
    assert!(next["id"].as_u64().unwrap() > max, "ids continue after a restart");
    let (_, list) = get_json(&c, &s2.url("/api/channels")).await;
    assert_eq!(list.as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_sigkill() {
    sigkill_round_trip(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_survive_sigkill_in_fsync_mode() {
    sigkill_round_trip(&["--durability", "fsync"]).await;
}

async fn sigkill_round_trip(args: &[&str]) {
    let mut s = Server::start_with(args);
    let c = client();
    let mut acked = Vec::new();
    for i in 0..50 {
        acked.push(post(&c, &s, "dev", msg("x", &format!("m{i}"))).await);
    }
    s.kill();
    let dir = s.take_dir().unwrap();
    let s2 = Server::start_in(dir.path(), args);
    assert_eq!(messages(&c, &s2, "dev", 0).await, acked);
    let next = post(&c, &s2, "dev", msg("x", "after")).await;
    assert!(next["id"].as_u64().unwrap() > acked.last().unwrap()["id"].as_u64().unwrap());
}
