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
use super::{BATCHES, RUN_S};

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
