//! The adaptive route. Each known queue is a set of slots (its cap), each free at a time: now
//! for room, or when an open job is expected to end. Batches, in order, each take the slot
//! where they would finish soonest: a slot's free time plus the queue's cost (expected start
//! delay plus run time, stretched by the rework of the jobs it loses). A batch whose best slot
//! is free now is sent now; one whose best slot frees later waits for it, and nothing is sent
//! to a slow queue that a faster one would finish first. A queue with nothing learned yet takes
//! part with a guessed start (`assess.rs`). List scheduling on expected times: it
//! needs no tuning, and a round stops as soon as no slot is free now (at most one pass over the
//! pending batches, each against every queue's slots). A round with no slot free now looks at
//! no batch; one that sends jobs looks at those and at the batches it sets to wait for a slow
//! queue's slot to be worth it, a number set by the queues, not by the run's size.
//!
//! Under a limit of jobs over all queues (`--max-jobs`) a place is what is scarce, not a slot:
//! a place given to a queue whose jobs wait three hours is one not given to a queue whose jobs
//! start in five minutes. The places are then shared out by what a place finishes there per
//! hour (its jobs' batches over their cost), the best queue first up to its cap; each queue
//! gets new jobs only within its share, until the batches left fit in one job per place: then,
//! at the tail, each batch goes where it finishes soonest again.

use super::assess::{assess, Assessed};
use super::tail::{moves_and_twins, Slots};
use super::{CutShort, PlannedJob, QueueOutlook, Round, RoutePlan, Router};

pub(super) fn plan(router: &Router, round: &Round<'_>) -> RoutePlan {
    let queues = assess(router, round);
    let usable = queues.iter().filter(|q| q.usable()).count();
    let mut plan = RoutePlan {
        outlook: outlook_of(&queues, round),
        ..RoutePlan::default()
    };
    if usable <= 1 {
        // One queue: nothing to choose between; it is filled as the static route fills it.
        (plan.jobs, plan.cut_short) = super::static_jobs(round);
        return plan;
    }
    let mut slots = Slots::of(&queues, round.now_s);
    let mut places = round.places();
    let Ok(share) = shares(&queues, round) else {
        plan.cut_short = true;
        return plan;
    };
    let mut sent = vec![0usize; queues.len()];
    let mut next = 0;
    // Batches whose best slot frees later wait for it (taking it on paper), so that a later
    // batch may still find a slower queue's free slot the better one.
    let mut waiting = false;
    // The end of a cut list is not the end of the batches: a plan that needs one past it is
    // cut short, and made again from more.
    while places > 0 && (next < round.pending.batches.len() || round.pending.cut) {
        let allowed = |i: usize| {
            share
                .as_ref()
                .is_none_or(|s| queues[i].view.jobs.len() + sent[i] < s[i])
        };
        if !(0..queues.len()).any(|i| allowed(i) && slots.free_now(i)) {
            break;
        }
        let Some((at, i)) = slots.best_among(&queues, allowed) else {
            break;
        };
        let end = next + queues[i].view.nodes.max(1);
        if end > round.pending.batches.len() && round.pending.cut {
            plan.cut_short = true;
            return plan;
        }
        let end = end.min(round.pending.batches.len());
        let chunk = &round.pending.batches[next..end];
        if plan.next.is_none() {
            plan.next = Some(if slots.free_now(i) {
                goes_why(chunk[0], &queues, i, &slots, round.now_s)
            } else {
                waits_why(chunk[0], &queues[i], at - round.now_s)
            });
        }
        if slots.free_now(i) {
            plan.jobs.push(job(&queues[i], chunk));
            places -= 1;
            sent[i] += 1;
        } else {
            waiting = true;
        }
        slots.take(i, queues[i].cost_s());
        next = end;
    }
    let batches_left = next < round.pending.batches.len() || round.pending.cut;
    if plan.next.is_none() && places == 0 && batches_left {
        let Some(batch) = round.pending.batches.get(next) else {
            plan.cut_short = true;
            return plan;
        };
        plan.next = Some(format!(
            "batch {batch} waits for a place: the run holds the {} jobs it may (--max-jobs)",
            round.open_jobs()
        ));
    }
    let no_batch_waiting = !waiting && !batches_left;
    let (moves, twins) = moves_and_twins(&queues, &mut slots, round, no_batch_waiting, places);
    plan.moves = moves;
    plan.twins = twins;
    plan
}

/// Each queue's share of the run's places under `max_jobs`: given out by the batches a place
/// finishes there per second, the best queue first, each up to its cap (the share that
/// finishes the most batches per hour: a fractional knapsack). `None` without a limit, and at
/// the tail, where the batches left fit in one job per place of the share: each then goes
/// where it finishes soonest. `Err` where a cut `pending` list cannot tell which.
fn shares(queues: &[Assessed], round: &Round<'_>) -> Result<Option<Vec<usize>>, CutShort> {
    let Some(max_jobs) = round.max_jobs else {
        return Ok(None);
    };
    let mut left = max_jobs as usize;
    let rate = |q: &Assessed| q.view.nodes.max(1) as f64 / q.cost_s().max(1.0);
    let mut order: Vec<usize> = (0..queues.len())
        .filter(|&i| queues[i].usable() && !queues[i].stopped)
        .collect();
    order.sort_by(|&a, &b| rate(&queues[b]).total_cmp(&rate(&queues[a])));
    // Queues alike (within 1 %: new ones, all guessed alike) take turns, as the static route
    // fills them: which of them is better is not known yet.
    let mut share = vec![0; queues.len()];
    let mut k = 0;
    while k < order.len() {
        let alike: Vec<usize> = order[k..]
            .iter()
            .copied()
            .take_while(|&i| rate(&queues[i]) >= 0.99 * rate(&queues[order[k]]))
            .collect();
        k += alike.len();
        while left > 0 {
            let before = left;
            for &i in &alike {
                if left > 0 && share[i] < queues[i].view.cap as usize {
                    share[i] += 1;
                    left -= 1;
                }
            }
            if left == before {
                break;
            }
        }
    }
    let per_round: usize = (0..queues.len())
        .map(|i| share[i] * queues[i].view.nodes.max(1))
        .sum();
    Ok(round.pending.more_than(per_round)?.then_some(share))
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
            unusable_why: None,
        })
        .collect()
}
