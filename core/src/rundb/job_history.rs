//! Every job attempt of the run, one row each: a `jobs` row (one batch of one scheduler job)
//! with the host its result manifest named and the embed run it made, for the report's
//! timeline and trace. Read incrementally: [`RunDb::job_attempts_since`] returns only the rows
//! whose job changed, or whose attempt was ingested, since a cursor, by index (run.db v11).

use super::error::{sqlite_err, stored_state, Result};
use super::handle::RunDb;
use crate::state::JobStatus;
use rusqlite::params;

/// Where a reader of [`RunDb::job_attempts_since`] got to: the latest `jobs.updated_at` and
/// `attempts.ingested_at` it has seen. Rows stamped in that same millisecond are read again
/// (a writer may have added one after the read): the reader keys rows by `job_row`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobAttemptCursor {
    pub jobs_updated: String,
    pub attempts_ingested: String,
}

/// One job attempt at one batch. Its result manifest names the job as the scheduler's
/// environment gave it (`NAME (ID)`, `NAME` or `ID`: `AttemptManifest::job`); each form is
/// matched, as the live view matches them.
#[derive(Debug, Clone, PartialEq)]
pub struct JobAttempt {
    /// `jobs.id`: the row, unique in the run.
    pub job_row: i64,
    pub batch: i64,
    pub attempt: u32,
    /// The name it was submitted under (shared by the batches of a multi-node job).
    pub name: String,
    /// The scheduler's id (`None` until the scheduler accepted it).
    pub native_id: Option<String>,
    pub queue: String,
    pub state: JobStatus,
    pub exit_reason: Option<String>,
    /// Unix seconds: submitted (accepted by the scheduler), started, ended. The start is the
    /// earlier of the owner's sighting (a poll after the job began) and the embed run's own,
    /// so a trace's `realtime` is never shorter than the run it timed.
    pub submit_s: Option<f64>,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    /// From the attempt's result manifest, once ingested.
    pub host: Option<String>,
    /// The owner's verdict on the attempt (`accepted`, `failed`, ...) and why.
    pub outcome: Option<String>,
    pub outcome_reason: Option<String>,
    /// The embed run the attempt made (by the job's name; in runs older than run.db v11 by
    /// batch and time), when it got that far.
    pub papers: Option<u64>,
    pub tokens: Option<u64>,
    pub run_s: Option<f64>,
    pub run_error: Option<String>,
    /// The study's Table 2 breakdown of that run (seconds).
    pub model_load_s: Option<f64>,
    pub io_s: Option<f64>,
    pub tokenize_s: Option<f64>,
    pub inference_s: Option<f64>,
    /// The job's log, relative to the run directory (or absolute).
    pub log: Option<String>,
}

/// Unix seconds of an ISO timestamp column, in SQL.
macro_rules! unix {
    ($col:expr) => {
        concat!("(julianday(", $col, ") - 2440587.5) * 86400.0")
    };
}

const SELECT: &str = concat!(
    "SELECT j.id, j.batch_id, j.attempt, coalesce(j.name, ''), j.scheduler_id, coalesce(j.queue, '-'),
            j.state, j.exit_reason, ",
    unix!("j.submitted_at"),
    // The start: the earlier of when the loop saw the job running (a poll after it began) and
    // when its embed run says it began; either alone where the other is not known.
    ", coalesce(min(",
    unix!("j.started_at"),
    ", ",
    unix!("r.started_at"),
    "), ",
    unix!("j.started_at"),
    ", ",
    unix!("r.started_at"),
    "), ",
    unix!("j.finished_at"),
    ", a.host, a.state, a.reason, r.papers, r.tokens, r.total_s, r.error, j.log, j.updated_at,
            a.ingested_at, r.model_load_s, r.io_s, r.tokenize_s, r.inference_s
     FROM jobs j
     LEFT JOIN attempts a ON a.rowid = (SELECT rowid FROM attempts WHERE batch_id = j.batch_id
                                        AND job IN (j.name, j.name || ' (' || j.scheduler_id || ')', j.scheduler_id)
                                        ORDER BY ingested_at DESC LIMIT 1)
     LEFT JOIN batch_runs r ON r.id = coalesce(
         (SELECT id FROM batch_runs WHERE batch_id = j.batch_id
          AND job IN (j.name, j.name || ' (' || j.scheduler_id || ')', j.scheduler_id)
          ORDER BY id DESC LIMIT 1),
         (SELECT id FROM batch_runs WHERE batch_id = j.batch_id AND job IS NULL
          AND started_at >= coalesce(j.submitted_at, '')
          AND (j.finished_at IS NULL OR started_at <= j.finished_at)
          ORDER BY id DESC LIMIT 1))"
);

impl RunDb {
    /// The job attempts changed since `cursor` (every one from the default cursor), in
    /// `jobs.id` order, and the cursor to pass next time.
    pub fn job_attempts_since(
        &self,
        cursor: &JobAttemptCursor,
    ) -> Result<(Vec<JobAttempt>, JobAttemptCursor)> {
        let sql = format!(
            "{SELECT}
             WHERE j.id IN (SELECT id FROM jobs WHERE updated_at >= ?1
                            UNION SELECT j2.id FROM attempts a2 JOIN jobs j2
                                  ON j2.batch_id = a2.batch_id AND a2.job IN
                                     (j2.name, j2.name || ' (' || j2.scheduler_id || ')', j2.scheduler_id)
                            WHERE a2.ingested_at >= ?2)
             ORDER BY j.id"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(sqlite_err(&self.dir))?;
        let mut next = cursor.clone();
        let mut out = Vec::new();
        let mut rows = stmt
            .query(params![cursor.jobs_updated, cursor.attempts_ingested])
            .map_err(sqlite_err(&self.dir))?;
        while let Some(r) = rows.next().map_err(sqlite_err(&self.dir))? {
            let row = read_row(r).map_err(sqlite_err(&self.dir))?;
            let (updated, ingested): (Option<String>, Option<String>) = (
                r.get(19).map_err(sqlite_err(&self.dir))?,
                r.get(20).map_err(sqlite_err(&self.dir))?,
            );
            advance(&mut next.jobs_updated, updated);
            advance(&mut next.attempts_ingested, ingested);
            out.push(row);
        }
        Ok((out, next))
    }
}

impl RunDb {
    /// When job `name`'s embed runs began by their own record (the earliest of its batches'),
    /// where the loop never saw it running: it ran between two polls, or while no loop ran. The
    /// start [`RunDb::job_attempts_since`] gives a restarted loop, for the loop that is running.
    pub fn job_run_began(&self, name: &str) -> Result<Option<f64>> {
        // Asked at each job's end that no poll saw run (by the index on jobs.name): prepared once.
        let sql = format!("{SELECT} WHERE j.name = ?1");
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt
            .query_map(params![name], read_row)
            .map_err(sqlite_err(&self.dir))?;
        let mut began: Option<f64> = None;
        for row in rows {
            if let Some(start) = row.map_err(sqlite_err(&self.dir))?.start_s {
                began = Some(began.map_or(start, |b| b.min(start)));
            }
        }
        Ok(began)
    }
}

fn advance(cursor: &mut String, seen: Option<String>) {
    if let Some(seen) = seen {
        if seen > *cursor {
            *cursor = seen;
        }
    }
}

fn read_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<JobAttempt> {
    Ok(JobAttempt {
        job_row: r.get(0)?,
        batch: r.get(1)?,
        attempt: r.get(2)?,
        name: r.get(3)?,
        native_id: r.get(4)?,
        queue: r.get(5)?,
        state: stored_state(r.get::<_, String>(6)?, JobStatus::parse)?,
        exit_reason: r.get(7)?,
        submit_s: r.get(8)?,
        start_s: r.get(9)?,
        end_s: r.get(10)?,
        host: r.get(11)?,
        outcome: r.get(12)?,
        outcome_reason: r.get(13)?,
        papers: r.get(14)?,
        tokens: r.get(15)?,
        run_s: r.get(16)?,
        run_error: r.get(17)?,
        log: r.get(18)?,
        model_load_s: r.get(21)?,
        io_s: r.get(22)?,
        tokenize_s: r.get(23)?,
        inference_s: r.get(24)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundb::test_support::db_with_batches;
    use crate::rundb::{BatchTimings, NewJob};
    use crate::BatchId;

    fn submit(db: &mut RunDb, batch: i64, attempt: u32, name: &str) {
        let job = NewJob {
            batches: &[batch],
            attempt,
            backend: "local",
            queue: "q",
            name,
            script: "s",
            log: "logs/x.log",
            marker: "m",
        };
        db.insert_job(&job).unwrap();
        db.set_job_submitted(name, &format!("id-{name}")).unwrap();
    }

    #[test]
    fn a_cursor_returns_only_the_attempts_changed_since() {
        let (_d, mut db) = db_with_batches(3);
        submit(&mut db, 1, 1, "j1");
        std::thread::sleep(std::time::Duration::from_millis(5));
        submit(&mut db, 2, 1, "j2");
        let (all, cursor) = db.job_attempts_since(&JobAttemptCursor::default()).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].native_id.as_deref(), Some("id-j1"));
        assert!(all[0].submit_s.unwrap() > 1.7e9, "{:?}", all[0]);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (again, cursor) = db.job_attempts_since(&cursor).unwrap();
        // The rows of the cursor's own millisecond at most (j2's), never an older one.
        assert!(again.iter().all(|a| a.name == "j2"), "{again:?}");
        db.set_job_state("j1", JobStatus::Failed, Some("exit code 3"))
            .unwrap();
        let t = BatchTimings {
            papers: 7,
            tokens: 70,
            total_s: 2.0,
            ..BatchTimings::default()
        };
        let now = crate::owner::unix_now();
        db.record_batch_run(
            BatchId(2),
            Some("j2 (id-j2)"),
            now,
            now + 2.0,
            "cpu",
            &t,
            None,
        )
        .unwrap();
        db.conn
            .execute(
                "INSERT INTO attempts (batch_id, token, state, job, host, reason, ingested_at)
                 VALUES (2, 't', 'accepted', 'j2 (id-j2)', 'node7', '', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+1 second'))",
                [],
            )
            .unwrap();
        let (changed, _) = db.job_attempts_since(&cursor).unwrap();
        let names: Vec<&str> = changed.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["j1", "j2"]);
        assert_eq!(changed[0].state, JobStatus::Failed);
        assert!(changed[0].end_s.is_some());
        assert_eq!(changed[1].host.as_deref(), Some("node7"));
        assert_eq!(changed[1].papers, Some(7));
        // Never seen running: its start is the embed run's.
        assert!((changed[1].start_s.unwrap() - now).abs() < 0.01);
        // And the live loop reads the same start by the job's name; j1 ran no batch.
        assert!((db.job_run_began("j2").unwrap().unwrap() - now).abs() < 0.01);
        assert_eq!(db.job_run_began("j1").unwrap(), None);
        assert_eq!(db.job_run_began("no-such-job").unwrap(), None);
    }
}
