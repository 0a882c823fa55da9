//! `embedfleet tune --queries`: the query workload's batch size and requests in flight, found
//! like the upload's (a sweep of batch sizes at one request in flight, then of requests in
//! flight at the chosen size; the smallest within 5 % of the fastest), on queries sampled from
//! the run's own vectors. Saved in run.db for `query`.

use crate::eval::{sample_queries, EvalError};
use crate::search::search_batched;
use embedfleet_core::rundb::RunDb;
use embedfleet_vectordb::tune::{two_stage_sweep, SweepPlan, Trial};
use embedfleet_vectordb::{SearchOptions, Sink};
use serde::{Deserialize, Serialize};

/// The run.db setting that holds [`TunedQueries`].
pub const TUNED_QUERIES_SETTING: &str = "query.tuned";

/// What `tune --queries` saved: `query` uses it unless told otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunedQueries {
    /// `edge` or `server`: used only for the same kind of target.
    pub sink: String,
    pub batch_size: usize,
    pub in_flight: usize,
    pub queries_per_s: f64,
}

/// How to tune the queries.
#[derive(Debug, Clone)]
pub struct QueryTuneOptions {
    pub collection: String,
    /// Queries per trial.
    pub sample: usize,
    pub k: usize,
    pub batch_sizes: Vec<usize>,
    pub in_flights: Vec<usize>,
    pub within: f64,
}

impl QueryTuneOptions {
    /// 256 queries, top 10, batches 1…64, 1…8 in flight, within 5 %.
    pub fn new(collection: impl Into<String>) -> Self {
        Self {
            collection: collection.into(),
            sample: 256,
            k: 10,
            batch_sizes: (0..7).map(|p| 1usize << p).collect(),
            in_flights: vec![1, 2, 4, 8],
            within: 0.05,
        }
    }
}

/// Every trial and the choice.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryTuneReport {
    pub trials: Vec<Trial>,
    pub batch_size: usize,
    pub in_flight: usize,
    pub queries_per_s: f64,
}

/// Runs both sweeps (see the module docs).
pub fn tune_queries(
    sink: &dyn Sink,
    db: &RunDb,
    options: &QueryTuneOptions,
) -> Result<QueryTuneReport, EvalError> {
    let queries = sample_queries(db, options.sample, 7)?;
    let search = SearchOptions::new(options.k);
    let trial = |sweep: &'static str, batch_size: usize, in_flight: usize| {
        let found = search_batched(
            sink,
            &options.collection,
            &queries,
            &search,
            batch_size,
            in_flight,
        )?;
        Ok::<_, EvalError>(Trial {
            sweep,
            batch_size,
            in_flight,
            points: queries.len(),
            secs: found.elapsed.as_secs_f64(),
        })
    };
    let plan = SweepPlan {
        batch_sizes: &options.batch_sizes,
        in_flights: &options.in_flights,
        within: options.within,
        fallback_batch_size: 16,
        reuse_one_in_flight: false,
    };
    let swept = two_stage_sweep(&plan, trial)?;
    Ok(QueryTuneReport {
        trials: swept.trials,
        batch_size: swept.batch_size,
        in_flight: swept.in_flight,
        queries_per_s: swept.per_s,
    })
}

/// The trials as a markdown table.
pub fn markdown(report: &QueryTuneReport) -> String {
    let mut out =
        String::from("| sweep | batch size | in flight | queries/s |\n|---|---|---|---|\n");
    for t in &report.trials {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} |\n",
            t.sweep,
            t.batch_size,
            t.in_flight,
            t.points_per_s()
        ));
    }
    out
}
