//! The command line, as typed. `commands` turns these into the library crates' option structs;
//! clap types go no further than this crate.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Turn a corpus of full-text papers into published embeddings on HPC clusters.
///
/// A run lives in one run directory: `plan` cuts the corpus into per-node jobs, `status` shows
/// where the run stands. Every step can be killed and run again; it continues where it stopped.
#[derive(Debug, Parser)]
#[command(
    name = "embedfleet",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// More log output on stderr (-v info, -vv debug); EMBEDFLEET_LOG=<filter> overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The whole pipeline on this machine: plan (if not planned), embed every batch as local
    /// jobs, upload into the embedded Qdrant (<run-dir>/qdrant), run one query, show the status. Run it again after a kill: it continues.
    Run(RunArgs),
    /// Stream the corpus and cut it into per-node jobs, each with its own batch file.
    Plan(PlanArgs),
    /// Show where a run stands: papers planned and quarantined, batches, jobs, shards, uploads.
    Status(StatusArgs),
    /// Submit the planned batches as scheduler jobs (Slurm, PBS or local), keeping each queue
    /// filled up to its cap, retrying failed jobs, until every batch is done. Kill it and run it
    /// again: it adopts the jobs already queued instead of submitting them twice.
    Submit(SubmitArgs),
    /// Stop the submit loop from submitting new jobs; jobs already queued or running go on.
    Pause(RunDirArgs),
    /// Let the submit loop submit again after `pause`.
    Resume(RunDirArgs),
    /// Show or change the queues the submit loop fills and their caps (jobs queued + running);
    /// a running loop picks changes up within one poll.
    Queues(QueuesArgs),
    /// The study's Table 2 for a run: mean ± std per batch of model load, I/O, tokenisation and
    /// inference; throughput, padding, fallbacks; optional PNG plots.
    Report(crate::commands::ReportArgs),
    /// Write a deterministic synthetic peS2o-like corpus (JSON lines, gzip).
    SampleCorpus(SampleCorpusArgs),
    /// Embed one planned batch on this node: parquet shards in <run-dir>/shards, timings in run.db.
    EmbedJob(EmbedJobArgs),
    /// Embed files of records (or text lines) straight to one parquet file.
    Embed(EmbedArgs),
    /// Write a small random Qwen3 model in the Hugging Face layout (for tests and the demo).
    MakeTinyModel(MakeTinyModelArgs),
    /// Upload the run's shards into Qdrant (a server, or the embedded engine), resumably.
    Upload(crate::commands::upload::UploadArgs),
    /// Find the upload's batch size and requests in flight with a sample; saved in run.db.
    Tune(crate::commands::upload::TuneArgs),
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A Qwen3-Embedding model directory (config.json, model.safetensors or shards,
    /// tokenizer.json), e.g. a download of Qwen/Qwen3-Embedding-4B.
    #[arg(long, value_name = "DIR")]
    pub model_dir: PathBuf,
    /// Output dimension (Matryoshka): the first N components, renormalised.
    #[arg(long, value_name = "N")]
    pub dim: Option<usize>,
    /// Element type of the stored vectors.
    #[arg(long, value_enum, default_value_t = VectorDtypeArg::F32)]
    pub vector_dtype: VectorDtypeArg,
    /// Longest sequence fed to the model, in tokens; longer papers are embedded in chunks and
    /// combined (default: the model's context).
    #[arg(long, value_name = "TOKENS")]
    pub max_tokens: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VectorDtypeArg {
    F32,
    F16,
}

#[derive(Debug, Args)]
pub struct EmbedJobArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// The batch to embed (`status` lists them; batch ids start at 1).
    #[arg(long, value_name = "ID")]
    pub batch: i64,
    /// Devices, one worker each: `cuda:0,1,2,3`, `cuda`, `cpu`, or `cpu:N` (N CPU workers).
    #[arg(long, default_value = "cpu", value_name = "DEVICES")]
    pub devices: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Papers per shard file: a killed job loses at most one shard of work.
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub shard_papers: usize,
    /// Fail mini-batches whose estimated memory exceeds this many bytes, as an out-of-memory
    /// on a GPU would (exercises the fallback without a GPU).
    #[arg(long, value_name = "BYTES", hide = true)]
    pub memory_limit: Option<u64>,
}

#[derive(Debug, Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Input files: any corpus format, or plain text lines with --lines.
    #[arg(long, required = true, num_args = 1.., value_name = "FILE")]
    pub input: Vec<PathBuf>,
    /// The parquet file to write (shard schema).
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// Devices: `cpu`, `cpu:N`, `cuda`, `cuda:0,1`.
    #[arg(long, default_value = "cpu", value_name = "DEVICES")]
    pub device: String,
    /// Inputs are plain text, one text per line (id = file:line).
    #[arg(long)]
    pub lines: bool,
    /// Embed as queries: `Instruct: {instruction}\nQuery:{text}`.
    #[arg(long)]
    pub query: bool,
    /// The query instruction (with --query).
    #[arg(long, value_name = "TEXT")]
    pub instruction: Option<String>,
    /// Token budget of one forward pass.
    #[arg(long, default_value_t = 16_384, value_name = "TOKENS")]
    pub batch_tokens: u64,
}

#[derive(Debug, Args)]
pub struct MakeTinyModelArgs {
    /// The directory to write config.json, model.safetensors and tokenizer.json to.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

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
    #[command(flatten)]
    pub corpus: CorpusArgs,
    #[command(flatten)]
    pub plan: PlanSettingsArgs,
}

#[derive(Debug, Args)]
pub struct PlanSettingsArgs {
    /// Papers per per-node job.
    #[arg(long, default_value_t = 4000, value_name = "N")]
    pub papers_per_job: u64,
    /// Characters per per-node job (a paper longer than this gets a job of its own).
    #[arg(long, value_name = "CHARS")]
    pub max_job_chars: Option<u64>,
    /// Only records whose `source` is this, or starts with this and '/' (repeatable):
    /// `--source s2orc` selects `s2orc/train`.
    #[arg(long = "source", value_name = "SOURCE")]
    pub sources: Vec<String>,
    /// Keep this record field besides id, text, source, created, added, version (repeatable).
    #[arg(long = "keep-field", value_name = "FIELD")]
    pub keep_fields: Vec<String>,
    /// How a job's papers are cut into per-device mini-batches: `tokens` sorts papers by length
    /// and fills a token budget (no padding waste); `chars` is the study's rule, in corpus order.
    #[arg(long, value_enum, default_value_t = Batching::Tokens)]
    pub batching: Batching,
    /// Token budget of one mini-batch (`--batching tokens`).
    #[arg(long, default_value_t = 32_768, value_name = "TOKENS")]
    pub batch_tokens: u64,
    /// Characters of one mini-batch (`--batching chars`).
    #[arg(long, default_value_t = 150_000, value_name = "CHARS")]
    pub batch_chars: u64,
    /// Papers of one mini-batch (`--batching chars`).
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub batch_max: u32,
    /// Corpus files planned at once (default: the number of cores).
    #[arg(long, value_name = "N")]
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
    #[command(flatten)]
    pub plan: PlanSettingsArgs,
    /// The model directory; without it a tiny random Qwen3 is written to <run-dir>/tiny-model
    /// and used, so the pipeline runs with no download (its vectors mean nothing).
    #[arg(long, value_name = "DIR")]
    pub model_dir: Option<PathBuf>,
    /// Embed jobs at once (local child processes).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub local_jobs: usize,
    /// Devices of each job: `cpu`, `cpu:N`, `cuda:0,1,2,3`.
    #[arg(long, default_value = "cpu", value_name = "DEVICES")]
    pub devices: String,
    /// Output dimension (Matryoshka).
    #[arg(long, value_name = "N")]
    pub dim: Option<usize>,
    /// Papers per shard file.
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub shard_papers: usize,
    /// The sample query run against the uploaded collection at the end.
    #[arg(long, default_value = "protein folding", value_name = "TEXT")]
    pub query: String,
}

#[derive(Debug, Args)]
pub struct RunDirArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The run directory (planned with `embedfleet plan`).
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// The scheduler; overrides `[scheduler] backend` of --config (default: local).
    #[arg(long, value_enum)]
    pub backend: Option<BackendArg>,
    /// A queue (PBS) or partition (Slurm) and its cap on jobs queued + running, e.g.
    /// `--queue debug=1 --queue prod=8` (repeatable). Replaces the queues stored in the run;
    /// without it the stored ones are used (`embedfleet queues`).
    #[arg(long = "queue", value_name = "NAME=CAP", value_parser = parse_queue_cap)]
    pub queues: Vec<(String, u32)>,
    /// The run config (TOML): scheduler command paths, account, walltime, GPUs, modules,
    /// environment, a job script template (README, "Run config").
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Devices of each job: `cuda` (every GPU of the node), `cuda:0,1`, `cpu:N`
    /// (default: cuda on slurm and pbs, cpu locally).
    #[arg(long, value_name = "DEVICES")]
    pub devices: Option<String>,
    /// Papers per shard file.
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub shard_papers: usize,
    /// Jobs per batch before it is marked failed (walltime kills, node failures, cancelled
    /// jobs are retried; exit codes 2 and 4 of embed-job are not).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_attempts: u32,
    /// Seconds between polls of the scheduler (default: 30, or 1 for local).
    #[arg(long, value_name = "SECS")]
    pub poll_interval: Option<f64>,
    /// Seconds a job may be unknown to the scheduler, with no completion marker, before it
    /// counts as lost and is retried (default: 300, or 10 for local).
    #[arg(long, value_name = "SECS")]
    pub lost_after: Option<f64>,
    /// Run as a daemon: do not exit when every batch is settled; stop it with a signal.
    #[arg(long)]
    pub watch: bool,
    /// Print the job scripts the first round would submit; submit nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Local,
    Slurm,
    Pbs,
}

#[derive(Debug, Args)]
pub struct QueuesArgs {
    #[command(subcommand)]
    pub command: Option<QueuesCommand>,
    /// The run directory (to show its queues).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum QueuesCommand {
    /// Show the queues, their caps and jobs.
    Show(RunDirArgs),
    /// Add queues or change caps: `queues set --run-dir DIR debug=2 prod=0 preemptable=4`
    /// (0 submits nothing more there; running jobs go on).
    Set {
        /// The run directory.
        #[arg(long, value_name = "DIR")]
        run_dir: PathBuf,
        /// NAME=CAP pairs.
        #[arg(required = true, value_name = "NAME=CAP", value_parser = parse_queue_cap)]
        caps: Vec<(String, u32)>,
    },
    /// Remove queues (their running jobs go on and are still watched).
    Remove {
        /// The run directory.
        #[arg(long, value_name = "DIR")]
        run_dir: PathBuf,
        /// Queue names.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
}

fn parse_queue_cap(s: &str) -> Result<(String, u32), String> {
    let (name, cap) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not NAME=CAP, e.g. debug=1"))?;
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
    if !valid {
        return Err(format!(
            "queue name `{name}` must be letters, digits and `-_.@`"
        ));
    }
    let cap = cap
        .parse::<u32>()
        .map_err(|_| format!("cap `{cap}` of queue {name} is not a whole number >= 0"))?;
    Ok((name.to_string(), cap))
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// Print the stable JSON form (README, "status --json").
    #[arg(long)]
    pub json: bool,
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
