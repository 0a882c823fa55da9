//! The shared vocabulary of embedfleet: papers, corpus formats, batch and shard files, and the
//! run state (`run.db`) that every step reads to resume.
//!
//! Both sides of the pipeline use this crate — the orchestrator that plans and submits, and the
//! jobs that embed and upload — so it stays free of models, schedulers and network clients.

pub mod access;
pub mod atomic;
pub mod batchfile;
pub mod cause;
pub mod corpus;
pub mod eval_tables;
pub mod exit;
pub mod fingerprint;
pub mod fsops;
pub mod handoff;
pub mod host;
pub mod layout;
pub mod owner;
pub mod paper;
pub mod pin;
pub mod plot;
pub mod precision;
pub mod process;
pub mod quarantine;
pub mod rundb;
pub mod secret;
pub mod settings;
pub mod shardfile;
pub mod space;
pub mod state;
pub mod status_snapshot;
pub mod stop_signal;
pub mod synthetic;
pub mod untrusted;

pub use layout::RunLayout;
pub use paper::{BatchId, Paper};
pub use precision::Precision;
pub use quarantine::{QuarantineEntry, QuarantineReason};
