//! A run directory made the way the embed job leaves it — run.db with batches, batch files and
//! parquet shards — and ways to read a published folder back.

use arrow_array::{Array, Float16Array, Float32Array, RecordBatch, StringArray};
use arrow_array::{FixedSizeListArray, Int32Array};
use embedfleet_core::batchfile::BatchWriter;
use embedfleet_core::rundb::{RunDb, ShardRow};
use embedfleet_core::shardfile::{ShardMeta, ShardRow as Row, ShardWriter, VectorDtype};
use embedfleet_core::{BatchId, Paper};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

pub const DIM: usize = 16;
/// Bytes per row as publish counts them without text: 16 × 4 + 64.
pub const ROW_BYTES: u64 = DIM as u64 * 4 + 64;

/// A run: one entry per batch, each with its parts' row counts.
pub struct Spec<'a> {
    pub parts: &'a [&'a [u64]],
    pub dtype: VectorDtype,
}

pub fn paper(batch: usize, i: u64) -> Paper {
    Paper {
        id: format!("b{batch}p{i}"),
        text: format!(
            "Paper {i} of batch {batch}: {}",
            "lorem ipsum ".repeat(i as usize % 5)
        ),
        source: Some("s2orc".into()),
        created: Some("2021-03-04".into()),
        added: None,
        version: Some("v2".into()),
        extra: i.is_multiple_of(2).then(|| r#"{"year": 2021}"#.to_string()),
    }
}

pub fn vector(batch: usize, i: u64, seed: u64) -> Vec<f32> {
    (0..DIM as u64)
        .map(|d| ((batch as u64 * 7919 + i * 31 + d + seed) % 97) as f32 / 97.0)
        .collect()
}

pub fn meta() -> ShardMeta {
    ShardMeta {
        model: "Qwen/Qwen3-Embedding-tiny".into(),
        model_revision: "rev-abc123".into(),
        compute_dtype: "bf16".into(),
        pooling: "last_token".into(),
        document_prompt: String::new(),
        text_rule: None,
        normalized: true,
        dim: DIM,
        embedfleet_version: "9.9.9-test".into(),
        timings: None,
    }
}

/// Builds a complete run in `dir`: every batch `done`, with its batch file and shards, and
/// three quarantined records (two reasons).
pub fn make_run(dir: &Path, spec: &Spec) {
    let db = RunDb::create(dir).unwrap();
    db.conn()
        .execute_batch(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges, state)
                 VALUES (1, '/corpus/c.jsonl.gz', 10, 1, 'e', 'planned');
             INSERT INTO quarantine (file_id, line, reason, detail) VALUES
                 (1, 3, 'empty_text', 'no text'), (1, 9, 'empty_text', 'no text'),
                 (1, 12, 'invalid_json', 'line 12: expected value');",
        )
        .unwrap();
    std::fs::create_dir_all(dir.join("shards")).unwrap();
    std::fs::create_dir_all(dir.join("batches")).unwrap();
    for (b, parts) in spec.parts.iter().enumerate() {
        let rows: u64 = parts.iter().sum();
        let path = format!("batches/f000001-{b:05}.parquet");
        let mut writer = BatchWriter::create(&dir.join(&path)).unwrap();
        for i in 0..rows {
            let p = paper(b, i);
            writer.push(i + 1, &p, p.n_chars()).unwrap();
        }
        writer.finish().unwrap();
        db.conn()
            .execute(
                "INSERT INTO batches (id, file_id, seq, path, n_rows, n_excluded, n_chars, state)
                 VALUES (?1, 1, ?2, ?3, ?4, 1, ?5, 'done')",
                rusqlite::params![b as i64 + 1, b as i64, path, rows + 1, rows * 40],
            )
            .unwrap();
        let mut first = 0;
        for (part, &n) in parts.iter().enumerate() {
            write_shard(&db, b, part as u32, first..first + n, spec.dtype, 0);
            first += n;
        }
    }
}

/// Writes (or rewrites) one parquet shard of batch index `b` and records it in run.db.
pub fn write_shard(
    db: &RunDb,
    b: usize,
    part: u32,
    rows: std::ops::Range<u64>,
    dtype: VectorDtype,
    seed: u64,
) {
    let rel = format!("shards/b{:06}-{part:04}.parquet", b + 1);
    // Each shard has its own timings, as the embed job writes them.
    let meta = ShardMeta {
        timings: Some(format!(r#"{{"batch": {b}, "part": {part}}}"#)),
        ..meta()
    };
    let mut w = ShardWriter::create(&db.dir().join(&rel), dtype, &meta).unwrap();
    for i in rows {
        let p = paper(b, i);
        let v = vector(b, i, seed);
        let row = Row {
            paper: &p,
            vector: &v,
            n_chars: p.n_chars() as u32,
            n_tokens: 5,
            n_chunks: 1,
        };
        w.push(&row).unwrap();
    }
    let info = w.finish().unwrap();
    let shard = ShardRow {
        batch_id: BatchId(b as i64 + 1),
        part,
        path: rel,
        rows: info.rows,
        sha256: info.sha256,
    };
    db.record_shard(&shard).unwrap();
}

/// A small parquet file of query results, as `embedfleet query` writes them.
pub fn write_query_results(path: &Path, n: usize) {
    let schema = Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("term", arrow_schema::DataType::Utf8, false),
        arrow_schema::Field::new("rank", arrow_schema::DataType::Int32, false),
        arrow_schema::Field::new("paper_id", arrow_schema::DataType::Utf8, false),
    ]));
    let terms: Vec<String> = (0..n).map(|i| format!("term {}", i / 3)).collect();
    let ids: Vec<String> = (0..n).map(|i| format!("b0p{i}")).collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(terms)),
            Arc::new(Int32Array::from_iter_values((0..n as i32).map(|i| i % 3))),
            Arc::new(StringArray::from(ids)),
        ],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// The data files of a published folder, in name order.
pub fn data_files(out: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Every record batch of a parquet file.
pub fn read_batches(path: &Path) -> Vec<RecordBatch> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    reader.map(|b| b.unwrap()).collect()
}

/// A parquet file's key-value metadata, and the metadata of the arrow schema it embeds.
pub fn kv_meta(path: &Path) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let kvs = builder.metadata().file_metadata().key_value_metadata();
    let kv = kvs
        .into_iter()
        .flatten()
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect();
    let schema = builder.schema().metadata().clone().into_iter().collect();
    (kv, schema)
}

/// (id, first vector element, text) of every row of the folder's data files, in order.
pub fn rows(out: &Path) -> Vec<(String, f32, Option<String>)> {
    let mut all = Vec::new();
    for file in data_files(out) {
        for batch in read_batches(&file) {
            let ids = column::<StringArray>(&batch, "id");
            let vectors = column::<FixedSizeListArray>(&batch, "embedding");
            let text = batch
                .column_by_name("text")
                .map(|c| c.as_any().downcast_ref::<StringArray>().unwrap().clone());
            for i in 0..batch.num_rows() {
                let v = vectors.value(i);
                let first = match v.as_any().downcast_ref::<Float32Array>() {
                    Some(f) => f.value(0),
                    None => v
                        .as_any()
                        .downcast_ref::<Float16Array>()
                        .unwrap()
                        .value(0)
                        .to_f32(),
                };
                let t = text.as_ref().map(|t| t.value(i).to_string());
                all.push((ids.value(i).to_string(), first, t));
            }
        }
    }
    all
}

fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> &'a T {
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_any()
        .downcast_ref::<T>()
        .unwrap_or_else(|| panic!("column {name} has another type"))
}

/// Runs `sha256sum -c SHA256SUMS` in the folder.
pub fn sha256sum_check(out: &Path) {
    let check = Command::new("sha256sum")
        .args(["-c", "--quiet", "--strict", "SHA256SUMS"])
        .current_dir(out)
        .output()
        .expect("sha256sum runs");
    assert!(
        check.status.success(),
        "sha256sum -c failed:\n{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

pub fn manifest(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap()
}

pub fn card(out: &Path) -> String {
    std::fs::read_to_string(out.join("README.md")).unwrap()
}

/// Runs `code` with python3 when it can import `module`; `None` (skipped) when it cannot and
/// `required_env` is unset, a failure when it is set.
pub fn python(code: &str, module: &str, required_env: &str, home: &Path) -> Option<String> {
    let probe = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os(required_env).is_none(),
            "{required_env} is set but python3 cannot import {module}"
        );
        eprintln!("skipping the {module} check: python3 has no {module} (pip install {module})");
        return None;
    }
    let out = Command::new("python3")
        .args(["-c", code])
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HOME", home)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `embedfleet_publish::publish` on the run's run.db, opened for it as a command would.
pub fn publish(
    options: &embedfleet_publish::PublishOptions,
) -> Result<embedfleet_publish::PublishReport, embedfleet_publish::PublishError> {
    let db = embedfleet_core::rundb::RunDb::open(&options.run_dir)?;
    embedfleet_publish::publish(&db, options)
}
