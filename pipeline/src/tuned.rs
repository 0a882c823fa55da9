//! What `tune` measured, kept in run.db for the kind of sink it was measured on, and the rule
//! `upload` and `query` batch by: as given, else as tuned for this kind of sink, else the
//! default (never below 1). The run.db keys are the stage crates' own; only this module reads
//! and writes them.

use embedfleet_core::pin::Resolved;
use embedfleet_core::rundb::RunDb;
use embedfleet_query::tune::{QueryTuneReport, TunedQueries, TUNED_QUERIES_SETTING};
use embedfleet_vectordb::tune::{TuneReport, TunedUpload, TUNED_SETTING};

use crate::error::Result;

/// A batch size and requests in flight, each with where it came from.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    pub batch_size: Resolved<usize>,
    pub in_flight: Resolved<usize>,
}

impl Batching {
    /// `given` (batch size, in flight), else `tuned`, else `defaults`; never below 1.
    pub fn resolve(
        given: (Option<usize>, Option<usize>),
        tuned: Option<(usize, usize)>,
        defaults: (usize, usize),
    ) -> Self {
        let batch_size = Resolved::of(given.0, tuned.map(|t| t.0), || defaults.0).map(|v| v.max(1));
        let in_flight = Resolved::of(given.1, tuned.map(|t| t.1), || defaults.1).map(|v| v.max(1));
        Self {
            batch_size,
            in_flight,
        }
    }

    /// Whether a tuned value was taken.
    pub fn tuned(&self) -> bool {
        self.batch_size.from_run() || self.in_flight.from_run()
    }
}

/// The upload's batching into a sink of `kind`, whose own batch size is `default_batch`
/// (`Sink::default_batch_size`) where neither the flags nor `tune` say one.
pub fn upload_batching(
    db: &RunDb,
    kind: &str,
    given: (Option<usize>, Option<usize>),
    default_batch: usize,
) -> Result<Batching> {
    let tuned: Option<TunedUpload> = db.setting(TUNED_SETTING)?;
    let tuned = tuned
        .filter(|t| t.sink == kind)
        .map(|t| (t.batch_size, t.in_flight));
    let defaults = (default_batch, embedfleet_vectordb::DEFAULT_IN_FLIGHT);
    Ok(Batching::resolve(given, tuned, defaults))
}

/// Keeps `tune`'s choice for uploads into a sink of `kind`.
pub fn save_upload(db: &RunDb, kind: &str, report: &TuneReport) -> Result<()> {
    let saved = TunedUpload {
        sink: kind.into(),
        batch_size: report.batch_size,
        in_flight: report.in_flight,
        points_per_s: report.points_per_s,
        sample_points: report.trials.first().map_or(0, |t| t.points),
    };
    Ok(db.set_setting(TUNED_SETTING, &saved)?)
}

/// The study's best query settings: 16 queries a request, 2 requests in flight.
const DEFAULT_QUERY_BATCHING: (usize, usize) = (16, 2);

/// The query workload's batching against a sink of `kind`.
pub fn query_batching(
    db: &RunDb,
    kind: &str,
    given: (Option<usize>, Option<usize>),
) -> Result<Batching> {
    let tuned: Option<TunedQueries> = db.setting(TUNED_QUERIES_SETTING)?;
    let tuned = tuned
        .filter(|t| t.sink == kind)
        .map(|t| (t.batch_size, t.in_flight));
    Ok(Batching::resolve(given, tuned, DEFAULT_QUERY_BATCHING))
}

/// Keeps `tune --queries`' choice for queries against a sink of `kind`.
pub fn save_queries(db: &RunDb, kind: &str, report: &QueryTuneReport) -> Result<()> {
    let saved = TunedQueries {
        sink: kind.into(),
        batch_size: report.batch_size,
        in_flight: report.in_flight,
        queries_per_s: report.queries_per_s,
    };
    Ok(db.set_setting(TUNED_QUERIES_SETTING, &saved)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_core::pin::Source;

    #[test]
    fn batching_is_as_given_else_as_tuned_else_the_default() {
        let b = Batching::resolve((Some(64), None), Some((32, 4)), (16, 2));
        assert_eq!(
            (b.batch_size.value, b.batch_size.source),
            (64, Source::Given)
        );
        assert_eq!((b.in_flight.value, b.in_flight.source), (4, Source::Run));
        assert!(b.tuned());
        let b = Batching::resolve((None, Some(0)), None, (16, 2));
        assert_eq!(
            (b.batch_size.value, b.batch_size.source),
            (16, Source::Default)
        );
        assert_eq!(b.in_flight.value, 1, "never below one");
        assert!(!b.tuned());
    }

    #[test]
    fn a_tuned_upload_applies_to_its_kind_of_sink_only() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        let saved = TunedUpload {
            sink: "server".into(),
            batch_size: 512,
            in_flight: 8,
            points_per_s: 1.0,
            sample_points: 10,
        };
        db.set_setting(TUNED_SETTING, &saved).unwrap();
        let server = upload_batching(&db, "server", (None, None), 256).unwrap();
        assert_eq!((server.batch_size.value, server.in_flight.value), (512, 8));
        let edge = upload_batching(&db, "edge", (None, None), 256).unwrap();
        assert!(!edge.tuned());
    }
}
