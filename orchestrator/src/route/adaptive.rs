//! The adaptive route. Each known queue is a set of slots (its cap), each free at a time: now
//! for room, or when an open job is expected to end. Batches, in order, each take the slot
//! where they would finish soonest: a slot's free time plus the queue's cost (expected start
//! delay plus run time, stretched by the rework of the jobs it loses). A batch whose best slot
//! is free now is sent now; one whose best slot frees later waits for it, and nothing is sent
//! to a slow queue that a faster one would finish first. A queue with nothing learned yet takes
//! part with a guessed start (`assess.rs`). List scheduling on expected times: it
//! needs no tuning, and a round stops as soon as no slot is free now (at most one pass over the
//! pending batches, each against every queue's slots).

use super::assess::{assess, Assessed};
use super::tail::{moves_and_twins, Slots};
use super::{PlannedJob, QueueOutlook, Round, RoutePlan, Router};

pub(super) fn plan(router: &Router, round: &Round<'_>) -> RoutePlan {
    let queues = assess(router, round);
    let usable = queues.iter().filter(|q| q.usable()).count();
    let mut plan = RoutePlan {
        outlook: outlook_of(&queues, round),
        ..RoutePlan::default()
    };
    if usable <= 1 {
        // One queue: nothing to choose between; it is filled as the static route fills it.
        plan.jobs = super::static_jobs(round);
        return plan;
    }
    let nodes = round.nodes.max(1);
    let mut chunks = round.pending.chunks(nodes).peekable();
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
        crate::status::duration(q.start_s),
        crate::status::duration(q.run_s),
    );
    if q.model.loss_share() > 0.0 {
        why.push_str(&format!(", {:.0} % lost", 100.0 * q.model.loss_share()));
    }
    why.push(')');
    let others: Vec<String> = queues
        .iter()
        .enumerate()
        .filter(|(j, o)| *j != i && o.usable())
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

fn outlook_of(queues: &[Assessed], round: &Round<'_>) -> Vec<QueueOutlook> {
    queues
        .iter()
        .map(|q| QueueOutlook {
            queue: q.view.name.clone(),
            start_delay_s: q.model.start_delay.get(),
            longest_wait_s: q.longest_wait_s,
            expected_start_s: Some(q.start_s),
            run_time_s: q.model.run_time.get(),
            loss_share: q.model.loss_share(),
            estimate_error_s: q.model.estimate_error.get(),
            scheduler_start_s: q.new_job_estimate.map(|at| (at - round.now_s).max(0.0)),
            expected_finish_s: q.usable().then(|| q.cost_s()),
            state: if !q.usable() {
                "unusable"
            } else if q.stopped {
                "stopped"
            } else if !q.known() {
                "new"
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
