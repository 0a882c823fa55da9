//! Planning: `plan`, `run` (which plans first), and `sample-corpus`.

use super::help;
use clap::{Args, ValueEnum};
use embedfleet_core::settings::{
    DEFAULT_BATCH_TOKENS, DEFAULT_PAPERS_PER_JOB, STUDY_MAX_CHARS, STUDY_MAX_PAPERS,
};
use embedfleet_pipeline::flags::defaults::DEFAULT_SHARD_PAPERS;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CorpusArgs {
    /// Corpus files or directories (searched recursively): .jsonl, .jsonl.gz, .json.gz,
    /// .jsonl.zst, .parquet. Records need `id` and `text`.
    #[arg(long, required = true, num_args = 1.., value_name = "PATH")]
    pub corpus: Vec<PathBuf>,
    /// The run directory (created if needed); holds run.db, batches/, quarantine.jsonl.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Corpus files or directories (searched recursively): .jsonl, .jsonl.gz, .json.gz,
    /// .jsonl.zst, .parquet. Records need `id` and `text`.
    #[arg(long, num_args = 1.., value_name = "PATH", required_unless_present = "update", conflicts_with = "update")]
    pub corpus: Vec<PathBuf>,
    /// A new release of the corpus, planned into this already planned run as its next
    /// release: only papers whose id is new or whose text changed get batches (then `submit`
    /// or `run` embeds just those, `upload` sends the difference and `publish` writes the
    /// next version); papers the release lacks are withdrawn. Run it again to resume.
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub update: Vec<PathBuf>,
    /// With `--update`: the release only adds papers; one it lacks is kept, not withdrawn.
    #[arg(long, requires = "update")]
    pub only_adds: bool,
    /// The run directory (created if needed); holds run.db, batches/, quarantine.jsonl.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub plan: PlanSettingsArgs,
}

/// How the corpus is cut into jobs and mini-batches. Pinned by the first plan: a later `plan`,
/// `plan --update` or `run` given none of them uses the run's.
#[derive(Debug, Args)]
pub struct PlanSettingsArgs {
    /// Papers per per-node job (one batch file each).
    #[arg(long, default_value_t = DEFAULT_PAPERS_PER_JOB, value_name = "N", help_heading = help::PLANNING)]
    pub papers_per_job: u64,
    /// Characters per per-node job (a paper longer than this gets a job of its own).
    #[arg(long, value_name = "CHARS", help_heading = help::PLANNING)]
    pub max_job_chars: Option<u64>,
    /// Only records whose `source` is this, or starts with this and '/' (repeatable):
    /// `--source s2orc` selects `s2orc/train`.
    #[arg(long = "source", value_name = "SOURCE", help_heading = help::PLANNING)]
    pub sources: Vec<String>,
    /// Keep this record field besides id, text, source, created, added, version (repeatable).
    #[arg(long = "keep-field", value_name = "FIELD", help_heading = help::PLANNING)]
    pub keep_fields: Vec<String>,
    /// How a job's papers are cut into per-device mini-batches: `tokens` sorts the papers of
    /// each part (one parquet shard's worth) by length and fills a token budget (little padding
    /// waste); `chars` is the study's rule, in corpus order.
    #[arg(long, value_enum, default_value_t = Batching::Tokens, help_heading = help::PLANNING)]
    pub batching: Batching,
    /// Token budget of one mini-batch (`--batching tokens`): papers × the longest one's tokens.
    #[arg(long, default_value_t = DEFAULT_BATCH_TOKENS, value_name = "TOKENS", help_heading = help::PLANNING)]
    pub batch_tokens: u64,
    /// Characters of one mini-batch (`--batching chars`).
    #[arg(long, default_value_t = STUDY_MAX_CHARS, value_name = "CHARS", help_heading = help::PLANNING)]
    pub batch_chars: u64,
    /// Papers of one mini-batch (`--batching chars`).
    #[arg(long, default_value_t = STUDY_MAX_PAPERS, value_name = "N", help_heading = help::PLANNING)]
    pub batch_max: u32,
    /// Corpus files planned at once (default: the number of cores).
    #[arg(long, value_name = "N", help_heading = help::PLANNING)]
    pub threads: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Batching {
    Tokens,
    Chars,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub corpus: CorpusArgs,
    /// The model directory; without it a tiny random model is written to <run-dir>/tiny-model
    /// and used, so the pipeline runs with no download (its vectors mean nothing).
    #[arg(long, value_name = "DIR", help_heading = help::MODEL)]
    pub model_dir: Option<PathBuf>,
    /// Embed jobs at once (local child processes).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub local_jobs: usize,
    /// Devices of each job: `cpu`, `cpu:N`, `cuda:0,1,2,3`.
    #[arg(long, default_value = "cpu", value_name = "DEVICES", help_heading = help::MODEL)]
    pub devices: String,
    /// Output dimension (Matryoshka).
    #[arg(long, value_name = "N", help_heading = help::MODEL)]
    pub dim: Option<usize>,
    /// Papers per parquet shard.
    #[arg(long, default_value_t = DEFAULT_SHARD_PAPERS, value_name = "N", help_heading = help::MODEL)]
    pub shard_papers: usize,
    /// The sample query run against the uploaded collection at the end.
    #[arg(long, default_value = "protein folding", value_name = "TEXT")]
    pub query: String,
    #[command(flatten)]
    pub plan: PlanSettingsArgs,
}

#[derive(Debug, Args)]
pub struct SampleCorpusArgs {
    /// How many papers.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub papers: u64,
    /// The output file (`.jsonl.gz` or `.jsonl`); with `--files` > 1, a directory of
    /// `part-NNNN.jsonl.gz`.
    #[arg(long, value_name = "PATH")]
    pub out: PathBuf,
    /// Seed of the generator: the same seed gives the same corpus, byte for byte.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Mean length of an ordinary paper, in characters (log-normal; one paper in 500 is
    /// 160,000-220,000 characters, longer than a 32,768-token context).
    #[arg(long, default_value_t = 20_000, value_name = "CHARS")]
    pub mean_chars: u64,
    /// Spread the papers over this many files.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub files: u32,
}
