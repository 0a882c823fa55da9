//! One function per command, called by the binary with the command's flags as given
//! ([`crate::flags`]); each prints what it did and returns its exit code
//! (docs/commands.md, "Exit codes"). [`invoke`] (`invoke.rs`) wraps every one: the run
//! directory checked before, run.db opened once, the command line recorded after.

mod bench;
mod compare;
mod doctor;
mod embed;
mod failure;
mod invoke;
pub mod plan;
mod query;
mod query_job;
mod report;
mod run;
mod snapshot;
mod submit;
mod upload;

pub use bench::bench_gpu;
pub use doctor::doctor;
pub use embed::{embed, embed_job, make_tiny_model};
pub use failure::CommandError;
pub use invoke::{invoke, Ended, RunDbSlot, RunDirs};
pub use plan::{plan, sample_corpus};
pub use query::{eval, publish, query};
pub use query_job::query_job;
pub use report::report;
pub use run::run_all;
pub use snapshot::build_shard_cmd as build_shard;
pub use submit::{pause, queues, status, submit, take_over};
pub use upload::{delete_cmd as delete, tune_cmd as tune, upload_cmd as upload};
