//! What a submit did: the loop's report, or a dry run's scripts.

use std::time::Duration;

/// How a submit loop ended.
#[derive(Debug, Default, Clone)]
pub struct SubmitReport {
    pub submitted: u64,
    /// Jobs found queued or running from an earlier loop.
    pub adopted: u64,
    /// Jobs that ended without finishing their batch and were submitted again.
    pub retried: u64,
    pub batches_done: u64,
    /// (batch, why) for batches given up on.
    pub failed: Vec<(i64, String)>,
    pub elapsed: Duration,
    /// Rounds (poll + submit) run, and the time they took without the sleeps between them.
    pub rounds: u64,
    pub busy: Duration,
    /// Of `busy`: polling (with settling), submitting, redrawing the progress.
    pub busy_poll: Duration,
    pub busy_submit: Duration,
    pub busy_progress: Duration,
    /// This process's CPU time (user + system) over the loop: the owner's own cost, jobs and
    /// scheduler commands excluded.
    pub owner_cpu: Duration,
    /// Filesystem operations on the files jobs write (`embedfleet_core::fsops`) over the loop.
    pub result_file_ops: u64,
    /// Jobs seen back in their queue after running: the scheduler requeued them (preempted).
    pub requeued: u64,
    /// Queues the breaker set aside in this loop (their jobs failed alike, the others' not).
    pub set_aside: Vec<String>,
    /// The route, the speculative twins it sent, the queued jobs it moved, and what the slower
    /// twins ran before they were cancelled.
    pub route: crate::route::Route,
    pub twins: u64,
    pub moves: u64,
    pub twin_node_hours: f64,
    /// What moved jobs ran before their cancel took effect (they had just started).
    pub move_node_hours: f64,
}

/// What a submit did: the loop's report, or (a dry run) the job scripts its next round would
/// send, (job name, script text), without submitting or recording anything.
#[derive(Debug)]
pub enum Submitted {
    Ran(Box<SubmitReport>),
    WouldSend(Vec<(String, String)>),
}
