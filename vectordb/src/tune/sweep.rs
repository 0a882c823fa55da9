//! The two-stage sweep both `tune` and `tune --queries` run: first batch sizes at one request
//! in flight, then requests in flight at the chosen batch size; each stage picks the smallest
//! setting within a margin of its fastest (smaller batches and fewer requests cost the server
//! less memory for the same speed). What a trial does (an upload of a sample, a batch of
//! searches) is the caller's.

use serde::Serialize;

/// One timed run at one setting.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Trial {
    /// `batch` (first sweep) or `in_flight` (second sweep).
    pub sweep: &'static str,
    /// Points (or queries) per request.
    pub batch_size: usize,
    /// Requests in flight.
    pub in_flight: usize,
    /// Points (or queries) sent.
    pub points: usize,
    /// Seconds the trial took.
    pub secs: f64,
}

impl Trial {
    /// Points (or queries) per second.
    pub fn points_per_s(&self) -> f64 {
        self.points as f64 / self.secs.max(1e-9)
    }
}

/// The settings a sweep tries.
#[derive(Debug, Clone, Copy)]
pub struct SweepPlan<'a> {
    /// Batch sizes of the first stage, at one request in flight.
    pub batch_sizes: &'a [usize],
    /// Requests in flight of the second stage, at the chosen batch size.
    pub in_flights: &'a [usize],
    /// Pick the smallest setting within this fraction of the fastest.
    pub within: f64,
    /// The batch size when the first stage ran no trial.
    pub fallback_batch_size: usize,
    /// Take the first stage's trial of the chosen batch size as the second's at one request in
    /// flight (the same setting), instead of running it again.
    pub reuse_one_in_flight: bool,
}

/// Both stages' trials and what was chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct Swept {
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    pub batch_size: usize,
    pub in_flight: usize,
    /// Points (or queries) per second at the chosen setting.
    pub per_s: f64,
}

/// Runs both stages of `plan`, `trial(sweep, batch_size, in_flight)` timing one setting.
pub fn two_stage_sweep<E>(
    plan: &SweepPlan<'_>,
    mut trial: impl FnMut(&'static str, usize, usize) -> Result<Trial, E>,
) -> Result<Swept, E> {
    let mut trials = Vec::new();
    for &b in plan.batch_sizes {
        trials.push(trial("batch", b, 1)?);
    }
    let batch_size =
        pick(&trials, plan.within, |t| t.batch_size).unwrap_or(plan.fallback_batch_size);
    let mut second = Vec::new();
    for &k in plan.in_flights {
        let done = (plan.reuse_one_in_flight && k == 1)
            .then(|| trials.iter().find(|t| t.batch_size == batch_size));
        match done.flatten() {
            Some(t) => second.push(Trial {
                sweep: "in_flight",
                ..*t
            }),
            None => second.push(trial("in_flight", batch_size, k)?),
        }
    }
    let in_flight = pick(&second, plan.within, |t| t.in_flight).unwrap_or(1);
    let per_s = second
        .iter()
        .find(|t| t.in_flight == in_flight)
        .map_or(0.0, Trial::points_per_s);
    trials.extend(second);
    Ok(Swept {
        trials,
        batch_size,
        in_flight,
        per_s,
    })
}

/// The smallest `key` among the trials within `within` of the fastest.
pub fn pick(trials: &[Trial], within: f64, key: impl Fn(&Trial) -> usize) -> Option<usize> {
    let best = trials.iter().map(Trial::points_per_s).fold(0.0, f64::max);
    trials
        .iter()
        .filter(|t| t.points_per_s() >= best * (1.0 - within))
        .map(key)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(batch_size: usize, secs: f64) -> Trial {
        Trial {
            sweep: "batch",
            batch_size,
            in_flight: 1,
            points: 1000,
            secs,
        }
    }

    #[test]
    fn pick_takes_the_smallest_within_the_margin_of_the_fastest() {
        // 1000 pts: 64 -> 10,000/s, 128 -> 10,400/s, 256 -> 10,600/s (fastest), 512 -> 9,000/s.
        let trials = [
            t(64, 0.1),
            t(128, 1.0 / 10.4),
            t(256, 1.0 / 10.6),
            t(512, 1.0 / 9.0),
        ];
        assert_eq!(pick(&trials, 0.05, |t| t.batch_size), Some(128));
        assert_eq!(pick(&trials, 0.0, |t| t.batch_size), Some(256));
        assert_eq!(pick(&[], 0.05, |t| t.batch_size), None);
    }
}
