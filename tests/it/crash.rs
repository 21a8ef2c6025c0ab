//! Crash safety: writers post continuously while the relay is killed with SIGKILL at random
//! moments and restarted on the same data. Every acknowledged message must survive with its
//! id and body, nothing may be duplicated, ids keep increasing, SSE clients that reconnect
//! with Last-Event-ID end up with exactly the log, and a damaged store tail is reported and
//! everything before it served.

use crate::common;
use common::*;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

const CHANNELS: [&str; 3] = ["c0", "c1", "c2"];
const WRITERS_PER_CHANNEL: usize = 3;
const CRASHES: usize = 10;

#[derive(Default)]
struct Acked {
    /// (channel, id, body) for every 200 a writer received.
    list: Vec<(String, u64, String)>,
}

async fn sse_reader(
    base: Arc<RwLock<String>>,
    channel: &'static str,
    seen: Arc<Mutex<Vec<(u64, String)>>>,
    stop: Arc<AtomicBool>,
) {
    let c = client();
    while !stop.load(Ordering::Relaxed) {
        let last = seen.lock().unwrap().last().map(|m| m.0);
        let url = format!("{}/api/channels/{channel}/stream", base.read().unwrap());
        let mut req = c.get(&url).timeout(Duration::from_secs(120));
        if let Some(id) = last {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let Ok(resp) = req.send().await else {
            tokio::time::sleep(Duration::from_millis(30)).await;
            continue;
        };
        use futures_util::StreamExt;
        let mut body = resp.bytes_stream();
        let mut buf = String::new();
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let chunk = match tokio::time::timeout(Duration::from_millis(200), body.next()).await {
                Err(_) => continue,
                Ok(Some(Ok(chunk))) => chunk,
                Ok(_) => break,
            };
            buf.push_str(std::str::from_utf8(&chunk).expect("utf8"));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                if !frame.contains("event: message") {
                    continue;
                }
                let data = frame.lines().find_map(|l| l.strip_prefix("data: ")).expect("data line");
                let m: Value = serde_json::from_str(data).expect("message json");
                seen.lock()
                    .unwrap()
                    .push((m["id"].as_u64().unwrap(), m["body"].as_str().unwrap().to_owned()));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_messages_survive_repeated_sigkill() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("crash test seed {seed}");
    let mut rng = Rng(seed);

    let mut server = Server::process(&[]);
    let tmp = server.take_dir().unwrap();
    let dir = tmp.path().to_path_buf();
    let base = Arc::new(RwLock::new(server.base.clone()));
    let stop_writers = Arc::new(AtomicBool::new(false));
    let stop_readers = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Acked::default()));
    // Every body ever attempted: a message in the log must be one of them, at most once.
    let attempted = Arc::new(Mutex::new(HashSet::new()));

    let mut writers = Vec::new();
    for ch in CHANNELS {
        for w in 0..WRITERS_PER_CHANNEL {
            let (base, stop, acked, attempted) = (base.clone(), stop_writers.clone(), acked.clone(), attempted.clone());
            writers.push(tokio::spawn(async move {
                let c = client();
                let mut last_id = 0;
                let mut seq = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let body = format!("{ch}/w{w}/{seq}");
                    attempted.lock().unwrap().insert(body.clone());
                    let url = format!("{}/api/channels/{ch}/messages", base.read().unwrap());
                    let sent = c
                        .post(&url)
                        .timeout(Duration::from_secs(3))
                        .json(&msg(&format!("w{w}"), &body))
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status() == 200 => {
                            let Ok(m) = r.json::<Value>().await else { continue };
                            let id = m["id"].as_u64().unwrap();
                            assert!(
                                id > last_id,
                                "a writer's acknowledged ids increase: {id} after {last_id}"
                            );
                            last_id = id;
                            acked.lock().unwrap().list.push((ch.to_owned(), id, body));
                        }
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }));
        }
    }
    let mut readers = Vec::new();
    let mut seen_by = Vec::new();
    for ch in CHANNELS {
        let seen = Arc::new(Mutex::new(Vec::new()));
        seen_by.push((ch, seen.clone()));
        readers.push(tokio::spawn(sse_reader(base.clone(), ch, seen, stop_readers.clone())));
    }

    for round in 0..CRASHES {
        tokio::time::sleep(Duration::from_millis(rng.between(300, 1200))).await;
        server.kill();
        server = Server::start_in(&dir, &[]);
        *base.write().unwrap() = server.base.clone();
        println!(
            "crash {round}: {} acknowledged so far",
            acked.lock().unwrap().list.len()
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_writers.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acked = std::mem::take(&mut acked.lock().unwrap().list);
    assert!(acked.len() > 50, "the writers got through: {}", acked.len());

    // The log reads back clean: every record decodes and no start-up found damage.
    let c = client();
    let mut log: HashMap<&str, Vec<Value>> = HashMap::new();
    let mut all_ids = HashSet::new();
    let attempted = attempted.lock().unwrap().clone();
    for ch in CHANNELS {
        let read = messages(&c, &server, ch, 0).await;
        let got = ids(&read);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{ch}: ids strictly increase");
        let mut bodies = HashSet::new();
        for m in &read {
            let body = m["body"].as_str().unwrap();
            assert!(attempted.contains(body), "{ch}: {body} was never posted");
            assert!(bodies.insert(body.to_owned()), "{ch}: {body} is stored twice");
            assert!(
                all_ids.insert(m["id"].as_u64().unwrap()),
                "ids are unique across channels"
            );
        }
        log.insert(ch, read);
    }
    for (ch, id, body) in &acked {
        let found = log[ch.as_str()].iter().find(|m| m["id"].as_u64() == Some(*id));
        let found = found.unwrap_or_else(|| panic!("acknowledged {ch}#{id} ({body}) is missing"));
        assert_eq!(found["body"].as_str(), Some(body.as_str()), "{ch}#{id} kept its body");
    }
    // SSE readers that lived through the crashes catch up to exactly the log, in order,
    // and never saw anything the log does not have.
    let deadline = Instant::now() + Duration::from_secs(20);
    for (ch, seen) in &seen_by {
        let want: Vec<(u64, String)> = log[ch]
            .iter()
            .map(|m| (m["id"].as_u64().unwrap(), m["body"].as_str().unwrap().to_owned()))
            .collect();
        loop {
            let got = seen.lock().unwrap().clone();
            if got.len() >= want.len() || Instant::now() > deadline {
                assert_eq!(got, want, "{ch}: the SSE client's view equals the log");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    stop_readers.store(true, Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
    let err = server.stderr();
    assert!(!err.contains("damage"), "no damage after plain crashes:\n{err}");
    assert!(!err.contains("ERROR"), "no errors logged:\n{err}");
    println!("{} acknowledged messages survived {CRASHES} crashes", acked.len());
    drop(tmp);
}

async fn fill(s: &Server, channel: &str, n: usize) -> Vec<Value> {
    let c = client();
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            post(
                &c,
                s,
                channel,
                msg("a", &format!("{channel} message {i} with a little padding")),
            )
            .await,
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_record_is_reported_and_everything_before_it_served() {
    use crosstalk_actors::sled_store::SledStore;
    use crosstalk_schema::ChannelName;
    let mut s = Server::process(&[]);
    let sent = fill(&s, "dev", 20).await;
    s.terminate();
    let tmp = s.take_dir().unwrap();
    let last = sent.last().unwrap()["id"].as_u64().unwrap();
    {
        // Simulate a torn write of the newest record.
        let store = SledStore::open(tmp.path()).unwrap();
        store
            .put_raw_event(&ChannelName::parse("dev").unwrap(), last, &[1, 2, 3, 4, 5, 6])
            .unwrap();
        crosstalk_actors::EventStore::flush(&store).unwrap();
    }
    let s = Server::start_in(tmp.path(), &[]);
    let c = client();
    assert_eq!(messages(&c, &s, "dev", 0).await, sent[..sent.len() - 1].to_vec());
    let err = s.stderr();
    assert!(err.contains("store damage repaired in channel dev"), "{err}");
    assert!(err.contains(&format!("[{last}]")), "names the dropped id: {err}");
    let next = post(&c, &s, "dev", msg("a", "after repair")).await;
    assert!(next["id"].as_u64().unwrap() > last, "the dropped id is not reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_store_file_is_reported_and_its_prefix_served() {
    let mut s = Server::process(&[]);
    let sent = fill(&s, "dev", 300).await;
    s.kill();
    let tmp = s.take_dir().unwrap();
    let db = tmp.path().join("db");
    let len = std::fs::metadata(&db).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    file.set_len(len - len / 10).unwrap();
    drop(file);

    let s = Server::start_in(tmp.path(), &[]);
    let c = client();
    let served = messages(&c, &s, "dev", 0).await;
    assert!(served.len() < sent.len(), "cutting the file lost something");
    assert_eq!(
        served,
        sent[..served.len()].to_vec(),
        "what is served is an intact prefix"
    );
    let err = s.stderr();
    let last = sent.last().unwrap()["id"].as_u64().unwrap();
    assert!(
        err.contains(&format!("but ids up to {last} were acknowledged")),
        "the loss is reported: {err}"
    );
    let next = post(&c, &s, "dev", msg("a", "after")).await;
    assert!(next["id"].as_u64().unwrap() > last, "lost ids are not reused");
}

/// sled's writes run on the thread that flushes (the store thread), not on a pool of IO
/// threads that every flush woke at once (`vendor/sled/PATCHED.md`): after writes and
/// flushes, the relay has no `sled-io-*` thread, and what it acknowledged is read back after
/// a SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_writes_on_the_store_thread_and_keeps_no_io_pool() {
    let mut s = Server::process(&[]);
    let written = fill(&s, "pool", 200).await;
    let pid = s.pid();
    let pool: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc lists the relay's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.starts_with("sled-io"))
        .collect();
    assert!(pool.is_empty(), "sled IO threads: {pool:?}");
    s.kill();
    let tmp = s.take_dir().unwrap();
    let s = Server::start_in(tmp.path(), &[]);
    assert_eq!(messages(&client(), &s, "pool", 0).await, written);
}
