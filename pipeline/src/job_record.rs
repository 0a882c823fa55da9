//! The one-shot jobs the owner submits beside the run's embed jobs (a group build, a query job):
//! each is recorded beside its work, so that a restarted owner finds the job again and waits
//! for it instead of submitting another, and each gets a name no earlier job of the run had.

use std::path::Path;

use embedfleet_core::atomic;
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::oneshot::{self, OneShot, OneShotJob};
use embedfleet_orchestrator::scheduler::{JobState, Scheduler};

use crate::error::{io, Result};

/// A job recorded beside its work, and its state when the scheduler still has it queued or
/// running (`None`: it ended, or the scheduler does not know it now).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub job: OneShotJob,
    pub open: Option<JobState>,
}

/// The job recorded at `path`; `None` when there is none or it cannot be read (a job not found
/// is submitted again: its work is decided by its files, never by this record).
pub fn recorded(path: &Path, scheduler: &dyn Scheduler) -> Option<Recorded> {
    let job: OneShotJob = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let open = oneshot::state(scheduler, &job)
        .ok()
        .filter(|s| matches!(s, JobState::Pending | JobState::Running));
    Some(Recorded { job, open })
}

/// Submits `one` to `scheduler` under a name no earlier job of the run used (its script, log
/// and marker are its own: the attempt counts up past every name taken), and records it at
/// `record`, atomically.
pub fn submit(
    mut one: OneShot<'_>,
    scheduler: &dyn Scheduler,
    record: &Path,
) -> Result<OneShotJob> {
    let layout = RunLayout::new(one.run_dir);
    while layout.job_script(&one.name()).exists() {
        one.attempt += 1;
    }
    let job = one.submit(scheduler)?;
    let json = serde_json::to_vec_pretty(&job).expect("a job record serialises. This is a bug.");
    atomic::write(record, &json).map_err(io("write", record))?;
    Ok(job)
}
