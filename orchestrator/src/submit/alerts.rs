//! The submit loop's side of the breaker and the notify hook: each job's end goes to the
//! breaker, which may pause the run; a `resume` after its pause tries the batches that failed
//! during the streak again; the events (paused, batch failed, finished) go to the hook.
//!
//! Other parts of the loop send their events through [`SubmitLoop::notify`] (e.g. a stalled
//! job: `self.notify(&Event::JobStalled { .. })`).

use std::collections::BTreeSet;
use std::path::Path;

use embedfleet_core::rundb::JobRow;
use embedfleet_core::state::{BatchState, JobStatus};

use super::breaker::{Failure, Signature};
use super::error::Result;
use super::submit_loop::SubmitLoop;
use crate::notify::Event;
use crate::scheduler::JobState;

/// [`PauseReason::by`](embedfleet_core::rundb::PauseReason::by) of the breaker's pauses.
const BY_BREAKER: &str = "breaker";

impl SubmitLoop<'_> {
    /// Sends `event` to the run's notify hook, in the background.
    pub(super) fn notify(&self, event: &Event) {
        self.notifier.send(&self.run_dir, event);
    }

    /// True when the run is paused and the breaker paused it (this loop or an earlier one).
    pub(super) fn paused_by_breaker(&self) -> Result<bool> {
        Ok(self.db.paused()? && self.db.pause_reason()?.is_some_and(|r| r.by == BY_BREAKER))
    }

    /// A job ended and run.db has its batches' fate (`all_done`): the breaker hears of it,
    /// and pauses the run when it trips.
    pub(super) fn judge(
        &mut self,
        name: &str,
        rows: &[&JobRow],
        state: &JobState,
        status: JobStatus,
        all_done: bool,
    ) -> Result<()> {
        let queue = rows[0].queue.clone();
        if all_done {
            self.trips.breaker.success();
            self.trips.queues.success(&queue);
            return Ok(());
        }
        if self.trips.tripped {
            // Jobs that were already queued when the breaker tripped fail the same way: the
            // pause and its reason stand, and one `paused` event is enough.
            return Ok(());
        }
        let log = rows[0].log.clone();
        let Some(signature) = Signature::of(state, status, log.as_deref().map(Path::new)) else {
            return Ok(());
        };
        let refused_by_device = signature.refused_by_device();
        let failure = Failure {
            job: name.to_string(),
            log: log.clone(),
            signature,
        };
        // One queue failing while others do not is that queue's fault: set it aside, and leave
        // the run-wide count to failures the other queues share. Its node's device refusing
        // (exit 5) sets it aside at the first.
        if let Some(reason) = self.trips.queues.failed(&queue, &failure) {
            if self.another_queue_usable(&queue)? {
                self.set_queue_aside(&queue, &reason, name, refused_by_device, log);
                return Ok(());
            }
        }
        let Some(reason) = self.trips.breaker.failed(failure) else {
            return Ok(());
        };
        self.db.pause_for(&reason)?;
        self.trips.tripped = true;
        let mut text = format!(
            "paused by the breaker: {}\n  failure: {}",
            reason.message, reason.signature
        );
        for log in &reason.logs {
            text.push_str(&format!("\n  log: {log}"));
        }
        for item in &reason.check {
            text.push_str(&format!("\n  check: {item}"));
        }
        text.push_str(&format!(
            "\n  jobs already queued go on; nothing new is submitted until `embedfleet resume \
             --run-dir {}`",
            self.run_dir.display()
        ));
        self.console.say(text);
        self.notify(&Event::Paused {
            message: reason.message.clone(),
            signature: reason.signature.clone(),
            job: name.to_string(),
            log,
        });
        Ok(())
    }

    /// Whether a queue other than `queue` can take jobs: a cap above 0, neither refused nor
    /// set aside.
    fn another_queue_usable(&self, queue: &str) -> Result<bool> {
        Ok(self
            .caps()?
            .iter()
            .any(|(q, cap)| q != queue && *cap > 0 && !self.refused.contains_key(q)))
    }

    /// Sends no more jobs to `queue`, saying why (`refused_by_device`: its node's device refused
    /// the job, exit 5, not a streak of failures), until a `resume`.
    fn set_queue_aside(
        &mut self,
        queue: &str,
        reason: &embedfleet_core::rundb::PauseReason,
        job: &str,
        refused_by_device: bool,
        log: Option<String>,
    ) {
        let message = if refused_by_device {
            format!("job {job} was refused by its node's device")
        } else {
            format!(
                "{} jobs in a row there failed the same way",
                reason.jobs.len()
            )
        };
        let why = format!(
            "set aside by the breaker: {message} ({}); `embedfleet resume` sends jobs there again",
            reason.signature
        );
        let mut text = format!("queue {queue}: {why}");
        for log in &reason.logs {
            text.push_str(&format!("\n  log: {log}"));
        }
        text.push_str("\n  its batches go to the other queues");
        self.console.say(text);
        self.refused.insert(queue.to_string(), why.clone());
        self.trips.set_aside.insert(queue.to_string(), why);
        self.report.set_aside.push(queue.to_string());
        self.notify(&Event::QueueSetAside {
            queue: queue.to_string(),
            message,
            signature: reason.signature.clone(),
            job: job.to_string(),
            log,
        });
    }

    /// After a `resume` (paused or not), the queues the breaker set aside take jobs again.
    pub(super) fn bring_back_set_aside(&mut self) -> Result<()> {
        let resumes = self.db.resumes()?;
        if resumes == self.trips.resumes_seen {
            return Ok(());
        }
        self.trips.resumes_seen = resumes;
        self.trips.queues.clear();
        for (queue, _) in std::mem::take(&mut self.trips.set_aside) {
            self.refused.remove(&queue);
            self.console.say(format!(
                "queue {queue}: resumed; the breaker's set-aside is lifted, jobs go there again"
            ));
        }
        Ok(())
    }

    /// The queues the breaker set aside, and why (for the snapshot).
    pub(super) fn set_aside(&self) -> &std::collections::BTreeMap<String, String> {
        &self.trips.set_aside
    }

    /// The user resumed a run the breaker paused: the batches that failed (for good, during
    /// the streak or before) get a fresh set of attempts, as a new `submit` would give them.
    pub(super) fn resumed_after_trip(&mut self) -> Result<()> {
        self.trips.tripped = false;
        self.trips.breaker.success();
        let reset = self.db.reset_failed_batches()?;
        let open: BTreeSet<i64> = self.db.open_jobs()?.iter().map(|j| j.batch_id).collect();
        self.following
            .attempts
            .retain(|batch, _| open.contains(batch));
        self.report.failed.clear();
        self.console.say(format!(
            "resumed after the breaker's pause: {reset} batches that failed are tried again"
        ));
        Ok(())
    }

    /// Batch `batch` was marked failed for good.
    pub(super) fn batch_failed(&self, batch: i64, job: &str, log: Option<&str>, why: &str) {
        self.notify(&Event::BatchFailed {
            batch,
            job: job.to_string(),
            reason: why.to_string(),
            log: log.map(str::to_string),
        });
    }

    /// Every batch is done or failed and no job is open: `finished`, once per stretch of work
    /// (a loop that found nothing to do sends none; a trial is not the run's end).
    pub(super) fn settled(&mut self) -> Result<()> {
        if self.opts.session.trial.is_some()
            || self.counts.jobs_ended == self.counts.jobs_ended_at_finish
        {
            return Ok(());
        }
        self.counts.jobs_ended_at_finish = self.counts.jobs_ended;
        let by_state = self.db.status()?.batches_by_state;
        let count = |state: BatchState| by_state.get(state.as_str()).copied().unwrap_or(0);
        self.notify(&Event::Finished {
            batches_done: count(BatchState::Done),
            batches_failed: count(BatchState::Failed),
        });
        Ok(())
    }

    /// Gives hooks still running a chance to end before the loop returns (the process may exit
    /// right after, cutting off the last `finished`); bounded by the hook's timeout.
    pub(super) fn wait_for_notify(&self) {
        if self.notifier.is_enabled() && !self.notifier.wait(self.notifier.max_run_time()) {
            self.console
                .say("the notify command is still running; leaving it behind");
        }
    }
}
