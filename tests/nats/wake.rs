//! `crosstalk wake` for one identity on two nodes of a cluster: the lease is the cluster's, so
//! one wake process at a time runs its turns, whichever node each talks to; the other says
//! which holds it, and takes over when it stops, handing nothing twice.

use super::*;

/// A fake agent: records each turn's start, end and prompt in `$FAKE_DIR`, sleeping a little
/// so that two turns at once would overlap.
const AGENT: &str = r#"#!/usr/bin/env bash
set -u
n=$(ls "$FAKE_DIR" | grep -c '\.turn$')
t="$FAKE_DIR/$$-$((n + 1)).turn"
echo "start $(date +%s.%N)" > "$t"
printf '%s\n' "$1" >> "$t"
sleep 0.3
echo "end $(date +%s.%N)" >> "$t"
"#;

fn wake_on(node: &Server, dir: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["wake", "--relay", &node.url(""), "--as", "reviewer", "--log-dir"])
        .arg(dir)
        .arg("--")
        .arg(dir.join("agent.sh"))
        .arg("{prompt}")
        .env_remove("CROSSTALK_URL")
        .env_remove("CROSSTALK_TOKEN")
        .env("FAKE_DIR", dir.join("turns"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start crosstalk wake")
}

/// Each turn's (start, end, prompt), by start.
fn turns(dir: &Path) -> Vec<(f64, Option<f64>, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir.join("turns")).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap_or_default();
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k} ")))
                .and_then(|v| v.parse::<f64>().ok())
        };
        out.push((field("start").unwrap_or(0.0), field("end"), text.clone()));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Waits until `node` says `reviewer` is held by the process `pid`.
async fn until_held_by(c: &reqwest::Client, node: &Server, pid: u32) {
    let deadline = Instant::now() + T;
    loop {
        let (_, list) = request(c, "GET", &node.url("/api/wake"), None, None).await;
        let held = list["woken"].as_array().and_then(|l| {
            l.iter()
                .find(|v| v["identity"] == "reviewer")
                .and_then(|v| v["held_by"].as_str().map(str::to_owned))
        });
        if held.as_deref().is_some_and(|h| h.starts_with(&format!("{pid}@"))) {
            return;
        }
        assert!(Instant::now() < deadline, "reviewer never held by {pid}: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every one of `bodies` was in a turn that ended; then each must be in exactly
/// one turn, and no two turns may overlap.
fn until_handled_once(dir: &Path, bodies: &[String]) {
    let deadline = Instant::now() + T;
    loop {
        let t = turns(dir);
        let ended: Vec<_> = t.iter().filter(|t| t.1.is_some()).collect();
        if bodies.iter().all(|b| ended.iter().any(|t| t.2.contains(b.as_str()))) {
            for b in bodies {
                let n = t.iter().filter(|t| t.2.contains(b.as_str())).count();
                assert_eq!(n, 1, "{b} was handed to {n} turns: {t:?}");
            }
            for w in t.windows(2) {
                assert!(w[0].1.unwrap_or(f64::MAX) <= w[1].0, "two turns overlapped: {t:?}");
            }
            return;
        }
        assert!(Instant::now() < deadline, "not all handled: {t:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn terminate(child: &mut std::process::Child) -> String {
    // SAFETY: kill(2) on the wake process this test spawned and has not waited for.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + T;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "crosstalk wake did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut err = String::new();
    use std::io::Read;
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_woken_through_two_nodes_runs_one_turn_at_a_time() {
    let _one = ONE_CLUSTER.lock().await;
    let nats = cluster();
    let (a, b) = (node(&nats), node(&nats));
    let c = client();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent.sh");
    std::fs::write(&script, AGENT).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::create_dir(dir.path().join("turns")).unwrap();
    let mut first = wake_on(&a, dir.path());
    until_held_by(&c, &b, first.id()).await;
    let mut second = wake_on(&b, dir.path());
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Directives through either node: each handled once, by the one holder, one turn at a time.
    let mut bodies = Vec::new();
    for i in 0..4 {
        let body = format!("task {i} for the reviewer");
        let node = if i % 2 == 0 { &a } else { &b };
        post(
            &c,
            node,
            "dev",
            json!({"sender": "alice", "type": "DIRECTIVE", "recipient": "reviewer", "body": body}),
        )
        .await;
        bodies.push(body);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    until_handled_once(dir.path(), &bodies);
    let by_first = turns(dir.path()).len();
    // The first stops: the second, on the other node, takes over and goes on from there.
    let err = terminate(&mut first);
    assert!(!err.contains("already woken"), "{err}");
    until_held_by(&c, &a, second.id()).await;
    let body = "task 4, after the hand-over".to_owned();
    post(
        &c,
        &a,
        "dev",
        json!({"sender": "alice", "type": "DIRECTIVE", "recipient": "reviewer", "body": body}),
    )
    .await;
    bodies.push(body);
    until_handled_once(dir.path(), &bodies);
    assert_eq!(turns(dir.path()).len(), by_first + 1, "{:?}", turns(dir.path()));
    let err = terminate(&mut second);
    assert!(
        err.contains("already woken by another crosstalk wake (pid ") && err.contains("waiting until it stops"),
        "{err}"
    );
}
