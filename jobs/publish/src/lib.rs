//! The publish stage: a run's embeddings as a folder ready to push as a Hugging Face dataset
//! repository or to archive —
//!
//! ```text
//! <out>/data/train-00000-of-0000N.parquet   the parquet shards' rows, re-chunked to a target size
//! <out>/queries/*.parquet                   query results, when the run has them
//! <out>/README.md                           the dataset card (YAML header the Hub reads)
//! <out>/manifest.json                       files, counts, model facts, what is missing
//! <out>/SHA256SUMS                          `sha256sum -c SHA256SUMS` verifies the folder
//! ```
//!
//! Atomic and resumable: the folder is built in `<out>.partial/` and renamed to `<out>` only
//! when complete, so a folder that looks complete always is. How rows are split into data files
//! depends only on the parquet shards' row counts, the vector size and the target, so a killed
//! publish run again keeps the data files it finished (checked against their footers).

mod card;
mod data;

use embedfleet_core::rundb::{RunDb, RunDbError};
use serde::Serialize;
use std::path::{Path, PathBuf};

pub use data::DataFile;

/// Size of each data file when not told otherwise, in MB.
pub const DEFAULT_TARGET_SHARD_MB: u64 = 500;
/// peS2o's licence.
pub const DEFAULT_LICENSE: &str = "odc-by";

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
    /// The report's timing table, as text.
    pub report_table: Option<String>,
    /// The last eval's recall table, as markdown.
    pub eval_summary: Option<String>,
    /// The query instruction, for the card.
    pub instruction: Option<String>,
    /// Query results to copy into `queries/`.
    pub query_results: Vec<PathBuf>,
    /// The command lines that made the run.
    pub commands: Vec<String>,
    pub progress: bool,
    /// Test hook: fail after writing this many data files, as a kill would stop the run.
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
    pub rows: u64,
    /// Bytes of the whole folder.
    pub bytes: u64,
    /// Data files kept from a killed earlier run.
    pub reused: usize,
    pub partial: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parquet { path: PathBuf, message: String },
    #[error("the run is not complete: {} — finish it (`embedfleet submit` or `embedfleet run` again), or use --allow-partial to publish what is there", missing.join(", "))]
    Partial { missing: Vec<String> },
    #[error("{0} exists and is not a published folder (no manifest.json): choose another --out or remove it")]
    OutExists(PathBuf),
    #[error("the run has no parquet shards: embed it first")]
    NoShards,
    #[error("stopped after the data files asked for (a test hook)")]
    Stopped,
}

impl PublishError {
    /// Refusals (exit code 4): the run or the folder refused the command.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            PublishError::Partial { .. } | PublishError::OutExists(_)
        )
    }
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> PublishError + '_ {
    move |source| PublishError::Io {
        path: path.into(),
        source,
    }
}

/// A batch that is not done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MissingBatch {
    pub id: i64,
    pub state: String,
    pub papers: u64,
}

/// Builds the folder (see the crate docs).
pub fn publish(options: &PublishOptions) -> Result<PublishReport, PublishError> {
    let db = RunDb::open(&options.run_dir)?;
    let missing = missing_batches(&db)?;
    if !missing.is_empty() && !options.allow_partial {
        let missing = missing
            .iter()
            .map(|b| format!("batch {} is {}", b.id, b.state))
            .collect();
        return Err(PublishError::Partial { missing });
    }
    if options.out.exists() && !options.out.join("manifest.json").is_file() {
        return Err(PublishError::OutExists(options.out.clone()));
    }
    let staging = staging_dir(&options.out);
    let written = data::write_data(&db, options, &staging)?;
    let queries = data::copy_queries(&options.query_results, &staging)?;
    let facts = card::Facts::gather(&db, &written, &queries, &missing)?;
    let card = card::render(&facts, options);
    write_small(&staging.join("README.md"), card.as_bytes())?;
    let manifest = card::manifest(&facts, options);
    write_small(&staging.join("manifest.json"), manifest.as_bytes())?;
    let bytes = write_sums(&staging)?;
    replace(&staging, &options.out)?;
    Ok(PublishReport {
        out: options.out.clone(),
        files: written.files.len(),
        rows: written.files.iter().map(|f| f.rows).sum(),
        bytes,
        reused: written.reused,
        partial: !missing.is_empty(),
    })
}

/// `<out>.partial`, beside `out`.
pub fn staging_dir(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    out.with_file_name(name)
}

fn missing_batches(db: &RunDb) -> Result<Vec<MissingBatch>, PublishError> {
    let mut stmt = db
        .conn()
        .prepare(
            "SELECT id, state, n_rows - n_excluded FROM batches WHERE state != 'done' ORDER BY id",
        )
        .map_err(|e| db.err(e))?;
    let rows = stmt
        .query_map([], |r| {
            Ok(MissingBatch {
                id: r.get(0)?,
                state: r.get(1)?,
                papers: r.get(2)?,
            })
        })
        .and_then(|r| r.collect::<rusqlite::Result<Vec<_>>>());
    rows.map_err(|e| db.err(e).into())
}

fn write_small(path: &Path, bytes: &[u8]) -> Result<(), PublishError> {
    embedfleet_core::atomic::write(path, bytes).map_err(io(path))
}

/// Writes `SHA256SUMS` over every file of the folder (sorted, relative paths, `sha256sum`'s
/// format); returns the folder's size.
fn write_sums(dir: &Path) -> Result<u64, PublishError> {
    let mut files = Vec::new();
    list_files(dir, dir, &mut files)?;
    files.sort();
    let (mut sums, mut bytes) = (String::new(), 0u64);
    for rel in files.iter().filter(|f| f.as_str() != "SHA256SUMS") {
        let path = dir.join(rel);
        let sha = embedfleet_core::shardfile::sha256_of(&path).map_err(io(&path))?;
        bytes += std::fs::metadata(&path).map_err(io(&path))?.len();
        sums.push_str(&format!("{sha}  {rel}\n"));
    }
    write_small(&dir.join("SHA256SUMS"), sums.as_bytes())?;
    Ok(bytes + sums.len() as u64)
}

fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), PublishError> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        if path.is_dir() {
            list_files(root, &path, out)?;
        } else if !path
            .to_string_lossy()
            .ends_with(embedfleet_core::atomic::TMP_SUFFIX)
        {
            let rel = path
                .strip_prefix(root)
                .expect("under the root. This is a bug.");
            out.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// Puts the finished staging folder in place of `out` (an earlier publish of it goes).
fn replace(staging: &Path, out: &Path) -> Result<(), PublishError> {
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(io(out))?;
    }
    std::fs::rename(staging, out).map_err(io(out))
}
