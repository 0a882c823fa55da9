//! The aggregates `status` shows, two ways: from the running counts run.db keeps (the
//! `tally_*` tables of schema v12), or recounted from the tables they count.
//!
//! The submit loop asks `status` at every poll (the console, `status-snapshot.json`, the
//! metrics). Recounting is a pass over every batch, shard, job, embed run and attempt of the
//! run (2,075 batches and ~10,000 rows in the study's), at every poll; reading the counts is a
//! few rows whatever the run's size. The counts are kept by SQLite triggers in the transaction
//! of each change, rather than by the owner in memory: another process writes run.db too
//! (`queues set`, `pause`, an upload, the `sqlite3` command in a test), and a kill at any moment
//! rolls a change and its count back together, so no writer can leave them apart. An in-memory
//! cache checked with `PRAGMA data_version` would be recounted at nearly every poll, since the
//! loop itself writes run.db each poll.
//!
//! `EMBEDFLEET_STATUS_RECOUNT=1` makes `status` recount, as embedfleet did before (a
//! before/after measurement, or a doubt about the counts).

use super::error::Result;
use super::handle::RunDb;
use std::collections::BTreeMap;

/// Set to `1` to have `status` recount from the tables instead of reading the running counts.
pub const STATUS_RECOUNT_ENV: &str = "EMBEDFLEET_STATUS_RECOUNT";

/// Whether [`STATUS_RECOUNT_ENV`] asks for a recount.
pub(super) fn recount_requested() -> bool {
    std::env::var(STATUS_RECOUNT_ENV).is_ok_and(|v| v == "1")
}

/// What `status` aggregates over the run's rows.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub batches: u64,
    pub batches_by_state: BTreeMap<String, u64>,
    pub papers_planned: u64,
    pub chars_planned: u64,
    pub jobs_by_queue: BTreeMap<String, BTreeMap<String, u64>>,
    pub shards: u64,
    pub rows_in_shards: u64,
    pub papers_quarantined: u64,
    pub quarantined_by_reason: BTreeMap<String, u64>,
    /// collection -> (rows acknowledged, rows failed).
    pub uploads: BTreeMap<String, (u64, u64)>,
    pub tokens_embedded: u64,
    pub papers_per_second: Option<f64>,
    pub attempts_by_state: BTreeMap<String, u64>,
    pub by_release: BTreeMap<i64, ReleaseWork>,
}

/// A release's batches and its finished embed runs.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct ReleaseWork {
    pub batches: u64,
    pub batches_done: u64,
    pub papers_embedded: u64,
    pub embed_seconds: f64,
}

impl RunDb {
    /// The counts as `status` wants them: read from the running counts, or recounted when
    /// [`STATUS_RECOUNT_ENV`] asks.
    pub(super) fn counts(&self) -> Result<Counts> {
        if recount_requested() {
            self.counts_recounted()
        } else {
            self.counts_kept()
        }
    }

    /// From the `tally_*` tables.
    pub(super) fn counts_kept(&self) -> Result<Counts> {
        let mut counts = Counts::default();
        for (release, state, batches, papers, chars) in self.rows(
            "SELECT release, state, batches, papers, chars FROM tally_batches WHERE batches <> 0",
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )? {
            let (release, state, batches, papers, chars): (i64, String, u64, u64, u64) =
                (release, state, batches, papers, chars);
            counts.batches += batches;
            counts.papers_planned += papers;
            counts.chars_planned += chars;
            let work = counts.by_release.entry(release).or_default();
            work.batches += batches;
            if state == crate::state::BatchState::Done.as_str() {
                work.batches_done += batches;
            }
            *counts.batches_by_state.entry(state).or_default() += batches;
        }
        for (queue, state, jobs) in self.rows(
            "SELECT queue, state, jobs FROM tally_jobs WHERE jobs <> 0",
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?)),
        )? {
            counts
                .jobs_by_queue
                .entry(queue)
                .or_default()
                .insert(state, jobs);
        }
        (counts.shards, counts.rows_in_shards) = self
            .conn
            .prepare_cached("SELECT shards, rows FROM tally_shards")
            .and_then(|mut stmt| stmt.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
            .map_err(|e| self.err(e))?;
        counts.quarantined_by_reason = self
            .rows(
                "SELECT reason, papers FROM tally_quarantine WHERE papers <> 0",
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .into_iter()
            .collect();
        counts.papers_quarantined = counts.quarantined_by_reason.values().sum();
        counts.uploads = self
            .rows(
                "SELECT collection, acked, failed FROM tally_uploads WHERE uploads <> 0",
                |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))),
            )?
            .into_iter()
            .collect();
        counts.attempts_by_state = self
            .rows(
                "SELECT state, attempts FROM tally_attempts WHERE attempts <> 0",
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .into_iter()
            .collect();
        let mut papers_embedded = 0;
        for (release, papers, tokens, seconds) in self.rows(
            "SELECT release, papers, tokens, seconds FROM tally_runs",
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, u64>(1)?,
                    r.get::<_, u64>(2)?,
                    r.get(3)?,
                ))
            },
        )? {
            papers_embedded += papers;
            counts.tokens_embedded += tokens;
            let work = counts.by_release.entry(release).or_default();
            (work.papers_embedded, work.embed_seconds) = (papers, seconds);
        }
        // The span by the partial indexes on the finished runs: two index lookups.
        let span: Option<f64> = self
            .conn
            .prepare_cached(
                "SELECT (julianday((SELECT max(finished_at) FROM batch_runs WHERE state = 'done'))
                       - julianday((SELECT min(started_at) FROM batch_runs WHERE state = 'done'))) * 86400.0",
            )
            .and_then(|mut stmt| stmt.query_row([], |r| r.get(0)))
            .map_err(|e| self.err(e))?;
        counts.papers_per_second = rate(Some(papers_embedded as f64), span);
        Ok(counts)
    }

    /// From the tables themselves: what `status` did before run.db kept counts.
    pub(super) fn counts_recounted(&self) -> Result<Counts> {
        let scalar = |sql: &str| -> Result<u64> {
            self.conn
                .query_row(sql, [], |r| r.get::<_, Option<u64>>(0))
                .map(|v| v.unwrap_or(0))
                .map_err(|e| self.err(e))
        };
        let grouped = |sql: &str| -> Result<BTreeMap<String, u64>> {
            Ok(self
                .rows(sql, |r| Ok((r.get(0)?, r.get(1)?)))?
                .into_iter()
                .collect())
        };
        let uploads = self
            .rows(
                "SELECT collection, sum(rows_acked), sum(failed_rows) FROM uploads GROUP BY 1",
                |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))),
            )?
            .into_iter()
            .collect();
        Ok(Counts {
            batches: scalar("SELECT count(*) FROM batches")?,
            batches_by_state: grouped("SELECT state, count(*) FROM batches GROUP BY state")?,
            papers_planned: scalar("SELECT sum(n_rows - n_excluded) FROM batches")?,
            chars_planned: scalar("SELECT sum(n_chars) FROM batches")?,
            jobs_by_queue: self.jobs_by_queue_recounted()?,
            shards: scalar("SELECT count(*) FROM shards")?,
            rows_in_shards: scalar("SELECT sum(rows) FROM shards")?,
            papers_quarantined: scalar("SELECT count(*) FROM quarantine")?,
            quarantined_by_reason: grouped(
                "SELECT reason, count(*) FROM quarantine GROUP BY reason",
            )?,
            uploads,
            tokens_embedded: scalar("SELECT sum(tokens) FROM batch_runs WHERE state = 'done'")?,
            papers_per_second: self.embed_rate_recounted()?,
            attempts_by_state: grouped("SELECT state, count(*) FROM attempts GROUP BY 1")?,
            by_release: self.release_work_recounted()?,
        })
    }

    /// Runs `sql` and collects its rows.
    fn rows<T>(
        &self,
        sql: &str,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let rows = stmt.query_map([], row);
        rows.and_then(|r| r.collect()).map_err(|e| self.err(e))
    }

    /// Jobs per queue and state, each batch counted at its latest attempt.
    fn jobs_by_queue_recounted(&self) -> Result<BTreeMap<String, BTreeMap<String, u64>>> {
        let mut jobs_by_queue: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (queue, state, n) in self.rows(
            "SELECT coalesce(queue, '-'), state, count(*) FROM jobs j
             WHERE attempt = (SELECT max(attempt) FROM jobs WHERE batch_id = j.batch_id)
             GROUP BY 1, 2",
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?)),
        )? {
            jobs_by_queue.entry(queue).or_default().insert(state, n);
        }
        Ok(jobs_by_queue)
    }

    /// Each release's batches and what embedding them cost: one pass over the batches and one
    /// over the finished embed runs, grouped by release.
    fn release_work_recounted(&self) -> Result<BTreeMap<i64, ReleaseWork>> {
        let mut out: BTreeMap<i64, ReleaseWork> = BTreeMap::new();
        for (release, batches, done) in self.rows(
            "SELECT f.release, count(*), sum(b.state = 'done') FROM batches b
             JOIN corpus_files f ON f.id = b.file_id GROUP BY 1",
            |r| Ok((r.get::<_, i64>(0)?, r.get(1)?, r.get(2)?)),
        )? {
            let work = out.entry(release).or_default();
            (work.batches, work.batches_done) = (batches, done);
        }
        for (release, papers, seconds) in self.rows(
            "SELECT f.release, sum(r.papers), sum(r.total_s) FROM batch_runs r
             JOIN batches b ON b.id = r.batch_id JOIN corpus_files f ON f.id = b.file_id
             WHERE r.state = 'done' GROUP BY 1",
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Option<u64>>(1)?.unwrap_or(0),
                    r.get::<_, Option<f64>>(2)?.unwrap_or(0.0),
                ))
            },
        )? {
            let work = out.entry(release).or_default();
            (work.papers_embedded, work.embed_seconds) = (papers, seconds);
        }
        Ok(out)
    }

    /// Papers per second of the finished embed runs over the span from the first start to the
    /// last finish: with N jobs at once this is the run's rate, not one job's.
    fn embed_rate_recounted(&self) -> Result<Option<f64>> {
        let (papers, span): (Option<f64>, Option<f64>) = self
            .conn
            .query_row(
                "SELECT sum(papers), (julianday(max(finished_at)) - julianday(min(started_at))) * 86400.0
                 FROM batch_runs WHERE state = 'done'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(|e| self.err(e))?;
        Ok(rate(papers, span))
    }
}

/// Papers per second over a span, when both are there and positive.
fn rate(papers: Option<f64>, span_s: Option<f64>) -> Option<f64> {
    match (papers, span_s) {
        (Some(p), Some(s)) if p > 0.0 && s > 0.0 => Some(p / s),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
