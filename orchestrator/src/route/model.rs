//! What the run has learned of each queue from its own jobs: how long a job waits to start
//! (its mean, and the shape of the waits: a log-normal fitted to them, so that a job that has
//! waited long already can be told how much longer it is likely to wait), how long it runs,
//! and how often the queue takes a job away (preempted, killed at its walltime, failed).
//! Updated once per event, where the loop sees the state change, never recomputed from every
//! attempt: at the study's shape a poll must cost the same at the last batch as at the first.

use serde::Serialize;

/// How a job ended, as far as the queue is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    /// Ran to its end (its batch may still be rejected: that is not the queue's doing).
    Finished,
    /// Preempted by a higher-priority job (requeued or ended).
    Preempted,
    /// Killed at its walltime.
    Walltime,
    /// Failed: a node failure, out of memory, a non-zero exit.
    Failed,
    /// Cancelled (by the user, by a move, or as the slower of two twins): says nothing of the
    /// queue.
    Cancelled,
}

/// Exit codes of `embed-job` that mean "this will fail the same way again" (a usage error, a
/// refused setup: a CPU build asked for GPUs, a run directory that does not match): not
/// retried, and no loss of the queue's, which would fail the same on any queue.
pub const SETUP_EXIT_CODES: [i32; 2] = [2, 4];

impl JobEnd {
    /// How a job run.db recorded ended, for its queue's model, from its row: as
    /// [`JobEnd::of`], except what says nothing of the queue, which counts as a cancel: a job
    /// the scheduler never took (`accepted` false: its submission failed) and one that ended
    /// with a setup exit code ([`SETUP_EXIT_CODES`], as its recorded reason says) or its
    /// device's refusal (`embedfleet_core::exit::DEVICE_REFUSED`: retried on another queue,
    /// nothing of this one's speed).
    pub fn of_record(
        status: embedfleet_core::state::JobStatus,
        accepted: bool,
        reason: Option<&str>,
    ) -> Self {
        let setup = reason.is_some_and(|r| {
            SETUP_EXIT_CODES
                .iter()
                .chain([&embedfleet_core::exit::DEVICE_REFUSED])
                .any(|c| {
                    r.contains(&format!("exit code {c})")) || r.ends_with(&format!("exit code {c}"))
                })
        });
        if !accepted || setup {
            Self::Cancelled
        } else {
            Self::of(status)
        }
    }

    /// How a job that run.db recorded as `status` ended, for its queue's model.
    pub fn of(status: embedfleet_core::state::JobStatus) -> Self {
        use embedfleet_core::state::JobStatus as S;
        match status {
            S::Completed => Self::Finished,
            S::Preempted => Self::Preempted,
            S::Timeout => Self::Walltime,
            S::Cancelled => Self::Cancelled,
            _ => Self::Failed,
        }
    }
}

/// A mean weighted toward the recent: the first samples count equally, then each new one
/// carries [`RECENT_WEIGHT`], so a queue that changes during a week is followed within a few
/// jobs, while a single odd job moves the mean by a quarter of its difference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RecentMean {
    pub mean: f64,
    pub samples: u64,
}

/// The weight of the newest sample once there are more than 1/RECENT_WEIGHT of them.
const RECENT_WEIGHT: f64 = 0.25;

impl RecentMean {
    pub fn add(&mut self, x: f64) {
        self.samples += 1;
        let w = (1.0 / self.samples as f64).max(RECENT_WEIGHT);
        self.mean += w * (x - self.mean);
    }

    pub fn get(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.mean)
    }
}

/// The weight of the newest wait in the fitted shape once there are more than 1/that: the
/// shape's spread needs more samples than a mean does, so it forgets more slowly.
const SHAPE_WEIGHT: f64 = 1.0 / 32.0;
/// Waits shorter than this are taken as this long: a log-normal has no zero, and a wait under
/// a second is a poll's rounding.
const SHORTEST_WAIT_S: f64 = 1.0;
/// The least spread of the fitted shape (log seconds): waits that all read the same (a poll's
/// rounding) would otherwise make any longer wait look impossible.
const LEAST_SIGMA: f64 = 0.1;
/// Waits learned before the shape is trusted for what is left of a long wait.
pub(super) const SHAPE_SAMPLES: u64 = 8;

/// The shape of a queue's waits: a log-normal fitted to them by their log's recent mean and
/// variance. Queue waits are long-tailed and never negative; the log-normal is the usual fit,
/// and gives in closed form how much longer a job that has waited `w` is likely to wait.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WaitShape {
    /// Mean and variance of ln(wait in seconds), weighted toward the recent.
    mu: f64,
    var: f64,
    pub samples: u64,
}

impl WaitShape {
    /// The shape of waits of this median and spread (log seconds), as if learned.
    pub fn of(median_s: f64, sigma: f64, samples: u64) -> Self {
        Self {
            mu: median_s.ln(),
            var: sigma * sigma,
            samples,
        }
    }

    pub fn add(&mut self, wait_s: f64) {
        let x = wait_s.max(SHORTEST_WAIT_S).ln();
        self.samples += 1;
        let w = (1.0 / self.samples as f64).max(SHAPE_WEIGHT);
        let d = x - self.mu;
        self.mu += w * d;
        // West's recursive weighted variance.
        self.var = (1.0 - w) * (self.var + w * d * d);
    }

    /// A wait cut short after `waited_s` (the job was sent again): the wait was longer, by how
    /// much the shape says, so the log it would have had (E[ln W | W > w]) is learned in its
    /// place. Learning only the waits that ended would teach the shape that the queue's long
    /// waits do not happen, the more so the more of them are cut short.
    pub fn add_censored(&mut self, waited_s: f64) {
        if self.samples == 0 {
            return;
        }
        let sigma = self.sigma();
        let alpha = self.z(waited_s);
        // The inverse Mills ratio phi(alpha) / (1 - Phi(alpha)), in logs for large alpha.
        let log_phi = -0.5 * alpha * alpha - 0.5 * (2.0 * std::f64::consts::PI).ln();
        let log_tail = ln_erfc(alpha / std::f64::consts::SQRT_2) - std::f64::consts::LN_2;
        let x = self.mu + sigma * (log_phi - log_tail).exp();
        self.add(x.exp());
    }

    pub fn sigma(&self) -> f64 {
        self.var.sqrt().max(LEAST_SIGMA)
    }

    /// The median wait, seconds.
    pub fn median_s(&self) -> f64 {
        self.mu.exp()
    }

    /// The mean wait, seconds.
    pub fn mean_s(&self) -> f64 {
        (self.mu + self.sigma().powi(2) / 2.0).exp()
    }

    /// The chance a wait is longer than `w` seconds.
    pub fn longer_than(&self, w: f64) -> f64 {
        0.5 * erfc(self.z(w) / std::f64::consts::SQRT_2)
    }

    fn z(&self, w: f64) -> f64 {
        (w.max(SHORTEST_WAIT_S).ln() - self.mu) / self.sigma()
    }

    /// Seconds a job that has waited `w` is expected to wait still: E[W - w | W > w]. Below
    /// the median it is about the mean less what was waited; far in the tail it grows with
    /// `w` where the spread is wide (the longer one has waited, the longer one waits: sending
    /// the job again is then worth a new wait), and shrinks where it is narrow.
    pub fn left_after_s(&self, w: f64) -> f64 {
        let sigma = self.sigma();
        let z = self.z(w);
        // E[W | W > w] = mean * Phi(sigma - z) / Phi(-z), the ratio taken in logs: far in the
        // tail both are tiny.
        let ratio = (ln_erfc((z - sigma) / std::f64::consts::SQRT_2)
            - ln_erfc(z / std::f64::consts::SQRT_2))
        .exp();
        (self.mean_s() * ratio - w).max(0.0)
    }
}

/// ln(erfc(x)): Numerical Recipes' erfc (fractional error under 1.2e-7 everywhere), kept in
/// logs for large `x`.
fn ln_erfc(x: f64) -> f64 {
    if x < 0.0 {
        return (2.0 - erfc(-x)).ln();
    }
    let t = 1.0 / (1.0 + 0.5 * x);
    let poly = -1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    t.ln() - x * x + poly
}

fn erfc(x: f64) -> f64 {
    if x < 0.0 {
        2.0 - erfc(-x)
    } else {
        ln_erfc(x).exp()
    }
}

/// A time a queue counted as stopped (see [`QueueModel::stop`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stop {
    /// When it last started a job, or its oldest queued job was sent.
    pub from: f64,
    /// Its first start after: the stop is over.
    pub until: Option<f64>,
    /// Whether it had started jobs before.
    pub known: bool,
}

/// How quickly an old job end stops counting toward the loss share: after ~20 ends a past one
/// weighs a third (0.95^20).
const LOSS_DECAY: f64 = 0.95;
/// The prior of the loss share, as job ends already seen: [`PRIOR_ENDS`] ends of which a share
/// [`PRIOR_LOSS`] were lost. Two jobs lost of two are no evidence that a queue loses most
/// (a node crash, an operator's rerun): with this prior they read 0.42, and the estimate
/// follows the queue's own ends as they come (ten lost of ten: 0.74; decayed ends weigh at
/// most 20 against the prior's 3).
const PRIOR_ENDS: f64 = 3.0;
const PRIOR_LOSS: f64 = 0.05;

/// The model of one queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueModel {
    /// Submit to start, seconds.
    pub start_delay: RecentMean,
    /// The shape of those waits.
    #[serde(skip)]
    pub wait_shape: WaitShape,
    /// When a job of it last started (the loop's clock), and the latest submission of a job
    /// of it that started: a queued job submitted no later than that was passed over (the
    /// queue started a job sent after it), so it waits for something other than a place.
    #[serde(skip)]
    pub last_start_s: Option<f64>,
    #[serde(skip)]
    pub newest_started_submit_s: Option<f64>,
    /// The most of the run's jobs seen running in it at once: a queue running that many runs
    /// at the run's limit there, and its queued jobs wait for the run's own to end.
    #[serde(skip)]
    pub most_running: u32,
    /// The latest time it counted as stopped: from when it started nothing, until its next
    /// start. The waits of jobs caught in it are not the queue's usual ones (a maintenance
    /// window) where it had started jobs before: they are not learned (its being stopped kept
    /// jobs away meanwhile). A queue that had started none yet learns them: they are its first.
    #[serde(skip)]
    pub stop: Option<Stop>,
    /// Start to end of a job that ran to its end, seconds.
    pub run_time: RecentMean,
    /// How far the scheduler's start estimates (`squeue --start`) were off, seconds.
    pub estimate_error: RecentMean,
    /// Ends, in counts: what the report shows.
    pub finished: u64,
    pub preempted: u64,
    pub walltime: u64,
    pub failed: u64,
    /// Decayed ends and losses, for the loss share.
    #[serde(skip)]
    decayed_ends: f64,
    #[serde(skip)]
    decayed_losses: f64,
}

impl QueueModel {
    /// A job of this queue started `delay_s` after it was submitted.
    pub fn started(&mut self, delay_s: f64) {
        self.start_delay.add(delay_s.max(0.0));
        self.wait_shape.add(delay_s.max(0.0));
    }

    /// A job of this queue submitted at `submitted_s` started at `started_s`.
    pub fn started_at(&mut self, submitted_s: f64, started_s: f64) {
        let delay = (started_s - submitted_s).max(0.0);
        let caught = self.stop.as_mut().map(|stop| {
            let until = *stop.until.get_or_insert(started_s);
            (submitted_s < until && started_s > stop.from, stop.known)
        });
        match caught {
            Some((true, true)) => {}
            Some((true, false)) => self.start_delay.add(delay),
            _ => self.started(delay),
        }
        self.last_start_s = Some(self.last_start_s.map_or(started_s, |t| t.max(started_s)));
        self.newest_started_submit_s = Some(
            self.newest_started_submit_s
                .map_or(submitted_s, |t| t.max(submitted_s)),
        );
    }

    /// A job of this queue ended after running `run_s` (None: it never started).
    pub fn ended(&mut self, end: JobEnd, run_s: Option<f64>) {
        let lost = match end {
            JobEnd::Cancelled => return,
            JobEnd::Finished => {
                self.finished += 1;
                if let Some(run) = run_s {
                    self.run_time.add(run.max(0.0));
                }
                false
            }
            JobEnd::Preempted => {
                self.preempted += 1;
                true
            }
            JobEnd::Walltime => {
                self.walltime += 1;
                true
            }
            JobEnd::Failed => {
                self.failed += 1;
                true
            }
        };
        self.decayed_ends = self.decayed_ends * LOSS_DECAY + 1.0;
        self.decayed_losses = self.decayed_losses * LOSS_DECAY + f64::from(u8::from(lost));
    }

    /// The share of recent jobs the queue took away, as seen (0 with no ends yet): what
    /// status and the routing log say.
    pub fn loss_share(&self) -> f64 {
        if self.decayed_ends <= 0.0 {
            0.0
        } else {
            self.decayed_losses / self.decayed_ends
        }
    }

    /// The share of jobs the queue is expected to take away, what routing weighs: the recent
    /// ends' share shrunk toward a prior of a few ends' worth ([`PRIOR_ENDS`] at
    /// [`PRIOR_LOSS`]), so that a handful of losses is not read as a queue that loses
    /// everything. A queue with no ends yet is at the prior, not at zero: else one job
    /// finished on a working queue would make it look worse than a queue that never ran one.
    pub fn loss_estimate(&self) -> f64 {
        (self.decayed_losses + PRIOR_ENDS * PRIOR_LOSS) / (self.decayed_ends + PRIOR_ENDS)
    }

    /// This round found it stopped, starting nothing since `since_s`.
    pub fn stopped_since(&mut self, since_s: f64) {
        if self.stop.as_ref().is_none_or(|s| s.until.is_some()) {
            self.stop = Some(Stop {
                from: since_s,
                until: None,
                known: self.known(),
            });
        }
    }

    /// True once a job of this queue has started: until then its start is guessed.
    pub fn known(&self) -> bool {
        self.start_delay.samples > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_follows_a_queue_that_changes_within_a_few_jobs() {
        let mut m = RecentMean::default();
        for _ in 0..50 {
            m.add(300.0);
        }
        assert_eq!(m.get(), Some(300.0));
        // The queue now starts jobs after three hours: after 8 jobs the mean is past 2.7 h.
        for _ in 0..8 {
            m.add(10_800.0);
        }
        assert!(m.mean > 0.9 * 10_800.0, "{}", m.mean);
        // The first samples count equally (no pull toward zero at the start).
        let mut first = RecentMean::default();
        first.add(100.0);
        first.add(200.0);
        assert_eq!(first.get(), Some(150.0));
    }

    #[test]
    fn what_is_left_of_a_long_wait_grows_with_it_where_waits_are_long_tailed() {
        // Monte Carlo of E[W - w | W > w] for a log-normal, beside the closed form.
        let mut rng = crate::sample::Rng(7);
        let draws: Vec<f64> = (0..400_000)
            .map(|_| 600.0 * (1.5 * rng.normal()).exp())
            .collect();
        let shape = WaitShape::of(600.0, 1.5, 100);
        for w in [0.0, 600.0, 3600.0, 4.0 * 3600.0] {
            let longer: Vec<f64> = draws.iter().filter(|d| **d > w).map(|d| d - w).collect();
            let mc = longer.iter().sum::<f64>() / longer.len() as f64;
            let got = shape.left_after_s(w);
            assert!((got / mc - 1.0).abs() < 0.08, "w {w}: {got} against {mc}");
        }
        assert!((shape.mean_s() - 600.0 * (1.125f64).exp()).abs() < 1.0);
        // Long-tailed (sigma 1.5): an hour's wait leaves more to wait than a new job's mean
        // (~31 min); narrow (sigma 0.5): less.
        assert!(shape.left_after_s(3600.0) > 2.0 * shape.mean_s());
        let narrow = WaitShape::of(600.0, 0.5, 100);
        assert!(narrow.left_after_s(1800.0) < narrow.mean_s());
        assert!(narrow.left_after_s(3600.0) < narrow.mean_s());
        // Far in the tail it stays finite.
        assert!(shape.left_after_s(1e7).is_finite());
        assert!((shape.longer_than(600.0) - 0.5).abs() < 1e-6);
    }

    #[test]
    fn the_shape_is_learned_from_waits() {
        let mut rng = crate::sample::Rng(3);
        let mut shape = WaitShape::default();
        for _ in 0..3000 {
            shape.add(300.0 * (0.8 * rng.normal()).exp());
        }
        assert!((shape.median_s() / 300.0 - 1.0).abs() < 0.35, "{shape:?}");
        assert!((shape.sigma() - 0.8).abs() < 0.25, "{shape:?}");
        // Waits that all read the same keep a least spread.
        let mut same = WaitShape::default();
        for _ in 0..50 {
            same.add(60.0);
        }
        assert_eq!(same.sigma(), LEAST_SIGMA);
        assert!(same.left_after_s(600.0).is_finite());
    }

    #[test]
    fn losses_are_a_recent_share_and_cancels_do_not_count() {
        let mut q = QueueModel::default();
        assert_eq!(q.loss_share(), 0.0);
        assert!((q.loss_estimate() - PRIOR_LOSS).abs() < 1e-12);
        // One job finished weighs below the prior: a queue seen working is never costlier
        // than one not seen at all.
        let mut one = QueueModel::default();
        one.ended(JobEnd::Finished, Some(60.0));
        assert!(one.loss_estimate() < q.loss_estimate());
        assert_eq!(one.loss_share(), 0.0);
        for i in 0..100 {
            q.ended(
                if i % 5 == 0 {
                    JobEnd::Preempted
                } else {
                    JobEnd::Finished
                },
                Some(2400.0),
            );
            q.ended(JobEnd::Cancelled, None);
        }
        assert!((q.loss_share() - 0.2).abs() < 0.05, "{}", q.loss_share());
        // A handful of ends says little: two lost of two is not a queue that loses them all.
        let mut two = QueueModel::default();
        two.ended(JobEnd::Failed, None);
        two.ended(JobEnd::Preempted, Some(60.0));
        assert!(
            (0.35..0.5).contains(&two.loss_estimate()),
            "{}",
            two.loss_estimate()
        );
        assert_eq!(two.loss_share(), 1.0, "said as seen");
        for _ in 0..8 {
            two.ended(JobEnd::Failed, None);
        }
        assert!(
            two.loss_estimate() > 0.7,
            "ten of ten: {}",
            two.loss_estimate()
        );
        assert_eq!((q.finished, q.preempted), (80, 20));
        assert_eq!(q.run_time.get(), Some(2400.0));
        // A queue that stops losing jobs is forgiven within tens of jobs.
        for _ in 0..60 {
            q.ended(JobEnd::Finished, Some(2400.0));
        }
        assert!(q.loss_share() < 0.02, "{}", q.loss_share());
        assert!(q.loss_estimate() < 0.03, "{}", q.loss_estimate());
    }

    #[test]
    fn a_failed_submission_or_a_setup_error_is_no_loss_of_the_queue() {
        use embedfleet_core::state::JobStatus as S;
        let of = JobEnd::of_record;
        assert_eq!(
            of(
                S::Failed,
                false,
                Some("not submitted: qsub: cannot connect")
            ),
            JobEnd::Cancelled
        );
        assert_eq!(
            of(S::Failed, true, Some("failed (exit code 4)")),
            JobEnd::Cancelled
        );
        assert_eq!(
            of(S::Failed, true, Some("failed (exit code 2)")),
            JobEnd::Cancelled
        );
        assert_eq!(
            of(S::Failed, true, Some("failed (exit code 1)")),
            JobEnd::Failed
        );
        assert_eq!(
            of(S::Failed, true, Some("failed (exit code 42)")),
            JobEnd::Failed
        );
        assert_eq!(of(S::Completed, true, None), JobEnd::Finished);
        assert_eq!(of(S::Preempted, true, None), JobEnd::Preempted);
    }
}
