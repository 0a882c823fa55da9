//! Where embedfleet's stages meet, as nextest-runner is to nextest: each command's settings
//! resolved once ([`settings`]: as given, else as the run keeps them, else the default), the
//! checks before a run's first job ([`preflight`]), and the drivers that cross stages — the
//! submit set-up ([`submit`]), shards built per group while the run embeds ([`group_builds`]),
//! the query job's round trip ([`query_job`]), the run's shard keys ([`shard_keys`]) and the
//! shards `build-shard` builds under them ([`build_shard`]), a target opened as a sink
//! ([`target`]) and the upload and query that end `run` ([`run`]).
//!
//! The `embedfleet` binary maps its flags onto these and prints what comes back. No stage crate
//! depends on this one (`tests/e2e/architecture.rs`).

pub mod activity;
pub mod build_shard;
pub mod commands;
pub mod delete;
pub mod error;
pub mod flags;
pub mod group_builds;
pub mod job_command;
pub mod job_record;
pub mod preflight;
pub mod query_job;
pub mod records;
pub mod room;
pub mod run;
pub mod searched;
pub mod settings;
pub mod shard_keys;
pub mod submit;
pub mod target;
pub mod tuned;

pub use embedfleet_vectordb::DEFAULT_COLLECTION;
pub use error::{PipelineError, Result};

/// The embedfleet binary running now: what jobs run when the run config names none.
/// `embedfleet --version`: the version and the build's kind, `(cpu build)` or `(cuda build)`,
/// which `submit`'s check reads back from the binary a run config names for its jobs.
pub const VERSION: &str = if embedfleet_models::CUDA_BUILD {
    concat!(env!("CARGO_PKG_VERSION"), " (cuda build)")
} else {
    concat!(env!("CARGO_PKG_VERSION"), " (cpu build)")
};

pub fn current_exe() -> Result<std::path::PathBuf> {
    std::env::current_exe().map_err(|source| PipelineError::Io {
        action: "find",
        path: "the embedfleet binary".into(),
        cause: source,
    })
}
