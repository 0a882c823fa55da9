//! What the submit loop keeps in run.db: queue caps, the pause switch, and one `jobs` row per
//! batch a scheduler job runs, so that a restarted loop finds its jobs again and `pause`,
//! `resume` and `queues set` reach a running loop (it re-reads them every poll).

use super::{sqlite_err, Result, RunDb};
use rusqlite::params;
use std::collections::BTreeMap;

/// Job states that still count: the loop polls these, and they hold a place in their queue
/// (`submitting` is a row written just before the scheduler was asked, so a crash between the
/// two is noticed and the job looked up by name instead of submitted twice).
pub const OPEN_JOB_STATES: [&str; 4] = ["submitting", "pending", "running", "unknown"];

const OPEN_SQL: &str = "('submitting', 'pending', 'running', 'unknown')";

const PAUSED_KEY: &str = "submit.paused";

/// One row of `jobs`: one batch of one scheduler job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow {
    pub batch_id: i64,
    pub attempt: u32,
    pub backend: String,
    pub queue: String,
    /// The name the job was submitted under; shared by the batches of a multi-node job.
    pub name: String,
    pub scheduler_id: Option<String>,
    pub state: String,
    pub exit_reason: Option<String>,
    pub log: Option<String>,
    pub marker: Option<String>,
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
    /// Queue name -> cap on its jobs queued + running.
    pub fn queue_caps(&self) -> Result<BTreeMap<String, u32>> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, cap FROM queues ORDER BY name")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// Sets the caps of the queues named; with `replace`, queues not named are removed.
    /// A cap of 0 keeps the queue known (its running jobs still show) but submits nothing.
    pub fn set_queue_caps(&mut self, caps: &BTreeMap<String, u32>, replace: bool) -> Result<()> {
        let dir = self.dir.clone();
        let tx = self.conn.transaction().map_err(sqlite_err(&dir))?;
        if replace {
            tx.execute("DELETE FROM queues", [])
                .map_err(sqlite_err(&dir))?;
        }
        for (name, cap) in caps {
            tx.execute(
                "INSERT INTO queues (name, cap) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET cap = excluded.cap",
                params![name, cap],
            )
            .map_err(sqlite_err(&dir))?;
        }
        tx.commit().map_err(sqlite_err(&dir))
    }

    /// Removes queues; their running jobs go on and are still watched.
    pub fn remove_queues(&self, names: &[String]) -> Result<()> {
        for name in names {
            self.conn
                .execute("DELETE FROM queues WHERE name = ?1", [name])
                .map_err(sqlite_err(&self.dir))?;
        }
        Ok(())
    }

    /// True while `embedfleet pause` is in force: no new submissions.
    pub fn paused(&self) -> Result<bool> {
        Ok(self.setting::<bool>(PAUSED_KEY)?.unwrap_or(false))
    }

    pub fn set_paused(&self, paused: bool) -> Result<()> {
        self.set_setting(PAUSED_KEY, &paused)
    }

    /// Records a job in state `submitting`, one row per batch, before the scheduler is asked.
    /// The batches stay `planned` until the embed job itself starts them.
    pub fn insert_job(&mut self, job: &NewJob<'_>) -> Result<()> {
        let dir = self.dir.clone();
        let tx = self.conn.transaction().map_err(sqlite_err(&dir))?;
        for batch in job.batches {
            tx.execute(
                "INSERT INTO jobs (batch_id, attempt, backend, queue, name, script, log, marker,
                                   state, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'submitting', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                params![
                    batch, job.attempt, job.backend, job.queue, job.name, job.script, job.log,
                    job.marker
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
                "UPDATE jobs SET scheduler_id = ?2, state = 'pending',
                     submitted_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
                     updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                 WHERE name = ?1",
                params![name, scheduler_id],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// Records the state of job `name` (every batch of it). `terminal` sets `finished_at`.
    pub fn set_job_state(
        &self,
        name: &str,
        state: &str,
        reason: Option<&str>,
        terminal: bool,
    ) -> Result<()> {
        self.conn
            .execute(
                "UPDATE jobs SET state = ?2, exit_reason = coalesce(?3, exit_reason),
                     started_at = CASE WHEN ?2 = 'running' AND started_at IS NULL
                                       THEN strftime('%Y-%m-%dT%H:%M:%fZ', 'now') ELSE started_at END,
                     finished_at = CASE WHEN ?4 THEN strftime('%Y-%m-%dT%H:%M:%fZ', 'now') ELSE finished_at END,
                     updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                 WHERE name = ?1",
                params![name, state, reason, terminal],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// Forgets a job that never reached the scheduler.
    pub fn delete_job(&self, name: &str) -> Result<()> {
        self.conn
            .execute("DELETE FROM jobs WHERE name = ?1", [name])
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// Jobs the loop still has to watch (see [`OPEN_JOB_STATES`]), in id order.
    pub fn open_jobs(&self) -> Result<Vec<JobRow>> {
        let sql = format!(
            "SELECT batch_id, attempt, backend, coalesce(queue, ''), coalesce(name, ''), scheduler_id,
                    state, exit_reason, log, marker
             FROM jobs WHERE state IN {OPEN_SQL} ORDER BY id"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            Ok(JobRow {
                batch_id: r.get(0)?,
                attempt: r.get(1)?,
                backend: r.get(2)?,
                queue: r.get(3)?,
                name: r.get(4)?,
                scheduler_id: r.get(5)?,
                state: r.get(6)?,
                exit_reason: r.get(7)?,
                log: r.get(8)?,
                marker: r.get(9)?,
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

    /// Batches that need a job: not done, not given up on, and with no open job, in order.
    pub fn batches_without_job(&self) -> Result<Vec<i64>> {
        let sql = format!(
            "SELECT id FROM batches b WHERE state IN ('planned', 'running')
               AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.batch_id = b.id AND j.state IN {OPEN_SQL})
             ORDER BY id"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| r.get(0));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// Marks batches `failed` back to `planned` (a new `submit` tries them again).
    pub fn reset_failed_batches(&self) -> Result<u64> {
        self.conn
            .execute(
                "UPDATE batches SET state = 'planned' WHERE state = 'failed'",
                [],
            )
            .map(|n| n as u64)
            .map_err(sqlite_err(&self.dir))
    }

    /// The batch's state (`planned`, `running`, `done`, `failed`).
    pub fn batch_state(&self, batch: i64) -> Result<Option<String>> {
        use rusqlite::OptionalExtension;
        self.conn
            .query_row("SELECT state FROM batches WHERE id = ?1", [batch], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sqlite_err(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db_with_batches(n: i64) -> (tempfile::TempDir, RunDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        db.conn()
            .execute(
                "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 0, 0, '')",
                [],
            )
            .unwrap();
        for id in 1..=n {
            db.conn()
                .execute(
                    "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (?1, 1, ?1, 'b', 1, 1)",
                    [id],
                )
                .unwrap();
        }
        (dir, db)
    }

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
        assert_eq!(db.batch_state(1).unwrap().as_deref(), Some("planned"));
        db.set_job_submitted("j1", "42").unwrap();
        let open = db.open_jobs().unwrap();
        assert_eq!(open.len(), 2);
        assert!(open
            .iter()
            .all(|j| j.state == "pending" && j.scheduler_id.as_deref() == Some("42")));
        db.set_job_state("j1", "failed", Some("exit code 1"), true)
            .unwrap();
        assert!(db.open_jobs().unwrap().is_empty());
        assert_eq!(db.batches_without_job().unwrap(), vec![1, 2, 3]);
        assert_eq!(db.last_attempt(1).unwrap(), 1);
        assert_eq!(db.last_attempt(3).unwrap(), 0);
    }

    #[test]
    fn caps_merge_or_replace_and_pause_toggles() {
        let (_d, mut db) = db_with_batches(0);
        let caps = |pairs: &[(&str, u32)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect::<BTreeMap<_, _>>()
        };
        db.set_queue_caps(&caps(&[("debug", 1), ("gpu", 2)]), true)
            .unwrap();
        db.set_queue_caps(&caps(&[("gpu", 0), ("pre", 4)]), false)
            .unwrap();
        assert_eq!(
            db.queue_caps().unwrap(),
            caps(&[("debug", 1), ("gpu", 0), ("pre", 4)])
        );
        db.set_queue_caps(&caps(&[("x", 3)]), true).unwrap();
        assert_eq!(db.queue_caps().unwrap(), caps(&[("x", 3)]));
        db.remove_queues(&["x".into()]).unwrap();
        assert!(db.queue_caps().unwrap().is_empty());
        assert!(!db.paused().unwrap());
        db.set_paused(true).unwrap();
        assert!(db.paused().unwrap());
        db.set_paused(false).unwrap();
        assert!(!db.paused().unwrap());
    }
}
