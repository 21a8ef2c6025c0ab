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

    /// Milliseconds since the epoch, as records that need no finer time keep it.
    pub fn from_millis(ms: i64) -> Self {
        Timestamp(ms.saturating_mul(1_000))
    }

    pub fn millis(self) -> i64 {
        self.0 / 1_000
    }

    /// An RFC 3339 time (`2026-12-01T09:00:00Z`, with or without a fraction), as the wire
    /// writes them; `None` if it is not one.
    pub fn parse_rfc3339(text: &str) -> Option<Self> {
        let t = humantime::parse_rfc3339_weak(text.trim()).ok()?;
        let d = t.duration_since(UNIX_EPOCH).ok()?;
        Some(Timestamp(d.as_micros() as i64))
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

    #[test]
    fn parses_what_it_formats_and_milliseconds_round_trip() {
        let t = Timestamp(1_700_000_000_123_456);
        assert_eq!(Timestamp::parse_rfc3339(&t.to_rfc3339()), Some(t));
        assert_eq!(
            Timestamp::parse_rfc3339("2023-11-14T22:13:20Z"),
            Some(Timestamp(1_700_000_000_000_000))
        );
        assert_eq!(Timestamp::parse_rfc3339("yesterday"), None);
        assert_eq!(Timestamp::from_millis(t.millis()), Timestamp(1_700_000_000_123_000));
    }
}
