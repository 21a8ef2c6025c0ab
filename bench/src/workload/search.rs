//! Search: a store of `plan.search_messages` messages, each 100 bytes of words drawn
//! from a 5,000-word vocabulary with Zipf-like frequencies (a few words in most messages, most
//! words rare), filled over HTTP with `--durability relaxed` from many connections. Then:
//! how long the first search takes to answer (it waits for the index to catch up with the
//! whole store: the indexing rate); queries of six kinds — a common word, a rare word, a
//! prefix, a phrase, a word with a typo, two words — each run `QUERIES` times one after
//! another, with p50 and p95 of each and of all; the index's size on disk; the relay's RSS
//! after the queries. crosstalk only.

use super::startup::fill_over_http;
use super::{Done, Plan, Record};
use crate::client::{get_once, Conn};
use crate::target::{disk_usage, Kind, Launcher};
use anyhow::{bail, Context as _};
use bytes::Bytes;
use std::path::Path;
use std::time::{Duration, Instant};

const CHANNELS: u64 = 16;
const FILL_CONNECTIONS: usize = 64;
const VOCABULARY: usize = 5_000;
/// Timed runs of each query.
const QUERIES: usize = 200;

/// The `rank`-th word of the vocabulary: pronounceable, distinct, 5–9 letters.
fn word(rank: usize) -> String {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "de", "po", "ga", "fe", "zu", "bi", "ho", "tr",
    ];
    let mut w = String::new();
    let mut n = rank + 16 * 16;
    while n > 0 {
        w.push_str(SYLLABLES[n % 16]);
        n /= 16;
    }
    w.push('x');
    w
}

/// A cheap deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A rank with Zipf-like weights: rank r about as likely as 1 / (r + 1).
    fn zipf(&mut self) -> usize {
        let u = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        let r = ((VOCABULARY as f64 + 1.0).powf(u) - 1.0) as usize;
        r.min(VOCABULARY - 1)
    }
}

fn body(rng: &mut Rng) -> String {
    let mut s = String::new();
    while s.len() < 100 {
        s.push_str(&word(rng.zipf()));
        s.push(' ');
    }
    s.truncate(100);
    s
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn search(plan: &Plan, launcher: &Launcher, dir: &Path, rec: &mut Record) -> anyhow::Result<Done> {
    if launcher.kind != Kind::Crosstalk {
        return Ok(Done::Skipped("crosstalk only".into()));
    }
    let n = plan.search_messages;
    let (server, _) = launcher.start(dir, &["--durability", "relaxed"], "search").await?;
    let rate = fill_over_http(server.addr, n, FILL_CONNECTIONS, |c| {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (c as u64 + 1));
        move |i| {
            let json = format!(r#"{{"sender":"bench-{:02}","body":"{}"}}"#, c % 16, body(&mut rng));
            (
                format!("/api/channels/bench-search-{}/messages", i % CHANNELS),
                Bytes::from(json),
            )
        }
    })
    .await
    .context("filling the store")?;
    rec.set("search_fill_per_s", rate);
    // The first search waits for the index to hold everything posted.
    let started = Instant::now();
    let r = get_once(server.addr, &format!("/api/search?q={}&limit=10", word(0))).await?;
    if !r.status.is_success() {
        bail!("the first search answered {}", r.status);
    }
    let first = started.elapsed();
    rec.set("search_first_s", first.as_secs_f64());
    rec.set("search_index_per_s", n as f64 / first.as_secs_f64().max(1e-6));
    let common = word(0);
    let rare = word(VOCABULARY - 7);
    let mid = word(40);
    let prefix = &mid[..mid.len() - 3];
    let typo = {
        let mut c: Vec<char> = word(25).chars().collect();
        c.swap(1, 2);
        c.into_iter().collect::<String>()
    };
    let queries: [(&str, String); 6] = [
        ("common", common.clone()),
        ("rare", rare),
        ("prefix", prefix.to_owned()),
        ("phrase", format!("\"{} {}\"", word(0), word(1))),
        ("typo", typo),
        ("two", format!("{} {}", word(3), word(9))),
    ];
    let mut conn = Conn::connect(server.addr).await?;
    let mut all = Vec::new();
    let budget = Instant::now() + Duration::from_secs(300);
    for (name, q) in &queries {
        let path = format!("/api/search?q={}&limit=20", urlencode(q));
        let mut times = Vec::with_capacity(QUERIES);
        for _ in 0..QUERIES.min(if plan.smoke { 10 } else { QUERIES }) {
            let t = Instant::now();
            let r = conn.get(&path).await?;
            if !r.status.is_success() {
                bail!("search {q:?} answered {}", r.status);
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
            if Instant::now() > budget {
                bail!("the queries took longer than 300 s");
            }
        }
        times.sort_by(f64::total_cmp);
        rec.set(&format!("search_{name}_p50_ms"), percentile(&times, 0.5));
        rec.set(&format!("search_{name}_p95_ms"), percentile(&times, 0.95));
        all.extend(times);
    }
    all.sort_by(f64::total_cmp);
    rec.set("search_p50_ms", percentile(&all, 0.5));
    rec.set("search_p95_ms", percentile(&all, 0.95));
    rec.set("search_rss_mib", server.rss_kib()? as f64 / 1024.0);
    server.stop().await?;
    rec.set(
        "search_index_mib",
        disk_usage(&dir.join("search-index"))? as f64 / (1024.0 * 1024.0),
    );
    rec.set("search_messages", n as f64);
    Ok(Done::Ran)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            b' ' => "+".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_is_distinct_and_bodies_are_100_bytes() {
        let words: std::collections::HashSet<String> = (0..VOCABULARY).map(word).collect();
        assert_eq!(words.len(), VOCABULARY);
        let mut rng = Rng(7);
        assert_eq!(body(&mut rng).len(), 100);
        let common = (0..10_000).filter(|_| rng.zipf() == 0).count();
        assert!(common > 500, "the commonest word is common: {common}");
    }
}
