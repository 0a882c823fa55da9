//! The run's job attempts, kept up to date incrementally: each refresh reads only the rows that
//! changed since the last ([`RunDb::job_attempts_since`]) and keeps the counts the metrics need
//! (attempts by queue and outcome) adjusted row by row, so a poll's cost follows what changed in
//! it, not the size of the run.

use std::collections::BTreeMap;

use embedfleet_core::rundb::{JobAttempt, JobAttemptCursor, RunDb, RunDbError};
use embedfleet_core::state::JobStatus;
use serde::Serialize;

/// How an attempt ended, as the report colours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Not ended: queued (or being submitted).
    Pending,
    Running,
    /// Ended and its batch's work was taken.
    Done,
    /// Ended with an error: a non-zero exit, out of memory, a node failure.
    Failed,
    /// Preempted or cancelled (by the scheduler, a user or the loop).
    Preempted,
    /// Killed at its walltime.
    Walltime,
    /// Unknown to the scheduler for too long, with no completion marker.
    Lost,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Pending,
        Outcome::Running,
        Outcome::Done,
        Outcome::Failed,
        Outcome::Preempted,
        Outcome::Walltime,
        Outcome::Lost,
    ];

    pub fn of(attempt: &JobAttempt) -> Self {
        match attempt.state {
            JobStatus::Submitting | JobStatus::Pending | JobStatus::Unknown => Outcome::Pending,
            JobStatus::Running => Outcome::Running,
            JobStatus::Completed => Outcome::Done,
            JobStatus::Failed | JobStatus::NodeFail | JobStatus::OutOfMemory => Outcome::Failed,
            JobStatus::Cancelled | JobStatus::Preempted => Outcome::Preempted,
            JobStatus::Timeout => Outcome::Walltime,
            JobStatus::Lost => Outcome::Lost,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pending => "pending",
            Outcome::Running => "running",
            Outcome::Done => "done",
            Outcome::Failed => "failed",
            Outcome::Preempted => "preempted",
            Outcome::Walltime => "walltime",
            Outcome::Lost => "lost",
        }
    }

    /// Ended without finishing its work: what the failures table lists.
    pub fn is_failure(self) -> bool {
        matches!(self, Outcome::Failed | Outcome::Walltime | Outcome::Lost)
    }
}

/// Every job attempt of the run, by `jobs.id`, with running counts.
#[derive(Debug, Default)]
pub struct AttemptHistory {
    rows: BTreeMap<i64, JobAttempt>,
    cursor: JobAttemptCursor,
    /// (queue, outcome) -> attempts.
    counts: BTreeMap<(String, Outcome), u64>,
}

impl AttemptHistory {
    /// Every attempt, read once.
    pub fn load(db: &RunDb) -> Result<Self, RunDbError> {
        let mut history = Self::default();
        history.refresh(db)?;
        Ok(history)
    }

    /// Takes in the attempts changed since the last refresh; returns how many rows were read.
    pub fn refresh(&mut self, db: &RunDb) -> Result<usize, RunDbError> {
        let (changed, cursor) = db.job_attempts_since(&self.cursor)?;
        self.cursor = cursor;
        let n = changed.len();
        for row in changed {
            self.count(&row, 1);
            if let Some(old) = self.rows.insert(row.job_row, row) {
                self.count(&old, -1);
            }
        }
        Ok(n)
    }

    fn count(&mut self, row: &JobAttempt, delta: i64) {
        let key = (row.queue.clone(), Outcome::of(row));
        let n = self.counts.entry(key).or_default();
        *n = n.saturating_add_signed(delta);
    }

    /// In `jobs.id` order (submission order).
    pub fn attempts(&self) -> impl Iterator<Item = &JobAttempt> {
        self.rows.values()
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// (queue, outcome) -> attempts, every attempt of the run counted once.
    pub fn counts(&self) -> &BTreeMap<(String, Outcome), u64> {
        &self.counts
    }
}
