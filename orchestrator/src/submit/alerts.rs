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
use super::{Result, SubmitLoop};
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
        if all_done {
            self.breaker.success();
            return Ok(());
        }
        if self.tripped {
            // Jobs that were already queued when the breaker tripped fail the same way: the
            // pause and its reason stand, and one `paused` event is enough.
            return Ok(());
        }
        let log = rows[0].log.clone();
        let Some(signature) = Signature::of(state, status, log.as_deref().map(Path::new)) else {
            return Ok(());
        };
        let failure = Failure {
            job: name.to_string(),
            log: log.clone(),
            signature,
        };
        let Some(reason) = self.breaker.failed(failure) else {
            return Ok(());
        };
        self.db.pause_for(&reason)?;
        self.tripped = true;
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

    /// The user resumed a run the breaker paused: the batches that failed (for good, during
    /// the streak or before) get a fresh set of attempts, as a new `submit` would give them.
    pub(super) fn resumed_after_trip(&mut self) -> Result<()> {
        self.tripped = false;
        self.breaker.success();
        let reset = self.db.reset_failed_batches()?;
        let open: BTreeSet<i64> = self.db.open_jobs()?.iter().map(|j| j.batch_id).collect();
        self.attempts.retain(|batch, _| open.contains(batch));
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
        if self.opts.trial.is_some() || self.jobs_ended == self.jobs_ended_at_finish {
            return Ok(());
        }
        self.jobs_ended_at_finish = self.jobs_ended;
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
