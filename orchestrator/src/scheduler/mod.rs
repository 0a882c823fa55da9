/*!
Scheduler backends: submit a job script, poll job states, cancel a job.

Each backend is a module of its own, listed once below, and everything that makes it different
sits in it: its table of the run config (`[scheduler.<name>]`), the [`Scheduler`] that submits,
polls and cancels, and the hooks of [`BackendKind`] (its job script template, its multi-node
launcher, a CPU job's directives, its job-name limit, a queue's own script settings, what
`submit` uses by default). The four:
- `local`: child processes on this machine, each in its own process group.
- `slurm`: `sbatch --parsable`, `squeue`, `scancel`; final states from `sacct` when accounting
  works, else from `squeue --states=all`/`scontrol show job` while Slurm remembers the job, else
  from the job's completion marker.
- `pbs`: `qsub`, `qstat`, `qdel`; PBS Pro (`qstat -x -f -F json`, with the text `qstat -x -f` as
  fallback) and Torque (`qstat -f`, including Slurm's `slurm-wlm-torque`).
- `ssh`: GPU machines over OpenSSH, each host a queue: jobs detached with `setsid`, tracked by
  pid, start time and name (docs/cluster.md, "A fleet without a scheduler").

Every scheduler command goes through [`CommandRunner`]: configurable path and extra
arguments, a timeout, retries with backoff; a command that fails or hangs is a
[`SchedulerError`], never a job state. A submit command goes through [`submit_command`], which
reads its refusals from the backend's [`Refusals`]. Job scripts come from
[`render_job_script`].
*/

mod backend;
mod command;
mod error;
mod job;
mod registry;
mod script;
mod state;
mod submit_command;
pub mod template;

use std::path::Path;

pub use backend::{BackendKind, QueueProblem, SubmitDefaults};
pub use command::{
    seconds_problem, shell_quote, Call, CommandConfig, CommandOutput, CommandRunner, ProgramConfig,
    RetryOn,
};
pub use error::{SchedulerError, SchedulerResult};
pub use job::{JobLimit, JobScript, JobSubmission, Scheduler};
pub use local::{LocalScheduler, LOCAL_TEMPLATE};
pub use pbs::{
    parse_acl_roots, parse_qstat_json, parse_qstat_text, parse_queues_json, pbs_state, PbsFlavor,
    PbsJob, PbsQueue, PbsScheduler, PBS_TEMPLATE,
};
pub use script::{render_command_script, render_job_script, script_vars, ScriptConfig, ScriptJob};
pub use slurm::{
    parse_sacct, parse_scontrol, parse_squeue, parse_start_estimates, parse_test_only, slurm_state,
    SacctMode, SlurmRecord, SlurmScheduler, SLURM_TEMPLATE,
};
pub use state::{marker_state, JobHandle, JobState, QueuedJob, SchedulerJobId};
pub use submit_command::{submit_command, Refusals};
pub use template::TemplateError;

use state::marker_or;

// The backends: one line each (ARCHITECTURE.md, "How to add a scheduler backend").
registry::backends! {
    /// Child processes on this machine (the default).
    Local => local::{LocalBackend, LocalConfig},
    /// Slurm.
    Slurm => slurm::{SlurmBackend, SlurmConfig},
    /// PBS Pro or Torque.
    Pbs => pbs::{PbsBackend, PbsConfig},
    /// GPU machines over OpenSSH.
    Ssh => ssh::{SshBackend, SshConfig},
}

impl SchedulerConfig {
    /// Builds the configured backend.
    pub fn build(&self) -> Box<dyn Scheduler> {
        self.backend.kind().build(self)
    }

    /// Values that parse but cannot work, each naming its key: the command policy's, then
    /// every backend's table's in the list's order.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.command.problems();
        for backend in Backend::ALL {
            problems.extend(backend.kind().problems(self));
        }
        problems
    }

    /// The problems the backend finds before the first job of the run in `run_dir` (see
    /// [`Scheduler::preflight`]).
    pub fn preflight(&self, run_dir: &Path) -> Vec<QueueProblem> {
        self.build().preflight(run_dir)
    }

    /// The queues of `queues` the backend's scheduler says it does not have, each with the
    /// reason naming the ones it has (see [`Scheduler::known_queues`]); none when it cannot say.
    pub fn unknown_queues<'q>(&self, queues: impl IntoIterator<Item = &'q String>) -> Vec<String> {
        let Some(known) = self.build().known_queues() else {
            return Vec::new();
        };
        queues
            .into_iter()
            .filter(|q| !known.contains(q))
            .map(|q| {
                format!(
                    "the {} server has no queue `{q}` (its queues: {}): give the queues it has (`--queue NAME=CAP`, or `embedfleet queues set`)",
                    self.backend.name().to_uppercase(),
                    known.join(", ")
                )
            })
            .collect()
    }
}
