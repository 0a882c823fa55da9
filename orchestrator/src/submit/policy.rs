//! How the submit loop treats its jobs ([`LoopPolicy`]: resolved once by the pipeline's submit
//! settings, as given, else as the run keeps it, else the default) and what this one session
//! does ([`SessionOptions`]: as typed); each handed to the loop whole.

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

/// What this submit session does, as its command line asked: unlike the policy, never kept
/// for the run's later submits (a restart without these flags neither watches nor runs a
/// trial). The pipeline's submit flags hold it whole and hand it on as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionOptions {
    /// Keep running after every batch is settled (new batches from a later `plan` are picked
    /// up).
    pub watch: bool,
    /// A trial: one job of the first batch that needs one, on this queue (cap 1; the run's
    /// stored queues are left as they are), then the loop ends.
    pub trial: Option<String>,
    /// When a running job counts as stalled (shown, reported once).
    pub stall: embedfleet_core::rundb::StallRule,
    /// Cancel stalled jobs (their batches are retried like any cancelled job's).
    pub kill_stalled: bool,
    /// Serve the run's metrics over HTTP here (`--metrics-listen`).
    pub metrics_listen: Option<std::net::SocketAddr>,
}
