//! The one error type of the publish stage, and the missing batches a refusal names.
//!
//! Every variant says what went wrong and what to do about it; [`PublishError::is_refusal`]
//! tells the binary which ones are the run or the folder refusing the command (exit code 4)
//! rather than a failure.

use embedfleet_core::rundb::RunDbError;
use serde::Serialize;
use std::fmt;
use std::path::PathBuf;

/// A batch whose papers are not all in parquet shards: not `done`, or `done` but short.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MissingBatch {
    pub id: i64,
    /// Its state in run.db (`planned`, `running`, `failed`, or `done` when it is short).
    pub state: String,
    /// Papers planned in it (batch rows less later duplicates).
    pub papers: u64,
    /// Papers of it neither in a parquet shard nor quarantined as `embed_failed`.
    pub missing: u64,
}

impl fmt::Display for MissingBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "batch {} ({}): {} of {} papers missing",
            self.id, self.state, self.missing, self.papers
        )
    }
}

/// Why a publish did not finish.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),

    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },

    /// A parquet file could not be read or written.
    #[error("{path}: {message}")]
    Parquet { path: PathBuf, message: String },

    /// The run has batches that are not (all) embedded.
    #[error(
        "the run is not complete: {} — finish it (`embedfleet submit` or `embedfleet run` again), or use --allow-partial to publish what is there",
        list(missing)
    )]
    Partial { missing: Vec<MissingBatch> },

    /// `out` exists and was not made by `embedfleet publish`.
    #[error("{0} exists and is not a folder `embedfleet publish` made (no manifest.json of ours): choose another --out, or remove it")]
    OutExists(PathBuf),

    /// `out` is a published folder, but of another run.
    #[error("{0} is a folder published from another run (its manifest.json names another plan): choose another --out, or remove it to replace it")]
    OutOfAnotherRun(PathBuf),

    #[error(
        "the run has no parquet shards: embed it first (`embedfleet submit` or `embedfleet run`)"
    )]
    NoShards,

    /// The parquet shards do not agree on the model, the vectors or the schema.
    #[error("{path} does not match the run's first parquet shard ({what}): the shards come from different models or settings; re-embed that batch, or publish the runs apart")]
    MixedShards { path: PathBuf, what: String },

    /// A parquet shard's footer and run.db disagree on its rows.
    #[error("{path} has {found} rows but run.db records {recorded}: the shard changed after the embed job wrote it; re-embed its batch")]
    ShardRows {
        path: PathBuf,
        recorded: u64,
        found: u64,
    },

    /// With `--with-text`: a batch file or a paper's text is not where run.db says.
    #[error("{path}: {message}; publish without --with-text, or plan the run again to rewrite its batch files")]
    Text { path: PathBuf, message: String },

    /// Two query-result files would land on the same name, or one is not parquet.
    #[error("{path}: {message}")]
    Queries { path: PathBuf, message: String },

    /// The test hook `stop_after_files` stopped the run, as a kill would.
    #[error("stopped after the data files asked for (a test hook)")]
    Stopped,
}

fn list(missing: &[MissingBatch]) -> String {
    let shown: Vec<String> = missing.iter().take(20).map(|b| b.to_string()).collect();
    let mut out = shown.join(", ");
    if missing.len() > shown.len() {
        out.push_str(&format!(
            " and {} more batches",
            missing.len() - shown.len()
        ));
    }
    out
}

impl PublishError {
    /// Refusals (exit code 4): the run or the folder refused the command; nothing was wrong
    /// with the machine or the files.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            PublishError::Partial { .. }
                | PublishError::OutExists(_)
                | PublishError::OutOfAnotherRun(_)
        )
    }
}

/// Wraps an I/O error with the path it happened at.
pub(crate) fn io(path: &std::path::Path) -> impl Fn(std::io::Error) -> PublishError + '_ {
    move |source| PublishError::Io {
        path: path.into(),
        cause: source,
    }
}

/// Wraps a parquet or arrow error with the file it happened in.
pub(crate) fn pq_err<E: fmt::Display>(path: &std::path::Path) -> impl Fn(E) -> PublishError + '_ {
    move |e| PublishError::Parquet {
        path: path.into(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_refusal_names_the_batches_and_the_way_out() {
        let missing = vec![MissingBatch {
            id: 2,
            state: "failed".into(),
            papers: 30,
            missing: 30,
        }];
        let e = PublishError::Partial { missing };
        let text = e.to_string();
        assert!(
            text.contains("batch 2 (failed): 30 of 30 papers missing"),
            "{text}"
        );
        assert!(text.contains("--allow-partial"), "{text}");
        assert!(e.is_refusal());
        assert!(!PublishError::NoShards.is_refusal());
    }
}
