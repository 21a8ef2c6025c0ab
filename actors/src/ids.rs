//! Event ids: unique across the relay and increasing, handed out by one counter that starts
//! above every id the store has ever handed out, so ids continue after a restart without reuse.

use std::sync::atomic::{AtomicU64, Ordering};

/// Hands out event ids. Channel actors take one per event they accept.
pub struct IdAllocator(AtomicU64);

impl IdAllocator {
    /// An allocator whose first id is `last + 1`.
    pub(crate) fn new(last: u64) -> Self {
        IdAllocator(AtomicU64::new(last))
    }

    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}
