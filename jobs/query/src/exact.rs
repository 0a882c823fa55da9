//! Exact top-k by brute force over the run's parquet shards: the truth that recall is measured
//! against. Shards are streamed in blocks of rows; each block's scores against every query are
//! one f32 matrix product (the machine's OpenBLAS when it has one, else candle's GEMM; all
//! cores either way), and each query keeps its k best.

use crate::filter::matches;
use crate::held::HeldRows;
use candle_core::{Device, Tensor};
use embedfleet_core::rundb::RunDb;
use embedfleet_vectordb::shards::read_from;
use embedfleet_vectordb::{PayloadFilter, PointsBatch};
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
    Shard(#[from] embedfleet_vectordb::shards::ShardReadError),
    #[error("failed to read a parquet shard: {0}")]
    Points(embedfleet_vectordb::UploadError),
    #[error("the matrix product failed: {0}")]
    Compute(candle_core::Error),
    #[error("a query has {found} components, the parquet shards {expected}")]
    Dim { expected: usize, found: usize },
}

/// Said in the message, so not returned as the source (`embedfleet_core::cause`): no
/// `#[from]`, which would return it.
impl From<candle_core::Error> for ExactError {
    fn from(e: candle_core::Error) -> Self {
        Self::Compute(e)
    }
}

/// Said in the message, so not returned as the source (`embedfleet_core::cause`): no
/// `#[from]`, which would return it.
impl From<embedfleet_vectordb::UploadError> for ExactError {
    fn from(e: embedfleet_vectordb::UploadError) -> Self {
        Self::Points(e)
    }
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

/// Scores `block` (`n` rows of `dim`) against `queries` (`m` rows of `dim`, row after row)
/// and offers every row that `accept`s to each query's [`TopK`], as row `first_row + i`. The
/// scan over the scores is split across threads by query.
pub fn top_k_block(
    queries: &[f32],
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
    let scores = scores(queries, block, dim)?;
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

/// `queries · blockᵀ`, row-major (`m × n`): the machine's OpenBLAS when it has one (the
/// models' `cpu::blas`, its rows split over the same pool as the model's kernels), else
/// candle's GEMM.
fn scores(queries: &[f32], block: &[f32], dim: usize) -> candle_core::Result<Vec<f32>> {
    let (m, n) = (queries.len() / dim, block.len() / dim);
    if let Some(sgemm) = embedfleet_models::cpu::blas::sgemm() {
        let mut out = vec![0f32; m * n];
        sgemm.a_bt(queries, dim, block, dim, m, n, dim, &mut out);
        return Ok(out);
    }
    let q = Tensor::from_slice(queries, (m, dim), &Device::Cpu)?;
    let x = Tensor::from_slice(block, (n, dim), &Device::Cpu)?;
    q.matmul(&x.t()?)?.flatten_all()?.to_vec1::<f32>()
}

/// Which matrix product the exact search uses: `openblas` or `candle`.
pub fn gemm_backend() -> &'static str {
    embedfleet_models::cpu::blas::backend()
}

/// The exact `k` nearest papers to each query (cosine: queries and shards are L2-normalised)
/// among the rows of the run's parquet shards that the collection holds (`held`: not withheld
/// by a release, not deleted), only those matching `filter` when given.
pub fn exact_top_k(
    db: &RunDb,
    queries: &[Vec<f32>],
    k: usize,
    filter: Option<&PayloadFilter>,
    held: &HeldRows,
) -> Result<Vec<Vec<ExactHit>>, ExactError> {
    let dim = queries.first().map_or(0, Vec::len);
    let q: Vec<f32> = queries.iter().flat_map(|q| normalised(q)).collect();
    let mut tops = vec![TopK::new(k); queries.len()];
    // Paper ids of the rows some query kept, by global row; the rest are never materialised.
    let mut ids: std::collections::HashMap<usize, String> = Default::default();
    for_each_block(db, |first_row, batch, points| {
        if held.skips_batch(batch) {
            return Ok(true);
        }
        if points.dim() != dim {
            return Err(ExactError::Dim {
                expected: points.dim(),
                found: dim,
            });
        }
        let all_held = held.holds_all_of(batch);
        let accept = |i: usize| {
            let p = points.point(i);
            (all_held || held.holds(batch, p.paper_id))
                && filter.is_none_or(|f| matches(f, p.year, p.source))
        };
        top_k_block(&q, points.vectors(), dim, first_row, &accept, &mut tops)?;
        for top in &tops {
            for &(_, row) in top.best() {
                if row >= first_row && !ids.contains_key(&row) {
                    ids.insert(row, points.point(row - first_row).paper_id.to_string());
                }
            }
        }
        Ok(true)
    })?;
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

/// Hands every block of [`BLOCK_ROWS`] rows of the run's parquet shards to `visit`, in run
/// order, with the run-wide row number of its first row and its batch; `visit` returns `false`
/// to stop.
pub(crate) fn for_each_block(
    db: &RunDb,
    mut visit: impl FnMut(usize, i64, &PointsBatch) -> Result<bool, ExactError>,
) -> Result<(), ExactError> {
    let mut first_row = 0usize;
    for shard in db.all_shards()? {
        let path = db.dir().join(&shard.path);
        for batch in read_from(&path, 0, BLOCK_ROWS)? {
            let batch = batch.map_err(|e| embedfleet_vectordb::shards::ShardReadError {
                path: path.clone(),
                message: e.to_string(),
            })?;
            let points = PointsBatch::from_record_batch(&batch)?;
            if !visit(first_row, shard.batch_id.0, &points)? {
                return Ok(());
            }
            first_row += points.len();
        }
    }
    Ok(())
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
        let q: Vec<f32> = queries.iter().flatten().copied().collect();
        let mut tops = vec![TopK::new(2); 2];
        top_k_block(&q, &block, dim, 10, &|i| i != 3, &mut tops).unwrap();
        let rows = |t: &TopK| t.best().iter().map(|b| b.1).collect::<Vec<_>>();
        assert_eq!(rows(&tops[0]), [10, 12], "row 13 is filtered out");
        assert_eq!(rows(&tops[1]), [11, 12]);
        assert!((tops[0].best()[0].0 - 0.9).abs() < 1e-6);
    }
}

#[cfg(test)]
mod gemm_tests {
    use super::*;

    #[test]
    fn both_matrix_products_give_the_same_scores() {
        let dim = 37;
        let q: Vec<f32> = (0..5 * dim).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let x: Vec<f32> = (0..9 * dim).map(|i| ((i * 3) % 13) as f32 - 6.0).collect();
        let naive: Vec<f32> = (0..5)
            .flat_map(|a| {
                let (q, x) = (&q, &x);
                (0..9).map(move |b| (0..dim).map(|d| q[a * dim + d] * x[b * dim + d]).sum())
            })
            .collect();
        assert_eq!(scores(&q, &x, dim).unwrap(), naive, "{}", gemm_backend());
        let tq = Tensor::from_slice(&q, (5, dim), &Device::Cpu).unwrap();
        let tx = Tensor::from_slice(&x, (9, dim), &Device::Cpu).unwrap();
        let candle: Vec<f32> = tq
            .matmul(&tx.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(candle, naive);
    }
}
