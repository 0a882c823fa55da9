//! What the run's owner (the submit loop) keeps fresh beside run.db: `metrics.prom` every 10 s
//! and `report.html` every few minutes, each replaced whole. Each write reads only the job
//! attempts that changed since the last ([`AttemptHistory::refresh`]); a failed attempt's log is
//! read once.
//! The page itself is built from that history in memory, never from a scan of run.db.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use embedfleet_core::rundb::{JobAttempt, RunDb, RunDbError, RunStatus};
use embedfleet_core::status_snapshot::LoopState;
use embedfleet_core::RunLayout;

use super::history::{AttemptHistory, Outcome};
use super::metrics::{self, MetricsInput};
use super::{figures, html, logline};

/// Seconds between two writes of `report.html` when `EMBEDFLEET_REPORT_EVERY_S` does not say
/// (0 there: neither file is written, the owner as it was before).
pub const DEFAULT_REPORT_EVERY_S: f64 = 300.0;
/// How often `metrics.prom` is rewritten: about a scrape interval, not every poll (a local
/// run polls twice a second).
pub const METRICS_EVERY: Duration = Duration::from_secs(10);
/// Quarantined papers the page lists by id.
const QUARANTINE_SHOWN: u32 = 50;

/// The owner's report state.
pub struct OwnerReport {
    run_dir: PathBuf,
    history: AttemptHistory,
    /// job row -> the first error line of its log (read once the attempt has failed).
    first_errors: HashMap<i64, Option<String>>,
    quarantined: Vec<(String, String, String)>,
    /// What upload, tune and query last did (read with the page).
    activity: super::activity::Activity,
    every: Duration,
    last_page: Option<Instant>,
    last_metrics: Option<Instant>,
    /// The latest metrics text (without the age), for `--metrics-listen`.
    pub metrics: super::listen::SharedMetrics,
}

impl OwnerReport {
    /// `None` when `EMBEDFLEET_REPORT_EVERY_S=0` turns the owner's report off.
    pub fn from_env(run_dir: &Path) -> Option<Self> {
        let every = std::env::var("EMBEDFLEET_REPORT_EVERY_S")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(DEFAULT_REPORT_EVERY_S);
        (every > 0.0).then(|| Self::new(run_dir, Duration::from_secs_f64(every)))
    }

    pub fn new(run_dir: &Path, every: Duration) -> Self {
        Self {
            run_dir: run_dir.to_path_buf(),
            history: AttemptHistory::default(),
            first_errors: HashMap::new(),
            quarantined: Vec::new(),
            activity: Default::default(),
            every,
            last_page: None,
            last_metrics: None,
            metrics: Default::default(),
        }
    }

    /// After a poll: when `metrics.prom` (every [`METRICS_EVERY`]) or `report.html` (every
    /// few minutes) is due, the attempts that changed since the last are taken in and the file
    /// written; the polls between cost nothing.
    pub fn polled(
        &mut self,
        db: &RunDb,
        status: &RunStatus,
        submit_loop: &LoopState,
    ) -> Result<(), RunDbError> {
        let due =
            |last: Option<Instant>, every: Duration| last.is_none_or(|t| t.elapsed() >= every);
        let metrics_due = due(self.last_metrics, METRICS_EVERY);
        let page_due = due(self.last_page, self.every);
        if !metrics_due && !page_due {
            return Ok(());
        }
        self.history.refresh(db)?;
        if metrics_due {
            self.write_metrics(status, submit_loop);
            self.last_metrics = Some(Instant::now());
        }
        if page_due {
            self.quarantined = db.quarantine_sample(QUARANTINE_SHOWN)?;
            self.activity = super::activity::Activity::read(db);
            self.write_page(status);
            self.last_page = Some(Instant::now());
        }
        Ok(())
    }

    /// Takes in the attempts changed since the last read: before [`OwnerReport::finish`] at
    /// the loop's end, so the last files hold the last attempts.
    pub fn refresh(&mut self, db: &RunDb) -> Result<(), RunDbError> {
        self.history.refresh(db).map(drop)
    }

    /// At the loop's end: both files once more, from what the last read took in.
    pub fn finish(&mut self, status: &RunStatus, submit_loop: &LoopState) {
        self.write_metrics(status, submit_loop);
        self.write_page(status);
    }

    fn write_metrics(&mut self, status: &RunStatus, submit_loop: &LoopState) {
        let now = embedfleet_core::owner::unix_now();
        let body = metrics::render(&MetricsInput {
            status,
            history: &self.history,
            submit_loop: Some(submit_loop),
        });
        let text = format!("{body}{}", metrics::age(submit_loop.last_poll_unix_s, now));
        self.metrics.set(body, submit_loop.last_poll_unix_s);
        // Replaced whole by a rename, not synced: a metrics file lost in a crash is rewritten
        // at the next poll, and a sync per write would cost a loaded filesystem's latency.
        // The temporary file is created fresh, never through a link planted at its name.
        let path = RunLayout::new(&self.run_dir).metrics_file();
        let tmp = embedfleet_core::atomic::tmp_path(&path);
        let written = embedfleet_core::atomic::or_discard(&path, || {
            embedfleet_core::atomic::create_tmp(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
                .and_then(|()| std::fs::rename(&tmp, &path))
        });
        if let Err(e) = written {
            tracing::warn!("{} not written: {e}", path.display());
        }
    }

    fn write_page(&mut self, status: &RunStatus) {
        let run_dir = self.run_dir.clone();
        let cache = &mut self.first_errors;
        let mut figures = figures::compute(status, &self.history, self.quarantined.clone(), |a| {
            first_error(&run_dir, cache, a)
        });
        figures.eval = embedfleet_core::eval_tables::latest(&run_dir);
        figures.compare = embedfleet_core::eval_tables::compare(&run_dir);
        figures.activity = self.activity.clone();
        self.write(
            &RunLayout::new(&run_dir).report_page(),
            html::render(&figures).as_bytes(),
        );
    }

    /// A file that cannot be written this time (a full quota) is stale until the next; it does
    /// not stop the run.
    fn write(&self, path: &Path, bytes: &[u8]) {
        if let Err(e) = embedfleet_core::atomic::write(path, bytes) {
            tracing::warn!("{} not written: {e}", path.display());
        }
    }
}

/// The first error line of a failed attempt's log, read once and kept.
pub fn first_error(
    run_dir: &Path,
    cache: &mut HashMap<i64, Option<String>>,
    a: &JobAttempt,
) -> Option<String> {
    if !Outcome::of(a).is_failure() {
        return None;
    }
    cache
        .entry(a.job_row)
        .or_insert_with(|| {
            let log = run_dir.join(a.log.as_deref()?);
            logline::first_error_line(&log)
        })
        .clone()
}
