//! The SSE stream: live delivery, resume with Last-Event-ID, safe framing, slow readers.

use crate::common;
use common::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_sends_ready_then_history_then_live_messages() {
    let s = Server::start();
    let c = client();
    let old = post(&c, &s, "dev", msg("a", "old")).await;
    let mut sse = SseReader::open(&c, &s.url("/api/channels/dev/stream?since_id=0"), None).await;
    let ready = sse.next(T).await.expect("ready");
    assert_eq!(ready.event, "ready");
    let ready: serde_json::Value = serde_json::from_str(&ready.data).unwrap();
    assert_eq!(ready["channel"], "dev");
    assert_eq!(sse.next_message(T).await.unwrap(), old);
    let tricky = "line one\nline two\r\nevent: fake\n\ndata: injected\n";
    let live = post(&c, &s, "dev", msg("b", tricky)).await;
    let got = sse.next_message(T).await.expect("live message");
    assert_eq!(got, live);
    assert_eq!(got["body"], tricky, "a multi-line body arrives intact in one event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_resumes_with_exactly_what_was_missed() {
    let s = Server::start();
    let c = client();
    let mut sent = Vec::new();
    for i in 0..5 {
        sent.push(post(&c, &s, "dev", msg("a", &format!("m{i}"))).await);
    }
    // Seen up to the second message; the URL still says since_id=0, the header wins.
    let seen = sent[1]["id"].as_u64().unwrap();
    let mut sse = SseReader::open(&c, &s.url("/api/channels/dev/stream?since_id=0"), Some(seen)).await;
    assert_eq!(sse.next(T).await.unwrap().event, "ready");
    for want in &sent[2..] {
        assert_eq!(&sse.next_message(T).await.unwrap(), want);
    }
    let later = post(&c, &s, "dev", msg("a", "later")).await;
    assert_eq!(sse.next_message(T).await.unwrap(), later);
    assert!(
        sse.next_message(Duration::from_millis(300)).await.is_none(),
        "nothing twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subscriber_that_does_not_read_lags_then_catches_up_with_nothing_lost() {
    let s = Server::start();
    let c = client();
    // The slow one connects and then stops reading.
    let mut slow = SseReader::open(&c, &s.url("/api/channels/busy/stream"), None).await;
    assert_eq!(slow.next(T).await.unwrap().event, "ready");
    let mut live = SseReader::open(&c, &s.url("/api/channels/busy/stream"), None).await;
    assert_eq!(live.next(T).await.unwrap().event, "ready");
    // Far more than socket buffers hold: the relay must stop writing to the slow one.
    let body = "x".repeat(4096);
    let total = 2000;
    let mut posters = Vec::new();
    for p in 0..8 {
        let c = c.clone();
        let url = s.url("/api/channels/busy/messages");
        let body = body.clone();
        posters.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..total / 8 {
                let r = c
                    .post(&url)
                    .json(&msg(&format!("p{p}"), &format!("{i}{body}")))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "posting is not blocked by a slow subscriber");
                ids.push(r.json::<serde_json::Value>().await.unwrap()["id"].as_u64().unwrap());
            }
            ids
        }));
    }
    // Meanwhile the live subscriber keeps up.
    let mut live_ids = Vec::new();
    while live_ids.len() < total {
        let m = live.next_message(T).await.expect("live subscriber keeps receiving");
        live_ids.push(m["id"].as_u64().unwrap());
    }
    let mut acked: Vec<u64> = Vec::new();
    for p in posters {
        acked.extend(p.await.unwrap());
    }
    acked.sort_unstable();
    assert_eq!(live_ids, acked);
    // The slow one now reads everything, in order, exactly once.
    let mut slow_ids = Vec::new();
    while slow_ids.len() < total {
        let m = slow.next_message(T).await.expect("slow subscriber catches up");
        slow_ids.push(m["id"].as_u64().unwrap());
    }
    assert_eq!(slow_ids, acked);
    assert!(slow.next_message(Duration::from_millis(300)).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_participant_shows_in_presence_and_leaves_when_the_stream_closes() {
    let s = Server::start();
    let c = client();
    let mut watcher = SseReader::open(&c, &s.url("/api/channels/dev/stream"), None).await;
    assert_eq!(watcher.next(T).await.unwrap().event, "ready");
    let url = s.url("/api/channels/dev/stream?participant_id=carol&display_name=Carol&kind=human&side=Y");
    let carol = SseReader::open(&c, &url, None).await;
    let joined = watcher.next(T).await.unwrap();
    assert_eq!(joined.event, "presence");
    let joined: serde_json::Value = serde_json::from_str(&joined.data).unwrap();
    assert_eq!(joined["event"], "joined");
    assert_eq!(joined["participant"]["participant_id"], "carol");
    let (_, p) = get_json(&c, &s.url("/api/channels/dev/presence")).await;
    let who = &p[0];
    assert_eq!(
        (who["participant_id"].as_str(), who["kind"].as_str()),
        (Some("carol"), Some("human"))
    );
    assert_eq!(who["activity"], "streaming");
    drop(carol);
    let left = watcher.next(T).await.expect("left event");
    let left: serde_json::Value = serde_json::from_str(&left.data).unwrap();
    assert_eq!(
        (left["event"].as_str(), left["participant_id"].as_str()),
        (Some("left"), Some("carol"))
    );
}

/// A participant known from posting (as an agent) who opens a stream as a human is shown as
/// a human, and the others' streams are told (`joined` with the participant as it now is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poster_who_streams_as_a_human_is_announced_as_one() {
    let s = Server::start();
    let c = client();
    let r = c
        .post(s.url("/api/channels/dev/messages"))
        .json(&serde_json::json!({"sender": "humanZ", "body": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut watcher = SseReader::open(&c, &s.url("/api/channels/dev/stream"), None).await;
    assert_eq!(watcher.next(T).await.unwrap().event, "ready");
    let _human = SseReader::open(
        &c,
        &s.url("/api/channels/dev/stream?participant_id=humanZ&kind=human"),
        None,
    )
    .await;
    let mut seen = None;
    while let Some(e) = watcher.next(T).await {
        if e.event == "presence" {
            seen = Some(serde_json::from_str::<serde_json::Value>(&e.data).unwrap());
            break;
        }
    }
    let joined = seen.expect("a presence event");
    assert_eq!(joined["event"], "joined", "{joined}");
    assert_eq!(joined["participant"]["kind"], "human", "{joined}");
    let (_, p) = get_json(&c, &s.url("/api/channels/dev/presence")).await;
    assert_eq!(p[0]["kind"], "human", "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_gets_a_keep_alive_comment_every_15_seconds() {
    use futures_util::StreamExt;
    let s = Server::start();
    let r = client()
        .get(s.url("/api/channels/quiet/stream"))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    let started = std::time::Instant::now();
    let mut seen = String::new();
    while !seen.contains(": keep-alive\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(25), body.next())
            .await
            .expect("a keep-alive within 25 s")
            .expect("stream open")
            .unwrap();
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let after = started.elapsed();
    assert!(after >= Duration::from_secs(14), "not before the interval: {after:?}");
    assert!(seen.starts_with("retry: "), "the ready event came first: {seen:?}");
}
