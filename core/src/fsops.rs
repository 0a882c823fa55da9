//! A count of the filesystem operations the owner makes on the files jobs write (listing,
//! stat, open and read, remove), for the rehearsal's "operations per poll" and for tests that
//! check the count grows with the open jobs, not with the batches of the run. On a shared
//! filesystem each of these is a round trip to the server; run.db's own I/O is not counted.

use std::sync::atomic::{AtomicU64, Ordering};

static OPERATIONS: AtomicU64 = AtomicU64::new(0);

/// Counts `n` operations.
pub fn count(n: u64) {
    OPERATIONS.fetch_add(n, Ordering::Relaxed);
}

/// Operations counted by this process so far.
pub fn total() -> u64 {
    OPERATIONS.load(Ordering::Relaxed)
}
