//! The embedding commands: `embed-job` (one planned batch), `embed` (any files),
//! `make-tiny-model`, `doctor` and `bench-gpu`.

use super::common::{ModelArgs, RunDirArgs};
use super::help;
use clap::{Args, Parser};
use embedfleet_core::settings::DEFAULT_BATCH_TOKENS;
use embedfleet_pipeline::flags::defaults::DEFAULT_SHARD_PAPERS;
use embedfleet_pipeline::settings::JobSettings;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct EmbedJobArgs {
    #[command(flatten)]
    pub run: RunDirArgs,
    /// The batch to embed (`status` lists them; batch ids start at 1).
    #[arg(long, value_name = "ID")]
    pub batch: i64,
    #[command(flatten)]
    pub settings: EmbedJobSettings,
}

/// How an embed job embeds: every `embed-job` flag but the run directory and the batch, which
/// the submit loop adds to each job's command line. `run` and `submit` fill the pipeline's
/// [`JobSettings`], whose `to_args` renders these flags, so a job parses exactly what was
/// meant (the round-trip test below).
#[derive(Debug, Clone, PartialEq, Args)]
pub struct EmbedJobSettings {
    /// Devices, one worker each: `cuda:0,1,2,3`, `cuda`, `cpu`, or `cpu:N` (N CPU workers).
    #[arg(long, default_value = "cpu", value_name = "DEVICES", help_heading = help::MODEL)]
    pub devices: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Papers per parquet shard: a killed job loses at most one shard of work.
    #[arg(long, default_value_t = DEFAULT_SHARD_PAPERS, value_name = "N", help_heading = help::MODEL)]
    pub shard_papers: usize,
    /// Fail mini-batches whose estimated memory exceeds this many bytes, as an out-of-memory
    /// on a GPU would (exercises the fallback without a GPU).
    #[arg(long, value_name = "BYTES", hide = true)]
    pub memory_limit: Option<u64>,
    /// After the batch, build its Qdrant shard (`build-shard`, with the run's pinned build
    /// settings) on this node's cores, for `upload --mode snapshot`.
    #[arg(long, help_heading = help::MODEL)]
    pub build_shard: bool,
}

impl EmbedJobSettings {
    /// The settings as the pipeline renders them into job scripts.
    pub fn job_settings(&self) -> JobSettings {
        JobSettings {
            devices: self.devices.clone(),
            model_dir: self.model.model_dir.clone(),
            dim: self.model.dim,
            vector_dtype: self.model.vector_dtype.dtype(),
            precision: self.model.precision.precision(),
            max_tokens: self.model.max_tokens,
            shard_papers: self.shard_papers,
            memory_limit: self.memory_limit,
            build_shard: self.build_shard,
            text_rule: self.model.text_rule.map(super::common::TextRuleArg::rule),
        }
    }
}

/// Parses an `embed-job` command line on its own (the round-trip test's other half).
#[derive(Debug, Parser)]
#[command(name = "embed-job")]
pub struct EmbedJobCommandLine {
    #[command(flatten)]
    pub args: EmbedJobArgs,
}

#[derive(Debug, Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Input files: any corpus format, or plain text lines with --lines.
    #[arg(long, required = true, num_args = 1.., value_name = "FILE")]
    pub input: Vec<PathBuf>,
    /// The parquet file to write (the parquet shard schema).
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// Devices: `cpu`, `cpu:N`, `cuda`, `cuda:0,1`.
    #[arg(long, alias = "device", default_value = "cpu", value_name = "DEVICES", help_heading = help::MODEL)]
    pub devices: String,
    /// Inputs are plain text, one text per line (id = file:line).
    #[arg(long)]
    pub lines: bool,
    // The families answer the help (`help::query_formats`).
    #[arg(long, help = help::query_formats())]
    pub query: bool,
    /// The query instruction (with --query; default: the model family's retrieval instruction, or
    /// the query prompt of the model's sentence-transformers files: E5's `query: `).
    #[arg(long, value_name = "TEXT")]
    pub instruction: Option<String>,
    /// Token budget of one mini-batch (one forward pass).
    #[arg(long, default_value_t = DEFAULT_BATCH_TOKENS, value_name = "TOKENS", help_heading = help::MODEL)]
    pub batch_tokens: u64,
}

#[derive(Debug, Args)]
pub struct BenchGpuArgs {
    // The families this build implements answer the help (`help::model_dir`).
    #[arg(
        long,
        value_name = "DIR",
        help = help::model_dir(
            ", loaded as the embed job loads it (on a GPU: the fused attention kernel after its self-test)"
        )
    )]
    pub model_dir: PathBuf,
    /// Devices, one worker each (`cuda:0`; `cuda:0,0` runs two workers on one GPU; `cpu`).
    #[arg(long, default_value = "cuda:0", value_name = "DEVICES")]
    pub devices: String,
    /// Uniform shapes, BATCHxTOKENS each, timed on the first device (the peer's
    /// `uniform_bB_tT`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "64x512,16x2048,4x8192,1x32768",
        value_name = "BxT,...",
        help_heading = help::BENCH_UNIFORM
    )]
    pub shapes: Vec<String>,
    /// Timed forwards per uniform shape (after two warm-up forwards).
    #[arg(long, default_value_t = 4, value_name = "N", help_heading = help::BENCH_UNIFORM)]
    pub forwards: usize,
    /// The paper mix: a JSON list of token lengths (`gpu-check.sh` writes the peer's); without
    /// it, --mix-papers lengths of the peer's distribution, seeded.
    #[arg(long, value_name = "FILE", help_heading = help::BENCH_MIX)]
    pub mix: Option<PathBuf>,
    /// Papers of the generated mix.
    #[arg(long, default_value_t = 240, value_name = "N", help_heading = help::BENCH_MIX)]
    pub mix_papers: usize,
    /// Padded tokens per mini-batch of the mix (the job's --batch-tokens), capped by the
    /// device's free memory unless --no-memory-plan.
    #[arg(long, default_value_t = 65_536, value_name = "TOKENS", help_heading = help::BENCH_MIX)]
    pub batch_tokens: u64,
    /// Do not cap mini-batches by the device's free memory (exercises the out-of-memory
    /// fallback).
    #[arg(long, help_heading = help::BENCH_MIX)]
    pub no_memory_plan: bool,
    /// Reference vectors (JSON: cases of name, ids with EOS, embedding): prints the cosine of
    /// ours against each.
    #[arg(long, value_name = "FILE", help_heading = help::BENCH_FIDELITY)]
    pub fidelity: Option<PathBuf>,
    /// Writes the mix's vectors (JSON) for a later --compare-vectors.
    #[arg(long, value_name = "FILE", help_heading = help::BENCH_FIDELITY)]
    pub save_vectors: Option<PathBuf>,
    /// Compares the mix's vectors with a --save-vectors file: prints the lowest cosine.
    #[arg(long, value_name = "FILE", help_heading = help::BENCH_FIDELITY)]
    pub compare_vectors: Option<PathBuf>,
    /// Skip the uniform shapes.
    #[arg(long, help_heading = help::BENCH_UNIFORM)]
    pub skip_uniform: bool,
    /// Skip the paper mix.
    #[arg(long, help_heading = help::BENCH_MIX)]
    pub skip_mix: bool,
    /// Skip the mix in the study's mini-batches (keep the job's token-budget batching only).
    #[arg(long, help_heading = help::BENCH_MIX)]
    pub skip_study: bool,
    /// Seed of the random token ids and of the generated mix.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compute dtype (default: bf16 on a GPU, f32 on the CPU). `--dtype f32` on a GPU, or
    /// `--dtype bf16` on the CPU, tells a numeric drift from a kernel's fault in --fidelity.
    #[arg(long, value_enum)]
    pub dtype: Option<ComputeDtype>,
    /// `fp8`: the projections in FP8 (GPUs of compute capability 8.9+); with
    /// --compare-vectors of a native run's --save-vectors, its fidelity.
    #[arg(long, value_enum, default_value_t = super::common::PrecisionArg::Native)]
    pub precision: super::common::PrecisionArg,
}

/// A model's compute dtype on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ComputeDtype {
    F32,
    Bf16,
    F16,
}

impl ComputeDtype {
    pub fn dtype(self) -> embedfleet_pipeline::flags::DType {
        match self {
            ComputeDtype::F32 => embedfleet_pipeline::flags::DType::F32,
            ComputeDtype::Bf16 => embedfleet_pipeline::flags::DType::BF16,
            ComputeDtype::F16 => embedfleet_pipeline::flags::DType::F16,
        }
    }
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The model directory the jobs will use (loaded, and one forward run on each device).
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<PathBuf>,
    /// The devices the jobs will use (default: `cuda` in a CUDA build, else `cpu`).
    #[arg(long, value_name = "DEVICES")]
    pub devices: Option<String>,
    /// The run directory: is it writable from here, and on which filesystem; and its queues
    /// checked by the run's scheduler (as `submit` checks them before its first job).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// The run config whose scheduler checks the queues (default: the one the run keeps,
    /// stored with its first job): a config not used yet, checked before any job.
    #[arg(long, value_name = "FILE", requires = "run_dir")]
    pub config: Option<PathBuf>,
    /// Tokens of the test forward.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub tokens: usize,
    /// Probe cuDNN's fused attention on each GPU first (a few seconds, before any model): its
    /// self-test for the 4B/8B head layout. A refusal is a problem (exit 1) that says why.
    #[arg(long)]
    pub attention: bool,
    /// The precision the test forward runs in (default: the run's with --run-dir, else
    /// native): `fp8` checks that this node's GPUs take FP8 projections before a run uses them.
    #[arg(long, value_enum)]
    pub precision: Option<super::common::PrecisionArg>,
}

#[derive(Debug, Args)]
pub struct MakeTinyModelArgs {
    /// The directory to write config.json, model.safetensors and tokenizer.json to.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Its output dimension (hidden size; default 128): as wide as a real model's output
    /// (2560 for Qwen3-Embedding-4B, 4096 for 8B), tiny otherwise.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(8..=16384))]
    pub hidden_size: Option<u64>,
    /// The family, by its `config.json` `model_type` (qwen3, bert, roberta, xlm-roberta, ...;
    /// default: qwen3): a random model of it in the Hugging Face and sentence-transformers
    /// layout, with a tokenizer of its kind.
    #[arg(long, value_name = "MODEL_TYPE")]
    pub family: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_core::shardfile::VectorDtype;
    use embedfleet_core::Precision;

    fn round_trip(settings: &JobSettings) -> JobSettings {
        let mut line = vec!["embed-job", "--run-dir", "/runs/r1", "--batch", "7"]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        line.extend(settings.to_args());
        let parsed = EmbedJobCommandLine::try_parse_from(&line).unwrap();
        assert_eq!(parsed.args.batch, 7);
        assert_eq!(parsed.args.run.run_dir, PathBuf::from("/runs/r1"));
        parsed.args.settings.job_settings()
    }

    #[test]
    fn embed_job_settings_survive_to_args_and_back() {
        let defaults = JobSettings {
            devices: "cpu".into(),
            model_dir: "/models/Qwen3-Embedding-4B".into(),
            dim: None,
            vector_dtype: VectorDtype::F32,
            precision: Precision::Native,
            max_tokens: None,
            shard_papers: DEFAULT_SHARD_PAPERS,
            memory_limit: None,
            build_shard: false,
            text_rule: None,
        };
        assert_eq!(round_trip(&defaults), defaults);
        let every_flag = JobSettings {
            devices: "cuda:0,1,2,3".into(),
            model_dir: "/models/with space".into(),
            dim: Some(1024),
            vector_dtype: VectorDtype::F16,
            precision: Precision::Fp8,
            max_tokens: Some(8192),
            shard_papers: 250,
            memory_limit: Some(1 << 30),
            build_shard: true,
            text_rule: Some(embedfleet_pipeline::flags::TextRule::Stripped),
        };
        assert_eq!(round_trip(&every_flag), every_flag);
        let as_given = JobSettings {
            text_rule: Some(embedfleet_pipeline::flags::TextRule::AsGiven),
            ..defaults
        };
        assert_eq!(round_trip(&as_given), as_given);
    }
}
