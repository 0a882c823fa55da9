//! The stages after the upload: `query` (the query workload), `eval` (recall against exact
//! search) and `publish` (a dataset folder).

use super::help;
use super::upload::TargetArgs;
use clap::Args;
use embedfleet_pipeline::flags::defaults::{
    DEFAULT_EFS, DEFAULT_LICENSE, DEFAULT_PART_QUERIES, DEFAULT_PART_TERMS, DEFAULT_RECALL_FLOOR,
    DEFAULT_TARGET_SHARD_MB,
};
use std::path::PathBuf;

/// The model that embeds query terms.
#[derive(Debug, Args)]
pub struct QueryModelArgs {
    /// The model directory that embeds the terms (default: the one the run's shards were made
    /// with, as output-settings.json records it; else <run-dir>/tiny-model, which `run` writes
    /// when it is given none).
    #[arg(long, value_name = "DIR", help_heading = help::MODEL)]
    pub model_dir: Option<PathBuf>,
    /// Output dimension (Matryoshka), as the run's `--dim`.
    #[arg(long, value_name = "N", help_heading = help::MODEL)]
    pub dim: Option<usize>,
    /// Devices that embed the queries: `cpu`, `cpu:N`, `cuda:0,1`, `cuda` (default: cpu; with
    /// `query --submit` on slurm or pbs, cuda: every GPU of the job's node).
    #[arg(long, value_name = "DEVICES", help_heading = help::MODEL)]
    pub devices: Option<String>,
    /// The query instruction (default: the model's retrieval instruction, as `embed --query`).
    #[arg(long, value_name = "TEXT", help_heading = help::MODEL)]
    pub instruction: Option<String>,
    /// The CSV column or JSON-lines field that holds the terms (default: the first column;
    /// `term`).
    #[arg(long, value_name = "NAME")]
    pub field: Option<String>,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// Terms to search for, given here (`embedfleet query --run-dir R "protein folding"`);
    /// without `--output` their top hits are printed.
    #[arg(
        value_name = "TERM",
        required_unless_present = "terms",
        conflicts_with = "terms"
    )]
    pub term_args: Vec<String>,
    /// The terms: a text file (one term per line), a CSV file (a column) or JSON lines (a field).
    #[arg(long, value_name = "FILE")]
    pub terms: Option<PathBuf>,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The collection.
    #[arg(long, default_value = embedfleet_pipeline::DEFAULT_COLLECTION, value_name = "NAME", help_heading = help::QDRANT)]
    pub collection: String,
    /// Results per query.
    #[arg(long, default_value_t = 10, value_name = "K")]
    pub top_k: usize,
    /// Only papers matching this (repeatable; all must hold): `year>=2015`, `year<2020`,
    /// `year=2019`, `source=s2orc`.
    #[arg(long = "filter", value_name = "EXPR")]
    pub filters: Vec<String>,
    #[command(flatten)]
    pub model: QueryModelArgs,
    /// Queries per search request (default: what `tune --queries` saved, else 16).
    #[arg(long, value_name = "B", help_heading = help::SPEED)]
    pub batch_size: Option<usize>,
    /// Search requests in flight (default: what `tune --queries` saved, else 2).
    #[arg(long, value_name = "K", help_heading = help::SPEED)]
    pub in_flight: Option<usize>,
    /// The parquet file of results: term, query_id, rank, paper_id, score, year, source. It
    /// records the request it answers (terms, collection contents, settings, model): the same
    /// request again does nothing, another one is refused (default: print the top hits).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite an --output (or its unfinished parts) that another request made.
    #[arg(long, requires = "output")]
    pub replace: bool,
    /// Terms per part (the unit written at once, and redone after a kill).
    #[arg(long, default_value_t = DEFAULT_PART_QUERIES, value_name = "N", hide = true)]
    pub part_queries: usize,
    /// Embed the terms in a scheduler job (`embedfleet query-job`, on a GPU node) through
    /// the run's stored run config (the one its first `submit` stored), wait for it, collect
    /// its vectors and search here: run.db and the output are written only by this process,
    /// the run's owner. Run the same command again after a failed or killed job: the parts
    /// it finished are kept (README, "On a cluster, step by step").
    #[arg(long, requires_all = ["queue", "output"], help_heading = help::QUERY_JOB)]
    pub submit: bool,
    /// The queue (PBS) or partition (Slurm) of the query job.
    #[arg(long, value_name = "NAME", requires = "submit", help_heading = help::QUERY_JOB)]
    pub queue: Option<String>,
    /// Terms per part of the query job, each written as soon as it is embedded (a killed job
    /// loses at most one).
    #[arg(long, default_value_t = DEFAULT_PART_TERMS, value_name = "N", requires = "submit", help_heading = help::QUERY_JOB)]
    pub part_terms: usize,
    /// Seconds between polls of the query job (default: 30, or 1 for local).
    #[arg(long, value_name = "SECS", requires = "submit", help_heading = help::QUERY_JOB)]
    pub poll_interval: Option<f64>,
}

#[derive(Debug, Args)]
pub struct QueryJobArgs {
    /// The query job's work folder, `<run-dir>/queries/<key>` (written by `query --submit`).
    #[arg(long, value_name = "DIR")]
    pub work: PathBuf,
    /// Devices, one worker each: `cuda`, `cuda:0,1`, `cpu`, `cpu:N`.
    #[arg(long, default_value = "cuda", value_name = "DEVICES")]
    pub devices: String,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The collection.
    #[arg(long, default_value = embedfleet_pipeline::DEFAULT_COLLECTION, value_name = "NAME", help_heading = help::QDRANT)]
    pub collection: String,
    /// Query terms (a file as `query --terms` takes), embedded with the model.
    #[arg(long, value_name = "FILE", conflicts_with = "sample")]
    pub queries: Option<PathBuf>,
    /// N papers' own vectors, slightly perturbed (seeded), as queries: no model, no terms
    /// (the default, with 100).
    #[arg(long, value_name = "N")]
    pub sample: Option<usize>,
    /// Seed of --sample.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also evaluate under this filter (repeatable; all must hold), e.g. `year=2019`; the
    /// exact search applies the same filter.
    #[arg(long = "filter", value_name = "EXPR")]
    pub filters: Vec<String>,
    /// The HNSW beam widths to evaluate.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_EFS, value_name = "EF,...")]
    pub ef: Vec<u64>,
    /// Results per query (recall@k).
    #[arg(long, default_value_t = 10, value_name = "K")]
    pub top_k: usize,
    /// Queries per search request (1: each latency is one query's).
    #[arg(long, default_value_t = 1, value_name = "B", help_heading = help::SPEED)]
    pub batch_size: usize,
    /// Search requests in flight.
    #[arg(long, default_value_t = 1, value_name = "K", help_heading = help::SPEED)]
    pub in_flight: usize,
    /// Print the stable JSON form instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Side by side with a pgvector table of the same run in this PostgreSQL database
    /// (postgresql://user@host/db, password as for --postgres): for each database the least
    /// search effort reaching --recall-floor, unfiltered and under three filters picked from
    /// the run (one year, one source, a wide range), with pgvector's defaults beside them.
    /// Written to <run-dir>/eval/compare.json and compare.md; the HTML report shows it.
    #[arg(long, value_name = "URL", help_heading = help::COMPARE)]
    pub compare_postgres: Option<String>,
    /// The table --compare-postgres evaluates (default: --collection).
    #[arg(long, value_name = "NAME", requires = "compare_postgres", help_heading = help::COMPARE)]
    pub compare_table: Option<String>,
    /// The recall@k each database must reach in the comparison.
    #[arg(long, default_value_t = DEFAULT_RECALL_FLOOR, value_name = "R", requires = "compare_postgres", help_heading = help::COMPARE)]
    pub recall_floor: f64,
    /// Where the recall-against-latency PNG goes (default: <run-dir>/eval/recall.png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub model: QueryModelArgs,
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// The dataset folder to write (built beside it, renamed into place when complete).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Size of each embedding parquet file, in MB (fractions too: 0.5).
    #[arg(long, default_value_t = DEFAULT_TARGET_SHARD_MB as f64, value_name = "MB")]
    pub target_shard_mb: f64,
    /// Publish a run with missing or failed batches; the card says what is missing.
    #[arg(long)]
    pub allow_partial: bool,
    /// Include each paper's text (from the batch files).
    #[arg(long)]
    pub with_text: bool,
    /// The licence of the dataset card (peS2o's is ODC-By).
    #[arg(long, default_value = DEFAULT_LICENSE, value_name = "ID")]
    pub license: String,
    /// Query results to include (default: the outputs of the run's `query` commands).
    #[arg(long = "query-results", value_name = "FILE")]
    pub query_results: Vec<PathBuf>,
}
