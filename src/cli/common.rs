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
    /// How the model computes: `native` (bf16 on a GPU, f32 on the CPU) or `fp8` (the
    /// projections in FP8 on GPUs of compute capability 8.9+: H100, H200, L40; Qwen3 models
    /// only). Fixed for the whole run: the vectors of the two never mix.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Native, help_heading = help::MODEL)]
    pub precision: PrecisionArg,
    /// Longest sequence fed to the model, in tokens; longer papers are embedded in chunks and
    /// combined (default: the model's context).
    #[arg(long, value_name = "TOKENS", help_heading = help::MODEL)]
    pub max_tokens: Option<usize>,
    // The help is TEXT_RULE_HELP's: the same words for `submit`.
    #[arg(long, value_enum, value_name = "RULE", help = TEXT_RULE_HELP, help_heading = help::MODEL)]
    pub text_rule: Option<TextRuleArg>,
}

// The words both helps share.
macro_rules! text_rule_help {
    () => {
        "How a text is prepared before it is tokenised: `as-given`, as sentence-transformers 5.4 \
and later encode it (the text as it is, `do_lower_case` \
by the tokenizer's Lowercase normalizer), or `stripped`, as 5.3 and earlier did (leading and \
trailing whitespace stripped, `do_lower_case` by Python's str.lower()), for vectors that must \
match a query side written against an older release. Fixed for the whole run; a run started \
before the rule was recorded keeps its own (docs/models.md, \"How texts are read\")"
    };
}

/// `--text-rule`'s help, for `embed` and `submit` alike (`submit` says where its default comes
/// from: [`TEXT_RULE_SUBMIT_HELP`]).
pub const TEXT_RULE_HELP: &str = concat!(text_rule_help!(), " [default: as-given]");

/// `submit --text-rule`'s help.
pub const TEXT_RULE_SUBMIT_HELP: &str =
    concat!(text_rule_help!(), " [default: the run's, else as-given]");

/// `--text-rule` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TextRuleArg {
    AsGiven,
    Stripped,
}

impl TextRuleArg {
    pub fn rule(self) -> embedfleet_pipeline::flags::TextRule {
        match self {
            Self::AsGiven => embedfleet_pipeline::flags::TextRule::AsGiven,
            Self::Stripped => embedfleet_pipeline::flags::TextRule::Stripped,
        }
    }
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

/// `--precision` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    Native,
    Fp8,
}

impl PrecisionArg {
    pub fn precision(self) -> embedfleet_core::Precision {
        match self {
            Self::Native => embedfleet_core::Precision::Native,
            Self::Fp8 => embedfleet_core::Precision::Fp8,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunDirArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
}
