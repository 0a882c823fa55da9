//! The files the run's owner and its jobs hand each other, so that only the owner ever opens
//! run.db.
//!
//! On a cluster the run directory sits on a shared filesystem that jobs on many hosts see at
//! once; SQLite's locking does not hold across hosts there. So the process that owns the run
//! (the submit loop, `run`, and the commands a user types on the login node) is the only one
//! that opens run.db, and everything crossing to and from a job is a file written atomically:
//!
//! - [`PlanManifest`] (`plan.json`, owner → job): each batch's file and the rows to skip.
//! - [`OutputSettings`] (`output-settings.json`): the settings that decide a batch's rows,
//!   fixed by the first attempt (or by `submit`); every later attempt is refused when its own
//!   differ.
//! - [`AttemptManifest`] (`results/b<batch>/<attempt>.json`, job → owner): one per attempt,
//!   rewritten after each shard and last with `complete: true`. The owner ingests complete
//!   ones into run.db (`RunDb::ingest_results`); the first complete, verified one of a batch
//!   wins.

mod attempt;
mod output;
mod plan;

pub use crate::host::name as host_name;
pub use attempt::{
    new_attempt_token, papers_digest, AttemptManifest, AttemptShard, BatchTimings, ExpectedBatch,
    Verdict, MANIFEST_FORMAT,
};
#[cfg(test)]
pub(crate) use output::settings_for_tests;
pub use output::{OutputSettings, PinError};
pub use plan::{PlanManifest, PlannedBatch};

#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        action: &'static str,
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
    #[error("{} is not valid: {cause}", path.display())]
    Json {
        path: std::path::PathBuf,
        cause: serde_json::Error,
    },
}

/// The most a handoff file may hold. A result manifest is kilobytes and the plan manifest of the
/// full corpus megabytes; anything bigger (a link to `/dev/zero`, say) is not one of ours.
const MAX_HANDOFF_BYTES: u64 = 256 << 20;

/// Reads a JSON file written by [`write_json`]: a regular file only, capped (see
/// [`crate::untrusted`]).
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
) -> Result<T, HandoffError> {
    let bytes = crate::untrusted::read_capped(path, MAX_HANDOFF_BYTES).map_err(|source| {
        HandoffError::Io {
            action: "read",
            path: path.into(),
            cause: source,
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|source| HandoffError::Json {
        path: path.into(),
        cause: source,
    })
}

/// Writes `value` as JSON to `path` atomically (see [`crate::atomic`]).
pub(crate) fn write_json<T: serde::Serialize>(
    path: &std::path::Path,
    value: &T,
) -> Result<(), HandoffError> {
    let io = |source| HandoffError::Io {
        action: "write",
        path: path.into(),
        cause: source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let bytes = serde_json::to_vec_pretty(value).expect("handoff files serialise. This is a bug.");
    crate::atomic::write(path, &bytes).map_err(io)
}
