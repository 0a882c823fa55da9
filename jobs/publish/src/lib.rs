//! The publish stage: a run's embeddings as a folder ready to push as a Hugging Face dataset
//! repository or to archive —
//!
//! ```text
//! <out>/data/train-00000-of-0000N.parquet   the parquet shards' rows, re-chunked to a target size
//! <out>/queries/*.parquet                   query results, when given
//! <out>/README.md                           the dataset card (YAML header the Hub reads)
//! <out>/manifest.json                       files, counts, model facts, what is missing
//! <out>/SHA256SUMS                          `sha256sum -c SHA256SUMS` verifies the folder
//! ```
//!
//! Atomic and resumable: the folder is built in `<out>.partial/` and renamed to `<out>` only
//! when complete, so a folder that looks complete always is. How rows are split into data files
//! depends only on the parquet shards (order, rows, checksums), the vector size, `with_text`
//! and the target, so a killed publish run again keeps the data files it finished — each
//! checked against its footer (rows, and a recipe naming the shard slices it was made of).
//!
//! Publishing over an `out` that an earlier publish of the same run made rebuilds the folder
//! in `<out>.partial/` and then replaces `out` (the data files are written again: the shards
//! may have changed since); over any other existing folder is refused.

mod card;
mod data;
mod error;
mod facts;
mod folder;
mod manifest;
mod plan;
mod run;

use embedfleet_core::rundb::RunDb;
use std::path::PathBuf;

pub use card::load_hint;
pub use error::{MissingBatch, PublishError};
pub use facts::FileEntry;
pub use folder::staging_dir;
pub use manifest::MANIFEST_FORMAT_VERSION;

/// Size of each data file when not told otherwise, in MB.
pub const DEFAULT_TARGET_SHARD_MB: u64 = 500;
/// peS2o's licence.
pub const DEFAULT_LICENSE: &str = "odc-by";

/// How the run's model family writes a query (the binary asks the family: publishing links no
/// model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryFormat {
    /// The family's name (`Qwen3`).
    pub family: String,
    /// A query with placeholders, as the family writes it
    /// (`Instruct: <query instruction>\nQuery:<query>`).
    pub example: String,
}

/// What to publish.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub run_dir: PathBuf,
    pub out: PathBuf,
    /// Bytes of vectors (and text) per data file, roughly.
    pub target_shard_bytes: u64,
    /// Publish although batches are missing or failed; the card says which.
    pub allow_partial: bool,
    /// Add each paper's text, from the batch files.
    pub with_text: bool,
    /// The card's licence (a Hub licence id).
    pub license: String,
    /// The report's timing table, as preformatted text.
    pub report_table: Option<String>,
    /// The last eval's recall table, as markdown.
    pub eval_summary: Option<String>,
    /// The query instruction, for the card.
    pub instruction: Option<String>,
    /// How the run's model family writes a query, for the card; `None` names no format.
    pub query_format: Option<QueryFormat>,
    /// Query results to copy into `queries/`, as they are.
    pub query_results: Vec<PathBuf>,
    /// The command lines that made the run.
    pub commands: Vec<String>,
    /// A line on stderr per data file written.
    pub progress: bool,
    /// Test hook: fail with [`PublishError::Stopped`] before writing more than this many data
    /// files, as a kill would stop the run.
    #[doc(hidden)]
    pub stop_after_files: Option<usize>,
}

impl PublishOptions {
    /// 500 MB data files, ODC-By, no text, complete runs only.
    pub fn new(run_dir: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        Self {
            run_dir: run_dir.into(),
            out: out.into(),
            target_shard_bytes: DEFAULT_TARGET_SHARD_MB * 1_000_000,
            allow_partial: false,
            with_text: false,
            license: DEFAULT_LICENSE.into(),
            report_table: None,
            eval_summary: None,
            instruction: None,
            query_format: None,
            query_results: Vec::new(),
            commands: Vec::new(),
            progress: false,
            stop_after_files: None,
        }
    }
}

/// What a publish came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReport {
    pub out: PathBuf,
    /// Data files.
    pub files: usize,
    /// Rows in the data files.
    pub rows: u64,
    /// Bytes of the whole folder.
    pub bytes: u64,
    /// Data files kept from a killed earlier run.
    pub reused: usize,
    /// Batches are missing (published with `allow_partial`).
    pub partial: bool,
}

/// Builds the folder (see the crate docs) from the run whose run.db `db` is, open already.
pub fn publish(db: &RunDb, options: &PublishOptions) -> Result<PublishReport, PublishError> {
    let missing = run::missing_batches(db)?;
    if !missing.is_empty() && !options.allow_partial {
        return Err(PublishError::Partial { missing });
    }
    let source = run::Source::read(db)?;
    folder::check_out(&options.out, &source.plan_sha256)?;
    let plan = plan::split(&source, options.with_text, options.target_shard_bytes);
    let data_paths: Vec<String> = plan.files.iter().map(|f| f.path.clone()).collect();
    let query_paths = folder::query_names(&options.query_results)?;
    let staging = staging_dir(&options.out);
    folder::prepare(&staging, &data_paths, &query_paths)?;

    let reused = data::write_all(db, &source, &plan, &staging, options)?;
    let query_rows = folder::copy_queries(&options.query_results, &query_paths, &staging)?;
    let data_rows: Vec<u64> = plan.files.iter().map(|f| f.rows).collect();
    let data = facts::entries(&staging, &data_paths, &data_rows)?;
    let queries = facts::entries(&staging, &query_paths, &query_rows)?;
    let facts = facts::Facts {
        source: &source,
        data: &data,
        queries: &queries,
        missing: &missing,
        status: db.status()?,
    };
    write_small(&staging.join(folder::CARD), &card::render(&facts, options))?;
    write_small(
        &staging.join(folder::MANIFEST),
        &manifest::render(&facts, options),
    )?;
    let known: Vec<FileEntry> = data.iter().chain(&queries).cloned().collect();
    let bytes = folder::write_sums(&staging, &known)?;
    folder::replace(&staging, &options.out)?;
    Ok(PublishReport {
        out: options.out.clone(),
        files: data.len(),
        rows: facts.rows(),
        bytes,
        reused,
        partial: !missing.is_empty(),
    })
}

fn write_small(path: &std::path::Path, text: &str) -> Result<(), PublishError> {
    embedfleet_core::atomic::write(path, text.as_bytes()).map_err(error::io(path))
}
