//! The eval's files, one definition for the writer and the readers: `eval/latest.json`
//! (`embedfleet eval`, [`EvalReport`]) and `eval/compare.json` (`eval --compare-postgres`,
//! [`CompareReport`]), written by the query crate and read by the report page. Both are stable:
//! fields are only ever added.

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (all zero when there are none).
    pub fn of(samples: &[Duration]) -> Self {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let at = |p: f64| {
            if ms.is_empty() {
                return 0.0;
            }
            let rank = ((p / 100.0) * ms.len() as f64).ceil().max(1.0) as usize;
            ms[rank.min(ms.len()) - 1]
        };
        Percentiles {
            p50_ms: at(50.0),
            p95_ms: at(95.0),
            p99_ms: at(99.0),
        }
    }
}

/// One line of the table: one way of searching, under one filter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRow {
    /// `none`, or the filter's expressions joined by ` & `.
    pub filter: String,
    /// `exact`, `default` (the collection's ef) or `ef=N`.
    pub search: String,
    pub ef: Option<u64>,
    /// Mean over queries of |answers ∩ exact| / |exact|.
    pub recall: f64,
    /// Share of queries that got fewer results than the exact search found (at most k).
    pub short_share: f64,
    pub latency: Percentiles,
    pub queries_per_s: f64,
}

/// `eval --json`: stable; fields are only ever added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub format_version: u32,
    pub collection: String,
    pub k: usize,
    pub queries: usize,
    /// Share of the run's papers the filter lets through (`None` without a filter).
    pub filter_selectivity: Option<f64>,
    pub rows: Vec<EvalRow>,
    /// How much of the collection an HNSW graph served when it was searched (absent in
    /// reports made before it was recorded, and for a database that does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexCoverage>,
}

/// The collection's points and how many of them sit in HNSW-indexed segments. Below Qdrant's
/// indexing threshold a segment has no graph and every search of it is exact, whatever its
/// `ef`: a table of such searches says nothing of HNSW's recall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexCoverage {
    pub points: u64,
    pub indexed_vectors: u64,
    /// Qdrant's indexing threshold in KB (`None` where the database has none).
    pub indexing_threshold_kb: Option<u64>,
    /// True when no point is in an indexed segment: every row is an exact search.
    pub exact_only: bool,
}

impl IndexCoverage {
    /// One sentence on what the table measured, `None` when every point is indexed.
    pub fn caveat(&self) -> Option<String> {
        let threshold = self
            .indexing_threshold_kb
            .map(|t| format!(", indexing threshold {t} KB"))
            .unwrap_or_default();
        if self.exact_only {
            let why = if self.indexing_threshold_kb.is_some() {
                "a collection this small is never indexed: evaluate a bigger one"
            } else {
                // A database without a threshold (pgvector) has none until the load's end built it.
                "its load did not finish: `embedfleet upload` again builds the index"
            };
            Some(format!(
                "exact search: the collection has no HNSW index ({} points{threshold}), so every \
                 row below searched exactly, whatever its ef; its recall says nothing of HNSW \
                 ({why})",
                self.points
            ))
        } else if self.indexed_vectors < self.points {
            Some(format!(
                "partly indexed: {} of {} points are in HNSW-indexed segments{threshold}; the \
                 rest are searched exactly",
                self.indexed_vectors, self.points
            ))
        } else {
            None
        }
    }
}

/// One database and index under one filter, at the least effort reaching the floor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    pub database: String,
    /// `hnsw (m=16, ef_construction=100)`, `ivfflat (lists=200)`, or `none (exact search)`:
    /// no index, or one that covers no point yet.
    pub index: String,
    /// `none`, or the filter's expressions.
    pub filter: String,
    /// Share of the collection's points the filter lets through.
    pub selectivity: f64,
    /// The tuning the row was measured at: `ef=64`, `probes=8`, `defaults`.
    pub tuning: String,
    /// True when the row's recall is at the floor or above; false: the most effort tried.
    pub reached_floor: bool,
    pub recall: f64,
    /// Share of queries answered with fewer rows than the exact search found.
    pub short_share: f64,
    pub queries_per_s: f64,
    pub latency: Percentiles,
}

/// `eval --compare-postgres --json`: stable; fields are only ever added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    pub format_version: u32,
    pub k: usize,
    pub floor: f64,
    pub queries: usize,
    pub rows: Vec<CompareRow>,
}

/// The latest eval of the run in `run_dir`; `None` when it has none (or one this build cannot
/// read: the report page then leaves the section out).
pub fn latest(run_dir: &Path) -> Option<EvalReport> {
    let path = crate::RunLayout::new(run_dir).eval_latest_json();
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The run's latest comparison; `None` when it has none (or one this build cannot read).
pub fn compare(run_dir: &Path) -> Option<CompareReport> {
    let path = crate::RunLayout::new(run_dir).eval_compare_json();
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}
