//! The pipeline's errors: a stage's own error as it is, or a setup the pipeline refuses.

use std::path::PathBuf;

use embedfleet_core::handoff::HandoffError;
use embedfleet_core::rundb::RunDbError;
use embedfleet_orchestrator::plan::PlanError;
use embedfleet_orchestrator::scheduler::SchedulerError;
use embedfleet_orchestrator::stored_config::StoredConfigError;
use embedfleet_orchestrator::submit::SubmitError;
use embedfleet_query::vectors::VectorsError;
use embedfleet_query::QueryError;
use embedfleet_snapshot::SnapshotError;

pub type Result<T> = std::result::Result<T, PipelineError>;

/// A setup refused before any job: every problem, each saying what to do.
#[derive(Debug)]
pub struct Refused {
    pub problems: Vec<String>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nothing was submitted; fix these first (`embedfleet doctor` on a compute node checks a node):")?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Refused {}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error(transparent)]
    Handoff(#[from] HandoffError),
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Submit(#[from] SubmitError),
    #[error(transparent)]
    StoredConfig(#[from] StoredConfigError),
    #[error(transparent)]
    Config(#[from] embedfleet_orchestrator::config::ConfigError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Query(#[from] QueryError),
    #[error(transparent)]
    QueryVectors(#[from] VectorsError),
    #[error(transparent)]
    Upload(#[from] embedfleet_vectordb::UploadError),
    #[error(transparent)]
    UploadRun(#[from] embedfleet_vectordb::UploadRunError),
    #[error(transparent)]
    UploadQuery(#[from] embedfleet_vectordb::query::QueryError),
    #[error(transparent)]
    EmbedQuery(#[from] embedfleet_embed::QueryEmbedError),
    /// The model directory's family, read from its `config.json`.
    #[error(transparent)]
    Model(#[from] embedfleet_models::ModelError),
    /// A setup refused before anything was sent (exit code 4).
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    /// A query model is needed and none was given, nor is the run's there (`recorded`: the
    /// directory its shards were made with, when the run has one).
    #[error("give --model-dir: {}", match recorded {
        Some(dir) => format!("the run's shards were made with the model in {dir}, which is not there now (queries must be embedded by the same model)"),
        None => "the model the run was embedded with (queries must be embedded by the same model)".into(),
    })]
    NoQueryModel { recorded: Option<String> },
    /// A run's first submit without `--model-dir`.
    #[error(
        "give --model-dir: this run's first submit chooses its model (later ones use the run's)"
    )]
    NoModelForFirstSubmit,
    /// A step that builds shards per group of batches, in a run with no shard keys pinned and
    /// no group count given.
    #[error("{}", step.how_to_give_keys())]
    NoShardKeys { step: GroupStep },
    /// A query job that ended before writing every part of its work.
    #[error("the query job {job} ended ({end}) with {written} of {parts} parts written; its log: {}. Run the same command again to go on: the parts written are kept", log.display())]
    QueryJobIncomplete {
        job: String,
        end: embedfleet_orchestrator::scheduler::JobState,
        written: usize,
        parts: usize,
        log: PathBuf,
    },
    /// A group's shard asked of run.db's accepted shards before any of its batches has one.
    #[error("{batches} has no accepted shards in run.db yet: embed it first (`embedfleet status` lists the batches)")]
    NothingAccepted { batches: String },
    /// A shard of several batches asked without `--accepted` (only run.db knows a group's
    /// accepted shards).
    #[error("this run's shard keys hold {per_group} batches each ({batches}): a group's shard is built from the shards run.db accepted, with --accepted on the login node")]
    GroupNeedsAccepted { per_group: i64, batches: String },
    /// A delete from a collection of grouped shard keys naming papers of no batch of the run
    /// (their key is unknown).
    #[error("{} papers are not in this run, so their shard key is unknown: {}", papers.len(), papers.join(", "))]
    UnknownPapersInKeyed { papers: Vec<String> },
    /// A search of a collection that does not exist (exit code 4).
    #[error("the collection `{collection}` does not exist at {target}: nothing was uploaded into it yet (`{upload}`), or name the collection and target the run uploaded into")]
    NotUploaded {
        collection: String,
        target: String,
        /// The upload that makes it: the same run directory, target and collection.
        upload: String,
    },
}

impl PipelineError {
    /// Refusals (exit code 4) as opposed to failures: the stage's own word where the error is
    /// a stage's.
    pub fn is_refusal(&self) -> bool {
        match self {
            Self::StoredConfig(e) => e.is_refusal(),
            Self::Snapshot(e) => e.is_refusal(),
            Self::Query(e) => e.is_refusal(),
            Self::UploadRun(e) => e.is_refusal(),
            Self::Plan(e) => e.is_refusal(),
            Self::Submit(e) => submit_refuses(e),
            Self::Refused(_) | Self::NotUploaded { .. } => true,
            _ => false,
        }
    }

    /// The exit code of a submit loop stopped by a signal (128 + the signal).
    pub fn interrupted_code(&self) -> Option<i32> {
        match self {
            Self::Submit(SubmitError::Interrupted { code, .. }) => Some(*code),
            _ => None,
        }
    }

    /// A corpus the plan could not use (exit code 3, as a corrupt corpus file is).
    pub fn is_unusable_input(&self) -> bool {
        matches!(self, Self::Plan(PlanError::Unusable { .. }))
    }
}

/// Which of the submit loop's errors are refusals (exit code 4): another host's run, or a loop
/// already running. The one place that says so (the binary asks it too).
// Phase 2 of issue 51 moves this onto `SubmitError` itself (orchestrator/src/submit/).
pub fn submit_refuses(e: &SubmitError) -> bool {
    matches!(
        e,
        SubmitError::NotOwner(_) | SubmitError::LoopRunning { .. }
    )
}

/// The steps that build Qdrant shards per group of batches, and so need the run's shard keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupStep {
    /// `submit --group-builds`.
    SubmitGroupBuilds,
    /// `build-shard --accepted --group N`.
    BuildShard,
}

impl GroupStep {
    fn how_to_give_keys(self) -> &'static str {
        match self {
            GroupStep::SubmitGroupBuilds => "--group-builds needs the run's shard keys: say how many groups its batches make (--group-count G, e.g. two per peer of the Qdrant cluster), or pin them with `build-shard --accepted --group-count G` or a first `upload --mode snapshot`",
            GroupStep::BuildShard => "this run has no shard keys pinned yet: say how many groups its batches make (--group-count G), or let `upload --mode snapshot` choose (two per peer of the cluster)",
        }
    }
}

/// An `Io` error of `action` on `path`.
pub(crate) fn io(
    action: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> PipelineError + use<> {
    let path = path.to_path_buf();
    move |source| PipelineError::Io {
        action,
        path,
        cause: source,
    }
}
