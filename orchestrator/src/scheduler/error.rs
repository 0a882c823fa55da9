/*!
The one error type of the scheduler backends.

A scheduler command that fails, hangs or prints something unexpected is an error here, never a
job state: the submit loop must not mistake a broken `squeue` for a finished job.
*/

use std::path::PathBuf;
use std::time::Duration;

use super::template::TemplateError;

/// Result alias for scheduler operations.
pub type SchedulerResult<T> = Result<T, SchedulerError>;

/// Everything that can go wrong talking to a scheduler.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The program does not exist (not on PATH, or a configured path is wrong).
    #[error(
        "scheduler command `{program}` was not found; install the scheduler's client tools \
         or set the command's path in the run config ([scheduler.<backend>.<command>] path = ...)"
    )]
    CommandNotFound {
        /// The program as configured.
        program: String,
    },

    /// The program could not be started for another reason (permissions, resource limits).
    #[error("failed to start `{command}`: {cause}")]
    CommandSpawn {
        /// The command line.
        command: String,
        /// The operating system's error.
        cause: std::io::Error,
    },

    /// Every attempt ran longer than the timeout and was killed.
    #[error(
        "`{command}` did not finish within {timeout:?} ({attempts} attempt(s)); the scheduler may \
         be overloaded: raise [scheduler.command] timeout_secs if this persists{}",
        stderr_suffix(stderr_tail)
    )]
    CommandTimedOut {
        /// The command line.
        command: String,
        /// The per-call timeout.
        timeout: Duration,
        /// How many times it was tried.
        attempts: u32,
        /// The end of what it wrote to stderr before it was killed.
        stderr_tail: String,
    },

    /// Every attempt exited with a status the caller does not accept.
    #[error(
        "`{command}` failed with {status} ({attempts} attempt(s)){}",
        stderr_suffix(stderr_tail)
    )]
    CommandFailed {
        /// The command line.
        command: String,
        /// The exit status in words (`exit status 1`, `signal 9`).
        status: String,
        /// How many times it was tried.
        attempts: u32,
        /// The end of its stderr.
        stderr_tail: String,
    },

    /// The command succeeded but its output is not in a format this backend understands.
    #[error(
        "could not understand the output of `{command}`: {reason}; output was: {output_tail:?}"
    )]
    UnexpectedOutput {
        /// The command line.
        command: String,
        /// What was wrong.
        reason: String,
        /// The end of the output.
        output_tail: String,
    },

    /// A submission timed out: the scheduler may or may not have accepted the job.
    #[error(
        "submitting job `{name}` timed out; it may have been queued anyway: look for a job of \
         that name (e.g. `squeue --name {name}`, `qstat -u $USER`) before submitting it again"
    )]
    SubmitUncertain {
        /// The job name.
        name: String,
        /// The timeout error.
        #[source]
        source: Box<SchedulerError>,
    },

    /// A job submission is invalid before it reaches any scheduler.
    #[error("invalid job `{name}`: {reason}")]
    InvalidJob {
        /// The job name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The local backend was asked about a job it did not start.
    #[error("job {id} is not a job of this local scheduler")]
    UnknownJob {
        /// The id.
        id: String,
    },

    /// The job script could not be rendered.
    #[error(transparent)]
    Template(#[from] TemplateError),

    /// Reading or writing a file (script, log, marker) failed.
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        /// What was being done (`write job script`, `open log file`).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        cause: std::io::Error,
    },
}

fn stderr_suffix(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("; stderr: {}", tail.trim())
    }
}

impl SchedulerError {
    /// True for conditions that may pass if the call is repeated later (timeouts, failures of a
    /// scheduler command); false for configuration errors (missing program, bad job).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::CommandTimedOut { .. } | Self::CommandFailed { .. } | Self::CommandSpawn { .. }
        )
    }
}
