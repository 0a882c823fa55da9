//! The upload stage: `upload` and `tune`.

use super::help;
use clap::Args;
use embedfleet_pipeline::flags::defaults::DEFAULT_CHECKPOINT_EVERY;
use std::path::PathBuf;

/// Where the points go: a Qdrant server, the embedded engine (the default), or PostgreSQL.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// A Qdrant server or cluster, its gRPC port: http://host:6334 (https for TLS).
    #[arg(long, value_name = "URL", conflicts_with_all = ["edge", "postgres"], help_heading = help::QDRANT)]
    pub qdrant: Option<String>,
    /// The embedded Qdrant engine's directory (default: <run-dir>/qdrant).
    #[arg(long, value_name = "DIR", help_heading = help::QDRANT)]
    pub edge: Option<PathBuf>,
    /// Read the server's API key from this environment variable (never printed).
    #[arg(long, value_name = "VAR", conflicts_with = "api_key_file", help_heading = help::QDRANT)]
    pub api_key_env: Option<String>,
    /// Read the server's API key from the first line of this file (never printed).
    #[arg(long, value_name = "PATH", help_heading = help::QDRANT)]
    pub api_key_file: Option<PathBuf>,
    /// Send the API key over plain http:// to another machine (it travels in clear text;
    /// without this such a target is refused: use https://).
    #[arg(long, help_heading = help::QDRANT)]
    pub allow_insecure: bool,
    /// A PostgreSQL database with pgvector 0.8+: postgresql://user@host:5432/db (`?sslmode=`
    /// and `sslrootcert=` as libpq takes them). The table is --collection. The password comes
    /// from PGPASSWORD or the pgpass file (PGPASSFILE, else ~/.pgpass; mode 0600), never the URL.
    #[arg(long, value_name = "URL", conflicts_with = "edge", help_heading = help::POSTGRES)]
    pub postgres: Option<String>,
    /// The index a table gets after its load: hnsw (--hnsw-m, --hnsw-ef-construct) or ivfflat
    /// (lists from the row count).
    #[arg(long, value_enum, default_value_t = PgIndexArg::Hnsw, value_name = "KIND", help_heading = help::POSTGRES)]
    pub pg_index: PgIndexArg,
    /// How a filtered search scans the index: relaxed (nearly ordered, re-sorted), strict, or
    /// off (pgvector's default: a selective filter gets fewer rows than asked).
    #[arg(long, value_enum, default_value_t = PgScanArg::Relaxed, value_name = "SCAN", help_heading = help::POSTGRES)]
    pub pg_iterative_scan: PgScanArg,
    /// Most maintenance_work_mem an index build asks for, in MB (default: half this
    /// machine's available memory when the server is on it, else 2048).
    #[arg(long, value_name = "MB", help_heading = help::POSTGRES)]
    pub pg_maintenance_mem: Option<u64>,
}

/// `--pg-index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PgIndexArg {
    Hnsw,
    Ivfflat,
}

/// `--pg-iterative-scan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PgScanArg {
    Relaxed,
    Strict,
    Off,
}

/// The collection's settings: a new collection gets them, a built shard is made with them.
#[derive(Debug, Clone, Args)]
pub struct CollectionArgs {
    /// HNSW edges per node, restored after the load.
    #[arg(long, default_value_t = 16, value_name = "M", help_heading = help::COLLECTION)]
    pub hnsw_m: u64,
    /// HNSW build candidates, restored after the load.
    #[arg(long, default_value_t = 100, value_name = "N", help_heading = help::COLLECTION)]
    pub hnsw_ef_construct: u64,
    /// Keep the vectors on disk (mmap) instead of RAM.
    #[arg(long, help_heading = help::COLLECTION)]
    pub on_disk_vectors: bool,
    /// Add int8 scalar quantization.
    #[arg(long, help_heading = help::COLLECTION)]
    pub int8: bool,
}

/// How the points reach a server (`--mode` says what each does).
// No doc comments on the variants: clap would list them in a long help of its own, laid out
// unlike every other command's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UploadMode {
    Upsert,
    Snapshot,
}

#[derive(Debug, Args)]
pub struct UploadArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The collection (created if absent; an existing one must have the run's vector size).
    #[arg(long, default_value = embedfleet_pipeline::DEFAULT_COLLECTION, value_name = "NAME", help_heading = help::QDRANT)]
    pub collection: String,
    /// Points per upsert batch (default: what `tune` saved, else 256; 2,048 into PostgreSQL).
    #[arg(long, value_name = "B", help_heading = help::SPEED)]
    pub batch_size: Option<usize>,
    /// Upsert batches in flight per worker (default: what `tune` saved, else 4).
    #[arg(long, value_name = "K", help_heading = help::SPEED)]
    pub in_flight: Option<usize>,
    /// Worker processes, each with its own client (server only; default: one per peer holding
    /// the collection's Qdrant shards, or one per core on a single server). The embedded
    /// engine is one process: its upload uses K threads.
    #[arg(long, value_name = "N", help_heading = help::SPEED)]
    pub workers: Option<u64>,
    /// Make the sent points durable and record them in run.db every N upsert batches.
    #[arg(long, default_value_t = DEFAULT_CHECKPOINT_EVERY, value_name = "N", help_heading = help::SPEED)]
    pub checkpoint_every: usize,
    #[command(flatten)]
    pub collection_settings: CollectionArgs,
    /// `upsert` sends the points (gRPC upserts) and the server builds the index; `snapshot`
    /// recovers built shards (`build-shard`), one per group of consecutive batches, each into
    /// its own shard key of a custom-sharded collection: the index arrives built (a server in
    /// cluster mode only).
    #[arg(long, value_enum, default_value_t = UploadMode::Upsert, help_heading = help::SNAPSHOT)]
    pub mode: UploadMode,
    /// The server's REST address, for `--mode snapshot` (default: --qdrant with its port minus
    /// one, as Qdrant's 6334 → 6333).
    #[arg(long, value_name = "URL", requires = "qdrant", help_heading = help::SNAPSHOT)]
    pub qdrant_rest: Option<String>,
    /// Snapshot recoveries at once, across the cluster's peers (`--mode snapshot`).
    #[arg(long, default_value_t = 4, value_name = "N", help_heading = help::SNAPSHOT)]
    pub recoveries: usize,
    /// Refuse groups no job built a shard for, instead of building them here
    /// (`--mode snapshot`).
    #[arg(long, help_heading = help::SNAPSHOT)]
    pub no_build: bool,
    /// The group count: split the run's batches into G groups of consecutive batches, a built
    /// shard and a shard key each (`--mode snapshot`; default: one per 100,000 of the run's
    /// papers, one under 200,000, at most two per peer of the cluster; the load says which).
    /// Fixed at the run's first grouped build or load (snapshots/keys.json). Every search
    /// visits every group: a few large groups search like an upserted collection.
    #[arg(long, alias = "groups", value_name = "G", value_parser = clap::value_parser!(i64).range(1..), help_heading = help::SNAPSHOT)]
    pub group_count: Option<i64>,
    /// Take over shard keys the collection records as another run's (`--mode snapshot`;
    /// their points are replaced). Without it such a key is refused.
    #[arg(long, help_heading = help::SNAPSHOT)]
    pub replace_keys: bool,
    /// Qdrant shards of a new collection (server).
    #[arg(long, value_name = "N", help_heading = help::COLLECTION)]
    pub shard_number: Option<u32>,
    /// Copies of each Qdrant shard of a new collection (server).
    #[arg(long, value_name = "N", help_heading = help::COLLECTION)]
    pub replication_factor: Option<u32>,
    /// Build the HNSW index while loading instead of once at the end.
    #[arg(long, help_heading = help::COLLECTION)]
    pub no_bulk_load: bool,
    /// Internal: this process is worker I of N of a multi-process upload.
    #[arg(long, value_name = "I/N", hide = true)]
    pub worker: Option<String>,
}

#[derive(Debug, Args)]
pub struct BuildShardArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: std::path::PathBuf,
    /// Build the shard of this batch's group (a run whose keys hold one batch each, or pinned
    /// none, builds the batch alone); repeat for several.
    #[arg(long = "batch", value_name = "ID", required_unless_present_any = ["groups", "request"])]
    pub batches: Vec<i64>,
    /// Build this group's shard (groups of consecutive batches, numbered from 1; needs
    /// --accepted); repeat for several.
    #[arg(long = "group", value_name = "N", requires = "accepted")]
    pub groups: Vec<i64>,
    /// Groups to split the run's batches into, when its keys are not pinned yet (as
    /// `upload --mode snapshot --group-count`).
    #[arg(long, value_name = "G", value_parser = clap::value_parser!(i64).range(1..))]
    pub group_count: Option<i64>,
    /// Build from this attempt's shards (its result manifest) instead of the batch's first
    /// finished attempt.
    #[arg(long, value_name = "TOKEN", conflicts_with = "accepted")]
    pub attempt: Option<String>,
    /// Build from the shards run.db accepted for the batch. This opens run.db: only on the
    /// login node, as the run's owner (a job never opens it; see docs/cluster.md, "On a
    /// shared filesystem").
    #[arg(long)]
    pub accepted: bool,
    /// Build what this request says (a group build job of `submit --group-builds`: the run's
    /// owner wrote its sources and tombstones; the job does not open run.db).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["batches", "groups", "accepted", "attempt"])]
    pub request: Option<PathBuf>,
    #[command(flatten)]
    pub collection_settings: CollectionArgs,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The run directory (it knows each paper's batch, hence its group's shard key).
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The collection.
    #[arg(long, default_value = embedfleet_pipeline::DEFAULT_COLLECTION, value_name = "NAME", help_heading = help::QDRANT)]
    pub collection: String,
    /// Paper ids (the corpus's `id`) to delete.
    #[arg(value_name = "PAPER_ID", required = true)]
    pub papers: Vec<String>,
}

#[derive(Debug, Args)]
pub struct TuneArgs {
    /// The run directory (its parquet shards are the sample; the result is saved in its run.db).
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// Points in the sample (capped at what the parquet shards have).
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub sample: usize,
    /// The scratch collection, dropped afterwards.
    #[arg(long, default_value = "embedfleet-tune-scratch", value_name = "NAME")]
    pub scratch: String,
    /// Largest upsert batch tried (powers of two from 1).
    #[arg(long, default_value_t = 512, value_name = "B")]
    pub max_batch: usize,
    /// Where the table and the plot go (default: <run-dir>/tune).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Tune the query workload (queries per search request, requests in flight) against
    /// --collection instead of the upload.
    #[arg(long)]
    pub queries: bool,
    /// The collection searched by --queries.
    #[arg(long, default_value = embedfleet_pipeline::DEFAULT_COLLECTION, value_name = "NAME", help_heading = help::QDRANT)]
    pub collection: String,
}
