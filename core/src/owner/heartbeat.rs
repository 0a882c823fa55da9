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
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often an owner process rewrites the heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// Seconds between heartbeats instead of [`HEARTBEAT_INTERVAL`] (tests).
pub const HEARTBEAT_INTERVAL_ENV: &str = "EMBEDFLEET_HEARTBEAT_INTERVAL_S";

/// The interval of this process's heartbeats.
pub fn heartbeat_interval() -> Duration {
    std::env::var(HEARTBEAT_INTERVAL_ENV)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(HEARTBEAT_INTERVAL)
}

/// How long an owner process goes on writing run.db with no heartbeat written: two beats missed
/// and a third of one (70 s). `take-over` waits `--stale-after` (300 s) of silence, so a process
/// that cannot beat has stopped writing long before another host may take the run.
pub fn write_grace() -> Duration {
    heartbeat_interval() * 7 / 3
}

/// What this process's heartbeat thread for one run directory has managed.
#[derive(Debug)]
struct Beating {
    /// When a heartbeat was last written (unix seconds).
    last_ok_unix_s: f64,
    /// Why the last try failed, while they fail.
    failing: Option<String>,
    /// The run was taken over by another host: this process writes nothing more to it.
    taken_over: bool,
}

type BeatingDirs = HashMap<PathBuf, Arc<Mutex<Beating>>>;

static BEATING: Mutex<Option<BeatingDirs>> = Mutex::new(None);

fn beating_of(dir: &Path) -> Option<Arc<Mutex<Beating>>> {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let beating = BEATING.lock().unwrap_or_else(|e| e.into_inner());
    beating.as_ref()?.get(&dir).cloned()
}

/// Why this process must not write `dir`'s run.db now, if it must not: its heartbeat has not
/// been written for longer than [`write_grace`] (another host may soon take the run over), or
/// the run was taken over. Nothing when this process keeps no heartbeat for `dir` (a
/// read-only look). Checked at every commit to run.db (`RunDb`'s commit hook), in memory.
pub fn why_not_writing(dir: &Path) -> Option<String> {
    let beating = beating_of(dir)?;
    let b = beating.lock().unwrap_or_else(|e| e.into_inner());
    if b.taken_over {
        return Some(
            "the run was taken over by another host (owner.json): this process writes no more \
             to its run.db"
                .into(),
        );
    }
    let silent = unix_now() - b.last_ok_unix_s;
    if silent > write_grace().as_secs_f64() {
        let path = RunLayout::new(dir).heartbeat_file();
        return Some(format!(
            "this process has not written its heartbeat ({}) for {silent:.0} s ({}), so another \
             host could take the run over: it writes no more to run.db. Fix what keeps it from \
             writing there (quota, permissions, the filesystem), then run the command again",
            path.display(),
            b.failing.as_deref().unwrap_or("no error seen")
        ));
    }
    None
}

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

/// The run's last heartbeat for `take-over`: a garbled one is an error (a process of the owner
/// `owner` may be rewriting it), not "none".
pub(super) fn read_strict(dir: &Path, owner: &str) -> Result<Option<Heartbeat>> {
    let path = RunLayout::new(dir).heartbeat_file();
    let Some(bytes) = super::read_if_present(&path)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| super::OwnerError::GarbledHeartbeat {
            path,
            owner: owner.into(),
            cause: source,
        })
}

/// Waits up to `stale_after` for a heartbeat to appear where there is none, saying so first:
/// the one that appears, or `None` after that long without one.
pub(super) fn wait_for_one(
    dir: &Path,
    owner: &str,
    stale_after: Duration,
) -> Result<Option<Heartbeat>> {
    tracing::warn!(
        "{} has no heartbeat from {owner}: waiting {:.0} s for one to appear before taking the \
         run over",
        dir.display(),
        stale_after.as_secs_f64()
    );
    let end = std::time::Instant::now() + stale_after;
    let step = (stale_after / 20).clamp(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        if let Some(beat) = read_strict(dir, owner)? {
            return Ok(Some(beat));
        }
        let now = std::time::Instant::now();
        if now >= end {
            return Ok(None);
        }
        std::thread::sleep(step.min(end - now));
    }
}

/// Writes the heartbeat now and keeps rewriting it from a thread of this process, once per run
/// directory, for as long as the process lives: a failed write (quota, a stale NFS handle,
/// `EIO`) is retried every few seconds and said once, never the end of the thread — a process
/// whose heartbeat stopped for good would look gone to `take-over` while it still writes. Past
/// [`write_grace`] without one, the process stops writing run.db ([`why_not_writing`]). The
/// thread ends only when the run is taken over by another host.
pub fn keep_heartbeat(dir: &Path) {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let state = {
        let mut beating = BEATING.lock().unwrap_or_else(|e| e.into_inner());
        let dirs = beating.get_or_insert_with(HashMap::new);
        if dirs.contains_key(&dir) {
            return;
        }
        let state = Arc::new(Mutex::new(Beating {
            // The grace runs from the start: a process that never beats stops writing too.
            last_ok_unix_s: unix_now(),
            failing: None,
            taken_over: false,
        }));
        dirs.insert(dir.clone(), state.clone());
        state
    };
    beat_once(&dir, &state);
    let spawned = std::thread::Builder::new()
        .name("owner-heartbeat".into())
        .spawn(move || loop {
            let failing = state.lock().map(|b| b.failing.is_some()).unwrap_or(false);
            let interval = heartbeat_interval();
            // Retried sooner while it fails: the grace is two intervals.
            std::thread::sleep(if failing { interval / 6 } else { interval });
            if !beat_once(&dir, &state) {
                return;
            }
        });
    if spawned.is_err() {
        tracing::warn!("could not start the owner heartbeat thread");
    }
}

/// One heartbeat, its outcome recorded in `state`; false once the run is no longer this host's.
fn beat_once(dir: &Path, state: &Mutex<Beating>) -> bool {
    let taken = |state: &Mutex<Beating>| {
        state.lock().unwrap_or_else(|e| e.into_inner()).taken_over = true;
        false
    };
    // An unreadable owner.json is not a take-over: the beat below says whether files can be
    // written at all.
    if !super::still_owner(dir).unwrap_or(true) {
        return taken(state);
    }
    let result = beat(dir);
    let mut b = state.lock().unwrap_or_else(|e| e.into_inner());
    match result {
        Ok(()) => {
            if let Some(error) = b.failing.take() {
                let silent = unix_now() - b.last_ok_unix_s;
                tracing::warn!("heartbeat written again after {silent:.0} s without ({error})");
                drop(b);
                // Taken over while it could not beat? Then this beat was not ours to write.
                if !super::still_owner(dir).unwrap_or(true) {
                    return taken(state);
                }
                b = state.lock().unwrap_or_else(|e| e.into_inner());
            }
            b.last_ok_unix_s = unix_now();
        }
        Err(e) => {
            if b.failing.is_none() {
                tracing::warn!(
                    "could not write the heartbeat {} ({e}); retrying. After {:.0} s without \
                     one this process stops writing run.db",
                    RunLayout::new(dir).heartbeat_file().display(),
                    write_grace().as_secs_f64()
                );
            }
            b.failing = Some(e.to_string());
        }
    }
    true
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
