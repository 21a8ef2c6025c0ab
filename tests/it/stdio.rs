//! `crosstalk mcp`, driven as a host drives a stdio server: newline-delimited JSON-RPC on its
//! stdin and stdout. The relay's tools arrive through it; a listened channel's messages are
//! pushed as `notifications/claude/channel` (never the session's own); `--tools cross-claude`
//! offers `/cc/mcp`'s tools; closing stdin takes the registered identity offline at once; and
//! in local mode two children started together share one relay they started themselves.

use crate::common;

use common::{client, client_with_token, free_port, get_json, msg, post, request, Server};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A `crosstalk mcp` child and the lines it writes.
struct Bridge {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
    next_id: u64,
    /// Notifications read while waiting for answers.
    notes: Vec<Value>,
    /// A 2026-07-28 host: no handshake, every request carries the revision in its `_meta`.
    modern: bool,
    /// Everything it wrote to stderr so far (also copied to the test's own).
    logs: std::sync::Arc<std::sync::Mutex<String>>,
}

/// The revision a 2026-07-28 host names in every request.
const MODERN: &str = "2026-07-28";

impl Bridge {
    /// A 2025-11-25 host: `initialize`, then `notifications/initialized`.
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Bridge {
        let mut b = Bridge::start(args, env, false);
        let init = b.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test-host", "version": "1"}}),
        );
        assert!(
            init["result"]["capabilities"]["experimental"]["claude/channel"].is_object(),
            "{init}"
        );
        assert!(
            init["result"]["capabilities"]["experimental"]["claude/channel/permission"].is_object(),
            "{init}"
        );
        assert!(init["result"]["capabilities"]["tools"].is_object(), "{init}");
        b.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        b
    }

    /// A 2026-07-28 host, as the Python SDK's default mode is one: `server/discover`, which
    /// must offer that revision, and no session.
    fn spawn_modern(args: &[&str], env: &[(&str, &str)]) -> Bridge {
        let mut b = Bridge::start(args, env, true);
        let found = b.request("server/discover", json!({}));
        let versions = &found["result"]["supportedVersions"];
        assert!(
            versions.as_array().is_some_and(|v| v.contains(&json!(MODERN))),
            "{found}"
        );
        assert_eq!(found["result"]["resultType"], "complete", "{found}");
        b
    }

    /// Spawns `crosstalk mcp ARGS` with `env` set (an empty value unsets the variable).
    fn start(args: &[&str], env: &[(&str, &str)], modern: bool) -> Bridge {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
        cmd.arg("mcp")
            .args(args)
            .env_remove("CROSSTALK_URL")
            .env_remove("CROSSTALK_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            if v.is_empty() {
                cmd.env_remove(k);
            } else {
                cmd.env(k, v);
            }
        }
        let mut child = cmd.spawn().expect("spawn crosstalk mcp");
        let logs = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let mut logs = sink.lock().unwrap();
                logs.push_str(&line);
                logs.push('\n');
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON on stdout: {line:?}: {e}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Bridge {
            child,
            stdin,
            lines,
            next_id: 0,
            notes: Vec::new(),
            modern,
            logs,
        }
    }

    fn send(&mut self, v: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, mut params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        if self.modern {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "test-host", "version": "1"}
            });
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {method}"));
            if v["id"] == id {
                return v;
            }
            self.notes.push(v);
        }
    }

    fn call(&mut self, tool: &str, args: Value) -> Value {
        let r = self.request("tools/call", json!({"name": tool, "arguments": args}));
        assert!(r["error"].is_null(), "{tool}: {r}");
        r["result"].clone()
    }

    /// Waits until `delivery_status` says `channel` is pushed and connected: until then a
    /// permission prompt has no channel to go to (the bridge says so and leaves it to the host).
    fn until_listening(&mut self, channel: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let st = structured(&self.call("delivery_status", json!({})));
            if st["pushed"][0]["channel"] == channel && st["pushed"][0]["connected"] == true {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the {channel} listener never connected: {st}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The next channel notification (or none within `wait`).
    fn pushed(&mut self, wait: Duration) -> Option<Value> {
        self.notified(is_push, wait)
    }

    /// The next notification that `wanted` picks (or none within `wait`).
    fn notified(&mut self, wanted: impl Fn(&Value) -> bool, wait: Duration) -> Option<Value> {
        if let Some(i) = self.notes.iter().position(&wanted) {
            return Some(self.notes.remove(i));
        }
        let deadline = Instant::now() + wait;
        while let Ok(v) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if wanted(&v) {
                return Some(v);
            }
            self.notes.push(v);
        }
        None
    }

    fn tool_names(&mut self) -> Vec<String> {
        let r = self.request("tools/list", json!({}));
        r["result"]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Closes stdin, as a host does when it ends the session; the child must exit soon.
    fn close(mut self) -> Duration {
        let t = Instant::now();
        drop(self.stdin.take());
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "crosstalk mcp exited with {status}");
                return t.elapsed();
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "crosstalk mcp did not exit after stdin closed"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_push(v: &Value) -> bool {
    v["method"] == "notifications/claude/channel"
}

fn structured(result: &Value) -> Value {
    if result["structuredContent"].is_object() {
        return result["structuredContent"].clone();
    }
    serde_json::from_str(result["content"][0]["text"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

async fn status_of(c: &reqwest::Client, s: &Server, who: &str) -> String {
    let (_, list) = get_json(c, &s.url("/api/instances")).await;
    let list = list.get("instances").cloned().unwrap_or(list);
    list.as_array()
        .and_then(|l| l.iter().find(|i| i["instance_id"] == who))
        .map(|i| i["status"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_push_and_presence_over_stdio() {
    let s = Server::start();
    let c = client();
    let url = s.url("");
    let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url, "--listen", "dev"], &[]));
    let names = tokio::task::block_in_place(|| b.tool_names());
    for t in [
        "post_message",
        "wait_for_message",
        "register",
        "listen_live",
        "stop_listening",
        "delivery_status",
        "reserve",
    ] {
        assert!(names.iter().any(|n| n == t), "{t} missing from {names:?}");
    }
    let reg = tokio::task::block_in_place(|| b.call("register", json!({"instance_id": "stdio-agent"})));
    assert_ne!(reg["isError"], true, "{reg}");
    // Path reservations through the bridge, as the registered identity.
    let held = tokio::task::block_in_place(|| b.call("reserve", json!({"paths": ["src/**"], "project": "stdio"})));
    assert_eq!(
        held["structuredContent"]["reservation"]["holder"], "stdio-agent",
        "{held}"
    );
    assert_eq!(status_of(&c, &s, "stdio-agent").await, "online");

    // A message from someone else on the listened channel is pushed, with who and which id.
    let theirs = post(&c, &s, "dev", msg("alice", "please review #42")).await;
    let pushed = tokio::task::block_in_place(|| b.pushed(Duration::from_secs(10))).expect("pushed into the session");
    assert_eq!(pushed["params"]["content"], "please review #42", "{pushed}");
    assert_eq!(pushed["params"]["meta"]["sender"], "alice");
    assert_eq!(pushed["params"]["meta"]["channel"], "dev");
    assert_eq!(pushed["params"]["meta"]["message_id"], theirs["id"].to_string());

    // The session's own post through the bridge is not pushed back; the next one from
    // someone else is, exactly once.
    let mine = tokio::task::block_in_place(|| {
        b.call(
            "post_message",
            json!({"channel": "dev", "sender": "stdio-agent", "body": "on it"}),
        )
    });
    assert_ne!(mine["isError"], true, "{mine}");
    post(&c, &s, "dev", msg("bob", "thanks")).await;
    let next = tokio::task::block_in_place(|| b.pushed(Duration::from_secs(10))).expect("second push");
    assert_eq!(
        next["params"]["content"], "thanks",
        "its own post was pushed back: {next}"
    );
    assert!(tokio::task::block_in_place(|| b.pushed(Duration::from_millis(500))).is_none());

    // delivery_status tells which channel is pushed and connected, and which is poll-only.
    tokio::task::block_in_place(|| b.call("get_messages", json!({"channel": "other", "since_id": 0})));
    let st = structured(&tokio::task::block_in_place(|| b.call("delivery_status", json!({}))));
    assert_eq!(st["pushed"][0]["channel"], "dev", "{st}");
    assert_eq!(st["pushed"][0]["connected"], true, "{st}");
    assert_eq!(st["pushed"][0]["delivered"], 2, "{st}");
    assert_eq!(st["poll_only"], json!(["other"]), "{st}");

    // A host that subscribes to a channel's resource gets the relay's update through the bridge.
    let uri = "crosstalk://channels/dev";
    let sub = tokio::task::block_in_place(|| b.request("resources/subscribe", json!({"uri": uri})));
    assert!(sub["error"].is_null(), "{sub}");
    post(&c, &s, "dev", msg("alice", "for subscribers")).await;
    let updated = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/resources/updated" && v["params"]["uri"] == uri,
            Duration::from_secs(10),
        )
    });
    assert!(updated.is_some(), "no resource update forwarded");
    let also = tokio::task::block_in_place(|| b.pushed(Duration::from_secs(10))).expect("pushed too");
    assert_eq!(also["params"]["content"], "for subscribers");

    // A name the relay would refuse is a tool error, not a listener that never connects.
    let bad = tokio::task::block_in_place(|| {
        b.request(
            "tools/call",
            json!({"name": "listen_live", "arguments": {"channel": "bad name!"}}),
        )
    });
    assert_eq!(bad["result"]["isError"], true, "{bad}");

    // stop_listening: nothing more is pushed.
    tokio::task::block_in_place(|| b.call("stop_listening", json!({"channel": "dev"})));
    post(&c, &s, "dev", msg("alice", "after stop")).await;
    assert!(tokio::task::block_in_place(|| b.pushed(Duration::from_millis(700))).is_none());

    // The host closes stdin: the process exits and the identity is offline now, not a
    // presence TTL later.
    let took = tokio::task::block_in_place(|| b.close());
    assert!(took < Duration::from_secs(5), "exit took {took:?}");
    assert_eq!(status_of(&c, &s, "stdio-agent").await, "offline");
}

/// The bridge's own tools say what they touch: this session's delivery, nothing beyond it
/// (`openWorldHint: false`), nothing destroyed, and `delivery_status` only reads. Codex runs a
/// tool without asking a person only when it says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridges_own_tools_say_they_reach_nothing_beyond_the_session() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url], &[]));
    let list = tokio::task::block_in_place(|| b.request("tools/list", json!({})));
    let annotations = |name: &str| {
        list["result"]["tools"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == name))
            .map(|t| t["annotations"].clone())
            .unwrap_or_default()
    };
    for (name, read_only) in [
        ("listen_live", false),
        ("stop_listening", false),
        ("delivery_status", true),
    ] {
        let a = annotations(name);
        assert_eq!(a["openWorldHint"], false, "{name}: {a}");
        assert_eq!(a["destructiveHint"], false, "{name}: {a}");
        assert_eq!(a["idempotentHint"], true, "{name}: {a}");
        assert_eq!(a["readOnlyHint"], read_only, "{name}: {a}");
    }
    tokio::task::block_in_place(|| b.close());
}

/// A 2026-07-28 host (the Python SDK's default mode) validates `resultType` on every result:
/// each answer the bridge gives it says `complete`, whether it forwards the relay's (which
/// answers the bridge in a 2025-11-25 session, without one) or makes it itself; a 2025-11-25
/// host gets the same answers without the field, as that revision has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_to_a_2026_07_28_host_says_its_result_type() {
    let s = Server::start();
    let url = s.url("");
    let mut b = tokio::task::block_in_place(|| Bridge::spawn_modern(&["--relay", &url], &[]));
    let uri = "crosstalk://channels/typed";
    let asked = [
        ("tools/list", json!({})),
        ("prompts/list", json!({})),
        ("prompts/get", json!({"name": "crosstalk-protocol"})),
        ("resources/templates/list", json!({})),
        (
            "tools/call",
            json!({"name": "post_message", "arguments": {"channel": "typed", "sender": "typist", "body": "hi"}}),
        ),
        (
            "tools/call",
            json!({"name": "get_messages", "arguments": {"channel": "typed", "limit": 0}}),
        ),
        ("tools/call", json!({"name": "delivery_status", "arguments": {}})),
        ("resources/list", json!({})),
        ("resources/read", json!({"uri": uri})),
    ];
    for (method, params) in &asked {
        let answer = tokio::task::block_in_place(|| b.request(method, params.clone()));
        assert!(answer["error"].is_null(), "{method} {params}: {answer}");
        assert_eq!(
            answer["result"]["resultType"], "complete",
            "{method} {params}: {answer}"
        );
    }
    // Such a host has no session to push into: listening is refused, with what to do instead.
    let live = tokio::task::block_in_place(|| b.call("listen_live", json!({"channel": "typed"})));
    assert_eq!(live["isError"], true, "{live}");
    assert!(
        live["structuredContent"]["instead"]
            .as_str()
            .is_some_and(|i| i.contains("wait_for_message")),
        "{live}"
    );
    tokio::task::block_in_place(|| b.close());

    let mut old = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url], &[]));
    for (method, params) in &asked {
        let answer = tokio::task::block_in_place(|| old.request(method, params.clone()));
        assert!(answer["error"].is_null(), "{method} {params}: {answer}");
        assert!(
            answer["result"].get("resultType").is_none(),
            "{method} {params}: {answer}"
        );
    }
    tokio::task::block_in_place(|| old.close());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_tool_set_is_the_lean_list_plus_the_bridges_own() {
    let s = Server::start();
    let url = s.url("");
    let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url, "--tools", "core"], &[]));
    let list = tokio::task::block_in_place(|| b.request("tools/list", json!({})))["result"].clone();
    let names: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for t in [
        "post_message",
        "get_messages",
        "wait_for_message",
        "ask_human",
        "listen_live",
    ] {
        assert!(names.contains(&t), "{t} missing from {names:?}");
    }
    assert!(
        !names.contains(&"reserve") && !names.contains(&"share_data"),
        "{names:?}"
    );
    let size = serde_json::to_vec(&list).unwrap().len();
    println!("crosstalk mcp --tools core: tools/list {size} bytes");
    let budget = crosstalk::bridge::CORE_TOOLS_LIST_BUDGET;
    assert!(size <= budget, "{size} bytes, over its budget of {budget}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_claude_tool_set_is_the_cc_face() {
    let s = Server::start();
    let url = s.url("");
    let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url, "--tools", "cross-claude"], &[]));
    let names = tokio::task::block_in_place(|| b.tool_names());
    for t in [
        "register",
        "send_message",
        "check_messages",
        "wait_for_reply",
        "get_replies",
        "listen_live",
    ] {
        assert!(names.iter().any(|n| n == t), "{t} missing from {names:?}");
    }
    assert!(!names.iter().any(|n| n == "post_message"), "{names:?}");
    let prompts = tokio::task::block_in_place(|| b.request("prompts/list", json!({})));
    assert_eq!(
        prompts["result"]["prompts"][0]["name"], "cross-claude-protocol",
        "{prompts}"
    );
    tokio::task::block_in_place(|| b.call("register", json!({"instance_id": "cc-stdio"})));
    let sent = structured(&tokio::task::block_in_place(|| {
        b.call(
            "send_message",
            json!({"channel": "general", "sender": "cc-stdio", "content": "hello from stdio"}),
        )
    }));
    assert!(sent.to_string().contains("hello") || sent.is_object(), "{sent}");
    let (_, got) = get_json(&client(), &s.url("/api/channels/general/messages?since_id=0")).await;
    assert!(got.to_string().contains("hello from stdio"), "{got}");
    // As with cross-claude over stdio, the session registers a second instance and speaks as
    // either.
    tokio::task::block_in_place(|| b.call("register", json!({"instance_id": "cc-stdio-2"})));
    for who in ["cc-stdio", "cc-stdio-2"] {
        let r = tokio::task::block_in_place(|| {
            b.call(
                "send_message",
                json!({"channel": "general", "sender": who, "content": format!("from {who}")}),
            )
        });
        assert_eq!(r["isError"], false, "{who}: {r}");
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(&format!("as \"{who}\"")), "{text}");
    }
    let (_, got) = get_json(&client(), &s.url("/api/channels/general/messages?since_id=0")).await;
    for who in ["cc-stdio", "cc-stdio-2"] {
        assert!(got.to_string().contains(&format!("from {who}")), "{got}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_mode_starts_one_shared_relay() {
    let home = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let data = home.path().join("data");
    let env = [
        ("HOME", home.path().to_str().unwrap()),
        ("XDG_CONFIG_HOME", home.path().to_str().unwrap()),
        ("CROSSTALK_LOCAL_ADDR", addr.as_str()),
        ("CROSSTALK_LOCAL_DATA", data.to_str().unwrap()),
    ];
    // Two terminals at the same moment: one relay, both served.
    let (mut a, mut b) = tokio::task::block_in_place(|| {
        std::thread::scope(|sc| {
            let ta = sc.spawn(|| Bridge::spawn(&[], &env));
            let tb = sc.spawn(|| Bridge::spawn(&[], &env));
            (ta.join().unwrap(), tb.join().unwrap())
        })
    });
    tokio::task::block_in_place(|| {
        a.call(
            "post_message",
            json!({"channel": "local", "sender": "a", "body": "one"}),
        );
        b.call(
            "post_message",
            json!({"channel": "local", "sender": "b", "body": "two"}),
        );
    });
    let c = client();
    let (status, got) = get_json(&c, &format!("http://{addr}/api/channels/local/messages?since_id=0")).await;
    assert_eq!(status, 200);
    assert_eq!(
        got.as_array().map(Vec::len),
        Some(2),
        "both children use the one relay: {got}"
    );
    let pid = relay_pid(port).expect("the local relay runs");
    let starts = std::fs::read_to_string(data.join("relay.log")).unwrap_or_default();
    assert!(data.join("store").is_dir(), "the relay's data is in the local data dir");
    // SIGTERM (a host stopping its servers) also takes the identity offline at once.
    tokio::task::block_in_place(|| a.call("register", json!({"instance_id": "local-a"})));
    let (_, list) = get_json(&c, &format!("http://{addr}/api/instances")).await;
    assert!(list.to_string().contains("\"online\""), "{list}");
    unsafe {
        libc::kill(a.child.id() as i32, libc::SIGTERM);
    }
    let t = Instant::now();
    tokio::task::block_in_place(|| {
        while a.child.try_wait().unwrap().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "SIGTERM did not stop crosstalk mcp"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let (_, list) = get_json(&c, &format!("http://{addr}/api/instances")).await;
    assert!(
        list.to_string().contains("\"offline\"") && !list.to_string().contains("\"online\""),
        "{list}"
    );
    tokio::task::block_in_place(|| b.close());
    // The relay outlives the children (a third finds it running), then we stop it.
    let (status, _) = get_json(&c, &format!("http://{addr}/healthz")).await;
    assert_eq!(status, 200, "the local relay outlives its children; log: {starts}");
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}

/// The pid of the process listening on `port` (from /proc/net/tcp and the fds).
fn relay_pid(port: u16) -> Option<i32> {
    let tcp = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = tcp.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local = f.get(1)?;
        let p = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
        (p == port && f.get(3) == Some(&"0A")).then(|| f[9].to_owned())
    })?;
    let needle = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy() == needle) {
                return Some(pid);
            }
        }
    }
    None
}

#[test]
fn print_config_gives_each_host_its_snippet() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_crosstalk"))
            .arg("mcp")
            .args(args)
            .env_remove("CROSSTALK_URL")
            .env_remove("CROSSTALK_TOKEN")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // The JSON part of a snippet: the value that starts at the first `{`.
    let json_of = |text: &str| -> Value {
        serde_json::Deserializer::from_str(&text[text.find('{').unwrap()..])
            .into_iter::<Value>()
            .next()
            .unwrap()
            .unwrap()
    };

    // Local mode: no relay, no environment.
    let local = run(&["--print-config", "claude-code", "--listen", "dev"]);
    assert!(local.contains("claude mcp add crosstalk -- "), "{local}");
    assert!(local.trim_end().contains("mcp --listen dev"), "{local}");
    let server = &json_of(&local)["mcpServers"]["crosstalk"];
    assert_eq!(server["args"], json!(["mcp", "--listen", "dev"]), "{local}");
    assert_eq!(server["env"], json!({}), "{local}");
    // How to see the pushes: Claude Code's channels flag.
    assert!(
        local.contains("claude --dangerously-load-development-channels server:crosstalk"),
        "{local}"
    );
    let codex = run(&["--print-config", "codex", "--listen", "dev"]);
    assert!(codex.contains("[mcp_servers.crosstalk]"), "{codex}");
    assert!(codex.contains(r#"args = ["mcp", "--listen", "dev"]"#), "{codex}");
    let vscode = run(&["--print-config", "vscode"]);
    assert_eq!(json_of(&vscode)["servers"]["crosstalk"]["type"], "stdio", "{vscode}");

    // A remote relay: its URL and a token placeholder, for each host.
    let remote = run(&["--print-config", "claude-code", "--relay", "https://relay.example:8765"]);
    assert!(
        remote.contains("-e CROSSTALK_URL=https://relay.example:8765 -e CROSSTALK_TOKEN=<your token> -- "),
        "{remote}"
    );
    for host in ["claude-desktop", "cursor"] {
        let text = run(&[
            "--print-config",
            host,
            "--relay",
            "https://relay.example:8765",
            "--tools",
            "cross-claude",
        ]);
        let server = &json_of(&text)["mcpServers"]["crosstalk"];
        assert_eq!(server["args"], json!(["mcp", "--tools", "cross-claude"]), "{text}");
        assert_eq!(server["env"]["CROSSTALK_URL"], "https://relay.example:8765", "{text}");
        assert_eq!(server["env"]["CROSSTALK_TOKEN"], "<your token>", "{text}");
    }
}

/// A host that starts `crosstalk mcp` before the relay keeps the tools: the bridge answers
/// `initialize` and `tools/list` at once, with the relay's whole tool list (as this binary's
/// relay has it), a tool called meanwhile says the relay is not reachable and how to fix it,
/// and once the relay is up the same call works. The tool list the relay gives is the one the
/// host was given, so the host is not told it changed; the resources it was answered without
/// the relay (none) did change, and it is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_starts_before_the_relay_and_connects_when_it_comes() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url], &[]));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "initialize took {:?} with no relay",
        started.elapsed()
    );
    let asked = Instant::now();
    let names = tokio::task::block_in_place(|| b.tool_names());
    // It used to wait 5 s for the relay, and then list the bridge's own tools alone.
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "tools/list took {:?} with no relay",
        asked.elapsed()
    );
    for t in [
        "post_message",
        "wait_for_message",
        "register",
        "reserve",
        "delivery_status",
    ] {
        assert!(names.iter().any(|n| n == t), "{t} missing without a relay: {names:?}");
    }
    let resources = tokio::task::block_in_place(|| b.request("resources/list", json!({})));
    assert_eq!(resources["result"]["resources"], json!([]), "{resources}");
    let r = tokio::task::block_in_place(|| b.call("list_channels", json!({})));
    assert_eq!(r["isError"], true, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert!(text.contains(&url) && text.contains("not reachable"), "{text}");
    assert!(text.contains("crosstalk serve"), "no remedy in: {text}");
    assert!(!text.contains("rmcp::"), "internal type names in: {text}");

    // The relay that comes holds a channel already (a store written by an earlier run), so
    // a host that lists again at the notice must find it: the notice comes once the session
    // is up, not while the bridge still answers from its own catalog.
    let data = tempfile::tempdir().unwrap();
    {
        let earlier = Server::start_in(data.path(), &[]);
        post(&client(), &earlier, "early", msg("a", "from an earlier run")).await;
    }
    let s = Server::start_in(data.path(), &["--port", &port.to_string()]);
    let changed = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/resources/list_changed",
            Duration::from_secs(20),
        )
    });
    assert!(changed.is_some(), "no resources/list_changed once the relay came");
    let listed = tokio::task::block_in_place(|| b.request("resources/list", json!({})));
    assert!(
        listed["result"]["resources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["uri"] == "crosstalk://channels/early")),
        "the list at the notice: {listed}"
    );
    assert_eq!(tokio::task::block_in_place(|| b.tool_names()), names);
    let r = tokio::task::block_in_place(|| {
        b.call(
            "post_message",
            json!({"channel": "late", "sender": "early-bird", "body": "made it"}),
        )
    });
    assert_ne!(r["isError"], true, "{r}");
    let (_, list) = get_json(&client(), &s.url("/api/channels/late/messages")).await;
    assert_eq!(list[0]["body"], "made it", "{list}");
    let told = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/tools/list_changed",
            Duration::from_millis(500),
        )
    });
    assert!(told.is_none(), "told the tools changed, and they did not: {told:?}");
    tokio::task::block_in_place(|| b.close());
}

/// A 2026-07-28 host has no session to be notified on: it hears of changes on the
/// `subscriptions/listen` stream it opens. Started before its relay, it is given this binary's
/// relay's whole tool list; the relay that comes lists only the core tools (`--tools core`),
/// so the list really changed and the stream says so; a post on a channel it listens to is
/// told as that resource's update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_07_28_host_hears_of_changes_on_its_listen_stream() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut b = tokio::task::block_in_place(|| Bridge::spawn_modern(&["--relay", &url], &[]));
    let before = tokio::task::block_in_place(|| b.tool_names());
    assert!(before.iter().any(|n| n == "search_messages"), "{before:?}");
    let uri = "crosstalk://channels/news";
    tokio::task::block_in_place(|| {
        b.next_id += 1;
        let id = b.next_id;
        let mut params = json!({"notifications": {
            "toolsListChanged": true,
            "resourceSubscriptions": [uri, "https://elsewhere.example/x"]
        }});
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "test-host", "version": "1"}
        });
        b.send(json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": params}));
    });
    let ack = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/subscriptions/acknowledged",
            Duration::from_secs(10),
        )
    })
    .expect("the listen was acknowledged");
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!([uri]),
        "only the relay's resources are accepted: {ack}"
    );

    let s = Server::start_with(&["--port", &port.to_string(), "--tools", "core"]);
    let changed = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/tools/list_changed",
            Duration::from_secs(20),
        )
    });
    assert!(changed.is_some(), "no tools/list_changed on the listen stream");
    let after = tokio::task::block_in_place(|| b.tool_names());
    assert!(!after.iter().any(|n| n == "search_messages"), "{after:?}");
    assert!(after.iter().any(|n| n == "post_message"), "{after:?}");

    post(&client(), &s, "news", msg("reporter", "extra")).await;
    let updated = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/resources/updated",
            Duration::from_secs(20),
        )
    });
    assert_eq!(updated.map(|v| v["params"]["uri"].clone()), Some(json!(uri)));
    tokio::task::block_in_place(|| b.close());
}

/// A wrong token is said as such, with the setting that fixes it — not as a transport error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_says_when_the_relay_refuses_its_token() {
    let s = Server::start_with(&["--token", "right-token"]);
    let url = s.url("");
    let mut b =
        tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url], &[("CROSSTALK_TOKEN", "wrong-token")]));
    let r = tokio::task::block_in_place(|| b.call("list_channels", json!({})));
    assert_eq!(r["isError"], true, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("refused the token"), "{text}");
    assert!(text.contains("CROSSTALK_TOKEN"), "no remedy in: {text}");
    tokio::task::block_in_place(|| b.close());
}

/// A host stops its servers with SIGINT and escalates to SIGTERM 100 ms later (Claude Code
/// does): the bridge exits within that after either signal (it took 210 ms, waiting for its
/// stdin reader), and has closed its relay session by then, so the identity it registered is
/// offline at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_ends_the_bridge_within_100_ms_signed_off() {
    let s = Server::start();
    let c = client();
    let url = s.url("");
    for (n, signal) in [libc::SIGINT, libc::SIGTERM].into_iter().enumerate() {
        let who = format!("signalled-{n}");
        // The fastest of up to six tries, less what this machine adds to any process there
        // and then: the 100 ms are the bridge's budget, not the machine's. The suite runs
        // this beside the NATS suite's clusters on two cores, where in a fresh checkout all
        // of six tries once took 105 ms or more. What the machine adds is measured each try:
        // a trivial child's exit after the same signal, and one round trip to the relay (the
        // bridge's sign-off is one).
        let mut fastest = Duration::MAX;
        for _ in 0..6 {
            let machine = {
                let mut idle = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
                let t = Instant::now();
                // SAFETY: kill(2) on the child just spawned and not waited for.
                unsafe {
                    libc::kill(idle.id() as i32, signal);
                }
                let _ = tokio::task::block_in_place(|| idle.wait());
                let child = t.elapsed();
                let t = Instant::now();
                let _ = get_json(&c, &s.url("/healthz")).await;
                child + t.elapsed()
            };
            let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url, "--listen", "dev"], &[]));
            tokio::task::block_in_place(|| b.call("register", json!({"instance_id": who})));
            assert_eq!(status_of(&c, &s, &who).await, "online");
            let t = Instant::now();
            // SAFETY: kill(2) on the child this test spawned and has not waited for.
            unsafe {
                libc::kill(b.child.id() as i32, signal);
            }
            let status = tokio::task::block_in_place(|| b.child.wait()).expect("wait");
            fastest = fastest.min(t.elapsed().saturating_sub(machine));
            assert!(status.success(), "signal {signal}: {status}");
            assert_eq!(status_of(&c, &s, &who).await, "offline", "signal {signal}");
            if fastest < Duration::from_millis(100) {
                break;
            }
        }
        assert!(
            fastest < Duration::from_millis(100),
            "signal {signal}: the bridge took {fastest:?} to exit, beyond what this machine added"
        );
    }
}

/// The bridge's stderr lands in its host's log, where Claude Code files every line as an
/// error: with no `RUST_LOG` it says what is wrong (a relay it cannot reach) and nothing
/// when all is well (it said "connected to the relay" at INFO).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_logs_only_what_is_wrong_by_default() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url], &[("RUST_LOG", "")]));
    let logs = b.logs.clone();
    let r = tokio::task::block_in_place(|| b.call("list_channels", json!({})));
    assert_eq!(r["isError"], true, "{r}");
    let _s = Server::start_with(&["--port", &port.to_string()]);
    let t = Instant::now();
    tokio::task::block_in_place(|| {
        while b.call("list_channels", json!({}))["isError"] == true {
            assert!(t.elapsed() < Duration::from_secs(20), "the bridge never connected");
            std::thread::sleep(Duration::from_millis(100));
        }
        b.call("register", json!({"instance_id": "quiet-one"}));
        b.close();
    });
    let logs = logs.lock().unwrap().clone();
    assert!(
        logs.contains("not reachable"),
        "the unreachable relay was not said: {logs}"
    );
    assert!(!logs.contains(" INFO "), "INFO lines by default: {logs}");
}

/// Claude Code's permission relay, end to end over stdio: the bridge declares
/// `claude/channel/permission`; a host's `permission_request` becomes a PERMISSION message on
/// the listened channel; an agent's "allow" is refused (a participant not in --humans, an MCP
/// tool call); a human's verdict comes back to the host as `notifications/claude/channel/permission`
/// pushed (within a second unloaded); the first verdict stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_prompt_is_decided_by_a_human_on_the_relay() {
    let s = Server::start_with(&[
        "--token",
        "admin-tok",
        "--participants",
        "coder:coder-tok,dana:dana-tok",
        "--humans",
        "dana",
    ]);
    let url = s.url("");
    let mut b = tokio::task::block_in_place(|| {
        Bridge::spawn(&["--relay", &url, "--token", "coder-tok", "--listen", "ops"], &[])
    });
    // (Bridge::spawn checked that it declares claude/channel/permission.)
    tokio::task::block_in_place(|| b.until_listening("ops"));
    tokio::task::block_in_place(|| {
        b.send(json!({"jsonrpc": "2.0", "method": "notifications/claude/channel/permission_request", "params": {
            "request_id": "tbxkq", "tool_name": "Bash", "description": "run the tests", "input_preview": "cargo test --all"
        }}))
    });
    // The prompt, on the channel, for any human.
    let admin = client_with_token("admin-tok");
    let prompt = relayed_prompt(&admin, &s).await;
    let body = prompt["body"].as_str().unwrap();
    assert!(
        body.contains("Bash") && body.contains("cargo test --all") && body.contains("tbxkq"),
        "{body}"
    );
    assert_eq!(prompt["sender"], "coder");
    assert_eq!(prompt["status"], "open");
    let pid = prompt["id"].as_u64().unwrap();
    let answer = |token: &str, sender: &str, verdict: &str| {
        let (c, url) = (client_with_token(token), s.url("/api/channels/ops/messages"));
        let body = json!({"sender": sender, "type": "ANSWER", "body": verdict, "reply_to": pid});
        async move { request(&c, "POST", &url, Some(body), None).await }
    };
    // The agent cannot allow its own tool use: not by REST, not by an MCP tool call.
    let (st, e) = answer("coder-tok", "coder", "allow").await;
    assert_eq!(st, 403, "{e}");
    assert!(e["error"].as_str().unwrap().contains("only a human"), "{e}");
    let m = common::mcp::Mcp::connect_with(&s, client_with_token("admin-tok")).await;
    let err = m
        .call_err(
            "post_message",
            json!({"channel": "ops", "sender": "dana", "type": "ANSWER", "body": "allow", "reply_to": pid}),
        )
        .await;
    assert!(err.contains("only a human") || err.contains("MCP"), "{err}");
    // Nor say anything but allow or deny.
    let (st, e) = answer("dana-tok", "dana", "sure").await;
    assert_eq!(st, 400, "{e}");
    // A human allows it: the verdict reaches the host within a second.
    let started = Instant::now();
    let (st, e) = answer("dana-tok", "dana", "Allow").await;
    assert_eq!(st, 200, "{e}");
    let verdict = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/claude/channel/permission",
            Duration::from_secs(5),
        )
    })
    .expect("no verdict reached the host");
    // Pushed, not polled for: within a second unloaded, bounded at 3 s so that the load of the
    // whole suite on two cores cannot fail it.
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!(verdict["params"], json!({"request_id": "tbxkq", "behavior": "allow"}));
    // The first verdict stands.
    let (st, e) = answer("admin-tok", "admin", "deny").await;
    assert_eq!(st, 409, "{e}");
    let (_, after) = get_json(&admin, &s.url(&format!("/api/channels/ops/messages/{pid}"))).await;
    assert_eq!(after["status"], "answered", "{after}");
}

/// The PERMISSION the bridge relayed to `ops`, once it is there (10 s at most).
async fn relayed_prompt(c: &reqwest::Client, s: &Server) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, got) = get_json(c, &s.url("/api/channels/ops/messages?since_id=0")).await;
        if let Some(p) = got
            .as_array()
            .and_then(|a| a.iter().find(|m| m["type"] == "PERMISSION"))
        {
            return p.clone();
        }
        assert!(Instant::now() < deadline, "no PERMISSION message: {got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A hole once found: a permission prompt's ANSWER was checked on the raw `type` and
/// stored trimmed, so an agent's `" ANSWER"` decided its own prompt. Every spelling an agent
/// can try — whitespace of each kind, case, invisible characters, Unicode look-alikes — from
/// every agent principal (participant, OAuth connector, OAuth `--as`, the admin token over
/// MCP) on every face (REST, `/mcp`, `/cc/mcp`, the stdio bridge) is refused, the prompt stays
/// open, and only a human's verdict reaches the host, end to end through `crosstalk mcp`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_spelling_of_answer_lets_an_agent_decide_its_permission_prompt() {
    const ADMIN: &str = "admin-s3cret"; // the token `crate::oauth::invite` uses
    let s = Server::start_with(&[
        "--oauth",
        "--token",
        ADMIN,
        "--participants",
        "coder:coder-tok,dana:dana-tok",
        "--humans",
        "dana",
    ]);
    let url = s.url("");
    let (_, connector) = crate::oauth::connect(&s, &crate::oauth::invite(&s, &[])).await;
    let (_, bound) = crate::oauth::connect(&s, &crate::oauth::invite(&s, &["--as", "worker-7"])).await;
    let connector = connector["access_token"].as_str().unwrap().to_owned();
    let bound = bound["access_token"].as_str().unwrap().to_owned();
    let mut b = tokio::task::block_in_place(|| {
        Bridge::spawn(&["--relay", &url, "--token", "coder-tok", "--listen", "ops"], &[])
    });
    tokio::task::block_in_place(|| b.until_listening("ops"));
    tokio::task::block_in_place(|| {
        b.send(
            json!({"jsonrpc": "2.0", "method": "notifications/claude/channel/permission_request", "params": {
                "request_id": "pqrst", "tool_name": "Bash", "description": "rm -rf", "input_preview": "rm -rf /"
            }}),
        )
    });
    let admin = client_with_token(ADMIN);
    let pid = relayed_prompt(&admin, &s).await["id"].as_u64().unwrap();
    let spellings = [
        "ANSWER",
        "answer",
        " ANSWER",
        "answer\n",
        "\tAnswer",
        "ANSWER\u{a0}",
        "\u{3000}answer\u{2003}",
        "\u{2028}ANSWER",
        "ANSWER\u{200b}",
        "\u{feff}ANSWER",
        "ANS\u{200d}WER",
        "\u{410}NSWER",
        "\u{ff41}\u{ff4e}\u{ff53}\u{ff57}\u{ff45}\u{ff52}",
        "\u{391}NSWER",
    ];
    let rest = [
        ("participant coder", client_with_token("coder-tok"), "coder"),
        ("OAuth connector", client_with_token(&connector), "coder"),
        ("OAuth --as worker-7", client_with_token(&bound), "worker-7"),
    ];
    let mcps = [
        (
            "participant coder",
            common::mcp::Mcp::connect_with(&s, client_with_token("coder-tok")).await,
        ),
        (
            "admin token",
            common::mcp::Mcp::connect_with(&s, client_with_token(ADMIN)).await,
        ),
        (
            "OAuth connector",
            common::mcp::Mcp::connect_with(&s, client_with_token(&connector)).await,
        ),
        (
            "OAuth --as worker-7",
            common::mcp::Mcp::connect_with(&s, client_with_token(&bound)).await,
        ),
    ];
    let cc = common::mcp::Mcp::connect_at(&s, "/cc/mcp", client_with_token(ADMIN)).await;
    let mut tried = 0;
    for kind in spellings {
        for verdict in ["allow", " Allow\n"] {
            let post = json!({"type": kind, "body": verdict, "reply_to": pid});
            for (who, c, sender) in &rest {
                let mut body = post.clone();
                body["sender"] = json!(sender);
                let (st, e) = request(c, "POST", &s.url("/api/channels/ops/messages"), Some(body), None).await;
                assert!(st == 403 || st == 400, "{who} over REST with type {kind:?}: {st} {e}");
                tried += 1;
            }
            for (who, m) in &mcps {
                let mut args = post.clone();
                args["channel"] = json!("ops");
                args["sender"] = json!("dana");
                let r = m
                    .request("tools/call", json!({"name": "post_message", "arguments": args}))
                    .await;
                let refused = r.message.get("error").is_some() || r.message["result"]["isError"] == true;
                assert!(refused, "{who} over /mcp with type {kind:?}: {}", r.message);
                tried += 1;
            }
            let r = cc
                .request(
                    "tools/call",
                    json!({"name": "send_message", "arguments":
                        {"channel": "ops", "sender": "dana", "content": verdict, "message_type": kind, "in_reply_to": pid}}),
                )
                .await;
            let refused = r.message.get("error").is_some() || r.message["result"]["isError"] == true;
            assert!(refused, "admin over /cc/mcp with type {kind:?}: {}", r.message);
            let r = tokio::task::block_in_place(|| {
                b.request(
                    "tools/call",
                    json!({"name": "post_message", "arguments":
                        {"channel": "ops", "type": kind, "body": verdict, "reply_to": pid}}),
                )
            });
            let refused = r.get("error").is_some() || r["result"]["isError"] == true;
            assert!(refused, "the agent through crosstalk mcp with type {kind:?}: {r}");
            tried += 2;
        }
    }
    assert_eq!(tried, spellings.len() * 2 * 9);
    // Nothing was decided: the prompt is open, no ANSWER is stored, the host heard nothing.
    let (_, prompt) = get_json(&admin, &s.url(&format!("/api/channels/ops/messages/{pid}"))).await;
    assert_eq!(prompt["status"], "open", "{prompt}");
    let (_, all) = get_json(&admin, &s.url("/api/channels/ops/messages?since_id=0&limit=1000")).await;
    let stored: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["reply_to"] == pid)
        .collect();
    assert!(
        stored.is_empty(),
        "an agent's reply to the prompt was stored: {stored:?}"
    );
    let early = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/claude/channel/permission",
            Duration::from_millis(300),
        )
    });
    assert!(
        early.is_none(),
        "a verdict reached the host before any human gave one: {early:?}"
    );
    // A human's verdict, in a loose spelling, is the one the host hears; the type is stored
    // trimmed.
    let (st, e) = request(
        &client_with_token("dana-tok"),
        "POST",
        &s.url("/api/channels/ops/messages"),
        Some(json!({"sender": "dana", "type": "\tanswer\u{a0}", "body": " Deny\n", "reply_to": pid})),
        None,
    )
    .await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["type"], "answer", "{e}");
    let verdict = tokio::task::block_in_place(|| {
        b.notified(
            |v| v["method"] == "notifications/claude/channel/permission",
            Duration::from_secs(5),
        )
    })
    .expect("the human's verdict never reached the host");
    assert_eq!(verdict["params"], json!({"request_id": "pqrst", "behavior": "deny"}));
    tokio::task::block_in_place(|| b.close());
}

/// On a relay without tokens, the rule is "an identity registered as an agent never decides":
/// it held on the raw sender and type too, so it is tried with the same spellings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_relay_without_tokens_a_registered_agent_decides_nothing() {
    let s = Server::start();
    let c = client();
    let (st, e) = request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "bot", "kind": "agent"})),
        Some("bot-session"),
    )
    .await;
    assert!(st < 300, "{st} {e}");
    let asked = common::post(
        &c,
        &s,
        "ops",
        json!({"sender": "host", "type": "PERMISSION", "body": "Allow Bash?", "recipient": "any-human"}),
    )
    .await;
    let pid = asked["id"].as_u64().unwrap();
    for kind in [
        " ANSWER",
        "answer\n",
        "\tAnswer",
        "ANSWER\u{a0}",
        "ANSWER\u{200b}",
        "\u{410}NSWER",
    ] {
        for sender in ["bot", " bot", "bot\u{a0}", "\tbot\n"] {
            let body = json!({"sender": sender, "type": kind, "body": "allow", "reply_to": pid});
            let (st, e) = request(
                &c,
                "POST",
                &s.url("/api/channels/ops/messages"),
                Some(body),
                Some("bot-session"),
            )
            .await;
            assert!(st == 403 || st == 400, "{sender:?} with {kind:?}: {st} {e}");
            assert!(!e["error"].as_str().unwrap().contains("another session"), "{e}");
        }
    }
    let (_, prompt) = get_json(&c, &s.url(&format!("/api/channels/ops/messages/{pid}"))).await;
    assert_eq!(prompt["status"], "open", "{prompt}");
    // The rule still lets a person through: an identity that is not a registered agent.
    let body = json!({"sender": "lee", "type": " answer ", "body": "deny", "reply_to": pid});
    let (st, e) = request(&c, "POST", &s.url("/api/channels/ops/messages"), Some(body), None).await;
    assert_eq!((st, e["type"].as_str()), (200, Some("answer")), "{e}");
}

/// Claude Code's `--permission-prompt-tool mcp__crosstalk__permission_prompt`, as a headless
/// turn of `crosstalk wake` calls it: the request goes to the humans on the turn's channel, a
/// person's allow or deny comes back in the shape Claude Code reads, and no agent decides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permission_prompt_tool_asks_the_humans_and_answers_in_claude_codes_shape() {
    let s = Server::start();
    let c = client();
    let url = s.url("");
    let env = [("CROSSTALK_CHANNELS", "ops,dev"), ("CROSSTALK_AS", "reviewer")];
    let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url], &env));
    let tools = tokio::task::block_in_place(|| b.request("tools/list", json!({})));
    assert!(
        tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "permission_prompt"),
        "{tools}"
    );
    // Asked on the turn's first channel, as its identity, of any human; the call blocks.
    let ask = |mut b: Bridge, command: &'static str| {
        std::thread::spawn(move || {
            let r = b.call(
                "permission_prompt",
                json!({"tool_name": "Bash", "input": {"command": command}, "tool_use_id": "tu-1"}),
            );
            (b, r)
        })
    };
    let asked_of = |c: reqwest::Client, url: String, command: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, list) = get_json(&c, &format!("{url}/api/channels/ops/messages?since_id=0")).await;
            if let Some(q) = list.as_array().and_then(|l| {
                l.iter()
                    .find(|m| m["type"] == "PERMISSION" && m["body"].as_str().unwrap().contains(command))
            }) {
                return q.clone();
            }
            assert!(Instant::now() < deadline, "no PERMISSION on ops: {list}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let waiting = ask(b, "rm -rf build");
    let q = asked_of(c.clone(), url.clone(), "rm -rf build").await;
    assert_eq!(
        (q["sender"].as_str(), q["recipient"].as_str()),
        (Some("reviewer"), Some("any-human")),
        "{q}"
    );
    assert!(q["body"].as_str().unwrap().starts_with("Allow Bash? "), "{q}");
    // An agent cannot decide it; a person allows it.
    let (status, reg) = request(
        &c,
        "POST",
        &s.url("/api/register"),
        Some(json!({"instance_id": "bot", "kind": "agent"})),
        None,
    )
    .await;
    assert!(status < 300, "{reg}");
    let (status, _) = request(
        &c,
        "POST",
        &s.url("/api/channels/ops/messages"),
        Some(json!({"sender": "bot", "type": "ANSWER", "body": "allow", "reply_to": q["id"]})),
        reg["session"].as_str(),
    )
    .await;
    assert_eq!(status, 403);
    post(
        &c,
        &s,
        "ops",
        json!({"sender": "pat", "type": "ANSWER", "body": "allow", "reply_to": q["id"]}),
    )
    .await;
    let (b, r) = tokio::task::block_in_place(|| waiting.join().unwrap());
    let verdict: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(
        verdict,
        json!({"behavior": "allow", "updatedInput": {"command": "rm -rf build"}}),
        "{r}"
    );
    // A person denies the next one with crosstalk answer.
    let waiting = ask(b, "git push --force");
    let q = asked_of(c.clone(), url.clone(), "git push --force").await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crosstalk"))
        .args([
            "answer",
            "ops",
            &q["id"].to_string(),
            "deny",
            "--as",
            "pat",
            "--relay",
            &url,
        ])
        .env_remove("CROSSTALK_URL")
        .env_remove("CROSSTALK_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_b, r) = tokio::task::block_in_place(|| waiting.join().unwrap());
    let verdict: Value = serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(verdict["behavior"], "deny", "{r}");
    assert!(verdict["message"].as_str().unwrap().contains("pat denied it"), "{r}");
}

/// `delivery_status` says what `crosstalk wake` does for the session's identity: nothing
/// before it holds it, its state while it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_status_names_the_wake_state_of_the_identity() {
    let s = Server::start();
    let c = client();
    let url = s.url("");
    let mut b = tokio::task::block_in_place(|| Bridge::spawn(&["--relay", &url], &[]));
    tokio::task::block_in_place(|| b.call("register", json!({"instance_id": "woken-agent"})));
    let st = structured(&tokio::task::block_in_place(|| b.call("delivery_status", json!({}))));
    assert_eq!(st["wake"], Value::Null, "{st}");
    // A wake process takes the identity (as crosstalk wake does, through the same routes).
    let lease = json!({"holder": "h-1", "host": "here", "pid": 7, "ttl_s": 60});
    let (status, _) = request(&c, "POST", &s.url("/api/wake/woken-agent/lease"), Some(lease), None).await;
    assert_eq!(status, 200);
    let st = structured(&tokio::task::block_in_place(|| b.call("delivery_status", json!({}))));
    assert_eq!(st["wake"]["state"], "listening (wakes on messages)", "{st}");
    assert_eq!(st["wake"]["held_by"], "7@here", "{st}");
}

impl crate::cross_claude::CcClient for Bridge {
    async fn tool(&mut self, name: &str, args: Value) -> Value {
        tokio::task::block_in_place(|| self.call(name, args))
    }
}

/// `crosstalk mcp --tools cross-claude` answers a cross-claude-mcp user's session in
/// cross-claude-mcp's words, as `/cc/mcp` does (the scenario is `cross_claude`'s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_claude_users_session_reads_as_on_cross_claude_through_the_bridge() {
    let s = Server::start();
    let url = s.url("");
    let args = ["--relay", url.as_str(), "--tools", "cross-claude"];
    let mut alice = tokio::task::block_in_place(|| Bridge::spawn(&args, &[]));
    let mut bob = tokio::task::block_in_place(|| Bridge::spawn(&args, &[]));
    crate::cross_claude::a_cross_claude_users_session(&mut alice, &mut bob).await;
}
