//! The states a run records, as types: a planned batch, a scheduler job, the plan itself, a
//! batch run and a parquet shard's upload. run.db stores each as the lowercase name
//! [`as_str`](BatchState::as_str) gives; every list of "open" states is here, once.

use std::fmt;

/// Declares a state enum stored in run.db as text: its variants with their stored names,
/// `as_str`, `parse`, `Display` and the list of every state.
macro_rules! stored_state {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every state, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The name run.db stores.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The state of a stored name; `None` for a name this version does not know.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

stored_state! {
    /// Where a planned batch stands (`batches.state`).
    BatchState {
        /// Planned; no embed job has started it (or a failed one was reset for a retry).
        Planned = "planned",
        /// An embed job has started it.
        Running = "running",
        /// Every paper is in a recorded parquet shard (or quarantined).
        Done = "done",
        /// Given up after `--max-attempts` jobs; `submit` again resets it to planned.
        Failed = "failed",
    }
}

impl BatchState {
    /// States that still need a job.
    pub const OPEN: [BatchState; 2] = [BatchState::Planned, BatchState::Running];
}

stored_state! {
    /// A scheduler job as run.db records it (`jobs.state`). The scheduler's own view
    /// (`embedfleet_orchestrator::scheduler::JobState`) maps onto this.
    JobStatus {
        /// The row is written, the scheduler not yet asked: a crash here is found by name.
        Submitting = "submitting",
        /// Queued.
        Pending = "pending",
        Running = "running",
        /// The scheduler does not know the job (yet): it counts as lost after `--lost-after`.
        Unknown = "unknown",
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
        Timeout = "timeout",
        NodeFail = "node_fail",
        OutOfMemory = "out_of_memory",
        Preempted = "preempted",
        /// Unknown to the scheduler for `--lost-after` with no completion marker.
        Lost = "lost",
    }
}

impl JobStatus {
    /// The states the submit loop still watches; each holds a place in its queue.
    pub const OPEN: [JobStatus; 4] = [
        JobStatus::Submitting,
        JobStatus::Pending,
        JobStatus::Running,
        JobStatus::Unknown,
    ];

    /// True for the states in [`JobStatus::OPEN`].
    pub fn is_open(self) -> bool {
        Self::OPEN.contains(&self)
    }

    /// `('submitting', 'pending', ...)`: [`JobStatus::OPEN`] for a SQL `IN`.
    pub fn open_sql() -> String {
        sql_list(&Self::OPEN.map(JobStatus::as_str))
    }
}

stored_state! {
    /// Whether the corpus is planned whole (the `plan_state` setting).
    PlanState {
        /// `plan` started and has not finished: run it again.
        InProgress = "in_progress",
        /// Every corpus file is planned and duplicates are resolved.
        Complete = "complete",
    }
}

stored_state! {
    /// One embed-job run of a batch (`batch_runs.state`).
    BatchRunState {
        Running = "running",
        Done = "done",
        Failed = "failed",
    }
}

stored_state! {
    /// What the owner made of one embed-job attempt's result manifest (`attempts.state`).
    AttemptState {
        /// The batch's shards are this attempt's.
        Accepted = "accepted",
        /// Complete, but another attempt of the batch was accepted first.
        Discarded = "discarded",
        /// Complete, but it did not verify (a shard missing or changed, rows that do not add
        /// up, other settings than the run's).
        Rejected = "rejected",
        /// The attempt stopped with an error.
        Failed = "failed",
        /// It never finished and the batch was done by another attempt.
        Abandoned = "abandoned",
    }
}

stored_state! {
    /// A parquet shard's upload into one collection, from its acknowledged rows.
    UploadState {
        /// No row acknowledged.
        Pending = "pending",
        /// A prefix of the rows is acknowledged; a re-run sends the rest.
        Partial = "partial",
        /// Every row is acknowledged.
        Done = "done",
    }
}

impl UploadState {
    /// The state of a parquet shard of `rows` rows whose first `rows_acked` are acknowledged.
    pub fn of(rows: u64, rows_acked: u64) -> Self {
        match rows_acked {
            _ if rows_acked >= rows => UploadState::Done,
            0 => UploadState::Pending,
            _ => UploadState::Partial,
        }
    }
}

/// `('a', 'b')` for a SQL `IN` over stored names (which are plain lowercase words).
fn sql_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    format!("({})", quoted.join(", "))
}

impl BatchState {
    /// [`BatchState::OPEN`] for a SQL `IN`.
    pub fn open_sql() -> String {
        sql_list(&Self::OPEN.map(BatchState::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_parses_back_from_its_stored_name() {
        fn check<T: Copy + PartialEq + std::fmt::Debug>(
            all: &[T],
            as_str: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
        ) {
            for &s in all {
                assert_eq!(parse(as_str(s)), Some(s));
            }
            assert_eq!(parse("no such state"), None);
        }
        check(BatchState::ALL, BatchState::as_str, BatchState::parse);
        check(JobStatus::ALL, JobStatus::as_str, JobStatus::parse);
        check(PlanState::ALL, PlanState::as_str, PlanState::parse);
        check(
            BatchRunState::ALL,
            BatchRunState::as_str,
            BatchRunState::parse,
        );
        check(UploadState::ALL, UploadState::as_str, UploadState::parse);
    }

    #[test]
    fn open_states_are_listed_once_for_code_and_sql() {
        assert_eq!(
            JobStatus::open_sql(),
            "('submitting', 'pending', 'running', 'unknown')"
        );
        assert_eq!(BatchState::open_sql(), "('planned', 'running')");
        assert!(JobStatus::Unknown.is_open() && !JobStatus::Lost.is_open());
    }

    #[test]
    fn upload_state_follows_the_acknowledged_prefix() {
        assert_eq!(UploadState::of(10, 0), UploadState::Pending);
        assert_eq!(UploadState::of(10, 4), UploadState::Partial);
        assert_eq!(UploadState::of(10, 10), UploadState::Done);
        assert_eq!(UploadState::of(0, 0), UploadState::Done);
    }
}
