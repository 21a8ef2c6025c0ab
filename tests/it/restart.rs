//! Restarts: graceful shutdown is quick and loses nothing; a crash (SIGKILL) loses nothing
//! acknowledged; ids continue without reuse.

use crate::common;
use common::*;
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_a_graceful_restart_and_ids_continue() {
    let mut s = Server::process(&[]);
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
    until_waits(&c, &s.url(""), 1).await;
    let (took, clean) = s.terminate();
    assert!(clean, "exit status is success");
    // The relay gives in-flight requests 1 s; held ones (actix's default) would keep it 30 s.
    assert!(took < Duration::from_secs(5), "SIGTERM to exit took {took:?}");
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

/// `crosstalk serve 2>&1 | head -3`: once `head` has exited, every log line the relay writes
/// fails (a closed pipe). That must not stop a shutdown: SIGTERM and SIGINT each still end the
/// relay within 2 s, cleanly, with what it acknowledged flushed (the relay kept serving, and
/// ignored both signals, when its first log line of the shutdown failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_log_pipe_does_not_stop_a_shutdown() {
    let c = client();
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let mut s = Server::start_unheard(&[]);
        let acked = post(&c, &s, "dev", msg("x", "before the signal")).await;
        let (took, clean) = tokio::task::block_in_place(|| s.signal(signal));
        assert!(clean, "signal {signal}: the relay did not exit cleanly");
        assert!(took < Duration::from_secs(2), "signal {signal}: exit took {took:?}");
        let dir = s.take_dir().unwrap();
        let s2 = Server::start_in(dir.path(), &[]);
        assert_eq!(messages(&c, &s2, "dev", 0).await, vec![acked], "signal {signal}");
    }
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
    let mut s = Server::process(args);
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

/// The words of a text as the index sees them: lowercase runs of letters and digits.
fn words_of(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// What a search for `words` (all of them, in `channel` if named) must find: the ids of the
/// messages holding every word (the posted words are far apart, so no prefix or one-edit
/// match adds any), in id order.
fn expected(posted: &[(u64, String, String)], words: &str, channel: Option<&str>) -> Vec<u64> {
    let wanted = words_of(words);
    posted
        .iter()
        .filter(|(_, ch, body)| {
            let have = words_of(body);
            channel.is_none_or(|c| c == ch) && wanted.iter().all(|w| have.contains(w))
        })
        .map(|(id, _, _)| *id)
        .collect()
}

/// Each query finds exactly what [`expected`] says (at most `limit` of them, every one of
/// which is expected).
async fn searches_find_what_was_posted(
    c: &reqwest::Client,
    s: &Server,
    posted: &[(u64, String, String)],
    queries: &[(&str, Option<&str>, usize)],
) {
    for &(words, channel, limit) in queries {
        let want = expected(posted, words, channel);
        let mut got = search_ids(c, s, words, channel, limit).await;
        got.sort_unstable();
        if want.len() <= limit {
            assert_eq!(got, want, "{words:?} in {channel:?}");
        } else {
            assert_eq!(got.len(), limit, "{words:?} in {channel:?}");
            assert!(
                got.iter().all(|id| want.contains(id)),
                "{words:?} in {channel:?}: {got:?}"
            );
        }
    }
}

async fn search_ids(c: &reqwest::Client, s: &Server, words: &str, channel: Option<&str>, limit: usize) -> Vec<u64> {
    let mut url = reqwest::Url::parse(&s.url("/api/search")).unwrap();
    url.query_pairs_mut()
        .append_pair("q", words)
        .append_pair("limit", &limit.to_string());
    if let Some(ch) = channel {
        url.query_pairs_mut().append_pair("channel", ch);
    }
    let (status, found) = get_json(c, url.as_str()).await;
    assert_eq!(status, 200, "{found}");
    found
        .as_array()
        .expect("a list of messages")
        .iter()
        .map(|m| m["id"].as_u64().unwrap())
        .collect()
}

/// The index is a cache of the log: searches find exactly what was posted; after a restart
/// they find the same from the index as it was committed; with the index deleted, or one of
/// its files damaged, the relay rebuilds it from the log and they find the same again. The
/// keys an earlier version kept its own index under are removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_is_rebuilt_from_the_log_when_its_index_is_missing_or_damaged() {
    use crosstalk_actors::sled_store::SledStore;
    use crosstalk_actors::store::{EventStore, Space};

    let mut s = Server::process(&[]);
    let c = client();
    let words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
    let mut rng = Rng(11);
    let mut posted = Vec::new();
    for i in 0..1300 {
        let channel = format!("s{}", i % 4);
        let body = format!(
            "every {} {} n{}",
            rng.pick(&words),
            rng.pick(&words),
            rng.between(0, 40)
        );
        let m = post(&c, &s, &channel, msg("x", &body)).await;
        posted.push((m["id"].as_u64().unwrap(), channel, body));
    }
    let queries: [(&str, Option<&str>, usize); 7] = [
        ("every", None, 10_000),
        ("EVERY", None, 5),
        ("every", Some("s1"), 10_000),
        ("alpha beta", None, 10_000),
        ("n7", None, 10_000),
        ("n7 gamma", Some("s2"), 10_000),
        ("absent", None, 10_000),
    ];
    searches_find_what_was_posted(&c, &s, &posted, &queries).await;
    assert_eq!(expected(&posted, "every", None).len(), 1300);
    let (_, clean) = s.terminate();
    assert!(clean);
    let dir = s.take_dir().unwrap();
    // An earlier version's index keys, to be removed.
    {
        let store = SledStore::open(dir.path()).unwrap();
        store
            .put_aux_batch(Space::Postings, &[(b"every\0\0\0\0\0\0\0\0\0".to_vec(), vec![1])])
            .unwrap();
        store
            .put_aux_batch(
                Space::Search,
                &[(b"every\0\0\0\0\0\0\0\0\x01".to_vec(), b"s0".to_vec())],
            )
            .unwrap();
        store.flush().unwrap();
    }
    let index = dir.path().join("search-index");

    // As committed.
    let mut s2 = Server::start_in(dir.path(), &[]);
    searches_find_what_was_posted(&c, &s2, &posted, &queries).await;
    let (_, clean) = s2.terminate();
    assert!(clean);
    // Missing.
    std::fs::remove_dir_all(&index).unwrap();
    let mut s3 = Server::start_in(dir.path(), &[]);
    searches_find_what_was_posted(&c, &s3, &posted, &queries).await;
    let (_, clean) = s3.terminate();
    assert!(clean);
    // Damaged: every segment file cut short.
    let mut cut = 0;
    for f in std::fs::read_dir(&index).unwrap().flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".store") || name.ends_with(".idx") || name.ends_with(".term") {
            let len = f.metadata().unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(f.path())
                .unwrap()
                .set_len(len / 2)
                .unwrap();
            cut += 1;
        }
    }
    assert!(cut > 0, "no segment files in {}", index.display());
    let mut s4 = Server::start_in(dir.path(), &[]);
    searches_find_what_was_posted(&c, &s4, &posted, &queries).await;
    let (_, clean) = s4.terminate();
    assert!(clean);
    let store = SledStore::open(dir.path()).unwrap();
    for space in [Space::Postings, Space::Search] {
        assert!(
            store.scan_aux(space, b"", 1).unwrap().is_empty(),
            "earlier index keys left in {space:?}"
        );
    }
}

/// Only messages take ids, as in crosstalk-mcp and cross-claude-mcp: creating a channel,
/// describing it, starting and ending a session take none, so a fresh relay's first message is
/// 1 and ids go up by one across the relay. What those changes did survives a SIGKILL, and ids
/// go on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_messages_take_ids_and_what_takes_none_survives_a_crash() {
    let mut s = Server::process(&[]);
    let c = client();
    let (status, _) = request(
        &c,
        "POST",
        &s.url("/api/channels"),
        Some(json!({"name": "plans", "description": "the release plan"})),
        None,
    )
    .await;
    assert!(status < 300, "{status}");
    let (status, _) = request(&c, "POST", &s.url("/api/channels/plans/session"), None, None).await;
    assert_eq!(status, 200);
    let first = post(&c, &s, "plans", msg("alice", "first")).await;
    // On a cluster ids come from the shared log's positions instead (unique, increasing).
    let lone = std::env::var_os("CROSSTALK_TEST_NATS").is_none();
    if lone {
        assert_eq!(first["id"], 1, "{first}");
    }
    let (status, _) = request(&c, "DELETE", &s.url("/api/channels/plans/session"), None, None).await;
    assert_eq!(status, 200);
    let (status, _) = request(
        &c,
        "POST",
        &s.url("/api/channels"),
        Some(json!({"name": "other", "description": "elsewhere"})),
        None,
    )
    .await;
    assert!(status < 300, "{status}");
    let second = post(&c, &s, "other", msg("bob", "second")).await;
    if lone {
        assert_eq!(second["id"], 2, "{second}");
    }
    assert!(second["id"].as_u64() > first["id"].as_u64());
    // A channel with a description and no message is listed, and all of it survives a crash.
    let (status, _) = request(
        &c,
        "POST",
        &s.url("/api/channels"),
        Some(json!({"name": "empty", "description": "nothing yet"})),
        None,
    )
    .await;
    assert!(status < 300, "{status}");
    s.kill();
    let dir = s.take_dir().unwrap();
    let s2 = Server::start_in(dir.path(), &[]);
    let (_, list) = get_json(&c, &s2.url("/api/channels")).await;
    let described: std::collections::BTreeMap<String, String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["channel"].as_str().unwrap().to_owned(),
                c["description"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        described.get("plans").map(String::as_str),
        Some("the release plan"),
        "{list}"
    );
    assert_eq!(
        described.get("empty").map(String::as_str),
        Some("nothing yet"),
        "{list}"
    );
    let (status, st) = get_json(&c, &s2.url("/api/channels/plans/session")).await;
    assert_eq!(status, 404, "the session stays ended: {st}");
    let third = post(&c, &s2, "plans", msg("alice", "third")).await;
    if lone {
        assert_eq!(third["id"], 3, "{third}");
    }
    assert!(third["id"].as_u64() > second["id"].as_u64());
}
