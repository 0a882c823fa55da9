//! The orchestrator: everything that happens outside a job — planning the corpus into per-node
//! jobs, running them locally, and the scheduler backends (local, Slurm, PBS) the submit loop
//! drives.

pub mod local_run;
pub mod plan;
pub mod sample;
pub mod scheduler;
pub mod status;
