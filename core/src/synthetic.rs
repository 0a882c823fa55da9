//! A run directory of random unit vectors in parquet shards, with no corpus and no model: for
//! the tests and benchmarks of the stages after embedding (upload, query, eval, publish).

use crate::rundb::{Result, RunDb, ShardRow};
use crate::shardfile::{ShardMeta, ShardRow as Row, ShardWriter, VectorDtype};
use crate::{BatchId, Paper};
use std::path::Path;

/// What each synthetic paper looks like.
#[derive(Debug, Clone)]
pub struct SyntheticRun {
    pub points: usize,
    pub dim: usize,
    pub shard_rows: usize,
    /// The year and source of paper `i`.
    pub payload: fn(usize) -> (i64, &'static str),
}

impl SyntheticRun {
    /// Years 2000..2024 in turn; one paper in three `arxiv`, the others `s2orc`.
    pub fn new(points: usize, dim: usize, shard_rows: usize) -> Self {
        Self {
            points,
            dim,
            shard_rows,
            payload: |i| {
                let source = if i % 3 == 0 { "arxiv" } else { "s2orc" };
                (2000 + (i % 25) as i64, source)
            },
        }
    }

    /// Writes the run into `dir`: run.db with one done batch and the parquet shards
    /// `shards/b000001-PPPP.synthetic.parquet` of seeded random unit vectors (ids `W0000000000`, ...).
    pub fn write(&self, dir: &Path) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let db = RunDb::create(dir)?;
        db.conn().execute_batch(&format!(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'synthetic', 1, 1, 'e');
             INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars, state)
                 VALUES (1, 1, 0, 'synthetic', {}, 1, 'done');",
            self.points
        ))?;
        std::fs::create_dir_all(db.layout().shard_dir())?;
        let meta = ShardMeta {
            model: "synthetic".into(),
            model_revision: "0".into(),
            compute_dtype: "f32".into(),
            pooling: "last_token".into(),
            normalized: true,
            dim: self.dim,
            embedfleet_version: env!("CARGO_PKG_VERSION").into(),
            timings: None,
        };
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut vector = vec![0f32; self.dim];
        let step = self.shard_rows.max(1);
        for (part, first) in (0..self.points).step_by(step).enumerate() {
            let rel = crate::RunLayout::shard_file_name(1, part as u32, "synthetic");
            let mut w = ShardWriter::create(&dir.join(&rel), VectorDtype::F32, &meta)?;
            for i in first..(first + step).min(self.points) {
                random_unit(&mut x, &mut vector);
                let (year, source) = (self.payload)(i);
                let paper = Paper {
                    id: format!("W{i:010}"),
                    source: Some(source.into()),
                    created: Some(format!("{year}-05-02T00:00:00.000Z")),
                    ..Paper::default()
                };
                let row = Row {
                    paper: &paper,
                    vector: &vector,
                    n_chars: 20_000,
                    n_tokens: 5_000,
                    n_chunks: 1,
                };
                w.push(&row)?;
            }
            let info = w.finish()?;
            record(&db, part as u32, rel, info.rows, info.sha256)?;
        }
        Ok(())
    }
}

fn record(db: &RunDb, part: u32, path: String, rows: u64, sha256: String) -> Result<()> {
    db.record_shard(&ShardRow {
        batch_id: BatchId(1),
        part,
        path,
        rows,
        sha256,
    })
}

/// Fills `v` with a unit vector from the xorshift state `x`.
fn random_unit(x: &mut u64, v: &mut [f32]) {
    for a in v.iter_mut() {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *a = (*x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
    }
    let norm = v.iter().map(|a| a * a).sum::<f32>().sqrt();
    v.iter_mut().for_each(|a| *a /= norm);
}
