//! The orchestrator: everything that happens outside a job — planning the corpus into per-node
//! jobs, and (later) submitting them to queues and watching them.

pub mod local_run;
pub mod plan;
pub mod sample;
pub mod status;
