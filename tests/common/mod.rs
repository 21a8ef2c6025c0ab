//! Shared fixtures: a relay on 127.0.0.1 with a fresh data directory — in this process by
//! default, or a real `crosstalk` process for what needs one — a JSON client, and an SSE reader.
//!
//! [`Server::start`] and [`Server::start_with`] run the relay in the test process, through
//! `crosstalk::server::serve` on a thread of its own (its own actix system), exactly as the
//! binary assembles it but without a process to spawn, and with the same command-line flags.
//! The `process` constructors ([`Server::process`], [`Server::start_in`], [`Server::start_logging`],
//! …) spawn the binary: for a crash, a signal, a restart on the same directory, what the relay
//! logs, a file-size limit or an environment of its own. Asking an in-process relay for any of
//! those (`kill`, `terminate`, `stderr`, `pid`) panics rather than pretending.
#![allow(dead_code)]

pub mod mcp;
pub mod oauth;
pub mod tmpfs;

use futures_util::StreamExt;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A small xorshift generator: tests that draw at random stay reproducible from their seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

#[allow(unused_imports)] // each test binary uses its share
pub use crosstalk_testkit::ports::{free_base_port, free_port, wait_for_port};

/// The flags every test relay gets unless the test gives its own: loopback, a free port, the
/// data directory.
fn defaults(dir: &Path, args: &[&str]) -> Vec<String> {
    let mut d = Vec::new();
    if !args.contains(&"--host") {
        d.extend(["--host".to_owned(), "127.0.0.1".to_owned()]);
    }
    if !args.contains(&"--port") {
        d.extend(["--port".to_owned(), "0".to_owned()]);
    }
    d.extend(["--data-dir".to_owned(), dir.display().to_string()]);
    d
}

pub struct Server {
    /// The relay's process, or `None` when it runs in this process.
    child: Option<Child>,
    /// The in-process relay: its stop signal and its thread.
    in_process: Option<InProcess>,
    /// Everything the relay wrote to stderr so far.
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
    pub base: String,
    pub data_dir: PathBuf,
    /// Keeps a temporary data directory alive for the server's lifetime.
    _tmp: Option<tempfile::TempDir>,
}

/// With `CROSSTALK_TEST_NATS` set (NATS server URLs), every relay the tests start is a node
/// on the shared log (`--store`), so the black-box suites check that store too. Each data
/// directory gets a stream of its own (named from its path: a restart finds it again).
fn shared_log(dir: &Path, args: &[&str]) -> Vec<String> {
    let Ok(urls) = std::env::var("CROSSTALK_TEST_NATS") else {
        return Vec::new();
    };
    if args.contains(&"--store") {
        return Vec::new();
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    vec![
        "--store".into(),
        urls,
        "--nats-stream".into(),
        format!("T{:016x}", h.finish()),
    ]
}

struct InProcess {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Starts a relay in this process on a free port with a fresh data directory.
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    /// Starts a relay in this process with these `crosstalk serve` flags.
    pub fn start_with(args: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = Self::in_process(tmp.path(), args);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a relay process (the binary) on a fresh data directory.
    pub fn process(args: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let mut s = Self::start_in(&dir, args);
        s._tmp = Some(tmp);
        s
    }

    /// The relay as the binary assembles it (`Config::resolve`, `server::open`, `server::serve`),
    /// on a thread with an actix system of its own.
    fn in_process(dir: &Path, args: &[&str]) -> Server {
        use clap::Parser;
        use crosstalk::config::{Cli, Command, Config};
        let mut argv: Vec<String> = vec!["crosstalk".into(), "serve".into()];
        argv.extend(defaults(dir, args));
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.extend(shared_log(dir, args));
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("bad relay flags {args:?}: {e}"));
        let Some(Command::Serve(serve_args)) = cli.command else {
            unreachable!("parsed as `serve`")
        };
        let config = Config::resolve(*serve_args).unwrap_or_else(|e| panic!("bad relay flags {args:?}: {e}"));
        let listener = std::net::TcpListener::bind((config.host.as_str(), config.port)).expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready, is_ready) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = std::thread::Builder::new()
            .name("in-process-relay".into())
            .spawn(move || {
                actix_rt::System::new().block_on(async move {
                    let relay = match crosstalk::server::open(&config).await {
                        Ok(relay) => relay,
                        Err(e) => {
                            let _ = ready.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(()));
                    if let Err(e) = crosstalk::server::serve(relay, config, listener, async {
                        let _ = stopped.await;
                    })
                    .await
                    {
                        eprintln!("in-process relay: {e}");
                    }
                })
            })
            .expect("relay thread");
        match is_ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("the relay did not start: {e}"),
            Err(_) => panic!("the relay's thread ended before it started"),
        }
        Server {
            child: None,
            in_process: Some(InProcess {
                stop: Some(stop),
                thread: Some(thread),
            }),
            stderr: Default::default(),
            base,
            data_dir: dir.to_path_buf(),
            _tmp: None,
        }
    }

    /// Starts a relay on an existing data directory (for restarts).
    pub fn start_in(dir: &Path, args: &[&str]) -> Server {
        Self::spawn(dir, args, None)
    }

    /// Starts a relay with its default logging (no `RUST_LOG`), to read what it logs.
    pub fn start_logging(args: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let mut s = Self::spawn_logging(&dir, args, None, None, &[]);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a relay on an existing data directory with its default logging.
    pub fn start_logging_in(dir: &Path, args: &[&str]) -> Server {
        Self::spawn_logging(dir, args, None, None, &[])
    }

    /// Starts a relay whose files may grow to at most `bytes` each (`ulimit -f`), as a full
    /// disk would stop them.
    pub fn start_file_limited(dir: &Path, bytes: u64, args: &[&str]) -> Server {
        Self::spawn(dir, args, Some(bytes))
    }

    /// Starts a relay with these environment variables set besides the usual ones.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = Self::spawn_logging(tmp.path(), args, None, Some("warn"), env);
        s._tmp = Some(tmp);
        s
    }

    /// Starts a relay with its default logging whose stdout and stderr are pipes nobody
    /// reads any more once it has said where it listens, as `crosstalk serve | head -3`
    /// leaves them: each write it makes after that fails.
    pub fn start_unheard(args: &[&str]) -> Server {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = Self::spawn_output(tmp.path(), args, None, None, &[], false);
        s._tmp = Some(tmp);
        s
    }

    fn spawn(dir: &Path, args: &[&str], file_limit: Option<u64>) -> Server {
        Self::spawn_logging(dir, args, file_limit, Some("warn"), &[])
    }

    fn spawn_logging(
        dir: &Path,
        args: &[&str],
        file_limit: Option<u64>,
        log: Option<&str>,
        env: &[(&str, &str)],
    ) -> Server {
        Self::spawn_output(dir, args, file_limit, log, env, true)
    }

    /// Spawns the relay; with `heard`, its stdout and stderr are read to the end (stderr kept
    /// for [`Server::stderr`]), else closed once it has said where it listens.
    fn spawn_output(
        dir: &Path,
        args: &[&str],
        file_limit: Option<u64>,
        log: Option<&str>,
        env: &[(&str, &str)],
        heard: bool,
    ) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_crosstalk"));
        cmd.arg("serve")
            .args(defaults(dir, args))
            .args(args)
            .args(shared_log(dir, args))
            .env_remove("RUST_LOG")
            .env_remove("MALLOC_CONF")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(log) = log {
            cmd.env("RUST_LOG", log);
        }
        // The test's own environment last: it may set RUST_LOG too.
        cmd.envs(env.iter().copied());
        if let Some(bytes) = file_limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: bytes,
                        rlim_max: bytes,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn crosstalk");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let base = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(addr) = line.strip_prefix("crosstalk listening on ") {
                        break addr.trim().to_owned();
                    }
                }
                _ => {
                    let status = child.wait();
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    panic!("crosstalk exited before listening: {status:?}\n{err}");
                }
            }
        };
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        if !heard {
            drop(lines);
            drop(child.stderr.take());
        } else {
            // Keep draining both pipes so the child never blocks on a full one.
            std::thread::spawn(move || for _ in lines {});
            if let Some(err) = child.stderr.take() {
                let sink = stderr.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(err).lines().map_while(Result::ok) {
                        let mut s = sink.lock().unwrap();
                        s.push_str(&line);
                        s.push('\n');
                    }
                });
            }
        }
        Server {
            child: Some(child),
            in_process: None,
            stderr,
            base,
            data_dir: dir.to_path_buf(),
            _tmp: None,
        }
    }

    /// Everything the relay process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        assert!(
            self.child.is_some(),
            "an in-process relay has no stderr: start it with a process constructor"
        );
        self.stderr.lock().unwrap().clone()
    }

    /// The relay process.
    pub fn child(&mut self) -> &mut Child {
        self.child
            .as_mut()
            .expect("an in-process relay has no process: start it with a process constructor")
    }

    /// The relay process's id.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("an in-process relay has no process: start it with a process constructor")
            .id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// SIGKILL: the process gets no chance to flush anything.
    pub fn kill(&mut self) {
        let child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGTERM, then waits for exit; returns how long the exit took and whether it was clean.
    pub fn terminate(&mut self) -> (Duration, bool) {
        self.signal(libc::SIGTERM)
    }

    /// Sends `signal`, then waits for exit (at most 10 s); returns how long the exit took and
    /// whether it was clean.
    pub fn signal(&mut self, signal: i32) -> (Duration, bool) {
        let start = Instant::now();
        // SAFETY: kill(2) on the relay process this server spawned and has not waited for.
        unsafe {
            libc::kill(self.pid() as i32, signal);
        }
        let deadline = start + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = self.child().try_wait() {
                return (start.elapsed(), status.success());
            }
            if Instant::now() > deadline {
                self.kill();
                return (start.elapsed(), false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Takes the data directory away from this server (so a restart can reuse it).
    pub fn take_dir(&mut self) -> Option<tempfile::TempDir> {
        self._tmp.take()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(mut p) = self.in_process.take() {
            if let Some(stop) = p.stop.take() {
                let _ = stop.send(());
            }
            // Streams end, the server stops and the store flushes; a test waits for that
            // (so its data directory outlives the relay) but never hangs on it.
            if let Some(thread) = p.thread.take() {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !thread.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
}

/// A reqwest client builder. The relay's crate builds reqwest without a bundled TLS crypto
/// provider (it installs ring itself), so the tests install it too before building clients.
pub fn builder() -> reqwest::ClientBuilder {
    crosstalk::client::tls();
    // A connection left idle is dropped well before the relay's keep-alive (actix's 5 s)
    // closes it: reused just as the relay closed it, a POST failed with hyper's
    // IncompleteMessage under CI's load (the OAuth refresh race test, once).
    reqwest::Client::builder().pool_idle_timeout(Duration::from_secs(2))
}

/// A client that sends `Authorization: Bearer <token>` on every request.
pub fn client_with_token(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
    builder()
        .timeout(Duration::from_secs(60))
        .default_headers(headers)
        .build()
        .expect("client")
}

pub fn client() -> reqwest::Client {
    builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(64)
        .build()
        .expect("client")
}

pub fn msg(sender: &str, body: &str) -> Value {
    json!({ "sender": sender, "type": "message", "body": body })
}

/// POSTs a message and returns the stored message, panicking on any failure.
pub async fn post(c: &reqwest::Client, s: &Server, channel: &str, body: Value) -> Value {
    let r = c
        .post(s.url(&format!("/api/channels/{channel}/messages")))
        .json(&body)
        .send()
        .await
        .expect("post");
    let status = r.status();
    let v: Value = r.json().await.expect("post json");
    assert_eq!(status, 200, "post failed: {v}");
    v
}

pub async fn get_json(c: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = c.get(url).send().await.expect("get");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

/// Waits (at most 10 s) until the relay at `base` counts `want` parked waits (`/healthz`'s
/// `waits`): a test that needs a wait to be parked before it posts, or gone after a cancel,
/// waits for it to be so instead of sleeping a guess.
pub async fn until_waits(c: &reqwest::Client, base: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, h) = get_json(c, &format!("{base}/healthz")).await;
        if h["waits"].as_u64() == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "waits never became {want}: {h}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Any request, with an optional JSON body and an optional identity session token
/// (`X-Crosstalk-Session`); answers the status and the JSON body (`null` when empty).
pub async fn request(
    c: &reqwest::Client,
    method: &str,
    url: &str,
    body: Option<Value>,
    session: Option<&str>,
) -> (u16, Value) {
    let mut req = c.request(method.parse().expect("method"), url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(s) = session {
        req = req.header("X-Crosstalk-Session", s);
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    if text.is_empty() {
        return (status, Value::Null);
    }
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, v)
}

pub async fn messages(c: &reqwest::Client, s: &Server, channel: &str, since: u64) -> Vec<Value> {
    let mut all = Vec::new();
    let mut since = since;
    loop {
        let (status, v) = get_json(
            c,
            &s.url(&format!(
                "/api/channels/{channel}/messages?since_id={since}&limit=10000"
            )),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let page = v.as_array().expect("array").clone();
        if page.is_empty() {
            return all;
        }
        since = page.last().unwrap()["id"].as_u64().unwrap();
        all.extend(page);
    }
}

pub fn ids(messages: &[Value]) -> Vec<u64> {
    messages.iter().map(|m| m["id"].as_u64().expect("id")).collect()
}

/// One parsed SSE event.
#[derive(Debug, Clone)]
pub struct Event {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// Reads SSE events from a streaming response.
pub struct SseReader {
    stream: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buf: Vec<u8>,
}

impl SseReader {
    pub async fn open(c: &reqwest::Client, url: &str, last_event_id: Option<u64>) -> SseReader {
        let mut req = c.get(url).timeout(Duration::from_secs(600));
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let r = req.send().await.expect("stream");
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        SseReader {
            stream: r.bytes_stream().boxed(),
            buf: Vec::new(),
        }
    }

    /// Reads events from a response already known to be an event stream.
    pub fn from_response(r: reqwest::Response) -> SseReader {
        SseReader {
            stream: r.bytes_stream().boxed(),
            buf: Vec::new(),
        }
    }

    /// The next event (comments skipped), or None if the stream ended or `timeout` passed.
    pub async fn next(&mut self, timeout: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let frame: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let text = String::from_utf8(frame).expect("utf8 frame");
                let mut ev = Event {
                    event: "message".into(),
                    id: None,
                    data: String::new(),
                };
                let mut has_field = false;
                for line in text.lines() {
                    if line.starts_with(':') || line.is_empty() {
                        continue;
                    }
                    has_field = true;
                    let (k, v) = line.split_once(':').unwrap_or((line, ""));
                    let v = v.strip_prefix(' ').unwrap_or(v);
                    match k {
                        "event" => ev.event = v.into(),
                        "id" => ev.id = Some(v.into()),
                        "data" => {
                            if !ev.data.is_empty() {
                                ev.data.push('\n');
                            }
                            ev.data.push_str(v)
                        }
                        _ => {}
                    }
                }
                if has_field && !(ev.data.is_empty() && ev.id.is_none() && ev.event == "message") {
                    return Some(ev);
                }
                continue;
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(Some(Ok(chunk))) => self.buf.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }

    /// The next `message` event's JSON, skipping other kinds.
    pub async fn next_message(&mut self, timeout: Duration) -> Option<Value> {
        loop {
            let ev = self.next(timeout).await?;
            if ev.event == "message" {
                let v: Value = serde_json::from_str(&ev.data).expect("message json");
                assert_eq!(
                    ev.id.as_deref(),
                    Some(v["id"].to_string().as_str()),
                    "SSE id matches message id"
                );
                return Some(v);
            }
        }
    }
}

/// The value of the `/metrics` sample whose name and labels start with `series`, e.g.
/// `crosstalk_operations_total{face="rest",operation="post_message",outcome="ok"}`, or an
/// unlabelled `crosstalk_cluster_appends_waiting`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
