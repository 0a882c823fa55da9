/*!
The PBS Pro checks before a run's first job, from the server itself: every queue of the run
exists (`qstat -Q -f -F json`) and takes jobs (`enabled`); and a loop running as root may submit
at all (`qstat -B -f -F json`: the server refuses root's jobs, "Bad UID for job execution",
unless its `acl_roots` names root). A queue that fails one is named with the reason, and
`submit` sends it no job; `doctor --run-dir` prints the same lines. A queue that is only stopped
(`started = False`, as for a maintenance) takes jobs, which wait until it is started: no
refusal (the adaptive route weighs its wait).

Torque and `slurm-wlm-torque` print no JSON: nothing is checked there (their `qsub` says what
is wrong with a queue).
*/

use std::collections::BTreeMap;
use std::path::Path;

use super::super::{Call, QueueProblem, SchedulerError};
use super::parse::{parse_acl_roots, parse_queues_json, PbsQueue};
use super::{PbsFlavor, PbsScheduler};

/// What `qsub` answers when the server will not run a job as its user (PBSE_BADUSER, exit 175).
pub(super) const BAD_UID: &str = "bad uid for job execution";

/// The hint for a job refused with [`BAD_UID`]: what to do, by who submits.
pub(super) fn bad_uid_hint() -> String {
    if is_root() {
        "the PBS server does not run jobs as root unless its acl_roots names root: submit as an \
         ordinary user, or on a test server allow root with `qmgr -c 'set server acl_roots = \
         root'`"
            .to_string()
    } else {
        "the PBS server will not run jobs as this user: the user must exist, with the same \
         uid, on the server and the execution hosts"
            .to_string()
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl PbsScheduler {
    pub(super) fn check_queues(&self, run_dir: &Path) -> Vec<QueueProblem> {
        if self.config.flavor != PbsFlavor::Pro {
            return Vec::new();
        }
        let queues = run_queues(run_dir);
        if queues.is_empty() {
            return Vec::new();
        }
        let problem = |queue: &str, reason: String, lasting: bool| QueueProblem {
            queue: queue.to_string(),
            reason,
            lasting,
        };
        let listed = match self.list_queues() {
            Ok(listed) => listed,
            Err(e) => {
                // The server did not answer: every queue would fail alike; say so once each.
                let why = format!("the PBS server did not list its queues ({e})");
                return queues.iter().map(|q| problem(q, why.clone(), false)).collect();
            }
        };
        let names: Vec<&str> = listed.iter().map(|q| q.name.as_str()).collect();
        let root_refused = is_root() && self.root_refused();
        let mut problems = Vec::new();
        for queue in &queues {
            let reason = match listed.iter().find(|q| &q.name == queue) {
                None => Some((
                    format!(
                        "the PBS server has no queue `{queue}` (its queues: {}); fix the run's \
                         queues with `embedfleet queues set`",
                        names.join(", ")
                    ),
                    true,
                )),
                Some(q) if !q.enabled => Some((
                    format!(
                        "queue `{queue}` is disabled on the PBS server (enabled = False): it \
                         takes no jobs now; tried again later"
                    ),
                    false,
                )),
                Some(_) if root_refused => Some((
                    format!("this loop runs as root, and {}", bad_uid_hint()),
                    true,
                )),
                Some(_) => None,
            };
            problems.extend(reason.map(|(r, lasting)| problem(queue, r, lasting)));
        }
        problems
    }

    /// The server's queue names (PBS Pro: Torque's `qstat -Q` has no JSON); `None` when it did
    /// not list them.
    pub(super) fn queue_names(&self) -> Option<Vec<String>> {
        if self.config.flavor != PbsFlavor::Pro {
            return None;
        }
        let listed = self.list_queues().ok()?;
        Some(listed.into_iter().map(|q| q.name).collect())
    }

    fn list_queues(&self) -> Result<Vec<PbsQueue>, SchedulerError> {
        let out = self.runner.run(
            &self.config.qstat,
            "qstat",
            Call::new(["-Q", "-f", "-F", "json"]),
        )?;
        parse_queues_json(&out.stdout).map_err(|reason| unexpected("qstat -Q -f -F json", reason))
    }

    /// True when the server's `acl_roots` does not name root (`root` or `root@HOST`). An
    /// answer that cannot be read is no refusal: `qsub` then says it in words.
    fn root_refused(&self) -> bool {
        let out = self.runner.run(
            &self.config.qstat,
            "qstat",
            Call::new(["-B", "-f", "-F", "json"]),
        );
        let Ok(Some(roots)) = out.map(|o| parse_acl_roots(&o.stdout).unwrap_or(None)) else {
            return false;
        };
        !roots
            .iter()
            .any(|u| u == "root" || u.starts_with("root@"))
    }
}

fn unexpected(command: &str, reason: String) -> SchedulerError {
    SchedulerError::UnexpectedOutput {
        command: command.to_string(),
        reason,
        output_tail: String::new(),
    }
}

/// The run's queues with a cap above 0, from its run.db (read-only: the loop that asks holds
/// it open); none when there is no run.db to read.
fn run_queues(run_dir: &Path) -> Vec<String> {
    let caps: BTreeMap<String, u32> = embedfleet_core::rundb::RunDb::open_read_only(run_dir)
        .and_then(|db| db.queue_caps())
        .unwrap_or_default();
    caps.into_iter()
        .filter(|(_, cap)| *cap > 0)
        .map(|(q, _)| q)
        .collect()
}
