//! `crosstalk wake` with fake agent commands: a script that records each turn (its start and
//! end, its arguments, its stdin and environment) and then does what the test says (nothing,
//! sleep, fail, or answer on a channel with the crosstalk CLI). Every wait is bounded.

use crate::common;

use common::{client, get_json, post, Server};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const AGENT: &str = r#"#!/usr/bin/env bash
# A fake agent: records this turn in $FAKE_DIR, then does what $FAKE_MODE says.
set -u
dir="$FAKE_DIR"
n=$(ls "$dir" | grep -c '\.meta$')
t="$dir/turn-$((n + 1))"
{
  echo "start $(date +%s.%N)"
  echo "as ${CROSSTALK_AS:-}"
  echo "channels ${CROSSTALK_CHANNELS:-}"
  echo "attempt ${CROSSTALK_WAKE_ATTEMPT:-}"
} > "$t.meta"
printf '%s' "${1:-}" > "$t.argv"
if [ -z "${1:-}" ]; then cat > "$t.stdin"; fi
sleep "${FAKE_SLEEP:-0}"
case "${FAKE_MODE:-}" in
  fail) echo "end $(date +%s.%N)" >> "$t.meta"; exit 3 ;;
  reply) "$CROSSTALK_BIN" send "$FAKE_CHANNEL" "answer from $CROSSTALK_AS" --as "$CROSSTALK_AS" \
           --relay "$CROSSTALK_URL" > /dev/null ;;
esac
echo "end $(date +%s.%N)" >> "$t.meta"
if [ -n "${FAKE_SAY:-}" ]; then echo "$FAKE_SAY"; fi
"#;

/// A fake agent's folder and script.
struct Agent {
    dir: tempfile::TempDir,
}

impl Agent {
    fn new() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("agent.sh");
        std::fs::write(&script, AGENT).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::create_dir(dir.path().join("turns")).unwrap();
        Agent { dir }
    }

    fn script(&self) -> String {
        self.dir.path().join("agent.sh").display().to_string()
    }

    fn turns_dir(&self) -> PathBuf {
        self.dir.path().join("turns")
    }

    /// The turns recorded so far, in order.
    fn turns(&self) -> Vec<TurnSeen> {
        let mut out = Vec::new();
        for n in 1.. {
            let base = self.turns_dir().join(format!("turn-{n}"));
            let Ok(meta) = std::fs::read_to_string(base.with_extension("meta")) else {
                break;
            };
            let field = |k: &str| {
                meta.lines()
                    .find_map(|l| l.strip_prefix(&format!("{k} ")))
                    .map(str::to_owned)
            };
            let prompt = std::fs::read_to_string(base.with_extension("argv")).unwrap_or_default()
                + &std::fs::read_to_string(base.with_extension("stdin")).unwrap_or_default();
            out.push(TurnSeen {
                start: field("start").and_then(|s| s.parse().ok()).unwrap_or(0.0),
                end: field("end").and_then(|s| s.parse().ok()),
                who: field("as").unwrap_or_default(),
                prompt,
                stdin: base.with_extension("stdin").exists(),
            });
        }
        out
    }

    /// Waits until `n` turns have ended (at most `within`).
    fn until_turns(&self, n: usize, within: Duration) -> Vec<TurnSeen> {
        let deadline = Instant::now() + within;
        loop {
            let turns = self.turns();
            if turns.iter().filter(|t| t.end.is_some()).count() >= n {
                return turns;
            }
            assert!(
                Instant::now() < deadline,
                "{} turns ended, not {n}: {turns:?}",
                turns.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[derive(Debug)]
struct TurnSeen {
    start: f64,
    end: Option<f64>,
    who: String,
    prompt: String,
    stdin: bool,
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// `crosstalk wake` against `s` as `who`, the fake agent as its command.
fn wake(s: &Server, agent: &Agent, who: &str, flags: &[&str], env: &[(&str, &str)], prompt_arg: bool) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
    c.args(["wake", "--relay", &s.url(""), "--as", who, "--log-dir"])
        .arg(agent.dir.path())
        .args(flags)
        .arg("--")
        .arg(agent.script());
    if prompt_arg {
        c.arg("{prompt}");
    }
    c.env_remove("CROSSTALK_URL")
        .env_remove("CROSSTALK_TOKEN")
        .env("FAKE_DIR", agent.turns_dir())
        .env("CROSSTALK_BIN", env!("CARGO_BIN_EXE_crosstalk"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c.spawn().expect("start crosstalk wake")
}

/// Waits until `who` is woken (its wake process holds the lease).
async fn until_woken(s: &Server, who: &str) -> Value {
    let c = client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, list) = get_json(&c, &s.url("/api/wake")).await;
        assert_eq!(status, 200, "{list}");
        if let Some(v) = list["woken"]
            .as_array()
            .and_then(|l| l.iter().find(|v| v["identity"] == who))
        {
            return v.clone();
        }
        assert!(Instant::now() < deadline, "{who} never became woken: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `who` is held by the wake process `by` (it took the lease over); its state.
async fn until_held_by(s: &Server, who: &str, by: &Child) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = until_woken(s, who).await;
        if v["held_by"]
            .as_str()
            .is_some_and(|h| h.starts_with(&format!("{}@", by.id())))
        {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "wake {} never took {who}'s lease: {v}",
            by.id()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn terminate(child: &mut Child) -> String {
    // SAFETY: kill(2) on the wake process this test spawned and has not waited for.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "crosstalk wake did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut err = String::new();
    use std::io::Read;
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    err
}

fn directive(sender: &str, to: &str, body: &str) -> Value {
    json!({"sender": sender, "type": "DIRECTIVE", "recipient": to, "body": body})
}

fn quiet(agent: &Agent, n: usize, for_: Duration) {
    std::thread::sleep(for_);
    let turns = agent.turns();
    assert_eq!(turns.len(), n, "a turn ran that should not have: {turns:?}");
}

/// An OAuth connection that may act as anyone makes wake states for at most
/// `MAX_WOKEN_PER_TOKEN` identities: a state is kept for good, and without a bound one
/// connection could fill the store, one request each. Counted from the store, so a restart
/// does not reset it; taking an identity it already woke again is not one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oauth_connection_wakes_a_bounded_number_of_identities() {
    use crosstalk::ops::wake::MAX_WOKEN_PER_TOKEN;
    const ADMIN: &str = "admin-s3cret";
    let mut s = Server::process(&["--oauth", "--token", ADMIN]);
    let flow = common::oauth::Flow::new(&s, ADMIN).await;
    let anyone = common::client_with_token(&flow.connect_as_anyone(&s).await.access);
    let admin = common::client_with_token(ADMIN);
    let lease = json!({"holder": "h1", "host": "here", "pid": 1, "ttl_s": 30});
    let take = |c: &reqwest::Client, s: &Server, who: &str| {
        let (c, url, lease) = (c.clone(), s.url(&format!("/api/wake/{who}/lease")), lease.clone());
        async move { common::request(&c, "POST", &url, Some(lease), None).await }
    };
    // One the admin woke is not the connection's.
    assert_eq!(take(&admin, &s, "lead").await.0, 200);
    for i in 0..MAX_WOKEN_PER_TOKEN - 8 {
        let (status, v) = take(&anyone, &s, &format!("worker-{i}")).await;
        assert_eq!(status, 200, "worker-{i}: {v}");
    }
    // The last places taken side by side: each counted after the one before it was made
    // (counted together, all sixteen passed the limit).
    let side_by_side =
        (MAX_WOKEN_PER_TOKEN - 8..MAX_WOKEN_PER_TOKEN + 8).map(|i| take(&anyone, &s, &format!("worker-{i}")));
    let statuses: Vec<u16> = futures_util::future::join_all(side_by_side)
        .await
        .into_iter()
        .map(|(status, _)| status)
        .collect();
    assert_eq!(
        (
            statuses.iter().filter(|&&s| s == 200).count(),
            statuses.iter().filter(|&&s| s == 429).count()
        ),
        (8, 8),
        "{statuses:?}"
    );
    let (status, v) = take(&anyone, &s, "one-more").await;
    assert_eq!((status, v["code"].as_str()), (429, Some("limit_reached")), "{v}");
    assert_eq!(take(&anyone, &s, "worker-0").await.0, 200, "one it woke, again");
    assert_eq!(take(&anyone, &s, "lead").await.0, 200, "one another woke");
    assert_eq!(take(&admin, &s, "admins-own").await.0, 200, "the admin is not bounded");

    let (_, clean) = s.terminate();
    assert!(clean);
    let dir = s.take_dir().unwrap();
    let s = Server::start_in(dir.path(), &["--oauth", "--token", ADMIN]);
    let (status, v) = take(&anyone, &s, "one-more").await;
    assert_eq!(status, 429, "after a restart: {v}");
}

/// A new identity starts at every channel's newest message, so its first turn hands out
/// nothing posted before it; renewing its lease moves nothing, whatever was posted since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_identity_starts_at_the_newest_message_and_a_renewal_moves_nothing() {
    let s = Server::start();
    let c = client();
    post(&c, &s, "dev", common::msg("lead", "before one")).await;
    let dev = post(&c, &s, "dev", common::msg("lead", "before two")).await["id"].clone();
    let ops = post(&c, &s, "ops", common::msg("lead", "before")).await["id"].clone();
    let lease = json!({"holder": "h1", "host": "here", "pid": 1, "ttl_s": 30});
    let url = s.url("/api/wake/reviewer/lease");
    let (status, first) = common::request(&c, "POST", &url, Some(lease.clone()), None).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["handled"], json!({"dev": dev, "ops": ops}), "{first}");
    post(&c, &s, "dev", common::msg("lead", "after")).await;
    post(&c, &s, "news", common::msg("lead", "a channel made after")).await;
    let (status, renewed) = common::request(&c, "POST", &url, Some(lease), None).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["handled"], first["handled"], "{renewed}");
}

/// An identity woken is an instance id: 1–128 bytes without control characters, trimmed.
/// A longer one was kept (on a lone relay) or refused as the store's failure (on a cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_identity_is_an_instance_id() {
    let s = Server::start();
    let c = client();
    let lease = json!({"holder": "h1", "host": "here", "pid": 1, "ttl_s": 30});
    let long = "x".repeat(129);
    for (who, status) in [
        (long.as_str(), 400),
        ("bell%07", 400),
        ("%20%20", 400),
        ("%20reviewer%20", 200),
    ] {
        let url = s.url(&format!("/api/wake/{who}/lease"));
        let (got, answer) = common::request(&c, "POST", &url, Some(lease.clone()), None).await;
        assert_eq!(got, status, "{who}: {answer}");
        if status == 400 {
            assert_eq!(answer["code"], "invalid_input", "{who}: {answer}");
        } else {
            assert_eq!(answer["identity"], "reviewer", "{answer}");
        }
    }
    let (_, list) = get_json(&c, &s.url("/api/wake")).await;
    assert_eq!(list["woken"].as_array().unwrap().len(), 1, "{list}");
}

/// Identities are any printable text; a cluster keeps a record's key in a subject, where a
/// space, a letter beyond ASCII or a `>` cannot be: a wake of "code reviewer" was refused
/// there ("the records bucket cannot hold the key"), and each gets a key of its own now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_of_any_text_are_woken_each_as_itself() {
    let s = Server::start();
    let c = client();
    let names = ["code reviewer", "rév", ">", "*"];
    let agents: Vec<Agent> = names.iter().map(|_| Agent::new()).collect();
    let mut procs: Vec<Child> = names
        .iter()
        .zip(&agents)
        .map(|(who, agent)| wake(&s, agent, who, &[], &[], true))
        .collect();
    for who in names {
        until_woken(&s, who).await;
    }
    for who in names {
        post(&c, &s, "dev", directive("alice", who, &format!("for {who} only"))).await;
    }
    for (who, agent) in names.iter().zip(&agents) {
        let turns = agent.until_turns(1, Duration::from_secs(10));
        assert_eq!(turns[0].who, *who);
        assert!(
            turns[0].prompt.contains(&format!("for {who} only")),
            "{who}: {}",
            turns[0].prompt
        );
    }
    let (_, list) = get_json(&c, &s.url("/api/wake")).await;
    let mut listed: Vec<&str> = list["woken"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["identity"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, ["*", ">", "code reviewer", "rév"], "{list}");
    for (p, agent) in procs.iter_mut().zip(&agents) {
        terminate(p);
        quiet(agent, 1, Duration::from_millis(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directive_wakes_the_agent_within_a_second_with_the_message_in_its_prompt() {
    let s = Server::start();
    let c = client();
    let agent = Agent::new();
    let mut w = wake(&s, &agent, "reviewer", &[], &[], true);
    let state = until_woken(&s, "reviewer").await;
    assert_eq!(state["state"], "listening (wakes on messages)", "{state}");
    // Not addressed to it, its own, or on a channel it does not listen to: nothing wakes it.
    post(&c, &s, "dev", json!({"sender": "alice", "body": "to everyone"})).await;
    post(&c, &s, "dev", directive("reviewer", "alice", "its own")).await;
    let posted_at = now();
    let m = post(&c, &s, "dev", directive("alice", "reviewer", "review PR 7 please")).await;
    let turns = agent.until_turns(1, Duration::from_secs(10));
    let t = &turns[0];
    assert!(
        t.start - posted_at < 1.0,
        "the turn started {:.3} s after the post",
        t.start - posted_at
    );
    assert!(t.prompt.contains("review PR 7 please"), "{}", t.prompt);
    assert!(
        t.prompt
            .contains(&format!("[dev #{}] from alice (DIRECTIVE, to reviewer)", m["id"])),
        "{}",
        t.prompt
    );
    assert!(
        !t.prompt.contains("to everyone") && !t.prompt.contains("its own"),
        "{}",
        t.prompt
    );
    assert_eq!(t.who, "reviewer");
    assert!(!t.stdin, "{{prompt}} was in the arguments: stdin stays empty");
    // "Read by" counts the turn that handled it, and says what wake does for the identity.
    let readers = format!("/api/channels/dev/messages/{}/readers", m["id"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, r) = get_json(&c, &s.url(&readers)).await;
        if r["read_by"].as_array().unwrap().iter().any(|w| w == "reviewer") {
            assert_eq!(r["woken"]["reviewer"], "listening (wakes on messages)", "{r}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the handled directive never counted as read: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A reply to one of its messages wakes it too.
    let mine = post(&c, &s, "ops", json!({"sender": "reviewer", "body": "done?"})).await;
    post(
        &c,
        &s,
        "ops",
        json!({"sender": "bob", "body": "yes", "reply_to": mine["id"]}),
    )
    .await;
    let turns = agent.until_turns(2, Duration::from_secs(10));
    assert!(
        turns[1].prompt.contains("yes") && !turns[1].prompt.contains("review PR 7"),
        "{turns:?}"
    );
    // crosstalk status says who is woken, and what it does.
    let out = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args(["status", "--relay", &s.url("")])
        .env_remove("CROSSTALK_URL")
        .env_remove("CROSSTALK_TOKEN")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("woken: reviewer listening (wakes on messages) (crosstalk wake, pid "),
        "{said}"
    );
    let err = terminate(&mut w);
    assert!(err.contains("turns log to"), "{err}");
    // Once it stopped, it is no longer shown as woken.
    let (_, list) = get_json(&c, &s.url("/api/wake")).await;
    assert_eq!(list["woken"], json!([]), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_during_a_turn_go_into_one_next_turn_and_turns_never_overlap() {
    let s = Server::start();
    let c = client();
    let agent = Agent::new();
    // The prompt on stdin this time.
    let mut w = wake(
        &s,
        &agent,
        "builder",
        &["--listen", "dev"],
        &[("FAKE_SLEEP", "1.5")],
        false,
    );
    until_woken(&s, "builder").await;
    post(&c, &s, "dev", json!({"sender": "alice", "body": "first"})).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.turns().is_empty() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for body in ["second", "third", "fourth"] {
        post(&c, &s, "dev", json!({"sender": "bob", "body": body})).await;
    }
    let turns = agent.until_turns(2, Duration::from_secs(15));
    assert!(turns[0].stdin && turns[0].prompt.contains("first"), "{turns:?}");
    for body in ["second", "third", "fourth"] {
        assert!(turns[1].prompt.contains(body), "{turns:?}");
        assert!(!turns[0].prompt.contains(body), "{turns:?}");
    }
    assert!(turns[1].start >= turns[0].end.unwrap(), "turns overlapped: {turns:?}");
    quiet(&agent, 2, Duration::from_millis(800));
    terminate(&mut w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_of_wake_and_of_the_relay_hand_nothing_twice_and_miss_nothing() {
    let port = crosstalk_testkit::ports::free_port().to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start_in(dir.path(), &["--port", &port]);
    let c = client();
    let agent = Agent::new();
    let mut w = wake(&s, &agent, "reviewer", &[], &[], true);
    until_woken(&s, "reviewer").await;
    post(&c, &s, "dev", directive("alice", "reviewer", "one")).await;
    agent.until_turns(1, Duration::from_secs(10));
    terminate(&mut w);
    // Posted while no wake runs: the next one hands it out, and only it.
    post(&c, &s, "dev", directive("alice", "reviewer", "two")).await;
    let mut w = wake(&s, &agent, "reviewer", &[], &[], true);
    let turns = agent.until_turns(2, Duration::from_secs(10));
    assert!(
        turns[1].prompt.contains("two") && !turns[1].prompt.contains("one"),
        "{turns:?}"
    );
    // The relay restarts under a running wake: it waits, and goes on where it was.
    s.terminate();
    let s = Server::start_in(dir.path(), &["--port", &port]);
    post(&c, &s, "dev", directive("alice", "reviewer", "three")).await;
    let turns = agent.until_turns(3, Duration::from_secs(20));
    assert!(
        turns[2].prompt.contains("three") && !turns[2].prompt.contains("two"),
        "{turns:?}"
    );
    quiet(&agent, 3, Duration::from_millis(500));
    terminate(&mut w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_wake_for_one_identity_waits_and_says_which_holds_it() {
    let s = Server::start();
    let c = client();
    let (a, b) = (Agent::new(), Agent::new());
    let mut first = wake(&s, &a, "reviewer", &[], &[], true);
    until_woken(&s, "reviewer").await;
    let mut second = wake(&s, &b, "reviewer", &[], &[], true);
    tokio::time::sleep(Duration::from_millis(700)).await;
    post(&c, &s, "dev", directive("alice", "reviewer", "only once")).await;
    a.until_turns(1, Duration::from_secs(10));
    quiet(&b, 0, Duration::from_millis(500));
    let err = terminate(&mut first);
    assert!(!err.contains("already woken"), "{err}");
    // The second takes over once the first gave the lease back.
    until_held_by(&s, "reviewer", &second).await;
    post(&c, &s, "dev", directive("alice", "reviewer", "to the second")).await;
    let turns = b.until_turns(1, Duration::from_secs(10));
    assert!(turns[0].prompt.contains("to the second") && !turns[0].prompt.contains("only once"));
    let err = terminate(&mut second);
    assert!(
        err.contains("already woken by another crosstalk wake (pid ") && err.contains("waiting until it stops"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_turn_is_retried_and_then_handed_to_a_person() {
    let s = Server::start();
    let c = client();
    let agent = Agent::new();
    let mut w = wake(
        &s,
        &agent,
        "reviewer",
        &["--retries", "1"],
        &[("FAKE_MODE", "fail")],
        true,
    );
    until_woken(&s, "reviewer").await;
    let m = post(&c, &s, "dev", directive("alice", "reviewer", "will fail")).await;
    agent.until_turns(2, Duration::from_secs(15));
    let deadline = Instant::now() + Duration::from_secs(10);
    let question = loop {
        let (_, list) = get_json(&c, &s.url("/api/channels/dev/messages?since_id=0")).await;
        if let Some(q) = list.as_array().unwrap().iter().find(|q| q["type"] == "QUESTION") {
            break q.clone();
        }
        assert!(Instant::now() < deadline, "no question to a person: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(question["recipient"], "any-human");
    assert_eq!(question["sender"], "reviewer");
    let body = question["body"].as_str().unwrap();
    assert!(
        body.contains(&format!("#{} on dev", m["id"])) && body.contains("exit 3"),
        "{body}"
    );
    // Handed to a person: not tried again.
    quiet(&agent, 2, Duration::from_millis(1500));
    let state = until_woken(&s, "reviewer").await;
    let outcomes: Vec<&str> = state["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["exit 3", "exit 3"], "{state}");
    terminate(&mut w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_guard_stops_two_agents_answering_each_other_and_a_person_resumes_them() {
    let s = Server::start();
    let c = client();
    let (a, b) = (Agent::new(), Agent::new());
    let reply = [("FAKE_MODE", "reply"), ("FAKE_CHANNEL", "dev")];
    let flags = ["--listen", "dev", "--loop-guard", "2", "--retries", "0"];
    let mut wa = wake(&s, &a, "agent-a", &flags, &reply, true);
    let mut wb = wake(&s, &b, "agent-b", &flags, &reply, true);
    until_woken(&s, "agent-a").await;
    until_woken(&s, "agent-b").await;
    post(&c, &s, "dev", json!({"sender": "agent-c", "body": "kick off"})).await;
    // Each answers the other until the guard stops it, and asks a person.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, a_state) = get_json(&c, &s.url("/api/wake")).await;
        let paused = a_state["woken"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["state"] == "paused by the loop guard")
            .count();
        if paused == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the guard never stopped them: {a_state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (na, nb) = (a.turns().len(), b.turns().len());
    assert!(na <= 3 && nb <= 3, "{na} and {nb} turns");
    let (_, list) = get_json(&c, &s.url("/api/channels/dev/messages?since_id=0&limit=1000")).await;
    let questions: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "QUESTION")
        .collect();
    assert_eq!(questions.len(), 2, "{list}");
    assert!(
        questions[0]["body"].as_str().unwrap().contains("woken only by agents"),
        "{list}"
    );
    quiet(&a, na, Duration::from_millis(800));
    assert_eq!(b.turns().len(), nb);
    // A restart while paused keeps the pause, and what arrives meanwhile waits on the relay
    // for the person, not in the process.
    let first = terminate(&mut wa);
    assert!(!first.contains("panicked"), "{first}");
    let mut wa = wake(&s, &a, "agent-a", &flags, &reply, true);
    let v = until_held_by(&s, "agent-a", &wa).await;
    assert_eq!(v["state"], "paused by the loop guard", "{v}");
    post(
        &c,
        &s,
        "dev",
        json!({"sender": "agent-c", "body": "held across a restart"}),
    )
    .await;
    quiet(&a, na, Duration::from_millis(800));
    // A person writes on the channel: both wake again.
    let (status, reg) = common::request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "pat", "kind": "human"})),
        None,
    )
    .await;
    assert!(status < 300, "{status} {reg}");
    let session = reg["session"].as_str().unwrap();
    let (status, _) = common::request(
        &c,
        "POST",
        &s.url("/api/channels/dev/messages"),
        Some(json!({"sender": "pat", "body": "go on, once more"})),
        Some(session),
    )
    .await;
    assert_eq!(status, 200);
    let turns = a.until_turns(na + 1, Duration::from_secs(10));
    let resumed = &turns[na].prompt;
    assert!(
        resumed.contains("held across a restart") && resumed.contains("go on, once more"),
        "{resumed}"
    );
    let turns = b.until_turns(nb + 1, Duration::from_secs(10));
    assert!(
        turns[nb].prompt.contains("held across a restart"),
        "{}",
        turns[nb].prompt
    );
    let err = terminate(&mut wa);
    assert!(
        err.contains("is paused by the loop guard; a person's message lifts it"),
        "{err}"
    );
    terminate(&mut wb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hourly_budget_asks_a_person_instead_of_going_on() {
    let s = Server::start();
    let c = client();
    let agent = Agent::new();
    let mut w = wake(&s, &agent, "reviewer", &["--max-turns-per-hour", "1"], &[], true);
    until_woken(&s, "reviewer").await;
    post(&c, &s, "dev", directive("alice", "reviewer", "first")).await;
    agent.until_turns(1, Duration::from_secs(10));
    post(&c, &s, "dev", directive("alice", "reviewer", "second")).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = until_woken(&s, "reviewer").await;
        if v["state"] == "paused by the hourly budget" {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    quiet(&agent, 1, Duration::from_millis(500));
    let (_, list) = get_json(&c, &s.url("/api/channels/dev/messages?since_id=0")).await;
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|m| m["type"] == "QUESTION" && m["body"].as_str().unwrap().contains("--max-turns-per-hour")),
        "{list}"
    );
    terminate(&mut w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_running_turn_finish_and_a_cut_one_is_handed_again() {
    let s = Server::start();
    let c = client();
    let agent = Agent::new();
    // Within the grace period: the turn finishes, and counts as handled.
    let mut w = wake(&s, &agent, "reviewer", &["--grace", "5s"], &[("FAKE_SLEEP", "1")], true);
    until_woken(&s, "reviewer").await;
    post(&c, &s, "dev", directive("alice", "reviewer", "finish me")).await;
    while agent.turns().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = terminate(&mut w);
    assert!(err.contains("has 5 s to finish"), "{err}");
    assert!(agent.turns()[0].end.is_some(), "the turn was cut short");
    // Past the grace period: the turn is stopped, and what it was handed is handed again.
    let mut w = wake(
        &s,
        &agent,
        "reviewer",
        &["--grace", "0.3"],
        &[("FAKE_SLEEP", "5")],
        true,
    );
    until_woken(&s, "reviewer").await;
    post(&c, &s, "dev", directive("alice", "reviewer", "cut me")).await;
    while agent.turns().len() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    terminate(&mut w);
    let turns = agent.turns();
    assert!(turns[1].end.is_none(), "{turns:?}");
    let mut w = wake(&s, &agent, "reviewer", &[], &[], true);
    let turns = agent.until_turns(2, Duration::from_secs(10));
    let again = turns.last().unwrap();
    assert!(
        again.prompt.contains("cut me") && !again.prompt.contains("finish me"),
        "{turns:?}"
    );
    terminate(&mut w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_line_without_a_backtrace() {
    let s = Server::start_with(&["--token", "admin-secret", "--participants", "alice:alice-secret"]);
    let agent = Agent::new();
    let run = |args: &[&str], relay: &str, token: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
        c.args(["wake", "--relay", relay, "--log-dir"]).arg(agent.dir.path());
        if let Some(t) = token {
            c.args(["--token", t]);
        }
        c.args(args)
            .env_remove("CROSSTALK_URL")
            .env_remove("CROSSTALK_TOKEN")
            .env_remove("CROSSTALK_AS")
            .stdin(Stdio::null());
        c.output().unwrap()
    };
    let out = run(
        &["--as", "bob", "--", "no-such-agent-command"],
        &s.url(""),
        Some("admin-secret"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("\"no-such-agent-command\" was not found"), "{err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    let out = run(
        &["--as", "bob", "--", &agent.script()],
        &s.url(""),
        Some("alice-secret"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot act as \"bob\""), "{err}");
    let out = run(&["--", &agent.script()], &s.url(""), Some("admin-secret"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--as"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A relay that is not up: it says so once and waits.
    let nowhere = format!("http://127.0.0.1:{}", crosstalk_testkit::ports::free_port());
    let mut c = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
    let mut waiting = c
        .args(["wake", "--relay", &nowhere, "--as", "bob", "--log-dir"])
        .arg(agent.dir.path())
        .args(["--", &agent.script()])
        .env_remove("CROSSTALK_URL")
        .env_remove("CROSSTALK_TOKEN")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(waiting.try_wait().unwrap().is_none(), "it should wait for the relay");
    let err = terminate(&mut waiting);
    assert!(
        err.contains("cannot reach the relay") && err.contains("waiting for it"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_output_posts_the_turns_stdout_as_the_identity_on_the_channel_that_woke_it() {
    let s = Server::start();
    let c = client();
    let agent = Agent::new();
    let say = [("FAKE_SAY", "the agent says: done")];
    let mut w = wake(&s, &agent, "scribe", &["--post-output"], &say, true);
    until_woken(&s, "scribe").await;
    post(&c, &s, "ops", directive("alice", "scribe", "write it up")).await;
    agent.until_turns(1, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, list) = get_json(&c, &s.url("/api/channels/ops/messages?since_id=0")).await;
        let said: Vec<&Value> = list
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["sender"] == "scribe")
            .collect();
        if let Some(m) = said.first() {
            assert_eq!(m["body"], "the agent says: done", "{list}");
            assert_eq!(said.len(), 1, "{list}");
            break;
        }
        assert!(Instant::now() < deadline, "the turn's output was never posted: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its own post wakes nothing.
    quiet(&agent, 1, Duration::from_millis(500));
    terminate(&mut w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_past_its_timeout_is_stopped_and_counts_as_failed() {
    let s = Server::start();
    let c = client();
    let agent = Agent::new();
    let flags = ["--turn-timeout", "1", "--retries", "0"];
    let mut w = wake(&s, &agent, "slow", &flags, &[("FAKE_SLEEP", "5")], true);
    until_woken(&s, "slow").await;
    post(&c, &s, "dev", directive("alice", "slow", "take your time")).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let question = loop {
        let (_, list) = get_json(&c, &s.url("/api/channels/dev/messages?since_id=0")).await;
        if let Some(q) = list.as_array().unwrap().iter().find(|q| q["type"] == "QUESTION") {
            break q.clone();
        }
        assert!(Instant::now() < deadline, "no question to a person: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        question["body"].as_str().unwrap().contains("timed out after 1 s"),
        "{question}"
    );
    // Stopped, not left running: the script never reached its end.
    let turns = agent.turns();
    assert_eq!(turns.len(), 1, "{turns:?}");
    assert!(turns[0].end.is_none(), "{turns:?}");
    terminate(&mut w);
}
