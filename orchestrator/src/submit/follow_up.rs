//! Work of a later stage that the submit loop drives between its rounds: the snapshot stage's
//! group builds (`submit --group-builds`), each a job of its own once its group's batches are
//! done. The loop knows nothing of what the work is (the orchestrator does not depend on the
//! stages' crates); it calls [`FollowUp::round`] once per round, shows what it says, and does
//! not end while it is busy.

use embedfleet_core::rundb::RunDb;

/// What a round of follow-up work did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FollowUpRound {
    /// Jobs of its own are open, or work is ready that is not submitted yet (paused): the
    /// loop goes on polling even with every batch settled.
    pub busy: bool,
    /// Lines for the user (submitted, finished, failed, given up).
    pub said: Vec<String>,
}

/// Work the submit loop drives once per round, after its own (see the module docs).
pub trait FollowUp {
    /// One round: `db` is the run's (the loop has just taken in the jobs' results); `paused`
    /// says the run is paused, when nothing new should be submitted. Errors are the work's
    /// own to report in `said`: a failing follow-up never stops the embedding.
    fn round(&mut self, db: &RunDb, paused: bool) -> FollowUpRound;
}
