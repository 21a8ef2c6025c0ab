//! What crosstalk's tests and its benchmark share to run servers on loopback: a free port (or a
//! free run of ports), and nats-server, alone or as a three-server JetStream cluster. The
//! actors' seam suite, the relay-cluster suite (`tests/nats/`), the cluster example's test and
//! the benchmark's cluster workload all start nats-server from here.
//!
//! nats-server is not part of the Rust toolchain. [`nats::server`] finds it (`$NATS_SERVER`,
//! or the copy `scripts/test` installs), and a test that needs it and finds none calls
//! [`nats::or_skip`], which prints one line saying what to install and returns, so that a plain
//! `cargo test --workspace` on a fresh clone passes.

pub mod nats;
pub mod ports;

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// A tool `scripts/test` installs under `.venv-test/`, if it is there.
pub fn installed(relative: &str) -> Option<PathBuf> {
    let p = root().join(".venv-test").join(relative);
    p.exists().then_some(p)
}

/// Prints the one line a test that cannot run here leaves, saying what it needs. Written to
/// stderr itself, not through `eprintln!`, which the test harness keeps to itself for a test
/// that passes.
pub fn skipped(test: &str, needs: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {test} needs {needs}");
}

/// nginx, for the cluster example's load balancer: `$NGINX_BIN`, else Debian's package as
/// `scripts/test` unpacks it (`.venv-test/nginx/`).
pub fn nginx() -> Option<PathBuf> {
    match std::env::var_os("NGINX_BIN") {
        Some(p) => Some(p.into()),
        None => installed("nginx/usr/sbin/nginx"),
    }
}
