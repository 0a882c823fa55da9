//! A job's files in the run directory and how it is handed to the scheduler: its script is
//! written (readable by its owner only), an old completion marker of its name removed, and
//! the submission points the scheduler at the script, the log and the marker. The submit
//! loop's embed jobs and the one-off jobs ([`crate::oneshot`]) go the same way.

use std::path::{Path, PathBuf};

use embedfleet_core::RunLayout;

use super::error::{Result, SubmitError};
use crate::scheduler::{JobScript, JobSubmission, SchedulerConfig, ScriptConfig, ScriptJob};

/// The files of the job named `name`: `jobs/<name>.sh`, `logs/<name>.log`, and the marker its
/// script writes its exit code to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobFiles {
    pub name: String,
    pub script: PathBuf,
    pub log: PathBuf,
    pub marker: PathBuf,
}

impl JobFiles {
    pub fn new(layout: &RunLayout, name: &str) -> Self {
        Self {
            name: name.to_string(),
            script: layout.job_script(name),
            log: layout.job_log(name),
            marker: layout.job_marker(name),
        }
    }

    /// What the job's script is rendered from: the job `embedfleet` runs in `run_dir` on
    /// `queue` for `batches` (one per node), its output and marker these files.
    pub fn script_job(
        &self,
        queue: &str,
        run_dir: &Path,
        batches: Vec<u64>,
        embed_args: Vec<String>,
    ) -> ScriptJob {
        ScriptJob {
            job_name: self.name.clone(),
            queue: queue.to_string(),
            run_dir: run_dir.to_path_buf(),
            batches,
            output: self.log.clone(),
            error: None,
            marker: Some(self.marker.clone()),
            embed_args,
        }
    }

    /// Writes the script and removes a marker an earlier job of the name may have left.
    pub fn write_script(&self, text: &str) -> Result<()> {
        write_private(&self.script, text).map_err(|source| SubmitError::Io {
            action: "write job script",
            path: self.script.clone(),
            cause: source,
        })?;
        let _ = std::fs::remove_file(&self.marker);
        Ok(())
    }

    /// The job as the scheduler takes it: to `queue`, started in `run_dir`.
    pub fn submission(&self, queue: &str, run_dir: &Path) -> JobSubmission {
        JobSubmission::new(&self.name, queue, JobScript::Path(self.script.clone()))
            .workdir(run_dir)
            .log(&self.log)
            .marker(&self.marker)
    }
}

/// The script settings of a job on `queue`: the backend's for that queue
/// ([`BackendKind::queue_script`](crate::scheduler::BackendKind::queue_script)), with the
/// binary its jobs run set to `exe` (this binary) unless they name one.
pub(crate) fn with_binary(scheduler: &SchedulerConfig, queue: &str, exe: &Path) -> ScriptConfig {
    let mut config = scheduler.backend.kind().queue_script(scheduler, queue);
    if config.embedfleet.is_none() {
        config.embedfleet = Some(exe.display().to_string());
    }
    config
}

/// Writes a job script readable by its owner only (and the run's group, in a group run: see
/// `embedfleet_core::access`): it holds the run config's `env` values, which may be secrets. A
/// new file renamed over the old one, never opened through a link planted at either name.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use embedfleet_core::access::Reach;
    let dir = path.parent().unwrap_or(Path::new("."));
    // The jobs folder was made with the run's reach; a script has the same.
    let mode = Reach::of_run_dir(dir).script_mode();
    embedfleet_core::atomic::write_with_mode(path, text.as_bytes(), mode)
}
