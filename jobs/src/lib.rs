//! The work done inside one job: embedding a batch (`embed-job`), embedding files (`embed`),
//! and uploading shards into Qdrant (`upload`).
//!
//! Like TEI's core, this crate drives the model through `embedfleet_models::Embedder` and knows
//! nothing of schedulers; the orchestrator starts jobs as processes of the `embedfleet` binary.

pub mod embed;
pub mod embed_files;
mod plot;
pub mod report;
pub mod upload;
