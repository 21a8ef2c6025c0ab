//! Timestamps: microseconds since the Unix epoch in the log, RFC 3339 UTC on the wire.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, UTC. Stored as an integer so a record stays small.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
pub struct Timestamp(pub i64);

impl Timestamp {
    pub fn now() -> Self {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Timestamp(micros)
    }

    /// RFC 3339 in UTC with microseconds, e.g. `2026-11-29T17:51:58.123456Z`.
    pub fn to_rfc3339(self) -> String {
        let t = if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_micros(self.0 as u64)
        } else {
            UNIX_EPOCH
        };
        humantime::format_rfc3339_micros(t).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_with_zone() {
        assert_eq!(
            Timestamp(1_700_000_000_123_456).to_rfc3339(),
            "2023-11-14T22:13:20.123456Z"
        );
    }
}
