//! The servers under test: spawning crosstalk or crosstalk-mcp on 127.0.0.1 with a data
//! directory of the harness's choosing, timing how long each takes to answer, reading its RSS
//! from /proc, and stopping it. Children die with the harness (PR_SET_PDEATHSIG + kill on drop).

use crate::client::get_once;
use anyhow::{bail, Context as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a server may take to start answering before the harness gives up.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Pause between readiness probes.
const PROBE_EVERY: Duration = Duration::from_millis(2);
/// How long a server gets to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// This repository's relay.
    Crosstalk,
    /// crosstalk-mcp 2.0.0 from PyPI, the peer we compare with.
    Peer,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Crosstalk => "crosstalk",
            Kind::Peer => "crosstalk-mcp",
        }
    }

    /// A cheap GET that touches no stored data: the readiness probe.
    pub fn health_path(self) -> &'static str {
        match self {
            Kind::Crosstalk => "/healthz",
            // crosstalk-mcp has no health route; /ui is served without the database or a token.
            Kind::Peer => "/ui",
        }
    }
}

/// How to launch one kind of server.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub kind: Kind,
    /// A command the server runs under (a profiler), or empty.
    pub wrapper: Vec<String>,
    /// `crosstalk` binary, or the `crosstalk-mcp` console script in the virtualenv.
    pub program: PathBuf,
    /// Where the server's stdout and stderr go.
    pub log_dir: PathBuf,
}

pub struct Server {
    pub kind: Kind,
    pub addr: SocketAddr,
    child: Child,
    /// Where its stderr goes.
    log_path: PathBuf,
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

impl Launcher {
    /// Starts a server on `data_dir` and returns it with the time from spawn to its first
    /// successful health probe.
    pub async fn start(&self, data_dir: &Path, extra_args: &[&str], tag: &str) -> anyhow::Result<(Server, Duration)> {
        std::fs::create_dir_all(data_dir)?;
        std::fs::create_dir_all(&self.log_dir)?;
        // crosstalk-mcp runs inside its data directory: a relative RELAY_DB would resolve twice.
        let data_dir = &std::fs::canonicalize(data_dir)?;
        let log_path = self.log_dir.join(format!("{}-{tag}.log", self.kind.name()));
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = match self.wrapper.split_first() {
            None => Command::new(&self.program),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&self.program);
                c
            }
        };
        cmd.stdin(Stdio::null()).stderr(log.try_clone()?).kill_on_drop(true);
        let peer_port = match self.kind {
            Kind::Crosstalk => {
                cmd.args(["serve", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
                    .arg(data_dir)
                    .args(extra_args)
                    .env("RUST_LOG", "warn")
                    .stdout(Stdio::piped());
                None
            }
            Kind::Peer => {
                let port = free_port()?;
                cmd.env("HOST", "127.0.0.1")
                    .env("PORT", port.to_string())
                    .env("RELAY_DB", data_dir.join("relay.db"))
                    .env_remove("RELAY_TOKEN")
                    .env_remove("RELAY_PARTICIPANTS")
                    .current_dir(data_dir)
                    .stdout(log);
                Some(port)
            }
        };
        // SAFETY: prctl is async-signal-safe; the child dies if the harness dies.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let spawned = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {}", self.program.display()))?;
        let addr: SocketAddr = match peer_port {
            Some(port) => SocketAddr::from(([127, 0, 0, 1], port)),
            None => {
                let stdout = child.stdout.take().context("relay stdout")?;
                let mut lines = BufReader::new(stdout).lines();
                let found = tokio::time::timeout(START_TIMEOUT, async {
                    while let Some(line) = lines.next_line().await? {
                        if let Some(url) = line.strip_prefix("crosstalk listening on http://") {
                            return Ok::<_, anyhow::Error>(Some(url.trim().parse::<SocketAddr>()?));
                        }
                    }
                    Ok(None)
                })
                .await
                .context("no `listening` line in time")??;
                let Some(addr) = found else {
                    bail!("crosstalk exited before listening; see {}", log_path.display());
                };
                // Keep draining stdout so the child never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                addr
            }
        };
        let path = self.kind.health_path();
        loop {
            if let Ok(r) = get_once(addr, path).await {
                if r.status.is_success() {
                    break;
                }
            }
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{} exited with {status} while starting; see {}",
                    self.kind.name(),
                    log_path.display()
                );
            }
            if spawned.elapsed() > START_TIMEOUT {
                bail!("{} did not answer {path} within {START_TIMEOUT:?}", self.kind.name());
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
        let ready = spawned.elapsed();
        Ok((
            Server {
                kind: self.kind,
                addr,
                child,
                log_path,
            },
            ready,
        ))
    }
}

impl Server {
    pub fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("server has exited")
    }

    /// Resident set size in KiB (VmRSS from /proc/PID/status).
    pub fn rss_kib(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS in /proc status")
    }

    /// SIGTERM, then waits for a clean exit (crosstalk flushes its store on the way out).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.pid()? as libc::pid_t;
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                // uvicorn shuts down gracefully and then re-raises SIGTERM, so for the peer
                // death by that signal is a clean stop; crosstalk must exit 0 (store flushed).
                use std::os::unix::process::ExitStatusExt;
                let clean = status.success() || (self.kind == Kind::Peer && status.signal() == Some(libc::SIGTERM));
                if !clean {
                    bail!(
                        "{} exited with {status} after SIGTERM; the end of {}:\n{}",
                        self.kind.name(),
                        self.log_path.display(),
                        log_tail(&self.log_path)
                    );
                }
                Ok(())
            }
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("{} did not exit within {STOP_TIMEOUT:?} of SIGTERM", self.kind.name())
            }
        }
    }
}

/// Bytes allocated on disk under `dir` (like `du -s --block-size=1`).
pub fn disk_usage(dir: &Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            disk_usage(&entry.path())?
        } else {
            meta.blocks() * 512
        };
    }
    Ok(total)
}

/// The last lines of a server's log, for an error that the log may explain.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    if tail.is_empty() {
        "(empty)".into()
    } else {
        tail
    }
}
