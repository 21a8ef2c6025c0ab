//! The long-poll wait: wakes on a post, times out with `[]`, honours since_id.

use crate::common;
use common::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_wakes_on_a_post() {
    let s = Server::start();
    let c = client();
    let first = post(&c, &s, "dev", msg("a", "before")).await;
    let since = first["id"].as_u64().unwrap();
    let url = s.url(&format!("/api/channels/dev/wait?since_id={since}&timeout_s=20"));
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let (status, v) = get_json(&c, &url).await;
            (status, v, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let posted_at = Instant::now();
    let second = post(&c, &s, "dev", msg("b", "after")).await;
    let (status, v, waited) = waiter.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        v.as_array().unwrap(),
        &vec![second.clone()],
        "the wait returns exactly the new message"
    );
    assert!(waited >= Duration::from_millis(300), "it did wait");
    assert!(
        posted_at.elapsed() < Duration::from_secs(5),
        "and woke on the post, not the timeout"
    );
}

#[tokio::test]
async fn wait_returns_at_once_when_something_is_already_there() {
    let s = Server::start();
    let c = client();
    let m = post(&c, &s, "dev", msg("a", "x")).await;
    let start = Instant::now();
    let (_, v) = get_json(&c, &s.url("/api/channels/dev/wait?since_id=0&timeout_s=30")).await;
    assert_eq!(v.as_array().unwrap(), &vec![m]);
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn wait_times_out_with_an_empty_list() {
    let s = Server::start();
    let c = client();
    let start = Instant::now();
    let (status, v) = get_json(&c, &s.url("/api/channels/quiet/wait?since_id=0&timeout_s=0.7")).await;
    assert_eq!((status, v), (200, serde_json::json!([])));
    assert!(start.elapsed() >= Duration::from_millis(700));
    // A message on another channel does not wake this one.
    let c2 = c.clone();
    let url = s.url("/api/channels/quiet/wait?since_id=0&timeout_s=1");
    let waiter = tokio::spawn(async move { get_json(&c2, &url).await });
    post(&c, &s, "noisy", msg("a", "x")).await;
    assert_eq!(waiter.await.unwrap().1, serde_json::json!([]));
}

#[tokio::test]
async fn wait_is_capped_by_configuration() {
    let s = Server::start_with(&["--wait-cap-secs", "1"]);
    let c = client();
    let start = Instant::now();
    let (status, v) = get_json(&c, &s.url("/api/channels/dev/wait?timeout_s=1e300")).await;
    assert_eq!((status, v), (200, serde_json::json!([])));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "{took:?}"
    );
}

async fn health(c: &reqwest::Client, s: &Server) -> serde_json::Value {
    get_json(c, &s.url("/healthz")).await.1
}

async fn until(c: &reqwest::Client, s: &Server, key: &str, want: u64) {
    for _ in 0..100 {
        if health(c, s).await[key].as_u64() == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{key} never became {want}: {}", health(c, s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_or_stream_ends_when_its_client_goes_away() {
    let s = Server::start();
    let c = client();
    let waiter = {
        let c = client();
        let url = s.url("/api/channels/dev/wait?timeout_s=120");
        tokio::spawn(async move { c.get(url).send().await })
    };
    let sse = SseReader::open(&client(), &s.url("/api/channels/dev/stream"), None).await;
    until(&c, &s, "waits", 1).await;
    until(&c, &s, "streams", 1).await;
    waiter.abort();
    drop(sse);
    until(&c, &s, "waits", 0).await;
    until(&c, &s, "streams", 0).await;
}
