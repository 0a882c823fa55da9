//! What the submit loop does as the run's owner, beside submitting: it keeps the status snapshot
//! that every other host reads (`status` there, `take-over`), it notices stalled jobs, and it
//! makes sure it is the run's one loop — one per run on the owner host (a lock file), and none
//! at all once the run was taken over to another host.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use embedfleet_core::owner::{self, describe_age};
use embedfleet_core::rundb::{LiveAttempt, RunDb, RunStatus};
use embedfleet_core::status_snapshot::{self as snapshot, LoopState};

use super::error::{Result, SubmitError};
use crate::report::owner::OwnerReport;

/// The file a running loop holds locked (`flock`): a second loop on the owner host refuses.
pub const LOOP_LOCK_FILE: &str = "submit.lock";

pub(super) struct OwnerWatch {
    run_dir: PathBuf,
    state: LoopState,
    /// Held for the loop's life; the kernel releases it when the process dies, however.
    _lock: File,
    /// The status last written, for the final snapshot.
    last_status: Option<RunStatus>,
    /// Attempts already reported stalled (each is reported once).
    stalled_seen: HashSet<String>,
    /// Why this start is a restart (the previous loop was killed, the host rebooted), if it is.
    pub restart: Option<String>,
    /// This process's CPU time and file operations when the loop started.
    cpu_at_start: std::time::Duration,
    ops_at_start: u64,
    /// `report.html` and `metrics.prom` beside run.db (none with `EMBEDFLEET_REPORT_EVERY_S=0`).
    pub report: Option<OwnerReport>,
    /// The last snapshot could not be written: said once, until one is written again (a full
    /// disk fails every poll's).
    unwritten: std::cell::Cell<bool>,
}

impl OwnerWatch {
    pub fn start(run_dir: &Path, poll_interval_s: f64, rebooted: Option<&str>) -> Result<Self> {
        let lock = lock_loop(run_dir)?;
        let now = owner::unix_now();
        let previous = snapshot::read_snapshot(run_dir)
            .ok()
            .flatten()
            .and_then(|s| s.submit_loop);
        let restart = match (rebooted, previous) {
            (Some(host), _) => Some(format!(
                "{host} rebooted; the submit loop starts again and adopts the jobs still queued"
            )),
            (None, Some(prev)) if prev.ended_unix_s.is_none() => Some(format!(
                "the previous submit loop (pid {}) stopped without ending, {} after its last poll; \
                 this one adopts its jobs",
                prev.pid,
                describe_age(now - prev.last_poll_unix_s)
            )),
            _ => None,
        };
        Ok(Self {
            run_dir: run_dir.into(),
            state: LoopState {
                pid: std::process::id(),
                started_unix_s: now,
                poll_interval_s,
                last_poll_unix_s: now,
                ended_unix_s: None,
                polls: 0,
                cpu_s: 0.0,
                result_file_ops: 0,
                ingest_cpu_s: 0.0,
                taken_in: 0,
                cpu_by_part_s: Default::default(),
                quiet_polls: 0,
                quiet_cpu_s: 0.0,
                routing: None,
                set_aside: Default::default(),
            },
            cpu_at_start: embedfleet_core::process::own_cpu(),
            ops_at_start: embedfleet_core::fsops::total(),
            _lock: lock,
            last_status: None,
            stalled_seen: HashSet::new(),
            restart,
            report: OwnerReport::from_env(run_dir),
            unwritten: std::cell::Cell::new(false),
        })
    }

    /// An ingest took `cpu` and accepted `accepted` results (the snapshot's `ingest_cpu_s`,
    /// `taken_in`).
    pub fn took_in(&mut self, cpu: std::time::Duration, accepted: usize) {
        self.state.ingest_cpu_s += cpu.as_secs_f64();
        self.state.taken_in += accepted as u64;
    }

    /// A part of a round took `cpu` (the snapshot's `cpu_by_part_s`).
    pub fn spent(&mut self, part: &str, cpu: std::time::Duration) {
        *self.state.cpu_by_part_s.entry(part.into()).or_default() += cpu.as_secs_f64();
    }

    /// A round in which nothing arrived (no result taken in, no job ended, nothing submitted)
    /// took `cpu` (the snapshot's `quiet_polls`, `quiet_cpu_s`).
    pub fn quiet_round(&mut self, cpu: std::time::Duration) {
        self.state.quiet_polls += 1;
        self.state.quiet_cpu_s += cpu.as_secs_f64();
    }

    /// The queues set aside by the breaker, as the next snapshot shows them.
    pub fn set_set_aside(&mut self, set_aside: std::collections::BTreeMap<String, String>) {
        self.state.set_aside = set_aside;
    }

    /// The routing the next snapshot shows.
    pub fn set_routing(&mut self, routing: embedfleet_core::status_snapshot::RoutingState) {
        self.state.routing = Some(routing);
    }

    /// After each poll: stops when the run is no longer this host's, and writes the snapshot
    /// (and the report's files).
    pub fn polled(&mut self, db: &RunDb, status: &RunStatus) -> Result<()> {
        if !owner::still_owner(&self.run_dir)? {
            return Err(SubmitError::NotOwner(self.run_dir.clone()));
        }
        self.state.last_poll_unix_s = owner::unix_now();
        self.state.polls += 1;
        self.state.cpu_s = embedfleet_core::process::own_cpu()
            .saturating_sub(self.cpu_at_start)
            .as_secs_f64();
        self.state.result_file_ops = embedfleet_core::fsops::total() - self.ops_at_start;
        self.last_status = Some(status.clone());
        self.write();
        if let Some(report) = &mut self.report {
            // A report not refreshed this poll is a poll older; it does not stop the run.
            if let Err(e) = report.polled(db, status, &self.state) {
                tracing::warn!("report not refreshed: {e}");
            }
        }
        Ok(())
    }

    /// Serves the run's metrics at `addr` (`--metrics-listen`) for the loop's life; returns the
    /// address bound. The metrics come from the owner's report, kept for them (with its files)
    /// even where `EMBEDFLEET_REPORT_EVERY_S=0` turned it off.
    pub fn listen(&mut self, addr: std::net::SocketAddr) -> Result<std::net::SocketAddr> {
        let report = self.report.get_or_insert_with(|| {
            OwnerReport::new(
                &self.run_dir,
                std::time::Duration::from_secs_f64(crate::report::owner::DEFAULT_REPORT_EVERY_S),
            )
        });
        crate::report::listen::serve(addr, report.metrics.clone()).map_err(|source| {
            SubmitError::Io {
                action: "listen for metrics scrapes on",
                path: PathBuf::from(addr.to_string()),
                cause: source,
            }
        })
    }

    /// At the loop's orderly end: the report takes in the last attempts (its files are written
    /// once more when the watch is dropped).
    pub fn last_poll(&mut self, db: &RunDb) {
        if let Some(report) = &mut self.report {
            if let Err(e) = report.refresh(db) {
                tracing::warn!("report not refreshed: {e}");
            }
        }
    }

    /// The stalled attempts not reported before.
    pub fn newly_stalled<'s>(&mut self, status: &'s RunStatus) -> Vec<&'s LiveAttempt> {
        status
            .live
            .iter()
            .filter(|a| a.stalled && self.stalled_seen.insert(a.attempt.clone()))
            .collect()
    }

    fn write(&self) {
        let Some(status) = &self.last_status else {
            return;
        };
        // A snapshot that cannot be written this poll (a full quota, a read-only mount) is
        // stale for a poll; it does not stop the run.
        match snapshot::write_snapshot(&self.run_dir, status, Some(self.state.clone())) {
            Ok(_) if self.unwritten.replace(false) => {
                tracing::warn!("status snapshot written again")
            }
            Ok(_) => {}
            Err(e) if !self.unwritten.replace(true) => {
                tracing::warn!("status snapshot not written (said once until it is again): {e}")
            }
            Err(_) => {}
        }
    }
}

impl Drop for OwnerWatch {
    /// Any orderly end (done, an error it reports, a panic) marks the loop ended; only a kill
    /// leaves it polling in the snapshot, which the next loop reports as a restart.
    fn drop(&mut self) {
        self.state.ended_unix_s = Some(owner::unix_now());
        self.write();
        if let (Some(report), Some(status)) = (&mut self.report, &self.last_status) {
            report.finish(status, &self.state);
        }
    }
}

/// Locks the run's loop lock file, saying which process holds it when another does.
fn lock_loop(run_dir: &Path) -> Result<File> {
    let path = run_dir.join(LOOP_LOCK_FILE);
    let io = |action: &'static str, source| SubmitError::Io {
        action,
        path: path.clone(),
        cause: source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io("open", e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            return Err(SubmitError::LoopRunning {
                run_dir: run_dir.into(),
                pid: pid.trim().to_string(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", e)),
    }
    file.set_len(0).map_err(|e| io("write", e))?;
    file.rewind().map_err(|e| io("write", e))?;
    write!(file, "{}", std::process::id()).map_err(|e| io("write", e))?;
    Ok(file)
}
