//! The orchestrator: everything that happens outside a job — planning the corpus into per-node
//! jobs, the scheduler backends (local, Slurm, PBS), and the submit loop that keeps their
//! queues filled.

mod child;
pub mod config;
pub mod notify;
pub mod oneshot;
pub mod plan;
pub mod report;
pub mod route;
pub mod sample;
pub mod scheduler;
pub mod status;
pub mod stored_config;
pub mod submit;
