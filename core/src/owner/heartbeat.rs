//! `owner-heartbeat.json`: proof that a process of the owner host holds run.db.
//!
//! Every process that opens run.db on the owner keeps one thread that rewrites the file every
//! [`HEARTBEAT_INTERVAL`] for as long as the process lives — the submit loop for a week, an
//! upload for hours, `status` for a moment. `take-over` on another host refuses until it is
//! stale, so a run is never moved from under a live process.

use super::{unix_now, Host, Result};
use crate::atomic;
use crate::RunLayout;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// How often an owner process rewrites the heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub host: Host,
    pub pid: u32,
    pub unix_s: f64,
}

impl Heartbeat {
    /// Seconds since it was written, by this host's clock (negative when the clocks differ).
    pub fn age_s(&self) -> f64 {
        unix_now() - self.unix_s
    }
}

/// The run's last heartbeat, `None` when no owner process ever wrote one.
pub fn read_heartbeat(dir: &Path) -> Result<Option<Heartbeat>> {
    // A heartbeat cut short or garbled is no heartbeat: `take-over` then waits for nothing.
    let bytes = super::read_if_present(&RunLayout::new(dir).heartbeat_file())?;
    Ok(bytes.and_then(|b| serde_json::from_slice(&b).ok()))
}

/// Writes the heartbeat now and keeps rewriting it from a thread of this process, once per run
/// directory. The thread ends when the run is no longer this host's (taken over) or its
/// directory is gone.
pub fn keep_heartbeat(dir: &Path) {
    static BEATING: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    {
        let mut beating = BEATING.lock().unwrap_or_else(|e| e.into_inner());
        if !beating.get_or_insert_with(HashSet::new).insert(dir.clone()) {
            return;
        }
    }
    if beat(&dir).is_err() {
        // Not fatal to the command: `take-over` errs on the safe side without one.
        tracing::warn!(
            "could not write {}",
            RunLayout::new(&dir).heartbeat_file().display()
        );
    }
    let spawned = std::thread::Builder::new()
        .name("owner-heartbeat".into())
        .spawn(move || loop {
            std::thread::sleep(HEARTBEAT_INTERVAL);
            if !super::still_owner(&dir).unwrap_or(true) || beat(&dir).is_err() {
                if let Ok(mut beating) = BEATING.lock() {
                    beating.get_or_insert_with(HashSet::new).remove(&dir);
                }
                return;
            }
        });
    if spawned.is_err() {
        tracing::warn!("could not start the owner heartbeat thread");
    }
}

fn beat(dir: &Path) -> io::Result<()> {
    if !dir.is_dir() {
        return Err(io::ErrorKind::NotFound.into());
    }
    let beat = Heartbeat {
        host: Host::this(),
        pid: std::process::id(),
        unix_s: unix_now(),
    };
    let bytes = serde_json::to_vec(&beat).expect("a heartbeat serialises");
    atomic::write(&RunLayout::new(dir).heartbeat_file(), &bytes)
}
