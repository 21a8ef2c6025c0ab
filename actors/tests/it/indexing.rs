//! The search indexer works in the background at the lowest priority, and keeps up with a
//! relay that is never quiet. In-process, on a temporary sled store.

use crate::support::*;
use crosstalk_actors::sled_store::SledStore;
use crosstalk_actors::{Relay, RelayConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn start(dir: &std::path::Path) -> Relay {
    let store = Arc::new(SledStore::open(dir).unwrap());
    Relay::start(store, RelayConfig::default()).unwrap().0
}

/// This process's threads whose name starts with one of `prefixes`, with their nice value.
fn threads_named(prefixes: &[&str]) -> Vec<(String, i64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // ended meanwhile
        };
        // `pid (comm) state …`: the name may hold spaces and parentheses, the fields after it
        // do not. Nice is the 19th field, the 17th after the name.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let nice = stat[close + 1..]
            .split_whitespace()
            .nth(16)
            .and_then(|n| n.parse().ok());
        if let (true, Some(nice)) = (prefixes.iter().any(|p| name.starts_with(p)), nice) {
            found.push((name.to_owned(), nice));
        }
    }
    found
}

// The indexing itself runs on tantivy's threads, which the index writer starts: they must
// not compete with the relay's own threads at its priority.
#[cfg(target_os = "linux")]
#[actix_rt::test]
async fn the_indexers_threads_all_run_at_the_lowest_priority() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start(dir.path());
    // tantivy's names, cut to the kernel's 15 bytes.
    let names = ["thrd-tantivy-in", "segment_updater", "merge_thread_"];
    let deadline = Instant::now() + Duration::from_secs(10);
    while threads_named(&names[..1]).is_empty() {
        assert!(Instant::now() < deadline, "no tantivy indexing thread started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every relay of this test binary starts its own; each must be lowered.
    let threads = threads_named(&names);
    assert!(!threads.is_empty());
    for (name, nice) in &threads {
        assert_eq!(*nice, 19, "thread {name} runs at nice {nice}: {threads:?}");
    }
    relay.shutdown().unwrap();
}

// An index on disk is read again only when the relay commits to it: no thread of tantivy's
// polls its meta file twice a second meanwhile, on an idle relay as on a busy one.
#[cfg(target_os = "linux")]
#[actix_rt::test]
async fn an_index_on_disk_is_not_polled() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SledStore::open(&dir.path().join("store")).unwrap());
    let config = RelayConfig {
        search_dir: Some(dir.path().join("search")),
        ..RelayConfig::default()
    };
    // The index is opened, and checked, as the relay starts.
    let relay = Relay::start(store, config).unwrap().0;
    assert!(dir.path().join("search").join("meta.json").exists());
    relay.post(&ch("polled"), msg("a", "indexed on disk")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !relay.search_index_lag().is_zero() {
        assert!(Instant::now() < deadline, "the index never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The kernel keeps 15 bytes of a thread's name: "thread-tantivy-meta-file-watcher".
    assert_eq!(threads_named(&["thread-tantivy-"]), vec![]);
    relay.shutdown().unwrap();
}

// Posts more often than the indexer's quiet period, for longer than its lag bound: the index
// catches up while the posting goes on, rather than leaving all of it to the first search.
#[actix_rt::test]
async fn a_relay_that_is_never_quiet_still_has_its_index_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let relay = start(dir.path());
    let started = Instant::now();
    // When the index last held everything, in ms since the posting began (at the last look).
    let mut caught_up_at = i128::MIN;
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(6) {
        relay
            .post(&ch("busy"), msg("a", &format!("steady work {n}")))
            .await
            .unwrap();
        n += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
        let at = started.elapsed().as_millis() as i128 - relay.search_index_lag().as_millis() as i128;
        caught_up_at = caught_up_at.max(at);
    }
    assert!(
        caught_up_at >= 2_500,
        "after {n} posts over 6 s, the index last held everything {caught_up_at} ms after they began"
    );
    relay.shutdown().unwrap();
}
