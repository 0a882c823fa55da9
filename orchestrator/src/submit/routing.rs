//! The submit loop's side of routing ([`crate::route`]): the scheduler's and run.db's part
//! around [`Routing`], which holds the decisions and the bookkeeping (the simulator calls the
//! same). The router learns each queue from the run's history once at the start, then from
//! each job the loop sees start or end; each round it decides where batches go, which queued
//! jobs move, and which batches get a speculative twin; the first of two twins to finish its
//! batch has the other cancelled.

use std::collections::{BTreeMap, BTreeSet};

use embedfleet_core::owner::unix_now;
use embedfleet_core::rundb::{JobAttemptCursor, JobRow};
use embedfleet_core::state::{BatchState, JobStatus};
use embedfleet_core::BatchId;

use super::error::Result;
use super::submit_loop::SubmitLoop;
use crate::route::{JobEnd, Pending, RoutePlan, Routing, Seen};

/// How often the scheduler is asked when it expects the queued jobs to start: an estimate
/// moves slowly, and the question costs the controller a scheduling pass per job.
const ESTIMATES_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl SubmitLoop<'_> {
    /// The loop's routing, its router taught every job of the run so far (once per loop:
    /// later jobs are taught as the loop sees them).
    pub(super) fn learned_routing(&self) -> Result<Routing> {
        let mut routing = Routing::new(
            self.opts.policy.route,
            self.opts.policy.speculate,
            self.max_jobs(),
        );
        let router = &mut routing.router;
        let (attempts, _) = self.db.job_attempts_since(&JobAttemptCursor::default())?;
        let mut seen = BTreeSet::new();
        for a in attempts {
            if !seen.insert(a.name.clone()) {
                continue; // a multi-node job: one row per batch, one job
            }
            if let (Some(submitted), Some(started)) = (a.submit_s, a.start_s) {
                router.started(&a.queue, submitted, started);
            }
            if let (Some(end), false) = (a.end_s, a.state.is_open()) {
                let accepted = a.native_id.is_some();
                let how = JobEnd::of_record(a.state, accepted, a.exit_reason.as_deref());
                router.ended(&a.queue, how, a.start_s, end);
            }
        }
        Ok(routing)
    }

    /// The loop saw job `row` change from its recorded state to `now_status`.
    pub(super) fn route_saw(&mut self, row: &JobRow, now_status: JobStatus) {
        if self.routing.saw(row, now_status, unix_now()) == Seen::Requeued {
            self.report.requeued += 1;
        }
    }

    /// Job `row` ended as `status`. One the loop never saw running (shorter than a poll, or run
    /// while no loop ran) has its start read from its embed runs' record, ingested just
    /// before, so its queue learns its start and run time all the same. A read error only
    /// leaves the start unknown: it is a refinement.
    pub(super) fn route_saw_end(&mut self, row: &JobRow, status: JobStatus) {
        let began = if row.state == JobStatus::Running {
            None
        } else {
            self.db.job_run_began(&row.name).unwrap_or_else(|e| {
                tracing::info!(job = %row.name, "its embed run's start unread: {e}");
                None
            })
        };
        self.routing.saw_end_unseen(row, status, began, unix_now());
    }

    /// Asks the scheduler, at most once a minute, when it expects the queued jobs among `open`
    /// to start (adaptive route only). An error is only logged: estimates are a refinement.
    pub(super) fn refresh_estimates(&mut self) -> Result<()> {
        if self.opts.policy.route != crate::route::Route::Adaptive
            || self
                .asked
                .estimates
                .queued
                .is_some_and(|at| at.elapsed() < ESTIMATES_EVERY)
        {
            return Ok(());
        }
        let open = self.db.open_jobs()?;
        let queued: Vec<&JobRow> = open
            .iter()
            .filter(|r| r.state == JobStatus::Pending)
            .collect();
        if queued.is_empty() {
            return Ok(());
        }
        self.asked.estimates.queued = Some(std::time::Instant::now());
        let handles: Vec<_> = queued
            .iter()
            .filter_map(|r| super::follow::handle(r))
            .collect();
        match self.scheduler.start_estimates(&handles) {
            Ok(estimates) => {
                for row in queued {
                    let id = row
                        .scheduler_id
                        .as_deref()
                        .map(crate::scheduler::SchedulerJobId::new);
                    if let Some(start) = id.and_then(|id| estimates.get(&id)) {
                        self.routing.router.estimated(&row.name, &row.queue, *start);
                    }
                }
            }
            Err(e) => tracing::info!("no start estimates from the scheduler this time: {e}"),
        }
        Ok(())
    }

    /// Asks the scheduler, at most once a minute per queue, when a job sent now to each queue
    /// with a free slot would start (adaptive route only; Slurm's `sbatch --test-only`, which
    /// queues nothing), with the script the next job there would have. An error is only
    /// logged: estimates are a refinement.
    pub(super) fn refresh_new_job_estimates(
        &mut self,
        caps: &BTreeMap<String, u32>,
        open: &[JobRow],
        pending: &[i64],
        disabled: &BTreeSet<String>,
    ) {
        if self.opts.policy.route != crate::route::Route::Adaptive || pending.is_empty() {
            return;
        }
        for (queue, cap) in caps {
            // One row per batch of a multi-node job: jobs are counted by name.
            let jobs: BTreeSet<&str> = open
                .iter()
                .filter(|r| &r.queue == queue)
                .map(|r| r.name.as_str())
                .collect();
            let asked = self.asked.estimates.new_job.get(queue);
            if disabled.contains(queue)
                || jobs.len() as u32 >= *cap
                || asked.is_some_and(|at| at.elapsed() < ESTIMATES_EVERY)
            {
                continue;
            }
            self.asked
                .estimates
                .new_job
                .insert(queue.clone(), std::time::Instant::now());
            let nodes = self.nodes().max(1).min(pending.len());
            let probe = crate::route::PlannedJob {
                queue: queue.clone(),
                batches: pending[..nodes].to_vec(),
            };
            let submission = match self.render(&probe, 0) {
                Ok((files, text)) => crate::scheduler::JobSubmission::new(
                    files.name,
                    queue.as_str(),
                    crate::scheduler::JobScript::Text(text),
                )
                .workdir(&self.run_dir),
                Err(e) => {
                    tracing::info!(queue = %queue, "no job to ask the scheduler about: {e}");
                    continue;
                }
            };
            match self.scheduler.new_job_start(&submission) {
                Ok(Some(start)) => self.routing.router.new_job_estimated(queue, start),
                Ok(None) => {}
                Err(e) => tracing::info!(
                    queue = %queue,
                    "no start estimate for a new job from the scheduler this time: {e}"
                ),
            }
        }
    }

    /// This round's plan from as few of the batches without a job as it uses. Every poll
    /// ends in a round, and most send nothing (every queue full): reading every such batch
    /// (2,075 at the start of the study's run) to use none was the round's one read that grew
    /// with the run. It reads [`Pending::to_read_first`] of them, and [`Pending::more`] while
    /// a plan walks to the end of what it read. The trial's scope is one batch: it reads all.
    pub(super) fn plan_round(
        &mut self,
        caps: &BTreeMap<String, u32>,
        open: &[JobRow],
        disabled: &BTreeSet<String>,
    ) -> Result<RoutePlan> {
        let nodes = self.nodes();
        let mut want = Pending::to_read_first(caps, |_| nodes);
        let (mut batches, mut cut) = self.first_pending(want)?;
        self.refresh_new_job_estimates(caps, open, &batches, disabled);
        loop {
            let plan = self.route_round(
                caps,
                open,
                Pending {
                    batches: &batches,
                    cut,
                },
                disabled,
            );
            if !plan.cut_short {
                return Ok(plan);
            }
            want = Pending::more(want);
            (batches, cut) = self.first_pending(want)?;
        }
    }

    /// The first `want` batches without a job in this loop's scope, and whether more follow.
    fn first_pending(&self, want: usize) -> Result<(Vec<i64>, bool)> {
        if self.opts.session.trial.is_some() {
            return Ok((self.in_scope(self.db.batches_without_job()?), false));
        }
        let mut first = self.db.first_batches_without_job(want.saturating_add(1))?;
        let cut = first.len() > want;
        first.truncate(want);
        Ok((first, cut))
    }

    /// A plan from these open jobs and batches without a job.
    pub(super) fn route_round(
        &mut self,
        caps: &BTreeMap<String, u32>,
        open: &[JobRow],
        pending: Pending<'_>,
        disabled: &BTreeSet<String>,
    ) -> RoutePlan {
        let nodes = self.nodes();
        self.routing
            .round(caps, |_| nodes, open, pending, disabled, unix_now())
    }

    /// Cancels the queued jobs the route moves; their batches are routed again once the
    /// scheduler reports the job ended (till then it holds its queue's place).
    pub(super) fn apply_moves(&mut self, plan: &RoutePlan, open: &[JobRow]) -> Result<()> {
        for mv in &plan.moves {
            let Some(row) = open.iter().find(|r| r.name == mv.job) else {
                continue;
            };
            let Some(handle) = super::follow::handle(row) else {
                continue;
            };
            if self.routing.cancelling(&mv.job) {
                continue;
            }
            if let Err(e) = self.scheduler.cancel(&handle) {
                self.console.say(format!(
                    "could not move job {} ({e}); it stays queued",
                    mv.job
                ));
                continue;
            }
            let reason = self.routing.moved(mv, row, unix_now());
            self.console.say(format!("job {} {reason}", mv.job));
        }
        Ok(())
    }

    /// Job `finished` ended: every other open job of a batch it finished (a speculative twin)
    /// is cancelled, and what that one ran is counted as the twins' cost.
    pub(super) fn cancel_twins_of(&mut self, finished: &str, batches: &[i64]) -> Result<()> {
        let mut done = Vec::new();
        for &b in batches {
            if self.db.batch_state(BatchId(b))? == Some(BatchState::Done) {
                done.push(b);
            }
        }
        if done.is_empty() {
            return Ok(());
        }
        let open = self.db.open_jobs()?;
        for rows in self.routing.twins_to_cancel(finished, &done, &open) {
            let name = rows[0].name.clone();
            if let Some(handle) = super::follow::handle(rows[0]) {
                if let Err(e) = self.scheduler.cancel(&handle) {
                    tracing::info!(job = %name, "cancelling the slower twin: {e}");
                }
            }
            let reason = self.routing.twin_cancelled(&rows, finished, unix_now());
            self.console.say(format!("job {name} cancelled: {reason}"));
        }
        Ok(())
    }

    /// Job `name` ended: if this loop cancelled it (a move, a slower twin), why; a move gives
    /// its batches back the try it cost.
    pub(super) fn cancelled_by_routing(&mut self, rows: &[&JobRow]) -> Option<String> {
        let (why, moved) = self.routing.ended_by_routing(rows, unix_now())?;
        if moved {
            for r in rows {
                if let Some(n) = self.following.attempts.get_mut(&r.batch_id) {
                    *n = n.saturating_sub(1);
                }
            }
        }
        Some(why)
    }
}
