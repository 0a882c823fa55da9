//! Parquet shards: the embed job's output, one parquet file per part (`--shard-papers` papers)
//! of a batch. (A *Qdrant* shard is something else: a piece of a collection on a server.)
//!
//! Schema (docs/run-directory.md, "Run directory"): `id: utf8`,
//! `embedding: fixed_size_list<float32 | float16>[dim]`,
//! `n_chars: int32`, `n_tokens: int32`, `n_chunks: int16`, then the corpus metadata kept
//! (`source`, `created`, `added`, `version`, `extra`). The file's key-value metadata says which
//! model made the vectors and how (see [`ShardMeta`]). Written through [`crate::atomic`].

use crate::atomic;
use crate::paper::Paper;
use arrow_array::builder::{
    FixedSizeListBuilder, Float16Builder, Float32Builder, Int16Builder, Int32Builder, StringBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Rows per write (and row group size).
const ROWS_PER_GROUP: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum VectorDtype {
    #[default]
    F32,
    F16,
}

/// How the vectors of a shard were made; stored as parquet key-value metadata (`embedfleet.*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardMeta {
    pub model: String,
    /// A hash of the weights, so shards from different weights are never mixed unnoticed.
    pub model_revision: String,
    /// The dtype the model ran in (`f32`, `bf16`).
    pub compute_dtype: String,
    pub pooling: String,
    /// The prompt written before every paper's text (E5's `passage: `); empty for none.
    pub document_prompt: String,
    /// How a text was prepared before it was tokenised (`as-given`: sentence-transformers 5.4
    /// and later; `stripped`: 5.3 and earlier); `None` for a run fixed before embedfleet
    /// recorded it (the encoder families' texts stripped, Qwen3's as given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_rule: Option<String>,
    pub normalized: bool,
    pub dim: usize,
    pub embedfleet_version: String,
    /// Timings of the batch so far, JSON (free-form, for the report).
    pub timings: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("failed to write shard {path}: {cause}")]
pub struct ShardFileError {
    pub path: PathBuf,
    pub cause: Box<dyn std::error::Error + Send + Sync>,
}

/// One embedded paper.
pub struct ShardRow<'a> {
    pub paper: &'a Paper,
    pub vector: &'a [f32],
    pub n_chars: u32,
    pub n_tokens: u32,
    pub n_chunks: u16,
}

/// What a finished shard holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    pub rows: u64,
    pub sha256: String,
}

pub fn schema(dim: usize, dtype: VectorDtype) -> SchemaRef {
    let item = match dtype {
        VectorDtype::F32 => DataType::Float32,
        VectorDtype::F16 => DataType::Float16,
    };
    let text = |name: &str, nullable| Field::new(name, DataType::Utf8, nullable);
    Arc::new(Schema::new(vec![
        text("id", false),
        Field::new(
            "embedding",
            DataType::FixedSizeList(Arc::new(Field::new("item", item, false)), dim as i32),
            false,
        ),
        Field::new("n_chars", DataType::Int32, false),
        Field::new("n_tokens", DataType::Int32, false),
        Field::new("n_chunks", DataType::Int16, false),
        text("source", true),
        text("created", true),
        text("added", true),
        text("version", true),
        text("extra", true),
    ]))
}

enum Vectors {
    F32(FixedSizeListBuilder<Float32Builder>),
    F16(FixedSizeListBuilder<Float16Builder>),
}

pub struct ShardWriter {
    path: PathBuf,
    dim: usize,
    schema: SchemaRef,
    writer: ArrowWriter<File>,
    id: StringBuilder,
    vectors: Vectors,
    n_chars: Int32Builder,
    n_tokens: Int32Builder,
    n_chunks: Int16Builder,
    meta: [StringBuilder; 5],
    pending: usize,
    rows: u64,
    /// The temporary file goes when the writer fails or is dropped before [`Self::finish`].
    guard: atomic::TmpGuard,
}

impl ShardWriter {
    pub fn create(
        path: &Path,
        dtype: VectorDtype,
        meta: &ShardMeta,
    ) -> Result<Self, ShardFileError> {
        let err = |e: Box<dyn std::error::Error + Send + Sync>| ShardFileError {
            path: path.into(),
            cause: e,
        };
        let schema = schema(meta.dim, dtype);
        let kv = |k: &str, v: String| KeyValue::new(format!("embedfleet.{k}"), v);
        let mut kvs = vec![
            kv("model", meta.model.clone()),
            kv("model_revision", meta.model_revision.clone()),
            kv("compute_dtype", meta.compute_dtype.clone()),
            kv("pooling", meta.pooling.clone()),
            kv("document_prompt", meta.document_prompt.clone()),
            kv("normalized", meta.normalized.to_string()),
            kv("dim", meta.dim.to_string()),
            kv("version", meta.embedfleet_version.clone()),
        ];
        if let Some(rule) = &meta.text_rule {
            kvs.push(kv("text_rule", rule.clone()));
        }
        if let Some(t) = &meta.timings {
            kvs.push(kv("timings", t.clone()));
        }
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(3).expect("level 3 is valid. This is a bug."),
            ))
            .set_max_row_group_size(ROWS_PER_GROUP)
            .set_key_value_metadata(Some(kvs))
            .build();
        let guard = atomic::TmpGuard::new(path);
        let file = atomic::create_tmp(path).map_err(|e| err(e.into()))?;
        let writer =
            ArrowWriter::try_new(file, schema.clone(), Some(props)).map_err(|e| err(e.into()))?;
        let dim32 = meta.dim as i32;
        let vectors = match dtype {
            VectorDtype::F32 => Vectors::F32(
                FixedSizeListBuilder::new(Float32Builder::new(), dim32)
                    .with_field(Arc::new(Field::new("item", DataType::Float32, false))),
            ),
            VectorDtype::F16 => Vectors::F16(
                FixedSizeListBuilder::new(Float16Builder::new(), dim32)
                    .with_field(Arc::new(Field::new("item", DataType::Float16, false))),
            ),
        };
        Ok(Self {
            path: path.into(),
            dim: meta.dim,
            schema,
            writer,
            id: StringBuilder::new(),
            vectors,
            n_chars: Int32Builder::new(),
            n_tokens: Int32Builder::new(),
            n_chunks: Int16Builder::new(),
            meta: Default::default(),
            pending: 0,
            rows: 0,
            guard,
        })
    }

    pub fn push(&mut self, row: &ShardRow) -> Result<(), ShardFileError> {
        if row.vector.len() != self.dim {
            let msg = format!(
                "vector of {} has {} dimensions, the shard {}",
                row.paper.id,
                row.vector.len(),
                self.dim
            );
            return Err(ShardFileError {
                path: self.path.clone(),
                cause: msg.into(),
            });
        }
        self.id.append_value(&row.paper.id);
        match &mut self.vectors {
            Vectors::F32(b) => {
                b.values().append_slice(row.vector);
                b.append(true);
            }
            Vectors::F16(b) => {
                for &x in row.vector {
                    b.values().append_value(half::f16::from_f32(x));
                }
                b.append(true);
            }
        }
        self.n_chars
            .append_value(row.n_chars.min(i32::MAX as u32) as i32);
        self.n_tokens
            .append_value(row.n_tokens.min(i32::MAX as u32) as i32);
        self.n_chunks
            .append_value(row.n_chunks.min(i16::MAX as u16) as i16);
        let p = row.paper;
        for (b, v) in self
            .meta
            .iter_mut()
            .zip([&p.source, &p.created, &p.added, &p.version, &p.extra])
        {
            b.append_option(v.as_deref());
        }
        self.pending += 1;
        self.rows += 1;
        if self.pending == ROWS_PER_GROUP {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ShardFileError> {
        if self.pending == 0 {
            return Ok(());
        }
        let vectors: ArrayRef = match &mut self.vectors {
            Vectors::F32(b) => Arc::new(b.finish()),
            Vectors::F16(b) => Arc::new(b.finish()),
        };
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(self.id.finish()),
            vectors,
            Arc::new(self.n_chars.finish()),
            Arc::new(self.n_tokens.finish()),
            Arc::new(self.n_chunks.finish()),
        ];
        columns.extend(
            self.meta
                .iter_mut()
                .map(|b| Arc::new(b.finish()) as ArrayRef),
        );
        self.pending = 0;
        let batch = RecordBatch::try_new(self.schema.clone(), columns)
            .expect("columns match the schema. This is a bug.");
        self.writer.write(&batch).map_err(|e| ShardFileError {
            path: self.path.clone(),
            cause: e.into(),
        })
    }

    /// Closes the file, makes it visible under its final name and returns its checksum.
    pub fn finish(mut self) -> Result<ShardInfo, ShardFileError> {
        self.flush()?;
        let path = self.path.clone();
        let err = |e: Box<dyn std::error::Error + Send + Sync>| ShardFileError {
            path: path.clone(),
            cause: e,
        };
        self.writer.close().map_err(|e| err(e.into()))?;
        let sha256 = sha256_of(&atomic::tmp_path(&path)).map_err(|e| err(e.into()))?;
        atomic::commit(&path).map_err(|e| err(e.into()))?;
        self.guard.committed();
        Ok(ShardInfo {
            rows: self.rows,
            sha256,
        })
    }
}

/// The rows of a parquet file, from its footer.
pub fn row_count(path: &Path) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(crate::untrusted::open_regular(path)?)?;
    Ok(reader.metadata().file_metadata().num_rows().max(0) as u64)
}

/// The shard at `path` (shown as `name`) still has the sha256 and the rows it was recorded
/// with: what a build checks before using it. The owner's check of an attempt is
/// [`check_recorded`], which also tells a read error from a wrong file.
pub fn verify_recorded(path: &Path, name: &str, rows: u64, sha256: &str) -> Result<(), String> {
    check_recorded(path, name, rows, sha256)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Why a recorded shard did not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardCheckError {
    /// The file could not be read (on a shared filesystem: ESTALE, EIO, a file renamed over
    /// while it was read): nothing is known about it, so the check is to be tried again.
    #[error("{0}")]
    Unreadable(String),
    /// The file was read whole and is not what was recorded: a verdict.
    #[error("{0}")]
    Wrong(String),
}

impl ShardCheckError {
    /// A read error, not a verdict on the file.
    pub fn is_unreadable(&self) -> bool {
        matches!(self, Self::Unreadable(_))
    }
}

/// Checks the shard at `path` (shown as `name`) against its record — sha256 first, then the
/// rows in its footer — and returns its paper ids, in row order.
pub fn check_recorded(
    path: &Path,
    name: &str,
    rows: u64,
    sha256: &str,
) -> Result<Vec<String>, ShardCheckError> {
    let unreadable = |e: &dyn std::fmt::Display| {
        ShardCheckError::Unreadable(format!("shard {name} cannot be read now: {e}"))
    };
    // A shard that is a link, a FIFO or another user's file stays so: a verdict, not a retry.
    let found = sha256_of(path).map_err(|e| match crate::untrusted::is_lasting(&e) {
        true => ShardCheckError::Wrong(format!("shard {name} is never read: {e}")),
        false => unreadable(&e),
    })?;
    if found != sha256 {
        return Err(ShardCheckError::Wrong(format!(
            "shard {name} changed after it was written (sha256 {found}, recorded {sha256})"
        )));
    }
    // The bytes are the ones the writer hashed: a failure to decode them now is a read error
    // (or a writer that wrote garbage, which a later attempt replaces), unless the parquet
    // reader itself says the data is malformed.
    let ids = paper_ids(path).map_err(|e| match e {
        PaperIdsError::Io(e) => unreadable(&e),
        PaperIdsError::Format(e) => {
            ShardCheckError::Wrong(format!("shard {name} is not a readable parquet shard: {e}"))
        }
    })?;
    if ids.len() as u64 != rows {
        return Err(ShardCheckError::Wrong(format!(
            "shard {name} has {} rows, recorded {rows}",
            ids.len()
        )));
    }
    Ok(ids)
}

#[derive(Debug, thiserror::Error)]
pub enum PaperIdsError {
    #[error(transparent)]
    Io(std::io::Error),
    #[error("{0}")]
    Format(String),
}

/// The `id` column of a parquet shard, in row order (only that column is read).
pub fn paper_ids(path: &Path) -> Result<Vec<String>, PaperIdsError> {
    use arrow_array::cast::AsArray;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;
    let format = |e: &dyn std::fmt::Display| PaperIdsError::Format(e.to_string());
    let from_parquet = |e: parquet::errors::ParquetError| match e {
        parquet::errors::ParquetError::External(inner) => {
            match inner.downcast::<std::io::Error>() {
                Ok(io) => PaperIdsError::Io(*io),
                Err(other) => PaperIdsError::Format(other.to_string()),
            }
        }
        other => format(&other),
    };
    let file = crate::untrusted::open_regular(path).map_err(PaperIdsError::Io)?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(from_parquet)?;
    let Some(index) = builder
        .schema()
        .fields()
        .iter()
        .position(|f| f.name() == "id")
    else {
        return Err(PaperIdsError::Format("it has no `id` column".into()));
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(from_parquet)?;
    let mut ids = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| match e {
            arrow_schema::ArrowError::IoError(_, io) => PaperIdsError::Io(io),
            arrow_schema::ArrowError::ExternalError(inner) => {
                match inner.downcast::<parquet::errors::ParquetError>() {
                    Ok(p) => from_parquet(*p),
                    Err(other) => PaperIdsError::Format(other.to_string()),
                }
            }
            other => format(&other),
        })?;
        let column = batch.column(0);
        // pyarrow may rewrite a shard with large strings; both are ids.
        match column.data_type() {
            DataType::Utf8 => ids.extend(
                column
                    .as_string::<i32>()
                    .iter()
                    .map(|v| v.unwrap_or_default().to_string()),
            ),
            DataType::LargeUtf8 => ids.extend(
                column
                    .as_string::<i64>()
                    .iter()
                    .map(|v| v.unwrap_or_default().to_string()),
            ),
            DataType::Utf8View => ids.extend(
                column
                    .as_string_view()
                    .iter()
                    .map(|v| v.unwrap_or_default().to_string()),
            ),
            other => {
                return Err(PaperIdsError::Format(format!(
                    "its `id` column is {other}, not a string"
                )))
            }
        }
    }
    Ok(ids)
}

/// The hex SHA-256 of a file.
pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut file = crate::untrusted::open_regular(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_that_is_a_fifo_or_a_link_is_a_verdict_and_a_directory_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("b1-p0.parquet");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
        let link = dir.path().join("b1-p1.parquet");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let folder = dir.path().join("b1-p2.parquet");
        std::fs::create_dir(&folder).unwrap();
        let check = |p: &Path| check_recorded(p, "s", 1, &"0".repeat(64));
        // Neither blocks nor reads without end.
        assert!(matches!(check(&fifo), Err(ShardCheckError::Wrong(w)) if w.contains("a FIFO")));
        assert!(
            matches!(check(&link), Err(ShardCheckError::Wrong(w)) if w.contains("symbolic link"))
        );
        assert!(check(&folder).unwrap_err().is_unreadable());
    }
}
