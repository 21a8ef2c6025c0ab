//! The physical reference (issue #57): crosstalk's durable POST beside a minimal durable server
//! on the same stack (`crosstalk-reference`, `bench/src/reference.rs`: one route, one parse,
//! one store thread group-committing every queued post in one sled batch and one flush) and
//! beside the same server storing nothing (HTTP alone). The three are alternated, round after
//! round, from 16 and from 64 connections on the same body, so the hour's drift falls on all
//! three alike. Records each one's mean rate per connection count, and crosstalk's rate as a
//! share of the minimal durable server's.

use super::{Done, Plan, Record};
use crate::stats::summarize;
use crate::target::{Launcher, Server};
use crate::workload::post::post_load;
use anyhow::Context as _;
use std::path::{Path, PathBuf};

/// Connection counts the three are compared at.
pub const CONNECTIONS: [usize; 2] = [16, 64];

/// The reference's binary: beside the benchmark's own.
fn reference_binary() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe().context("the benchmark's own path")?;
    let bin = me.with_file_name("crosstalk-reference");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: build it with cargo build -p crosstalk-bench",
        bin.display()
    );
    Ok(bin)
}

pub async fn reference(plan: &Plan, launcher: &Launcher, dir: &Path, rec: &mut Record) -> anyhow::Result<Done> {
    let reference = Launcher {
        program: reference_binary()?,
        wrapper: Vec::new(),
        ..launcher.clone()
    };
    let sides: [(&str, &Launcher, &[&str]); 3] = [
        ("crosstalk", launcher, &[]),
        ("durable", &reference, &[]),
        ("http", &reference, &["--no-store"]),
    ];
    let mut servers: Vec<(&str, Server)> = Vec::new();
    for (name, l, args) in sides {
        let (server, _) = l.start(&dir.join(name), args, &format!("reference-{name}")).await?;
        servers.push((name, server));
    }
    let rounds = plan.reference_rounds;
    // Rounds of 5 s at most: three sides, two connection counts, several rounds.
    let mut plan = plan.clone();
    plan.duration = plan.duration.min(std::time::Duration::from_secs(5));
    let plan = &plan;
    // rates[side][connections] over the rounds.
    let mut rates = vec![vec![Vec::new(); CONNECTIONS.len()]; servers.len()];
    let mut p99s = vec![vec![Vec::new(); CONNECTIONS.len()]; servers.len()];
    // Seconds the relay's search index took to catch up after its side of each round.
    let mut catch_up = Vec::new();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    for round in 0..rounds {
        for (s, (name, server)) in servers.iter().enumerate() {
            for (c, connections) in CONNECTIONS.iter().enumerate() {
                let channel = format!("reference-{round}-{connections}");
                let res = post_load(plan, server, &channel, *connections).await?;
                res.check(&format!("{name} POST"))?;
                let lat = summarize(&res.latencies);
                rec.note(format!(
                    "reference round {}: {name} from {connections} connections: {:.0}/s, p99 {:.2} ms",
                    round + 1,
                    res.rate(),
                    lat.p99_ms
                ));
                rates[s][c].push(res.rate());
                p99s[s][c].push(lat.p99_ms);
            }
            if *name == "crosstalk" {
                let took = index_caught_up(server).await?;
                rec.note(format!(
                    "reference round {}: crosstalk's search index caught up in {:.2} s",
                    round + 1,
                    took.as_secs_f64()
                ));
                catch_up.push(took.as_secs_f64());
            }
        }
    }
    rec.set("reference_crosstalk_index_catch_up_s", mean(&catch_up));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    for (s, (name, _)) in servers.iter().enumerate() {
        for (c, connections) in CONNECTIONS.iter().enumerate() {
            rec.set(&format!("reference_{name}_{connections}c_per_s"), mean(&rates[s][c]));
            rec.set(&format!("reference_{name}_{connections}c_p99_ms"), mean(&p99s[s][c]));
        }
    }
    for (c, connections) in CONNECTIONS.iter().enumerate() {
        let ours = mean(&rates[0][c]);
        let durable = mean(&rates[1][c]);
        if durable > 0.0 {
            rec.set(&format!("reference_ratio_{connections}c"), ours / durable);
        }
    }
    for (_, server) in servers {
        server.stop().await?;
    }
    Ok(Done::Ran)
}

/// The relay indexes its messages for search only once no channel has committed for a moment
/// (under load it keeps its cores for posting), so after its side of a round it indexes what
/// that side posted: work that, left alone, runs while the reference is measured and takes the
/// reference's CPU. A search waits for the index to hold everything committed and makes the
/// relay catch it up at once; this makes one, and another while the relay answers that it
/// gave up waiting (503), for a minute at most; it returns how long the catch-up took. Any
/// other answer is a failure of the workload.
async fn index_caught_up(server: &Server) -> anyhow::Result<std::time::Duration> {
    let started = std::time::Instant::now();
    loop {
        let r = crate::client::get_once(server.addr, "/api/search?q=reference&limit=1").await?;
        if r.status.is_success() {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            r.status == hyper::StatusCode::SERVICE_UNAVAILABLE
                && started.elapsed() < std::time::Duration::from_secs(60),
            "the relay's search index did not catch up: its search answered {} after {:.1} s",
            r.status,
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
