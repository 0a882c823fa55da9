/*!
The local backend: each job is a child process (`bash SCRIPT`) in its own process group.

States come from the child's wait status. Cancelling sends SIGTERM to the group, waits a grace
period, then sends SIGKILL, on a helper thread so `cancel` returns at once. Jobs started by an
earlier process (a restarted submit loop) are not our children: their state comes from their
completion marker, or "running" while their process group leader is alive and carries the
job's name in its environment (a pid alone may have been reused by another process).
*/

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use embedfleet_core::process;
use serde::{Deserialize, Serialize};

use super::{
    marker_or, seconds_problem, Backend, BackendKind, JobHandle, JobScript, JobState,
    JobSubmission, QueuedJob, Scheduler, SchedulerConfig, SchedulerError, SchedulerJobId,
    SchedulerResult, SubmitDefaults,
};

/// Built-in local template: no directives.
pub const LOCAL_TEMPLATE: &str = "#!/bin/bash
# embedfleet local job {job_name} (queue {queue})
{env_lines}
{setup_lines}
{command}
{finish}
";

/// The local backend's hooks.
pub struct LocalBackend;

impl BackendKind for LocalBackend {
    fn build(&self, config: &SchedulerConfig) -> Box<dyn Scheduler> {
        Box::new(LocalScheduler::new(config.local.clone()))
    }

    fn problems(&self, config: &SchedulerConfig) -> Vec<String> {
        let grace = config.local.grace_secs;
        seconds_problem("[scheduler.local] grace_secs", grace, true)
            .into_iter()
            .collect()
    }

    fn template(&self) -> &'static str {
        LOCAL_TEMPLATE
    }

    /// On the CPU, one queue of two jobs at once, and quick polls: jobs here start at once.
    fn defaults(&self, _config: &SchedulerConfig) -> SubmitDefaults {
        SubmitDefaults {
            devices: "cpu".to_string(),
            queues: Some((
                BTreeMap::from([("local".to_string(), 2)]),
                "one local queue `local` of 2 jobs at once".to_string(),
            )),
            poll_interval: Duration::from_secs(1),
            lost_after: Duration::from_secs(10),
        }
    }
}

/// The `[scheduler.local]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// Shell that runs job scripts.
    pub shell: PathBuf,
    /// Seconds between SIGTERM and SIGKILL when a job is cancelled.
    pub grace_secs: f64,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            shell: PathBuf::from("/bin/bash"),
            grace_secs: 10.0,
        }
    }
}

#[derive(Debug)]
struct LocalJob {
    name: String,
    queue: String,
    /// `None` while a cancel thread owns the child.
    child: Option<Child>,
    exit: Option<ExitStatus>,
    cancelled: bool,
}

type Jobs = Arc<Mutex<HashMap<SchedulerJobId, LocalJob>>>;

/// Runs jobs as local child processes.
#[derive(Debug, Default)]
pub struct LocalScheduler {
    config: LocalConfig,
    jobs: Jobs,
}

impl LocalScheduler {
    /// A local backend.
    pub fn new(config: LocalConfig) -> Self {
        Self {
            config,
            jobs: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SchedulerJobId, LocalJob>> {
        self.jobs
            .lock()
            .expect("local job table lock poisoned. This is a bug.")
    }
}

/// The state of a job that has exited.
fn exit_state(status: ExitStatus, cancelled: bool) -> JobState {
    match (status.code(), status.signal()) {
        (Some(0), _) => JobState::Completed,
        _ if cancelled => JobState::Cancelled,
        (Some(code), _) => JobState::from_exit_code(code),
        (None, sig) => JobState::Failed {
            exit_code: None,
            reason: format!("killed by signal {}", sig.unwrap_or(0)),
        },
    }
}

/// The pid a local job id names (the job's process group leader).
fn pid_of(id: &SchedulerJobId) -> Option<i32> {
    id.as_str().parse::<i32>().ok().filter(|pid| *pid > 0)
}

/// The environment of process `pid` as `/proc/<pid>/environ` shows it (`KEY=value` entries,
/// each ended by a NUL byte); `None` when it cannot be read: the process ended, or it belongs
/// to another user (the kernel shows a process's environment to its own user only).
fn process_environ(pid: i32) -> Option<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ")).ok()
}

/// The value of `key` in an environment read by [`process_environ`].
fn environ_var(environ: &[u8], key: &str) -> Option<String> {
    environ.split(|b| *b == 0).find_map(|kv| {
        kv.strip_prefix(key.as_bytes())
            .and_then(|v| v.strip_prefix(b"="))
            .map(|v| String::from_utf8_lossy(v).into_owned())
    })
}

fn leads_its_group(pid: i32) -> bool {
    // SAFETY: getpgid only reads the process table.
    unsafe { libc::getpgid(pid) == pid }
}

/// Whether process `pid` is the job submitted as `name`: it leads its own process group and
/// carries the `EMBEDFLEET_JOB_NAME` that [`LocalScheduler::submit`] gave the job. A pid alone
/// proves nothing: after a reboot, or once pids wrap around, it may be any other process.
///
/// A process whose environment cannot be read is not taken for the job. Our jobs run as this
/// user and never hide their environment, so such a process is almost surely someone else's;
/// and the cost of the two mistakes differs. Taken for gone, a job of ours is run again after
/// `--lost-after` (attempts never share files, so that is waste, not harm). Taken for the job,
/// another process would keep its batch "running" forever and could have its group signalled.
fn is_the_job(pid: i32, name: &str) -> bool {
    leads_its_group(pid)
        && process_environ(pid)
            .and_then(|env| environ_var(&env, "EMBEDFLEET_JOB_NAME"))
            .is_some_and(|found| found == name)
}

/// State of a job this process did not start: running while its pid is still the job (see
/// [`is_the_job`]), else unknown (its completion marker, if any, says how it ended). A handle
/// without the job's name cannot tell the job from a stranger with its pid: unknown.
fn foreign_state(job: &JobHandle) -> JobState {
    match (pid_of(&job.id), job.name.as_deref()) {
        (Some(pid), Some(name)) if is_the_job(pid, name) => JobState::Running,
        _ => JobState::Unknown,
    }
}

/// Jobs an earlier process started that still run: process group leaders whose environment
/// has the `EMBEDFLEET_JOB_NAME` that [`LocalScheduler::submit`] sets. This is how a restarted
/// submit loop finds a job whose pid its predecessor did not live to record.
fn foreign_jobs() -> Vec<QueuedJob> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut jobs = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // Unreadable (another user's process, or it just ended): not ours.
        let Some(environ) = process_environ(pid) else {
            continue;
        };
        let Some(name) = environ_var(&environ, "EMBEDFLEET_JOB_NAME") else {
            continue;
        };
        if leads_its_group(pid) {
            jobs.push(QueuedJob {
                id: SchedulerJobId::new(pid.to_string()),
                name,
                queue: environ_var(&environ, "EMBEDFLEET_QUEUE").unwrap_or_default(),
                state: JobState::Running,
            });
        }
    }
    jobs
}

/// SIGTERM the group, wait up to `grace` for the leader, SIGKILL the group (stragglers too),
/// reap, and record the exit.
fn terminate(jobs: Jobs, id: SchedulerJobId, mut child: Child, grace: Duration) {
    let status = process::terminate_group(&mut child, grace);
    let mut table = jobs
        .lock()
        .expect("local job table lock poisoned. This is a bug.");
    if let Some(job) = table.get_mut(&id) {
        job.exit = status.ok();
        if job.exit.is_none() {
            tracing::warn!(%id, "could not reap cancelled local job");
        }
    }
}

impl Scheduler for LocalScheduler {
    fn backend(&self) -> Backend {
        Backend::Local
    }

    fn submit(&self, job: &JobSubmission) -> SchedulerResult<SchedulerJobId> {
        job.validate()?;
        let mut cmd = Command::new(&self.config.shell);
        match &job.script {
            JobScript::Path(p) => cmd.arg(p),
            JobScript::Text(t) => cmd.arg("-c").arg(t),
        };
        if let Some(dir) = &job.workdir {
            cmd.current_dir(dir);
        }
        let (out, err) = match &job.log {
            Some(path) => {
                // Never through a link someone planted at the log's name.
                let open = || embedfleet_core::access::open_append(path, 0o600);
                let io = |source| SchedulerError::Io {
                    action: "open log file",
                    path: path.clone(),
                    cause: source,
                };
                let f = open().map_err(io)?;
                let f2 = f.try_clone().map_err(io)?;
                (Stdio::from(f), Stdio::from(f2))
            }
            None => (Stdio::null(), Stdio::null()),
        };
        process::in_own_group(cmd.stdin(Stdio::null()).stdout(out).stderr(err));
        cmd.env("EMBEDFLEET_JOB_NAME", &job.name)
            .env("EMBEDFLEET_QUEUE", &job.queue);
        let child = cmd.spawn().map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => SchedulerError::CommandNotFound {
                program: format!(
                    "{} (or the job's working directory)",
                    self.config.shell.display()
                ),
            },
            _ => SchedulerError::CommandSpawn {
                command: self.config.shell.display().to_string(),
                cause: source,
            },
        })?;
        let id = SchedulerJobId::new(child.id().to_string());
        let entry = LocalJob {
            name: job.name.clone(),
            queue: job.queue.clone(),
            child: Some(child),
            exit: None,
            cancelled: false,
        };
        self.lock().insert(id.clone(), entry);
        Ok(id)
    }

    fn poll(&self, jobs: &[JobHandle]) -> SchedulerResult<HashMap<SchedulerJobId, JobState>> {
        let mut table = self.lock();
        let mut states = HashMap::with_capacity(jobs.len());
        for handle in jobs {
            let state = match table.get_mut(&handle.id) {
                None => marker_or(handle, foreign_state(handle)),
                Some(job) => {
                    if job.exit.is_none() {
                        if let Some(child) = job.child.as_mut() {
                            job.exit = child.try_wait().map_err(|source| SchedulerError::Io {
                                action: "wait for local job",
                                path: PathBuf::from(format!("/proc/{}", handle.id)),
                                cause: source,
                            })?;
                        }
                    }
                    match job.exit {
                        Some(status) => exit_state(status, job.cancelled),
                        None => JobState::Running,
                    }
                }
            };
            states.insert(handle.id.clone(), state);
        }
        Ok(states)
    }

    fn cancel(&self, handle: &JobHandle) -> SchedulerResult<()> {
        let id = &handle.id;
        let mut table = self.lock();
        let Some(job) = table.get_mut(id) else {
            // Not our child: signal its group only while its pid is still the job, never a
            // stranger that reuses the pid. (The check and the signal are not atomic; the pid
            // would have to be freed and reused within that instant.)
            if foreign_state(handle) == JobState::Running {
                let pid = pid_of(id).expect("foreign_state parsed it. This is a bug.");
                process::signal_group(pid, libc::SIGTERM);
                return Ok(());
            }
            return Err(SchedulerError::UnknownJob { id: id.to_string() });
        };
        if job.exit.is_some() || job.child.is_none() {
            return Ok(()); // already ended, or a cancel is under way
        }
        let mut child = job.child.take().expect("checked above. This is a bug.");
        if let Ok(Some(status)) = child.try_wait() {
            job.exit = Some(status);
            return Ok(());
        }
        job.cancelled = true;
        let jobs = Arc::clone(&self.jobs);
        let (id, grace) = (
            id.clone(),
            Duration::from_secs_f64(self.config.grace_secs.max(0.0)),
        );
        thread::spawn(move || terminate(jobs, id, child, grace));
        Ok(())
    }

    fn list_jobs(&self) -> SchedulerResult<Vec<QueuedJob>> {
        let ids: Vec<JobHandle> = self.lock().keys().cloned().map(JobHandle::new).collect();
        let states = self.poll(&ids)?;
        let table = self.lock();
        let mut jobs: Vec<QueuedJob> = states
            .into_iter()
            .filter_map(|(id, state)| {
                let job = table.get(&id)?;
                Some(QueuedJob {
                    name: job.name.clone(),
                    queue: job.queue.clone(),
                    id,
                    state,
                })
            })
            .collect();
        jobs.extend(
            foreign_jobs()
                .into_iter()
                .filter(|j| !table.contains_key(&j.id)),
        );
        Ok(jobs)
    }
}
