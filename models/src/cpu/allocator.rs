//! The CPU forward allocates a fresh buffer for every op's output (candle's tensors), tens of
//! megabytes for a mini-batch's activations. glibc's malloc serves the large ones with `mmap`
//! and gives freed memory back at once, so every forward faults in and zeroes the same pages
//! again: 12 % of a BERT-base forward's time on the 2-core machine of BENCHMARKS.md was the
//! kernel's page faults. [`keep_freed_memory`] tells malloc to keep them.

/// Keeps freed memory in the process for the next forward (glibc: buffers up to 32 MiB from
/// the heap rather than `mmap`, the heap grown 1 GiB of address space at a time and never
/// trimmed). The process's resident size then stays at its peak rather than shrinking between
/// forwards, which an embed job's does anyway. Once per process; nothing on another libc.
pub fn keep_freed_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only sets allocator parameters; it is called once, before the
        // forwards allocate.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TOP_PAD, 1 << 30);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        }
    });
}
