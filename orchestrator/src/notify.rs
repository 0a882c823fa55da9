/*!
The notify hook: a command of the run config (`[notify] command`) run on the events a user of a
week-long run wants to hear about, with the event in its environment (docs/notify.md).

The command runs through `sh -c` on the owner's host, in a thread of its own, in a process
group of its own, with its output appended to `logs/notify.log` of the run directory. It never
holds up the submit loop: [`Notifier::send`] returns at once, a command that runs past its
timeout is killed (with everything it started), and a failing one is a warning, not an error.

Events and their variables (besides `EMBEDFLEET_EVENT`, `EMBEDFLEET_RUN_DIR` and
`EMBEDFLEET_MESSAGE`, a one-line text for people):

| event | when | variables |
| --- | --- | --- |
| `finished` | the loop ends (or, with `--watch`, goes idle) with every batch settled | `EMBEDFLEET_BATCHES_DONE`, `EMBEDFLEET_BATCHES_FAILED` |
| `paused` | the breaker paused the run | `EMBEDFLEET_REASON` (the failure signature), `EMBEDFLEET_JOB` (the last failed job), `EMBEDFLEET_LOG` |
| `queue_set_aside` | the breaker set one queue (an ssh host, a partition) aside: its jobs failed alike while the other queues' did not | `EMBEDFLEET_QUEUE`, `EMBEDFLEET_REASON`, `EMBEDFLEET_JOB`, `EMBEDFLEET_LOG` |
| `batch_failed` | a batch failed for good (every attempt used, or refused) | `EMBEDFLEET_BATCH`, `EMBEDFLEET_JOB`, `EMBEDFLEET_REASON`, `EMBEDFLEET_LOG` |
| `job_stalled` | a job wrote nothing for several of its shard times | `EMBEDFLEET_JOB`, `EMBEDFLEET_BATCH`, `EMBEDFLEET_HOST`, `EMBEDFLEET_REASON` |
| `owner_restarted` | the run's owner (the submit loop) started again | `EMBEDFLEET_HOST`, `EMBEDFLEET_REASON` |
*/

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use embedfleet_core::{process, RunLayout};
use serde::{Deserialize, Serialize};

/// The hook's default timeout: long enough for `mail` or a `curl` to a slow webhook, short
/// enough that a hung one is gone well before the next event.
pub const DEFAULT_NOTIFY_TIMEOUT_SECS: f64 = 60.0;

/// How long a timed-out hook gets between SIGTERM and SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// The `[notify]` table of the run config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotifyConfig {
    /// Shell command (`sh -c`) run on each event, the event in its environment; none sends
    /// nothing.
    pub command: Option<String>,
    /// Seconds the command may run before it is killed (default 60).
    pub timeout_secs: f64,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            command: None,
            timeout_secs: DEFAULT_NOTIFY_TIMEOUT_SECS,
        }
    }
}

/// Something worth telling the user about.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The loop ended (or, watching, went idle) with every batch done or failed.
    Finished {
        batches_done: u64,
        batches_failed: u64,
    },
    /// The breaker paused the run: `signature` is what the failed jobs had in common.
    Paused {
        message: String,
        signature: String,
        /// The last failed job and its log.
        job: String,
        log: Option<String>,
    },
    /// The breaker set one queue aside (its jobs failed alike while the others' did not):
    /// `signature` is what its failed jobs had in common.
    QueueSetAside {
        queue: String,
        message: String,
        signature: String,
        /// The last failed job and its log.
        job: String,
        log: Option<String>,
    },
    /// A batch failed for good: every attempt used, or its job was refused.
    BatchFailed {
        batch: i64,
        job: String,
        reason: String,
        log: Option<String>,
    },
    /// A job wrote nothing for several of its own shard times.
    JobStalled {
        job: String,
        batch: Option<i64>,
        host: Option<String>,
        /// Why it counts as stalled, e.g. "no shard for 40m (4 shard times)".
        reason: String,
    },
    /// The run's owner started again (on `host`), e.g. after a reboot or a `take-over`.
    OwnerRestarted { host: String, reason: String },
}

impl Event {
    /// `EMBEDFLEET_EVENT`: `finished`, `paused`, `queue_set_aside`, `batch_failed`,
    /// `job_stalled`, `owner_restarted`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Finished { .. } => "finished",
            Self::Paused { .. } => "paused",
            Self::QueueSetAside { .. } => "queue_set_aside",
            Self::BatchFailed { .. } => "batch_failed",
            Self::JobStalled { .. } => "job_stalled",
            Self::OwnerRestarted { .. } => "owner_restarted",
        }
    }

    /// `EMBEDFLEET_MESSAGE`: one line for people (a mail subject, a chat message).
    pub fn message(&self) -> String {
        let text = match self {
            Self::Finished {
                batches_done,
                batches_failed: 0,
            } => format!("embedfleet: finished, all {batches_done} batches done"),
            Self::Finished {
                batches_done,
                batches_failed,
            } => format!(
                "embedfleet: finished, {batches_done} batches done, {batches_failed} failed \
                 (`embedfleet submit` again retries them)"
            ),
            Self::Paused {
                message, signature, ..
            } => format!(
                "embedfleet: paused: {message}: {signature} (`embedfleet status` says what to \
                 check, `embedfleet resume` goes on)"
            ),
            Self::QueueSetAside {
                queue,
                message,
                signature,
                ..
            } => format!(
                "embedfleet: queue {queue} set aside: {message}: {signature} (the other queues \
                 go on; `embedfleet resume` sends jobs there again)"
            ),
            Self::BatchFailed { batch, reason, .. } => {
                format!("embedfleet: batch {batch} failed: {reason}")
            }
            Self::JobStalled {
                job, host, reason, ..
            } => match host {
                Some(host) => format!("embedfleet: job {job} on {host} stalled: {reason}"),
                None => format!("embedfleet: job {job} stalled: {reason}"),
            },
            Self::OwnerRestarted { host, reason } => {
                format!("embedfleet: the run's owner started again on {host}: {reason}")
            }
        };
        one_line(&text)
    }

    /// The event's own variables (see the module's table).
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = Vec::new();
        let mut put = |k: &'static str, v: Option<String>| {
            if let Some(v) = v {
                vars.push((k, one_line(&v)));
            }
        };
        match self {
            Self::Finished {
                batches_done,
                batches_failed,
            } => {
                put("EMBEDFLEET_BATCHES_DONE", Some(batches_done.to_string()));
                put(
                    "EMBEDFLEET_BATCHES_FAILED",
                    Some(batches_failed.to_string()),
                );
            }
            Self::Paused {
                signature,
                job,
                log,
                ..
            } => {
                put("EMBEDFLEET_REASON", Some(signature.clone()));
                put("EMBEDFLEET_JOB", Some(job.clone()));
                put("EMBEDFLEET_LOG", log.clone());
            }
            Self::QueueSetAside {
                queue,
                signature,
                job,
                log,
                ..
            } => {
                put("EMBEDFLEET_QUEUE", Some(queue.clone()));
                put("EMBEDFLEET_REASON", Some(signature.clone()));
                put("EMBEDFLEET_JOB", Some(job.clone()));
                put("EMBEDFLEET_LOG", log.clone());
            }
            Self::BatchFailed {
                batch,
                job,
                reason,
                log,
            } => {
                put("EMBEDFLEET_BATCH", Some(batch.to_string()));
                put("EMBEDFLEET_JOB", Some(job.clone()));
                put("EMBEDFLEET_REASON", Some(reason.clone()));
                put("EMBEDFLEET_LOG", log.clone());
            }
            Self::JobStalled {
                job,
                batch,
                host,
                reason,
            } => {
                put("EMBEDFLEET_JOB", Some(job.clone()));
                put("EMBEDFLEET_BATCH", batch.map(|b| b.to_string()));
                put("EMBEDFLEET_HOST", host.clone());
                put("EMBEDFLEET_REASON", Some(reason.clone()));
            }
            Self::OwnerRestarted { host, reason } => {
                put("EMBEDFLEET_HOST", Some(host.clone()));
                put("EMBEDFLEET_REASON", Some(reason.clone()));
            }
        }
        vars
    }
}

/// Newlines and other control characters as spaces: every variable is one line, so a hook
/// can put it in a mail subject or a JSON string without breaking it.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Hooks that run at once; further events wait for one to end.
pub const MAX_HOOKS_RUNNING: usize = 4;
/// Events sent and not yet ended (running or waiting); one more is not sent, with a warning: a
/// storm of events (a node lost with hundreds of batches) must not start hundreds of threads.
pub const MAX_HOOKS_PENDING: usize = 64;

/// Runs the notify command on events, in the background (see the module's doc).
#[derive(Debug, Clone)]
pub struct Notifier {
    command: Option<String>,
    timeout: Duration,
    /// Hooks sent and not ended (running or waiting for a slot); [`Notifier::wait`] waits for
    /// them to reach 0.
    in_flight: Arc<(Mutex<usize>, Condvar)>,
    /// Hooks running now, at most [`MAX_HOOKS_RUNNING`].
    running: Arc<(Mutex<usize>, Condvar)>,
}

impl Notifier {
    /// The notifier of a run config's `[notify]` table.
    pub fn new(config: &NotifyConfig) -> Self {
        let secs = if config.timeout_secs.is_finite() && config.timeout_secs > 0.0 {
            config.timeout_secs
        } else {
            DEFAULT_NOTIFY_TIMEOUT_SECS
        };
        Self {
            command: config.command.clone().filter(|c| !c.trim().is_empty()),
            timeout: Duration::from_secs_f64(secs),
            in_flight: Arc::default(),
            running: Arc::default(),
        }
    }

    /// One that sends nothing.
    pub fn disabled() -> Self {
        Self::new(&NotifyConfig::default())
    }

    pub fn is_enabled(&self) -> bool {
        self.command.is_some()
    }

    /// Runs the command for `event` of the run in `run_dir`, in the background: returns at once.
    /// Its failure or timeout is logged as a warning.
    pub fn send(&self, run_dir: &Path, event: &Event) {
        let Some(command) = self.command.clone() else {
            return;
        };
        tracing::info!(event = event.name(), "notify: {}", event.message());
        let run_dir = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
        let mut env = vec![
            ("EMBEDFLEET_EVENT", event.name().to_string()),
            (
                "EMBEDFLEET_RUN_DIR",
                one_line(&run_dir.display().to_string()),
            ),
            ("EMBEDFLEET_MESSAGE", event.message()),
        ];
        env.extend(event.vars());
        let name = event.name();
        let timeout = self.timeout;
        let in_flight = Arc::clone(&self.in_flight);
        {
            let mut pending = in_flight.0.lock().unwrap_or_else(|e| e.into_inner());
            if *pending >= MAX_HOOKS_PENDING {
                tracing::warn!(
                    "notify: {pending} hooks still running or waiting; event {name} not sent \
                     ({})",
                    event.message()
                );
                return;
            }
            *pending += 1;
        }
        let running = Arc::clone(&self.running);
        thread::spawn(move || {
            {
                let (count, freed) = &*running;
                let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
                while *n >= MAX_HOOKS_RUNNING {
                    n = freed.wait(n).unwrap_or_else(|e| e.into_inner());
                }
                *n += 1;
            }
            run_hook(&command, &run_dir, &env, name, timeout);
            {
                let (count, freed) = &*running;
                *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                freed.notify_one();
            }
            let (count, done) = &*in_flight;
            *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            done.notify_all();
        });
    }

    /// Waits until every hook sent so far has ended, at most `max`; true if they all did.
    /// Called where the process is about to exit, so a last event (`finished`) is not cut off:
    /// a hook is killed at its own timeout, so waiting longer than that is never needed.
    pub fn wait(&self, max: Duration) -> bool {
        let deadline = Instant::now() + max;
        let (count, done) = &*self.in_flight;
        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            n = done
                .wait_timeout(n, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// How long [`Self::wait`] needs at most: the timeout and the kill's grace.
    pub fn max_run_time(&self) -> Duration {
        self.timeout + KILL_GRACE + Duration::from_secs(1)
    }
}

/// Where the hooks' output goes: `logs/notify.log` of the run directory.
pub fn notify_log(run_dir: &Path) -> PathBuf {
    RunLayout::new(run_dir).notify_log()
}

/// Waits for the hook's shell to exit (at most until `deadline`; `None` then, the group left
/// for the caller to end), then kills what it left running in its group — a `curl &`, a
/// `sleep &` — and reaps it. The shell is not reaped before the group is signalled, so the
/// group id cannot have been reused.
fn wait_then_end_group(
    child: &mut std::process::Child,
    deadline: Instant,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let Ok(pid) = i32::try_from(child.id()) else {
        return child.wait().map(Some);
    };
    let mut nap = Duration::from_millis(5);
    while !process::has_exited(pid) {
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(200));
    }
    process::signal_group(pid, libc::SIGKILL);
    child.wait().map(Some)
}

/// Runs one hook to its end or its timeout (then kills its process group).
fn run_hook(
    command: &str,
    run_dir: &Path,
    env: &[(&'static str, String)],
    event: &str,
    timeout: Duration,
) {
    let log = notify_log(run_dir);
    let output = log
        .parent()
        .map(std::fs::create_dir_all)
        .and_then(Result::ok)
        .and_then(|_| {
            let reach = embedfleet_core::access::Reach::of_run_dir(run_dir);
            embedfleet_core::access::open_append(&log, reach.file_mode()).ok()
        });
    let (stdout, stderr) = match output.as_ref().map(|f| (f.try_clone(), f.try_clone())) {
        Some((Ok(out), Ok(err))) => (Stdio::from(out), Stdio::from(err)),
        _ => (Stdio::null(), Stdio::null()),
    };
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(run_dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    // Own group: a timeout kills the hook and whatever it started (a `curl`, a `sleep`).
    process::in_own_group(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            tracing::warn!("notify: could not start `sh -c {command}` for event {event}: {e}");
            return;
        }
    };
    let deadline = Instant::now() + timeout;
    match wait_then_end_group(&mut child, deadline) {
        Ok(Some(status)) if status.success() => {}
        Ok(Some(status)) => tracing::warn!(
            "notify: the command for event {event} ended with {status}; its output is in {}",
            log.display()
        ),
        Ok(None) => {
            let _ = process::terminate_group(&mut child, KILL_GRACE);
            tracing::warn!(
                "notify: the command for event {event} ran past its {:?} timeout \
                 ([notify] timeout_secs) and was killed; its output is in {}",
                timeout,
                log.display()
            );
        }
        Err(e) => {
            process::kill_group(&mut child);
            tracing::warn!("notify: waiting for the command for event {event}: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
