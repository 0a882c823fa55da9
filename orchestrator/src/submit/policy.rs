//! How the submit loop treats its jobs, resolved once (the pipeline's submit settings: as
//! given, else as the run keeps it, else the default) and handed to the loop whole.

use std::time::Duration;

/// The loop's policy: attempts, polling, when a job is lost, the breaker, routing.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopPolicy {
    /// Jobs per batch in this invocation before the batch is marked failed.
    pub max_attempts: u32,
    pub poll_interval: Duration,
    /// How long a job may be unknown to the scheduler (and have left no completion marker)
    /// before it counts as lost and its batch is retried.
    pub lost_after: Duration,
    /// Jobs in a row failing alike that pause the run ([`super::breaker`]); 0: never.
    pub breaker_after: u32,
    /// How free slots are given batches (`--route`).
    pub route: crate::route::Route,
    /// Whether the tail gets speculative twins (`--speculate`; adaptive route only).
    pub speculate: bool,
    /// The most jobs the run may hold queued or running over all its queues together
    /// (`--max-jobs`: a site's per-user limit); the scheduler's own, where it states a lower
    /// one, holds too.
    pub max_jobs: Option<u32>,
}
