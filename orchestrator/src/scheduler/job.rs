/*!
A job as a backend takes it ([`JobSubmission`]) and what every backend does with it: the
[`Scheduler`] trait.
*/

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::{
    Backend, JobHandle, JobState, QueueProblem, QueuedJob, SchedulerError, SchedulerJobId,
    SchedulerResult,
};

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

    pub(super) fn validate(&self) -> SchedulerResult<()> {
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

/// A limit of jobs over queues that the scheduler states (see [`Scheduler::job_limit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLimit {
    /// Jobs queued and running over all the run's queues together, where stated.
    pub jobs: Option<u32>,
    /// Jobs running at once, where also stated (it holds jobs back; it refuses none).
    pub running: Option<u32>,
    /// Jobs queued and running in one queue, for queues that state their own (PBS's
    /// `max_queued` of a queue): the loop keeps each queue's cap under it.
    pub queues: std::collections::BTreeMap<String, u32>,
    /// Where it is stated, in words (`Slurm: QOS rtq MaxSubmitJobsPerUser=3`).
    pub said: String,
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

    /// The scheduler's own estimate of when each of these queued jobs starts (unix seconds),
    /// for the jobs it has one for: Slurm's `squeue --start`. None by default; the router
    /// weighs an estimate by how far the queue's earlier ones were off.
    fn start_estimates(
        &self,
        _queued: &[JobHandle],
    ) -> SchedulerResult<HashMap<SchedulerJobId, f64>> {
        Ok(HashMap::new())
    }

    /// The scheduler's own estimate of when `job` would start if it were submitted now (unix
    /// seconds): Slurm's `sbatch --test-only`, which queues nothing. None by default. The
    /// router takes it as the start of the next job sent to that queue, weighed by how far
    /// the queue's earlier estimates were off.
    fn new_job_start(&self, _job: &JobSubmission) -> SchedulerResult<Option<f64>> {
        Ok(None)
    }

    /// The most jobs the scheduler lets the run's user hold queued or running over all of
    /// `queues` together, and in each queue, where it states such limits (Slurm:
    /// `MaxSubmitJobs` of the user's association or QOS; PBS Pro: `max_queued` of the server
    /// and of each queue), and where they are stated. `None` by default: none stated, or the
    /// backend cannot tell. The submit loop keeps under it as under `--max-jobs`.
    fn job_limit(&self, _queues: &[String]) -> SchedulerResult<Option<JobLimit>> {
        Ok(None)
    }

    /// Queues that cannot take jobs, each with the reason, found before the first job of a run
    /// in `run_dir`: `submit` sends none there, `doctor` shows them. A batch scheduler has
    /// none to report (its submit command says what is wrong with a queue).
    fn preflight(&self, _run_dir: &Path) -> Vec<QueueProblem> {
        Vec::new()
    }

    /// The names of the queues the scheduler has, where it can list them (PBS Pro's `qstat
    /// -Q`): a queue the run names that is not among them is refused before anything is
    /// stored or sent, the dry run included. `None`: not listed (the backend cannot, or the
    /// server did not answer: the submission then says what is wrong).
    fn known_queues(&self) -> Option<Vec<String>> {
        None
    }

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
