//! The command line, as typed: every clap type of the binary, a file per stage. `commands`
//! turns these into the library crates' option structs; clap types go no further than this
//! crate.

mod common;
mod embed;
pub mod help;
mod plan;
mod query;
mod report;
mod submit;
mod upload;

pub use common::{ModelArgs, PrecisionArg, RunDirArgs, TextRuleArg, VectorDtypeArg};
pub use embed::{BenchGpuArgs, DoctorArgs, EmbedArgs, EmbedJobArgs, MakeTinyModelArgs};
pub use plan::{Batching, CorpusArgs, PlanArgs, PlanSettingsArgs, RunArgs, SampleCorpusArgs};
pub use query::{EvalArgs, PublishArgs, QueryArgs, QueryJobArgs, QueryModelArgs};
pub use report::ReportArgs;
pub use submit::{QueuesArgs, QueuesCommand, StatusArgs, SubmitArgs, TakeOverArgs};
pub use upload::{
    BuildShardArgs, CollectionArgs, DeleteArgs, PgIndexArg, PgScanArg, TargetArgs, TuneArgs,
    UploadArgs, UploadMode,
};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Turn a corpus of full-text papers into published embeddings on HPC clusters.
// The help and version flags are declared here, not clap's own, so that they come last in
// every command's help, under their own heading (clap puts its own under "Options" first).
#[derive(Debug, Parser)]
#[command(
    name = "embedfleet",
    version = embedfleet_pipeline::VERSION,
    propagate_version = true,
    max_term_width = 100,
    disable_help_flag = true,
    disable_version_flag = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log more on stderr: -v info, -vv debug (EMBEDFLEET_LOG=<filter> overrides).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = help::GLOBAL)]
    pub verbose: u8,
    /// Print help.
    #[arg(short, long, global = true, action = clap::ArgAction::Help, help_heading = help::GLOBAL)]
    help: Option<bool>,
    /// Print version.
    #[arg(short = 'V', long, global = true, action = clap::ArgAction::Version, help_heading = help::GLOBAL)]
    version: Option<bool>,
}

/// The command line, its top-level help grouped ([`help::grouped`]).
pub fn command() -> clap::Command {
    help::grouped(Cli::command())
}

/// Parses the process's arguments; exits on `--help`, `--version` or a usage error.
pub fn parse() -> Cli {
    let matches = command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command()).exit())
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The whole pipeline on this machine: plan (if not planned), embed every batch as local
    /// jobs, upload into the embedded Qdrant (<run-dir>/qdrant), run one query, show the status. Run it again after a kill: it continues.
    Run(RunArgs),
    /// Stream the corpus and cut it into per-node jobs, each with its own batch file.
    Plan(PlanArgs),
    /// Show where a run stands: papers planned and quarantined, batches, jobs, parquet shards,
    /// uploads, and each running job per host (papers/s, last shard, stalled). Works on any
    /// host: elsewhere than the run's owner it reads the snapshot the owner writes each poll.
    Status(StatusArgs),
    /// Move a run to this host when the host that owns it (the only one that may open run.db)
    /// is gone for good; refused while a process there still holds run.db.
    TakeOver(TakeOverArgs),
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
    /// Timings, throughput and failures of a run: model load, I/O, tokenisation and inference
    /// per batch (mean ± std), throughput, padding and fallbacks as a table or --json; the whole
    /// run, its failed jobs with their first error line included, as one HTML page (--html);
    /// PNG plots; a trace.
    Report(ReportArgs),
    /// Write a deterministic synthetic peS2o-like corpus (JSON lines, gzip).
    SampleCorpus(SampleCorpusArgs),
    /// Embed one planned batch on this node: parquet shards in <run-dir>/shards and a result
    /// manifest in <run-dir>/results, which the run's owner (submit, status, ...) takes into
    /// run.db; the job itself never opens run.db (docs/cluster.md, "On a shared filesystem").
    #[command(hide = true)]
    EmbedJob(EmbedJobArgs),
    /// Embed files of records (or text lines) straight to one parquet file.
    Embed(EmbedArgs),
    /// Write a small random model of a family (default qwen3) in the Hugging Face layout (for tests
    /// and the demo).
    #[command(hide = true)]
    MakeTinyModel(MakeTinyModelArgs),
    /// Check this binary and this node as a job would use them: the build, the driver, the
    /// devices, the model directory (one forward on each device), the run directory. Run it on
    /// a compute node; ends with one line per problem.
    Doctor(DoctorArgs),
    /// Measure the forward pass on this node in the PyTorch peer's shapes and fields
    /// (benches/torch_baseline.py): uniform batches, a paper-length mix batched the embed job's
    /// way and the study's way, fidelity against reference vectors. JSON lines on stdout, a
    /// table on stderr. `benches/gpu-check.sh` runs it beside the peer.
    #[command(hide = true)]
    BenchGpu(BenchGpuArgs),
    /// Upload the run's parquet shards into Qdrant (a server, or the embedded engine), resumably.
    /// `--mode snapshot` recovers built shards instead of sending points (a cluster-mode server).
    Upload(UploadArgs),
    /// Build a batch's Qdrant shard offline (HNSW and payload indexes on this machine's cores)
    /// and pack it as a server shard snapshot under <run-dir>/snapshots, for
    /// `upload --mode snapshot`. Resumable; `embed-job --build-shard` runs it after a batch.
    BuildShard(BuildShardArgs),
    /// Delete papers from a collection by paper id; in a snapshot-loaded collection each delete
    /// goes to the shard key of its batch's group.
    Delete(DeleteArgs),
    /// Find the upload's batch size and requests in flight with a sample (or, with --queries,
    /// the query workload's); saved in run.db.
    Tune(TuneArgs),
    /// The query workload: each term of a file embedded as a query and searched in batches;
    /// the top papers of each go to one parquet file. Resumable. With --submit the terms are
    /// embedded by a scheduler job (`query-job`) on a GPU node, collected by this process.
    Query(QueryArgs),
    /// Embed the terms of a query job's work folder (written by `query --submit`) on this
    /// node, in parts written atomically beside them; resumable. Run by the query job's script;
    /// never opens run.db.
    #[command(hide = true)]
    QueryJob(QueryJobArgs),
    /// Recall@k of the collection against exact search over the run's parquet shards, per
    /// HNSW ef, filtered too; latency percentiles; a table, --json, and a PNG.
    Eval(EvalArgs),
    /// Write a dataset folder of the run's embeddings (and query results), ready to push to
    /// the Hugging Face Hub or to archive: parquet, a dataset card, SHA256SUMS, manifest.json.
    Publish(PublishArgs),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        command().debug_assert();
    }

    /// `plan` with no planning flag plans with the settings layer's defaults (a plan tells a
    /// given setting from a default by comparing with them).
    #[test]
    fn plan_flags_left_out_are_the_settings_defaults() {
        #[derive(clap::Parser)]
        struct Plan {
            #[command(flatten)]
            plan: PlanSettingsArgs,
        }
        let parsed = <Plan as clap::Parser>::parse_from(["embedfleet"]).plan;
        assert_eq!(
            embedfleet_pipeline::settings::plan::plan_settings(
                &crate::commands::flags::plan_settings_flags(&parsed)
            ),
            embedfleet_core::settings::PlanSettings::default()
        );
        let given = <Plan as clap::Parser>::parse_from(["embedfleet", "--batch-tokens", "8192"]);
        assert_ne!(
            embedfleet_pipeline::settings::plan::plan_settings(
                &crate::commands::flags::plan_settings_flags(&given.plan)
            ),
            embedfleet_core::settings::PlanSettings::default()
        );
    }
}
