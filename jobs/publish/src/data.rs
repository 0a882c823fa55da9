//! The data files: the parquet shards' rows in batch and part order, re-chunked into files of
//! about the target size, each keeping the shards' `embedfleet.*` metadata.

use crate::{io, PublishError, PublishOptions};
use arrow_array::builder::StringBuilder;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use embedfleet_core::rundb::{RunDb, ShardRow};
use embedfleet_core::{atomic, batchfile, BatchId};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use serde::Serialize;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One file of the folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DataFile {
    /// Relative to the folder.
    pub path: String,
    pub rows: u64,
}

/// The data files and what they hold.
#[derive(Debug, Clone, Default)]
pub struct Written {
    pub files: Vec<DataFile>,
    pub reused: usize,
    pub dim: usize,
    /// `float32` or `float16`.
    pub vector_type: String,
    /// The shards' `embedfleet.*` key-value metadata.
    pub meta: Vec<(String, String)>,
}

fn parquet_err(path: &Path) -> impl Fn(parquet::errors::ParquetError) -> PublishError + '_ {
    move |e| PublishError::Parquet {
        path: path.into(),
        message: e.to_string(),
    }
}

fn arrow_err(path: &Path) -> impl Fn(arrow_schema::ArrowError) -> PublishError + '_ {
    move |e| PublishError::Parquet {
        path: path.into(),
        message: e.to_string(),
    }
}

/// Writes (or keeps, from a killed run) every data file into `staging/data`.
pub fn write_data(
    db: &RunDb,
    options: &PublishOptions,
    staging: &Path,
) -> Result<Written, PublishError> {
    let shards = db.all_shards()?;
    let first = shards.first().ok_or(PublishError::NoShards)?;
    let first_path = db.dir().join(&first.path);
    let builder = reader(&first_path)?;
    let (schema, meta) = (builder.schema().clone(), embedfleet_meta(&builder));
    let (dim, item) = match schema.field_with_name("embedding").map(|f| f.data_type()) {
        Ok(DataType::FixedSizeList(item, n)) => (*n as usize, item.data_type().clone()),
        _ => {
            return Err(PublishError::Parquet {
                path: first_path,
                message: "no fixed-size `embedding` column".into(),
            })
        }
    };
    let item_bytes = if item == DataType::Float16 { 2 } else { 4 };
    let text_bytes = if options.with_text { 30_000 } else { 0 };
    let per_row = (dim * item_bytes + 64 + text_bytes) as u64;
    let rows_per_file = (options.target_shard_bytes / per_row).max(1);
    let total: u64 = shards.iter().map(|s| s.rows).sum();
    let n_files = total.div_ceil(rows_per_file).max(1) as usize;
    let out_schema = with_text(&schema, options.with_text);
    let data = staging.join("data");
    std::fs::create_dir_all(&data).map_err(io(&data))?;
    atomic::remove_leftovers(&data).map_err(io(&data))?;
    let mut written = Written {
        dim,
        vector_type: if item_bytes == 2 {
            "float16"
        } else {
            "float32"
        }
        .into(),
        meta,
        ..Written::default()
    };
    let mut texts = TextSource::default();
    for i in 0..n_files {
        let start = i as u64 * rows_per_file;
        let rows = rows_per_file.min(total - start.min(total));
        let rel = format!("data/train-{i:05}-of-{n_files:05}.parquet");
        let path = staging.join(&rel);
        if footer_rows(&path) == Some(rows) {
            written.reused += 1;
        } else {
            if options
                .stop_after_files
                .is_some_and(|n| i - written.reused >= n)
            {
                return Err(PublishError::Stopped);
            }
            let slices = slices(&shards, start, rows);
            write_file(
                db,
                &path,
                &out_schema,
                &written.meta,
                &slices,
                &mut texts,
                options,
            )?;
        }
        written.files.push(DataFile { path: rel, rows });
    }
    Ok(written)
}

fn reader(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>, PublishError> {
    let file = File::open(path).map_err(io(path))?;
    ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet_err(path))
}

fn embedfleet_meta(builder: &ParquetRecordBatchReaderBuilder<File>) -> Vec<(String, String)> {
    let kvs = builder.metadata().file_metadata().key_value_metadata();
    kvs.into_iter()
        .flatten()
        .filter(|kv| kv.key.starts_with("embedfleet."))
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect()
}

/// The row count in a data file's footer; `None` when it is absent or unreadable.
fn footer_rows(path: &Path) -> Option<u64> {
    let file = File::open(path).ok()?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).ok()?;
    u64::try_from(builder.metadata().file_metadata().num_rows()).ok()
}

fn with_text(schema: &SchemaRef, text: bool) -> SchemaRef {
    if !text {
        return schema.clone();
    }
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new("text", DataType::Utf8, true));
    Arc::new(Schema::new(fields))
}

/// (shard, first row, rows) pieces that make global rows `start..start + rows`.
fn slices(shards: &[ShardRow], start: u64, rows: u64) -> Vec<(ShardRow, u64, u64)> {
    let (mut out, mut offset) = (Vec::new(), 0u64);
    let end = start + rows;
    for s in shards {
        let (lo, hi) = (offset, offset + s.rows);
        if hi > start && lo < end {
            let from = start.max(lo) - lo;
            out.push((s.clone(), from, end.min(hi) - lo - from));
        }
        offset = hi;
    }
    out
}

fn write_file(
    db: &RunDb,
    path: &Path,
    schema: &SchemaRef,
    meta: &[(String, String)],
    slices: &[(ShardRow, u64, u64)],
    texts: &mut TextSource,
    options: &PublishOptions,
) -> Result<(), PublishError> {
    let kvs = meta
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    let props = WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
        .set_key_value_metadata(Some(kvs))
        .build();
    let tmp = atomic::tmp_path(path);
    let file = File::create(&tmp).map_err(io(&tmp))?;
    let mut writer =
        ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(parquet_err(path))?;
    for (shard, from, rows) in slices {
        let shard_path = db.dir().join(&shard.path);
        let reader = reader(&shard_path)?
            .with_offset(*from as usize)
            .with_limit(*rows as usize)
            .build()
            .map_err(parquet_err(&shard_path))?;
        for batch in reader {
            let mut batch = batch.map_err(arrow_err(&shard_path))?;
            if options.with_text {
                let column = texts.column(db, shard.batch_id, &batch)?;
                let mut columns = batch.columns().to_vec();
                columns.push(column);
                batch = RecordBatch::try_new(schema.clone(), columns).map_err(arrow_err(path))?;
            }
            writer.write(&batch).map_err(parquet_err(path))?;
        }
    }
    writer.close().map_err(parquet_err(path))?;
    atomic::commit(path).map_err(io(path))
}

/// Papers' texts by id, one batch file at a time (the parquet shards of a batch are in a row).
#[derive(Default)]
struct TextSource {
    batch: Option<BatchId>,
    texts: HashMap<String, String>,
}

impl TextSource {
    fn column(
        &mut self,
        db: &RunDb,
        batch: BatchId,
        rows: &RecordBatch,
    ) -> Result<ArrayRef, PublishError> {
        if self.batch != Some(batch) {
            let row = db.batch(batch)?.ok_or_else(|| PublishError::Parquet {
                path: db.dir().into(),
                message: format!("batch {batch} of a parquet shard is not in run.db"),
            })?;
            let path = db.dir().join(&row.path);
            let mut texts = HashMap::new();
            batchfile::read(&path, |r| {
                texts.insert(r.paper.id, r.paper.text);
            })
            .map_err(|e| PublishError::Parquet {
                path: path.clone(),
                message: e.to_string(),
            })?;
            self.texts = texts;
            self.batch = Some(batch);
        }
        let ids = rows
            .column_by_name("id")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| PublishError::Parquet {
                path: db.dir().into(),
                message: "a parquet shard has no utf8 `id` column".into(),
            })?;
        let mut out = StringBuilder::new();
        for i in 0..ids.len() {
            out.append_option(self.texts.get(ids.value(i)));
        }
        Ok(Arc::new(out.finish()))
    }
}

/// Copies the query results into `staging/queries` (atomically each).
pub fn copy_queries(results: &[PathBuf], staging: &Path) -> Result<Vec<DataFile>, PublishError> {
    let mut out = Vec::new();
    if results.is_empty() {
        return Ok(out);
    }
    let dir = staging.join("queries");
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    for (i, source) in results.iter().enumerate() {
        let name = source
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| format!("queries-{i}.parquet"));
        let rel = format!("queries/{name}");
        let path = staging.join(&rel);
        std::fs::copy(source, atomic::tmp_path(&path)).map_err(io(source))?;
        atomic::commit(&path).map_err(io(&path))?;
        let rows = footer_rows(&path).ok_or_else(|| PublishError::Parquet {
            path: source.clone(),
            message: "not a parquet file".into(),
        })?;
        out.push(DataFile { path: rel, rows });
    }
    Ok(out)
}
