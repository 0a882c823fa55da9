//! `status-snapshot.json`: the run's status as its owner last saw it, for every other host.
//!
//! The submit loop rewrites it at each poll and `status` on the owner at each call, atomically,
//! so `status` on another login node or a compute node reads a whole one without opening run.db.

use crate::owner::{unix_now, Host, Result};
use crate::rundb::RunStatus;
use crate::RunLayout;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The snapshot format this embedfleet writes and reads.
pub const SNAPSHOT_FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusSnapshot {
    pub format: u32,
    pub written_unix_s: f64,
    /// The owner host that wrote it.
    pub host: Host,
    /// The submit loop, when one has run: whether it is polling, and since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_loop: Option<LoopState>,
    pub status: RunStatus,
}

/// The submit loop as the snapshot records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    pub pid: u32,
    pub started_unix_s: f64,
    pub poll_interval_s: f64,
    pub last_poll_unix_s: f64,
    /// Set when the loop ended by itself (every batch settled) or by an error it reported; a
    /// loop that was killed leaves it unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_unix_s: Option<f64>,
    /// Polls this loop made, and its own cost over them: its CPU time (user + system) and its
    /// operations on the files jobs write (`crate::fsops`). Per poll, they should follow the
    /// open jobs, not the batches of the run.
    #[serde(default)]
    pub polls: u64,
    #[serde(default)]
    pub cpu_s: f64,
    #[serde(default)]
    pub result_file_ops: u64,
    /// The part of `cpu_s` spent taking in the results jobs wrote (manifests, shard checks,
    /// run.db), and the results it accepted: that work is per new result, the rest of a poll
    /// per open job.
    #[serde(default)]
    pub ingest_cpu_s: f64,
    #[serde(default)]
    pub taken_in: u64,
    /// `cpu_s` by part of the round: `poll` (the scheduler's listing and the ingest of the
    /// jobs it found ended, `ingest_cpu_s` included), `submit` (the round's submissions), and
    /// `progress` (status, console, this snapshot and the report).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cpu_by_part_s: BTreeMap<String, f64>,
    /// Rounds in which nothing arrived (no result taken in, no job found ended, nothing
    /// submitted), and the CPU they took (all parts): what a poll costs whatever arrives, the
    /// part that must not grow with the run.
    #[serde(default)]
    pub quiet_polls: u64,
    #[serde(default)]
    pub quiet_cpu_s: f64,
    /// How the loop routes batches to queues, and what it has learned of each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingState>,
    /// Queues the breaker set aside (their jobs failed alike while the other queues' did not),
    /// with why; `embedfleet resume` brings them back.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set_aside: BTreeMap<String, String>,
}

/// The submit loop's routing as of its last round (`submit --route`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoutingState {
    /// `adaptive` or `static`.
    pub route: String,
    /// Whether the tail gets speculative twins.
    pub speculate: bool,
    /// Where the next batch goes and why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    pub queues: Vec<QueueOutlook>,
    /// Speculative twins this loop submitted, and queued jobs it moved to another queue.
    #[serde(default)]
    pub twins: u64,
    #[serde(default)]
    pub moves: u64,
    /// Node-hours run by jobs cancelled because their batch's twin finished first.
    #[serde(default)]
    pub twin_node_hours: f64,
    /// Node-hours run by moved jobs that had started before their cancel took effect.
    #[serde(default)]
    pub move_node_hours: f64,
    /// The most jobs the run holds over all its queues (`--max-jobs`, or the scheduler's own
    /// limit where lower), and the scheduler's limit in words where it states one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_limit: Option<String>,
}

/// What one queue looks like to the router: learned from the run's own jobs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueOutlook {
    pub queue: String,
    /// `new` (no job of it started yet: its start is guessed), `stopped` (its queued jobs
    /// overdue), `ok`, `unusable` (refused, cooling off after a failed submission, or cap 0).
    pub state: String,
    /// Learned submit-to-start, seconds (none until a job of it started).
    pub start_delay_s: Option<f64>,
    /// The longest any of its queued jobs has waited so far.
    pub longest_wait_s: f64,
    /// The start a new job is expected to wait: the learned delay, or longer when its queued
    /// jobs have already waited longer (a `new` queue: the longest wait, or the scheduler's
    /// estimate for a job sent now when later). Always set by the router since 2026-12-05;
    /// optional for snapshots written before.
    pub expected_start_s: Option<f64>,
    /// Learned start-to-end of a job that ran to its end.
    pub run_time_s: Option<f64>,
    /// Share of its recent jobs preempted, killed at walltime or failed (0 to 1).
    pub loss_share: f64,
    /// How far the scheduler's start estimates of its jobs were off, seconds (none until one
    /// could be checked against a start).
    #[serde(default)]
    pub estimate_error_s: Option<f64>,
    /// The scheduler's own estimate of how long a job sent there now would wait to start
    /// (`sbatch --test-only`), seconds; blended into `expected_start_s`.
    #[serde(default)]
    pub scheduler_start_s: Option<f64>,
    /// Seconds from sending a job there to its batch's end, rework of losses counted.
    pub expected_finish_s: Option<f64>,
    pub jobs_started: u64,
    pub finished: u64,
    pub preempted: u64,
    pub walltime: u64,
    pub failed: u64,
    /// Why an `unusable` queue is so: refused (and why), cooling off after failed submissions
    /// or an unanswered check, or cap 0 (absent otherwise, and in older snapshots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable_why: Option<String>,
}

impl LoopState {
    /// On the host the loop ran on: whether its process still runs (the same pid, started no
    /// later than the loop: a pid reused since belongs to a process started after it).
    pub fn process_runs_here(&self) -> bool {
        crate::process::started_unix_s(self.pid).is_some_and(|s| s <= self.started_unix_s + 2.0)
    }

    /// Whether the loop should still be polling: not ended, and its last poll less than a few
    /// poll intervals ago.
    pub fn is_polling(&self, now_unix_s: f64) -> bool {
        self.ended_unix_s.is_none()
            && now_unix_s - self.last_poll_unix_s < 3.0 * self.poll_interval_s + 60.0
    }
}

impl StatusSnapshot {
    /// Seconds since the owner wrote it.
    pub fn age_s(&self) -> f64 {
        unix_now() - self.written_unix_s
    }
}

/// The last snapshot, `None` when the owner never wrote one.
pub fn read_snapshot(dir: &Path) -> Result<Option<StatusSnapshot>> {
    crate::owner::read_json(RunLayout::new(dir).status_snapshot_file())
}

/// Writes the snapshot of `status`. `submit_loop: None` (a `status` command) keeps the loop
/// state of the snapshot before, so a look at the run does not hide a running loop.
pub fn write_snapshot(
    dir: &Path,
    status: &RunStatus,
    submit_loop: Option<LoopState>,
) -> Result<StatusSnapshot> {
    let submit_loop = match submit_loop {
        Some(state) => Some(state),
        None => read_snapshot(dir)
            .ok()
            .flatten()
            .and_then(|s| s.submit_loop),
    };
    let snapshot = StatusSnapshot {
        format: SNAPSHOT_FORMAT,
        written_unix_s: unix_now(),
        host: Host::this(),
        submit_loop,
        status: status.clone(),
    };
    crate::owner::write_json(RunLayout::new(dir).status_snapshot_file(), &snapshot)?;
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::unix_now;
    use crate::rundb::RunDb;

    #[test]
    fn a_status_call_keeps_the_loop_state_of_the_snapshot_before() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        let status = db.status().unwrap();
        let state = LoopState {
            pid: 42,
            started_unix_s: unix_now() - 100.0,
            poll_interval_s: 30.0,
            last_poll_unix_s: unix_now() - 5.0,
            ended_unix_s: None,
            polls: 3,
            cpu_s: 0.5,
            result_file_ops: 12,
            ingest_cpu_s: 0.0,
            taken_in: 0,
            cpu_by_part_s: Default::default(),
            quiet_polls: 0,
            quiet_cpu_s: 0.0,
            routing: None,
            set_aside: Default::default(),
        };
        write_snapshot(dir.path(), &status, Some(state.clone())).unwrap();
        write_snapshot(dir.path(), &status, None).unwrap();
        let read = read_snapshot(dir.path()).unwrap().unwrap();
        // (JSON keeps f64 to about 1e-7 s here: compare the pid and the times to the millisecond.)
        let kept = read.submit_loop.clone().expect("the loop state is kept");
        assert_eq!(kept.pid, 42);
        assert!((kept.last_poll_unix_s - state.last_poll_unix_s).abs() < 1e-3);
        assert!(kept.is_polling(unix_now()));
        assert_eq!(read.status, status);
        assert!(!state.is_polling(unix_now() + 3600.0));
    }
}
