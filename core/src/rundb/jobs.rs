//! The `jobs` table: one row per batch of each scheduler job, so that a restarted submit loop
//! finds its jobs again (`submitting` is written just before the scheduler is asked, so a
//! crash between the two is noticed and the job looked up by name instead of submitted twice).

use super::error::{sqlite_err, stored_state, Result};
use super::handle::RunDb;
use crate::state::JobStatus;
use rusqlite::params;

/// One row of `jobs`: one batch of one scheduler job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub batch_id: i64,
    pub attempt: u32,
    pub backend: String,
    pub queue: String,
    /// The name the job was submitted under; shared by the batches of a multi-node job.
    pub name: String,
    pub scheduler_id: Option<String>,
    pub state: JobStatus,
    pub exit_reason: Option<String>,
    pub log: Option<String>,
    pub marker: Option<String>,
    /// Unix seconds: when the scheduler accepted it, and when the loop first saw it running.
    pub submitted_s: Option<f64>,
    pub started_s: Option<f64>,
}

/// A job about to be submitted (see [`RunDb::insert_job`]).
#[derive(Debug, Clone)]
pub struct NewJob<'a> {
    pub batches: &'a [i64],
    pub attempt: u32,
    pub backend: &'a str,
    pub queue: &'a str,
    pub name: &'a str,
    pub script: &'a str,
    pub log: &'a str,
    pub marker: &'a str,
}

impl RunDb {
    /// Records a job in state `submitting`, one row per batch, before the scheduler is asked.
    /// The batches stay `planned` until the embed job itself starts them.
    pub fn insert_job(&mut self, job: &NewJob<'_>) -> Result<()> {
        let dir = self.dir.clone();
        let tx = self.conn.transaction().map_err(sqlite_err(&dir))?;
        for batch in job.batches {
            // Its results folder is read at every poll again while the job may write into it.
            tx.execute(
                "UPDATE batches SET results_settled = 0 WHERE id = ?1",
                [batch],
            )
            .map_err(sqlite_err(&dir))?;
            tx.execute(
                "INSERT INTO jobs (batch_id, attempt, backend, queue, name, script, log, marker,
                                   state, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                params![
                    batch,
                    job.attempt,
                    job.backend,
                    job.queue,
                    job.name,
                    job.script,
                    job.log,
                    job.marker,
                    JobStatus::Submitting.as_str()
                ],
            )
            .map_err(sqlite_err(&dir))?;
        }
        tx.commit().map_err(sqlite_err(&dir))
    }

    /// The scheduler accepted job `name` as `scheduler_id`.
    pub fn set_job_submitted(&self, name: &str, scheduler_id: &str) -> Result<()> {
        self.conn
            .execute(
                "UPDATE jobs SET scheduler_id = ?2, state = ?3,
                     submitted_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                     updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                 WHERE name = ?1",
                params![name, scheduler_id, JobStatus::Pending.as_str()],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// Records the state of job `name` (every batch of it). A state that is not open sets
    /// `finished_at`.
    pub fn set_job_state(&self, name: &str, state: JobStatus, reason: Option<&str>) -> Result<()> {
        self.conn
            .execute(
                "UPDATE jobs SET state = ?2, exit_reason = coalesce(?3, exit_reason),
                     started_at = CASE WHEN ?2 = 'running' AND started_at IS NULL
                                       THEN strftime('%Y-%m-%dT%H:%M:%fZ', 'now') ELSE started_at END,
                     finished_at = CASE WHEN ?4 THEN strftime('%Y-%m-%dT%H:%M:%fZ', 'now') ELSE finished_at END,
                     updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                 WHERE name = ?1",
                params![name, state.as_str(), reason, !state.is_open()],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// Jobs the loop still has to watch (see [`JobStatus::OPEN`]), in id order.
    pub fn open_jobs(&self) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT batch_id, attempt, backend, coalesce(queue, ''), coalesce(name, ''), scheduler_id,
                    state, exit_reason, log, marker,
                    (julianday(submitted_at) - 2440587.5) * 86400.0,
                    (julianday(started_at) - 2440587.5) * 86400.0
             FROM jobs WHERE state IN {} ORDER BY id",
            JobStatus::open_sql()
        );
        // Asked several times a round by the submit loop: prepared once.
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            Ok(JobRow {
                batch_id: r.get(0)?,
                attempt: r.get(1)?,
                backend: r.get(2)?,
                queue: r.get(3)?,
                name: r.get(4)?,
                scheduler_id: r.get(5)?,
                state: stored_state(r.get::<_, String>(6)?, JobStatus::parse)?,
                exit_reason: r.get(7)?,
                log: r.get(8)?,
                marker: r.get(9)?,
                submitted_s: r.get(10)?,
                started_s: r.get(11)?,
            })
        });
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// The highest attempt number any job of `batch` had (0 if none).
    pub fn last_attempt(&self, batch: i64) -> Result<u32> {
        self.conn
            .query_row(
                "SELECT coalesce(max(attempt), 0) FROM jobs WHERE batch_id = ?1",
                [batch],
                |r| r.get(0),
            )
            .map_err(sqlite_err(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundb::test_support::db_with_batches;
    use crate::state::BatchState;
    use crate::BatchId;

    fn job<'a>(batches: &'a [i64], name: &'a str) -> NewJob<'a> {
        NewJob {
            batches,
            attempt: 1,
            backend: "local",
            queue: "q",
            name,
            script: "s",
            log: "l",
            marker: "m",
        }
    }

    #[test]
    fn a_job_holds_its_batches_until_it_ends() {
        let (_d, mut db) = db_with_batches(3);
        assert_eq!(db.batches_without_job().unwrap(), vec![1, 2, 3]);
        db.insert_job(&job(&[1, 2], "j1")).unwrap();
        assert_eq!(db.batches_without_job().unwrap(), vec![3]);
        assert_eq!(
            db.batch_state(BatchId(1)).unwrap(),
            Some(BatchState::Planned)
        );
        db.set_job_submitted("j1", "42").unwrap();
        let open = db.open_jobs().unwrap();
        assert_eq!(open.len(), 2);
        assert!(open
            .iter()
            .all(|j| j.state == JobStatus::Pending && j.scheduler_id.as_deref() == Some("42")));
        db.set_job_state("j1", JobStatus::Failed, Some("exit code 1"))
            .unwrap();
        assert!(db.open_jobs().unwrap().is_empty());
        assert_eq!(db.batches_without_job().unwrap(), vec![1, 2, 3]);
        assert_eq!(db.last_attempt(1).unwrap(), 1);
        assert_eq!(db.last_attempt(3).unwrap(), 0);
    }
}
