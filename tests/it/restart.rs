//! Restarts: graceful shutdown is quick and loses nothing; a crash (SIGKILL) loses nothing
//! acknowledged; ids continue without reuse.

use crate::common;
use common::*;
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

/// What a search for `words` (all of them, in `channel` if named) must answer: ids newest
/// first, at most `limit`.
fn expected(posted: &[(u64, String, String)], words: &str, channel: Option<&str>, limit: usize) -> Vec<u64> {
    let wanted = crosstalk_actors::search::terms(words);
    let mut ids: Vec<u64> = posted
        .iter()
        .filter(|(_, ch, body)| {
            let have = crosstalk_actors::search::terms(body);
            channel.is_none_or(|c| c == ch) && wanted.iter().all(|w| have.contains(w))
        })
        .map(|(id, _, _)| *id)
        .collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    ids.truncate(limit);
    ids
}

/// Each query's results are exactly what [`expected`] says.
async fn searches_find_what_was_posted(
    c: &reqwest::Client,
    s: &Server,
    posted: &[(u64, String, String)],
    queries: &[(&str, Option<&str>, usize)],
) {
    for &(words, channel, limit) in queries {
        let want = expected(posted, words, channel, limit);
        assert_eq!(
            search_ids(c, s, words, channel, limit).await,
            want,
            "{words:?} in {channel:?}"
        );
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

/// The index keeps one key per term and block of message ids. Searches page through many
/// blocks newest first and find exactly what was posted; and a store holding the first index
/// format (one key per term and message, as relays before the blocks wrote it) is converted
/// at start, answers the same searches, and is left with no first-format key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_answers_the_same_from_index_blocks_and_after_converting_the_first_format() {
    use crosstalk_actors::sled_store::SledStore;
    use crosstalk_actors::store::{EventStore, Space};

    let mut s = Server::process(&[]);
    let c = client();
    let words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
    let mut rng = Rng(11);
    let mut posted = Vec::new();
    // More ids than one page of blocks holds (16 blocks of 64), for the common term.
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
    assert_eq!(expected(&posted, "every", None, 10_000).len(), 1300);
    let (_, clean) = s.terminate();
    assert!(clean);

    // Rewrite the index as the first format held it: `term\0{id}` → channel, every posting
    // its own key, and no blocks.
    let dir = s.take_dir().unwrap();
    let (old_keys, block_keys) = {
        let store = SledStore::open(dir.path()).unwrap();
        let blocks = store.scan_aux(Space::Postings, b"", usize::MAX).unwrap();
        assert!(!blocks.is_empty() && blocks.len() < 1300, "{} blocks", blocks.len());
        let drop_blocks: Vec<_> = blocks.into_iter().map(|(k, _)| (k, None)).collect();
        store.write_aux(Space::Postings, &drop_blocks).unwrap();
        let mut old = Vec::new();
        let mut blocks = std::collections::HashSet::new();
        for (id, channel, body) in &posted {
            for term in crosstalk_actors::search::terms(body) {
                blocks.insert((term.clone(), id / 64));
                let mut key = term.into_bytes();
                key.push(0);
                key.extend_from_slice(&id.to_be_bytes());
                old.push((key, channel.as_bytes().to_vec()));
            }
        }
        store.put_aux_batch(Space::Search, &old).unwrap();
        store.flush().unwrap();
        (old.len(), blocks.len())
    };

    let mut s2 = Server::start_in(dir.path(), &[]);
    searches_find_what_was_posted(&c, &s2, &posted, &queries).await;
    let (_, clean) = s2.terminate();
    assert!(clean);
    let store = SledStore::open(dir.path()).unwrap();
    assert!(
        store.scan_aux(Space::Search, b"", 1).unwrap().is_empty(),
        "first-format keys left"
    );
    // One key per term and block of 64 ids.
    let blocks = store.scan_aux(Space::Postings, b"", usize::MAX).unwrap().len();
    assert_eq!(blocks, block_keys, "keys for {old_keys} postings");
}
