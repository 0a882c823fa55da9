//! Each stage after embedding records what it did for the run's page (`report --html`, the
//! owner's `report.html`): the upload's rate, `tune`'s trials, the query workload
//! ([`embedfleet_orchestrator::report::activity`]). A record that cannot be written is a
//! warning: the stage's work is done and kept either way.

use embedfleet_core::owner::unix_now;
use embedfleet_core::rundb::RunDb;
use embedfleet_orchestrator::report::activity::{
    self, QueryRun, TuneRun, TuneTrial, UploadRun, QUERY_RUN_SETTING, TUNE_RUN_SETTING,
};
use embedfleet_query::workload::QueryReport;
use embedfleet_vectordb::tune::TuneReport;
use embedfleet_vectordb::{Sink, UploadOptions, UploadReport};

/// The upload `report` into `options.spec.name` of `sink`, when it sent anything.
pub fn record_upload(db: &RunDb, sink: &dyn Sink, options: &UploadOptions, report: &UploadReport) {
    if report.send.points == 0 {
        return;
    }
    let run = UploadRun {
        collection: embedfleet_vectordb::progress_key(sink, &options.spec.name),
        points: report.send.points,
        seconds: report.send.elapsed.as_secs_f64(),
        batch_size: options.batch_size,
        in_flight: options.in_flight,
        workers: report.workers,
        ended_unix_s: unix_now(),
    };
    if let Err(e) = activity::record_upload(db, run) {
        tracing::warn!("the upload's rate is not kept for the report: {e}");
    }
}

/// `tune`'s trials into the sink of kind `sink`.
pub fn record_tune(db: &RunDb, sink: &str, report: &TuneReport) {
    let run = TuneRun {
        sink: sink.to_string(),
        trials: report
            .trials
            .iter()
            .map(|t| TuneTrial {
                sweep: t.sweep.to_string(),
                batch_size: t.batch_size,
                in_flight: t.in_flight,
                points_per_s: t.points_per_s(),
            })
            .collect(),
        batch_size: report.batch_size,
        in_flight: report.in_flight,
        points_per_s: report.points_per_s,
        ended_unix_s: unix_now(),
    };
    if let Err(e) = db.set_setting(TUNE_RUN_SETTING, &run) {
        tracing::warn!("tune's trials are not kept for the report: {e}");
    }
}

/// A query run against `collection`.
pub fn record_query(db: &RunDb, collection: &str, report: &QueryReport) {
    let run = QueryRun {
        collection: collection.to_string(),
        queries: report.queries,
        already_done: report.already_done,
        rows: report.rows,
        embed_s: report.embed.as_secs_f64(),
        search_s: report.search.as_secs_f64(),
        queries_per_s: report.queries_per_s(),
        p50_ms: report.latency.p50_ms,
        p95_ms: report.latency.p95_ms,
        p99_ms: report.latency.p99_ms,
        ended_unix_s: unix_now(),
    };
    if let Err(e) = db.set_setting(QUERY_RUN_SETTING, &run) {
        tracing::warn!("the query run is not kept for the report: {e}");
    }
}
