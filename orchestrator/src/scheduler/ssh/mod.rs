/*!
The ssh backend: a fleet of GPU machines with no scheduler, sharing the run directory over a
shared filesystem. Each host is a queue (`queues set` caps it; `status` and the breaker count
per host); each of its slots runs one job at a time on its own devices.

A job is started over OpenSSH (`remote.rs`: a bash script on ssh's stdin) detached with
`setsid`, its output into its log in the run directory; its id is `HOST:SLOT:PID:START`, and
it is the job only while that pid has that start time and carries the job's
`EMBEDFLEET_JOB_NAME`. A host that does not answer a poll leaves its jobs unknown: the submit
loop counts them lost after `--lost-after` and retries their batches on other hosts; one that
answers again within that time still has them running (adopted, never run twice). A cancel a
host did not take is sent again when it answers. The checks before the first job are in
`preflight.rs`.
*/

mod config;
mod connect;
mod preflight;
mod remote;

use embedfleet_core::RunLayout;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub use config::{HostConfig, SshConfig};

use super::command::tail;
use super::{
    marker_or, Backend, BackendKind, CommandRunner, JobHandle, JobScript, JobState,
    JobSubmission, QueueProblem, QueuedJob, Scheduler, SchedulerConfig, SchedulerError,
    SchedulerJobId, SchedulerResult, ScriptConfig, SubmitDefaults,
};
use connect::{Retry, Ssh};

/// Built-in ssh template: no directives (the host runs it with bash).
pub const SSH_TEMPLATE: &str = "#!/bin/bash
# embedfleet ssh job {job_name} (host {queue})
{env_lines}
{setup_lines}
{command}
{finish}
";

/// The ssh backend's hooks.
pub struct SshBackend;

impl BackendKind for SshBackend {
    fn build(&self, config: &SchedulerConfig) -> Box<dyn Scheduler> {
        Box::new(SshScheduler::new(config))
    }

    fn problems(&self, config: &SchedulerConfig) -> Vec<String> {
        config.ssh.problems(config.backend == Backend::Ssh)
    }

    fn template(&self) -> &'static str {
        SSH_TEMPLATE
    }

    /// The host's binary and environment.
    fn queue_script(&self, config: &SchedulerConfig, queue: &str) -> ScriptConfig {
        let mut script = config.script.clone();
        if let Some(host) = config.ssh.host(queue) {
            if host.embedfleet.is_some() {
                script.embedfleet.clone_from(&host.embedfleet);
            }
            script.env.extend(host.env.clone());
        }
        script
    }

    /// Every host a queue of its slots; `cuda` unless every slot is a CPU's; polls every 5 s,
    /// a job lost after a minute of its host not answering.
    fn defaults(&self, config: &SchedulerConfig) -> SubmitDefaults {
        let hosts = &config.ssh.hosts;
        let caps: BTreeMap<String, u32> = hosts
            .iter()
            .map(|h| (h.name.clone(), h.slots.len().max(1) as u32))
            .collect();
        let listed: Vec<String> = caps.iter().map(|(h, n)| format!("{h} ({n})")).collect();
        let all_cpu = hosts.iter().flat_map(|h| &h.slots).all(|s| s.trim() == "cpu");
        SubmitDefaults {
            devices: if all_cpu && !hosts.is_empty() { "cpu" } else { "cuda" }.to_string(),
            queues: Some((
                caps,
                format!(
                    "one queue per ssh host, capped at its slots: {}",
                    listed.join(", ")
                ),
            )),
            poll_interval: Duration::from_secs(5),
            lost_after: Duration::from_secs(60),
        }
    }
}

/// A job as its id names it: `HOST:SLOT:PID:START`, and the name it was started under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct JobRef {
    id: String,
    pid: u32,
    start: String,
    name: String,
}

impl JobRef {
    /// The host and the job, from a handle with a name (a job without one cannot be told
    /// from a stranger with its pid).
    fn of(handle: &JobHandle) -> Option<(String, Self)> {
        let id = handle.id.as_str();
        let mut parts = id.rsplitn(4, ':');
        let start = parts.next()?.to_string();
        let pid = parts.next()?.parse().ok()?;
        let _slot: u32 = parts.next()?.parse().ok()?;
        let host = parts.next()?.to_string();
        let job = Self {
            id: id.to_string(),
            pid,
            start,
            name: handle.name.clone()?,
        };
        Some((host, job))
    }
}

/// A cancel a host owes.
#[derive(Debug, Clone)]
enum Owed {
    /// This job.
    Job(JobRef),
    /// Every job of this name there.
    Named(String),
}

/// Jobs on hosts over ssh.
#[derive(Debug)]
pub struct SshScheduler {
    config: SshConfig,
    /// `[scheduler.script] embedfleet`, the binary preflight looks for where a host names none.
    script_binary: Option<String>,
    ssh: Ssh,
    /// Jobs this process cancelled: gone without a marker, they were cancelled, not lost.
    cancelled: Mutex<HashSet<SchedulerJobId>>,
    /// Cancels a host did not take because it did not answer, per host: sent when it does.
    owed: Mutex<BTreeMap<String, Vec<Owed>>>,
}

impl SshScheduler {
    /// The ssh backend of this run config.
    pub fn new(config: &SchedulerConfig) -> Self {
        Self {
            config: config.ssh.clone(),
            script_binary: config.script.embedfleet.clone(),
            ssh: Ssh::new(config.ssh.clone(), CommandRunner::new(config.command.clone())),
            cancelled: Mutex::default(),
            owed: Mutex::default(),
        }
    }

    /// The host of job `id`.
    fn host_of(&self, name: &str, id: &SchedulerJobId) -> SchedulerResult<&HostConfig> {
        self.config
            .host(name)
            .ok_or_else(|| SchedulerError::InvalidJob {
                name: id.to_string(),
                reason: format!(
                    "its host `{name}` is not in [scheduler.ssh] hosts any more: put it back to \
                     reach the job"
                ),
            })
    }

    /// The job script on the shared filesystem (script text is written next to the run's).
    fn script_path(&self, job: &JobSubmission, run_dir: &Path) -> SchedulerResult<PathBuf> {
        match &job.script {
            JobScript::Path(p) => Ok(p.clone()),
            JobScript::Text(text) => {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let path = RunLayout::new(run_dir).ssh_job_script(&job.name);
                let io = |source| SchedulerError::Io {
                    action: "write job script",
                    path: path.clone(),
                    cause: source,
                };
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o700)
                    .open(&path)
                    .map_err(io)?;
                file.write_all(text.as_bytes()).map_err(io)?;
                Ok(path)
            }
        }
    }

    /// Sends the cancels `host` owes, now that it answered; those it still cannot take stay
    /// owed.
    fn pay_owed(&self, host: &HostConfig) {
        let owed = self.lock_owed().remove(&host.name).unwrap_or_default();
        for debt in owed {
            let paid = match &debt {
                Owed::Job(job) => self.cancel(&JobHandle::new(SchedulerJobId::new(&job.id)).with_name(&job.name)),
                Owed::Named(name) => self.list_host(host).and_then(|listed| {
                    listed
                        .into_iter()
                        .filter(|j| &j.name == name)
                        .try_for_each(|j| self.cancel(&JobHandle::new(j.id).with_name(j.name)))
                }),
            };
            match paid {
                Ok(()) => tracing::info!(host = %host.name, ?debt, "sent a cancel the host owed"),
                // `cancel` owes a job again itself.
                Err(_) if matches!(debt, Owed::Job(_)) => {}
                Err(_) => self.owe(&host.name, debt),
            }
        }
    }

    fn owe(&self, host: &str, debt: Owed) {
        self.lock_owed().entry(host.to_string()).or_default().push(debt);
    }

    fn lock_owed(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<Owed>>> {
        self.owed
            .lock()
            .expect("owed cancels lock poisoned. This is a bug.")
    }

    /// The jobs of `host` there.
    fn list_host(&self, host: &HostConfig) -> SchedulerResult<Vec<QueuedJob>> {
        let script = remote::list(&host.name);
        let out = self.ssh.run(host, &script, Retry::UnlessUnreachable, &|o| o.status.success())?;
        Ok(out
            .stdout
            .lines()
            .filter_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                let ["job", slot, pid, start, name] = words[..] else {
                    return None;
                };
                Some(QueuedJob {
                    id: SchedulerJobId::new(format!("{}:{slot}:{pid}:{start}", host.name)),
                    name: name.to_string(),
                    queue: host.name.clone(),
                    state: JobState::Running,
                })
            })
            .collect())
    }

    fn was_cancelled(&self, id: &SchedulerJobId) -> bool {
        self.cancelled
            .lock()
            .expect("cancel set lock poisoned. This is a bug.")
            .contains(id)
    }

    /// The states of one host's jobs: from the host, or unknown when it does not answer.
    fn poll_host(&self, host: &str, jobs: &[(&JobHandle, JobRef)]) -> Vec<(SchedulerJobId, JobState)> {
        let answer = self.config.host(host).map(|h| {
            let refs: Vec<&JobRef> = jobs.iter().map(|(_, j)| j).collect();
            let out = self.ssh.run(h, &remote::poll(&refs), Retry::UnlessUnreachable, &|o| o.status.success());
            if out.is_ok() {
                self.pay_owed(h);
            }
            out
        });
        let running: HashSet<String> = match answer {
            Some(Ok(out)) => out
                .stdout
                .lines()
                .filter_map(|l| l.strip_prefix("running "))
                .map(str::to_string)
                .collect(),
            Some(Err(e)) => {
                tracing::warn!(%host, error = %e, "the host did not answer the poll; its jobs are unknown until it does");
                HashSet::new()
            }
            None => HashSet::new(),
        };
        jobs.iter()
            .map(|(handle, job)| {
                let state = if running.contains(&job.id) {
                    JobState::Running
                } else if self.was_cancelled(&handle.id) {
                    marker_or(handle, JobState::Cancelled)
                } else {
                    marker_or(handle, JobState::Unknown)
                };
                (handle.id.clone(), state)
            })
            .collect()
    }
}

impl Scheduler for SshScheduler {
    fn backend(&self) -> Backend {
        Backend::Ssh
    }

    fn submit(&self, job: &JobSubmission) -> SchedulerResult<SchedulerJobId> {
        job.validate()?;
        let Some(host) = self.config.host(&job.queue) else {
            return Err(SchedulerError::InvalidJob {
                name: job.name.clone(),
                reason: format!(
                    "queue `{}` is not a host of [scheduler.ssh] hosts",
                    job.queue
                ),
            });
        };
        let run_dir = job.workdir.clone().ok_or_else(|| SchedulerError::InvalidJob {
            name: job.name.clone(),
            reason: "an ssh job needs its run directory as its working directory".to_string(),
        })?;
        let script = self.script_path(job, &run_dir)?;
        let log = job.log.clone().unwrap_or_else(|| PathBuf::from("/dev/null"));
        let slots = host.parsed_slots().iter().map(|s| s.visible_devices()).collect();
        let text = remote::launch(&remote::Launch {
            host: &host.name,
            name: &job.name,
            run_dir: &run_dir,
            script: &script,
            log: &log,
            slots,
        });
        let out = match self.ssh.run(host, &text, Retry::Never, &|o| o.status.success()) {
            Ok(out) => out,
            Err(e @ SchedulerError::CommandTimedOut { .. }) => {
                return Err(uncertain(job, e));
            }
            Err(SchedulerError::CommandFailed { command, status, attempts, stderr_tail })
                if status == "exit status 255" && !could_not_connect_text(&stderr_tail) =>
            {
                // The connection broke after it got in: the job may have started.
                let e = SchedulerError::CommandFailed { command, status, attempts, stderr_tail };
                return Err(uncertain(job, e));
            }
            Err(e) => return Err(e),
        };
        let started: Vec<&str> = out.stdout.split_whitespace().collect();
        match started[..] {
            ["started", slot, pid, start] => Ok(SchedulerJobId::new(format!(
                "{}:{slot}:{pid}:{start}",
                host.name
            ))),
            _ => Err(SchedulerError::UnexpectedOutput {
                command: format!("ssh {} bash -s (start job {})", host.describe(), job.name),
                reason: "expected `started SLOT PID START`".to_string(),
                output_tail: tail(&out.stdout, 1000),
            }),
        }
    }

    fn poll(&self, jobs: &[JobHandle]) -> SchedulerResult<HashMap<SchedulerJobId, JobState>> {
        let mut states = HashMap::with_capacity(jobs.len());
        let mut by_host: BTreeMap<String, Vec<(&JobHandle, JobRef)>> = BTreeMap::new();
        for handle in jobs {
            match JobRef::of(handle) {
                Some((host, job)) => by_host.entry(host).or_default().push((handle, job)),
                None => {
                    states.insert(handle.id.clone(), marker_or(handle, JobState::Unknown));
                }
            }
        }
        // Every host at once: one that does not answer costs its connect timeout, not more.
        std::thread::scope(|scope| {
            let asked: Vec<_> = by_host
                .iter()
                .map(|(host, jobs)| scope.spawn(move || self.poll_host(host, jobs)))
                .collect();
            for answer in asked {
                states.extend(answer.join().expect("a host's poll panicked. This is a bug."));
            }
        });
        Ok(states)
    }

    fn cancel(&self, handle: &JobHandle) -> SchedulerResult<()> {
        let (host, job) = JobRef::of(handle).ok_or_else(|| SchedulerError::InvalidJob {
            name: handle.id.to_string(),
            reason: "not an ssh job id (HOST:SLOT:PID:START), or its name is not known"
                .to_string(),
        })?;
        let host = self.host_of(&host, &handle.id)?;
        self.cancelled
            .lock()
            .expect("cancel set lock poisoned. This is a bug.")
            .insert(handle.id.clone());
        let script = remote::cancel(&[&job], self.config.grace_secs);
        match self.ssh.run(host, &script, Retry::UnlessUnreachable, &|o| o.status.success()) {
            Ok(_) => Ok(()),
            Err(e) => {
                // Sent again when the host answers: a job that comes back must not run beside
                // its batch's next job.
                self.owe(&host.name, Owed::Job(job));
                Err(e)
            }
        }
    }

    /// The jobs of every host that answers (one that does not is left out, with a warning:
    /// the submit loop's jobs there are polled by id, and a twin there is cancelled by
    /// [`Scheduler::cancel_named`] when it answers).
    fn list_jobs(&self) -> SchedulerResult<Vec<QueuedJob>> {
        let mut jobs = Vec::new();
        for host in &self.config.hosts {
            match self.list_host(host) {
                Ok(listed) => jobs.extend(listed),
                Err(e) => tracing::warn!(host = %host.name, error = %e, "the host did not answer; its jobs are not listed"),
            }
        }
        Ok(jobs)
    }

    /// As the default, but a host that does not answer owes the cancel: it is sent when it
    /// answers, so that a twin there never runs beside its batch's next job.
    fn cancel_named(&self, name: &str) -> SchedulerResult<()> {
        for host in &self.config.hosts {
            match self.list_host(host) {
                Ok(listed) => {
                    for twin in listed.into_iter().filter(|j| j.name == name) {
                        self.cancel(&JobHandle::new(twin.id).with_name(twin.name))?;
                    }
                }
                Err(_) => self.owe(&host.name, Owed::Named(name.to_string())),
            }
        }
        Ok(())
    }

    fn preflight(&self, run_dir: &Path) -> Vec<QueueProblem> {
        preflight::check_hosts(&self.config, &self.ssh, self.script_binary.as_deref(), run_dir)
    }
}

fn could_not_connect_text(stderr: &str) -> bool {
    connect::unreachable(stderr).is_some()
}

fn uncertain(job: &JobSubmission, e: SchedulerError) -> SchedulerError {
    SchedulerError::SubmitUncertain {
        name: job.name.clone(),
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_read_back_and_a_handle_without_a_name_is_no_job() {
        let id = SchedulerJobId::new("gpu-a.lab:1:4242:998877");
        let (host, job) = JobRef::of(&JobHandle::new(id.clone()).with_name("j")).unwrap();
        assert_eq!(host, "gpu-a.lab");
        assert_eq!((job.pid, job.start.as_str(), job.name.as_str()), (4242, "998877", "j"));
        assert!(JobRef::of(&JobHandle::new(id)).is_none());
        let local = JobHandle::new(SchedulerJobId::new("12345")).with_name("j");
        assert!(JobRef::of(&local).is_none());
    }

    #[test]
    fn hosts_are_the_default_queues_and_each_brings_its_binary_and_environment() {
        let mut config = SchedulerConfig {
            backend: Backend::Ssh,
            ..SchedulerConfig::default()
        };
        config.ssh = toml::from_str(
            r#"hosts = [
                 { name = "a", slots = ["cpu", "cpu"], embedfleet = "/opt/ef", env = { K = "v" } },
                 { name = "b", slots = ["cpu"] },
               ]"#,
        )
        .unwrap();
        assert!(SshBackend.problems(&config).is_empty());
        let defaults = SshBackend.defaults(&config);
        assert_eq!(defaults.devices, "cpu");
        let caps = BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 1)]);
        assert_eq!(defaults.queues.unwrap().0, caps);
        let a = SshBackend.queue_script(&config, "a");
        assert_eq!(a.embedfleet.as_deref(), Some("/opt/ef"));
        assert_eq!(a.env["K"], "v");
        assert_eq!(SshBackend.queue_script(&config, "b"), config.script);
        config.ssh.hosts[1].slots = vec!["cuda:0".to_string()];
        assert_eq!(SshBackend.defaults(&config).devices, "cuda");
    }
}
