/*!
Job identifiers and the backend-neutral job state.

Every backend maps its own state names (Slurm's `COMPLETED`, PBS's `F` plus `Exit_status`, a
local child's wait status) onto [`JobState`], so the submit loop decides retries on typed
variants and never on scheduler text.
*/

use std::fmt;
use std::path::{Path, PathBuf};

use embedfleet_core::state::JobStatus;
use serde::{Deserialize, Serialize};

/// The id a scheduler gave a job (`sbatch --parsable` output, `qsub` output, a local pid).
///
/// Kept as text: PBS ids carry the server name (`1234.polaris-pbs-01...`), Slurm array tasks
/// look like `12_3`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchedulerJobId(String);

impl SchedulerJobId {
    /// Wraps a scheduler's id as is.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as the scheduler prints it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SchedulerJobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`Scheduler::poll`](super::Scheduler::poll) needs to know about a job.
///
/// The marker is the file the job script writes its exit code to when it ends (see
/// [`ScriptJob::marker`](super::ScriptJob)); it decides the final state of a job that the
/// scheduler has already forgotten (no `sacct`, purged from `squeue`) or that a restarted
/// submit loop adopted.
///
/// The name is what the job was submitted under. The local backend needs it to tell a job it
/// did not start from an unrelated process that was given the same pid (after a reboot, or
/// once pids wrap around): without it, such a job is never taken for running nor signalled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobHandle {
    /// The scheduler's id.
    pub id: SchedulerJobId,
    /// Completion marker written by the job script, if the script writes one.
    pub marker: Option<PathBuf>,
    /// The name the job was submitted under, when known.
    pub name: Option<String>,
}

impl JobHandle {
    /// A handle without a completion marker or a name.
    pub fn new(id: SchedulerJobId) -> Self {
        Self {
            id,
            marker: None,
            name: None,
        }
    }

    /// Sets the name the job was submitted under.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the completion marker path.
    pub fn with_marker(mut self, marker: impl Into<PathBuf>) -> Self {
        self.marker = Some(marker.into());
        self
    }
}

/// The state of one job, the same for every backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Queued, held, or waiting to be requeued.
    Pending,
    /// Running (or completing, suspended, staging out).
    Running,
    /// Ended with exit code 0.
    Completed,
    /// Ended with a non-zero exit code, a signal, or a scheduler error.
    Failed {
        /// The job script's exit code when the scheduler reported one.
        exit_code: Option<i32>,
        /// Why, in words (`exit code 3`, `killed by signal 9`, the scheduler's reason).
        reason: String,
    },
    /// Cancelled (`scancel`, `qdel`, [`Scheduler::cancel`](super::Scheduler::cancel)).
    Cancelled,
    /// Killed at its walltime limit.
    Timeout,
    /// Its node failed (or did not boot); the job itself may be fine.
    NodeFail,
    /// Killed for exceeding its memory limit.
    OutOfMemory,
    /// Preempted by a higher-priority job (e.g. Polaris's `preemptable` queue).
    Preempted,
    /// The scheduler does not know the job and it left no completion marker: it was purged
    /// from the scheduler's memory, or it never started. Not a final state by itself; the
    /// caller decides how long to wait before treating the job as lost.
    Unknown,
}

impl JobState {
    /// True for states after which the job will never run again by itself.
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Self::Pending | Self::Running | Self::Unknown)
    }

    /// True while the job counts against a queue's cap (queued or running).
    pub fn is_active(&self) -> bool {
        matches!(self, Self::Pending | Self::Running)
    }

    /// The state run.db records for a job in this state.
    pub fn status(&self) -> JobStatus {
        match self {
            Self::Pending => JobStatus::Pending,
            Self::Running => JobStatus::Running,
            Self::Completed => JobStatus::Completed,
            Self::Failed { .. } => JobStatus::Failed,
            Self::Cancelled => JobStatus::Cancelled,
            Self::Timeout => JobStatus::Timeout,
            Self::NodeFail => JobStatus::NodeFail,
            Self::OutOfMemory => JobStatus::OutOfMemory,
            Self::Preempted => JobStatus::Preempted,
            Self::Unknown => JobStatus::Unknown,
        }
    }

    /// A stable lowercase name, the one run.db stores.
    pub fn name(&self) -> &'static str {
        self.status().as_str()
    }

    /// The state a finished job's exit code implies.
    pub fn from_exit_code(code: i32) -> Self {
        if code == 0 {
            Self::Completed
        } else {
            Self::Failed {
                exit_code: Some(code),
                reason: format!("exit code {code}"),
            }
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { reason, .. } => write!(f, "failed ({reason})"),
            other => f.write_str(other.name()),
        }
    }
}

/// One of the current user's jobs that a scheduler still holds (see
/// [`Scheduler::list_jobs`](super::Scheduler::list_jobs)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedJob {
    /// The scheduler's id.
    pub id: SchedulerJobId,
    /// The job name given at submission.
    pub name: String,
    /// The queue or partition it is in.
    pub queue: String,
    /// Its state.
    pub state: JobState,
}

/// The final state a completion marker records, if the marker exists and holds an exit code.
///
/// The job script writes the marker under a temporary name and renames it, so a marker that
/// exists is complete; one whose content is not a number counts as a failure.
pub fn marker_state(marker: &Path) -> Option<JobState> {
    let text = std::fs::read_to_string(marker).ok()?;
    Some(match text.trim().parse::<i32>() {
        Ok(code) => JobState::from_exit_code(code),
        Err(_) => JobState::Failed {
            exit_code: None,
            reason: format!(
                "completion marker {} holds {:?}",
                marker.display(),
                text.trim()
            ),
        },
    })
}

/// Marker state for a handle, or `fallback`.
pub(super) fn marker_or(handle: &JobHandle, fallback: JobState) -> JobState {
    handle
        .marker
        .as_deref()
        .and_then(marker_state)
        .unwrap_or(fallback)
}

/// A wall-clock time of this host's zone, as the schedulers print their estimates, in unix
/// seconds (`mktime`, daylight saving decided by the date).
pub(crate) fn local_unix_s(year: i32, month: i32, day: i32, h: i32, m: i32, s: i32) -> Option<f64> {
    // SAFETY: `tm` is a plain C struct, zeroed then filled; mktime only reads and normalises it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = year - 1900;
    tm.tm_mon = month - 1;
    tm.tm_mday = day;
    tm.tm_hour = h;
    tm.tm_min = m;
    tm.tm_sec = s;
    tm.tm_isdst = -1;
    let secs = unsafe { libc::mktime(&mut tm) };
    (secs != -1).then_some(secs as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_and_active_are_disjoint() {
        let all = [
            JobState::Pending,
            JobState::Running,
            JobState::Completed,
            JobState::Failed {
                exit_code: Some(1),
                reason: "exit code 1".into(),
            },
            JobState::Cancelled,
            JobState::Timeout,
            JobState::NodeFail,
            JobState::OutOfMemory,
            JobState::Preempted,
            JobState::Unknown,
        ];
        for s in &all {
            assert!(!(s.is_terminal() && s.is_active()), "{s}");
        }
        assert!(!JobState::Unknown.is_terminal());
        assert!(!JobState::Unknown.is_active());
    }

    #[test]
    fn exit_code_maps_to_completed_or_failed() {
        assert_eq!(JobState::from_exit_code(0), JobState::Completed);
        assert_eq!(
            JobState::from_exit_code(3),
            JobState::Failed {
                exit_code: Some(3),
                reason: "exit code 3".into()
            }
        );
    }
}
