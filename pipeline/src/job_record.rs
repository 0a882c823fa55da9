//! The record of a one-shot job the owner submitted (a group build, a query job), kept beside
//! its work so that a restarted owner finds the job again instead of submitting another.

use std::path::Path;

use embedfleet_core::atomic;
use embedfleet_orchestrator::oneshot::OneShotJob;

use crate::error::{io, Result};

/// The job recorded at `path`; `None` when there is none or it cannot be read (a job not
/// found is submitted again: its work is decided by its files, never by this record).
pub fn read(path: &Path) -> Option<OneShotJob> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Records `job` at `path`, atomically.
pub fn write(path: &Path, job: &OneShotJob) -> Result<()> {
    let json = serde_json::to_vec_pretty(job).expect("a job record serialises. This is a bug.");
    atomic::write(path, &json).map_err(io("write", path))
}
