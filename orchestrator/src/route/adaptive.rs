//! The adaptive route. Each known queue is a set of slots (its cap), each free at a time: now
//! for room, or when an open job is expected to end. Batches, in order, each take the slot
//! where they would finish soonest: a slot's free time plus the queue's cost (expected start
//! delay plus run time, stretched by the rework of the jobs it loses). A batch whose best slot
//! is free now is sent now; one whose best slot frees later waits for it, and nothing is sent
//! to a slow queue that a faster one would finish first. List scheduling on expected times: it
//! needs no tuning, and a round stops as soon as no slot is free now (at most one pass over the
//! pending batches, each against every queue's slots).

use super::tail::{moves_and_twins, Slots};
use super::{PlannedJob, QueueModel, QueueOutlook, QueueView, Round, RoutePlan, Router};

/// The run time assumed before any job of the run has finished (the study's batch took ~40 min).
pub(super) const DEFAULT_RUN_S: f64 = 3600.0;
/// The largest loss share planned with: a queue that loses every job would cost infinitely.
const MAX_LOSS: f64 = 0.9;
/// A known queue whose oldest queued job has waited this many times its learned start delay
/// (plus [`STOPPED_SLACK_S`]) is taken to have stopped starting jobs.
pub(super) const STOPPED_FACTOR: f64 = 3.0;
pub(super) const STOPPED_SLACK_S: f64 = 60.0;

/// One queue as this round assesses it.
#[derive(Debug, Clone)]
pub(super) struct Assessed<'a> {
    pub view: &'a QueueView,
    pub model: QueueModel,
    pub run_s: f64,
    /// The longest any queued (not started) job has waited.
    pub longest_wait_s: f64,
    /// The start a new job there is expected to wait (None: no job of it started yet).
    pub start_s: Option<f64>,
    pub stopped: bool,
}

impl Assessed<'_> {
    pub fn known(&self) -> bool {
        self.start_s.is_some()
    }

    /// Seconds from sending a job here to its batch's end, counting the rework of losses:
    /// each try costs a start and a run, and a share `p` of tries are lost (1/(1-p) tries).
    pub fn cost_s(&self) -> f64 {
        let loss = self.model.loss_share().min(MAX_LOSS);
        (self.start_s.unwrap_or(0.0) + self.run_s) / (1.0 - loss)
    }

    /// Seconds until a queued job that has waited `waited_s` is expected to start: what is
    /// left of the learned delay, or, past it, as long again as it has overstayed (waits are
    /// heavy-tailed: a job that overstays is likely to overstay more).
    pub fn start_left_s(&self, waited_s: f64) -> f64 {
        let learned = self.model.start_delay.get().unwrap_or(0.0);
        (learned - waited_s).abs()
    }

    pub fn usable(&self) -> bool {
        self.view.usable && self.view.cap > 0
    }
}

pub(super) fn assess<'a>(router: &Router, round: &Round<'a>) -> Vec<Assessed<'a>> {
    let known_runs: Vec<f64> = round
        .queues
        .iter()
        .filter_map(|q| router.model(&q.name)?.run_time.get())
        .collect();
    let run_default = if known_runs.is_empty() {
        DEFAULT_RUN_S
    } else {
        known_runs.iter().sum::<f64>() / known_runs.len() as f64
    };
    round
        .queues
        .iter()
        .map(|view| {
            let model = router.model(&view.name).cloned().unwrap_or_default();
            let longest_wait_s = view
                .jobs
                .iter()
                .filter(|j| j.started_s.is_none())
                .map(|j| (round.now_s - j.submitted_s).max(0.0))
                .fold(0.0, f64::max);
            let learned = model.start_delay.get();
            let stopped =
                learned.is_some_and(|d| longest_wait_s > STOPPED_FACTOR * d + STOPPED_SLACK_S);
            Assessed {
                view,
                run_s: model.run_time.get().unwrap_or(run_default),
                longest_wait_s,
                // A new job waits at least as long as the queue's oldest queued one has.
                start_s: learned.map(|d| d.max(longest_wait_s)),
                stopped,
                model,
            }
        })
        .collect()
}

pub(super) fn plan(router: &Router, round: &Round<'_>) -> RoutePlan {
    let queues = assess(router, round);
    let usable: Vec<&Assessed> = queues.iter().filter(|q| q.usable()).collect();
    let mut plan = RoutePlan {
        outlook: outlook_of(&queues, round),
        ..RoutePlan::default()
    };
    if usable.len() <= 1 {
        // One queue: nothing to choose between; it is filled as the static route fills it.
        plan.jobs = super::static_jobs(round);
        return plan;
    }
    let nodes = round.nodes.max(1);
    let mut chunks = round.pending.chunks(nodes).peekable();
    // A queue no job of which has started yet gets one, to learn from, and no more.
    for q in usable
        .iter()
        .filter(|q| !q.known() && q.view.jobs.is_empty())
    {
        let Some(chunk) = chunks.next() else { break };
        plan.jobs.push(job(q, chunk));
    }
    let mut slots = Slots::of(&queues, round.now_s);
    // Batches whose best slot frees later wait for it (taking it on paper), so that a later
    // batch may still find a slower queue's free slot the better one.
    let mut waiting = false;
    while let Some(chunk) = chunks.peek() {
        if !(0..queues.len()).any(|i| slots.free_now(i)) {
            break;
        }
        let Some((at, i)) = slots.best(&queues) else {
            break;
        };
        if plan.next.is_none() {
            plan.next = Some(if slots.free_now(i) {
                goes_why(chunk[0], &queues, i, &slots, round.now_s)
            } else {
                waits_why(chunk[0], &queues[i], at - round.now_s)
            });
        }
        if slots.free_now(i) {
            plan.jobs.push(job(&queues[i], chunk));
        } else {
            waiting = true;
        }
        slots.take(i, queues[i].cost_s());
        chunks.next();
    }
    let no_batch_waiting = !waiting && chunks.peek().is_none();
    let (moves, twins) = moves_and_twins(&queues, &mut slots, round, no_batch_waiting);
    plan.moves = moves;
    plan.twins = twins;
    plan
}

fn job(q: &Assessed, chunk: &[i64]) -> PlannedJob {
    PlannedJob {
        queue: q.view.name.clone(),
        batches: chunk.to_vec(),
    }
}

fn goes_why(batch: i64, queues: &[Assessed], i: usize, slots: &Slots, now: f64) -> String {
    let q = &queues[i];
    let mut why = format!(
        "batch {batch} goes to {}: done in ~{} (start ~{}, run ~{}",
        q.view.name,
        crate::status::duration(q.cost_s()),
        crate::status::duration(q.start_s.unwrap_or(0.0)),
        crate::status::duration(q.run_s),
    );
    if q.model.loss_share() > 0.0 {
        why.push_str(&format!(", {:.0} % lost", 100.0 * q.model.loss_share()));
    }
    why.push(')');
    let others: Vec<String> = queues
        .iter()
        .enumerate()
        .filter(|(j, o)| *j != i && o.usable() && o.known())
        .filter_map(|(j, o)| {
            let at = slots.earliest(j)?;
            Some(format!(
                "{} ~{}",
                o.view.name,
                crate::status::duration(at.max(now) - now + o.cost_s())
            ))
        })
        .collect();
    if !others.is_empty() {
        why.push_str(&format!("; elsewhere {}", others.join(", ")));
    }
    why
}

fn waits_why(batch: i64, q: &Assessed, in_s: f64) -> String {
    format!(
        "batch {batch} waits for a slot of {} (free in ~{}): sooner done there than anywhere free now",
        q.view.name,
        crate::status::duration(in_s)
    )
}

/// Every queue's outlook, for either route (the static route shows what it would learn).
pub(super) fn outlook(router: &Router, round: &Round<'_>) -> Vec<QueueOutlook> {
    outlook_of(&assess(router, round), round)
}

fn outlook_of(queues: &[Assessed], _round: &Round<'_>) -> Vec<QueueOutlook> {
    queues
        .iter()
        .map(|q| QueueOutlook {
            queue: q.view.name.clone(),
            start_delay_s: q.model.start_delay.get(),
            longest_wait_s: q.longest_wait_s,
            expected_start_s: q.start_s,
            run_time_s: q.model.run_time.get(),
            loss_share: q.model.loss_share(),
            expected_finish_s: (q.usable() && q.known()).then(|| q.cost_s()),
            state: if !q.usable() {
                "unusable"
            } else if !q.known() {
                "trial"
            } else if q.stopped {
                "stopped"
            } else {
                "ok"
            }
            .into(),
            jobs_started: q.model.start_delay.samples,
            finished: q.model.finished,
            preempted: q.model.preempted,
            walltime: q.model.walltime,
            failed: q.model.failed,
        })
        .collect()
}
