//! This machine's name, as the run's files record it (owner, attempts, temporary names).

use std::sync::OnceLock;

/// This machine's name, read once a process: the owner asks it every poll (its snapshot, its
/// heartbeat), and a process keeps its host (and its UTS namespace) for its life.
pub fn name() -> String {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown".into())
    })
    .clone()
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`), read once a process (no process outlives
/// its boot); empty where there is none.
pub fn boot_id() -> String {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        })
        .clone()
}
