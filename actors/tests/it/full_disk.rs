//! A real full filesystem, in-process: a sled store on a tmpfs of a few MiB (mounted for the
//! test, so it needs root, as the test command runs in CI), filled until writes fail, then
//! given space again. sled keeps the I/O error of its first failed write forever; the store
//! thread opens the store again once it can. Writes must resume by themselves within seconds,
//! with every acknowledged message there and no refused one, in memory and on disk.

use crate::support::*;
use crate::tmpfs::{fill, Tmpfs};
use crosstalk_actors::sled_store::SledStore;
use crosstalk_actors::{Relay, RelayConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Opens the store, waiting out the file lock a just-dropped store may hold for a moment.
fn open(dir: &Path) -> SledStore {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match SledStore::open(dir) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline && e.to_string().contains("lock") => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("open: {e}"),
        }
    }
}

/// A copy of a store's files as they are now, for a restart to read while the relay's threads
/// may still hold the originals' lock.
pub(crate) fn copy_of(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in walk(dir) {
        let to = copy.path().join(entry.strip_prefix(dir).unwrap());
        if entry.is_dir() {
            std::fs::create_dir_all(&to).unwrap();
        } else {
            std::fs::copy(&entry, &to).unwrap();
        }
    }
    copy
}

#[actix_rt::test]
async fn a_full_filesystem_heals_by_itself_once_space_returns() {
    let Some(fs) = Tmpfs::mount("16m") else { return };
    let dir: PathBuf = fs.path().join("store");
    std::fs::create_dir(&dir).unwrap();
    let store = Arc::new(open(&dir));
    let relay = Relay::start(store.clone(), RelayConfig::default()).unwrap().0;
    relay.post(&ch("dev"), msg("writer", "before")).await.unwrap();

    let filler = fs.path().join("filler");
    fill(&filler);
    let mut acknowledged = vec!["before".to_string()];
    let mut refused = Vec::new();
    for i in 0..3000 {
        let body = format!("{i:04} {}", "x".repeat(1024));
        match relay.post(&ch("dev"), msg("writer", &body)).await {
            Ok(_) => acknowledged.push(body),
            Err(_) => refused.push(body),
        }
        if refused.len() >= 20 {
            break;
        }
    }
    assert!(refused.len() >= 20, "the full filesystem never refused a write");
    assert!(relay.store_health().is_err(), "health says the store fails");
    // Still full: still refused, a few seconds on (the store thread has tried again by then).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(relay.post(&ch("dev"), msg("writer", "still full")).await.is_err());
    refused.push("still full".into());

    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    let deadline = freed + Duration::from_secs(20);
    loop {
        match relay.post(&ch("dev"), msg("writer", "after")).await {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "writes did not resume 20 s after space returned: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    eprintln!(
        "writes resumed {:.1} s after space returned",
        freed.elapsed().as_secs_f64()
    );
    acknowledged.push("after".into());
    assert!(relay.store_health().is_ok(), "{:?}", relay.store_health());
    assert_eq!(
        bodies(&relay, "dev").await,
        acknowledged,
        "the relay serves exactly what it acknowledged"
    );
    assert_eq!(
        stored_bodies(store.as_ref(), "dev"),
        acknowledged,
        "the store holds exactly that"
    );
    relay.shutdown().unwrap();

    // What a restart reads: a copy of the store's files as they are now (the relay's threads
    // may hold the originals' lock a while longer) holds the same, and no refused write.
    let copy = copy_of(&dir);
    let restarted = Relay::start(Arc::new(open(copy.path())), RelayConfig::default())
        .unwrap()
        .0;
    let after_restart = bodies(&restarted, "dev").await;
    assert_eq!(after_restart, acknowledged);
    assert!(refused.iter().all(|r| !after_restart.contains(r)));
    restarted.post(&ch("dev"), msg("writer", "next")).await.unwrap();
    restarted.shutdown().unwrap();
}

/// Every file and folder under `dir`, folders before what they hold.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.push(path.clone());
        if path.is_dir() {
            out.extend(walk(&path));
        }
    }
    out
}
