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
    /// Points per batch (each batch its own shards): all in one batch by default.
    pub batch_points: usize,
    /// The year and source of paper `i`.
    pub payload: fn(usize) -> (i64, &'static str),
    /// 0: every vector uniformly random (HNSW's worst case). N: each paper near one of N
    /// random centres ([`cluster_of`]), as embeddings of papers on N topics are; a `payload`
    /// that reads the cluster makes the year follow the vectors, as a real corpus's does.
    pub clusters: usize,
}

/// The cluster of paper `i` among `clusters` (see [`SyntheticRun::clusters`]).
pub fn cluster_of(i: usize, clusters: usize) -> usize {
    (i.wrapping_mul(0x9E37_79B9) >> 7) % clusters.max(1)
}

impl SyntheticRun {
    /// Years 2000..2024 in turn; one paper in three `arxiv`, the others `s2orc`.
    pub fn new(points: usize, dim: usize, shard_rows: usize) -> Self {
        Self {
            points,
            dim,
            shard_rows,
            batch_points: usize::MAX,
            payload: |i| {
                let source = if i % 3 == 0 { "arxiv" } else { "s2orc" };
                (2000 + (i % 25) as i64, source)
            },
            clusters: 0,
        }
    }

    /// Writes the run into `dir`: run.db with its done batches (`batch_points` points each, one
    /// batch by default) and the parquet shards `shards/bBBBBBB-PPPP.synthetic.parquet` of seeded
    /// random unit vectors (ids `W0000000000`, ...).
    pub fn write(&self, dir: &Path) -> std::result::Result<(), Box<dyn std::error::Error>> {
        let db = RunDb::create(dir)?;
        db.conn().execute_batch(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'synthetic', 1, 1, 'e');",
        )?;
        let per_batch = self.batch_points.clamp(1, self.points.max(1));
        for (b, first) in (0..self.points.max(1)).step_by(per_batch).enumerate() {
            let rows = per_batch.min(self.points - first.min(self.points));
            db.conn().execute_batch(&format!(
                "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars, state)
                     VALUES ({}, 1, {b}, 'synthetic', {rows}, 1, 'done');",
                b + 1
            ))?;
        }
        std::fs::create_dir_all(db.layout().shard_dir())?;
        let meta = ShardMeta {
            model: "synthetic".into(),
            model_revision: "0".into(),
            compute_dtype: "f32".into(),
            pooling: "last_token".into(),
            document_prompt: String::new(),
            text_rule: None,
            normalized: true,
            dim: self.dim,
            embedfleet_version: env!("CARGO_PKG_VERSION").into(),
            timings: None,
        };
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut vector = vec![0f32; self.dim];
        let step = self.shard_rows.max(1).min(per_batch);
        let shards = (0..self.points).step_by(per_batch).flat_map(|batch_first| {
            let batch_end = (batch_first + per_batch).min(self.points);
            (batch_first..batch_end)
                .step_by(step)
                .enumerate()
                .map(move |(part, first)| {
                    (
                        batch_first,
                        part as u32,
                        first,
                        (first + step).min(batch_end),
                    )
                })
        });
        for (batch_first, part, first, end) in shards {
            let batch = (batch_first / per_batch) as i64 + 1;
            let rel = crate::RunLayout::shard_file_name(batch, part, "synthetic");
            let mut w = ShardWriter::create(&dir.join(&rel), VectorDtype::F32, &meta)?;
            for i in first..end {
                random_unit(&mut x, &mut vector);
                if self.clusters > 0 {
                    near_centre(cluster_of(i, self.clusters), &mut vector);
                }
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
            record(&db, batch, part, rel, info.rows, info.sha256)?;
        }
        Ok(())
    }
}

fn record(
    db: &RunDb,
    batch: i64,
    part: u32,
    path: String,
    rows: u64,
    sha256: String,
) -> Result<()> {
    db.record_shard(&ShardRow {
        batch_id: BatchId(batch),
        part,
        path,
        rows,
        sha256,
    })
}

/// Moves the random unit vector `noise` to its cluster's centre: `centre + noise`,
/// renormalised (papers of a cluster at cosine ~0.5 of each other, ~0.7 of the centre).
fn near_centre(cluster: usize, noise: &mut [f32]) {
    let mut seed =
        0x9E37_79B9_7F4A_7C15u64 ^ (cluster as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut centre = vec![0f32; noise.len()];
    random_unit(&mut seed, &mut centre);
    noise.iter_mut().zip(&centre).for_each(|(a, c)| *a += c);
    let norm = noise.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-12);
    noise.iter_mut().for_each(|a| *a /= norm);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_of_batch_points_each_cut_into_shards_of_shard_rows() {
        let dir = tempfile::tempdir().unwrap();
        let run = SyntheticRun {
            batch_points: 1000,
            ..SyntheticRun::new(2500, 4, 300)
        };
        run.write(dir.path()).unwrap();
        let db = RunDb::open(dir.path()).unwrap();
        let shards = db.all_shards().unwrap();
        let per_batch = |b: i64| -> (usize, u64) {
            let of: Vec<_> = shards.iter().filter(|s| s.batch_id.0 == b).collect();
            (of.len(), of.iter().map(|s| s.rows).sum())
        };
        assert_eq!(per_batch(1), (4, 1000));
        assert_eq!(per_batch(2), (4, 1000));
        assert_eq!(per_batch(3), (2, 500));
        assert_eq!(shards.iter().map(|s| s.rows).sum::<u64>(), 2500);
        assert!(shards.iter().all(|s| s.rows <= 300));
    }
}
