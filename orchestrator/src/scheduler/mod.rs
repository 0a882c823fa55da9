/*!
Scheduler backends: submit a job script, poll job states, cancel a job.

Three backends sit behind the object-safe [`Scheduler`] trait:
- [`LocalScheduler`]: child processes on this machine, each in its own process group.
- [`SlurmScheduler`]: `sbatch --parsable`, `squeue`, `scancel`; final states from `sacct` when
  accounting works, else from `squeue --states=all`/`scontrol show job` while Slurm remembers
  the job, else from the job's completion marker.
- [`PbsScheduler`]: `qsub`, `qstat`, `qdel`; PBS Pro (`qstat -x -f -F json`, with the text
  `qstat -x -f` as fallback) and Torque (`qstat -f`, including Slurm's `slurm-wlm-torque`).

Every scheduler command goes through [`CommandRunner`]: configurable path and extra
arguments, a timeout, retries with backoff; a command that fails or hangs is a
[`SchedulerError`], never a job state. Job scripts come from [`render_job_script`].
*/

mod command;
mod error;
mod local;
mod pbs;
mod pbs_parse;
mod script;
mod slurm;
mod slurm_parse;
mod state;
pub mod template;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use command::{
    shell_quote, Call, CommandConfig, CommandOutput, CommandRunner, ProgramConfig, RetryOn,
};
pub use error::{SchedulerError, SchedulerResult};
pub use local::{LocalConfig, LocalScheduler};
pub use pbs::{PbsConfig, PbsFlavor, PbsScheduler};
pub use pbs_parse::{parse_qstat_json, parse_qstat_text, pbs_state, PbsJob};
pub use script::{
    render_command_script, render_job_script, script_vars, ScriptConfig, ScriptJob, LOCAL_TEMPLATE,
    PBS_TEMPLATE, SLURM_TEMPLATE,
};
pub use slurm::{SacctMode, SlurmConfig, SlurmScheduler};
pub use slurm_parse::{parse_sacct, parse_scontrol, parse_squeue, slurm_state, SlurmRecord};
pub use state::{JobHandle, JobState, QueuedJob, SchedulerJobId};
pub use template::TemplateError;

/// Which scheduler a run uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Child processes on this machine.
    #[default]
    Local,
    /// Slurm.
    Slurm,
    /// PBS Pro or Torque.
    Pbs,
}

impl Backend {
    /// `local`, `slurm` or `pbs`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Slurm => "slurm",
            Self::Pbs => "pbs",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(Self::Local),
            "slurm" => Ok(Self::Slurm),
            "pbs" => Ok(Self::Pbs),
            other => Err(format!(
                "unknown backend `{other}`; use local, slurm or pbs"
            )),
        }
    }
}

/// The job script to submit: a file, or its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobScript {
    /// A script file (kept in the run directory, so a user can read what was submitted).
    Path(PathBuf),
    /// Script text; Slurm reads it from stdin, PBS and local write it to a file first.
    Text(String),
}

/// One job to submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSubmission {
    /// Job name (letters, digits, `-_.@`); also what to search for after an uncertain submit.
    pub name: String,
    /// Queue (PBS) or partition (Slurm); the local backend only records it.
    pub queue: String,
    /// The script.
    pub script: JobScript,
    /// Directory the job starts in (default: the submitter's current directory).
    pub workdir: Option<PathBuf>,
    /// File for the job's stdout and stderr; overrides the script's directives.
    pub log: Option<PathBuf>,
    /// The completion marker the script writes (used by the local backend for adopted jobs).
    pub marker: Option<PathBuf>,
}

impl JobSubmission {
    /// A submission of `script` named `name` to `queue`.
    pub fn new(name: impl Into<String>, queue: impl Into<String>, script: JobScript) -> Self {
        Self {
            name: name.into(),
            queue: queue.into(),
            script,
            workdir: None,
            log: None,
            marker: None,
        }
    }

    /// Sets the working directory.
    pub fn workdir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workdir = Some(dir.into());
        self
    }

    /// Sets the log file.
    pub fn log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// Sets the completion marker.
    pub fn marker(mut self, path: impl Into<PathBuf>) -> Self {
        self.marker = Some(path.into());
        self
    }

    /// The handle to poll this job by, once `id` is known.
    pub fn handle(&self, id: SchedulerJobId) -> JobHandle {
        JobHandle {
            id,
            marker: self.marker.clone(),
            name: Some(self.name.clone()),
        }
    }

    fn validate(&self) -> SchedulerResult<()> {
        let word = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
        };
        let reason = if !word(&self.name) {
            "the name must be letters, digits and `-_.@`"
        } else if !word(&self.queue) {
            "the queue must be letters, digits and `-_.@`"
        } else {
            return Ok(());
        };
        Err(SchedulerError::InvalidJob {
            name: self.name.clone(),
            reason: reason.to_string(),
        })
    }
}

/// A batch scheduler: submit, poll, cancel. Object-safe; all methods block.
pub trait Scheduler: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// Submits a job and returns the scheduler's id for it.
    fn submit(&self, job: &JobSubmission) -> SchedulerResult<SchedulerJobId>;

    /// The states of `jobs`, one entry per job. A scheduler command that fails is an error for
    /// the whole call; a job the scheduler does not know is [`JobState::Unknown`] unless its
    /// completion marker says how it ended.
    fn poll(&self, jobs: &[JobHandle]) -> SchedulerResult<HashMap<SchedulerJobId, JobState>>;

    /// Cancels a job; cancelling a job that already ended is not an error.
    fn cancel(&self, job: &JobHandle) -> SchedulerResult<()>;

    /// The current user's jobs the scheduler lists (at least every queued or running one), to
    /// adopt jobs after a restart and to count what a queue holds.
    fn list_jobs(&self) -> SchedulerResult<Vec<QueuedJob>>;

    /// Cancels every job the scheduler lists under `name` that has not ended: whatever a
    /// submission whose answer never came (a timed-out `sbatch`) may have queued after all.
    /// The submit loop calls it before it submits that job's batches again, so that no
    /// untracked twin runs beside their next job.
    fn cancel_named(&self, name: &str) -> SchedulerResult<()> {
        let twins = self
            .list_jobs()?
            .into_iter()
            .filter(|job| job.name == name && !job.state.is_terminal());
        for twin in twins {
            self.cancel(&JobHandle::new(twin.id).with_name(twin.name))?;
        }
        Ok(())
    }
}

/// The `[scheduler]` table of a run config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// `local` (default), `slurm` or `pbs`.
    pub backend: Backend,
    /// Timeout and retries of every scheduler command.
    pub command: CommandConfig,
    /// Local backend settings.
    pub local: LocalConfig,
    /// Slurm command paths and options.
    pub slurm: SlurmConfig,
    /// PBS command paths and options.
    pub pbs: PbsConfig,
    /// Job script template and its values.
    pub script: ScriptConfig,
}

impl SchedulerConfig {
    /// Builds the configured backend.
    pub fn build(&self) -> Box<dyn Scheduler> {
        match self.backend {
            Backend::Local => Box::new(LocalScheduler::new(self.local.clone())),
            Backend::Slurm => Box::new(SlurmScheduler::new(
                self.slurm.clone(),
                self.command.clone(),
            )),
            Backend::Pbs => Box::new(PbsScheduler::new(self.pbs.clone(), self.command.clone())),
        }
    }
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
fn marker_or(handle: &JobHandle, fallback: JobState) -> JobState {
    handle
        .marker
        .as_deref()
        .and_then(marker_state)
        .unwrap_or(fallback)
}

/// Writes script text to a file the scheduler can read (`qsub` of the Torque wrapper does not
/// read stdin): `<dir>/.<name>.<pid>.<n>.sh`.
fn write_script_file(dir: &Path, name: &str, text: &str) -> SchedulerResult<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!(".{name}.{}.{n}.sh", std::process::id()));
    std::fs::write(&path, text).map_err(|source| SchedulerError::Io {
        action: "write job script",
        path: path.clone(),
        source,
    })?;
    Ok(path)
}
