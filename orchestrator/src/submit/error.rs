//! How a submit fails: the loop's one error type, each case with what to do about it.

use std::path::PathBuf;

use embedfleet_core::rundb::RunDbError;

use crate::scheduler::{SchedulerError, TemplateError};

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error("{0} is not planned completely: run `embedfleet plan` on it first")]
    NotPlanned(PathBuf),
    #[error(
        "no queues to submit to: give them with `--queue NAME=CAP` (repeatable), or \
         `embedfleet queues set --run-dir DIR NAME=CAP`"
    )]
    NoQueues,
    /// Stopped by a signal: `said` tells what became of the run's jobs; the process exits
    /// with `code` (128 + the signal, as a shell reports it).
    #[error("stopped by {signal}: {said}")]
    Interrupted {
        signal: String,
        code: i32,
        said: String,
    },
    /// Each queue's reason says its own remedy (a host key to add, a queue to fix).
    #[error("no queue can take the run's jobs: {0}")]
    AllQueuesRefused(String),
    #[error("the job script template does not work: {0}")]
    Template(TemplateError),
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(transparent)]
    Owner(#[from] embedfleet_core::owner::OwnerError),
    #[error(
        "{} was taken over by another host (`embedfleet take-over`): this submit loop stops; the new owner's loop goes on",
        .0.display()
    )]
    NotOwner(PathBuf),
    #[error(
        "a submit loop (pid {pid}) is already running for {}: watch it with `embedfleet status`, or stop it first",
        run_dir.display()
    )]
    LoopRunning { run_dir: PathBuf, pid: String },
}

/// Said in the message, so not returned as the source (`embedfleet_core::cause`): no
/// `#[from]`, which would return it.
impl From<TemplateError> for SubmitError {
    fn from(e: TemplateError) -> Self {
        Self::Template(e)
    }
}

pub type Result<T> = std::result::Result<T, SubmitError>;
