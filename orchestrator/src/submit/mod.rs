/*!
The submit loop: keeps every queue filled up to its cap with embed jobs until every batch is
done or given up on.

Each round it (1) settles jobs left `submitting` by a crash between recording a job and hearing
back from the scheduler (looked up by name: adopted if queued, forgotten if not), (2) polls the
open jobs and records their states, retrying a batch whose job ended without finishing it,
(3) unless paused, submits pending batches to queues with room. Caps, the pause switch and the
jobs live in run.db, so `pause`, `resume` and `queues set` from another shell reach a running
loop within one poll, and a restarted loop adopts the jobs its predecessor left queued.

Whether a batch is done is decided by run.db (the embed job marks it), never by the job's exit
status alone: a job that ends with "partial" (some papers quarantined) finished its batch, and
a job reported "completed" whose batch is not done is retried.

Jobs in a row that fail alike pause the run ([`breaker`]); the events a user wants to hear of
(finished, paused, a batch failed for good) go to the run config's notify hook
([`crate::notify`]); both are wired in by `alerts`.
*/

mod alerts;
pub mod breaker;
mod console;
pub mod disk;
mod error;
mod follow;
mod follow_up;
mod interrupt;
mod job_files;
mod launch;
mod naming;
mod options;
mod outcome;
mod policy;
mod routing;
mod submit_loop;
mod watch;

use std::collections::BTreeSet;

use embedfleet_core::rundb::RunDb;

use crate::route::Pending;
pub use crate::route::{fill_queues, PlannedJob};
pub use console::Console;
pub use error::{Result, SubmitError};
pub use follow_up::{FollowUp, FollowUpRound};
pub(crate) use job_files::{with_binary, JobFiles};
pub use naming::{fit_job_name, job_name, run_tag};
pub use options::SubmitOptions;
pub use outcome::{SubmitReport, Submitted};
pub use policy::{LoopPolicy, SessionOptions};
use submit_loop::SubmitLoop;
pub use watch::LOOP_LOCK_FILE;

/// The submit stage's one entry point: on `db` (the run's run.db, open already; read-only for
/// a dry run), runs the submit loop until every batch is done or failed (or forever with
/// `watch`), driving `follow_up` once per round as well (see [`FollowUp`]: the loop then ends
/// when every batch is settled and the follow-up work is not busy); or, with `dry_run`, only
/// renders the next round's job scripts. `db` is handed back (`run` holds one handle for all
/// its stages; a command records its line with it).
pub fn submit<'a>(
    db: RunDb,
    options: &'a SubmitOptions,
    follow_up: Option<&'a mut dyn FollowUp>,
    dry_run: bool,
) -> Result<(Submitted, RunDb)> {
    if dry_run {
        return would_send(db, options);
    }
    let mut lp = SubmitLoop::new_on(options, db)?;
    lp.follow_up = follow_up;
    let (report, db) = lp.run_keeping_db()?;
    Ok((Submitted::Ran(Box::new(report)), db))
}

/// The job scripts the next round would submit, without submitting or recording anything.
fn would_send(db: RunDb, options: &SubmitOptions) -> Result<(Submitted, RunDb)> {
    // The run config's `env` values may be secrets (tokens, keys): printed as ***.
    let mut masked = options.clone();
    for value in masked.config.scheduler.script.env.values_mut() {
        *value = "***".into();
    }
    let options = &masked;
    let mut lp = SubmitLoop::with_db(options, db)?;
    let caps = match &options.queues {
        Some(q) => q.clone(),
        None => lp.db.queue_caps()?,
    };
    if caps.is_empty() {
        return Err(SubmitError::NoQueues);
    }
    lp.routing = lp.learned_routing()?;
    let open = lp.db.open_jobs()?;
    let pending = lp.db.batches_without_job()?;
    let plan = lp.route_round(&caps, &open, Pending::all(&pending), &BTreeSet::new());
    let scripts = plan
        .jobs
        .iter()
        .map(|job| {
            let attempt = lp.next_attempt(&job.batches)?;
            let (files, script) = lp.render(job, attempt)?;
            Ok((files.name, script))
        })
        .collect::<Result<_>>()?;
    Ok((Submitted::WouldSend(scripts), lp.db))
}

#[cfg(test)]
mod tests;
