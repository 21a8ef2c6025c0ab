//! Log lines that repeat while their cause lasts, at most one a second each: a full disk fails
//! every write, and logging each failure wrote thousands of lines a second, burying the first
//! one (the one that says why). The first occurrence is logged at once; the next one logged
//! says how many were left out in between.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Least time between two lines of one call site.
const EVERY: Duration = Duration::from_secs(1);

/// `tracing`'s `$level!` for a line that repeats while its cause lasts: at most once a second
/// for this call site, with a `left_out` field counting the lines left out since the last.
#[macro_export]
macro_rules! throttled {
    ($level:ident, $($arg:tt)+) => {{
        static LOG: $crate::throttle::Throttle = $crate::throttle::Throttle::new();
        if let Some(left_out) = LOG.admit() {
            tracing::$level!(left_out, $($arg)+);
        }
    }};
}

/// One call site's pace (what [`throttled!`] keeps for each).
pub struct Throttle {
    /// When a line was last let through, and how many were left out since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    pub const fn new() -> Throttle {
        Throttle {
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(left_out)` when this occurrence should be logged (with how many were left out
    /// since the last line), `None` when it should be left out.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock();
        match state.0 {
            Some(last) if now.duration_since(last) < EVERY => {
                state.1 += 1;
                None
            }
            _ => {
                let left_out = std::mem::take(&mut state.1);
                state.0 = Some(now);
                Some(left_out)
            }
        }
    }
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_second_and_a_count_of_the_rest() {
        let t = Throttle::new();
        let start = Instant::now();
        assert_eq!(t.admit_at(start), Some(0));
        for ms in [1, 10, 500, 999] {
            assert_eq!(t.admit_at(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(t.admit_at(start + Duration::from_millis(1000)), Some(4));
        assert_eq!(t.admit_at(start + Duration::from_millis(1500)), None);
        assert_eq!(t.admit_at(start + Duration::from_millis(3000)), Some(1));
        assert_eq!(t.admit_at(start + Duration::from_millis(5000)), Some(0));
    }
}
