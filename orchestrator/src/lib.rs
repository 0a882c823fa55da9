//! The orchestrator: everything that happens outside a job — planning the corpus into per-node
//! jobs, and (later) submitting them to queues and watching them.

pub mod plan;
pub mod sample;
pub mod status;
