//! Reading the run's parquet shards for upload: the vector size from the footer, and record
//! batches of the upload's batch size from a given row on (a resumed shard skips what is acked).

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_schema::DataType;
use embedfleet_core::shardfile::VectorDtype;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

/// The columns a point is built from; a shard's other columns are not read.
const COLUMNS: [&str; 6] = [
    "id",
    "embedding",
    "n_chars",
    "n_tokens",
    "source",
    "created",
];

/// A shard that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("failed to read shard {}: {message}; re-run the embed job of its batch (`embedfleet run` again) or remove it from run.db", path.display())]
pub struct ShardReadError {
    /// The shard file.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

fn read_err(path: &Path) -> impl Fn(String) -> ShardReadError + '_ {
    move |message| ShardReadError {
        path: path.to_owned(),
        message,
    }
}

fn builder(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>, ShardReadError> {
    let file = File::open(path).map_err(|e| read_err(path)(e.to_string()))?;
    ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| read_err(path)(e.to_string()))
}

/// The vector size of a shard (the `embedding` column's list size), read from its footer.
pub fn shard_dim(path: &Path) -> Result<usize, ShardReadError> {
    shard_shape(path).map(|(dim, _)| dim)
}

/// The vector size and element type of a shard, read from its footer.
pub fn shard_shape(path: &Path) -> Result<(usize, VectorDtype), ShardReadError> {
    let b = builder(path)?;
    let field = b
        .schema()
        .field_with_name("embedding")
        .map_err(|_| read_err(path)("no `embedding` column".into()))?;
    match field.data_type() {
        DataType::FixedSizeList(item, n) if *n > 0 => {
            let dtype = match item.data_type() {
                DataType::Float16 => VectorDtype::F16,
                _ => VectorDtype::F32,
            };
            Ok((*n as usize, dtype))
        }
        other => Err(read_err(path)(format!(
            "`embedding` has type {other}, expected fixed_size_list<float32 | float16>"
        ))),
    }
}

/// Record batches of `batch_size` rows of `path`, from row `start` on, with only the columns
/// that go into a point.
pub fn read_from(
    path: &Path,
    start: u64,
    batch_size: usize,
) -> Result<ParquetRecordBatchReader, ShardReadError> {
    let b = builder(path)?;
    let roots: Vec<usize> = b
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| COLUMNS.contains(&f.name().as_str()))
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(b.parquet_schema(), roots);
    b.with_projection(mask)
        .with_batch_size(batch_size.max(1))
        .with_offset(usize::try_from(start).unwrap_or(usize::MAX))
        .build()
        .map_err(|e| read_err(path)(e.to_string()))
}

/// The first `limit` rows of `path` as record batches of `batch_size` (for `tune`'s sample).
pub fn read_all(
    path: &Path,
    batch_size: usize,
    limit: usize,
) -> Result<Vec<RecordBatch>, ShardReadError> {
    let reader = builder(path)?
        .with_batch_size(batch_size.max(1))
        .with_limit(limit)
        .build()
        .map_err(|e| read_err(path)(e.to_string()))?;
    reader
        .map(|b| b.map_err(|e| read_err(path)(e.to_string())))
        .collect()
}

/// The paper ids (`id` column) of the first `limit` rows of `path`, reading no other column: the
/// upload's per-batch check counts exactly the rows it acknowledged. (The column is read by
/// core's [`embedfleet_core::shardfile::paper_ids`], the owner's check of a shard's papers.)
pub fn paper_ids(path: &Path, limit: u64) -> Result<Vec<String>, ShardReadError> {
    let mut ids =
        embedfleet_core::shardfile::paper_ids(path).map_err(|e| read_err(path)(e.to_string()))?;
    ids.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(ids)
}
