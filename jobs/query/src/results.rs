//! The query workload's output: one parquet row per (query, rank) — `term`, `query_id`, `rank`,
//! `paper_id`, `score`, `year`, `source` — written atomically, and read back to resume.

use arrow_array::builder::{Float32Builder, Int32Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use embedfleet_core::atomic;
use embedfleet_vectordb::Hit;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::request::REQUEST_METADATA_KEY;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("term", DataType::Utf8, false),
        Field::new("query_id", DataType::Int64, false),
        Field::new("rank", DataType::Int32, false),
        Field::new("paper_id", DataType::Utf8, true),
        Field::new("score", DataType::Float32, false),
        Field::new("year", DataType::Int64, true),
        Field::new("source", DataType::Utf8, true),
    ]))
}

/// The rows of queries `first_query..` (one result list per term), as one record batch.
pub fn to_batch(terms: &[String], first_query: u64, hits: &[Vec<Hit>]) -> RecordBatch {
    let (mut term, mut query_id, mut rank) = (
        StringBuilder::new(),
        Int64Builder::new(),
        Int32Builder::new(),
    );
    let (mut paper, mut score, mut year, mut source) = (
        StringBuilder::new(),
        Float32Builder::new(),
        Int64Builder::new(),
        StringBuilder::new(),
    );
    for (i, (t, list)) in terms.iter().zip(hits).enumerate() {
        for (r, hit) in list.iter().enumerate() {
            term.append_value(t);
            query_id.append_value(first_query as i64 + i as i64);
            rank.append_value(r as i32 + 1);
            paper.append_option(hit.paper_id.as_deref());
            score.append_value(hit.score);
            year.append_option(hit.year);
            source.append_option(hit.source.as_deref());
        }
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(term.finish()),
        Arc::new(query_id.finish()),
        Arc::new(rank.finish()),
        Arc::new(paper.finish()),
        Arc::new(score.finish()),
        Arc::new(year.finish()),
        Arc::new(source.finish()),
    ];
    RecordBatch::try_new(schema(), columns).expect("columns match the schema. This is a bug.")
}

/// Writes `batches` to `path` atomically (zstd), with `request` (the JSON of the request they
/// answer) in the footer's key-value metadata.
pub fn write(path: &Path, batches: &[RecordBatch], request: &str) -> std::io::Result<()> {
    let props = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::ZSTD(Default::default()))
        .set_key_value_metadata(Some(vec![KeyValue::new(
            REQUEST_METADATA_KEY.to_string(),
            request.to_string(),
        )]))
        .build();
    atomic::or_discard(path, || {
        let mut writer = ArrowWriter::try_new(atomic::create_tmp(path)?, schema(), Some(props))
            .map_err(io_err)?;
        for b in batches {
            writer.write(b).map_err(io_err)?;
        }
        writer.close().map_err(io_err)?;
        atomic::commit(path)
    })
}

/// The request stored in a results file's footer: `Ok(None)` for a parquet file without one
/// (written by something else, or by an embedfleet before requests were stored).
pub fn read_request(path: &Path) -> std::io::Result<Option<String>> {
    let reader = SerializedFileReader::new(File::open(path)?).map_err(io_err)?;
    let found = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|e| e.key == REQUEST_METADATA_KEY))
        .and_then(|e| e.value.clone());
    Ok(found)
}

/// Every record batch of a results file.
pub fn read(path: &Path) -> std::io::Result<Vec<RecordBatch>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path)?)
        .map_err(io_err)?
        .build()
        .map_err(io_err)?;
    reader.map(|b| b.map_err(io_err)).collect()
}

fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}
