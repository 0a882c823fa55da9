//! The submit loop's side of routing ([`crate::route`]): the router learns each queue from the
//! run's history once at the start, then from each job the loop sees start or end; each round
//! it decides where batches go, which queued jobs move, and which batches get a speculative
//! twin; the first of two twins to finish its batch has the other cancelled.

use std::collections::{BTreeMap, BTreeSet};

use embedfleet_core::owner::unix_now;
use embedfleet_core::rundb::{JobAttemptCursor, JobRow};
use embedfleet_core::state::{BatchState, JobStatus};
use embedfleet_core::status_snapshot::RoutingState;
use embedfleet_core::BatchId;

use super::{Result, SubmitLoop};
use crate::route::{JobEnd, OpenJob, QueueView, Round, RoutePlan, Router};

/// What routing has done in this loop, for the snapshot and the report.
#[derive(Debug, Default, Clone)]
pub(super) struct RoutingTally {
    pub twins: u64,
    pub moves: u64,
    pub twin_node_hours: f64,
    pub next: Option<String>,
    pub outlook: Vec<crate::route::QueueOutlook>,
    /// Jobs this loop cancelled to move them or as the slower twin, until the scheduler says
    /// they ended (they hold their queue's place till then, as the scheduler counts them):
    /// why, and whether it was a move (not a failed try of its batches).
    pub cancelling: BTreeMap<String, (String, bool)>,
    /// When the scheduler was last asked for its start estimates.
    pub estimates_at: Option<std::time::Instant>,
    /// When it was last asked when a new job would start in each queue.
    pub new_job_estimates_at: BTreeMap<String, std::time::Instant>,
}

/// How often the scheduler is asked when it expects the queued jobs to start: an estimate
/// moves slowly, and the question costs the controller a scheduling pass per job.
const ESTIMATES_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl SubmitLoop<'_> {
    /// The router, taught every job of the run so far (once per loop: later jobs are taught
    /// as the loop sees them).
    pub(super) fn learned_router(&self) -> Result<Router> {
        let mut router = Router::new(self.opts.route);
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
                router.ended(&a.queue, JobEnd::of(a.state), a.start_s, end);
            }
        }
        Ok(router)
    }

    /// The loop saw job `row` change from its recorded state to `now_status`.
    pub(super) fn route_saw(&mut self, row: &JobRow, now_status: JobStatus) {
        let now = unix_now();
        match (row.state, now_status) {
            (JobStatus::Running, JobStatus::Running) => {}
            (_, JobStatus::Running) => {
                let submitted = row.submitted_s.unwrap_or(now);
                self.router
                    .job_started(&row.name, &row.queue, submitted, now);
            }
            // Back in the queue after running: the scheduler requeued it (a preemption).
            (JobStatus::Running, JobStatus::Pending) => {
                self.router
                    .ended(&row.queue, JobEnd::Preempted, row.started_s, now);
                self.report.requeued += 1;
            }
            (_, end) if !end.is_open() => {
                self.router.forget(&row.name);
                self.router
                    .ended(&row.queue, JobEnd::of(end), row.started_s, now);
            }
            _ => {}
        }
    }

    /// Asks the scheduler, at most once a minute, when it expects the queued jobs among `open`
    /// to start (adaptive route only). An error is only logged: estimates are a refinement.
    pub(super) fn refresh_estimates(&mut self) -> Result<()> {
        if self.opts.route != crate::route::Route::Adaptive
            || self
                .routing
                .estimates_at
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
        self.routing.estimates_at = Some(std::time::Instant::now());
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
                        self.router.estimated(&row.name, &row.queue, *start);
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
        if self.opts.route != crate::route::Route::Adaptive || pending.is_empty() {
            return;
        }
        for (queue, cap) in caps {
            // One row per batch of a multi-node job: jobs are counted by name.
            let jobs: BTreeSet<&str> = open
                .iter()
                .filter(|r| &r.queue == queue)
                .map(|r| r.name.as_str())
                .collect();
            let asked = self.routing.new_job_estimates_at.get(queue);
            if disabled.contains(queue)
                || jobs.len() as u32 >= *cap
                || asked.is_some_and(|at| at.elapsed() < ESTIMATES_EVERY)
            {
                continue;
            }
            self.routing
                .new_job_estimates_at
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
                Ok(Some(start)) => self.router.new_job_estimated(queue, start),
                Ok(None) => {}
                Err(e) => tracing::info!(
                    queue = %queue,
                    "no start estimate for a new job from the scheduler this time: {e}"
                ),
            }
        }
    }

    /// This round's plan: the open jobs by queue, the pending batches, and what is usable.
    pub(super) fn route_round(
        &mut self,
        caps: &BTreeMap<String, u32>,
        open: &[JobRow],
        pending: &[i64],
        disabled: &BTreeSet<String>,
    ) -> RoutePlan {
        let now = unix_now();
        let mut jobs: BTreeMap<&str, BTreeMap<&str, OpenJob>> = BTreeMap::new();
        for row in open {
            let job = jobs
                .entry(row.queue.as_str())
                .or_default()
                .entry(row.name.as_str())
                .or_insert_with(|| OpenJob {
                    name: row.name.clone(),
                    batches: Vec::new(),
                    submitted_s: row.submitted_s.unwrap_or(now),
                    started_s: (row.state == JobStatus::Running)
                        .then_some(row.started_s)
                        .flatten(),
                    cancelling: self.routing.cancelling.contains_key(&row.name),
                });
            job.batches.push(row.batch_id);
        }
        let queues: Vec<QueueView> = caps
            .iter()
            .map(|(name, cap)| QueueView {
                name: name.clone(),
                cap: *cap,
                usable: !disabled.contains(name),
                jobs: jobs
                    .remove(name.as_str())
                    .map(|j| j.into_values().collect())
                    .unwrap_or_default(),
            })
            .collect();
        let plan = self.router.plan(&Round {
            now_s: now,
            queues: &queues,
            pending,
            nodes: self.nodes(),
            speculate: self.opts.speculate,
        });
        self.routing.next = plan.next.clone();
        self.routing.outlook = plan.outlook.clone();
        plan
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
            if self.routing.cancelling.contains_key(&mv.job) {
                continue;
            }
            if let Err(e) = self.scheduler.cancel(&handle) {
                self.console.say(format!(
                    "could not move job {} ({e}); it stays queued",
                    mv.job
                ));
                continue;
            }
            let reason = format!("moved: {}", mv.why);
            let waited = unix_now() - row.submitted_s.unwrap_or_else(unix_now);
            self.router.gave_up_waiting(&mv.queue, waited);
            self.routing.moves += 1;
            self.console.say(format!("job {} {reason}", mv.job));
            self.routing
                .cancelling
                .insert(mv.job.clone(), (reason, true));
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
        let twins: BTreeMap<&str, &JobRow> = open
            .iter()
            .filter(|r| r.name != finished && done.contains(&r.batch_id))
            .map(|r| (r.name.as_str(), r))
            .collect();
        let now = unix_now();
        for (name, row) in twins {
            if self.routing.cancelling.contains_key(name) {
                continue;
            }
            if let Some(handle) = super::follow::handle(row) {
                if let Err(e) = self.scheduler.cancel(&handle) {
                    tracing::info!(job = %name, "cancelling the slower twin: {e}");
                }
            }
            let reason = format!("its batch was finished first by its twin {finished}");
            if row.state == JobStatus::Running {
                let ran = now - row.started_s.unwrap_or(now);
                self.routing.twin_node_hours += ran.max(0.0) / 3600.0 * self.nodes() as f64;
            }
            self.console.say(format!("job {name} cancelled: {reason}"));
            self.routing
                .cancelling
                .insert(name.to_string(), (reason, false));
        }
        Ok(())
    }

    /// Job `name` ended: if this loop cancelled it (a move, a slower twin), why; a move gives
    /// its batches back the try it cost.
    pub(super) fn cancelled_by_routing(&mut self, name: &str, rows: &[&JobRow]) -> Option<String> {
        let (why, moved) = self.routing.cancelling.remove(name)?;
        if moved {
            for r in rows {
                if let Some(n) = self.attempts.get_mut(&r.batch_id) {
                    *n = n.saturating_sub(1);
                }
            }
        }
        Some(why)
    }

    /// The routing part of the snapshot.
    pub(super) fn routing_state(&self) -> RoutingState {
        RoutingState {
            route: self.opts.route.name().into(),
            speculate: self.opts.speculate,
            next: self.routing.next.clone(),
            queues: self.routing.outlook.clone(),
            twins: self.routing.twins,
            moves: self.routing.moves,
            twin_node_hours: self.routing.twin_node_hours,
        }
    }
}
