//! Writing the data files the plan lays out: the shards' rows (plus each paper's text with
//! `--with-text`) with the shards' `embedfleet.*` metadata, each through `<name>.tmp` and a
//! rename — and keeping a file a killed run finished when its footer says it is the same file.

use crate::error::{io, pq_err, PublishError};
use crate::plan::{FilePlan, Plan};
use crate::run::Source;
use crate::PublishOptions;
use arrow_array::builder::StringBuilder;
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use embedfleet_core::rundb::{PaperMetadata, RunDb};
use embedfleet_core::{atomic, batchfile, BatchId};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The metadata key holding a data file's recipe ([`FilePlan::recipe_sha256`]).
pub const RECIPE_KEY: &str = "embedfleet.publish_recipe_sha256";

/// Writes every planned data file that is not already in `staging`; returns how many were
/// kept from an earlier, killed run.
pub fn write_all(
    db: &RunDb,
    source: &Source,
    plan: &Plan,
    staging: &Path,
    options: &PublishOptions,
) -> Result<usize, PublishError> {
    let schema = output_schema(&source.schema, options.with_text);
    let mut texts = TextSource::default();
    let mut stamps = Restamps::default();
    let (mut reused, mut written) = (0, 0);
    for (i, file) in plan.files.iter().enumerate() {
        let path = staging.join(&file.path);
        if is_finished(&path, file) {
            reused += 1;
            continue;
        }
        if options.stop_after_files.is_some_and(|n| written >= n) {
            return Err(PublishError::Stopped);
        }
        let props = properties(source, file, plan.rows_per_group);
        let mut out = Output::create(&path, &schema, props)?;
        for slice in &file.slices {
            let shard_path = db.dir().join(&slice.shard.path);
            let file = File::open(&shard_path).map_err(io(&shard_path))?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .and_then(|b| {
                    b.with_offset(slice.from as usize)
                        .with_limit(slice.rows as usize)
                        .build()
                })
                .map_err(pq_err(&shard_path))?;
            let mut at = slice.from;
            for batch in reader {
                let batch = batch.map_err(pq_err(&shard_path))?;
                let first = at;
                at += batch.num_rows() as u64;
                for (first, batch) in kept(&batch, first, &slice.deleted) {
                    let batch = if slice.restamped.is_empty() {
                        batch
                    } else {
                        let new = stamps.of(db, slice.shard.batch_id)?;
                        restamp(&batch, first, &slice.restamped, new)?
                    };
                    let mut columns = batch.columns().to_vec();
                    if options.with_text {
                        columns.push(texts.column(db, slice.shard.batch_id, &batch)?);
                    }
                    let batch = RecordBatch::try_new(schema.clone(), columns)
                        .map_err(pq_err(&shard_path))?;
                    out.write(&batch)?;
                }
            }
        }
        out.finish()?;
        embedfleet_core::rundb::test_kill_point("publish_file");
        written += 1;
        if options.progress {
            eprintln!(
                "publish: {} of {} data files ({} rows)",
                i + 1,
                plan.files.len(),
                file.rows
            );
        }
    }
    Ok(reused)
}

/// The rows of `batch` (shard rows `first..`) not in `deleted` (sorted shard rows), as slices of
/// it, each with its first shard row: the whole batch when none is deleted.
fn kept(batch: &RecordBatch, first: u64, deleted: &[u64]) -> Vec<(u64, RecordBatch)> {
    let end = first + batch.num_rows() as u64;
    let mut out = Vec::new();
    let mut start = first;
    for &row in deleted.iter().filter(|r| (first..end).contains(r)) {
        if row > start {
            out.push((
                start,
                batch.slice((start - first) as usize, (row - start) as usize),
            ));
        }
        start = row + 1;
    }
    if end > start {
        out.push((
            start,
            batch.slice((start - first) as usize, (end - start) as usize),
        ));
    }
    out
}

/// The metadata later releases gave a batch's papers, one batch at a time (a release that
/// stamps the whole corpus is never held at once).
#[derive(Default)]
struct Restamps {
    batch: Option<BatchId>,
    by_id: HashMap<String, PaperMetadata>,
}

impl Restamps {
    fn of(
        &mut self,
        db: &RunDb,
        batch: BatchId,
    ) -> Result<&HashMap<String, PaperMetadata>, PublishError> {
        if self.batch != Some(batch) {
            self.by_id = db
                .restamps_of_batch(batch.0)?
                .into_iter()
                .map(|r| (r.paper_id, r.metadata))
                .collect();
            self.batch = Some(batch);
        }
        Ok(&self.by_id)
    }
}

/// `batch` (shard rows `first..`) with the metadata columns of its `restamped` rows (sorted
/// shard rows) replaced by the values a later release gave them (`new`, by paper id).
fn restamp(
    batch: &RecordBatch,
    first: u64,
    restamped: &[(u64, u64)],
    new: &HashMap<String, PaperMetadata>,
) -> Result<RecordBatch, PublishError> {
    let end = first + batch.num_rows() as u64;
    let ids = batch
        .column_by_name("id")
        .and_then(|c| c.as_any().downcast_ref::<StringArray>());
    let mut here: HashMap<usize, &PaperMetadata> = HashMap::new();
    for (row, _) in restamped.iter().filter(|(r, _)| (first..end).contains(r)) {
        let i = (row - first) as usize;
        if let Some(m) = ids.and_then(|ids| new.get(ids.value(i))) {
            here.insert(i, m);
        }
    }
    if here.is_empty() {
        return Ok(batch.clone());
    }
    type Field = fn(&PaperMetadata) -> Option<&str>;
    let fields: [(&str, Field); 5] = [
        ("source", |m| m.source.as_deref()),
        ("created", |m| m.created.as_deref()),
        ("added", |m| m.added.as_deref()),
        ("version", |m| m.version.as_deref()),
        ("extra", |m| m.extra.as_deref()),
    ];
    let mut columns = batch.columns().to_vec();
    for (name, value_of) in fields {
        let Some(index) = batch.schema().index_of(name).ok() else {
            continue;
        };
        let Some(old) = columns[index].as_any().downcast_ref::<StringArray>() else {
            continue;
        };
        let mut new = StringBuilder::new();
        for row in 0..old.len() {
            match here.get(&row) {
                Some(m) => new.append_option(value_of(m)),
                None if old.is_null(row) => new.append_null(),
                None => new.append_value(old.value(row)),
            }
        }
        columns[index] = Arc::new(new.finish());
    }
    RecordBatch::try_new(batch.schema(), columns).map_err(|e| PublishError::Text {
        path: PathBuf::new(),
        message: format!("could not set a release's metadata on a shard's rows: {e}"),
    })
}

/// A data file being written under its temporary name.
struct Output<'a> {
    path: &'a Path,
    writer: ArrowWriter<File>,
    /// The temporary file goes when the output fails or is dropped before it is finished.
    guard: atomic::TmpGuard,
}

impl<'a> Output<'a> {
    fn create(
        path: &'a Path,
        schema: &SchemaRef,
        props: WriterProperties,
    ) -> Result<Self, PublishError> {
        let guard = atomic::TmpGuard::new(path);
        let file = atomic::create_tmp(path).map_err(io(&atomic::tmp_path(path)))?;
        let writer =
            ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(pq_err(path))?;
        Ok(Output {
            path,
            writer,
            guard,
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<(), PublishError> {
        self.writer.write(batch).map_err(pq_err(self.path))
    }

    fn finish(self) -> Result<(), PublishError> {
        self.writer.close().map_err(pq_err(self.path))?;
        atomic::commit(self.path).map_err(io(self.path))?;
        self.guard.committed();
        Ok(())
    }
}

/// True when `path` is a whole parquet file with the planned rows and recipe.
fn is_finished(path: &Path, plan: &FilePlan) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    let Ok(builder) = ParquetRecordBatchReaderBuilder::try_new(file) else {
        return false;
    };
    let meta = builder.metadata().file_metadata();
    let recipe = meta
        .key_value_metadata()
        .into_iter()
        .flatten()
        .find(|kv| kv.key == RECIPE_KEY)
        .and_then(|kv| kv.value.as_deref());
    u64::try_from(meta.num_rows()).ok() == Some(plan.rows)
        && recipe == Some(plan.recipe_sha256.as_str())
}

/// zstd, the shards' metadata, the recipe; row groups sized by the plan.
fn properties(source: &Source, file: &FilePlan, rows_per_group: usize) -> WriterProperties {
    let mut kvs: Vec<KeyValue> = source
        .meta
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
        .collect();
    kvs.push(KeyValue::new(
        RECIPE_KEY.to_string(),
        file.recipe_sha256.clone(),
    ));
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("level 3 is valid. This is a bug."),
        ))
        .set_max_row_group_size(rows_per_group)
        .set_key_value_metadata(Some(kvs))
        .build()
}

/// The shards' schema, plus a nullable `text` column with `--with-text`.
fn output_schema(schema: &SchemaRef, with_text: bool) -> SchemaRef {
    if !with_text {
        return schema.clone();
    }
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new("text", DataType::Utf8, true));
    Arc::new(Schema::new(fields))
}

/// Papers' texts by id, one batch file at a time: the shards of a batch come in a row, so
/// each batch file is read once (unless a data file boundary falls inside it).
#[derive(Default)]
struct TextSource {
    batch: Option<BatchId>,
    texts: HashMap<String, String>,
}

impl TextSource {
    /// The `text` column for a record batch of one parquet shard of `batch`.
    fn column(
        &mut self,
        db: &RunDb,
        batch: BatchId,
        rows: &RecordBatch,
    ) -> Result<ArrayRef, PublishError> {
        if self.batch != Some(batch) {
            self.texts = read_texts(db, batch)?;
            self.batch = Some(batch);
        }
        let ids = rows
            .column_by_name("id")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| PublishError::Text {
                path: db.dir().into(),
                message: format!("a parquet shard of batch {batch} has no utf8 `id` column"),
            })?;
        let mut out = StringBuilder::new();
        for i in 0..ids.len() {
            let text = self
                .texts
                .get(ids.value(i))
                .ok_or_else(|| PublishError::Text {
                    path: db.dir().into(),
                    message: format!(
                        "paper {} is not in the batch file of batch {batch}",
                        ids.value(i)
                    ),
                })?;
            out.append_value(text);
        }
        Ok(Arc::new(out.finish()))
    }
}

fn read_texts(db: &RunDb, batch: BatchId) -> Result<HashMap<String, String>, PublishError> {
    let row = db.batch(batch)?.ok_or_else(|| PublishError::Text {
        path: db.dir().into(),
        message: format!("batch {batch} of a parquet shard is not in run.db"),
    })?;
    let path = db.dir().join(&row.path);
    let mut texts = HashMap::new();
    batchfile::read(&path, |r| {
        texts.insert(r.paper.id, r.paper.text);
    })
    .map_err(|e| PublishError::Text {
        path: path.clone(),
        message: e.to_string(),
    })?;
    Ok(texts)
}
