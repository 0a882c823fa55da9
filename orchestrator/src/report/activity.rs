//! What the stages after embedding last did, as run.db keeps it for the page: the upload's
//! rate, `tune`'s trials, the query workload. Each command records its own run when it ends
//! (a setting of run.db: one row whatever the run's size), so the page never scans or reads
//! files others could have planted to show them.

use serde::{Deserialize, Serialize};

/// run.db setting: the last upload into each collection ([`UploadRun`]s).
pub const UPLOAD_RUNS_SETTING: &str = "report.upload_runs";
/// run.db setting: the last `tune` ([`TuneRun`]).
pub const TUNE_RUN_SETTING: &str = "report.tune_run";
/// run.db setting: the last query run ([`QueryRun`]).
pub const QUERY_RUN_SETTING: &str = "report.query_run";

/// One upload's sending into one collection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UploadRun {
    /// `name@target`, as `status` names it.
    pub collection: String,
    /// Points this upload sent and had acknowledged (not those an earlier one had).
    pub points: u64,
    /// Seconds of sending.
    pub seconds: f64,
    pub batch_size: usize,
    pub in_flight: usize,
    /// Processes that sent.
    pub workers: u64,
    pub ended_unix_s: f64,
}

impl UploadRun {
    pub fn points_per_s(&self) -> f64 {
        self.points as f64 / self.seconds.max(1e-9)
    }
}

/// One trial of `tune`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneTrial {
    /// `batch` or `in_flight`: what this trial varied.
    pub sweep: String,
    pub batch_size: usize,
    pub in_flight: usize,
    pub points_per_s: f64,
}

/// `tune`'s trials and what it chose.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneRun {
    /// The sink it measured (`edge`, `server`).
    pub sink: String,
    pub trials: Vec<TuneTrial>,
    pub batch_size: usize,
    pub in_flight: usize,
    pub points_per_s: f64,
    pub ended_unix_s: f64,
}

/// One run of the query workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryRun {
    pub collection: String,
    /// Terms in the workload, and those an earlier run had searched.
    pub queries: u64,
    pub already_done: u64,
    /// Result rows this run wrote.
    pub rows: u64,
    /// Seconds embedding the terms (with the query instruction) and searching.
    pub embed_s: f64,
    pub search_s: f64,
    pub queries_per_s: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub ended_unix_s: f64,
}

/// Records `run` as the last upload into its collection.
pub fn record_upload(
    db: &embedfleet_core::rundb::RunDb,
    run: UploadRun,
) -> Result<(), embedfleet_core::rundb::RunDbError> {
    let mut runs: Vec<UploadRun> = db.setting(UPLOAD_RUNS_SETTING)?.unwrap_or_default();
    runs.retain(|r| r.collection != run.collection);
    runs.push(run);
    db.set_setting(UPLOAD_RUNS_SETTING, &runs)
}

/// What the page shows of the stages after embedding, read from run.db.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Activity {
    pub upload_runs: Vec<UploadRun>,
    pub tune: Option<TuneRun>,
    pub query: Option<QueryRun>,
}

impl Activity {
    /// What run.db holds; a setting that does not read (a newer embedfleet's) is left out.
    pub fn read(db: &embedfleet_core::rundb::RunDb) -> Self {
        Self {
            upload_runs: db
                .setting(UPLOAD_RUNS_SETTING)
                .ok()
                .flatten()
                .unwrap_or_default(),
            tune: db.setting(TUNE_RUN_SETTING).ok().flatten(),
            query: db.setting(QUERY_RUN_SETTING).ok().flatten(),
        }
    }
}
