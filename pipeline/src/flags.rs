//! Each command's flags as given, as plain data: what `src/cli` parsed, before anything is
//! resolved. The binary maps clap's types onto these one to one; `src/cli` documents each flag.

pub use crate::job_command::JobSettings;
pub use crate::target::TargetFlags;
pub use embedfleet_core::shardfile::VectorDtype;
pub use embedfleet_core::Precision;
pub use embedfleet_models::{DType, TextRule};
pub use embedfleet_vectordb::{IterativeScan, PgIndex};
use std::path::PathBuf;

/// `upload --mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadMode {
    Upsert,
    Snapshot,
}

/// `plan --batching`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    Tokens,
    Chars,
}

/// `EmbedJobArgs` as given.
#[derive(Debug, Clone)]
pub struct EmbedJobFlags {
    pub run: RunDirFlags,
    pub batch: i64,
    pub settings: JobSettings,
}

/// `EmbedArgs` as given.
#[derive(Debug, Clone)]
pub struct EmbedFlags {
    pub model: ModelFlags,
    pub input: Vec<PathBuf>,
    pub output: PathBuf,
    pub devices: String,
    pub lines: bool,
    pub query: bool,
    pub instruction: Option<String>,
    pub batch_tokens: u64,
}

/// `BenchGpuArgs` as given.
#[derive(Debug, Clone)]
pub struct BenchGpuFlags {
    pub model_dir: PathBuf,
    pub devices: String,
    pub shapes: Vec<String>,
    pub forwards: usize,
    pub mix: Option<PathBuf>,
    pub mix_papers: usize,
    pub batch_tokens: u64,
    pub no_memory_plan: bool,
    pub fidelity: Option<PathBuf>,
    pub save_vectors: Option<PathBuf>,
    pub compare_vectors: Option<PathBuf>,
    pub skip_uniform: bool,
    pub skip_mix: bool,
    pub skip_study: bool,
    pub seed: u64,
    pub dtype: Option<DType>,
    pub precision: Precision,
}

/// `DoctorArgs` as given.
#[derive(Debug, Clone)]
pub struct DoctorFlags {
    pub model_dir: Option<PathBuf>,
    pub devices: Option<String>,
    pub run_dir: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub tokens: usize,
    pub attention: bool,
    pub precision: Option<Precision>,
}

/// `MakeTinyModelArgs` as given.
#[derive(Debug, Clone)]
pub struct MakeTinyModelFlags {
    pub out: PathBuf,
    pub seed: u64,
    pub hidden_size: Option<u64>,
    pub family: Option<String>,
}

/// `ModelArgs` as given.
#[derive(Debug, Clone)]
pub struct ModelFlags {
    pub model_dir: PathBuf,
    pub dim: Option<usize>,
    pub vector_dtype: VectorDtype,
    pub precision: Precision,
    pub max_tokens: Option<usize>,
    /// `None`: not given (`embed`: today's rule; `embed-job`: the run's from before the rule
    /// was recorded).
    pub text_rule: Option<TextRule>,
}

/// `RunDirArgs` as given.
#[derive(Debug, Clone)]
pub struct RunDirFlags {
    pub run_dir: PathBuf,
}

/// `CorpusArgs` as given.
#[derive(Debug, Clone)]
pub struct CorpusFlags {
    pub corpus: Vec<PathBuf>,
    pub run_dir: PathBuf,
}

/// `PlanArgs` as given.
#[derive(Debug, Clone)]
pub struct PlanFlags {
    pub corpus: Vec<PathBuf>,
    pub update: Vec<PathBuf>,
    pub only_adds: bool,
    pub run_dir: PathBuf,
    pub plan: PlanSettingsFlags,
}

/// `PlanSettingsArgs` as given.
#[derive(Debug, Clone)]
pub struct PlanSettingsFlags {
    pub papers_per_job: u64,
    pub max_job_chars: Option<u64>,
    pub sources: Vec<String>,
    pub keep_fields: Vec<String>,
    pub batching: Batching,
    pub batch_tokens: u64,
    pub batch_chars: u64,
    pub batch_max: u32,
    pub threads: Option<usize>,
}

/// `RunArgs` as given.
#[derive(Debug, Clone)]
pub struct RunFlags {
    pub corpus: CorpusFlags,
    pub model_dir: Option<PathBuf>,
    pub local_jobs: usize,
    pub devices: String,
    pub dim: Option<usize>,
    pub shard_papers: usize,
    pub query: String,
    pub plan: PlanSettingsFlags,
}

/// `SampleCorpusArgs` as given.
#[derive(Debug, Clone)]
pub struct SampleCorpusFlags {
    pub papers: u64,
    pub out: PathBuf,
    pub seed: u64,
    pub mean_chars: u64,
    pub files: u32,
}

/// `QueryArgs` as given.
#[derive(Debug, Clone)]
pub struct QueryFlags {
    pub run_dir: PathBuf,
    pub term_args: Vec<String>,
    pub terms: Option<PathBuf>,
    pub target: TargetFlags,
    pub collection: String,
    pub top_k: usize,
    pub filters: Vec<String>,
    pub model: QueryModelFlags,
    pub batch_size: Option<usize>,
    pub in_flight: Option<usize>,
    pub output: Option<PathBuf>,
    pub replace: bool,
    pub part_queries: usize,
    pub submit: bool,
    pub queue: Option<String>,
    pub part_terms: usize,
    pub poll_interval: Option<f64>,
}

/// The query model's flags as typed.
#[derive(Debug, Clone, Default)]
pub struct QueryModelFlags {
    pub model_dir: Option<PathBuf>,
    pub dim: Option<usize>,
    pub devices: Option<String>,
    pub instruction: Option<String>,
    /// `--field`: the precomputed vectors' column to search with, instead of a model.
    pub field: Option<String>,
}

/// `QueryJobArgs` as given.
#[derive(Debug, Clone)]
pub struct QueryJobFlags {
    pub work: PathBuf,
    pub devices: String,
}

/// `EvalArgs` as given.
#[derive(Debug, Clone)]
pub struct EvalFlags {
    pub run_dir: PathBuf,
    pub target: TargetFlags,
    pub collection: String,
    pub queries: Option<PathBuf>,
    pub sample: Option<usize>,
    pub seed: u64,
    pub filters: Vec<String>,
    pub ef: Vec<u64>,
    pub top_k: usize,
    pub batch_size: usize,
    pub in_flight: usize,
    pub json: bool,
    pub compare_postgres: Option<String>,
    pub compare_table: Option<String>,
    pub recall_floor: f64,
    pub plot: Option<PathBuf>,
    pub model: QueryModelFlags,
}

/// `PublishArgs` as given.
#[derive(Debug, Clone)]
pub struct PublishFlags {
    pub run_dir: PathBuf,
    pub out: PathBuf,
    pub target_shard_mb: f64,
    pub allow_partial: bool,
    pub with_text: bool,
    pub license: String,
    pub query_results: Vec<PathBuf>,
}

/// `ReportArgs` as given.
#[derive(Debug, Clone)]
pub struct ReportFlags {
    pub run_dir: PathBuf,
    pub plots: Option<PathBuf>,
    pub json: bool,
    pub html: Option<PathBuf>,
    pub trace: Option<PathBuf>,
}

/// `TakeOverArgs` as given.
#[derive(Debug, Clone)]
pub struct TakeOverFlags {
    pub run_dir: PathBuf,
    pub stale_after: f64,
}

/// `StatusArgs` as given.
#[derive(Debug, Clone)]
pub struct StatusFlags {
    pub run_dir: PathBuf,
    pub json: bool,
}

/// `CollectionArgs` as given.
#[derive(Debug, Clone)]
pub struct CollectionFlags {
    pub hnsw_m: u64,
    pub hnsw_ef_construct: u64,
    pub on_disk_vectors: bool,
    pub int8: bool,
}

/// `UploadArgs` as given.
#[derive(Debug, Clone)]
pub struct UploadFlags {
    pub run_dir: PathBuf,
    pub target: TargetFlags,
    pub collection: String,
    pub batch_size: Option<usize>,
    pub in_flight: Option<usize>,
    pub workers: Option<u64>,
    pub checkpoint_every: usize,
    pub collection_settings: CollectionFlags,
    pub mode: UploadMode,
    pub qdrant_rest: Option<String>,
    pub recoveries: usize,
    pub no_build: bool,
    pub group_count: Option<i64>,
    pub replace_keys: bool,
    pub shard_number: Option<u32>,
    pub replication_factor: Option<u32>,
    pub no_bulk_load: bool,
    pub worker: Option<String>,
}

/// `BuildShardArgs` as given.
#[derive(Debug, Clone)]
pub struct BuildShardFlags {
    pub run_dir: PathBuf,
    pub batches: Vec<i64>,
    pub groups: Vec<i64>,
    pub group_count: Option<i64>,
    pub attempt: Option<String>,
    pub accepted: bool,
    pub request: Option<PathBuf>,
    pub collection_settings: CollectionFlags,
}

/// `DeleteArgs` as given.
#[derive(Debug, Clone)]
pub struct DeleteFlags {
    pub run_dir: PathBuf,
    pub target: TargetFlags,
    pub collection: String,
    pub papers: Vec<String>,
}

/// `TuneArgs` as given.
#[derive(Debug, Clone)]
pub struct TuneFlags {
    pub run_dir: PathBuf,
    pub target: TargetFlags,
    pub sample: usize,
    pub scratch: String,
    pub max_batch: usize,
    pub out: Option<PathBuf>,
    pub queries: bool,
    pub collection: String,
}

/// `queues` as given: `queues [--run-dir DIR]` and `queues show` show the caps.
#[derive(Debug, Clone)]
pub enum QueuesFlags {
    Show {
        run_dir: Option<PathBuf>,
    },
    Set {
        run_dir: PathBuf,
        caps: Vec<(String, u32)>,
    },
    Remove {
        run_dir: PathBuf,
        names: Vec<String>,
    },
}

/// The defaults and names the command line's help shows, which the stages own.
pub mod defaults {
    pub use embedfleet_embed::job::DEFAULT_SHARD_PAPERS;
    pub use embedfleet_orchestrator::report::listen::parse_listen;
    pub use embedfleet_orchestrator::scheduler::Backend;
    pub use embedfleet_publish::{DEFAULT_LICENSE, DEFAULT_TARGET_SHARD_MB};
    pub use embedfleet_query::compare::DEFAULT_FLOOR as DEFAULT_RECALL_FLOOR;
    pub use embedfleet_query::vectors::DEFAULT_PART_TERMS;
    pub use embedfleet_query::workload::DEFAULT_PART_QUERIES;
    pub use embedfleet_query::DEFAULT_EFS;
    pub use embedfleet_vectordb::DEFAULT_CHECKPOINT_EVERY;
}

/// Help texts made from what this build implements.
pub mod help {
    /// The model families this build implements, each with a checkpoint of it.
    pub fn families() -> String {
        embedfleet_models::families_help()
    }

    /// The help of `embed --query`: each family's query format, with placeholders, families that
    /// write queries alike named together.
    pub fn query_formats() -> String {
        let mut formats: Vec<(String, Vec<&str>)> = Vec::new();
        for f in embedfleet_models::registry::FAMILIES {
            let example = f.query_example().replace('\n', "\\n");
            match formats.iter_mut().find(|(e, _)| *e == example) {
                Some((_, names)) => names.push(f.model_type()),
                None => formats.push((example, vec![f.model_type()])),
            }
        }
        let formats: Vec<String> = formats
            .into_iter()
            .map(|(example, names)| format!("{}: `{example}`", names.join(", ")))
            .collect();
        format!(
            "Embed as queries, in the model family's query format ({})",
            formats.join("; ")
        )
    }
}
