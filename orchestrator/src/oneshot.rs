/*!
One job of another embedfleet subcommand sent through the run's scheduler and waited for by
the run's owner: the query job (`query --submit` runs `embedfleet query-job` on a GPU node).

It is the submit loop's machinery, not a second one: the script comes from the same template
([`render_command_script`]: directives, modules, env, setup lines, the completion marker), the
files go where the embed jobs' go (`jobs/`, `logs/`), the name carries the run's tag
([`run_tag`]) and fits PBS like theirs ([`fit_job_name`]), and it is polled through the same
[`Scheduler`]. Its record is not a row of run.db's `jobs` table (that table is the embed
jobs', one row per batch): the caller keeps the [`OneShotJob`] it gets back (the query job's in
its work folder), so a restarted owner finds the job again instead of submitting a twin.
*/

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use embedfleet_core::RunLayout;
use serde::{Deserialize, Serialize};

use crate::scheduler::{
    render_command_script, Backend, JobHandle, JobState, Scheduler, SchedulerConfig,
    SchedulerError, SchedulerJobId,
};
use crate::submit::{fit_job_name, run_tag, with_binary, JobFiles, SubmitError};

/// A one-off job as submitted; what the caller keeps to find it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OneShotJob {
    pub name: String,
    pub attempt: u32,
    pub backend: Backend,
    pub queue: String,
    pub scheduler_id: String,
    pub script: PathBuf,
    pub log: PathBuf,
    pub marker: PathBuf,
}

impl OneShotJob {
    pub fn handle(&self) -> JobHandle {
        JobHandle::new(SchedulerJobId::new(&self.scheduler_id))
            .with_name(&self.name)
            .with_marker(&self.marker)
    }
}

/// What to run: `embedfleet ARGS...` on `queue`, named `ef<tag>-<kind><attempt>`.
#[derive(Debug, Clone)]
pub struct OneShot<'a> {
    pub run_dir: &'a Path,
    pub scheduler: &'a SchedulerConfig,
    /// The embedfleet binary the job runs when the run config does not name one.
    pub exe: &'a Path,
    pub queue: &'a str,
    /// Part of the name after the run's tag, e.g. `q0123abcd-a` (letters, digits, `-`).
    pub kind: &'a str,
    pub attempt: u32,
    /// The arguments after the binary.
    pub args: Vec<String>,
}

impl OneShot<'_> {
    pub fn name(&self) -> String {
        fit_job_name(
            self.scheduler.backend,
            format!("ef{}-{}{}", run_tag(self.run_dir), self.kind, self.attempt),
        )
    }

    /// The job's files and its script's text.
    fn render(&self) -> Result<(JobFiles, String), SubmitError> {
        let config = with_binary(self.scheduler, self.queue, self.exe);
        let files = JobFiles::new(&RunLayout::new(self.run_dir), &self.name());
        let job = files.script_job(self.queue, self.run_dir, vec![0], Vec::new());
        let backend = self.scheduler.backend;
        let text = render_command_script(backend, &config, &job, &self.args)?;
        Ok((files, text))
    }

    /// Writes the script into `jobs/` and submits it.
    pub fn submit(&self, scheduler: &dyn Scheduler) -> Result<OneShotJob, SubmitError> {
        let layout = RunLayout::new(self.run_dir);
        for dir in [layout.job_dir(), layout.log_dir()] {
            std::fs::create_dir_all(&dir).map_err(|source| SubmitError::Io {
                action: "create",
                path: dir,
                cause: source,
            })?;
        }
        let (files, text) = self.render()?;
        files.write_script(&text)?;
        let id = scheduler.submit(&files.submission(self.queue, self.run_dir))?;
        Ok(OneShotJob {
            name: files.name,
            attempt: self.attempt,
            backend: self.scheduler.backend,
            queue: self.queue.to_string(),
            scheduler_id: id.as_str().to_string(),
            script: files.script,
            log: files.log,
            marker: files.marker,
        })
    }
}

/// The run's scheduler settings for a CPU job of one node (a group's shard build): no GPUs,
/// and `cpus` cores and `memory_mib` of memory asked for where the backend takes directives
/// (Slurm `--cpus-per-task`/`--mem`, PBS `ncpus`/`mem` in the select). The run config's own
/// extra directives, modules, env and setup lines stay: they are the site's (account,
/// filesystems), not the GPU jobs' alone.
pub fn cpu_job_config(scheduler: &SchedulerConfig, cpus: u32, memory_mib: u64) -> SchedulerConfig {
    let mut config = scheduler.clone();
    config.script.nodes = 1;
    config.script.gpus_per_node = None;
    let backend = config.backend.kind();
    backend.cpu_job(&mut config.script, cpus, memory_mib);
    config
}

/// The job's state now; a scheduler that does not know it and no completion marker is
/// [`JobState::Unknown`].
pub fn state(scheduler: &dyn Scheduler, job: &OneShotJob) -> Result<JobState, SchedulerError> {
    let handle = job.handle();
    let states = scheduler.poll(std::slice::from_ref(&handle))?;
    Ok(states.get(&handle.id).cloned().unwrap_or(JobState::Unknown))
}

/// Polls `job` every `interval` until it ends (or has been unknown to the scheduler, with no
/// completion marker, for `lost_after`: then it is cancelled and reported failed, lost).
/// `each(state)` after every poll; a scheduler command that fails transiently is retried at
/// the next poll.
pub fn wait(
    scheduler: &dyn Scheduler,
    job: &OneShotJob,
    interval: Duration,
    lost_after: Duration,
    mut each: impl FnMut(&JobState),
) -> Result<JobState, SchedulerError> {
    let mut unknown_since: Option<Instant> = None;
    loop {
        match state(scheduler, job) {
            Ok(JobState::Unknown) => {
                let since = *unknown_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= lost_after {
                    let _ = scheduler.cancel(&job.handle());
                    return Ok(JobState::Failed {
                        exit_code: None,
                        reason: format!(
                            "lost: the scheduler has not known the job for {lost_after:?} and it left no completion marker"
                        ),
                    });
                }
                each(&JobState::Unknown);
            }
            Ok(s) if s.is_terminal() => return Ok(s),
            Ok(s) => {
                unknown_since = None;
                each(&s);
            }
            Err(e) if e.is_transient() => {
                tracing::info!(job = %job.name, "polling failed ({e}); will try again");
            }
            Err(e) => return Err(e),
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script_of(backend: Backend, gpus: Option<u32>, select_extra: Option<&str>) -> String {
        let dir = tempfile::tempdir().unwrap();
        let mut config = SchedulerConfig {
            backend,
            ..SchedulerConfig::default()
        };
        config.script.gpus_per_node = gpus;
        config.script.nodes = 2;
        config.script.select_extra = select_extra.map(str::to_string);
        config.script.account = Some("proj".into());
        let cpu = cpu_job_config(&config, 8, 6144);
        OneShot {
            run_dir: dir.path(),
            scheduler: &cpu,
            exe: Path::new("/opt/embedfleet"),
            queue: "cpu",
            kind: "g3-a",
            attempt: 1,
            args: vec!["build-shard".into(), "--request".into(), "r.json".into()],
        }
        .render()
        .unwrap()
        .1
    }

    #[test]
    fn a_cpu_job_asks_slurm_for_cores_and_memory_and_no_gpus() {
        let s = script_of(Backend::Slurm, Some(4), None);
        assert!(s.contains("#SBATCH --cpus-per-task=8\n"), "{s}");
        assert!(s.contains("#SBATCH --mem=6144M\n"), "{s}");
        assert!(s.contains("#SBATCH --nodes=1\n"), "{s}");
        assert!(s.contains("#SBATCH --account=proj\n"), "{s}");
        assert!(!s.contains("gpus"), "{s}");
        assert!(
            s.contains("/opt/embedfleet build-shard --request r.json"),
            "{s}"
        );
    }

    #[test]
    fn a_cpu_job_puts_cores_and_memory_in_the_pbs_select_before_the_sites_own() {
        let s = script_of(Backend::Pbs, Some(4), Some("system=polaris"));
        assert!(
            s.contains("#PBS -l select=1:ncpus=8:mem=6144mb:system=polaris\n"),
            "{s}"
        );
        assert!(!s.contains("ngpus"), "{s}");
        let plain = script_of(Backend::Pbs, None, None);
        assert!(
            plain.contains("#PBS -l select=1:ncpus=8:mem=6144mb\n"),
            "{plain}"
        );
    }

    #[test]
    fn a_local_cpu_job_has_no_directives() {
        let s = script_of(Backend::Local, Some(4), None);
        assert!(!s.contains("#SBATCH") && !s.contains("#PBS"), "{s}");
        assert!(s.contains("build-shard --request r.json"), "{s}");
    }
}
