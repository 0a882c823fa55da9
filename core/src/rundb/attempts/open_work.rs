//! Which result folders a poll between full sweeps reads: the batches with open work, by
//! index, and those whose files the last ingest could not read (see
//! [`RunDb::ingest_results`]).

use super::super::error::{sqlite_err, Result};
use super::super::handle::RunDb;
use crate::state::{AttemptState, BatchState, JobStatus};

/// The settings key listing the batches an ingest could not read whole (read again next time).
const READ_AGAIN_KEY: &str = "ingest_read_again";

impl RunDb {
    /// The batches an ingest could not read whole and reads again (`read_again` of
    /// [`IngestReport`]), kept in run.db: `status` and the loop are different processes.
    pub(super) fn read_again(&self) -> Result<std::collections::BTreeSet<i64>> {
        Ok(self.setting(READ_AGAIN_KEY)?.unwrap_or_default())
    }

    /// After an ingest of `batches`: those of them it could not read whole (`failed`) are
    /// read again, the others no longer.
    pub(super) fn keep_read_again(&self, batches: &[(i64, bool)], failed: &[i64]) -> Result<()> {
        let before = self.read_again()?;
        let mut after = before.clone();
        for (batch, _) in batches {
            after.remove(batch);
        }
        after.extend(failed.iter().copied());
        if after != before {
            self.set_setting(READ_AGAIN_KEY, &after)?;
        }
        Ok(())
    }

    /// The batches a poll between full sweeps reads: a job open; a job that ended in the last
    /// ten minutes leaving its batch not done (its manifest may show up late: NFS's attribute
    /// cache lets a folder's new file appear after the job's end is seen) or its files not
    /// cleaned; an attempt's files not cleaned; or a file the last ingest could not read. Each
    /// part by an index (`jobs_by_state`, `jobs_by_updated`, `attempts_uncleaned`): as many
    /// rows as there is open work, whatever the run's size. A result no part names (an
    /// `embed-job` run by hand) waits for the next full sweep. With each batch, whether it is
    /// quiet when its folder is empty (see [`RunDb::ingest_folders`]).
    pub(super) fn batches_with_open_work(&self) -> Result<Vec<(i64, bool)>> {
        let sql = format!(
            "WITH work (batch_id) AS (
               SELECT batch_id FROM jobs WHERE state IN {open}
               UNION SELECT j.batch_id FROM jobs j JOIN batches b ON b.id = j.batch_id
                 WHERE j.updated_at >= strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-10 minutes')
                   AND (b.state != '{done}' OR b.results_settled = 0)
               UNION SELECT batch_id FROM attempts WHERE cleaned = 0 AND state != '{accepted}')
             SELECT w.batch_id, coalesce(b.state != '{done}', 1) AND NOT EXISTS (
                 SELECT 1 FROM attempts a
                 WHERE a.batch_id = w.batch_id AND a.cleaned = 0 AND a.state != '{accepted}')
             FROM work w LEFT JOIN batches b ON b.id = w.batch_id ORDER BY w.batch_id",
            open = JobStatus::open_sql(),
            done = BatchState::Done.as_str(),
            accepted = AttemptState::Accepted.as_str(),
        );
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)));
        let mut work: Vec<(i64, bool)> = rows
            .and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))?;
        drop(stmt);
        let again = self.read_again()?;
        work.retain(|(b, _)| !again.contains(b));
        work.extend(again.into_iter().map(|b| (b, false)));
        work.sort_unstable();
        Ok(work)
    }
}
