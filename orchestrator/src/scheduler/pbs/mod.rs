/*!
The PBS backend: `qsub`, `qstat`, `qdel`, for PBS Pro (Polaris) and Torque (including the
`slurm-wlm-torque` wrappers over Slurm).
*/

mod limits;
mod parse;
mod preflight;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::command::tail;
use super::{
    marker_or, marker_state, submit_command, Backend, BackendKind, Call, CommandConfig,
    CommandOutput, CommandRunner, JobHandle, JobScript, JobState, JobSubmission, ProgramConfig,
    QueueProblem, QueuedJob, Refusals, Scheduler, SchedulerConfig, SchedulerError,
    SchedulerJobId, SchedulerResult, ScriptConfig,
};
pub use parse::{
    parse_acl_roots, parse_qstat_json, parse_qstat_text, parse_queues_json, pbs_state, PbsJob,
    PbsQueue,
};

/// Built-in PBS template (PBS Pro as on Polaris; Torque reads the same directives).
///
/// The job is rerunnable (`-r y`): PBS Pro preempts a job by requeueing it (`preempt_order R`,
/// as for Polaris's `preemptable` queue) and reruns one whose server and MOM restarted, and it
/// can do either only to a rerunnable job; a job that may not be rerun is not preempted at all
/// under `preempt_order R`, and is killed by a MOM restart. A rerun is the same job id run
/// again: the loop sees it back in its queue (counted as preempted on that queue) and follows it
/// to its end. Each run of `embed-job` is an attempt of its own (its own token in every file
/// name), so a rerun takes over the shards the killed run finished and never mixes with it.
pub const PBS_TEMPLATE: &str = "#!/bin/bash
#PBS -N {job_name}
#PBS -q {queue}
#PBS -A {account}
#PBS -l walltime={walltime}
#PBS -l select={select}
#PBS -o {output}
#PBS -e {error}
#PBS -j {join}
#PBS -r y
{extra_directives}
cd \"${PBS_O_WORKDIR:-.}\"
{module_lines}
{env_lines}
{setup_lines}
{command}
{finish}
";

/// Some PBS servers (older PBS Pro and Torque releases) refuse or cut job names longer than
/// this.
const PBS_NAME_MAX: usize = 15;

/// What `qsub` answers when repeating cannot help; `slurm-wlm-torque`'s `qsub` answers with
/// `sbatch`'s words.
const REFUSALS: Refusals = Refusals {
    unknown_queue: &["unknown queue", "no such queue", "invalid partition"],
    permanent: &[
        "invalid account",
        "invalid qos",
        "unable to open file",
        "no such file",
        preflight::BAD_UID,
    ],
    list_queues: "qstat -Q",
};

/// The PBS backend's hooks.
pub struct PbsBackend;

impl BackendKind for PbsBackend {
    fn build(&self, config: &SchedulerConfig) -> Box<dyn Scheduler> {
        Box::new(PbsScheduler::new(config.pbs.clone(), config.command.clone()))
    }

    fn template(&self) -> &'static str {
        PBS_TEMPLATE
    }

    fn launcher(&self, nodes: usize) -> Option<String> {
        Some(format!("mpiexec -n {nodes} --ppn 1"))
    }

    /// Cores and memory go into the select, before the site's own resources.
    fn cpu_job(&self, script: &mut ScriptConfig, cpus: u32, memory_mib: u64) {
        let resources = format!("ncpus={cpus}:mem={memory_mib}mb");
        script.select_extra = Some(match script.select_extra.take().filter(|e| !e.is_empty()) {
            Some(extra) => format!("{resources}:{extra}"),
            None => resources,
        });
    }

    fn max_job_name(&self) -> Option<usize> {
        Some(PBS_NAME_MAX)
    }
}

/// Job ids per `qstat` call.
const CHUNK: usize = 200;

/// Which `qstat` dialect to speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PbsFlavor {
    /// PBS Pro / OpenPBS: `qstat -x -f -F json`, falling back to text `qstat -x -f`.
    #[default]
    Pro,
    /// Torque or `slurm-wlm-torque`: text `qstat -f` (no `-x`, no JSON).
    Torque,
}

/// The `[scheduler.pbs]` table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PbsConfig {
    /// `qsub` path and extra arguments (e.g. `["-l", "filesystems=home:eagle"]`).
    pub qsub: ProgramConfig,
    /// `qstat`.
    pub qstat: ProgramConfig,
    /// `qdel`.
    pub qdel: ProgramConfig,
    /// Output dialect of `qstat`.
    pub flavor: PbsFlavor,
}

/// PBS through its command-line tools.
#[derive(Debug)]
pub struct PbsScheduler {
    config: PbsConfig,
    runner: CommandRunner,
    /// Jobs this process asked to delete: Torque's `C` state does not say why a job ended.
    cancelled: Mutex<HashSet<SchedulerJobId>>,
}

/// `qstat` exits non-zero when any asked-for job is unknown (153 = PBSE_UNKJOBID) or finished
/// without `-x`; the other jobs are still printed, so such output is an answer.
fn qstat_answered(o: &CommandOutput) -> bool {
    if o.status.success() {
        return true;
    }
    let benign = |l: &str| {
        l.contains("Unknown Job Id")
            || l.contains("Job has finished")
            || l.contains("Invalid job id")
    };
    o.status.code() == Some(153)
        || (!o.stderr.trim().is_empty()
            && o.stderr
                .lines()
                .filter(|l| !l.trim().is_empty())
                .all(benign))
}

impl PbsScheduler {
    /// A PBS backend with these command paths and this command policy.
    pub fn new(config: PbsConfig, command: CommandConfig) -> Self {
        Self {
            config,
            runner: CommandRunner::new(command),
            cancelled: Mutex::new(HashSet::new()),
        }
    }

    fn qstat(&self, ids: &[&str], history: bool) -> SchedulerResult<Vec<PbsJob>> {
        let mut base: Vec<&str> = Vec::new();
        if history && self.config.flavor == PbsFlavor::Pro {
            base.push("-x");
        }
        base.push("-f");
        if self.config.flavor == PbsFlavor::Pro {
            let args: Vec<&str> = base
                .iter()
                .copied()
                .chain(["-F", "json"])
                .chain(ids.iter().copied())
                .collect();
            let out = self.runner.run(
                &self.config.qstat,
                "qstat",
                Call::new(args).accept(&qstat_answered),
            )?;
            if out.stdout.trim().is_empty() {
                return Ok(Vec::new());
            }
            match parse_qstat_json(&out.stdout) {
                Ok(jobs) => return Ok(jobs),
                // Some PBS Pro versions print invalid JSON (unescaped values); read the text.
                Err(reason) => {
                    tracing::warn!(%reason, "qstat JSON unreadable; using text qstat -f")
                }
            }
        }
        let args: Vec<&str> = base.iter().copied().chain(ids.iter().copied()).collect();
        let out = self.runner.run(
            &self.config.qstat,
            "qstat",
            Call::new(args).accept(&qstat_answered),
        )?;
        parse_qstat_text(&out.stdout).map_err(|reason| SchedulerError::UnexpectedOutput {
            command: "qstat -f".to_string(),
            reason,
            output_tail: tail(&out.stdout, 1000),
        })
    }

    /// PBS keeps a job that can never run queued forever, and `poll` reports it failed: it is
    /// deleted, so that it holds no place in the queue. A failed `qdel` is only logged (the loop
    /// counts the job as ended either way).
    fn delete_never_running(&self, handle: &JobHandle) {
        if self.was_cancelled(&handle.id) {
            return;
        }
        if let Err(e) = self.cancel(handle) {
            tracing::warn!(job = %handle.id, error = %e, "could not delete a job PBS can never run");
        }
    }

    fn was_cancelled(&self, id: &SchedulerJobId) -> bool {
        self.cancelled
            .lock()
            .expect("cancel set lock poisoned. This is a bug.")
            .contains(id)
    }

    fn script_path(&self, job: &JobSubmission) -> SchedulerResult<PathBuf> {
        match &job.script {
            JobScript::Path(p) => Ok(p.clone()),
            JobScript::Text(t) => {
                let dir = job.workdir.clone().unwrap_or_else(std::env::temp_dir);
                write_script_file(&dir, &job.name, t)
            }
        }
    }
}

/// PBS Pro prints `1234.server`; Torque may print the id alone. Either is the id.
fn parse_qsub_id(stdout: &str) -> Option<&str> {
    let id = stdout.lines().map(str::trim).find(|l| !l.is_empty())?;
    let digits = id.split('.').next()?.split('[').next()?;
    (!digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())).then_some(id)
}

impl Scheduler for PbsScheduler {
    fn backend(&self) -> Backend {
        Backend::Pbs
    }

    /// PBS Pro's `estimated.start_time` of the queued jobs, where the site's scheduler sets it
    /// (Torque and `slurm-wlm-torque` print none: no estimates, as before).
    fn start_estimates(
        &self,
        queued: &[JobHandle],
    ) -> SchedulerResult<HashMap<SchedulerJobId, f64>> {
        let mut estimates = HashMap::new();
        if self.config.flavor != PbsFlavor::Pro {
            return Ok(estimates);
        }
        for chunk in queued.chunks(CHUNK) {
            let ids: Vec<&str> = chunk.iter().map(|j| j.id.as_str()).collect();
            for job in self.qstat(&ids, false)? {
                if let Some(start) = job.estimated_start_s() {
                    estimates.insert(SchedulerJobId::new(job.id), start);
                }
            }
        }
        Ok(estimates)
    }

    fn submit(&self, job: &JobSubmission) -> SchedulerResult<SchedulerJobId> {
        job.validate()?;
        let script = self.script_path(job)?;
        let mut args: Vec<OsString> = vec![
            "-N".into(),
            job.name.clone().into(),
            "-q".into(),
            job.queue.clone().into(),
        ];
        if let Some(log) = &job.log {
            args.extend(["-o".into(), log.into(), "-j".into(), "oe".into()]);
        }
        args.push(script.into());
        let mut call = Call::new(args);
        if let Some(dir) = &job.workdir {
            // PBS_O_WORKDIR is where qsub ran.
            call = call.cwd(dir);
        }
        let qsub = &self.config.qsub;
        let out = match submit_command(&self.runner, qsub, "qsub", call, job, &REFUSALS) {
            Err(SchedulerError::CommandFailed { stderr_tail, .. })
                if stderr_tail.to_lowercase().contains(preflight::BAD_UID) =>
            {
                // Exit 175 says only "Bad UID for job execution": say what it means.
                return Err(SchedulerError::InvalidJob {
                    name: job.name.clone(),
                    reason: format!(
                        "{} (qsub said: {})",
                        preflight::bad_uid_hint(),
                        stderr_tail.trim()
                    ),
                });
            }
            other => other?,
        };
        match parse_qsub_id(&out.stdout) {
            Some(id) => Ok(SchedulerJobId::new(id)),
            None => Err(SchedulerError::UnexpectedOutput {
                command: "qsub".to_string(),
                reason: "expected a job id such as `1234.server`".to_string(),
                output_tail: tail(&out.stdout, 1000),
            }),
        }
    }

    fn poll(&self, jobs: &[JobHandle]) -> SchedulerResult<HashMap<SchedulerJobId, JobState>> {
        let mut states = HashMap::with_capacity(jobs.len());
        for chunk in jobs.chunks(CHUNK) {
            let ids: Vec<&str> = chunk.iter().map(|j| j.id.as_str()).collect();
            let found: HashMap<String, PbsJob> = self
                .qstat(&ids, true)?
                .into_iter()
                .map(|j| (j.id.clone(), j))
                .collect();
            for handle in chunk {
                let state = match lookup(&found, handle.id.as_str()) {
                    Some(job) => {
                        let marker = handle.marker.as_deref().and_then(marker_state);
                        let state = pbs_state(job, self.was_cancelled(&handle.id), marker);
                        if job.get("job_state") == Some("Q") && job.can_never_run().is_some() {
                            self.delete_never_running(handle);
                        }
                        state
                    }
                    None => marker_or(handle, JobState::Unknown),
                };
                states.insert(handle.id.clone(), state);
            }
        }
        Ok(states)
    }

    fn cancel(&self, job: &JobHandle) -> SchedulerResult<()> {
        let id = &job.id;
        self.cancelled
            .lock()
            .expect("cancel set lock poisoned. This is a bug.")
            .insert(id.clone());
        match self
            .runner
            .run(&self.config.qdel, "qdel", Call::new([id.as_str()]))
        {
            Ok(_) => Ok(()),
            Err(err @ SchedulerError::CommandFailed { .. }) => {
                // qdel of a finished job fails; that job needs no cancelling.
                let handle = JobHandle::new(id.clone());
                match self.poll(std::slice::from_ref(&handle))?.get(id) {
                    Some(s) if s.is_terminal() => Ok(()),
                    _ => Err(err),
                }
            }
            Err(err) => Err(err),
        }
    }

    fn job_limit(&self, queues: &[String]) -> SchedulerResult<Option<super::JobLimit>> {
        self.read_job_limit(queues)
    }

    fn preflight(&self, run_dir: &Path) -> Vec<QueueProblem> {
        self.check_queues(run_dir)
    }

    fn known_queues(&self) -> Option<Vec<String>> {
        self.queue_names()
    }

    fn list_jobs(&self) -> SchedulerResult<Vec<QueuedJob>> {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .ok();
        let jobs = self.qstat(&[], false)?;
        Ok(jobs
            .iter()
            .filter(|j| match (&user, j.get("Job_Owner")) {
                (Some(u), Some(owner)) => owner.split('@').next() == Some(u.as_str()),
                _ => true,
            })
            .map(|j| QueuedJob {
                id: SchedulerJobId::new(j.id.clone()),
                name: j.get("Job_Name").unwrap_or("").to_string(),
                queue: j.get("queue").unwrap_or("").to_string(),
                state: pbs_state(j, false, None),
            })
            .collect())
    }
}

/// Finds a job by id; PBS may print the id with a longer server suffix than was asked for
/// (`1234.pbs01` asked, `1234.pbs01.example.org` printed).
fn lookup<'a>(found: &'a HashMap<String, PbsJob>, id: &str) -> Option<&'a PbsJob> {
    // `long` is `short` plus a further `.domain` part.
    let extends = |long: &str, short: &str| {
        long.strip_prefix(short)
            .is_some_and(|rest| rest.starts_with('.'))
    };
    found.get(id).or_else(|| {
        found
            .iter()
            .find(|(k, _)| extends(k, id) || extends(id, k))
            .map(|(_, v)| v)
    })
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
        cause: source,
    })?;
    Ok(path)
}
