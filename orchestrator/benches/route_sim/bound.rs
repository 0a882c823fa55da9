//! A wall time no routing can beat in a scenario's world: the batches over the most the queues
//! can finish per hour. Each place a queue gives the run (its cap, or a share of the run's job
//! limit) finishes a job's batches per the job's hold on it: its wait, at the best any
//! give-up-and-send-again rule gets from the wait's distribution, and its run, with the
//! rework of preemption (Little's law); each queue is bounded by its running limit too. Under
//! a limit of jobs over all queues, the places go to the queues that finish most per place
//! first, each up to what its cap and running limit can use (a fractional knapsack: no
//! integer share does better). A queue closed for a while loses what it would have done then,
//! less what its running jobs finish (half a run each on average). The run's first waits and
//! its last batches only add to it, so it is a bound, not a target.

use embedfleet_orchestrator::sample::Rng;

use super::world::{lognormal, QueueSpec, Scenario};
use super::{BATCHES, POLL_S, RUN_S};

/// The shortest mean wait, in hours, that any rule of giving up on a job after it has waited
/// `tau` and sending it again can get from a queue's wait distribution: E[min(W, tau)] / P(W <=
/// tau) at the best `tau` (giving up never is `tau` = infinity: the mean). Computed from 200,000
/// draws. At sigma 0.5 the best is never giving up (waits get no longer the longer one waits);
/// at sigma 1.5 giving up on the longest is worth it (scenario (e)'s speculation).
fn best_mean_wait_h(median_s: f64, sigma: f64) -> f64 {
    let mut rng = Rng(0x5eed);
    let n = 200_000;
    let mut waits: Vec<f64> = (0..n)
        .map(|_| lognormal(&mut rng, median_s, sigma))
        .collect();
    waits.sort_by(f64::total_cmp);
    let mut below = 0.0;
    let mut best = f64::INFINITY;
    for (i, &tau) in waits.iter().enumerate() {
        below += tau;
        let capped_mean = (below + (n - i - 1) as f64 * tau) / n as f64;
        best = best.min(capped_mean / ((i + 1) as f64 / n as f64));
    }
    best / 3600.0
}

/// What one place does in a queue, and how many places it can use.
struct PlaceRate {
    /// Batches a place finishes per hour there.
    per_place: f64,
    /// Places beyond which its running limit binds (fractional), and its cap.
    useful: f64,
}

fn place_rate(s: &QueueSpec) -> PlaceRate {
    let run_h = RUN_S / 3600.0;
    let p = s.preempt;
    let nodes = s.nodes.max(1) as f64;
    // Node-hours per finished batch: a preempted job's partial run is lost (half a run on
    // average), and it is run again.
    let machine_per_batch = run_h * (1.0 + p / (2.0 * (1.0 - p)));
    // A job holds its place for its tries: each a wait and a run (half a run when preempted).
    let hold_per_job =
        (best_mean_wait_h(s.wait_median_s, s.wait_sigma) + run_h * (1.0 - p / 2.0)) / (1.0 - p);
    let per_place = nodes / hold_per_job;
    let running_rate = f64::from(s.running) * nodes / machine_per_batch;
    PlaceRate {
        per_place,
        useful: f64::from(s.cap).min(running_rate / per_place),
    }
}

/// The bound, in hours.
pub fn bound_h(s: &Scenario) -> f64 {
    let rates: Vec<PlaceRate> = s.queues.iter().map(place_rate).collect();
    let mut order: Vec<usize> = (0..rates.len()).collect();
    order.sort_by(|&a, &b| rates[b].per_place.total_cmp(&rates[a].per_place));
    let mut left = s.max_jobs.map_or(f64::INFINITY, f64::from);
    let mut rate = 0.0;
    let mut closed_work = 0.0;
    for i in order {
        let places = rates[i].useful.min(left);
        left -= places;
        let q_rate = places * rates[i].per_place;
        rate += q_rate;
        let closed_h = s.queues[i].closed_for_s.unwrap_or(0.0) / 3600.0;
        if closed_h > 0.0 {
            closed_work += q_rate * (closed_h - RUN_S / 3600.0 / 2.0).max(0.0);
        }
    }
    (BATCHES as f64 + closed_work) / rate
}

/// The same bound in whole jobs, for a world where every queue's running limit binds (no job
/// limit, no preemption, no refused submissions, one node a job): no routing keeps the
/// running places busier than one that has a ready job behind every place the moment it
/// frees. This is that schedule, drawn like the world: each place's first job starts after
/// its own wait (the `running` earliest of the `cap` jobs sent at the first poll), the next
/// ones back to back, each run drawn as the world draws it; the earliest free place takes the
/// next batch (with jobs alike, no order finishes sooner); a closed queue starts nothing from
/// the poll after half the batches were seen done until it reopens. Its wall, the poll that
/// sees the last batch end, is what the fluid bound leaves out: the first waits, the last
/// wave (a place runs a job or none: in (a) at x5, 2,075 batches over 100 places are 20 waves
/// and 75 batches more, which take a whole run), and where in its jobs' runs the queue closed.
/// It is a mean over seeds of its own draws: a run of the world may fall below it by luck.
/// `None` where the world is not of that kind.
pub fn whole_jobs_h(s: &Scenario, seed: u64) -> Option<f64> {
    let running_bound = s.queues.iter().all(|q| {
        let r = place_rate(q);
        q.preempt == 0.0
            && q.refuses_for_s.is_none()
            && q.nodes == 1
            && r.useful < f64::from(q.cap)
            // A queued job behind every running one, ready (its wait over) when its place frees.
            && q.cap >= 2 * q.running
    });
    if s.max_jobs.is_some() || !running_bound {
        return None;
    }
    let mut rng = Rng(seed ^ 0xb0_0d);
    // (free at, queue) for every running place.
    let mut places: Vec<(f64, usize)> = Vec::new();
    for (i, q) in s.queues.iter().enumerate() {
        let mut ready: Vec<f64> = (0..q.cap)
            .map(|_| POLL_S + lognormal(&mut rng, q.wait_median_s, q.wait_sigma))
            .collect();
        ready.sort_by(f64::total_cmp);
        places.extend(ready.into_iter().take(q.running as usize).map(|t| (t, i)));
    }
    let poll_after = |t: f64| (t / POLL_S).ceil() * POLL_S;
    let mut ends: Vec<f64> = Vec::with_capacity(BATCHES as usize);
    // From when the closed queue starts nothing: the poll that sees half the batches done (the
    // world closes it at the next poll, whose starts date from this one).
    let mut closes_at: Option<f64> = None;
    while ends.len() < BATCHES as usize {
        places.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (free, q) = places[0];
        if let Some(closed_for) = s.queues[q].closed_for_s {
            if closes_at.is_none() && ends.len() >= BATCHES as usize / 2 {
                // Every end to come is later than `free`: once the half-way end's poll is
                // not after it, that poll is final.
                let mut sorted = ends.clone();
                sorted.sort_by(f64::total_cmp);
                let seen = poll_after(sorted[BATCHES as usize / 2 - 1]);
                closes_at = (seen <= free).then_some(seen);
            }
            if let Some(c) = closes_at {
                if free >= c && free < c + closed_for {
                    places[0].0 = c + closed_for;
                    continue;
                }
            }
        }
        let run = RUN_S * (1.0 + 0.03 * rng.normal()).max(0.5);
        ends.push(free + run);
        places[0].0 = free + run;
    }
    let last = ends.iter().copied().fold(0.0, f64::max);
    Some(poll_after(last) / 3600.0)
}
