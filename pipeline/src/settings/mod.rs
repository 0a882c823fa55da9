//! Each command's settings, resolved once (ripgrep's low args to high args): the flags as
//! typed, a plain struct the binary fills from clap, become validated settings, each one as
//! given, else as the run keeps it (pinned by its first step, or stored by an earlier command),
//! else the default ([`embedfleet_core::pin::Resolved`]). Clap types stop at the binary.

pub mod eval;
pub mod plan;
pub mod publish;
pub mod query;
pub mod query_job;
pub mod report;
pub mod submit;
pub mod tune;
pub mod upload;

pub use crate::flags::QueryModelFlags;
pub use crate::job_command::JobSettings;
pub use embedfleet_orchestrator::submit::SessionOptions;
pub use eval::{Comparison, EvalMeasure, EvalQueries, EvalSettings};
pub use query::QueryModelSettings;
pub use query_job::QueryJobSettings;
pub use report::ReportSettings;
pub use submit::{GroupBuildsSetting, LoopOptions, SubmitFlags, SubmitSettings};
pub use tune::TuneSettings;
pub use upload::UploadSettings;
