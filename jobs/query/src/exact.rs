//! Exact top-k by brute force over the run's parquet shards: the truth that recall is measured
//! against. Shards are streamed in blocks of rows; each block's scores against every query are
//! one f32 matrix product (candle's CPU GEMM, on all cores), and each query keeps its k best.

use crate::filter::matches;
use candle_core::{Device, Tensor};
use embedfleet_core::rundb::RunDb;
use embedfleet_upload::shards::read_from;
use embedfleet_upload::{PayloadFilter, PointsBatch};
use serde::{Deserialize, Serialize};

/// Rows of a shard scored at once.
const BLOCK_ROWS: usize = 4096;

/// One exact neighbour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExactHit {
    pub paper_id: String,
    pub score: f32,
}

/// Why the exact search failed.
#[derive(Debug, thiserror::Error)]
pub enum ExactError {
    #[error(transparent)]
    RunDb(#[from] embedfleet_core::rundb::RunDbError),
    #[error(transparent)]
    Shard(#[from] embedfleet_upload::shards::ShardReadError),
    #[error("failed to read a parquet shard: {0}")]
    Points(#[from] embedfleet_upload::UploadError),
    #[error("the matrix product failed: {0}")]
    Compute(#[from] candle_core::Error),
    #[error("a query has {found} components, the parquet shards {expected}")]
    Dim { expected: usize, found: usize },
}

/// The k best (score, row) of one query so far, best first.
#[derive(Debug, Clone, Default)]
pub struct TopK {
    k: usize,
    best: Vec<(f32, usize)>,
}

impl TopK {
    pub fn new(k: usize) -> Self {
        Self {
            k,
            best: Vec::with_capacity(k + 1),
        }
    }

    /// Offers a row; kept when it beats the k-th best (ties keep the earlier row).
    pub fn offer(&mut self, score: f32, row: usize) {
        if self.best.len() == self.k && self.best.last().is_some_and(|w| score <= w.0) {
            return;
        }
        let at = self.best.partition_point(|b| b.0 >= score);
        self.best.insert(at, (score, row));
        self.best.truncate(self.k);
    }

    /// (score, row), best first.
    pub fn best(&self) -> &[(f32, usize)] {
        &self.best
    }
}

/// Scores `block` (`n` rows of `dim`) against `queries` (`m` rows of `dim`) and offers every
/// row that `accept`s to each query's [`TopK`], as row `first_row + i`. The scan over the
/// scores is split across threads by query.
pub fn top_k_block(
    queries: &Tensor,
    block: &[f32],
    dim: usize,
    first_row: usize,
    accept: &(dyn Fn(usize) -> bool + Sync),
    tops: &mut [TopK],
) -> candle_core::Result<()> {
    let n = block.len() / dim;
    if n == 0 {
        return Ok(());
    }
    let x = Tensor::from_slice(block, (n, dim), &Device::Cpu)?;
    let scores = queries.matmul(&x.t()?)?.flatten_all()?.to_vec1::<f32>()?;
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per = tops.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (chunk_index, chunk) in tops.chunks_mut(per).enumerate() {
            let scores = &scores;
            scope.spawn(move || {
                for (j, top) in chunk.iter_mut().enumerate() {
                    let q = chunk_index * per + j;
                    let row_scores = &scores[q * n..(q + 1) * n];
                    for (i, &s) in row_scores.iter().enumerate() {
                        if accept(i) {
                            top.offer(s, first_row + i);
                        }
                    }
                }
            });
        }
    });
    Ok(())
}

/// The exact `k` nearest papers to each query (cosine: queries and shards are L2-normalised)
/// among the run's parquet shards, only those matching `filter` when given.
pub fn exact_top_k(
    db: &RunDb,
    queries: &[Vec<f32>],
    k: usize,
    filter: Option<&PayloadFilter>,
) -> Result<Vec<Vec<ExactHit>>, ExactError> {
    let dim = queries.first().map_or(0, Vec::len);
    let flat: Vec<f32> = queries.iter().flat_map(|q| normalised(q)).collect();
    let q = Tensor::from_slice(&flat, (queries.len(), dim.max(1)), &Device::Cpu)?;
    let mut tops = vec![TopK::new(k); queries.len()];
    // Paper ids of the rows some query kept, by global row; the rest are never materialised.
    let mut ids: std::collections::HashMap<usize, String> = Default::default();
    let mut first_row = 0usize;
    for shard in db.all_shards()? {
        for batch in read_from(&db.dir().join(&shard.path), 0, BLOCK_ROWS)? {
            let batch = batch.map_err(|e| embedfleet_upload::shards::ShardReadError {
                path: db.dir().join(&shard.path),
                message: e.to_string(),
            })?;
            let points = PointsBatch::from_record_batch(&batch)?;
            if points.dim() != dim {
                return Err(ExactError::Dim {
                    expected: points.dim(),
                    found: dim,
                });
            }
            let accept = |i: usize| {
                filter.is_none_or(|f| {
                    let p = points.point(i);
                    matches(f, p.year, p.source)
                })
            };
            top_k_block(&q, points.vectors(), dim, first_row, &accept, &mut tops)?;
            for top in &tops {
                for &(_, row) in top.best() {
                    if row >= first_row && !ids.contains_key(&row) {
                        ids.insert(row, points.point(row - first_row).paper_id.to_string());
                    }
                }
            }
            first_row += points.len();
        }
    }
    Ok(tops
        .iter()
        .map(|t| {
            t.best()
                .iter()
                .map(|&(score, row)| ExactHit {
                    paper_id: ids[&row].clone(),
                    score,
                })
                .collect()
        })
        .collect())
}

/// `v / |v|` (a zero vector stays zero).
pub fn normalised(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        return v.to_vec();
    }
    v.iter().map(|x| x / norm).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_keeps_the_best_in_order() {
        let mut t = TopK::new(3);
        for (s, r) in [(0.1, 0), (0.9, 1), (0.5, 2), (0.7, 3), (0.2, 4), (0.9, 5)] {
            t.offer(s, r);
        }
        assert_eq!(t.best(), &[(0.9, 1), (0.9, 5), (0.7, 3)]);
    }

    #[test]
    fn block_scores_equal_dot_products_and_respect_accept() {
        let dim = 3;
        let queries = [[1.0f32, 0.0, 0.0], [0.0, 1.0, 0.0]];
        let block = [
            0.9f32, 0.1, 0.0, 0.1, 0.9, 0.0, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0,
        ];
        let flat: Vec<f32> = queries.iter().flatten().copied().collect();
        let q = Tensor::from_slice(&flat, (2, dim), &Device::Cpu).unwrap();
        let mut tops = vec![TopK::new(2); 2];
        top_k_block(&q, &block, dim, 10, &|i| i != 3, &mut tops).unwrap();
        let rows = |t: &TopK| t.best().iter().map(|b| b.1).collect::<Vec<_>>();
        assert_eq!(rows(&tops[0]), [10, 12], "row 13 is filtered out");
        assert_eq!(rows(&tops[1]), [11, 12]);
        assert!((tops[0].best()[0].0 - 0.9).abs() < 1e-6);
    }
}
