//! `embedfleet eval`: recall@k of the collection's answers against the exact top-k (brute
//! force over the run's parquet shards, cached in `<run-dir>/eval/`), per HNSW `ef`, with the
//! share of queries that got fewer results than exist and latency percentiles; unfiltered and,
//! when a filter is given, filtered (the same filter applied to the exact search).

use crate::exact::{exact_top_k, for_each_block, normalised, ExactError, ExactHit};
use crate::filter::run_filters;
use crate::held::HeldRows;
use crate::search::search_batched;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::{atomic, RunLayout};
use embedfleet_vectordb::{CountRequest, PayloadFilter, SearchOptions, Sink, UploadError};
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The `ef` values swept by default.
pub const DEFAULT_EFS: [u64; 5] = [16, 32, 64, 128, 256];

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Exact(#[from] ExactError),
    #[error("search failed: {0}")]
    Search(UploadError),
    #[error(transparent)]
    RunDb(#[from] embedfleet_core::rundb::RunDbError),
    #[error("failed to write {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("the run has no parquet shards to sample queries from: embed it first")]
    NoShards,
    #[error("{0}")]
    Filter(String),
    #[error("the collection `{collection}` does not exist at {target}: nothing was uploaded into it yet (`embedfleet upload --run-dir DIR`), or give the collection and target the run uploaded into")]
    NoCollection { collection: String, target: String },
}

/// Said in the message, so not returned as the source (`embedfleet_core::cause`): no
/// `#[from]`, which would return it.
impl From<UploadError> for EvalError {
    fn from(e: UploadError) -> Self {
        Self::Search(e)
    }
}

/// What to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub collection: String,
    pub k: usize,
    pub efs: Vec<u64>,
    /// `--filter` expressions; the filtered rows are reported beside the unfiltered ones.
    pub filters: Vec<String>,
    /// Queries per search request and requests in flight (1 and 1 by default, so each
    /// latency is one query's).
    pub batch_size: usize,
    pub in_flight: usize,
}

pub use embedfleet_core::eval_tables::{EvalReport, EvalRow, IndexCoverage, Percentiles};

/// How much of the collection `info` describes sits in HNSW-indexed segments.
fn coverage_of(info: &embedfleet_vectordb::CollectionInfo) -> IndexCoverage {
    IndexCoverage {
        points: info.points,
        indexed_vectors: info.indexed_vectors,
        indexing_threshold_kb: info.qdrant.map(|q| q.indexing_threshold_kb),
        exact_only: info.points > 0 && info.indexed_vectors == 0,
    }
}

/// Evaluates `queries` (see the module docs); writes `eval/latest.json` and `eval/latest.md`.
pub fn eval(
    sink: &dyn Sink,
    db: &RunDb,
    queries: &[Vec<f32>],
    options: &EvalOptions,
) -> Result<EvalReport, EvalError> {
    let filter = run_filters(db, &options.filters).map_err(EvalError::Filter)?;
    let info =
        sink.collection_info(&options.collection)?
            .ok_or_else(|| EvalError::NoCollection {
                collection: options.collection.clone(),
                target: sink.target(),
            })?;
    let mut report = EvalReport {
        format_version: 1,
        collection: options.collection.clone(),
        k: options.k,
        queries: queries.len(),
        filter_selectivity: None,
        rows: Vec::new(),
        index: Some(coverage_of(&info)),
    };
    let mut filters: Vec<(String, Option<PayloadFilter>)> = vec![("none".into(), None)];
    if let Some(f) = filter {
        let all = sink.count(CountRequest::new(&options.collection))?.max(1);
        let passing = sink.count(CountRequest::new(&options.collection).filter(Some(&f)))?;
        report.filter_selectivity = Some(passing as f64 / all as f64);
        filters.push((options.filters.join(" & "), Some(f)));
    }
    // The truth is over what the collection holds now: the live papers of its release, less
    // the deleted ones.
    let held = HeldRows::of(db, sink, &options.collection)?;
    for (name, filter) in filters {
        let truth = cached_truth(db, queries, options.k, filter.as_ref(), &held)?;
        let mut ways = vec![
            ("exact".to_string(), None, true),
            ("default".into(), None, false),
        ];
        ways.extend(
            options
                .efs
                .iter()
                .map(|&ef| (format!("ef={ef}"), Some(ef), false)),
        );
        for (search, ef, exact) in ways {
            let search_options = SearchOptions {
                k: options.k,
                filter: filter.clone(),
                hnsw_ef: ef,
                exact,
                ..SearchOptions::default()
            };
            let found = search_batched(
                sink,
                &options.collection,
                queries,
                &search_options,
                options.batch_size,
                options.in_flight,
            )?;
            let (recall, short_share) = score(&truth, &found.hits);
            report.rows.push(EvalRow {
                filter: name.clone(),
                search,
                ef,
                recall,
                short_share,
                latency: Percentiles::of(&found.batch_latencies),
                queries_per_s: queries.len() as f64 / found.elapsed.as_secs_f64().max(1e-9),
            });
        }
    }
    write_latest(db, &report)?;
    Ok(report)
}

/// How close to the exact k-th score an answer may be and still count as a tie with it: two
/// papers that close are interchangeable at the last place, and which of them a database's
/// exact search ranks k-th depends on its summation order (SIMD lanes, threads), not on the
/// search. Cosines of normalised f32 vectors agree to about 1e-6 between such orders.
const TIE_EPS: f32 = 1e-5;

/// Mean recall and the share of short answers. An answer counts when it is one of the exact
/// top-k, or ties with the k-th (within [`TIE_EPS`]), at most k in all. One scored above the
/// k-th and not in the top-k is wrong whatever its score: a paper the truth leaves out.
pub(crate) fn score(
    truth: &[Vec<ExactHit>],
    answers: &[Vec<embedfleet_vectordb::Hit>],
) -> (f64, f64) {
    let (mut recall, mut short, mut counted) = (0.0, 0usize, 0usize);
    for (exact, got) in truth.iter().zip(answers) {
        if exact.is_empty() {
            continue;
        }
        counted += 1;
        let want: HashSet<&str> = exact.iter().map(|h| h.paper_id.as_str()).collect();
        let last = exact.last().map_or(f32::INFINITY, |h| h.score);
        let hits = got
            .iter()
            .filter(|h| {
                h.paper_id.as_deref().is_some_and(|id| want.contains(id))
                    || (h.score - last).abs() <= TIE_EPS
            })
            .count()
            .min(want.len());
        recall += hits as f64 / want.len() as f64;
        short += usize::from(got.len() < exact.len());
    }
    let n = counted.max(1) as f64;
    (recall / n, short as f64 / n)
}

/// The exact top-k, from `eval/exact-<key>.json` when an earlier eval computed it for the same
/// queries, k, filter, parquet shards and rows held (the collection's release, the rows
/// releases withheld and the papers deleted: [`HeldRows::digest`]); computed again otherwise.
pub(crate) fn cached_truth(
    db: &RunDb,
    queries: &[Vec<f32>],
    k: usize,
    filter: Option<&PayloadFilter>,
    held: &HeldRows,
) -> Result<Vec<Vec<ExactHit>>, EvalError> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for q in queries {
        for x in q {
            h.update(&x.to_le_bytes());
        }
    }
    h.update(format!("{k} {filter:?}").as_bytes());
    h.update(&held.digest().to_le_bytes());
    for shard in db.all_shards()? {
        h.update(shard.sha256.as_bytes());
    }
    let dir = eval_dir(db);
    let path = dir.join(format!("exact-{:016x}.json", h.digest()));
    if let Some(cached) = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
    {
        return Ok(cached);
    }
    let truth = exact_top_k(db, queries, k, filter, held)?;
    let json = serde_json::to_vec(&truth).expect("hits serialise. This is a bug.");
    write_file(&dir, &path, &json)?;
    Ok(truth)
}

fn eval_dir(db: &RunDb) -> PathBuf {
    RunLayout::new(db.dir()).eval_dir()
}

fn write_file(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), EvalError> {
    let io = |source| EvalError::Io {
        path: path.into(),
        cause: source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    atomic::write(path, bytes).map_err(io)
}

fn write_latest(db: &RunDb, report: &EvalReport) -> Result<(), EvalError> {
    let dir = eval_dir(db);
    let json = serde_json::to_vec_pretty(report).expect("the report serialises. This is a bug.");
    write_file(&dir, &dir.join("latest.json"), &json)?;
    write_file(&dir, &dir.join("latest.md"), render(report).as_bytes())
}

/// The report as a markdown table.
pub fn render(report: &EvalReport) -> String {
    let mut out = format!(
        "recall@{} of `{}` over {} queries{}\n\n| filter | search | recall@{} | short answers | p50 ms | p95 ms | p99 ms | queries/s |\n|---|---|---|---|---|---|---|---|\n",
        report.k,
        report.collection,
        report.queries,
        report
            .filter_selectivity
            .map(|s| format!(" (the filter passes {:.2} % of points)", s * 100.0))
            .unwrap_or_default(),
        report.k
    );
    if let Some(caveat) = report.index.as_ref().and_then(IndexCoverage::caveat) {
        // Above the table, where a reader of the dataset card meets it first.
        out = format!("**{caveat}**\n\n{out}");
    }
    for r in &report.rows {
        out.push_str(&format!(
            "| {} | {} | {:.4} | {:.1} % | {:.2} | {:.2} | {:.2} | {:.0} |\n",
            r.filter,
            r.search,
            r.recall,
            r.short_share * 100.0,
            r.latency.p50_ms,
            r.latency.p95_ms,
            r.latency.p99_ms,
            r.queries_per_s
        ));
    }
    out
}

/// `n` papers' own vectors from the parquet shards (chosen with `seed`), each moved by a small
/// seeded perturbation (a random direction of norm 0.1) and renormalised: queries near real
/// papers, with no model and no terms file.
pub fn sample_queries(db: &RunDb, n: usize, seed: u64) -> Result<Vec<Vec<f32>>, EvalError> {
    let shards = db.all_shards()?;
    let total: u64 = shards.iter().map(|s| s.rows).sum();
    if total == 0 {
        return Err(EvalError::NoShards);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut wanted: Vec<u64> =
        rand::seq::index::sample(&mut rng, total as usize, n.min(total as usize))
            .into_iter()
            .map(|i| i as u64)
            .collect();
    wanted.sort_unstable();
    let mut picked = Vec::with_capacity(wanted.len());
    let mut next = wanted.iter().map(|&r| r as usize).peekable();
    for_each_block(db, |first_row, _, points| {
        let end = first_row + points.len();
        while let Some(row) = next.next_if(|&r| r < end) {
            picked.push(points.point(row - first_row).vector.to_vec());
        }
        Ok(next.peek().is_some())
    })?;
    Ok(picked.iter().map(|v| perturb(v, &mut rng)).collect())
}

fn perturb(v: &[f32], rng: &mut impl Rng) -> Vec<f32> {
    // Box-Muller normals: a uniformly random direction, scaled to norm 0.1.
    let noise: Vec<f32> = (0..v.len())
        .map(|_| {
            let (u1, u2): (f32, f32) = (rng.random::<f32>().max(1e-12), rng.random());
            (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect();
    let noise = normalised(&noise);
    let moved: Vec<f32> = v.iter().zip(&noise).map(|(a, b)| a + 0.1 * b).collect();
    normalised(&moved)
}

/// The path of the recall-against-latency plot when none is given.
pub fn default_plot_path(run_dir: &Path) -> PathBuf {
    RunLayout::new(run_dir).eval_dir().join("recall.png")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(id: &str, score: f32) -> embedfleet_vectordb::Hit {
        embedfleet_vectordb::Hit {
            paper_id: Some(id.into()),
            score,
            ..embedfleet_vectordb::Hit::default()
        }
    }

    fn exact(id: &str, score: f32) -> ExactHit {
        ExactHit {
            paper_id: id.into(),
            score,
        }
    }

    #[test]
    fn a_tie_at_the_last_place_counts_and_a_paper_the_truth_left_out_does_not() {
        let truth = vec![vec![exact("a", 0.9), exact("b", 0.8)]];
        // `c` ties with the k-th (`b`) to within float noise: interchangeable.
        let (recall, _) = score(&truth, &[vec![hit("a", 0.9), hit("c", 0.800_003)]]);
        assert_eq!(recall, 1.0);
        // `w` ranks first but is no answer (withdrawn, deleted): wrong, however well it scores.
        let (recall, _) = score(&truth, &[vec![hit("w", 0.95), hit("a", 0.9)]]);
        assert_eq!(recall, 0.5);
        let (recall, short) = score(&truth, &[vec![hit("a", 0.9)]]);
        assert_eq!((recall, short), (0.5, 1.0));
    }
}
