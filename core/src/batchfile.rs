//! Batch files: the input of one per-node job, written by the planner and read by the embed job.
//!
//! Parquet with zstd, one row a paper, in corpus order. Written through [`crate::atomic`], so a
//! batch file that exists is complete. Row groups hold [`ROWS_PER_GROUP`] papers (fewer when
//! their text passes [`MAX_GROUP_TEXT_BYTES`]), so neither the
//! planner nor the job ever holds a whole batch of text in memory twice.

use crate::atomic;
use crate::paper::Paper;
use arrow_array::builder::{Int32Builder, Int64Builder, StringBuilder};
use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Papers per parquet row group (and per write).
pub const ROWS_PER_GROUP: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum BatchFileError {
    #[error("failed to write batch file {path}: {cause}")]
    Write {
        path: PathBuf,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("failed to read batch file {path}: {cause} (re-plan the run if the file was damaged)")]
    Read {
        path: PathBuf,
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The schema of every batch file.
pub fn schema() -> SchemaRef {
    static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let text = |name: &str, nullable| Field::new(name, DataType::Utf8, nullable);
            Arc::new(Schema::new(vec![
                text("id", false),
                text("text", false),
                Field::new("n_chars", DataType::Int32, false),
                Field::new("line", DataType::Int64, false),
                text("source", true),
                text("created", true),
                text("added", true),
                text("version", true),
                text("extra", true),
            ]))
        })
        .clone()
}

/// One paper read back from a batch file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRow {
    pub paper: Paper,
    pub n_chars: u32,
    /// Line (JSON lines, 1-based) or row (parquet, 0-based) in the corpus file.
    pub line: u64,
}

/// Writes one batch file. Nothing is visible under `path` until [`BatchWriter::finish`].
pub struct BatchWriter {
    path: PathBuf,
    writer: ArrowWriter<File>,
    pending: Pending,
    rows: u64,
    chars: u64,
    /// Text bytes after which a row group ends early (see [`MAX_GROUP_TEXT_BYTES`]).
    group_bytes: usize,
    /// The temporary file goes when the writer fails or is dropped before [`Self::finish`].
    guard: atomic::TmpGuard,
}

/// Text bytes of one row group at most (one paper may exceed it alone): arrow's string arrays
/// have i32 offsets, so a row group read back as one array must stay well under 2 GiB.
pub const MAX_GROUP_TEXT_BYTES: usize = 256 << 20;

#[derive(Default)]
struct Pending {
    id: StringBuilder,
    text: StringBuilder,
    n_chars: Int32Builder,
    line: Int64Builder,
    meta: [StringBuilder; 5],
    len: usize,
    /// Text bytes appended since the last flush.
    bytes: usize,
}

impl BatchWriter {
    pub fn create(path: &Path) -> Result<Self, BatchFileError> {
        Self::with_group_bytes(path, MAX_GROUP_TEXT_BYTES)
    }

    /// A writer whose row groups end after `group_bytes` of text (tests use small values).
    pub fn with_group_bytes(path: &Path, group_bytes: usize) -> Result<Self, BatchFileError> {
        let err = |source: Box<dyn std::error::Error + Send + Sync>| BatchFileError::Write {
            path: path.into(),
            cause: source,
        };
        let guard = atomic::TmpGuard::new(path);
        let file = atomic::create_tmp(path).map_err(|e| err(e.into()))?;
        let props = WriterProperties::builder()
            // Level 1: the batch files are scratch space read once or twice; speed beats size.
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(1).expect("level 1 is valid. This is a bug."),
            ))
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::None)
            .set_max_row_group_size(ROWS_PER_GROUP)
            .build();
        let writer =
            ArrowWriter::try_new(file, schema(), Some(props)).map_err(|e| err(e.into()))?;
        Ok(Self {
            path: path.into(),
            writer,
            pending: Pending::default(),
            rows: 0,
            chars: 0,
            group_bytes: group_bytes.max(1),
            guard,
        })
    }

    /// Appends a paper whose text has `n_chars` characters ([`count_chars`]).
    pub fn push(&mut self, line: u64, paper: &Paper, n_chars: u64) -> Result<(), BatchFileError> {
        let p = &mut self.pending;
        p.id.append_value(&paper.id);
        p.text.append_value(&paper.text);
        p.n_chars.append_value(n_chars.min(i32::MAX as u64) as i32);
        p.line.append_value(line as i64);
        let meta = [
            &paper.source,
            &paper.created,
            &paper.added,
            &paper.version,
            &paper.extra,
        ];
        for (builder, value) in p.meta.iter_mut().zip(meta) {
            builder.append_option(value.as_deref());
        }
        p.len += 1;
        p.bytes += paper.text.len();
        self.rows += 1;
        self.chars += n_chars;
        if p.len == ROWS_PER_GROUP {
            self.flush()?;
        } else if p.bytes >= self.group_bytes {
            // Many long papers: end the row group early, before its text nears 2 GiB.
            self.flush()?;
            self.writer.flush().map_err(|e| BatchFileError::Write {
                path: self.path.clone(),
                cause: e.into(),
            })?;
        }
        Ok(())
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn chars(&self) -> u64 {
        self.chars
    }

    fn flush(&mut self) -> Result<(), BatchFileError> {
        if self.pending.len == 0 {
            return Ok(());
        }
        let p = &mut self.pending;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(p.id.finish()),
            Arc::new(p.text.finish()),
            Arc::new(p.n_chars.finish()),
            Arc::new(p.line.finish()),
        ];
        columns.extend(p.meta.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        p.len = 0;
        p.bytes = 0;
        let batch = RecordBatch::try_new(schema(), columns)
            .expect("columns match the schema. This is a bug.");
        self.writer
            .write(&batch)
            .map_err(|e| BatchFileError::Write {
                path: self.path.clone(),
                cause: e.into(),
            })
    }

    /// Closes the file and makes it visible under its final name.
    pub fn finish(mut self) -> Result<(), BatchFileError> {
        self.flush()?;
        let err =
            |source: Box<dyn std::error::Error + Send + Sync>, path: &Path| BatchFileError::Write {
                path: path.into(),
                cause: source,
            };
        self.writer.close().map_err(|e| err(e.into(), &self.path))?;
        atomic::commit(&self.path).map_err(|e| err(e.into(), &self.path))?;
        self.guard.committed();
        Ok(())
    }
}

/// Reads a batch file in row groups, handing each row to `visit` in order.
pub fn read(path: &Path, mut visit: impl FnMut(BatchRow)) -> Result<(), BatchFileError> {
    let err = |source: Box<dyn std::error::Error + Send + Sync>| BatchFileError::Read {
        path: path.into(),
        cause: source,
    };
    let file = File::open(path).map_err(|e| err(e.into()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.with_batch_size(ROWS_PER_GROUP).build())
        .map_err(|e| err(e.into()))?;
    for batch in reader {
        let batch = batch.map_err(|e| err(e.into()))?;
        let text = |name: &str| -> Result<&StringArray, BatchFileError> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .ok_or_else(|| err(format!("column `{name}` is missing or not utf8").into()))
        };
        let (id, body) = (text("id")?, text("text")?);
        let meta = ["source", "created", "added", "version", "extra"].map(|n| text(n).ok());
        let n_chars = batch
            .column_by_name("n_chars")
            .and_then(|c| c.as_any().downcast_ref::<Int32Array>());
        let line = batch
            .column_by_name("line")
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>());
        let (Some(n_chars), Some(line)) = (n_chars, line) else {
            return Err(err(
                "columns `n_chars` and `line` must be int32 and int64".into()
            ));
        };
        for i in 0..batch.num_rows() {
            let opt = |c: Option<&StringArray>| {
                c.filter(|c| c.is_valid(i)).map(|c| c.value(i).to_owned())
            };
            visit(BatchRow {
                paper: Paper {
                    id: id.value(i).to_owned(),
                    text: body.value(i).to_owned(),
                    source: opt(meta[0]),
                    created: opt(meta[1]),
                    added: opt(meta[2]),
                    version: opt(meta[3]),
                    extra: opt(meta[4]),
                },
                n_chars: n_chars.value(i) as u32,
                line: line.value(i) as u64,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper::count_chars;

    #[test]
    fn round_trips_papers_across_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.parquet");
        let mut writer = BatchWriter::create(&path).unwrap();
        let papers: Vec<Paper> = (0..ROWS_PER_GROUP + 7)
            .map(|i| Paper {
                id: format!("p{i}"),
                text: "é".repeat(i + 1),
                source: (i % 2 == 0).then(|| "s2orc".into()),
                extra: (i % 3 == 0).then(|| r#"{"k":1}"#.into()),
                ..Paper::default()
            })
            .collect();
        for (i, p) in papers.iter().enumerate() {
            writer.push(i as u64 + 1, p, count_chars(&p.text)).unwrap();
        }
        assert!(!path.exists(), "nothing is visible before finish");
        writer.finish().unwrap();
        let mut back = Vec::new();
        read(&path, |row| back.push(row)).unwrap();
        assert_eq!(back.len(), papers.len());
        for (i, (row, paper)) in back.iter().zip(&papers).enumerate() {
            assert_eq!(&row.paper, paper);
            assert_eq!(row.n_chars as usize, i + 1);
            assert_eq!(row.line, i as u64 + 1);
        }
        assert!(!atomic::tmp_path(&path).exists());
    }

    #[test]
    fn row_groups_end_early_when_their_text_is_large() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.parquet");
        let mut w = BatchWriter::with_group_bytes(&path, 3000).unwrap();
        for i in 0..10u64 {
            let paper = Paper {
                id: i.to_string(),
                text: "x".repeat(1000),
                ..Paper::default()
            };
            w.push(i, &paper, 1000).unwrap();
        }
        w.finish().unwrap();
        let file = File::open(&path).unwrap();
        let reader = parquet::file::reader::SerializedFileReader::new(file).unwrap();
        use parquet::file::reader::FileReader;
        let groups = reader.metadata().num_row_groups();
        assert_eq!(
            groups, 4,
            "3 papers (3,000 bytes) a group, then the last one"
        );
        let mut ids = Vec::new();
        read(&path, |r| ids.push(r.paper.id)).unwrap();
        assert_eq!(ids.len(), 10, "every row read back, in order");
        assert_eq!(ids[9], "9");
    }
}
