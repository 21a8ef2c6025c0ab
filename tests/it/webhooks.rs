//! Outbound webhooks: a channel's QUESTIONs POSTed, signed, to a receiver that is down at
//! first — nothing is lost, in order, once it is up, and the failure was visible meanwhile;
//! types filtered; Slack's shape; admin only; private addresses refused unless allowed; the
//! cursor survives a restart.

use crate::common;

use common::{client, client_with_token, free_port, post, request, Server};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ADMIN: &str = "hook-admin";

/// One request a receiver got: its headers (lowercased names) and body.
#[derive(Debug)]
struct Got {
    headers: std::collections::HashMap<String, String>,
    body: Vec<u8>,
}

/// A receiver on `port` that answers 200 to every POST and hands each on.
fn receiver(port: u16) -> mpsc::Receiver<Got> {
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the receiver");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut headers = std::collections::HashMap::new();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                }
            }
            let len: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
            let mut body = vec![0; len];
            let _ = reader.read_exact(&mut body);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            if tx.send(Got { headers, body }).is_err() {
                return;
            }
        }
    });
    rx
}

fn verify(secret: &str, got: &Got) -> bool {
    let ts = &got.headers["x-crosstalk-timestamp"];
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let mut signed = ts.as_bytes().to_vec();
    signed.push(b'.');
    signed.extend_from_slice(&got.body);
    let want: String = ring::hmac::sign(&key, &signed)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    got.headers["x-crosstalk-signature"] == format!("sha256={want}")
}

async fn webhooks(s: &Server) -> Vec<Value> {
    let (_, v) = request(&client_with_token(ADMIN), "GET", &s.url("/api/webhooks"), None, None).await;
    v["webhooks"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_is_down_loses_nothing() {
    let mut s = Server::process(&["--token", ADMIN, "--webhooks-allow-private"]);
    let admin = client_with_token(ADMIN);
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    post(&admin, &s, "ops", common::msg("alice", "before the webhook")).await;
    let (status, hook) = request(
        &admin,
        "POST",
        &s.url("/api/webhooks"),
        Some(json!({"channel": "ops", "url": url, "types": ["QUESTION", "PERMISSION"]})),
        None,
    )
    .await;
    assert_eq!(status, 201, "{hook}");
    let secret = hook["secret"].as_str().unwrap().to_owned();
    let id = hook["id"].as_str().unwrap().to_owned();
    // Three questions and a plain message while nobody listens at the URL.
    let mut asked = Vec::new();
    for (i, kind) in ["QUESTION", "message", "QUESTION", "PERMISSION"].iter().enumerate() {
        let m = post(
            &admin,
            &s,
            "ops",
            json!({"sender": "agent-1", "type": kind, "body": format!("q{i}"), "recipient": "any-human"}),
        )
        .await;
        if *kind != "message" {
            asked.push(m["id"].as_u64().unwrap());
        }
    }
    // The failure is visible.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = webhooks(&s).await;
        let d = &list[0]["delivery"];
        if d["failing_since"].is_number() {
            assert!(d["last_error"].as_str().unwrap().contains("cannot reach"), "{d}");
            assert!(d["attempts"].as_u64().unwrap() >= 1, "{d}");
            assert!(list[0].get("secret").is_none(), "the secret is shown once");
            break;
        }
        assert!(Instant::now() < deadline, "no failure shown: {list:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The receiver comes up: every question arrives, in order, signed; the message does not.
    let rx = receiver(port);
    let mut ids = Vec::new();
    while ids.len() < asked.len() {
        let got = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(20)))
            .unwrap_or_else(|_| panic!("only {ids:?} of {asked:?} arrived"));
        assert!(verify(&secret, &got), "a bad signature: {:?}", got.headers);
        assert_eq!(got.headers["x-crosstalk-webhook"], id);
        let v: Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(v["channel"], "ops");
        let mid = v["message"]["id"].as_u64().unwrap();
        if ids.last() != Some(&mid) {
            ids.push(mid);
        }
    }
    assert_eq!(ids, asked);
    let deadline = Instant::now() + Duration::from_secs(10);
    while webhooks(&s).await[0]["delivery"]["failing_since"].is_number() {
        assert!(Instant::now() < deadline, "still failing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(webhooks(&s).await[0]["delivery"]["delivered"], 3);

    // A restart: delivery goes on from the durable cursor, nothing sent again.
    let dir = s.take_dir().unwrap();
    drop(s);
    let s = Server::start_in(dir.path(), &["--token", ADMIN, "--webhooks-allow-private"]);
    let q = post(
        &admin,
        &s,
        "ops",
        json!({"sender": "agent-1", "type": "QUESTION", "body": "after the restart"}),
    )
    .await;
    let got =
        tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(20))).expect("nothing after the restart");
    let v: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(v["message"]["id"], q["id"], "sent again after the restart: {v}");
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_shape_admin_only_and_private_addresses_refused() {
    let s = Server::start_with(&["--token", ADMIN, "--participants", "agent-1:agent-tok"]);
    let admin = client_with_token(ADMIN);
    // Not the admin: refused.
    let (status, e) = request(
        &client_with_token("agent-tok"),
        "POST",
        &s.url("/api/webhooks"),
        Some(json!({"channel": "ops", "url": "https://hooks.example.com/x"})),
        None,
    )
    .await;
    assert_eq!(status, 403, "{e}");
    // Loopback without --webhooks-allow-private: refused, saying why.
    let (status, e) = request(
        &admin,
        "POST",
        &s.url("/api/webhooks"),
        Some(json!({"channel": "ops", "url": "http://127.0.0.1:9/x"})),
        None,
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("--webhooks-allow-private"), "{e}");
    for bad in [
        json!({"channel": "ops", "url": "ftp://x.example/"}),
        json!({"channel": "bad name!", "url": "https://x.example/"}),
        json!({"url": "https://x.example/"}),
    ] {
        let (status, e) = request(&admin, "POST", &s.url("/api/webhooks"), Some(bad.clone()), None).await;
        assert_eq!(status, 400, "{bad}: {e}");
    }
    for odd in ["nope", "%3E", "*", "a..b", "%20"] {
        let (status, e) = request(&admin, "DELETE", &s.url(&format!("/api/webhooks/{odd}")), None, None).await;
        assert_eq!(status, 404, "{odd}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slack_webhook_gets_text() {
    let s = Server::start_with(&["--webhooks-allow-private"]);
    let c = client();
    let port = free_port();
    let rx = receiver(port);
    let (status, hook) = request(
        &c,
        "POST",
        &s.url("/api/webhooks"),
        Some(json!({"channel": "ops", "url": format!("http://127.0.0.1:{port}/slack"), "format": "slack"})),
        None,
    )
    .await;
    assert_eq!(status, 201, "{hook}");
    post(
        &c,
        &s,
        "ops",
        json!({"sender": "agent-1", "type": "DIRECTIVE", "body": "stop", "recipient": "worker-2"}),
    )
    .await;
    let got = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(20))).expect("nothing arrived");
    let v: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(v, json!({"text": "[#ops] agent-1 (DIRECTIVE) → worker-2: stop"}));
    // The command line lists it with its state, and adds another (its secret on the last line).
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_crosstalk"))
            .args(["webhooks", "--relay", &s.url("")])
            .args(args)
            .env_remove("CROSSTALK_TOKEN")
            .output()
            .unwrap()
    };
    let id0 = hook["id"].as_str().unwrap();
    let mut listed = String::new();
    for _ in 0..50 {
        let out = cli(&[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        listed = String::from_utf8_lossy(&out.stdout).into_owned();
        if listed.contains("1 delivered") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(listed.contains(id0) && listed.contains("ok, 1 delivered"), "{listed}");
    let out = cli(&[
        "--add",
        &format!("http://127.0.0.1:{port}/two"),
        "--channel",
        "ops",
        "--types",
        "QUESTION",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let secret = String::from_utf8_lossy(&out.stdout)
        .trim()
        .lines()
        .last()
        .unwrap_or("")
        .to_owned();
    assert_eq!(secret.len(), 48, "{secret}");
    let out = cli(&["--json"]);
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(lines, 2);
    let second: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let out = cli(&["--remove", second["id"].as_str().unwrap()]);
    assert!(out.status.success());
    // Removed: nothing more.
    let id = hook["id"].as_str().unwrap();
    let (status, _) = request(&c, "DELETE", &s.url(&format!("/api/webhooks/{id}")), None, None).await;
    assert_eq!(status, 204);
    post(&c, &s, "ops", common::msg("agent-1", "after removal")).await;
    assert!(tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_millis(1500))).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_beyond_the_limit_is_refused_as_a_limit_and_the_others_stay() {
    let s = Server::start_with(&["--webhooks-allow-private"]);
    let c = client();
    let (at, url) = (s.url("/api/webhooks"), format!("http://127.0.0.1:{}/hook", free_port()));
    let make = || request(&c, "POST", &at, Some(json!({"channel": "ops", "url": url})), None);
    for i in 0..100 {
        let (status, hook) = make().await;
        assert_eq!(status, 201, "webhook {i}: {hook}");
    }
    let (status, e) = make().await;
    assert_eq!(status, 429, "the 101st is the limit's own answer, not the store's: {e}");
    assert_eq!(e["code"], "limit_reached", "{e}");
    assert!(e["error"].as_str().unwrap().contains("100 webhooks"), "{e}");
    assert_eq!(webhooks(&s).await.len(), 100, "the hundred made are all kept");
}
