//! The command line for people and scripts, run as a user runs it: `send`, `tail --json`,
//! `wait` and its exit status, `ask` answered by `answer` from another process, and one clear
//! line with exit status 2 for a bad URL or token.

use crate::common;

use common::{client, get_json, post, until_waits, Server};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn crosstalk(s: &Server, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
    c.args(args)
        .args(["--relay", &s.url("")])
        .env_remove("CROSSTALK_URL")
        .env_remove("CROSSTALK_TOKEN");
    c
}

fn run(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().expect("run crosstalk")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_tail_and_wait_work_for_scripts() {
    let s = Server::start();
    // tail --json from the start of the channel, in the background.
    let mut tail = crosstalk(&s, &["tail", "dev", "--since", "0", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = run(crosstalk(
        &s,
        &[
            "send",
            "dev",
            "hello from the shell",
            "--as",
            "alice",
            "--type",
            "status",
        ],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id: u64 = text(&out.stdout).parse().expect("send prints the id");
    // The body from stdin with `-`.
    let mut piped = crosstalk(&s, &["send", "dev", "-", "--as", "bob"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    piped.stdin.take().unwrap().write_all(b"from stdin\n").unwrap();
    let out = piped.wait_with_output().unwrap();
    assert!(out.status.success());
    let second: u64 = text(&out.stdout).parse().unwrap();

    let mut lines = BufReader::new(tail.stdout.take().unwrap()).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["id"], id);
    assert_eq!(first["body"], "hello from the shell");
    assert_eq!(first["type"], "status");
    let next: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        (next["id"].as_u64(), next["body"].as_str()),
        (Some(second), Some("from stdin"))
    );
    tail.kill().unwrap();
    let _ = tail.wait();

    // For a person: one line per message, and no colour codes when stdout is not a terminal.
    let mut human = crosstalk(&s, &["tail", "dev", "--since", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = BufReader::new(human.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    human.kill().unwrap();
    let _ = human.wait();
    assert!(line.starts_with(&format!("#{id} ")), "{line}");
    assert!(line.ends_with("alice [status] hello from the shell"), "{line}");
    assert!(!line.contains('\u{1b}'), "colour codes on a pipe: {line:?}");

    // wait: 1 on timeout, 0 (and the message) when someone posts.
    let started = Instant::now();
    let out = run(crosstalk(&s, &["wait", "dev", "--timeout", "0.5"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(5));
    let waiter = crosstalk(&s, &["wait", "dev", "--timeout", "20", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Parked before the post (a wait started after it would take "wake up" as old news).
    until_waits(&client(), &s.url(""), 1).await;
    let out = run(crosstalk(&s, &["send", "dev", "wake up", "--as", "carol"]));
    assert!(out.status.success());
    let woke = waiter.wait_with_output().unwrap();
    assert_eq!(woke.status.code(), Some(0));
    let m: Value = serde_json::from_str(&text(&woke.stdout)).unwrap();
    assert_eq!(m["body"], "wake up");

    let out = run(crosstalk(&s, &["channels", "--json"]));
    let ch: Value = serde_json::from_str(text(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(ch["channel"], "dev");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_returns_when_answer_is_run_from_another_process() {
    let s = Server::start();
    let asking = crosstalk(&s, &["ask", "ops", "ship it?", "--timeout", "20", "--as", "bot"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Find the question as a person would: read the channel.
    let deadline = Instant::now() + Duration::from_secs(10);
    let question = loop {
        let (_, list) = get_json(&client(), &s.url("/api/channels/ops/messages")).await;
        if let Some(q) = list.as_array().and_then(|l| l.iter().find(|m| m["body"] == "ship it?")) {
            break q["id"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "the question never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = run(crosstalk(
        &s,
        &["answer", "ops", &question.to_string(), "yes, ship it", "--as", "dana"],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let asked = asking.wait_with_output().unwrap();
    assert_eq!(asked.status.code(), Some(0), "{}", text(&asked.stderr));
    assert_eq!(text(&asked.stdout), "yes, ship it");
}

#[test]
fn a_bad_url_or_token_is_one_line_and_exit_2() {
    let s = Server::start_with(&["--token", "right"]);
    for (args, needle) in [
        (vec!["send", "dev", "x", "--token", "wrong"], "401"),
        (vec!["channels"], "401"),
        (vec!["tail", "dev", "--since", "0", "--token", "wrong"], "401"),
    ] {
        let out = run(crosstalk(&s, &args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let mut c = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
    let out = c
        .args(["send", "dev", "x", "--relay", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach the relay"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["channels", "--relay", "not a url"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("bad relay URL"));
    // With the right token, it works.
    let out = run(crosstalk(&s, &["send", "dev", "x", "--token", "right"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// `tail` follows a relay that restarts: the message posted after the restart arrives, and
/// nothing before it is shown twice. The relay comes back on another port, so `tail` talks to
/// it through a fixed local address that forwards to wherever the relay is now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follows_a_relay_restart_with_nothing_lost_or_repeated() {
    use std::sync::{Arc, Mutex};
    use tokio::net::{TcpListener, TcpStream};
    let dir = tempfile::tempdir().unwrap();
    let mut relay = Server::start_in(dir.path(), &[]);
    let target = Arc::new(Mutex::new(relay.url("").trim_start_matches("http://").to_owned()));
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front_url = format!("http://{}", front.local_addr().unwrap());
    let to = target.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = front.accept().await {
            let addr = to.lock().unwrap().clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(addr).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let mut tail = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["tail", "dev", "--since", "0", "--json", "--relay", &front_url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let stdout = tail.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let send = |relay: &Server, body: &str| run(crosstalk(relay, &["send", "dev", body, "--as", "a"]));
    assert!(send(&relay, "before").status.success());
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first["body"], "before");

    relay.terminate();
    relay = Server::start_in(dir.path(), &[]);
    *target.lock().unwrap() = relay.url("").trim_start_matches("http://").to_owned();
    assert!(send(&relay, "after").status.success());
    let next = tokio::time::timeout(Duration::from_secs(15), rx.recv())
        .await
        .expect("the message after the restart arrives")
        .unwrap();
    assert_eq!(next["body"], "after", "{next}");
    assert!(
        tokio::time::timeout(Duration::from_millis(700), rx.recv())
            .await
            .is_err(),
        "something was shown twice"
    );
    tail.kill().unwrap();
    let _ = tail.wait();
}

/// What a person sees while a command blocks or ends empty: `ask` names its question before
/// it blocks, `questions` lists it, `answer` refuses a plain message and a second answer,
/// `tail` without `--since` says where it starts, and a timed-out `wait` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_talks_back() {
    let s = Server::start();
    let mut asking = crosstalk(&s, &["ask", "ops", "ship 412?", "--timeout", "20", "--as", "bot"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = BufReader::new(asking.stderr.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert!(
        said.starts_with("asked question #") && said.contains(" on ops"),
        "{said}"
    );
    let id: u64 = said["asked question #".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(said.contains(&format!("crosstalk answer ops {id}")), "{said}");

    let out = run(crosstalk(&s, &["questions", "ops", "--json"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let open: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0]["id"], id);

    let plain = run(crosstalk(&s, &["send", "ops", "just chatting", "--as", "eve"]));
    let plain_id = text(&plain.stdout);
    let out = run(crosstalk(&s, &["answer", "ops", &plain_id, "yes", "--as", "dana"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("not a question"), "{}", text(&out.stderr));
    let out = run(crosstalk(&s, &["answer", "ops", "999999", "yes", "--as", "dana"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no message #999999"),
        "{}",
        text(&out.stderr)
    );

    let out = run(crosstalk(
        &s,
        &["answer", "ops", &id.to_string(), "yes, ship it", "--as", "dana"],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let asked = asking.wait_with_output().unwrap();
    assert_eq!(asked.status.code(), Some(0));
    assert_eq!(text(&asked.stdout), "yes, ship it");
    let out = run(crosstalk(
        &s,
        &["answer", "ops", &id.to_string(), "again", "--as", "dana"],
    ));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("already answered"), "{}", text(&out.stderr));
    let out = run(crosstalk(&s, &["questions", "ops"]));
    assert!(text(&out.stderr).contains("no open questions"), "{}", text(&out.stderr));

    let mut tail = crosstalk(&s, &["tail", "ops"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = BufReader::new(tail.stderr.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    tail.kill().unwrap();
    let _ = tail.wait();
    assert!(said.starts_with("following ops from #"), "{said}");

    let out = run(crosstalk(&s, &["wait", "ops", "--timeout", "0.3"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("nothing new on ops"),
        "{}",
        text(&out.stderr)
    );
}

/// A user's mistakes at start-up: one line naming the path or address and the remedy, exit 2,
/// no backtrace even with RUST_BACKTRACE=1; bare `crosstalk` prints help and creates nothing.
#[test]
fn start_up_errors_say_what_and_what_to_do() {
    let home = tempfile::tempdir().unwrap();
    let serve = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_crosstalk"))
            .args(args)
            .current_dir(home.path())
            .env("HOME", home.path())
            .env_remove("XDG_DATA_HOME")
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let bare = serve(&[]);
    assert_eq!(bare.status.code(), Some(2));
    assert!(text(&bare.stdout).contains("serve"), "{}", text(&bare.stdout));
    assert_eq!(
        home.path().read_dir().unwrap().count(),
        0,
        "bare `crosstalk` created something"
    );

    let file = home.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let one_line = |out: &Output, needles: &[&str]| {
        assert_eq!(out.status.code(), Some(2));
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!err.contains("backtrace"), "{err}");
        for n in needles {
            assert!(err.contains(n), "{n:?} not in: {err}");
        }
    };
    let f = file.display().to_string();
    one_line(
        &serve(&["serve", "--port", "0", "--data-dir", &f]),
        &[&f, "not a directory"],
    );
    let under = file.join("store").display().to_string();
    one_line(
        &serve(&["serve", "--port", "0", "--data-dir", &under]),
        &[&under, "not a directory"],
    );

    // A second relay on the same directory names the first one's pid.
    let dir = tempfile::tempdir().unwrap();
    let first = Server::start_in(dir.path(), &[]);
    let d = dir.path().display().to_string();
    one_line(
        &serve(&["serve", "--port", "0", "--data-dir", &d]),
        &[&d, &format!("another relay (pid {})", first.pid())],
    );
    // A busy port says how to find out and how to avoid it.
    let port = first.url("").rsplit(':').next().unwrap().to_owned();
    let other = tempfile::tempdir().unwrap();
    one_line(
        &serve(&[
            "serve",
            "--port",
            &port,
            "--data-dir",
            &other.path().display().to_string(),
        ]),
        &[&format!("127.0.0.1:{port}"), "in use", "--port 0", "crosstalk status"],
    );
}

/// A relay that does not exit after SIGTERM: `crosstalk stop` gives up after 15 s and says
/// the next step (SIGKILL, and why it is safe), not only that it gave up.
#[test]
fn stop_says_what_to_do_with_a_relay_that_will_not_exit() {
    let dir = tempfile::tempdir().unwrap();
    // What `crosstalk stop` sees of a relay that ignores SIGTERM: a process, its pid in the
    // data directory's pid file, and the file locked (here by the test, for the process).
    let mut stuck = Command::new("sh")
        .args(["-c", "trap '' TERM; sleep 60"])
        .spawn()
        .expect("sh");
    let pid_file = dir.path().join(crosstalk::client::PID_FILE);
    std::fs::write(&pid_file, format!("{}\n", stuck.id())).unwrap();
    let lock = std::fs::File::open(&pid_file).unwrap();
    lock.lock().unwrap();
    // Give sh the moment to set its trap.
    std::thread::sleep(Duration::from_millis(300));
    let out = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["stop", "--data-dir", &dir.path().display().to_string()])
        .output()
        .unwrap();
    let _ = stuck.kill();
    let _ = stuck.wait();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("15 s after SIGTERM"), "{said}");
    assert!(
        said.contains(&format!("kill -KILL {}", stuck.id())),
        "no next step in: {said}"
    );
}

/// `crosstalk status` says who serves a data directory and whether the relay answers;
/// `crosstalk stop` stops it and returns once it has exited.
#[test]
fn status_and_stop_find_the_relay_by_its_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = Server::start_in(dir.path(), &[]);
    let d = dir.path().display().to_string();
    let out = run(crosstalk(&relay, &["status", "--data-dir", &d]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains(": ok"), "{said}");
    assert!(
        said.contains(&format!("pid {} serves {d} at {}", relay.pid(), relay.url(""))),
        "{said}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["stop", "--data-dir", &d])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("stopped the relay (pid {})", relay.pid())));
    let deadline = Instant::now() + Duration::from_secs(5);
    let exited = loop {
        if let Some(status) = relay.child().try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the relay still runs after `crosstalk stop`");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exited.success(), "{exited:?}");

    let out = run(crosstalk(&relay, &["status", "--data-dir", &d]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("cannot reach a relay"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stdout).contains(&format!("no relay uses {d}")),
        "{}",
        text(&out.stdout)
    );
}

/// `crosstalk inbox` reads a registered identity's inbox with the session its `register`
/// answered: what others posted on the channels it joined, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_reads_a_registered_identity_once() {
    let s = Server::start();
    let c = client();
    let (_, reg) = common::request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(serde_json::json!({"instance_id": "rev"})),
        None,
    )
    .await;
    let session = reg["session"].as_str().unwrap().to_owned();
    let joined = common::request(
        &c,
        "POST",
        &s.url("/api/channels/pr/messages"),
        Some(common::msg("rev", "watching")),
        Some(&session),
    )
    .await;
    assert_eq!(joined.0, 200);
    let posted = common::post(&c, &s, "pr", common::msg("bob", "please look")).await;
    let out = run(crosstalk(
        &s,
        &["inbox", "--as", "rev", "--session", &session, "--json"],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["id"], posted["id"]);
    let again = run(crosstalk(&s, &["inbox", "--as", "rev", "--session", &session]));
    assert!(
        text(&again.stderr).contains("nothing new for rev"),
        "{}",
        text(&again.stderr)
    );
    let without = run(crosstalk(&s, &["inbox", "--as", "rev"]));
    assert_eq!(without.status.code(), Some(2), "another's inbox needs its session");
}

/// `crosstalk answer` decides a permission prompt on a relay without tokens (it speaks for a
/// person): allow or deny only, once; an MCP tool call, an agent's, cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_decides_a_permission_prompt() {
    let s = Server::start();
    let c = client();
    let p = post(
        &c,
        &s,
        "ops",
        json!({"sender": "claude-code", "type": "PERMISSION", "body": "Allow Bash? cargo test\n(request qwert)", "recipient": "any-human"}),
    )
    .await;
    assert_eq!(p["status"], "open", "{p}");
    let id = p["id"].to_string();
    let m = common::mcp::Mcp::connect(&s).await;
    let err = m
        .call_err(
            "post_message",
            json!({"channel": "ops", "sender": "dana", "type": "ANSWER", "body": "allow", "reply_to": p["id"]}),
        )
        .await;
    assert!(err.contains("only a human"), "{err}");
    let out = tokio::task::block_in_place(|| run(crosstalk(&s, &["answer", "ops", &id, "maybe", "--as", "dana"])));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("allow or deny"), "{}", text(&out.stderr));
    let out = tokio::task::block_in_place(|| run(crosstalk(&s, &["answer", "ops", &id, "deny", "--as", "dana"])));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = tokio::task::block_in_place(|| run(crosstalk(&s, &["answer", "ops", &id, "allow", "--as", "lee"])));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("already answered"), "{}", text(&out.stderr));
    let (_, got) = get_json(&c, &s.url(&format!("/api/channels/ops/messages/{id}"))).await;
    assert_eq!(got["status"], "answered", "{got}");
}

/// `crosstalk` with a home of its own (so the default data directory is an empty one) and none
/// of the settings this machine's shell may carry.
fn bare(home: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
    c.env("HOME", home).env_remove("XDG_DATA_HOME").env("RUST_LOG", "warn");
    for var in [
        "CROSSTALK_URL",
        "CROSSTALK_TOKEN",
        "CROSSTALK_DATA_DIR",
        "RELAY_DB",
        "CROSSTALK_HOST",
        "HOST",
        "CROSSTALK_PORT",
        "PORT",
    ] {
        c.env_remove(var);
    }
    c.stdin(Stdio::null());
    c
}

/// A process a test started, killed when the test ends, whether it passes or not.
struct Spawned(std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `serve` with its data directory and port from the environment, as a user may start it; the
/// relay and the URL it printed.
fn serve_from_env(home: &std::path::Path, env: &[(&str, &str)]) -> (Spawned, String) {
    let mut relay = bare(home)
        .arg("serve")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(relay.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("crosstalk listening on ")
        .unwrap_or_else(|| panic!("the relay did not start: {line:?}"))
        .to_owned();
    (Spawned(relay), url)
}

/// `CROSSTALK_DATA_DIR=… crosstalk serve` on a port of its own: `status` and `stop` with the
/// same environment find it, name its address and stop it; without it, `stop` says which
/// directory it looked at and how to name the other.
#[test]
fn status_and_stop_honour_the_settings_serve_reads() {
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let d = data.path().display().to_string();
    let (mut relay, url) = serve_from_env(home.path(), &[("CROSSTALK_DATA_DIR", &d), ("CROSSTALK_PORT", "0")]);
    // The listening line has the bound address; a client reaches it on loopback.
    let url = url.replace("0.0.0.0", "127.0.0.1");
    let pid = relay.0.id();

    // Nothing on 8765 here, nor in the default directory: status asks the relay serving the
    // directory the environment names, where it said it listens.
    let out = bare(home.path())
        .arg("status")
        .env("CROSSTALK_DATA_DIR", &d)
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said} {}", text(&out.stderr));
    assert!(said.starts_with(&format!("relay at {url}: ok")), "{said}");
    assert!(said.contains(&format!("pid {pid} serves {d} at {url}")), "{said}");
    // RELAY_DB, crosstalk-mcp's name, is honoured as `serve` honours it.
    let out = bare(home.path()).arg("status").env("RELAY_DB", &d).output().unwrap();
    assert!(
        text(&out.stdout).contains(&format!("pid {pid} serves {d}")),
        "{}",
        text(&out.stdout)
    );

    // Asked at another address, status says where the directory's relay is.
    let out = bare(home.path())
        .args(["status", "--relay", "http://127.0.0.1:9", "--data-dir", &d])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout);
    assert!(said.contains(&format!("`crosstalk status --relay {url}`")), "{said}");
    assert!(
        !said.contains("crosstalk serve"),
        "advice that runs into the lock: {said}"
    );

    // Without the setting, stop names the directory it looked at and how to name the other.
    let out = bare(home.path()).arg("stop").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    let default = home.path().join(".local/share/crosstalk/store").display().to_string();
    assert!(err.contains(&format!("no relay uses {default}")), "{err}");
    assert!(err.contains("CROSSTALK_DATA_DIR"), "{err}");
    assert!(relay.0.try_wait().unwrap().is_none(), "stopped the wrong relay");

    // A CROSSTALK_URL meant for other commands (here a malformed one) is none of stop's
    // business: it talks to no relay.
    let out = bare(home.path())
        .arg("stop")
        .env("CROSSTALK_DATA_DIR", &d)
        .env("CROSSTALK_URL", "http://127.0.0.1:9/mcp")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("stopped the relay (pid {pid}) using {d}")));
    let deadline = Instant::now() + Duration::from_secs(5);
    while relay.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the relay still runs after `crosstalk stop`");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = bare(home.path())
        .arg("status")
        .env("CROSSTALK_DATA_DIR", &d)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout);
    assert!(said.contains(&format!("no relay uses {d}")), "{said}");
    assert!(said.contains("Start one with `crosstalk serve`"), "{said}");
}

/// A data directory held by a relay in another container (a volume two containers mount): its
/// pid means nothing here, so a second relay, `status` and `stop` say where it runs and how to
/// stop it there, and `stop` signals no process of this machine.
#[test]
fn a_relay_in_another_container_is_named_and_not_signalled() {
    use std::io::Write as _;
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let d = data.path().display().to_string();
    // A live process of this machine whose pid the record names: it must survive `stop`.
    let mut bystander = Spawned(Command::new("sleep").arg("30").spawn().unwrap());
    let mut pid_file = std::fs::File::create(data.path().join("relay.pid")).unwrap();
    pid_file.lock().unwrap();
    write!(
        pid_file,
        "{}\nurl=http://127.0.0.1:8765\npid_ns=pid:[1]\nhost=3f2a9c1b7d0e\n",
        bystander.0.id()
    )
    .unwrap();

    let out = bare(home.path())
        .args(["serve", "--port", "0", "--data-dir", &d])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("another container or machine (host 3f2a9c1b7d0e)"),
        "{err}"
    );
    assert!(err.contains("docker stop 3f2a9c1b7d0e"), "{err}");
    assert!(
        !err.contains("`crosstalk stop --data-dir"),
        "advice that cannot work: {err}"
    );

    let out = bare(home.path()).args(["stop", "--data-dir", &d]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("a signal from here cannot reach") && err.contains("docker stop 3f2a9c1b7d0e"),
        "{err}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        bystander.0.try_wait().unwrap().is_none(),
        "stop signalled a process of this machine"
    );

    let out = bare(home.path())
        .args(["status", "--data-dir", &d, "--relay", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert!(
        text(&out.stdout).contains("served by pid") && text(&out.stdout).contains("another container"),
        "{}",
        text(&out.stdout)
    );
}

/// Each mistake a first hour meets ends in one line on stderr, exit 2, that says what to do
/// next, in the command line's terms.
#[test]
fn every_error_says_the_next_step() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let one_line = |out: &Output, needles: &[&str]| -> String {
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        for n in needles {
            assert!(err.contains(n), "{n:?} not in: {err}");
        }
        err
    };

    // A relay with a token: the 401 names --token and CROSSTALK_TOKEN, and which was refused.
    let s = Server::start_with(&["--token", "right"]);
    let err = one_line(
        &bare(h).args(["channels", "--relay", &s.url("")]).output().unwrap(),
        &["--token", "CROSSTALK_TOKEN"],
    );
    assert!(!err.contains("Authorization"), "{err}");
    one_line(
        &bare(h)
            .args(["channels", "--relay", &s.url("")])
            .env("CROSSTALK_TOKEN", "stale")
            .output()
            .unwrap(),
        &["refused $CROSSTALK_TOKEN"],
    );
    one_line(
        &bare(h)
            .args(["send", "dev", "x", "--relay", &s.url(""), "--token", "wrong"])
            .output()
            .unwrap(),
        &["refused --token"],
    );

    // OAuth's commands on a relay without --oauth say how to start one with it.
    for args in [
        vec!["invite"],
        vec!["clients"],
        vec!["clients", "--revoke", "3f2a9c1b7d0e"],
    ] {
        let out = bare(h)
            .args(&args)
            .args(["--relay", &s.url(""), "--token", "right"])
            .output()
            .unwrap();
        let err = one_line(&out, &["--oauth --token"]);
        assert!(
            !err.contains("no route") && !err.contains("no connection"),
            "{args:?}: {err}"
        );
    }

    // The MCP endpoint where the relay's address belongs: the address to give instead.
    for cmd in ["status", "channels"] {
        one_line(
            &bare(h).args([cmd, "--relay", &s.url("/mcp")]).output().unwrap(),
            &[&format!("--relay {}", s.url(""))],
        );
    }
    // https:// to a relay that speaks plain HTTP.
    let tls = s.url("").replacen("http://", "https://", 1);
    one_line(
        &bare(h).args(["channels", "--relay", &tls]).output().unwrap(),
        &["plain HTTP", &format!("--relay {}", s.url(""))],
    );
    let out = bare(h).args(["status", "--relay", &tls]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains("plain HTTP"), "{}", text(&out.stdout));

    // guard outside a git checkout: one line, not git's usage.
    let nowhere = tempfile::tempdir().unwrap();
    for extra in [&[][..], &["--install"][..]] {
        let out = bare(h)
            .args(["guard", "--as", "me", "--relay", &s.url("")])
            .args(extra)
            .current_dir(nowhere.path())
            .env("GIT_CEILING_DIRECTORIES", nowhere.path().parent().unwrap())
            .output()
            .unwrap();
        one_line(&out, &["not in a git checkout", "inside the repository"]);
    }

    // serve --oauth without --token: one line, no run of spaces.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let err = one_line(
        &bare(h)
            .args(["serve", "--oauth", "--port", "0", "--data-dir", &d])
            .output()
            .unwrap(),
        &["--oauth needs --token"],
    );
    assert!(!err.contains("  "), "{err:?}");

    // A host that came from $HOST (zsh sets it to the machine's name) is named as such.
    one_line(
        &bare(h)
            .args(["serve", "--port", "0", "--data-dir", &d])
            .env("HOST", "my-laptop")
            .output()
            .unwrap(),
        &["my-laptop (from $HOST)", "unset HOST"],
    );
    one_line(
        &bare(h)
            .args(["serve", "--port", "0", "--data-dir", &d, "--token", "t"])
            .env("HOST", "192.0.2.1")
            .output()
            .unwrap(),
        &["cannot bind 192.0.2.1:0 (from $HOST)", "unset HOST"],
    );

    // Durations everywhere: a span or a number of seconds; anything else says what to write.
    for (timeout, said) in [("300ms", "within 300ms"), ("0.2", "within 200ms")] {
        let started = Instant::now();
        let out = bare(h)
            .args([
                "wait",
                "dev",
                "--timeout",
                timeout,
                "--relay",
                &s.url(""),
                "--token",
                "right",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{timeout}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(said), "{timeout}: {}", text(&out.stderr));
        assert!(started.elapsed() < Duration::from_secs(10));
    }
    let out = bare(h)
        .args(["ask", "dev", "?", "--timeout", "2x", "--relay", &s.url("")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("30s, 5m"), "{}", text(&out.stderr));
}

/// `invite --expires` takes a number of seconds as well as a span.
#[test]
fn invite_expires_takes_seconds_or_a_span() {
    let home = tempfile::tempdir().unwrap();
    let s = Server::start_with(&["--oauth", "--token", "admin"]);
    // A fraction is rounded up to whole seconds (0.5 was sent as 0, which the relay refuses).
    for expires in ["3600", "90m", "0.5"] {
        let out = bare(home.path())
            .args([
                "invite",
                "--expires",
                expires,
                "--relay",
                &s.url(""),
                "--token",
                "admin",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{expires}: {}", text(&out.stderr));
        assert!(!text(&out.stdout).is_empty(), "{expires}: no code printed");
    }
}

/// `crosstalk serve --help` and docs/operations.md's tables of settings say the same: the same
/// flags, each with the same environment variables and the same default. The help's come from
/// the one table the relay resolves its settings with (`src/config/settings.rs`).
#[test]
fn serve_help_and_the_operations_tables_agree() {
    let mut serve = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
    serve.args(["serve", "--help"]).env_remove("RUST_LOG");
    let help = text(&run(serve).stdout);
    let mut from_help = std::collections::BTreeMap::new();
    let mut flag: Option<String> = None;
    for line in help.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("--") {
            flag = Some(rest.split_whitespace().next().unwrap().to_owned());
        } else if let (Some(f), Some(at)) = (flag.as_ref(), t.rfind("[env: ")) {
            let tail = &t[at..];
            let (env, default) = tail
                .strip_prefix("[env: ")
                .and_then(|r| r.split_once("] [default: "))
                .unwrap_or_else(|| panic!("--{f}: {tail}"));
            from_help.insert(f.clone(), (env.to_owned(), default.trim_end_matches(']').to_owned()));
            flag = None;
        }
    }
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md")).unwrap();
    let section = &docs[docs.find("## Configuration").unwrap()..docs.find("## Security model").unwrap()];
    let mut from_docs = std::collections::BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = row
            .split(" | ")
            .map(|c| c.trim_matches(|ch| ch == '|' || ch == ' '))
            .collect();
        let flag = cells[0].trim_matches('`').trim_start_matches("--").to_owned();
        let plain = |c: &str| c.replace('`', "");
        let before = from_docs.insert(flag.clone(), (plain(cells[1]), plain(cells[2])));
        assert!(before.is_none(), "docs/operations.md lists --{flag} twice");
    }
    assert!(from_help.len() > 40, "{help}");
    assert_eq!(
        from_docs, from_help,
        "docs/operations.md's settings (left) and `serve --help` (right) differ"
    );
}
