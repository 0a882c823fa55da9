//! The flags several stages share: the model and its output options, the run directory.

use super::help;
use clap::{Args, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Args)]
pub struct ModelArgs {
    // The families this build implements answer the help (`help::model_dir`).
    #[arg(long, value_name = "DIR", help = help::model_dir(""), help_heading = help::MODEL)]
    pub model_dir: PathBuf,
    /// Output dimension (Matryoshka): the first N components, renormalised.
    #[arg(long, value_name = "N", help_heading = help::MODEL)]
    pub dim: Option<usize>,
    /// Element type of the stored vectors.
    #[arg(long, value_enum, default_value_t = VectorDtypeArg::F32, help_heading = help::MODEL)]
    pub vector_dtype: VectorDtypeArg,
    /// Longest sequence fed to the model, in tokens; longer papers are embedded in chunks and
    /// combined (default: the model's context).
    #[arg(long, value_name = "TOKENS", help_heading = help::MODEL)]
    pub max_tokens: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VectorDtypeArg {
    F32,
    F16,
}

impl VectorDtypeArg {
    pub fn dtype(self) -> embedfleet_core::shardfile::VectorDtype {
        match self {
            Self::F32 => embedfleet_core::shardfile::VectorDtype::F32,
            Self::F16 => embedfleet_core::shardfile::VectorDtype::F16,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunDirArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
}
