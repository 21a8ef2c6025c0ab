//! Loopback ports for servers the tests start.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A loopback port that is free now (nothing listens on it until a test starts something
/// there): the kernel's choice, for servers that bind what they are told at once.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A base port such that `base + o` is free now for every offset `o`: for a group of servers
/// (a NATS cluster, a relay cluster behind a load balancer) that bind ports they are told.
/// Two calls of one process never start from the same candidate: a port found free here is
/// bound only later, by the server started on it, so a second caller checking meanwhile would
/// pick it too and its servers would talk to the first caller's. Candidates lie below Linux's
/// ephemeral range (32768 up): a port found free there could be taken by any outgoing
/// connection before the server binds it.
pub fn free_base_port(offsets: &[u16]) -> u16 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let pid = u64::from(std::process::id());
    let first = CALLS.fetch_add(1, Ordering::Relaxed) * 200;
    for attempt in first..first + 200 {
        let base = 20_000 + ((pid * 7919 + attempt * 331) % 12_000) as u16;
        if offsets
            .iter()
            .all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok())
        {
            return base;
        }
    }
    panic!("no free ports for offsets {offsets:?}");
}

/// Waits until something listens on `port` of 127.0.0.1, for at most `within`.
pub fn wait_for_port(port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port} after {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_callers_get_different_ports_before_either_binds() {
        let offsets = [0, 1, 2, 100, 101, 102];
        let (a, b) = (free_base_port(&offsets), free_base_port(&offsets));
        let ports = |base: u16| offsets.map(|o| base + o);
        assert!(
            !ports(a).iter().any(|p| ports(b).contains(p)),
            "two callers share ports: {a} and {b}"
        );
    }
}
