//! What the run has learned of each queue from its own jobs: how long a job waits to start,
//! how long it runs, and how often the queue takes a job away (preempted, killed at its
//! walltime, failed). Updated once per event, where the loop sees the state change, never
//! recomputed from every attempt: at the study's shape a poll must cost the same at the last
//! batch as at the first.

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

impl JobEnd {
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

/// How quickly an old job end stops counting toward the loss share: after ~20 ends a past one
/// weighs a third (0.95^20).
const LOSS_DECAY: f64 = 0.95;

/// The model of one queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueModel {
    /// Submit to start, seconds.
    pub start_delay: RecentMean,
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

    /// The share of recent jobs the queue took away (0 with no ends yet).
    pub fn loss_share(&self) -> f64 {
        if self.decayed_ends <= 0.0 {
            0.0
        } else {
            self.decayed_losses / self.decayed_ends
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
    fn losses_are_a_recent_share_and_cancels_do_not_count() {
        let mut q = QueueModel::default();
        assert_eq!(q.loss_share(), 0.0);
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
        assert_eq!((q.finished, q.preempted), (80, 20));
        assert_eq!(q.run_time.get(), Some(2400.0));
        // A queue that stops losing jobs is forgiven within tens of jobs.
        for _ in 0..60 {
            q.ended(JobEnd::Finished, Some(2400.0));
        }
        assert!(q.loss_share() < 0.02, "{}", q.loss_share());
    }
}
