//! The run's latest `eval` (`eval/latest.json`, written by `embedfleet eval`): recall against
//! latency per search setting, for the report page. Read as plain JSON: the orchestrator does
//! not link the query crate; only the fields shown are read, the rest is ignored.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalTable {
    pub collection: String,
    pub k: u32,
    pub queries: u64,
    pub rows: Vec<EvalRow>,
    /// How much of the collection an HNSW graph served (absent from older evals).
    #[serde(default)]
    pub index: Option<EvalIndex>,
}

/// `eval`'s `index`: with no point in an indexed segment every row was an exact search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalIndex {
    pub points: u64,
    pub indexed_vectors: u64,
    #[serde(default)]
    pub indexing_threshold_kb: Option<u64>,
    pub exact_only: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRow {
    pub filter: String,
    pub search: String,
    pub recall: f64,
    pub latency: EvalLatency,
    pub queries_per_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalLatency {
    pub p50_ms: f64,
    pub p95_ms: f64,
}

/// `eval --compare-postgres` (`eval/compare.json`): two databases side by side, each at the
/// least search effort reaching the recall floor, per filter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareTable {
    pub k: u32,
    pub floor: f64,
    pub queries: u64,
    pub rows: Vec<CompareRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    pub database: String,
    pub index: String,
    pub filter: String,
    pub selectivity: f64,
    pub tuning: String,
    pub reached_floor: bool,
    pub recall: f64,
    pub short_share: f64,
    pub queries_per_s: f64,
    pub latency: CompareLatency,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareLatency {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

/// The run's latest comparison; `None` when it has none (or one this build cannot read).
pub fn compare(run_dir: &Path) -> Option<CompareTable> {
    let path = embedfleet_core::RunLayout::new(run_dir).eval_compare_json();
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The latest eval of the run in `run_dir`; `None` when it has none (or one this build cannot
/// read: the page then leaves the section out).
pub fn latest(run_dir: &Path) -> Option<EvalTable> {
    let path = embedfleet_core::RunLayout::new(run_dir).eval_latest_json();
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}
