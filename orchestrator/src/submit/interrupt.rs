//! The loop stopped by Ctrl-C or SIGTERM (`embedfleet_core::stop_signal`): this machine's own
//! jobs (the local backend's child processes, in groups of their own) are stopped, since
//! nothing would watch them and they would keep the CPU busy; a scheduler's jobs keep running,
//! and the next `submit` adopts them. Either way the user is told which, and how to go on.

use embedfleet_core::stop_signal;

use super::error::{Result, SubmitError};
use super::follow;
use super::submit_loop::SubmitLoop;
use crate::scheduler::{Backend, JobState};
use embedfleet_core::state::JobStatus;

impl SubmitLoop<'_> {
    /// Ends the loop for `signal` (see the module docs).
    pub(super) fn interrupted(&mut self, signal: i32) -> Result<()> {
        let open = self.db.open_jobs()?;
        let backend = self.scheduler.backend();
        let said = if backend == Backend::Local {
            let jobs = follow::by_name(&open);
            for (name, rows) in &jobs {
                if let Some(job) = follow::handle(rows[0]) {
                    if let Err(e) = self.scheduler.cancel(&job) {
                        tracing::warn!(job = %name, "stopping the local job: {e}");
                        continue;
                    }
                }
                // Ended now, as cancelled: what it finished is taken in, and the next loop
                // sends its batches again at once instead of waiting out a "lost" time.
                self.ended(name, rows, &JobState::Cancelled, JobStatus::Cancelled)?;
            }
            format!(
                "stopped {} local job(s); `embedfleet run` (or `submit`) again embeds what they had not finished",
                jobs.len()
            )
        } else {
            format!(
                "{} job(s) keep running on {backend}; `embedfleet submit --run-dir {}` again adopts them",
                open.len(),
                self.run_dir.display()
            )
        };
        self.console.finish();
        Err(SubmitError::Interrupted {
            signal: stop_signal::name(signal),
            code: 128 + signal,
            said,
        })
    }
}
