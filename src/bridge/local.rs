//! Local mode: the relay every `crosstalk mcp` on this machine shares. The first child that
//! finds nothing answering starts one (`crosstalk serve`, detached, on loopback, data in the
//! user's data directory); a lock file makes two terminals starting at the same moment start
//! one relay, not two, and the store's own lock refuses a second writer regardless.

use crate::client::Failure;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a relay we started may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The user's data directory (`$XDG_DATA_HOME`, else `~/.local/share` on Linux; the
/// platform's own elsewhere), `/crosstalk`.
pub fn data_dir() -> Result<PathBuf, Failure> {
    crate::client::local_data_dir()
        .ok_or_else(|| Failure("local mode needs a home directory (or --local-data)".into(), 2))
}

/// Whether a relay answers at `url` (any answer from `/healthz`: a relay whose store is
/// unhealthy is still the one to use, and to report).
async fn answers(http: &reqwest::Client, url: &str) -> bool {
    http.get(format!("{url}/healthz")).send().await.is_ok()
}

/// The URL of the local relay at `addr`, started (detached) if nothing answers there.
pub async fn ensure(addr: &str, data: &Path) -> Result<String, Failure> {
    let url = format!("http://{addr}");
    crate::client::tls();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .build()?;
    if answers(&http, &url).await {
        return Ok(url);
    }
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| Failure(format!("bad local address {addr:?}: use host:port"), 2))?;
    std::fs::create_dir_all(data).map_err(|e| {
        Failure(
            format!("cannot create the local relay's directory {}: {e}", data.display()),
            2,
        )
    })?;
    let lock_path = data.join("start.lock");
    let lock = File::create(&lock_path).map_err(|e| Failure(format!("cannot open {}: {e}", lock_path.display()), 2))?;
    // One starter at a time; the others wait here and then find it running.
    let lock = tokio::task::spawn_blocking(move || lock.lock().map(|()| lock))
        .await
        .map_err(|e| Failure(e.to_string(), 2))?
        .map_err(|e| Failure(format!("cannot lock {}: {e}", lock_path.display()), 2))?;
    if answers(&http, &url).await {
        return Ok(url);
    }
    let store = data.join(crate::client::LOCAL_STORE);
    // A relay already serves the store but not here (`crosstalk serve --port …`, or one that
    // hangs): starting another would only meet its lock.
    if let Some(holder) = crate::client::served::served_by(&store)? {
        let next = match &holder.url {
            Some(at) if *at != url => format!("point this bridge at it (--relay {at}), or stop it"),
            _ => "stop it".to_owned(),
        };
        return Err(Failure(
            format!(
                "the local relay's store {} is served by {}{} and nothing answers at {url}: {next} ({})",
                store.display(),
                holder.who(),
                holder.url.as_deref().map(|u| format!(" at {u}")).unwrap_or_default(),
                holder.how_to_stop(&store),
            ),
            2,
        ));
    }
    let log_path = data.join("relay.log");
    let log = File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| Failure(format!("cannot open {}: {e}", log_path.display()), 2))?;
    // What this start writes to the log begins here (the log keeps every earlier start's).
    let written_before = log.metadata().map_or(0, |m| m.len());
    let exe = std::env::current_exe().map_err(|e| Failure(format!("cannot find this program: {e}"), 2))?;
    let mut child = start(&exe, host, port, &store, log)?;
    let started = Instant::now();
    loop {
        if answers(&http, &url).await {
            tracing::info!(%url, pid = child.id(), "started the local relay");
            drop(lock);
            return Ok(url);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Its last line says why, and what to do (a refusal of `serve` is one line): of
            // what this start wrote, not an earlier one's.
            let log = std::fs::read(&log_path).unwrap_or_default();
            let ours = String::from_utf8_lossy(log.get(written_before as usize..).unwrap_or_default());
            let why = ours
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("no word in its log");
            return Err(Failure(
                format!(
                    "the local relay exited at start ({status}): {why} (its log: {})",
                    log_path.display()
                ),
                2,
            ));
        }
        if started.elapsed() > START_TIMEOUT {
            return Err(Failure(
                format!(
                    "the local relay did not answer at {url} within {} s; see {}",
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                ),
                2,
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `crosstalk serve` in its own process group and session, so it outlives the host that
/// spawned this child and ignores the terminal's signals.
fn start(exe: &Path, host: &str, port: &str, store: &Path, log: File) -> Result<std::process::Child, Failure> {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--host", host, "--port", port, "--data-dir"])
        .arg(store)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        // The bridge's own settings are not the relay's.
        .env_remove("CROSSTALK_TOKEN")
        .env_remove("CROSSTALK_URL");
    // SAFETY: setsid is async-signal-safe; it only detaches the child from our session.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn()
        .map_err(|e| Failure(format!("cannot start the local relay ({}): {e}", exe.display()), 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The local store held by a relay that listens elsewhere: the bridge is told where, and
    /// starts no second relay to meet the lock.
    #[tokio::test]
    async fn a_store_served_elsewhere_is_named_not_started_again() {
        use std::io::Write;
        let data = tempfile::tempdir().unwrap();
        let store = data.path().join(crate::client::LOCAL_STORE);
        std::fs::create_dir_all(&store).unwrap();
        let mut pid_file = File::create(store.join(crate::client::PID_FILE)).unwrap();
        pid_file.lock().unwrap();
        let elsewhere = crate::client::served::PidRecord::here(Some("http://127.0.0.1:9".into()));
        pid_file.write_all(elsewhere.render().as_bytes()).unwrap();
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let Failure(why, _) = ensure(&free.to_string(), data.path()).await.unwrap_err();
        assert!(
            why.contains(&format!("served by pid {} at http://127.0.0.1:9", elsewhere.pid)),
            "{why}"
        );
        assert!(why.contains("--relay http://127.0.0.1:9"), "{why}");
        assert!(!data.path().join("relay.log").exists(), "a relay was started");
    }
}
