/*!
The Slurm backend: `sbatch --parsable`, `squeue`, `scancel`, and for final states `sacct`, then
`scontrol show job`, then the job's completion marker.
*/

mod limits;
mod parse;

use std::collections::HashMap;
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::command::tail;
use super::{
    marker_or, submit_command, Backend, BackendKind, Call, CommandConfig, CommandOutput,
    CommandRunner, JobHandle, JobLimit, JobScript, JobState, JobSubmission, ProgramConfig,
    QueuedJob,
    Refusals, Scheduler, SchedulerConfig, SchedulerError, SchedulerJobId, SchedulerResult,
    ScriptConfig,
};
pub use parse::{
    parse_sacct, parse_scontrol, parse_squeue, parse_start_estimates, parse_test_only, slurm_state, SlurmRecord,
};
use parse::{SACCT_FIELDS, SQUEUE_FORMAT};

/// Built-in Slurm template.
pub const SLURM_TEMPLATE: &str = "#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --partition={queue}
#SBATCH --account={account}
#SBATCH --time={walltime}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --output={output}
#SBATCH --error={error}
#SBATCH --no-requeue
{extra_directives}
{module_lines}
{env_lines}
{setup_lines}
{command}
{finish}
";

/// What `sbatch` answers when repeating cannot help.
const REFUSALS: Refusals = Refusals {
    unknown_queue: &["invalid partition"],
    permanent: &[
        "invalid account",
        "invalid qos",
        "unable to open file",
        "no such file",
    ],
    list_queues: "sinfo -s",
};

/// The Slurm backend's hooks.
pub struct SlurmBackend;

impl BackendKind for SlurmBackend {
    fn build(&self, config: &SchedulerConfig) -> Box<dyn Scheduler> {
        Box::new(SlurmScheduler::new(
            config.slurm.clone(),
            config.command.clone(),
        ))
    }

    fn template(&self) -> &'static str {
        SLURM_TEMPLATE
    }

    fn launcher(&self, nodes: usize) -> Option<String> {
        Some(format!(
            "srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1"
        ))
    }

    /// `%%` for each `%`: sbatch reads `%` in `--output`/`--error` as a pattern (`%j`, `%x`),
    /// so a run directory with a `%` in its path would send the log elsewhere, where the
    /// breaker and `status` never find it.
    fn log_path(&self, path: &str) -> String {
        path.replace('%', "%%")
    }

    fn cpu_job(&self, script: &mut ScriptConfig, cpus: u32, memory_mib: u64) {
        script
            .extra_directives
            .push(format!("#SBATCH --cpus-per-task={cpus}"));
        script
            .extra_directives
            .push(format!("#SBATCH --mem={memory_mib}M"));
    }
}

/// Job ids per `squeue`/`sacct` call, to keep command lines short.
const CHUNK: usize = 500;

/// Whether final states come from `sacct`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SacctMode {
    /// Use `sacct`; stop asking once it says accounting is disabled.
    #[default]
    Auto,
    /// Never call `sacct`.
    Never,
}

/// The `[scheduler.slurm]` table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlurmConfig {
    /// `sbatch` path and extra arguments (e.g. `["--qos=normal"]`).
    pub sbatch: ProgramConfig,
    /// `squeue`.
    pub squeue: ProgramConfig,
    /// `scancel`.
    pub scancel: ProgramConfig,
    /// `sacct`.
    pub sacct: ProgramConfig,
    /// `scontrol`.
    pub scontrol: ProgramConfig,
    /// `sacctmgr` (the job limits of the user's association and QOS). Added after runs had
    /// stored their configs: left unset, it is not written, so such a config reads back and is
    /// written again key for key.
    #[serde(skip_serializing_if = "ProgramConfig::is_unset")]
    pub sacctmgr: ProgramConfig,
    /// Whether to use `sacct`.
    pub use_sacct: SacctMode,
}

/// Slurm through its command-line tools.
#[derive(Debug)]
pub struct SlurmScheduler {
    config: SlurmConfig,
    runner: CommandRunner,
    /// Set once `sacct` reports that accounting is disabled.
    sacct_off: AtomicBool,
}

impl SlurmScheduler {
    /// A Slurm backend with these command paths and this command policy.
    pub fn new(config: SlurmConfig, command: CommandConfig) -> Self {
        let sacct_off = AtomicBool::new(config.use_sacct == SacctMode::Never);
        Self {
            config,
            runner: CommandRunner::new(command),
            sacct_off,
        }
    }

    /// `squeue --states=all` for `ids`; jobs Slurm has forgotten are simply absent.
    fn squeue(&self, ids: &[&str]) -> SchedulerResult<Vec<SlurmRecord>> {
        let args = vec![
            "-h".to_string(),
            "--states=all".to_string(),
            "-o".to_string(),
            SQUEUE_FORMAT.to_string(),
            "-j".to_string(),
            ids.join(","),
        ];
        // A single unknown id makes squeue exit 1 with this message; that is an answer.
        let accept = |o: &CommandOutput| {
            o.status.success()
                || (o.status.code() == Some(1) && o.stderr.contains("Invalid job id specified"))
        };
        let out = self.runner.run(
            &self.config.squeue,
            "squeue",
            Call::new(args).accept(&accept),
        )?;
        parse_squeue(&out.stdout).map_err(|reason| unexpected("squeue", reason, &out.stdout))
    }

    /// `sacct` for `ids`, or `None` when accounting is off or `sacct` fails (then the caller
    /// falls back; a failing `sacct` must not stop polling when `squeue` works).
    fn sacct(&self, ids: &[&str]) -> Option<Vec<SlurmRecord>> {
        if self.sacct_off.load(Ordering::Relaxed) || ids.is_empty() {
            return None;
        }
        let args = ["-n", "-X", "-P", "-o", SACCT_FIELDS, "-j"]
            .iter()
            .map(|s| s.to_string())
            .chain([ids.join(",")])
            .collect::<Vec<_>>();
        let disabled = |o: &CommandOutput| accounting_disabled(&o.stderr);
        let call = Call::new(args).permanent(&disabled);
        match self.runner.run(&self.config.sacct, "sacct", call) {
            Ok(out) => match parse_sacct(&out.stdout) {
                Ok(rows) => Some(rows),
                Err(reason) => {
                    tracing::warn!(%reason, "ignoring unreadable sacct output");
                    None
                }
            },
            Err(SchedulerError::CommandFailed { stderr_tail, .. })
                if accounting_disabled(&stderr_tail) =>
            {
                tracing::info!("Slurm accounting is disabled; final job states come from squeue, scontrol and completion markers");
                self.sacct_off.store(true, Ordering::Relaxed);
                None
            }
            Err(err) => {
                tracing::warn!(error = %err, "sacct failed; falling back to scontrol and completion markers");
                None
            }
        }
    }

    /// `scontrol show job -o ID` for the exit code of a failed job Slurm still remembers.
    fn scontrol(&self, id: &str) -> Option<SlurmRecord> {
        let call = Call::new(["show", "job", "-o", id]);
        let out = self
            .runner
            .run(&self.config.scontrol, "scontrol", call)
            .ok()?;
        parse_scontrol(&out.stdout)
            .ok()?
            .into_iter()
            .find(|r| r.id == id)
    }

    fn poll_chunk(
        &self,
        jobs: &[JobHandle],
        states: &mut HashMap<SchedulerJobId, JobState>,
    ) -> SchedulerResult<()> {
        let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        let mut known: HashMap<String, SlurmRecord> = self
            .squeue(&ids)?
            .into_iter()
            .map(|r| (r.id.clone(), r))
            .collect();
        // Finished or forgotten jobs: sacct has the exit code and outlives squeue's memory.
        let need: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| known.get(*id).is_none_or(|r| r.job_state().is_terminal()))
            .collect();
        for row in self.sacct(&need).unwrap_or_default() {
            if need.contains(&row.id.as_str()) {
                merge_sacct(&mut known, row);
            }
        }
        for job in jobs {
            let state = match known.get(job.id.as_str()) {
                Some(r) if r.exit.is_none() && matches!(r.job_state(), JobState::Failed { .. }) => {
                    self.scontrol(&r.id)
                        .unwrap_or_else(|| r.clone())
                        .job_state()
                }
                Some(r) => r.job_state(),
                None => marker_or(job, JobState::Unknown),
            };
            states.insert(job.id.clone(), state);
        }
        Ok(())
    }
}

/// Takes a `sacct` row over what `squeue` said, unless `sacct` lags behind: slurmdbd may not
/// have recorded the end of a job that slurmctld already reports as ended.
/// What `sbatch` is told of `job` besides its script: name, partition, directory, log.
fn sbatch_args(job: &JobSubmission) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        format!("--job-name={}", job.name).into(),
        format!("--partition={}", job.queue).into(),
    ];
    if let Some(dir) = &job.workdir {
        args.push(format!("--chdir={}", dir.display()).into());
    }
    if let Some(log) = &job.log {
        let log = SlurmBackend.log_path(&log.display().to_string());
        args.push(format!("--output={log}").into());
    }
    args
}

/// `sbatch ARGS` with `job`'s script: its path as the last argument, or its text on stdin.
fn with_script(mut args: Vec<OsString>, job: &JobSubmission) -> Call<'_> {
    match &job.script {
        JobScript::Path(p) => {
            args.push(p.into());
            Call::new(args)
        }
        JobScript::Text(t) => Call::new(args).stdin(t.as_bytes()),
    }
}

fn merge_sacct(known: &mut HashMap<String, SlurmRecord>, mut row: SlurmRecord) {
    let row_final = row.job_state().is_terminal();
    if known.contains_key(&row.id) && !row_final {
        return;
    }
    // A FAILED row whose exit code is still 0:0 has no real exit code yet.
    if matches!(row.job_state(), JobState::Failed { .. }) && row.exit == Some((0, 0)) {
        row.exit = None;
    }
    if let Some(prev) = known.get(&row.id) {
        row.partition.clone_from(&prev.partition);
        row.name.clone_from(&prev.name);
    }
    known.insert(row.id.clone(), row);
}

fn accounting_disabled(stderr: &str) -> bool {
    stderr.contains("accounting storage is disabled")
        || stderr.contains("not running a supported accounting_storage plugin")
}

fn unexpected(cmd: &str, reason: String, output: &str) -> SchedulerError {
    SchedulerError::UnexpectedOutput {
        command: cmd.to_string(),
        reason,
        output_tail: tail(output, 1000),
    }
}

impl Scheduler for SlurmScheduler {
    fn backend(&self) -> Backend {
        Backend::Slurm
    }

    fn submit(&self, job: &JobSubmission) -> SchedulerResult<SchedulerJobId> {
        job.validate()?;
        let mut args: Vec<OsString> = vec!["--parsable".into()];
        args.extend(sbatch_args(job));
        let call = with_script(args, job);
        let sbatch = &self.config.sbatch;
        let out = submit_command(&self.runner, sbatch, "sbatch", call, job, &REFUSALS)?;
        // `--parsable` prints `ID` or `ID;CLUSTER`.
        let id = out.stdout.trim().split(';').next().unwrap_or("").trim();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
            return Err(unexpected(
                "sbatch --parsable",
                "expected a job id".into(),
                &out.stdout,
            ));
        }
        Ok(SchedulerJobId::new(id))
    }

    fn poll(&self, jobs: &[JobHandle]) -> SchedulerResult<HashMap<SchedulerJobId, JobState>> {
        let mut states = HashMap::with_capacity(jobs.len());
        for chunk in jobs.chunks(CHUNK) {
            self.poll_chunk(chunk, &mut states)?;
        }
        Ok(states)
    }

    fn cancel(&self, job: &JobHandle) -> SchedulerResult<()> {
        // scancel of a job that already ended exits 0 (or says so); both are fine.
        let ended =
            |o: &CommandOutput| o.status.success() || o.stderr.contains("already completed");
        self.runner
            .run(
                &self.config.scancel,
                "scancel",
                Call::new([job.id.as_str()]).accept(&ended),
            )
            .map(|_| ())
    }

    fn new_job_start(&self, job: &JobSubmission) -> SchedulerResult<Option<f64>> {
        job.validate()?;
        let mut args: Vec<OsString> = vec!["--test-only".into()];
        args.extend(sbatch_args(job));
        // A partition that would never start it, or refuses it, says so on stderr with a
        // non-zero exit: that is no estimate, not an error of the loop's.
        let any = |_: &CommandOutput| true;
        let out = self.runner.run(
            &self.config.sbatch,
            "sbatch",
            with_script(args, job).accept(&any),
        )?;
        Ok(parse::parse_test_only(&out.stderr).or_else(|| parse::parse_test_only(&out.stdout)))
    }

    fn start_estimates(
        &self,
        queued: &[JobHandle],
    ) -> SchedulerResult<HashMap<SchedulerJobId, f64>> {
        let mut estimates = HashMap::new();
        for chunk in queued.chunks(CHUNK) {
            let ids: Vec<&str> = chunk.iter().map(|j| j.id.as_str()).collect();
            let args = vec![
                "--start".to_string(),
                "-h".to_string(),
                "-o".to_string(),
                parse::SQUEUE_START_FORMAT.to_string(),
                "-j".to_string(),
                ids.join(","),
            ];
            // A job that started or ended meanwhile is simply not listed.
            let accept = |o: &CommandOutput| {
                o.status.success()
                    || (o.status.code() == Some(1) && o.stderr.contains("Invalid job id"))
            };
            let out = self.runner.run(
                &self.config.squeue,
                "squeue",
                Call::new(args).accept(&accept),
            )?;
            for (id, start_s) in parse_start_estimates(&out.stdout) {
                estimates.insert(SchedulerJobId::new(id), start_s);
            }
        }
        Ok(estimates)
    }

    fn job_limit(&self, queues: &[String]) -> SchedulerResult<Option<JobLimit>> {
        self.read_job_limit(queues)
    }

    fn list_jobs(&self) -> SchedulerResult<Vec<QueuedJob>> {
        let call = Call::new(["-h", "--me", "-o", SQUEUE_FORMAT]);
        let out = self.runner.run(&self.config.squeue, "squeue", call)?;
        let rows =
            parse_squeue(&out.stdout).map_err(|r| unexpected("squeue --me", r, &out.stdout))?;
        Ok(rows
            .into_iter()
            .map(|r| QueuedJob {
                state: r.job_state(),
                id: SchedulerJobId::new(r.id),
                name: r.name,
                queue: r.partition,
            })
            .collect())
    }
}
