/*!
What makes one backend different from another: [`BackendKind`], implemented by a unit struct
in each backend's module (`LocalBackend`, `SlurmBackend`, `PbsBackend`, `SshBackend`) beside the
[`Scheduler`] it builds. Code outside a backend's module asks [`Backend::kind`] and never
matches on the backend.

[`Backend::kind`]: super::Backend::kind
*/

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Scheduler, SchedulerConfig, ScriptConfig};

/// A backend's hooks. The defaults fit a batch scheduler that needs none of them.
pub trait BackendKind: Sync {
    /// The scheduler that submits, polls and cancels this backend's jobs, built from the run
    /// config: the backend's own table (`config.<its name>`) and `[scheduler.command]`.
    fn build(&self, config: &SchedulerConfig) -> Box<dyn Scheduler>;

    /// Values of the backend's table that parse but cannot work, each naming its key (a run
    /// config with any is refused). Every backend's table is checked, used or not.
    fn problems(&self, _config: &SchedulerConfig) -> Vec<String> {
        Vec::new()
    }

    /// The built-in job script template (`[scheduler.script] template` replaces it).
    fn template(&self) -> &'static str;

    /// The launcher line that starts one task per node of a job of `nodes` nodes (`srun ...`),
    /// unless `[scheduler.script] launcher` names one. `None`: such a job runs its batches one
    /// after another.
    fn launcher(&self, _nodes: usize) -> Option<String> {
        None
    }

    /// Adds to `script` what a CPU job of one node asks for: `cpus` cores and `memory_mib` of
    /// memory (directives where the backend reads them; nothing where it does not).
    fn cpu_job(&self, _script: &mut ScriptConfig, _cpus: u32, _memory_mib: u64) {}

    /// A log file's path as the scheduler's output directive must spell it (Slurm reads `%`
    /// as the start of a pattern such as `%j`); the path as it is by default.
    fn log_path(&self, path: &str) -> String {
        path.to_owned()
    }

    /// The longest job name the backend keeps whole; a longer one is given a short hashed
    /// form (`crate::submit::fit_job_name`). `None`: no limit.
    fn max_job_name(&self) -> Option<usize> {
        None
    }

    /// The script settings of a job on `queue`: `[scheduler.script]` as it is, unless the
    /// backend's queues differ in what their jobs run (the ssh backend's hosts, each with its
    /// own binary and environment).
    fn queue_script(&self, config: &SchedulerConfig, _queue: &str) -> ScriptConfig {
        config.script.clone()
    }

    /// What `submit` uses where neither the command line nor the run says.
    fn defaults(&self, config: &SchedulerConfig) -> SubmitDefaults {
        SubmitDefaults::batch_scheduler(&config.script)
    }
}

/// What `submit` uses where neither the command line nor the run says (see
/// [`BackendKind::defaults`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SubmitDefaults {
    /// The embed jobs' `--devices`.
    pub devices: String,
    /// The queues and caps of a run that has none, and how to tell the user (`one local queue
    /// ...`); `None`: the user must name them.
    pub queues: Option<(BTreeMap<String, u32>, String)>,
    /// `--poll-interval`.
    pub poll_interval: Duration,
    /// `--lost-after`.
    pub lost_after: Duration,
}

impl SubmitDefaults {
    /// A batch scheduler's: every GPU the script asks for (else the four of the product's
    /// nodes), queues named by the user, polls every 30 s, a job lost after 5 minutes unknown.
    pub fn batch_scheduler(script: &ScriptConfig) -> Self {
        let gpus = script.gpus_per_node.unwrap_or(4).max(1);
        let list: Vec<String> = (0..gpus).map(|g| g.to_string()).collect();
        Self {
            devices: format!("cuda:{}", list.join(",")),
            queues: None,
            poll_interval: Duration::from_secs(30),
            lost_after: Duration::from_secs(300),
        }
    }
}

/// A queue that cannot take jobs, found before the first one (see
/// [`Scheduler::preflight`](super::Scheduler::preflight)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueProblem {
    /// The queue.
    pub queue: String,
    /// Why, and what to do about it.
    pub reason: String,
    /// Whether it lasts: a queue the server does not have, or refuses this user, takes no job
    /// of the run. A server that did not answer (restarting, down for a while) or a queue
    /// disabled for now is tried again later: the queue cools off, as after a failed
    /// submission, instead of being left out of the run for good.
    pub lasting: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Backend;

    #[test]
    fn submit_defaults_are_this_machines_or_a_batch_schedulers() {
        let mut config = SchedulerConfig::default();
        let local = Backend::Local.kind().defaults(&config);
        assert_eq!(local.devices, "cpu");
        assert_eq!(
            local.queues,
            Some((
                BTreeMap::from([("local".to_string(), 2)]),
                "one local queue `local` of 2 jobs at once".to_string()
            ))
        );
        assert_eq!(local.poll_interval, Duration::from_secs(1));
        assert_eq!(local.lost_after, Duration::from_secs(10));
        for backend in [Backend::Slurm, Backend::Pbs] {
            config.script.gpus_per_node = None;
            let four = backend.kind().defaults(&config);
            assert_eq!(four.devices, "cuda:0,1,2,3", "{backend}");
            assert_eq!(four.queues, None, "{backend}");
            assert_eq!(four.poll_interval, Duration::from_secs(30));
            assert_eq!(four.lost_after, Duration::from_secs(300));
            config.script.gpus_per_node = Some(2);
            assert_eq!(backend.kind().defaults(&config).devices, "cuda:0,1");
        }
    }
}
