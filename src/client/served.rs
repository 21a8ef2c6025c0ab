//! Who serves a data directory, and where: the record a relay keeps in its pid file while it
//! holds the file's lock (its pid, the URL it answers at, and where the process runs), and the
//! settings `crosstalk serve` reads its address and directory from, so that `status`, `stop`
//! and the bridge's local mode find the relay `serve` started with the same environment.

use super::Failure;
use std::path::{Path, PathBuf};

/// Where `serve` reads its bind address from, in order, after `--host` (crosstalk-mcp's `HOST`
/// after our own).
pub const HOST_VARS: [&str; 2] = ["CROSSTALK_HOST", "HOST"];
/// Where `serve` reads its port from, in order, after `--port`.
pub const PORT_VARS: [&str; 2] = ["CROSSTALK_PORT", "PORT"];
/// Where `serve` reads its data directory from, in order, after `--data-dir`.
pub const DATA_DIR_VARS: [&str; 2] = ["CROSSTALK_DATA_DIR", "RELAY_DB"];
/// The address `serve` binds when none is set.
pub const DEFAULT_HOST: &str = "127.0.0.1";
/// The port `serve` binds when none is set.
pub const DEFAULT_PORT: u16 = 8765;

/// Where a setting's value came from, for messages about it: a value a shell set behind the
/// user's back (zsh sets `$HOST` to the machine's name) is named as such.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The command line, by this flag.
    Flag(&'static str),
    /// This environment variable.
    Env(&'static str),
    /// Nothing set it.
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Flag(flag) => write!(f, "{flag}"),
            Origin::Env(var) => write!(f, "${var}"),
            Origin::Default => f.write_str("the default"),
        }
    }
}

/// The first of `vars` set to something other than blanks: its name and its value, trimmed.
pub fn env_setting(vars: &[&'static str]) -> Option<(&'static str, String)> {
    vars.iter().find_map(|&var| {
        let raw = std::env::var(var).ok()?;
        let value = raw.trim();
        (!value.is_empty()).then(|| (var, value.to_owned()))
    })
}

/// The data directory `serve` uses with this `--data-dir` and the environment (and so what
/// `status` and `stop` look at): the flag, else [`DATA_DIR_VARS`], else the local relay's
/// ([`super::local_store_dir`]), else, with no home directory, [`NO_HOME_DATA_DIR`] here.
pub fn data_dir(flag: Option<PathBuf>) -> (PathBuf, Origin) {
    if let Some(dir) = flag {
        return (dir, Origin::Flag("--data-dir"));
    }
    if let Some((var, dir)) = env_setting(&DATA_DIR_VARS) {
        return (dir.into(), Origin::Env(var));
    }
    let dir = super::local_store_dir().unwrap_or_else(|| NO_HOME_DATA_DIR.into());
    (dir, Origin::Default)
}

/// The data directory of a relay started where there is no home directory (a bare
/// container): beside where it was started.
pub const NO_HOME_DATA_DIR: &str = "crosstalk-data";

/// What a data directory's pid file says about the relay that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidRecord {
    pub pid: u32,
    /// The URL a client on the relay's machine reaches it at, once it listens.
    pub url: Option<String>,
    /// The relay's PID namespace (`/proc/self/ns/pid`'s link): another one is another
    /// container, whose pids mean nothing here.
    pub pid_ns: Option<String>,
    /// The relay's host name: in a container, by default, the container's id.
    pub host: Option<String>,
}

impl PidRecord {
    /// The record of this process, answering at `url`.
    pub fn here(url: Option<String>) -> PidRecord {
        PidRecord {
            pid: std::process::id(),
            url,
            pid_ns: pid_namespace(),
            host: host_name(),
        }
    }

    /// Reads a pid file's text: the pid alone on the first line (what releases before this
    /// one wrote, and all some tools read), then `key=value` lines.
    pub fn parse(text: &str) -> Option<PidRecord> {
        let mut lines = text.lines();
        let pid = lines.next()?.trim().parse().ok()?;
        let mut record = PidRecord {
            pid,
            url: None,
            pid_ns: None,
            host: None,
        };
        for line in lines {
            match line.split_once('=') {
                Some(("url", v)) => record.url = Some(v.trim().to_owned()),
                Some(("pid_ns", v)) => record.pid_ns = Some(v.trim().to_owned()),
                Some(("host", v)) => record.host = Some(v.trim().to_owned()),
                _ => {}
            }
        }
        Some(record)
    }

    /// The pid file's text.
    pub fn render(&self) -> String {
        let mut text = format!("{}\n", self.pid);
        for (key, value) in [("url", &self.url), ("pid_ns", &self.pid_ns), ("host", &self.host)] {
            if let Some(v) = value {
                text.push_str(&format!("{key}={v}\n"));
            }
        }
        text
    }

    /// Whether the relay runs where this process can signal it: in this PID namespace, on this
    /// host. Unknown (a record without them) counts as here.
    pub fn reachable_here(&self) -> bool {
        let same = |theirs: &Option<String>, ours: Option<String>| match (theirs, ours) {
            (Some(t), Some(o)) => *t == o,
            _ => true,
        };
        same(&self.pid_ns, pid_namespace()) && same(&self.host, host_name())
    }

    /// The relay as a person would name it: `pid 1234`, or, when it runs elsewhere, where.
    pub fn who(&self) -> String {
        if self.reachable_here() {
            format!("pid {}", self.pid)
        } else {
            format!(
                "pid {} of another container or machine (host {})",
                self.pid,
                self.host.as_deref().unwrap_or("unknown")
            )
        }
    }

    /// How to stop it from here: `crosstalk stop` on its directory `dir`, or, where a signal
    /// from here cannot reach it, [`PidRecord::stop_elsewhere`].
    pub fn how_to_stop(&self, dir: &std::path::Path) -> String {
        if self.reachable_here() {
            let dir = crate::client::shell_quote(&dir.display().to_string());
            format!("`crosstalk stop --data-dir {dir}`")
        } else {
            self.stop_elsewhere()
        }
    }

    /// How to stop a relay that runs elsewhere: not `crosstalk stop`, whose signal cannot
    /// cross a container's or a machine's boundary.
    pub fn stop_elsewhere(&self) -> String {
        match &self.host {
            Some(h) => format!(
                "stop it where it runs: `docker stop {h}` (a container's host name is its id, unless \
                 it was given another), or `crosstalk stop` inside it"
            ),
            None => "stop it where it runs (its container, or its machine), with `crosstalk stop` there".into(),
        }
    }
}

/// This process's PID namespace, where the system says (Linux).
fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

/// This machine's host name.
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer it is given.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_owned();
    (!name.is_empty()).then_some(name)
}

/// Who serves `dir`: the record in its pid file while that file is locked, else no one.
///
/// The relay rewrites its record once it knows its address ([`write_pid_file`]), and a read
/// at that moment can find the text half written: a locked file whose text does not parse is
/// read again, for up to 100 ms, before it is taken for a record this release cannot read.
pub fn served_by(dir: &Path) -> Result<Option<PidRecord>, Failure> {
    use std::io::{Read, Seek};
    let path = dir.join(super::PID_FILE);
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Failure(format!("cannot read {}: {e}", path.display()), 2)),
    };
    match file.try_lock_shared() {
        // Nobody holds it: no relay runs there now.
        Ok(()) => Ok(None),
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            for _ in 0..20 {
                text.clear();
                let read = file.rewind().and_then(|()| file.read_to_string(&mut text));
                if let Some(record) = read.ok().and_then(|_| PidRecord::parse(&text)) {
                    return Ok(Some(record));
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Ok(None)
        }
        Err(std::fs::TryLockError::Error(e)) => Err(Failure(format!("cannot check {}: {e}", path.display()), 2)),
    }
}

/// Replaces a pid file's text with `record`: written over the old text first and cut to its
/// length after, so the file is never empty while a relay holds it. (Cut first, a
/// `crosstalk status` reading at that moment found no record and said no relay used the
/// directory: seen once in the test command.)
pub fn write_pid_file(file: &mut std::fs::File, record: &PidRecord) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    let text = record.render();
    file.rewind()?;
    file.write_all(text.as_bytes())?;
    file.set_len(text.len() as u64)
}

/// The URL a client on this machine reaches a relay at that listens on `addr`: an unspecified
/// address (`0.0.0.0`, `::`) is reached on loopback.
pub fn local_url(addr: std::net::SocketAddr) -> String {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crosstalk status` finds the relay's record however often the relay rewrites it, the
    /// address added or not, while it holds the file.
    #[test]
    fn a_pid_file_being_rewritten_still_names_its_relay() {
        let dir = tempfile::tempdir().unwrap();
        let mut held = std::fs::File::create(dir.path().join(super::super::PID_FILE)).unwrap();
        held.lock().unwrap();
        let bare = PidRecord::here(None);
        write_pid_file(&mut held, &bare).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let with_url = PidRecord::here(Some("http://127.0.0.1:65000".into()));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    write_pid_file(&mut held, &with_url).unwrap();
                    write_pid_file(&mut held, &bare).unwrap();
                }
            })
        };
        for read in 0..2_000 {
            let found = served_by(dir.path()).unwrap();
            assert_eq!(found.map(|r| r.pid), Some(std::process::id()), "read {read}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
    }

    /// A held pid file caught between two writes (text that does not parse yet) is read
    /// again until its record is whole.
    #[test]
    fn a_held_pid_file_caught_half_written_is_read_again() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let mut held = std::fs::File::create(dir.path().join(super::super::PID_FILE)).unwrap();
        held.lock().unwrap();
        held.write_all(b"not a pid\n").unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            write_pid_file(&mut held, &PidRecord::here(None)).unwrap();
            held
        });
        let found = served_by(dir.path()).unwrap();
        let _held = writer.join().unwrap();
        assert_eq!(found.map(|r| r.pid), Some(std::process::id()));
    }

    #[test]
    fn a_pid_file_reads_back_and_an_old_one_is_a_pid_alone() {
        let r = PidRecord {
            pid: 42,
            url: Some("http://127.0.0.1:9000".into()),
            pid_ns: Some("pid:[4026531836]".into()),
            host: Some("3f2a9c1b7d0e".into()),
        };
        assert_eq!(PidRecord::parse(&r.render()), Some(r));
        let old = PidRecord::parse("1234\n").unwrap();
        assert_eq!((old.pid, &old.url, &old.pid_ns), (1234, &None, &None));
        assert!(old.reachable_here());
        assert_eq!(PidRecord::parse("not a pid\n"), None);
        assert_eq!(PidRecord::parse(""), None);
    }

    #[test]
    fn a_relay_in_another_container_is_not_reachable_here() {
        let here = PidRecord::here(None);
        assert!(here.reachable_here());
        assert_eq!(here.who(), format!("pid {}", std::process::id()));
        let other_ns = PidRecord {
            pid_ns: Some("pid:[1]".into()),
            ..here.clone()
        };
        assert!(!other_ns.reachable_here());
        let other_host = PidRecord {
            host: Some("3f2a9c1b7d0e".into()),
            ..here
        };
        assert!(!other_host.reachable_here());
        assert!(other_host.who().contains("another container"), "{}", other_host.who());
        assert!(other_host.stop_elsewhere().contains("docker stop 3f2a9c1b7d0e"));
    }

    #[test]
    fn an_unspecified_address_is_reached_on_loopback() {
        assert_eq!(local_url("0.0.0.0:8765".parse().unwrap()), "http://127.0.0.1:8765");
        assert_eq!(local_url("[::]:8765".parse().unwrap()), "http://[::1]:8765");
        assert_eq!(local_url("10.1.2.3:80".parse().unwrap()), "http://10.1.2.3:80");
    }
}
